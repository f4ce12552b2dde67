"""The tensor-algebra view (seed 004): ``OpGraph``, a bipartite graph of tensors and operations whose edges carry
tensor modes, and ``tensor_expr``, the index-notation layer that builds it.

Nodes are :class:`Tensor` s (data references, or results) and :class:`Operation` s; every edge joins a tensor and
an operation and is labelled with modes (``"i,j"``): on an edge into an operation they name the input's axes, in
the tensor's order; on an edge out of it they name the result's axes. A permutation is not a node: it is read by
comparing labels (``Add`` with an input edge ``"j,i"`` and an output edge ``"i,j"`` adds a transpose). The API
follows the Boost Graph Library: nodes are referred to by offset.

    >>> import numpy as np
    >>> A, B, C = np.ones((2, 3)), np.full((2, 3), 2.0), None
    >>> g = OpGraph()
    >>> g.add_node(Tensor(A, name="A")), g.add_node(Tensor(B, name="B")), g.add_node(Add()), g.add_node(Tensor())
    (0, 1, 2, 3)
    >>> g.add_edge(0, 2, "i,j"); g.add_edge(1, 2, "i,j"); g.add_edge(2, 3, "i,j")
    >>> g.degree(2), g.in_degree(2), g.out_degree(2), g.sources(), g.sinks()
    (3, 2, 1, [0, 1], [3])
    >>> g.edges(0)
    [Edge(0, 2, 'i,j')]
    >>> g.run()[0]
    array([[3., 3., 3.],
           [3., 3., 3.]])

Index notation: ``*`` is the seed's general multiplication (contraction, trace, tensor or element-wise product,
decided by the labels of the result); a product of several factors is one einsum, whose order opt_einsum picks:

    >>> T = tensor_expr
    >>> a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    >>> expr = T(a)["i,k"] * T(b)["k,j"] + T(np.ones((2, 4)))["i,j"]
    >>> bool(np.allclose(expr.opgraph("i,j").run()[0], a @ b + 1))
    True

Graphs convert both ways with the core :class:`~opgraph.core.graph.Graph` (:meth:`OpGraph.from_graph`,
:meth:`OpGraph.to_graph`), data included: as constants, or as inputs with their values alongside
(``to_graph(data="inputs")``); lowering a contraction to permutations and a GEMM is the rule set
``opgraph.passes.lower.LOWER`` that the backends share.
"""

from __future__ import annotations

import heapq
import numbers
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import numpy as np

from opgraph.core import hooks
from opgraph.core.builder import GraphBuilder
from opgraph.core.feeds import convert_feed
from opgraph.core.graph import Graph, GraphAndWeights
from opgraph.core.registry import get_op
from opgraph.core.types import TensorType
from opgraph.errors import GraphError, OpBuildError
from opgraph.frontend.lazy import LazyArray, append_to

__all__ = ["Add", "Cholesky", "Divide", "DivideBy", "Edge", "EigenSolve", "Elementwise", "ElementwiseMultiply",
           "Expr", "Multiply", "Node", "OpGraph", "OpGraphError", "Operation", "Permute", "Pow", "Reshape", "Scale",
           "Slice", "Subtract", "Tensor", "TensorRef", "apply", "cholesky", "eigen_solve", "permutation", "power",
           "slice_", "tensor_expr"]


class OpGraphError(GraphError):
    """An OpGraph that is not well formed, or an expression whose labels do not fit (the message names the node)."""


Labels = tuple[str, ...]


def parse_modes(modes: str | Sequence[str]) -> Labels:
    """Mode labels from ``"i,j"`` (or a sequence of labels); ``""`` is a scalar's (no modes).

    Labels are names (``"i"``, ``"mu"``, ``"a1"``); spaces around commas are ignored.

    >>> parse_modes("i, j,mu"), parse_modes(""), parse_modes(["a", "b"])
    (('i', 'j', 'mu'), (), ('a', 'b'))
    >>> parse_modes("i,,j")
    Traceback (most recent call last):
    ...
    opgraph.frontend.tensor_algebra.OpGraphError: modes 'i,,j': empty label at position 1
    """
    if isinstance(modes, str):
        text = modes.strip()
        parts = [p.strip() for p in text.split(",")] if text else []
    else:
        parts = [str(p).strip() for p in modes]
    for k, p in enumerate(parts):
        if not p:
            raise OpGraphError(f"modes {modes!r}: empty label at position {k}")
        if any(c.isspace() or c in ",[]()" for c in p):
            raise OpGraphError(f"modes {modes!r}: label {p!r} has a space, comma or bracket")
    return tuple(parts)


def _modes_text(labels: Labels) -> str:
    return ",".join(labels)


def default_labels(rank: int) -> Labels:
    """Labels for the axes of a rank-``rank`` value: ``i, j, k, ...`` then the other letters, then ``m52, ...``.

    >>> default_labels(3)
    ('i', 'j', 'k')
    """
    return tuple(_LABEL_POOL[k] if k < len(_LABEL_POOL) else f"m{k}" for k in range(rank))


_LABEL_POOL = "ijklmnopqrstuvwxyzabcdefgh" + string.ascii_uppercase
UNKNOWN_RANK = "..."
"""The one label of an edge whose tensor's rank is unknown (a positional operation's input or output)."""


@dataclass(frozen=True)
class Edge:
    """A directed edge from ``source`` to ``target`` labelled with ``modes`` (stored as ``"i,j"``, no spaces).

    >>> Edge(0, 2, "i, j") == Edge(0, 2, "i,j"), Edge(0, 2, "i,j").labels
    (True, ('i', 'j'))
    """

    source: int
    target: int
    modes: str | Sequence[str]
    labels: Labels = field(init=False, compare=False, repr=False)
    """The modes as a tuple of labels."""

    def __post_init__(self) -> None:
        labels = parse_modes(self.modes)
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "modes", _modes_text(labels))

    def __repr__(self) -> str:
        return f"Edge({self.source}, {self.target}, {self.modes!r})"


# --------------------------------------------------------------------------------------------------------- nodes
class Node:
    """A node of an OpGraph: a :class:`Tensor` or an :class:`Operation`."""

    label = "node"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.label})"


class Tensor(Node):
    """A tensor node: a data reference (a NumPy array, a lazy array, anything ``np.asarray`` takes) or a result.

    A source tensor (no edge into it) holding an array is data: :meth:`OpGraph.to_graph` makes it a constant of
    the core graph (default), or an input whose value it returns alongside (``data="inputs"``); ``constant=True``
    makes it a constant either way (a number of the computation rather than data). A tensor without a value is
    an input to feed, and needs a ``type`` (``("float64", (3, 4))`` or a :class:`~opgraph.core.types.TensorType`)
    unless an operation produces it. With both, the value is converted to the type as a feed would be.

    >>> Tensor(np.zeros((2, 3)), name="A").type
    f64[2,3]
    """

    def __init__(self, value: Any = None, *, name: str | None = None, type: Any = None,
                 constant: bool = False) -> None:
        if value is not None and not isinstance(value, LazyArray):
            value = np.asarray(value)
        self.value = value
        self.name = name
        self.constant = constant
        if type is not None:
            self.type: TensorType | None = type if isinstance(type, TensorType) else TensorType(*type)
        elif value is not None:
            self.type = value.type if isinstance(value, LazyArray) else TensorType(value.dtype, value.shape)
        else:
            self.type = None
        if constant and value is None:
            raise OpGraphError("Tensor(constant=True) needs a value")

    @property
    def label(self) -> str:  # type: ignore[override]
        return self.name or "tensor"


