"""Graphviz drawings of computation graphs, optionally coloured by a memory plan (Owl style).

The drawing is the bipartite graph itself: **ops** are boxes (kind, a few key
attributes), **values** are ellipses (name or ``%id``, type). Edges run
value -> op (labelled with the input position when the op has several inputs)
and op -> value (labelled with the output position when it has several).
Graph inputs have a blue double border, outputs a red bold border, update
(copy) edges are dashed and labelled ``update``. A const op and its value are
drawn as one small grey note showing the constant (``0.5``, ``[1, 2]`` or
``const f32[3,4]``).

With a memory plan (``plan=True`` plans with :func:`opgraph.memory.plan_memory`)
every planned value is filled with one colour per storage slot, that is per
``(buffer, offset)`` of ``plan.placement``: values with the same colour reuse
the same bytes at different times, as in Owl's drawings where each memory
block has a colour. View ops' outputs take their root's colour (dashed
border); unplanned values (inputs, constants, dynamic shapes) stay white. A
legend node says so and lists the slots.

Large graphs: at most ``max_ops`` ops (const ops not counted) are drawn; beyond
that the first and last ``max_ops // 2`` ops in topological order are drawn
and everything between is collapsed into one ``... N more ops`` node listing
the most common kinds, with edges to and from it where the drawn part reads or
feeds the hidden part. This keeps the two ends (where the inputs come in and
the outputs leave) readable and the layout time bounded.

:func:`to_dot` needs neither Graphviz nor the ``graphviz`` package;
:func:`draw` needs the ``graphviz`` Python package; :func:`render` and
:func:`graph_repr_svg` need the ``dot`` binary.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (4,)), name="x")
    >>> b.output(b.op("exp", b.op("negative", x)))
    >>> text = to_dot(b.freeze(), plan=True)
    >>> text.startswith("digraph opgraph {"), text.count(" -> ")
    (True, 4)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from opgraph.core import hooks
from opgraph.core.atomic import atomic_files
from opgraph.core.graph import Graph
from opgraph.core.registry import CONST
from opgraph.core.subgraph import Subgraph, subgraphs_of
from opgraph.errors import MissingDependencyError
from opgraph.frontend.tensor_algebra import Elementwise, Multiply, Operation, OpGraph, Permute, Tensor, permutation

if TYPE_CHECKING:
    import graphviz

    from opgraph.memory.plan import MemoryPlan

__all__ = ["PALETTE", "GraphvizNotFoundError", "draw", "graph_repr_svg", "render", "to_dot"]

PALETTE: tuple[str, ...] = (
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
    "#bc80bd", "#ccebc5", "#ffed6f", "#a6cee3", "#b2df8a", "#fb9a99", "#fdbf6f", "#cab2d6",
    "#e5d8bd", "#d9d9d9", "#66c2a5", "#fc8d62", "#8da0cb", "#e78ac3", "#a6d854", "#ffd92f",
)
"""Fill colours of memory slots, in order of first use (reused cyclically beyond 24 slots)."""

INSTALL_HINT = ("install Graphviz: 'apt-get install graphviz' (Debian/Ubuntu), 'brew install graphviz' (macOS), "
                "'conda install -c conda-forge graphviz' or see https://graphviz.org/download/")
FORMATS = ("svg", "png", "pdf")
_LEGEND_ROWS = 12
_MAX_ATTRS = 3
_ATTR_CHARS = 24
FANOUT = 4
"""A value read by more drawn ops than this gets a small dashed reference node (``(ref)``) per further use,
so a weight or input used all over the graph does not pull long edges across it (slow and unreadable)."""


class GraphvizNotFoundError(FileNotFoundError):
    """The Graphviz ``dot`` binary is not on ``PATH`` (needed to render, not to make DOT text)."""


# ----------------------------------------------------------------------------- text helpers
def _q(text: str) -> str:
    r"""A DOT double-quoted string; newlines become ``\n`` line breaks.

    >>> _q('a "b"\nc')
    '"a \\"b\\"\\nc"'
    """
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _attrs(a: dict[str, str]) -> str:
    if not a:
        return ""
    parts = [f"{k}={v}" if v.startswith("<") else f"{k}={_q(v)}" for k, v in a.items()]
    return " [" + ", ".join(parts) + "]"


def _short(v: Any) -> str:
    """A compact form of an attribute value.

    >>> _short((0, 1)), _short("x" * 40)[-3:]
    ('(0,1)', '...')
    """
    if isinstance(v, Subgraph):
        return f"@{v.name or 'body'}"
    if isinstance(v, tuple):
        s = "(" + ",".join(_short(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    elif isinstance(v, float):
        s = f"{v:.6g}"
    elif isinstance(v, np.ndarray):
        s = f"array{list(v.shape)}"
    else:
        s = repr(v) if isinstance(v, str) else str(v)
    return s if len(s) <= _ATTR_CHARS else s[:_ATTR_CHARS - 3] + "..."


def _human(n: int) -> str:
    """Bytes for labels.

    >>> _human(512), _human(2048), _human(3 * 2**20)
    ('512 B', '2 KiB', '3 MiB')
    """
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def _const_text(c: np.ndarray, ty: Any) -> str:
    if c.ndim == 0:
        return _short(c.item())
    if c.size <= 4:
        return np.array2string(c, separator=", ", precision=4).replace("\n", "")
    return f"const {ty}"


# ----------------------------------------------------------------------------- model
def _resolve_plan(graph: Graph, plan: Any) -> MemoryPlan | None:
    if plan is None or plan is False:
        return None
    if plan is True:
        from opgraph.memory import plan_memory

        return plan_memory(graph)
    from opgraph.memory.plan import MemoryPlan

    if not isinstance(plan, MemoryPlan):
        raise TypeError(f"plan must be None, True or a MemoryPlan, not {type(plan).__name__}")
    if plan.graph is not graph and plan.graph.num_values != graph.num_values:
        raise ValueError("the memory plan was made for another graph")
    return plan


def _slot_name(plan: MemoryPlan, b: int, off: int) -> str:
    kind = plan.bins[b].kind
    where = "arena" if b == 0 else f"{kind} buf {b}"
    return f"{where} +{off}"


def _statements(graph: Graph, plan: MemoryPlan | None, max_ops: int, rankdir: str) -> list[str]:
    """The body of the DOT text (one statement per line)."""
    if max_ops < 2:
        raise ValueError(f"max_ops must be at least 2, got {max_ops}")
    is_const = graph.op_kind == CONST.id
    try:
        order = [int(o) for o in graph.topological_order()]
    except Exception:  # a cyclic graph is still drawn, in index order
        order = list(range(graph.num_ops))
    real = [o for o in order if not is_const[o]]
    hidden: set[int] = set()
    if len(real) > max_ops:
        half = max_ops // 2
        hidden = set(real[half:len(real) - (max_ops - half)])
    shown_ops = [o for o in real if o not in hidden]
    inputs = {int(v) for v in graph.inputs}
    outputs = {int(v) for v in graph.outputs}
    updates = [(int(s), int(d)) for s, d in graph.updates]

    lines = [f"graph [rankdir={rankdir}, fontname=Helvetica, fontsize=10, nodesep=0.25, ranksep=0.3, "
             f"newrank=true, label={_q(_title(graph))}, labelloc=t]",
             'node [fontname=Helvetica, fontsize=10, margin="0.08,0.03", height=0.3]',
             "edge [fontname=Helvetica, fontsize=8, arrowsize=0.6, color=\"#555555\"]"]

    # Values to draw: everything a shown op touches, the gateways, update ends.
    shown_vals: set[int] = set(inputs) | outputs
    for s, d in updates:
        shown_vals.update((s, d))
    for o in shown_ops:
        shown_vals.update(int(v) for v in graph.op_inputs(o))
        shown_vals.update(int(v) for v in graph.op_outputs(o))
    producer = graph.value_producer
    # Values produced by hidden ops are drawn only if something drawn uses them (done above);
    # values of hidden ops used only by hidden ops are dropped.

    slot_color: dict[tuple[int, int], str] = {}
    slot_members: Counter[tuple[int, int]] = Counter()
    alias_root: dict[int, int] = plan.extra.get("alias_root", {}) if plan is not None else {}
    if plan is not None:
        for v in sorted(plan.placement, key=lambda v: (plan.start.get(v, 0), v)):
            key = plan.placement[v]
            slot_members[key] += 1
            if key not in slot_color:
                slot_color[key] = PALETTE[len(slot_color) % len(PALETTE)]

    ref_attrs: dict[int, str] = {}
    const_vals: dict[int, int] = {}
    for o in np.flatnonzero(is_const).tolist():
        for v in graph.op_outputs(o):
            const_vals[int(v)] = o

    for v in sorted(shown_vals):
        a: dict[str, str] = {}
        ty = graph.type_of(v)
        name = graph.name_of(v)
        if v in const_vals:
            c = graph.constant_of(const_vals[v])
            text = _const_text(c, ty)
            label = f"{name}\n{text}" if name else text
            a.update(shape="note", style="filled", fillcolor="#eeeeee", color="#999999", fontsize="8",
                     height="0.2", label=label)
        else:
            lines_ = [f"%{name}" if name else f"%{v}", str(ty)]
            a["shape"] = "ellipse"
            styles: list[str] = []
            if plan is not None:
                key = plan.placement.get(v)
                root = alias_root.get(v)
                if key is None and root is not None:
                    key = plan.placement.get(root)
                    if key is not None:
                        styles.append("dashed")
                        lines_.append(f"view of %{graph.name_of(root) or root}")
                if key is not None:
                    styles.append("filled")
                    a["fillcolor"] = slot_color[key]
                    if root is None:
                        lines_.append(_slot_name(plan, *key))
            if v in inputs:
                lines_.append("(input)")
                a.update(peripheries="2", color="#1f5fbf")
            if v in outputs:
                lines_.append("(output)")
                a.update(penwidth="2.5", color="#c0392b")
            if styles:
                a["style"] = ",".join(styles)
            a["label"] = "\n".join(lines_)
        lines.append(f"v{v}{_attrs(a)}")
        ref = {"shape": a["shape"], "style": "dashed,filled" if "fillcolor" in a else "dashed", "fontsize": "8",
               "label": a["label"].split("\n")[0] + "\n(ref)"}
        if "fillcolor" in a:
            ref["fillcolor"] = a["fillcolor"]
        ref_attrs[v] = _attrs(ref)

    for o in shown_ops:
        lines.append(f"o{o}{_attrs(_op_node(graph, o))}")
    if hidden:
        kinds = Counter(graph.kind_of(o) for o in hidden)
        top = ", ".join(f"{k} x{n}" for k, n in kinds.most_common(4))
        more = f", +{len(kinds) - 4} kinds" if len(kinds) > 4 else ""
        label = f"... {len(hidden)} more ops\n({top}{more})"
        lines.append("collapsed" + _attrs({"shape": "box", "style": "dashed,rounded", "color": "#777777",
                                           "label": label}))

    # Edges.
    hidden_in: set[int] = set()
    hidden_out: set[int] = set()
    uses: Counter[int] = Counter()
    for o in order:
        if is_const[o]:
            continue
        ins = [int(v) for v in graph.op_inputs(o)]
        outs = [int(v) for v in graph.op_outputs(o)]
        if o in hidden:
            hidden_in.update(v for v in ins if v in shown_vals)
            hidden_out.update(v for v in outs if v in shown_vals)
            continue
        for k, v in enumerate(ins):
            uses[v] += 1
            src = f"v{v}"
            if uses[v] > FANOUT:
                src = f"r{v}_{uses[v]}"
                lines.append(src + ref_attrs[v])
            lines.append(f"{src} -> o{o}" + (_attrs({"label": str(k)}) if len(ins) > 1 else ""))
        for k, v in enumerate(outs):
            lines.append(f"o{o} -> v{v}" + (_attrs({"label": str(k)}) if len(outs) > 1 else ""))
    for v in sorted(hidden_in):
        lines.append(f"v{v} -> collapsed [style=dotted]")
    for v in sorted(hidden_out):
        if int(producer[v]) in hidden:
            lines.append(f"collapsed -> v{v} [style=dotted]")
    for s, d in updates:
        lines.append(f"v{s} -> v{d}" + _attrs({"style": "dashed", "color": "#8e44ad", "fontcolor": "#8e44ad",
                                                "label": "update", "constraint": "false"}))
    lines.append("legend" + _attrs({"shape": "plaintext", "label": _legend(plan, slot_color, slot_members)}))
    return lines


def _title(graph: Graph) -> str:
    counts = ((graph.num_ops, "op"), (graph.num_values, "value"), (len(graph.inputs), "input"),
              (len(graph.outputs), "output"), (len(graph.updates), "update"))
    return ", ".join(f"{n} {word}{'s' if n != 1 else ''}" for n, word in counts)


def _op_node(graph: Graph, o: int) -> dict[str, str]:
    attrs = graph.attrs_of(o)
    lines_ = [graph.kind_of(o)]
    items = [f"{k}={_short(v)}" for k, v in attrs.items()]
    if len(items) > _MAX_ATTRS:
        items = [*items[:_MAX_ATTRS], f"+{len(items) - _MAX_ATTRS} more"]
    lines_ += items
    name = graph.symbols.ops.get(o)
    if name:
        lines_.append(f"# {name}")
    return {"shape": "box", "style": "rounded,filled", "fillcolor": "#f4f4f4", "label": "\n".join(lines_)}


def _legend(plan: MemoryPlan | None, slot_color: dict[tuple[int, int], str],
            slot_members: Counter[tuple[int, int]]) -> str:
    rows = ['<tr><td align="left" colspan="2"><b>legend</b></td></tr>',
            '<tr><td align="left" colspan="2">box: op (kind, attributes); ellipse: value (name, type)</td></tr>',
            '<tr><td align="left" colspan="2">blue double border: input; red border: output; '
            'dashed purple: update; grey note: constant</td></tr>']
    if plan is None:
        rows.append('<tr><td align="left" colspan="2">no memory plan (draw with plan=True to colour values)</td></tr>')
    else:
        s = plan.stats()
        rows.append('<tr><td align="left" colspan="2">memory plan: fill colour = storage slot (buffer + offset); '
                    'values of one colour reuse the same bytes at different times</td></tr>')
        rows.append(f'<tr><td align="left" colspan="2">planned {_html(_human(s["planned_bytes"]))} '
                    f'(arena {_html(_human(s["arena_bytes"]))}) for {s["planned_values"]} values in '
                    f'{len(slot_color)} slots; no reuse {_html(_human(s["no_reuse_bytes"]))}; '
                    f'white: not planned</td></tr>')
        for k, (key, color) in enumerate(slot_color.items()):
            if k == _LEGEND_ROWS:
                more = len(slot_color) - _LEGEND_ROWS
                rows.append(f'<tr><td align="left" colspan="2">... {more} more slots</td></tr>')
                break
            n = slot_members[key]
            rows.append(f'<tr><td align="left" colspan="2"><font color="{color}">\u2588\u2588\u2588</font> '
                        f'{_html(_slot_name(plan, *key))} ({n} value{"s" if n != 1 else ""})</td></tr>')
    return '<<table border="0" cellborder="0" cellspacing="1" cellpadding="1">' + "".join(rows) + "</table>>"


# ----------------------------------------------------------------------------- public API
def to_dot(graph: Graph | OpGraph, *, plan: Any = None, max_ops: int = 300, rankdir: str = "TB") -> str:
    """The DOT text of a drawing of ``graph`` (no Graphviz needed); see the module doc.

    An :class:`~opgraph.frontend.tensor_algebra.OpGraph` is drawn in seed 004's notation
    (:func:`opgraph_statements`).

    ``plan`` is None (no colours), True (plan with :func:`~opgraph.memory.plan_memory`)
    or a :class:`~opgraph.memory.MemoryPlan` of this graph. Node ids are ``v<id>``
    for values, ``o<id>`` for ops, ``collapsed`` and ``legend``.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> b.output(b.op("add", x, b.op("exp", x)))
    >>> dot = to_dot(b.freeze())
    >>> print([line for line in dot.splitlines() if " -> " in line])
    ['  v0 -> o0', '  o0 -> v1', '  v0 -> o1 [label="0"]', '  v1 -> o1 [label="1"]', '  o1 -> v2']
    """
    if isinstance(graph, OpGraph):
        body = opgraph_statements(graph, rankdir)
    else:
        body = _statements(graph, _resolve_plan(graph, plan), max_ops, rankdir) + _body_clusters(graph, max_ops,
                                                                                                  rankdir)
    return "digraph opgraph {\n" + "".join(f"  {line}\n" for line in body) + "}\n"


def opgraph_statements(og: OpGraph, rankdir: str = "LR") -> list[str]:
    """DOT statements drawing an OpGraph in seed 004's notation.

    Tensors are squares and operations circles, each labelled with its name; edges carry their modes, with a
    width that grows with the number of modes. A permutation is drawn on the edge that carries it (red, with
    the ``permute_dims`` axes): an input edge of a label-aware operation (``*``, ``+``, element-wise ops) whose
    modes are the output's in another order, and the output edge of a ``permute`` node. Source tensors have a
    blue double border, results a red bold one.

    >>> import numpy as np
    >>> from opgraph.frontend.tensor_algebra import tensor_expr as T
    >>> og = (T(np.ones((2, 2)), name="A")["j,i"] + T(np.ones((2, 2)), name="B")["i,j"]).opgraph("i,j")
    >>> [line for line in opgraph_statements(og) if "->" in line][0]
    'n0 -> n2 [label="j,i  ⟲ (1,0)", penwidth="2", color="#d62728", fontcolor="#d62728"]'
    """
    lines = [f"rankdir={rankdir}", 'node [fontname="Helvetica", fontsize=11]',
             'edge [fontname="Helvetica", fontsize=10]']
    results = set(og.result_tensors())
    for u, node in enumerate(og.nodes()):
        if isinstance(node, Tensor):
            ty = f"\n{node.type}" if node.type is not None else ""
            a = {"shape": "square", "label": f"{node.name or f't{u}'}{ty}"}
            if not og.in_degree(u):
                a.update(peripheries="2", color="#1f77b4")
            if u in results:
                a.update(color="#d62728", penwidth="2")
        else:
            assert isinstance(node, Operation)
            extra = [f"{k}={_short(v)}" for k, v in list(node.attrs.items())[:_MAX_ATTRS]] if type(
                node) is Operation else []
            a = {"shape": "circle", "label": "\n".join([node.label, *extra]), "style": "filled",
                 "fillcolor": "#e8e0f0"}
        lines.append(f"n{u}{_attrs(a)}")
    for e in og.edges():
        a = {"label": e.modes or "(scalar)", "penwidth": str(max(1, len(e.labels)))}
        perm = _edge_permutation(og, e)
        if perm is not None:
            a.update(label=f"{a['label']}  ⟲ ({','.join(map(str, perm))})", color="#d62728", fontcolor="#d62728")
        lines.append(f"n{e.source} -> n{e.target}{_attrs(a)}")
    return lines


def _edge_permutation(og: OpGraph, e: Any) -> tuple[int, ...] | None:
    """The axes permutation an edge carries (``permute_dims`` axes taking its modes to the output's), or None."""
    target, source = og[e.target], og[e.source]
    if isinstance(target, (Multiply, Elementwise)):
        outs = og.out_edges(e.target)
        if len(outs) == 1 and set(e.labels) <= set(outs[0].labels):
            return permutation(e.labels, outs[0].labels)
    elif isinstance(source, Permute):
        (inp,) = og.in_edges(e.source)
        if sorted(inp.labels) == sorted(e.labels):
            return permutation(inp.labels, e.labels)
    return None


_NODE_ID = re.compile(r"\b([vo]\d+|collapsed)\b")


def _body_clusters(graph: Graph, max_ops: int, rankdir: str) -> list[str]:
    """Each body of a control-flow op drawn once, as a cluster labelled ``@name`` (node ids prefixed ``b<k>_``)."""
    lines: list[str] = []
    for k, body in enumerate(subgraphs_of(graph, recursive=True)):
        inner = _statements(body.graph, None, max_ops, rankdir)[3:-1]  # no graph defaults, no legend
        lines.append(f"subgraph cluster_b{k} {{")
        label = f"@{body.name or 'body' + str(k)}: {_title(body.graph)}"
        lines.append(f"  label={_q(label)}; style=dashed; color=\"#888888\"")
        lines.extend("  " + _NODE_ID.sub(lambda m, k=k: f"b{k}_{m.group(1)}", line) for line in inner)
        lines.append("}")
    return lines


def draw(graph: Graph | OpGraph, *, plan: Any = None, max_ops: int = 300, rankdir: str = "TB") -> graphviz.Digraph:
    """A :class:`graphviz.Digraph` of ``graph`` (same drawing as :func:`to_dot`).

    Needs the ``graphviz`` Python package (``pip install graphviz``); showing
    or rendering the result needs the ``dot`` binary as well.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> b.output(b.op("sin", b.input(("float32", (2,)), name="x")))
    >>> d = draw(b.freeze(), plan=True)  # doctest: +SKIP
    >>> d.render("g", format="svg")  # doctest: +SKIP
    """
    try:
        import graphviz
    except ImportError:
        raise MissingDependencyError("graphviz", "opgraph.viz.draw (opgraph.viz.to_dot gives the DOT text "
                                     "without it)") from None
    if isinstance(graph, OpGraph):
        body = opgraph_statements(graph, rankdir)
    else:
        body = _statements(graph, _resolve_plan(graph, plan), max_ops, rankdir)
    return graphviz.Digraph(name="opgraph", body=[f"\t{line}\n" for line in body])


def dot_binary() -> str:
    """Path of the ``dot`` binary; :class:`GraphvizNotFoundError` (with how to install it) if missing."""
    path = shutil.which("dot")
    if path is None:
        raise GraphvizNotFoundError(f"rendering a graph needs the Graphviz 'dot' binary, which is not on PATH; "
                                    f"{INSTALL_HINT} (opgraph.viz.to_dot() gives the DOT text without it)")
    return path


def _run_dot(dot_text: str, fmt: str, timeout: float | None = 120) -> bytes:
    proc = subprocess.run([dot_binary(), f"-T{fmt}"], input=dot_text.encode(), capture_output=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"dot -T{fmt} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def render(graph: Graph | OpGraph, path: str | os.PathLike[str], *, format: str | None = None, plan: Any = None,
           max_ops: int = 300, rankdir: str = "TB") -> str:
    """Render ``graph`` to ``path`` (svg, png or pdf; default: from the extension) with ``dot``.

    Also writes ``.dot``/``.gv`` files (the DOT text, no binary needed). The file
    is replaced atomically (:func:`opgraph.core.atomic.atomic_files`): a failed save
    leaves any earlier file as it was and no temporary behind. Raises
    :class:`GraphvizNotFoundError` naming the ``dot`` binary and how to install it
    when it is missing. Returns the path written.

    >>> import opgraph, tempfile, os
    >>> b = opgraph.GraphBuilder()
    >>> b.output(b.op("sin", b.input(("float32", (2,)), name="x")))
    >>> out = render(b.freeze(), os.path.join(tempfile.mkdtemp(), "g.dot"))
    >>> open(out).read().startswith("digraph")
    True
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    fmt = (format or ext or "svg").lower()
    if fmt == "gv":
        fmt = "dot"
    if fmt not in (*FORMATS, "dot"):
        raise ValueError(f"unknown drawing format {fmt!r}: choose one of svg, png, pdf or dot")
    text = to_dot(graph, plan=plan, max_ops=max_ops, rankdir=rankdir)
    if fmt == "dot":
        data = text.encode()
    else:
        data = _run_dot(text, fmt)
    # Made whole in memory first (dot has run), then written under a fresh temporary name and renamed.
    with atomic_files([path]) as (f,):
        f.write(data)
    return path


def graph_repr_svg(graph: Graph | OpGraph, *, max_ops: int = 300) -> str | None:
    """SVG text of ``graph`` for notebooks (``Graph._repr_svg_``), or None when ``dot`` is missing or fails.

    >>> import opgraph
    >>> svg = graph_repr_svg(opgraph.GraphBuilder().freeze())
    >>> svg is None or "<svg" in svg
    True
    """
    if shutil.which("dot") is None:
        return None
    try:
        return _run_dot(to_dot(graph, max_ops=max_ops), "svg", timeout=60).decode()
    except Exception:
        return None


# Graph._repr_svg_ (notebook display) lives in core, which may not import this layer; it draws through this hook.
hooks.SVG.set(graph_repr_svg)
