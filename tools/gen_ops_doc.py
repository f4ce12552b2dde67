"""Write docs/ops.md, the table of op kinds and their stable ids, from the registry.

    python tools/gen_ops_doc.py          # rewrite docs/ops.md
    python tools/gen_ops_doc.py --check  # fail if docs/ops.md is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

from opgraph.core.registry import _REQUIRED, all_ops

DOC = Path(__file__).resolve().parent.parent / "docs" / "ops.md"

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

Flags: **E** elementwise, **C** commutative, **I** may overwrite the inputs listed.

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
        doc = d.doc.replace("|", "\\|").replace("\n", " ")
        rows.append(f"| {d.id} | `{d.name}` | {d.family} | {arity} | {attrs} | {flags.strip()} | {doc} |")
    return HEADER + "\n".join(rows) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is out of date: run `python tools/gen_ops_doc.py`", file=sys.stderr)
            return 1
        return 0
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(text)
    print(f"wrote {DOC} ({text.count(chr(10)) - HEADER.count(chr(10)) - 2} ops)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