class Operation(Node):
    """An operation node: one core op ``kind`` with ``attrs``, applied positionally.

    Inputs are the node's in-edges, outputs its out-edges, both in the order the edges were added. For a
    positional operation (this class) the labels only name the axes, in order; the label-aware subclasses
    (:class:`Multiply`, :class:`Elementwise`, :class:`Permute`, ...) read permutations from them.

    >>> Operation("tanh").label, Operation("sum", axis=0).attrs
    ('tanh', {'axis': 0})
    """

    same_modes = False
    """Whether the (single) output's labels are a permutation of the (single) input's: the op is computed on the
    input's axes, then the result is permuted to the output edge's order."""
    display = ""
    """The node's label in printouts and drawings (default: the op kind)."""

    def __init__(self, kind: str, **attrs: Any) -> None:
        get_op(kind)  # an unknown kind fails here, with the registry's message
        self.kind = kind
        self.attrs = attrs

    @property
    def label(self) -> str:  # type: ignore[override]
        return self.display or self.kind

    def emit(self, b: GraphBuilder, ins: list[tuple[Any, Labels]], outs: list[Labels]) -> list[Any]:
        """Append the core ops computing this node to ``b``: ``ins`` are (value, labels), ``outs`` the labels of
        the output edges; return one core value per output edge."""
        if self.same_modes:
            (v, labels), = _arity(self, ins, 1)
            (out,) = _arity(self, outs, 1, "output")
            r = b.op(self.kind, v, **self.attrs)
            return [_permute(b, self, r, labels, out)]
        r = b.op(self.kind, *(v for v, _ in ins), **self.attrs)
        return list(r) if isinstance(r, tuple) else [r]

    def __repr__(self) -> str:
        if type(self) not in (Operation, Elementwise):  # a named node of the seed's, made without arguments
            return f"{type(self).__name__}()"
        attrs = "".join(f", {k}={v!r}" for k, v in self.attrs.items())
        return f"{type(self).__name__}({self.kind!r}{attrs})"


def permutation(labels: Labels, out: Labels) -> tuple[int, ...] | None:
    """The ``permute_dims`` axes putting the axes named ``labels`` in the order ``out`` names them (labels missing
    from ``out`` are left out), or None when they already are.

    >>> permutation(("i", "j"), ("j", "i")), permutation(("j",), ("i", "j"))
    ((1, 0), None)
    """
    perm = tuple(labels.index(c) for c in out if c in labels)
    return None if perm == tuple(range(len(perm))) else perm


def _require_present(op: Operation, ins: list[tuple[Any, Labels]], out: Labels) -> None:
    present = {c for _, labels in ins for c in labels}
    missing = [c for c in out if c not in present]
    if missing:
        raise OpGraphError(f"{op.label}: output mode(s) {', '.join(missing)} appear in no input edge")


def _arity(op: Operation, items: list[Any], n: int, what: str = "input") -> list[Any]:
    if len(items) != n:
        raise OpGraphError(f"{op.label} takes {n} {what} edge(s), got {len(items)}")
    return items


def _permute(b: GraphBuilder, op: Operation, v: Any, labels: Labels, out: Labels) -> Any:
    """``v`` (axes named ``labels``) with its axes in the order ``out`` names them."""
    if sorted(labels) != sorted(out) or len(set(labels)) != len(labels):
        raise OpGraphError(f"{op.label}: output modes {_modes_text(out)!r} are not a permutation of the input's "
                           f"{_modes_text(labels)!r}")
    perm = permutation(labels, out)
    return v if perm is None else b.op("permute_dims", v, axes=perm)


class Permute(Operation):
    """The identity with a permutation on its edges: the output edge's modes reorder the input's.

    >>> g = OpGraph(); a = g.add_node(Tensor(np.arange(6.0).reshape(2, 3)))
    >>> p, r = g.add_node(Permute()), g.add_node(Tensor())
    >>> g.add_edge(a, p, "i,j"); g.add_edge(p, r, "j,i")
    >>> g.run()[0].shape
    (3, 2)
    """

    display = "permute"

    def __init__(self) -> None:
        super().__init__("permute_dims")
        self.origin: tuple[Any] | None = None
        """``(axes,)`` of the core op this node was read from (:meth:`OpGraph.from_graph`), written back as they
        were when they still say what the labels say."""

    def emit(self, b: GraphBuilder, ins: list[tuple[Any, Labels]], outs: list[Labels]) -> list[Any]:
        (v, labels), = _arity(self, ins, 1)
        (out,) = _arity(self, outs, 1, "output")
        if self.origin is not None and tuple(labels[k] for k in _axes(self.origin[0], len(labels))) == out:
            return [b.op("permute_dims", v, axes=self.origin[0])]
        return [_permute(b, self, v, labels, out)]


class Multiply(Operation):
    """The seed's general multiplication: one einsum of the inputs, with labels summed unless the output keeps them.

    Contraction, trace (a label twice on one edge), tensor product and element-wise product are all this node;
    ``optimize`` is opt_einsum's path optimizer for three or more inputs.

    >>> g = OpGraph(); a, b = g.add_node(Tensor(np.ones((2, 3)))), g.add_node(Tensor(np.ones((3, 4))))
    >>> m, c = g.add_node(Multiply()), g.add_node(Tensor())
    >>> g.add_edge(a, m, "i,k"); g.add_edge(b, m, "k,j"); g.add_edge(m, c, "j,i")
    >>> g.to_graph().op(2).attrs["subscripts"]  # after the two constants, A and B
    'ik,kj->ji'
    """

    display = "*"

    def __init__(self, optimize: str = "auto") -> None:
        super().__init__("einsum", optimize=optimize)
        self.optimize = optimize
        self.origin: str | None = None
        """The subscripts of the core op this node was read from, written back when they say what the labels say
        (``"i,i"`` stays implicit)."""

    def emit(self, b: GraphBuilder, ins: list[tuple[Any, Labels]], outs: list[Labels]) -> list[Any]:
        (out,) = _arity(self, outs, 1, "output")
        if not ins:
            raise OpGraphError("* needs at least one input edge")
        if len(set(out)) != len(out):
            raise OpGraphError(f"*: output modes {_modes_text(out)!r} repeat a label")
        _require_present(self, ins, out)
        letters = _letters([labels for _, labels in ins] + [out], self.label)
        subs = ",".join("".join(letters[c] for c in labels) for _, labels in ins) + "->" + "".join(
            letters[c] for c in out)
        if self.origin is not None:
            from opgraph.ops.contraction import einsum_signature

            shapes = [b.type_of(v).shape for v, _ in ins]  # type: ignore[union-attr]
            if einsum_signature(self.origin, shapes)[0] == subs:
                subs = self.origin
        return [b.op("einsum", *(v for v, _ in ins), subscripts=subs, optimize=self.optimize)]

    def __repr__(self) -> str:
        return "Multiply()" if self.optimize == "auto" else f"Multiply(optimize={self.optimize!r})"


def _letters(label_lists: Iterable[Labels], what: str) -> dict[str, str]:
    """One einsum letter per distinct label, keeping single-letter labels where they are free."""
    labels = list(dict.fromkeys(c for ls in label_lists for c in ls))
    if len(labels) > 52:
        raise OpGraphError(f"{what}: {len(labels)} distinct labels, einsum has 52 letters")
    taken = {c for c in labels if len(c) == 1 and c in string.ascii_letters}
    spare = iter(c for c in string.ascii_letters if c not in taken)
    return {c: c if c in taken else next(spare) for c in labels}


class Elementwise(Operation):
    """An element-wise op aligned by labels: each input is permuted (and given size-1 axes for labels it lacks)
    to the output's modes, then ``kind`` is applied; ``add``/``multiply``/``maximum``/``minimum`` take any number
    of inputs (folded left to right; one input is just aligned).

    >>> g = OpGraph(); x = g.add_node(Tensor(np.arange(6.0).reshape(2, 3)))
    >>> e, y = g.add_node(Elementwise("negative")), g.add_node(Tensor())
    >>> g.add_edge(x, e, "i,j"); g.add_edge(e, y, "j,i")
    >>> g.run()[0].shape
    (3, 2)
    """

    _NARY = frozenset({"add", "multiply", "maximum", "minimum", "logical_and", "logical_or"})

    def emit(self, b: GraphBuilder, ins: list[tuple[Any, Labels]], outs: list[Labels]) -> list[Any]:
        (out,) = _arity(self, outs, 1, "output")
        arity = get_op(self.kind).arity
        if not (self.kind in self._NARY and ins) and arity is not None:
            _arity(self, ins, arity)
        _require_present(self, ins, out)
        vals = [_align(b, self, v, labels, out) for v, labels in ins]
        if self.kind in self._NARY and len(vals) == 1:
            return vals
        if self.kind in self._NARY and len(vals) > 2:
            acc = vals[0]
            for v in vals[1:]:
                acc = b.op(self.kind, acc, v, **self.attrs)
            return [acc]
        return [b.op(self.kind, *vals, **self.attrs)]


