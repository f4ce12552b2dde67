"""Write docs/ops.md (op kinds and their stable ids) and docs/backends.md (op x backend table) from the registry.

    python tools/gen_ops_doc.py          # rewrite both
    python tools/gen_ops_doc.py --check  # fail if either is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from opgraph.core.registry import _REQUIRED, all_ops, get_op

DOC = Path(__file__).resolve().parent.parent / "docs" / "ops.md"
BACKENDS_DOC = DOC.parent / "backends.md"
BACKENDS_HEADER = (DOC.parent / "backends.intro.md")

HEADER = """# Op kinds

Generated from the registry by `python tools/gen_ops_doc.py`; `make test` checks it is current.

Ids are stable: they are the `type` integers of function records in `.cg` files.
They are never renumbered or reused.

| ids | owner |
|---|---|
| 0 | `const` (type 0 in `.cg` files: a constant from the `.cgc` table) |
| 1-9999 | opgraph's own kinds (elementwise 1-499, reductions 500-599, contractions 600-699, shape 700-799, \
nn 800-899, linalg 900-999, fused 1000-1099, indexing 1100-1199, signal 1200-1299) |
| 10001-30002 | reserved for TensCalc's registered types (`lib/CGregistration.m`) |
| 40000 and up | for user-defined kinds (`opgraph.register_op`) |

The *version* stored on each op is chosen from its input dtypes when it is built:
by default the code of the promoted input dtype (bool 1, int8 2, int16 3, int32 4,
int64 5, uint8 6, uint16 7, uint32 8, uint64 9, float16 10, float32 11, float64 12,
complex64 13, complex128 14); `cast` uses 16 * source code + target code.

Flags: **E** elementwise, **C** commutative, **I** may overwrite the inputs listed, **D** decomposes into basic
ops (its `decompose`: lowering gives a backend without the op these parts, and ONNX export writes them).

"""


def render() -> str:
    rows = ["| id | name | family | inputs | attributes | flags | description |", "|---|---|---|---|---|---|---|"]
    for d in all_ops():
        if d.id >= 40000:
            continue  # user kinds registered by tests or docs
        arity = str(d.arity) if d.arity is not None else f"{d.min_inputs}+"
        attrs = ", ".join(f"`{k}`" if a.default is _REQUIRED else f"`{k}={a.default!r}`" for k, a in d.attrs.items())
        flags = " ".join(f for f, on in (("E", d.elementwise), ("C", d.commutative)) if on)
        if d.inplace:
            flags += f" I{list(d.inplace)}"
        if d.decompose is not None:
            flags += " D"
        doc = d.doc.replace("|", "\\|").replace("\n", " ")
        rows.append(f"| {d.id} | `{d.name}` | {d.family} | {arity} | {attrs} | {flags.strip()} | {doc} |")
    return HEADER + "\n".join(rows) + "\n"


def render_backends() -> str:
    """The op x backend table: what each backend runs natively, what it gets by lowering, what falls back."""
    from opgraph import backends
    from opgraph.passes.lower import LOWER

    names = [n for n in backends.names() if n != "numpy"]
    loaded = {n: backends.get(n) for n in names}
    lowered = {get_op(k).name for k in LOWER.by_kind}
    head = ["| id | kind | numpy | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    counts = dict.fromkeys(names, 0)
    rows = []
    for d in all_ops():
        if d.id >= 40000 or d.name == "const":
            continue
        cells = []
        for n in names:
            be = loaded[n]
            cell = be.doc_cell(d.name)
            if cell is not None:
                counts[n] += cell != "whole block"
                cells.append(cell)
            elif d.name in be.rules:
                counts[n] += 1
                note = " (some dtypes/attrs: numpy)" if d.name in be.limits else ""
                cells.append("yes" + note)
            elif d.name in lowered:
                cells.append("lowered")
            else:
                cells.append("numpy")
        rows.append(f"| {d.id} | `{d.name}` | yes | " + " | ".join(cells) + " |")
    summary = ["", "Kinds with a rule: " + ", ".join(f"{n} {counts[n]}" for n in names) +
               f" (of {len(rows)}); dtypes each runs: " +
               "; ".join(f"{n}: {', '.join(sorted(loaded[n].dtypes, key=_dtype_order)) or 'all'}" for n in names) + "."]
    intro = BACKENDS_HEADER.read_text().replace("<!-- numerics table -->", render_numerics(loaded))
    return intro + "\n".join(head + rows + summary) + "\n"


def render_numerics(loaded: dict[str, Any]) -> str:
    """The table of the engines' declared differences from NumPy (``Backend.numerics``)."""
    rows = ["| engine | tag | ops | where (input class) | what happens |", "|---|---|---|---|---|"]
    for name, be in loaded.items():
        for d in be.numerics:
            cells = [f"`{name}` ({', '.join(d.devices)})", f"`{d.tag}`", d.ops(), d.inputs, d.effect]
            rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if len(rows) == 2:
        rows.append("| (none) | | | | |")
    return "\n".join(rows)


def _dtype_order(name: str) -> int:
    order = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
             "float64", "complex64", "complex128"]
    return order.index(name) if name in order else len(order)


def main() -> int:
    docs = {DOC: render(), BACKENDS_DOC: render_backends()}
    if "--check" in sys.argv:
        stale = [p for p, text in docs.items() if not p.exists() or p.read_text() != text]
        for p in stale:
            print(f"{p} is out of date: run `python tools/gen_ops_doc.py`", file=sys.stderr)
        return 1 if stale else 0
    DOC.parent.mkdir(exist_ok=True)
    for p, text in docs.items():
        p.write_text(text)
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