def _align(b: GraphBuilder, op: Operation, v: Any, labels: Labels, out: Labels) -> Any:
    """``v`` (axes ``labels``) arranged to broadcast against ``out``: permuted, with size-1 axes where missing."""
    extra = [c for c in labels if c not in out]
    if extra or len(set(labels)) != len(labels):
        why = f"mode(s) {', '.join(extra)} not in the output {_modes_text(out)!r}" if extra else "a repeated label"
        raise OpGraphError(f"{op.label}: input edge {_modes_text(labels)!r} has {why}")
    perm = permutation(labels, out)
    if perm is not None:
        v = b.op("permute_dims", v, axes=perm)
    order = tuple(c for c in out if c in labels)
    if order != out[len(out) - len(order):]:  # NumPy broadcasting fills leading axes only
        v = b.op("expand_dims", v, axis=tuple(k for k, c in enumerate(out) if c not in labels))
    return v


class _Arithmetic(Elementwise):
    """One of the seed's named element-wise operations: the core op ``op_kind``, drawn as ``symbol``."""

    op_kind = ""
    symbol = ""

    def __init__(self) -> None:
        super().__init__(self.op_kind)

    @property
    def label(self) -> str:  # type: ignore[override]
        return self.symbol


class Add(_Arithmetic):
    """Element-wise sum of the inputs (any number), aligned by labels."""

    op_kind, symbol = "add", "+"


class Subtract(_Arithmetic):
    """First input minus the second, aligned by labels."""

    op_kind, symbol = "subtract", "-"


class ElementwiseMultiply(_Arithmetic):
    """Element-wise (Hadamard) product, aligned by labels (the seed defines it beside the general ``*``)."""

    op_kind, symbol = "multiply", "∘"


class Divide(_Arithmetic):
    """First input divided element-wise by the second, aligned by labels."""

    op_kind, symbol = "divide", "/"


_ARITHMETIC = {c.op_kind: c for c in _Arithmetic.__subclasses__()}
"""The seed's named element-wise operations by core op kind (what :meth:`OpGraph.from_graph` makes of them)."""


class _WithConstant(Elementwise):
    """An element-wise op of one input and a number held by the node (the seed's operations with state)."""

    symbol = ""

    def __init__(self, kind: str, number: Any) -> None:
        super().__init__(kind)
        if not isinstance(number, numbers.Number) or isinstance(number, bool):
            raise OpGraphError(f"{type(self).__name__} takes a number, got {number!r}")
        self.number = number

    @property
    def label(self) -> str:  # type: ignore[override]
        return f"{self.symbol}{self.number:g}" if isinstance(self.number, float) else f"{self.symbol}{self.number}"

    def emit(self, b: GraphBuilder, ins: list[tuple[Any, Labels]], outs: list[Labels]) -> list[Any]:
        (v, labels), = _arity(self, ins, 1)
        (out,) = _arity(self, outs, 1, "output")
        x = _align(b, self, v, labels, out)
        dt = b.type_of(x).dtype  # type: ignore[union-attr]
        # The number takes the tensor's dtype where it fits (NEP 50's weak scalars), as onp does.
        c = np.result_type(dt, self.number) if dt.kind in "biu" and not float(self.number).is_integer() else dt
        x = x if c == dt else b.op("cast", x, dtype=c)
        return [b.op(self.kind, x, b.constant(np.asarray(self.number, dtype=c)))]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.number!r})"


class Scale(_WithConstant):
    """The input times a number: ``Scale(2.0)``."""

    symbol = "×"  # noqa: RUF001 (the multiplication sign is meant)

    def __init__(self, factor: Any) -> None:
        super().__init__("multiply", factor)


class DivideBy(_WithConstant):
    """The input divided by a number: ``DivideBy(3.0)`` (NumPy's ``x / 3``, not ``x * (1/3)``)."""

    symbol = "/"

    def __init__(self, divisor: Any) -> None:
        super().__init__("divide", divisor)


class Pow(_WithConstant):
    """The input raised element-wise to a power: ``Pow(2)`` squares each element (NumPy's ``**``)."""

    symbol = "^"

    def __init__(self, exponent: Any) -> None:
        super().__init__("power", exponent)


class Slice(Operation):
    """``A[begin[0]:end[0], begin[1]:end[1], ...]`` on the input's axes (in its order); the output edge may
    permute the result's modes. ``Slice((0, 0), (10, 10))`` is the seed's ``slice(A, {0, 0}, {10, 10})``."""

    display = "slice"

    same_modes = True

    def __init__(self, begin: Sequence[int], end: Sequence[int]) -> None:
        if len(begin) != len(end):
            raise OpGraphError(f"Slice: begin {tuple(begin)} and end {tuple(end)} differ in length")
        self.begin, self.end = tuple(int(x) for x in begin), tuple(int(x) for x in end)
        super().__init__("getitem", index=tuple(slice(a, z) for a, z in zip(self.begin, self.end, strict=True)))

    def __repr__(self) -> str:
        return f"Slice({self.begin}, {self.end})"


class Reshape(Operation):
    """The input reshaped to ``shape`` (row-major); the labels of the output edge name the new axes."""

    display = "reshape"

    def __init__(self, shape: Sequence[int]) -> None:
        super().__init__("reshape", shape=tuple(int(x) for x in shape))

    def __repr__(self) -> str:
        return f"Reshape({self.attrs['shape']})"


class Cholesky(Operation):
    """The lower Cholesky factor ``L`` of a Hermitian positive-definite matrix (``A = L Lᴴ``)."""

    display = "cholesky"

    same_modes = True

    def __init__(self) -> None:
        super().__init__("cholesky")


class EigenSolve(Operation):
    """``A v = λ B v`` for Hermitian ``A`` (and Hermitian positive-definite ``B``, the second input edge if any).

    Output edges, in order: the eigenvectors (as columns) and the eigenvalues (ascending), as in the seed's
    ``std::make_pair(v("i,j"), λ("j")) = eigen_solve(A("i,j"), B("i,j"))``. With ``B``, the problem is reduced
    with ``B``'s Cholesky factor ``L``: ``C = L⁻¹ A L⁻ᴴ``, ``C y = λ y``, ``v = L⁻ᴴ y``.
    """

    display = "eigen_solve"

    def __init__(self) -> None:
        super().__init__("eigh")

    def emit(self, b: GraphBuilder, ins: list[tuple[Any, Labels]], outs: list[Labels]) -> list[Any]:
        if len(ins) not in (1, 2):
            raise OpGraphError(f"eigen_solve takes 1 or 2 input edges (A, optionally B), got {len(ins)}")
        vec_labels, _ = _arity(self, outs, 2, "output")
        (a, la), *rest = ins
        if len(la) != 2:
            raise OpGraphError(f"eigen_solve: A's edge has modes {_modes_text(la)!r}; it needs two")
        if rest:
            (bm, lb), = rest
            bm = _permute(b, self, bm, lb, la)
            low = b.op("cholesky", bm)
            x = b.op("solve", low, a)  # L⁻¹ A
            c = b.op("permute_dims", b.op("solve", low, b.op("conj", b.op("permute_dims", x, axes=(1, 0)))),
                     axes=(1, 0))  # (L⁻¹ (L⁻¹ A)ᴴ)ᴴ = L⁻¹ A L⁻ᴴ
            w, y = b.op("eigh", c)
            v = b.op("solve", b.op("conj", b.op("permute_dims", low, axes=(1, 0))), y)
        else:
            w, v = b.op("eigh", a)
        return [_permute(b, self, v, la, vec_labels), w]


# --------------------------------------------------------------------------------------------------------- graph
class OpGraph:
    """A bipartite directed graph of tensors and operations with mode-labelled edges (seed 004; BGL-style API).

    ``OpGraph(n)`` reserves room for ``n`` nodes. Nodes are referred to by offset (two equal nodes are still two
    nodes); edges by ``(source, target)``. A node's edges keep the order they were added in: an operation's
    in-edges are its inputs and its out-edges its outputs, in that order. See the module doc for an example.
    """

    def __init__(self, n: int = 0) -> None:
        if not isinstance(n, int) or n < 0:
            raise OpGraphError(f"OpGraph(n): n is the number of nodes to make room for, got {n!r}")
        self.capacity = n
        self._nodes: list[Node] = []
        self._edges: list[Edge] = []
        self._in: list[list[int]] = []
        self._out: list[list[int]] = []
        self.outputs: list[int] | None = None
        """Result tensors in order; ``None`` means the sinks produced by an operation, in offset order."""
        self.updates: list[tuple[int, int]] = []
        """Update edges (source tensor, input tensor) carried from a core graph (``Graph.updates``)."""

    # ------------------------------------------------------------------ building
    def add_node(self, node: Node) -> int:
        """Add a :class:`Tensor` or :class:`Operation`; return its offset.

        >>> g = OpGraph(3); g.add_node(Tensor(np.eye(2))), g.add_node(Pow(2)), g.add_node(Tensor())
        (0, 1, 2)
        """
        if not isinstance(node, Node):
            raise OpGraphError(f"add_node takes a Tensor or an Operation, got {type(node).__name__} "
                               "(wrap an array as Tensor(A))")
        self._nodes.append(node)
        self._in.append([])
        self._out.append([])
        return len(self._nodes) - 1

    def add_edge(self, u: int, v: int, modes: str | Sequence[str]) -> None:
        """Add the edge ``u -> v`` labelled ``modes`` (``"i,j"``); one end must be a tensor, the other an operation.

        >>> g = OpGraph(); t, o = g.add_node(Tensor(np.eye(2))), g.add_node(Add())
        >>> g.add_edge(t, o, "i,j"); g.add_edge(t, t, "i,j")
        Traceback (most recent call last):
        ...
        opgraph.frontend.tensor_algebra.OpGraphError: edge 0 -> 0: both ends are tensors ...
        """
        self._check_node(u, "add_edge")
        self._check_node(v, "add_edge")
        nu, nv = self._nodes[u], self._nodes[v]
        if isinstance(nu, Tensor) == isinstance(nv, Tensor):
            both = "tensors" if isinstance(nu, Tensor) else "operations"
            raise OpGraphError(f"edge {u} -> {v}: both ends are {both} (node {u} is {nu!r}, node {v} is {nv!r}); "
                               "an OpGraph is bipartite")
        labels = parse_modes(modes)
        if isinstance(nv, Tensor):
            if self._in[v]:
                raise OpGraphError(f"edge {u} -> {v}: tensor {v} ({nv.label}) is already the result of operation "
                                   f"{self._edges[self._in[v][0]].source}; a tensor has one producer")
            if nv.value is not None:
                raise OpGraphError(f"edge {u} -> {v}: tensor {v} ({nv.label}) holds data, so it cannot also be "
                                   "an operation's result")
        tensor = nu if isinstance(nu, Tensor) else nv
        rank = tensor.type.rank if tensor.type is not None else None  # type: ignore[union-attr]
        if rank is not None and (len(labels) != rank or UNKNOWN_RANK in labels):
            raise OpGraphError(f"edge {u} -> {v}: modes {_modes_text(labels)!r} name {len(labels)} axes, tensor "
                               f"{u if tensor is nu else v} ({tensor.label}) has rank {rank}")
        self._edges.append(Edge(u, v, labels))
        self._out[u].append(len(self._edges) - 1)
        self._in[v].append(len(self._edges) - 1)

    def _check_node(self, u: int, what: str) -> None:
        if not isinstance(u, (int, np.integer)) or not 0 <= u < len(self._nodes):
            raise OpGraphError(f"{what}: no node {u!r} (the graph has {len(self._nodes)} nodes)")

    # ------------------------------------------------------------------ inspecting
    def __getitem__(self, u: int) -> Node:
        """The node at offset ``u``."""
        self._check_node(u, "OpGraph[u]")
        return self._nodes[u]

    def nodes(self) -> list[Node]:
        """The nodes, in offset order."""
        return list(self._nodes)

    def edges(self, u: int | None = None) -> list[Edge]:
        """Every edge (in the order added), or the edges touching node ``u`` (its in-edges, then its out-edges)."""
        if u is None:
            return list(self._edges)
        return self.in_edges(u) + self.out_edges(u)

    def in_edges(self, u: int) -> list[Edge]:
        """The edges into node ``u``, in the order added."""
        self._check_node(u, "in_edges")
        return [self._edges[e] for e in self._in[u]]

    def out_edges(self, u: int) -> list[Edge]:
        """The edges out of node ``u``, in the order added."""
        self._check_node(u, "out_edges")
        return [self._edges[e] for e in self._out[u]]

    def num_nodes(self) -> int:
        """Number of nodes."""
        return len(self._nodes)

    def num_edges(self) -> int:
        """Number of edges."""
        return len(self._edges)

    def degree(self, u: int) -> int:
        """Number of edges touching node ``u``."""
        return self.in_degree(u) + self.out_degree(u)

    def in_degree(self, u: int) -> int:
        """Number of edges into node ``u``."""
        self._check_node(u, "in_degree")
        return len(self._in[u])

    def out_degree(self, u: int) -> int:
        """Number of edges out of node ``u``."""
        self._check_node(u, "out_degree")
        return len(self._out[u])

    def adjacent_nodes(self, u: int) -> list[int]:
        """The nodes joined to ``u`` by an edge (either way), each once, in edge order."""
        return list(dict.fromkeys(e.target if e.source == u else e.source for e in self.edges(u)))

    def sources(self) -> list[int]:
        """Nodes with no edge into them (the input tensors, and nullary operations)."""
        return [u for u in range(len(self._nodes)) if not self._in[u]]

    def sinks(self) -> list[int]:
        """Nodes with no edge out of them (the results)."""
        return [u for u in range(len(self._nodes)) if not self._out[u]]

    def _edge_between(self, u: int, v: int) -> Edge:
        for e in self.edges(u):
            if {e.source, e.target} == {u, v}:
                return e
        raise OpGraphError(f"no edge between nodes {u} and {v}")

    def source(self, u: int, v: int) -> int:
        """Of the edge between ``u`` and ``v`` (either order), the node it leaves."""
        return self._edge_between(u, v).source

    def sink(self, u: int, v: int) -> int:
        """Of the edge between ``u`` and ``v`` (either order), the node it enters."""
        return self._edge_between(u, v).target

    def result_tensors(self) -> list[int]:
        """The tensors :meth:`to_graph` returns: ``outputs`` if set, else every sink tensor an operation produces."""
        if self.outputs is not None:
            return list(self.outputs)
        return [u for u in self.sinks() if isinstance(self._nodes[u], Tensor) and self._in[u]]

    def __repr__(self) -> str:
        return f"OpGraph({self.num_nodes()} nodes, {self.num_edges()} edges)"

    def _repr_svg_(self) -> str | None:
        # Notebook display: drawing is opgraph.viz's job (a layer above), reached through the core's hook.
        return hooks.SVG.get()(self)

    def __str__(self) -> str:
        lines = [repr(self)]
        for u, node in enumerate(self._nodes):
            if isinstance(node, Operation):
                ins = ", ".join(f"{e.source}[{e.modes}]" for e in self.in_edges(u))
                outs = ", ".join(f"{e.target}[{e.modes}]" for e in self.out_edges(u))
                lines.append(f"  {outs} = {node.label}({ins})  # node {u}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ conversion
    def _names(self) -> dict[int, str | None]:
        """Input names of the source tensors: their own name, else ``t<offset>`` for one with data (to feed it
        by name), else none; made unique with ``_<offset>``."""
        names: dict[int, str | None] = {}
        used: set[str] = set()
        for u, node in enumerate(self._nodes):
            if isinstance(node, Tensor) and not self._in[u] and not node.constant and not isinstance(
                    node.value, LazyArray):
                name = node.name or (f"t{u}" if node.value is not None else None)
                if name is None:
                    names[u] = None
                    continue
                if name in used:
                    name = f"{name}_{u}"
                used.add(name)
                names[u] = name
        return names

    def _order(self) -> list[int]:
        """Source tensors and operations in a topological order, lowest offset first among the ready ones (so a
        graph whose nodes were added in order is emitted in that order, and its values keep their numbers)."""
        # an operation waits for the producers of its input tensors (source tensors are there from the start)
        missing = {u: sum(1 for t in {self._edges[e].source for e in self._in[u]} if self._in[t])
                   for u, n in enumerate(self._nodes) if isinstance(n, Operation)}
        ready = [u for u, k in missing.items() if k == 0] + [
            u for u, n in enumerate(self._nodes) if isinstance(n, Tensor) and not self._in[u]]
        heapq.heapify(ready)
        order = []
        while ready:
            u = heapq.heappop(ready)
            order.append(u)
            if isinstance(self._nodes[u], Tensor):
                continue
            for e in self._out[u]:
                t = self._edges[e].target
                for c in {self._edges[f].target for f in self._out[t]}:
                    missing[c] -= 1
                    if missing[c] == 0:
                        heapq.heappush(ready, c)
        if len(order) - sum(isinstance(self._nodes[u], Tensor) for u in order) != len(missing):
            stuck = sorted(set(missing) - set(order))
            raise OpGraphError(f"the graph has a cycle through operation node(s) {stuck[:8]}; an OpGraph that "
                               "runs must be acyclic")
        return order

    def _source(self, b: GraphBuilder, u: int, node: Tensor, names: dict[int, str | None],
                value: dict[int, Any], data: str, weights: dict[str, np.ndarray]) -> None:
        """Add source tensor ``u`` to ``b``: a constant, a lazy array's graph, or an input (whose value, for a
        tensor holding data, goes to ``weights``)."""
        if node.constant:
            value[u] = b.constant(node.value, name=node.name)
        elif isinstance(node.value, LazyArray) and not node.value._node.is_input:
            (value[u],) = append_to(b, [node.value])
        elif node.type is None and not isinstance(node.value, LazyArray):
            if self._out[u]:
                raise OpGraphError(f"tensor node {u} ({node.label}) has no value, no type and no producer")
        elif isinstance(node.value, np.ndarray) and data == "constants":
            value[u] = b.constant(_as_declared(node, names[u]), name=names[u])
        else:
            ty = node.value.type if isinstance(node.value, LazyArray) else node.type
            name = node.value._node.name or node.name if isinstance(node.value, LazyArray) else names[u]
            value[u] = b.input(ty, name=name)
            if isinstance(node.value, np.ndarray):
                weights[names[u]] = node.value  # type: ignore[index]

    @overload
    def to_graph(self, *, data: Literal["constants"] = ...) -> Graph: ...
    @overload
    def to_graph(self, *, data: Literal["inputs"]) -> GraphAndWeights: ...
    def to_graph(self, *, data: str = "constants") -> Graph | GraphAndWeights:
        """The core :class:`~opgraph.core.graph.Graph` computing :meth:`result_tensors`, with the data of the
        source tensors (lossless: :meth:`from_graph` gives the OpGraph back; see the docs).

        ``data`` says what a source tensor holding an array becomes:

        * ``"constants"`` (default): a constant named after the tensor (``t<offset>`` if it has no name), so the
          graph runs with no feeds;
        * ``"inputs"``: an input of that name; the result is a
          :class:`~opgraph.core.graph.GraphAndWeights` ``(graph, weights)`` whose ``weights`` maps those names to
          the tensors' arrays (the arrays themselves, not copies), ready to feed (:meth:`feeds` gives the same).

        Tensors without a value (and lazy placeholders) are inputs, ``constant=True`` tensors constants, other
        lazy arrays are appended with their own graph; each operation becomes the core ops its ``emit`` writes.

        >>> g = OpGraph(); a = g.add_node(Tensor(np.eye(2), name="A"))
        >>> p, c = g.add_node(Pow(2)), g.add_node(Tensor(name="C"))
        >>> g.add_edge(a, p, "i,j"); g.add_edge(p, c, "i,j")
        >>> print(g.to_graph())
        graph() {
          %A: f64[2,2] = const [[1.0, 0.0],  [0.0, 1.0]]
          %1: f64[] = const 2.0
          %C: f64[2,2] = power(%A, %1)
          return %C
        }
        >>> graph, weights = g.to_graph(data="inputs")
        >>> print(graph)
        graph(%A: f64[2,2]) {
          %1: f64[] = const 2.0
          %C: f64[2,2] = power(%A, %1)
          return %C
        }
        >>> weights["A"] is g[a].value
        True
        """
        if data not in ("constants", "inputs"):
            raise OpGraphError(f"to_graph(data={data!r}): data is 'constants' (the default) or 'inputs'")
        names = self._names()
        if data == "constants":
            for _, dst in self.updates:
                node = self._nodes[dst]
                if isinstance(node, Tensor) and isinstance(node.value, np.ndarray) and not node.constant:
                    raise OpGraphError(f"tensor node {dst} ({names[dst]}) holds data that an update edge writes; "
                                       "a constant cannot be updated: use to_graph(data='inputs')")
        b = GraphBuilder(hash_cons=False)
        value: dict[int, Any] = {}
        weights: dict[str, np.ndarray] = {}
        for u in self._order():
            op = self._nodes[u]
            if isinstance(op, Tensor):
                self._source(b, u, op, names, value, data, weights)
                continue
            ins = [(value[e.source], e.labels) for e in self.in_edges(u)]
            outs = self.out_edges(u)
            if not outs:
                raise OpGraphError(f"operation node {u} ({op.label}) has no output edge")
            try:
                results = op.emit(b, ins, [e.labels for e in outs])
            except OpGraphError as exc:
                raise OpGraphError(f"operation node {u}: {exc}") from None
            except OpBuildError as exc:
                raise OpBuildError(f"operation node {u} ({op.label}, input edges "
                                   f"{[e.modes for e in self.in_edges(u)]}): {exc}", op=exc.op,
                                   location=exc.location) from exc
            if len(results) != len(outs):
                raise OpGraphError(f"operation node {u} ({op.label}) computes {len(results)} result(s) but has "
                                   f"{len(outs)} output edge(s)")
            for e, r in zip(outs, results, strict=True):
                t = self._nodes[e.target]
                assert isinstance(t, Tensor)
                rt = b.type_of(r)
                if t.type is not None and isinstance(rt, TensorType) and not _fits(t.type, rt):
                    raise OpGraphError(f"tensor node {e.target} ({t.label}) is declared {t.type} but operation "
                                       f"node {u} ({op.label}) computes {rt}")
                known = isinstance(rt, TensorType) and rt.rank is not None
                if known and (len(e.labels) != rt.rank or UNKNOWN_RANK in e.labels):  # type: ignore[union-attr]
                    raise OpGraphError(f"edge {u} -> {e.target}: modes {e.modes!r} name {len(e.labels)} axes, the "
                                       f"result of {op.label} has rank {rt.rank}")  # type: ignore[union-attr]
                if t.name and b.name_of(r.id) is None:
                    r = b.name(r, t.name)
                value[e.target] = r
        results = self.result_tensors()
        for u in results:
            if u not in value:
                raise OpGraphError(f"result tensor {u} ({self._nodes[u].label}) has no value and no producer")
        for src, dst in self.updates:
            b.update(value[src], value[dst])
        b.output(*(value[u] for u in results))
        if data == "inputs":
            return GraphAndWeights(b.freeze(), weights)
        return b.freeze()

    def feeds(self) -> dict[str, Any]:
        """The data of the source tensors, by the input names ``to_graph(data="inputs")`` gives them (its
        ``weights``).

        >>> g = OpGraph(); g.add_node(Tensor(np.ones(2), name="x")), g.add_node(Tensor(type=("float64", (2,))))
        (0, 1)
        >>> g.feeds()
        {'x': array([1., 1.])}
        """
        names = self._names()
        return {names[u]: self._nodes[u].value for u in names  # type: ignore[union-attr]
                if self._nodes[u].value is not None}  # type: ignore[union-attr]

    def run(self, feeds: Mapping[Any, Any] | None = None, *, backend: str = "numpy", **kw_feeds: Any
            ) -> list[np.ndarray]:
        """Evaluate the result tensors; the source tensors' data are fed, ``feeds`` (by input name) add or
        override them. See the module doc for an example."""
        graph, weights = self.to_graph(data="inputs")
        return graph.run({**weights, **(feeds or {})}, backend=backend, **kw_feeds)

    @classmethod
    def from_equations(cls, *refs: TensorRef) -> OpGraph:
        """The OpGraph of assigned tensors (``C["i,j"] = ...``, see :class:`TensorRef`); its results are ``refs``,
        in that order, and each is computed once however often other equations use it."""
        builder = _Building(cls())
        outs = []
        for r in refs:
            if not isinstance(r, TensorRef) or r.equation is None:
                raise OpGraphError(f"from_equations takes assigned tensors (C['i,j'] = ...), got {r!r}")
            outs.append(builder.ref(r))
        builder.og.outputs = outs
        return builder.og

    @classmethod
    def from_graph(cls, graph: Graph | GraphAndWeights, weights: Mapping[str, Any] | None = None) -> OpGraph:
        """The OpGraph of a core graph: a tensor node per value, an operation node per op (see the docs' table).

        Data come back as data: a named constant becomes a tensor holding its value (an unnamed one, a number
        an operation wrote, a ``Tensor(constant=True)``), and an input named in ``weights`` a tensor holding that
        value (the array itself), with the input's type. ``graph`` may be a
        :class:`~opgraph.core.graph.GraphAndWeights`, what ``to_graph(data="inputs")`` returns. So ``to_graph``
        with the same ``data`` gives the graph back, and the same weights.

        ``einsum`` becomes :class:`Multiply` with its subscripts as labels, ``permute_dims`` a :class:`Permute`
        whose edges carry the permutation, element-wise ops :class:`Elementwise` (labels aligned as NumPy
        broadcasts), every other op a positional :class:`Operation`; ``to_graph()`` gives the graph back.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder()
        >>> x = b.input(("float64", (2, 3)), name="x"); y = b.input(("float64", (3, 4)), name="y")
        >>> b.output(b.op("einsum", x, y, subscripts="ij,jk->ik"))
        >>> og = OpGraph.from_graph(b.freeze())
        >>> og.edges()
        [Edge(0, 2, 'i,j'), Edge(1, 2, 'j,k'), Edge(2, 3, 'i,k')]
        >>> og.to_graph().equals(b.freeze())
        True
        >>> og = OpGraph.from_graph(b.freeze(), {"y": np.ones((3, 4))})
        >>> og[1].value.shape, og.run(x=np.ones((2, 3)))[0][0]
        ((3, 4), array([3., 3., 3., 3.]))
        """
        if isinstance(graph, GraphAndWeights):
            if weights is not None:
                raise OpGraphError("from_graph: pass a GraphAndWeights or a graph and weights=, not both")
            graph, weights = graph
        data = _weights_by_input(graph, weights or {})
        og = cls(graph.num_values + graph.num_ops)
        node_of: dict[int, int] = {}

        def source(v: int) -> Tensor:
            name = graph.name_of(v)
            if v in data:
                return Tensor(data[v], name=name, type=graph.type_of(v))
            return Tensor(type=graph.type_of(v), name=name)

        ops = range(graph.num_ops) if graph.is_topologically_ordered() else graph.topological_order().tolist()
        inputs = graph.inputs.tolist()
        # Inputs are added where their value ids fall between the ops' outputs (a file may declare one after some
        # ops), so to_graph numbers the values as the graph did.
        pending = inputs[::-1] if inputs == sorted(inputs) else []
        if not pending:
            for v in inputs:
                node_of[v] = og.add_node(source(v))
        for op in [*ops, None]:
            first = graph.num_values
            if op is not None:  # inputs numbered before the op's outputs, and every input the op reads
                needed = max((v + 1 for v in graph.op_inputs(op).tolist() if v not in node_of), default=0)
                first = max(int(graph.op_outputs(op).min(initial=graph.num_values)), needed)
            while pending and pending[-1] < first:
                v = pending.pop()
                node_of[v] = og.add_node(source(v))
            if op is None:
                break
            kind = graph.kind_of(op)
            outs = graph.op_outputs(op).tolist()
            if kind == "const":
                (v,) = outs
                name = graph.name_of(v)
                node_of[v] = og.add_node(Tensor(graph.constant_of(op), name=name, constant=name is None))
                continue
            ins = graph.op_inputs(op).tolist()
            in_types = [graph.type_of(v) for v in ins]
            out_types = [graph.type_of(v) for v in outs]
            node, in_labels, out_labels = _operation_for(kind, graph.attrs_of(op), in_types, out_types)
            u = og.add_node(node)
            for v, labels in zip(ins, in_labels, strict=True):
                og.add_edge(node_of[v], u, labels)
            for v, labels, t in zip(outs, out_labels, out_types, strict=True):
                node_of[v] = og.add_node(Tensor(type=t if isinstance(t, TensorType) else None, name=graph.name_of(v)))
                og.add_edge(u, node_of[v], labels)
        og.outputs = [node_of[v] for v in graph.outputs.tolist()]
        og.updates = [(node_of[int(s)], node_of[int(d)]) for s, d in np.asarray(graph.updates).reshape(-1, 2)]
        return og


def _as_declared(node: Tensor, name: str | None) -> np.ndarray:
    """A data tensor's array as a value of its declared type (converted as a feed of that input would be)."""
    arr = node.value
    assert isinstance(arr, np.ndarray) and node.type is not None
    if arr.dtype == node.type.dtype and arr.shape == node.type.shape:
        return arr
    arr = convert_feed(arr, node.type, f"%{name}")
    if not node.type.accepts(arr):
        raise OpGraphError(f"tensor {name} is declared {node.type} but holds an array of shape {arr.shape}")
    return arr


def _weights_by_input(graph: Graph, weights: Mapping[str, Any]) -> dict[int, Any]:
    """The values ``weights`` gives, by input value id; a name that is no input of ``graph`` is an error, and so
    is a value that does not fit its input's type."""
    inputs = {graph.name_of(v): v for v in graph.inputs.tolist()}
    unknown = [k for k in weights if k not in inputs]
    if unknown:
        raise OpGraphError(f"from_graph: weights name no input of the graph: {unknown}; its inputs are "
                           f"{[k for k in inputs if k is not None]}")
    out = {}
    for k, w in weights.items():
        t = graph.type_of(inputs[k])
        arr = w if isinstance(w, np.ndarray) else np.asarray(w)
        if isinstance(t, TensorType) and not _fits(t, TensorType(arr.dtype, arr.shape)):
            raise OpGraphError(f"from_graph: weight {k!r} is {TensorType(arr.dtype, arr.shape)}, input %{k} "
                               f"is {t}")
        out[inputs[k]] = arr
    return out


def _axes(axes: Sequence[int] | None, rank: int) -> tuple[int, ...]:
    """``permute_dims`` axes as a permutation (None reverses, as NumPy's transpose)."""
    return tuple(range(rank))[::-1] if axes is None else tuple(int(a) % max(rank, 1) for a in axes)


def _fits(declared: TensorType, computed: TensorType) -> bool:
    """Whether a computed type matches a declared one (same dtype; dims equal where both are known)."""
    if declared.dtype != computed.dtype:
        return False
    if declared.shape is None or computed.shape is None:
        return True
    return len(declared.shape) == len(computed.shape) and all(
        a is None or b is None or a == b for a, b in zip(declared.shape, computed.shape, strict=True))


def _labels_of(t: Any) -> Labels:
    """Default labels for the axes of a value of type ``t``; ``("...",)`` when its rank is unknown (TensCalc's
    files, graphs with unknown ranks): only positional operations take such an edge."""
    if not isinstance(t, TensorType) or t.rank is None:
        return (UNKNOWN_RANK,)
    return default_labels(t.rank)


def _operation_for(kind: str, attrs: dict[str, Any], in_types: list[Any], out_types: list[Any]
                   ) -> tuple[Operation, list[Labels], list[Labels]]:
    """The OpGraph node for a core op and the labels of its in- and out-edges."""
    if kind == "einsum" and "..." not in attrs["subscripts"]:
        from opgraph.ops.contraction import einsum_signature

        explicit, _ = einsum_signature(attrs["subscripts"], [t.shape for t in in_types])
        lhs, rhs = explicit.split("->")
        m = Multiply(attrs["optimize"])
        m.origin = attrs["subscripts"]
        return m, [tuple(t) for t in lhs.split(",")], [tuple(rhs)]
    if kind == "permute_dims" and len(in_types) == 1 and getattr(in_types[0], "rank", None) is not None:
        labels = _labels_of(in_types[0])
        p = Permute()
        p.origin = (attrs["axes"],)
        return p, [labels], [tuple(labels[k] for k in _axes(attrs["axes"], len(labels)))]
    opdef = get_op(kind)
    if opdef.family == "elementwise" and len(out_types) == 1 and all(
            isinstance(t, TensorType) and t.rank is not None for t in (*in_types, *out_types)):
        out = default_labels(out_types[0].rank)
        ranks = [t.rank for t in in_types]
        if all(r <= len(out) for r in ranks):
            node = _ARITHMETIC.get(kind)
            op = node() if node is not None and not attrs else Elementwise(kind, **attrs)
            return op, [out[len(out) - r:] for r in ranks], [out]
    return Operation(kind, **attrs), [_labels_of(t) for t in in_types], [_labels_of(t) for t in out_types]


# ------------------------------------------------------------------------------------------------- index notation
def tensor_expr(value: Any = None, *, name: str | None = None, type: Any = None) -> TensorRef:
    """A tensor for index notation: ``tensor_expr(A)["i,j"]`` labels its modes (see :class:`TensorRef`).

    ``value`` is an array or a lazy array (a placeholder becomes an input to feed); without one, the tensor is a
    result to assign (``C["i,j"] = ...``) or an input of the given ``type``.

    >>> T = tensor_expr
    >>> A = np.arange(4.0).reshape(2, 2)
    >>> float((T(A)["i,j"] * T(A)["i,j"]).opgraph("").run()[0])  # a full contraction: sum of squares
    14.0
    """
    return TensorRef(value, name=name, type=type)


class Expr:
    """An index-notation expression; ``*`` contracts, ``+``/``-``/``/`` act element-wise aligned by labels."""

    def free_labels(self) -> Labels:
        """The result's modes when none are asked for (Einstein's convention: a label twice in a product is
        summed; the others stay, in order of first appearance)."""
        raise NotImplementedError

    def all_labels(self) -> set[str]:
        """Every label the expression can keep: a product inside an element-wise operation keeps each label the
        enclosing result has (``A["i,j"] * x["j"] / B["i,j"]`` keeps ``j``) and sums the others."""
        return set(self.free_labels())

    def __mul__(self, other: Any) -> Expr:
        if isinstance(other, numbers.Number):
            return _Call(Scale(other), (self,))
        return Product(_factors(self) + _factors(_expr(other)))

    def __rmul__(self, other: Any) -> Expr:
        if isinstance(other, numbers.Number):
            return _Call(Scale(other), (self,))
        return Product(_factors(_expr(other)) + _factors(self))

    def __add__(self, other: Any) -> Expr:
        return Sum(_terms(self) + _terms(_expr(other)))

    def __radd__(self, other: Any) -> Expr:
        return Sum(_terms(_expr(other)) + _terms(self))

    def __sub__(self, other: Any) -> Expr:
        return _Call(Subtract(), (self, _expr(other)))

    def __rsub__(self, other: Any) -> Expr:
        return _Call(Subtract(), (_expr(other), self))

    def __neg__(self) -> Expr:
        return _Call(Scale(-1), (self,))

    def __truediv__(self, other: Any) -> Expr:
        if isinstance(other, numbers.Number):
            return _Call(DivideBy(other), (self,))
        return _Call(Divide(), (self, _expr(other)))

    def __pow__(self, exponent: Any) -> Expr:
        return _Call(Pow(exponent), (self,))

    def opgraph(self, modes: str | Sequence[str] | None = None) -> OpGraph:
        """The OpGraph computing this expression with the result's modes in the order ``modes`` gives
        (default: :meth:`free_labels`).

        >>> T = tensor_expr
        >>> og = (T(np.ones((2, 3)))["i,k"] * T(np.ones((3, 4)))["k,j"]).opgraph("j,i")
        >>> og.run()[0].shape
        (4, 2)
        """
        builder = _Building(OpGraph())
        out = self.free_labels() if modes is None else parse_modes(modes)
        u = builder.result(self, out)
        builder.og.outputs = [u]
        return builder.og

    def eval(self, modes: str | Sequence[str] | None = None, *, backend: str = "numpy") -> np.ndarray:
        """The value of the expression (modes as in :meth:`opgraph`)."""
        return self.opgraph(modes).run(backend=backend)[0]


def _expr(x: Any) -> Expr:
    if isinstance(x, Expr):
        return x
    raise OpGraphError(f"index notation combines labelled tensors (T(A)['i,j']), got {type(x).__name__}; "
                       "label it first")


def _factors(e: Expr) -> list[Expr]:
    return list(e.factors) if isinstance(e, Product) else [e]


def _terms(e: Expr) -> list[Expr]:
    return list(e.terms) if isinstance(e, Sum) else [e]


class TensorRef:
    """A tensor in index notation (what :func:`tensor_expr` returns): index it with modes to use it, assign to
    its modes to define it.

    The same ``TensorRef`` used twice is one tensor node; two ``tensor_expr`` of the same array are two nodes
    (the OpGraph takes what it is given: seed 004, "Identifying unique/repeat tensors").

    >>> T = tensor_expr
    >>> a, b = T(np.arange(6.0).reshape(2, 3), name="a"), T(np.ones((2, 3)), name="b")
    >>> c, d = T(name="c"), T(name="d")
    >>> aij = a["i,j"]
    >>> c["i,j"] = aij * b["i,j"]
    >>> d["j,i"] = aij / b["i,j"]
    >>> og = OpGraph.from_equations(c, d)
    >>> [x.shape for x in og.run()]
    [(2, 3), (3, 2)]
    """

    def __init__(self, value: Any = None, *, name: str | None = None, type: Any = None) -> None:
        self.tensor = Tensor(value, name=name, type=type)
        self.equation: tuple[Labels, Expr] | None = None

    @property
    def name(self) -> str | None:
        """The tensor's name (its input or output name in the core graph)."""
        return self.tensor.name

    def __getitem__(self, modes: str | Sequence[str]) -> Indexed:
        return Indexed(self, parse_modes(modes))

    def __setitem__(self, modes: str | Sequence[str], expr: Any) -> None:
        if self.tensor.value is not None:
            raise OpGraphError(f"tensor {self.tensor.label} holds data; assign to a tensor made without a value "
                               "(tensor_expr(name=...))")
        if self.equation is not None:
            raise OpGraphError(f"tensor {self.tensor.label} is already assigned")
        self.equation = (parse_modes(modes), _expr(expr))

    def __repr__(self) -> str:
        return f"tensor_expr({self.tensor.label})"


@dataclass(eq=False)
class Indexed(Expr):
    """A tensor with its modes labelled: ``T(A)["i,j"]``."""

    ref: TensorRef
    labels: Labels

    def free_labels(self) -> Labels:
        return tuple(c for c in self.labels if self.labels.count(c) == 1)

    def all_labels(self) -> set[str]:
        return set(self.labels)

    def __repr__(self) -> str:
        return f"{self.ref.tensor.label}[{_modes_text(self.labels)!r}]"


@dataclass(eq=False)
class Product(Expr):
    """The general multiplication of its factors: one :class:`Multiply` (one einsum)."""

    factors: list[Expr] = field(default_factory=list)

    def free_labels(self) -> Labels:
        every = [c for f in self.factors for c in (f.labels if isinstance(f, Indexed) else f.free_labels())]
        return tuple(dict.fromkeys(c for c in every if every.count(c) == 1))

    def all_labels(self) -> set[str]:
        return set().union(*(f.all_labels() for f in self.factors))

    def __repr__(self) -> str:
        return " * ".join(map(repr, self.factors))


@dataclass(eq=False)
class Sum(Expr):
    """The element-wise sum of its terms, aligned by labels: one :class:`Add`."""

    terms: list[Expr] = field(default_factory=list)

    def free_labels(self) -> Labels:
        return self.terms[0].free_labels()

    def all_labels(self) -> set[str]:
        return set().union(*(t.all_labels() for t in self.terms))

    def __repr__(self) -> str:
        return "(" + " + ".join(map(repr, self.terms)) + ")"


@dataclass(eq=False)
class _Call(Expr):
    """An operation applied to expressions; ``index`` picks one output of a multi-output operation."""

    op: Operation
    args: tuple[Expr, ...]
    index: int = 0
    n_out: int = 1

    def free_labels(self) -> Labels:
        first = self.args[0].free_labels()
        if isinstance(self.op, EigenSolve) and self.index == 1:
            return first[1:]
        return first

    def all_labels(self) -> set[str]:
        if isinstance(self.op, Elementwise):
            return set().union(*(a.all_labels() for a in self.args))
        return set(self.free_labels())


def cholesky(a: Expr) -> Expr:
    """The lower Cholesky factor of a labelled matrix (``L["i,j"] = cholesky(A["i,j"])``)."""
    return _Call(Cholesky(), (_expr(a),))


def eigen_solve(a: Expr, b: Expr | None = None) -> tuple[Expr, Expr]:
    """Eigenvectors and eigenvalues of ``A v = λ B v`` (``B`` defaults to the identity), as a pair of expressions.

    >>> T = tensor_expr
    >>> A = np.array([[2.0, 1.0], [1.0, 2.0]])
    >>> v, lam = eigen_solve(T(A)["i,j"])
    >>> lam.eval("j")
    array([1., 3.])
    """
    args = (_expr(a),) if b is None else (_expr(a), _expr(b))
    op = EigenSolve()
    return _Call(op, args, 0, 2), _Call(op, args, 1, 2)


def slice_(a: Expr, begin: Sequence[int], end: Sequence[int]) -> Expr:
    """``a[begin[0]:end[0], ...]`` on a labelled tensor (the seed's ``slice(A, {0, 0}, {10, 10})``)."""
    return _Call(Slice(begin, end), (_expr(a),))


def power(a: Expr, exponent: Any) -> Expr:
    """Element-wise power (the seed's ``pow(A, 2)``); the same as ``a ** exponent``."""
    return _Call(Pow(exponent), (_expr(a),))


def apply(kind: str, *args: Expr, **attrs: Any) -> Expr:
    """An element-wise core op on labelled tensors, aligned by labels: ``apply("exp", T(A)["i,j"])``."""
    if get_op(kind).family != "elementwise":
        raise OpGraphError(f"apply() takes element-wise ops; {kind!r} is a {get_op(kind).family} op (build an "
                           "Operation node for it)")
    return _Call(Elementwise(kind, **attrs), tuple(_expr(a) for a in args))


class _Building:
    """Turns expressions into nodes of ``og``: one node per TensorRef and per (expression, modes)."""

    def __init__(self, og: OpGraph) -> None:
        self.og = og
        self.refs: dict[int, int] = {}
        self.done: dict[tuple[int, Labels], int] = {}
        self.calls: dict[int, list[int]] = {}
        self.busy: set[int] = set()

    def ref(self, ref: TensorRef) -> int:
        u = self.refs.get(id(ref))
        if u is not None:
            return u
        if ref.equation is not None:
            if id(ref) in self.busy:
                raise OpGraphError(f"tensor {ref.tensor.label} is defined in terms of itself")
            self.busy.add(id(ref))
            labels, expr = ref.equation
            u = self.result(expr, labels, tensor=Tensor(name=ref.name))
            self.busy.discard(id(ref))
        else:
            if ref.tensor.value is None and ref.tensor.type is None:
                raise OpGraphError(f"tensor {ref.tensor.label} has no value, no type and is not assigned")
            u = self.og.add_node(ref.tensor)
        self.refs[id(ref)] = u
        return u

    def operand(self, e: Expr) -> tuple[int, Labels]:
        """The tensor node and edge labels of an operand."""
        if isinstance(e, Indexed):
            return self.ref(e.ref), e.labels
        labels = e.free_labels()
        return self.result(e, labels), labels

    def result(self, e: Expr, out: Labels, tensor: Tensor | None = None) -> int:
        """The tensor node holding ``e`` with modes ``out`` (an operation node and its edges, made once); an
        assigned tensor passes its own node as ``tensor``."""
        key = (id(e), out)
        if key in self.done and tensor is None:
            return self.done[key]
        have = e.all_labels()
        missing = [c for c in out if c not in have]
        if missing:
            raise OpGraphError(f"{e!r}: output mode(s) {', '.join(missing)} appear in no input edge")
        og = self.og
        if isinstance(e, _Call) and e.n_out > 1:
            outs = self.calls.get(id(e.op))
            if outs is None:  # the operation is made once, whichever of its outputs is asked for first
                ins = [self.operand(a) for a in e.args]
                u = og.add_node(e.op)
                for t, labels in ins:
                    og.add_edge(t, u, labels)
                own = e.args[0].free_labels()  # the seed's eigen_solve: vectors "i,j", values "j"
                outs = []
                for k in range(e.n_out):
                    labels = own if k == 0 else own[1:]
                    t = og.add_node(Tensor())
                    og.add_edge(u, t, labels)
                    outs.append((t, labels))
                self.calls[id(e.op)] = outs
            t, labels = outs[e.index]
            if labels == out and tensor is not None and og._nodes[t].name is None:
                og._nodes[t] = tensor  # the assigned tensor is this output itself
            elif labels != out or tensor is not None:
                p, t0 = og.add_node(Permute()), t
                t = og.add_node(tensor if tensor is not None else Tensor())
                og.add_edge(t0, p, labels)
                og.add_edge(p, t, out)
            self.done[key] = t
            return t
        if isinstance(e, Indexed):
            op: Operation = Permute()
            ins = [(self.ref(e.ref), e.labels)]
            if len(set(e.labels)) != len(e.labels) or set(e.labels) != set(out):
                op = Multiply()  # a trace, a diagonal or a sum over a label: einsum computes those
        elif isinstance(e, Product):
            op, ins = Multiply(), [self.operand(f) for f in e.factors]
        elif isinstance(e, (Sum, _Call)):
            op = Add() if isinstance(e, Sum) else e.op
            ins = []
            for a in (e.terms if isinstance(e, Sum) else e.args):
                if isinstance(a, Indexed) or not isinstance(op, Elementwise):
                    ins.append(self.operand(a))
                else:  # an element-wise op: its operands are computed directly in the output's modes
                    a_out = tuple(c for c in out if c in a.all_labels())
                    ins.append((self.result(a, a_out), a_out))
        else:
            raise OpGraphError(f"cannot build {type(e).__name__}")
        u = og.add_node(op)
        for t, labels in ins:
            og.add_edge(t, u, labels)
        t = og.add_node(tensor if tensor is not None else Tensor())
        og.add_edge(u, t, out)
        self.done[key] = t
        return t


