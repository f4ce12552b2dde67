"""To and from PyTensor's :class:`~pytensor.graph.fg.FunctionGraph` (seed 001's Theano FunctionGraph).

:func:`to_pytensor` writes a :class:`Graph` as a FunctionGraph of
``pytensor.tensor`` expressions: inputs become tensor variables with the
same name, dtype and static shape, constants become PyTensor constants and
each op the equivalent PyTensor expression (see ``TO_PYTENSOR`` for the op
kinds it knows). :func:`from_pytensor` walks a FunctionGraph's Apply nodes in
topological order and rebuilds them with a :class:`GraphBuilder`; it reads
what :func:`to_pytensor` writes and what users write with ``pytensor.tensor``
(``pytensor.grad`` graphs and graphs after PyTensor's rewrites included).
Anything else is an error naming the op.

    >>> import numpy as np, opgraph, pytensor
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2, 3)), name="x")
    >>> b.output(b.op("sum", b.op("exp", x), axis=1, keepdims=True, name="s"))
    >>> g = b.freeze()
    >>> fg = to_pytensor(g)
    >>> fg.inputs, fg.outputs
    ([x], [s])
    >>> py = pytensor.compile.mode.Mode(linker="py", optimizer="fast_compile")  # no C compiler needed
    >>> f = pytensor.function(fg.inputs, fg.outputs, mode=py)
    >>> np.allclose(f(np.zeros((2, 3)))[0], g.run({"x": np.zeros((2, 3))})[0])
    True
    >>> from_pytensor(fg) == g
    True

PyTensor rebuilds some opgraph kinds from several nodes (``mean`` is a sum
divided by the element count, ``keepdims`` an ``ExpandDims`` after the
reduction, ``stack`` a ``Join`` of ``ExpandDims``); :func:`from_pytensor`
recognises those patterns, so such graphs come back op for op. Graph update
edges have no FunctionGraph counterpart (PyTensor keeps updates on shared
variables of compiled functions): :func:`to_pytensor` refuses them.

Unknown dims stay unknown: PyTensor's ``Shape``/``Shape_i`` become the
``shape`` op (a constant where the dims are static), ``ARange`` ``arange``,
``Alloc``/``AllocEmpty`` and ``Reshape`` to computed shapes ``alloc`` and
``reshape_to``, run-time slice bounds ``slice``, and ``Assert`` /
``CheckAndRaise`` ``assert_all``, which keeps the check: running the graph
raises :class:`~opgraph.errors.ExecutionError` with the assertion's message.
Several integer index arrays (``x[pt.arange(n), labels]``) become
``gather_nd``; ``IncSubtensor`` (``set_subtensor``/``inc_subtensor`` of basic
indices) ``slice_update`` and ``AdvancedIncSubtensor(1)`` ``scatter_nd``
(repeated indices accumulate, as ``np.add.at``). So the graph of a model
trained on batches of any size, raw or after PyTensor's rewrites, runs on
batches of any size:

    >>> import numpy as np, pytensor, pytensor.tensor as pt
    >>> from pytensor.graph.fg import FunctionGraph
    >>> logp, y = pt.matrix("logp"), pt.ivector("y")
    >>> nll = -pt.mean(logp[pt.arange(y.shape[0]), y])
    >>> g = from_pytensor(FunctionGraph([logp, y], [nll, pytensor.grad(nll, logp)]))
    >>> float(g.run({"logp": -np.arange(6.0).reshape(3, 2), "y": np.int32([1, 1, 1])})[0])  # -(-1 - 3 - 5) / 3
    3.0
    >>> g.run({"logp": np.zeros((1, 4)), "y": np.int32([3])})[1]
    array([[ 0.,  0.,  0., -1.]])
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Graph, Value
from opgraph.core.types import TensorType, broadcast_shapes, normalize_axes
from opgraph.errors import GraphError
from opgraph.ops.shape import python_key

# ---------------------------------------------------------------- opgraph -> PyTensor
_UNARY = {
    "negative": "neg", "abs": "abs", "sign": "sign", "exp": "exp", "expm1": "expm1", "log": "log", "log1p": "log1p",
    "log2": "log2", "log10": "log10", "sqrt": "sqrt", "square": "sqr", "reciprocal": "reciprocal", "sin": "sin",
    "cos": "cos", "tan": "tan", "asin": "arcsin", "acos": "arccos", "atan": "arctan", "sinh": "sinh", "cosh": "cosh",
    "tanh": "tanh", "asinh": "arcsinh", "acosh": "arccosh", "atanh": "arctanh", "floor": "floor", "ceil": "ceil",
    "trunc": "trunc", "round": "round_half_to_even", "sigmoid": "sigmoid", "erf": "erf", "erfc": "erfc",
    "isnan": "isnan", "isinf": "isinf", "bitwise_invert": "invert", "conj": "conj", "exp2": "exp2",
}
_BINARY = {
    "add": "add", "subtract": "sub", "multiply": "mul", "divide": "true_div", "floor_divide": "floor_div",
    "remainder": "mod", "power": "pow", "maximum": "maximum", "minimum": "minimum", "atan2": "arctan2",
    "logaddexp": "logaddexp", "equal": "eq", "not_equal": "neq", "less": "lt", "less_equal": "le", "greater": "gt",
    "greater_equal": "ge", "bitwise_and": "and_", "bitwise_or": "or_", "bitwise_xor": "xor",
}
_REDUCE = {"sum": "sum", "prod": "prod", "max": "max", "min": "min", "any": "any", "all": "all"}

Emit = Callable[[list[Any], dict[str, Any], list[TensorType], list[TensorType]], Any]


def _pt() -> Any:
    import pytensor.tensor as pt

    return pt


def _const(value: Any, dtype: Any) -> Any:
    return _pt().constant(np.asarray(value, dtype=dtype))


def _truthy(x: Any) -> Any:
    # logical ops take any dtype in NumPy; PyTensor's and_/or_/xor are bitwise, so compare with 0 first
    return x if x.dtype == "bool" else _pt().neq(x, _const(0, x.dtype))


def _count(x: Any, axis: tuple[int, ...] | None) -> Any:
    """Number of reduced elements: a constant when the dims are static, else from ``x.shape``."""
    pt = _pt()
    axes = range(x.ndim) if axis is None else axis
    dims = [x.type.shape[a] for a in axes]
    if all(d is not None for d in dims):
        return int(np.prod(dims, dtype=np.int64))
    n = pt.constant(np.int64(1))
    for a in axes:
        n = n * x.shape[a]
    return n


def _mean(x: Any, axis: tuple[int, ...] | None, keepdims: bool, out_dtype: Any) -> Any:
    # sum / count with a constant count, the pattern from_pytensor turns back into one mean op
    pt = _pt()
    n = _count(x, axis)
    total = pt.sum(x, axis=axis, keepdims=keepdims)
    return pt.true_div(total, _const(n, out_dtype) if isinstance(n, int) else pt.cast(n, out_dtype))


def _var(x: Any, attrs: dict[str, Any], out_dtype: Any, sqrt: bool) -> Any:
    pt = _pt()
    axis, keepdims = attrs["axis"], attrs["keepdims"]
    d = x - pt.mean(x, axis=axis, keepdims=True)
    sq = pt.real(d * pt.conj(d)) if d.dtype.startswith("complex") else pt.sqr(d)
    n = _count(x, axis)
    denom = n - attrs["correction"] if isinstance(n, int) else pt.cast(n, out_dtype) - attrs["correction"]
    v = pt.true_div(pt.sum(sq, axis=axis, keepdims=keepdims), _const(denom, out_dtype) if isinstance(n, int) else denom)
    return pt.sqrt(v) if sqrt else v


def _logsumexp(x: Any, axis: tuple[int, ...] | None, keepdims: bool) -> Any:
    # pt.logsumexp is log(sum(exp(x))); opgraph's kernel subtracts the max first (as scipy), so do the same
    pt = _pt()
    m = pt.max(x, axis=axis, keepdims=True)
    m = pt.switch(pt.isinf(m), _const(0, m.dtype), m)
    out = pt.log(pt.sum(pt.exp(x - m), axis=axis, keepdims=True)) + m
    if not keepdims:
        out = pt.squeeze(out, axis=tuple(range(x.ndim)) if axis is None else axis)
    return out


def _split(x: Any, attrs: dict[str, Any], in_t: list[TensorType], out_t: list[TensorType]) -> Any:
    axis = attrs["axis"]
    sizes = [t.shape[axis] for t in out_t]
    if any(s is None for s in sizes):
        raise GraphError("split along an axis of unknown size: PyTensor's Split needs the part sizes")
    return _pt().split(x, sizes, n_splits=len(sizes), axis=axis)


def _solve(a: Any, b: Any) -> Any:
    return _pt().linalg.solve(a, b, b_ndim=1 if b.ndim == 1 else 2)


def _squeeze(x: Any, axis: Any, in_t: TensorType) -> Any:
    if axis is None:  # NumPy drops every size-1 axis; the static type says which those are
        if in_t.shape is None or any(d is None for d in in_t.shape):
            raise GraphError("squeeze(axis=None) of a tensor with unknown dims: the axes are not known statically")
        axis = tuple(i for i, d in enumerate(in_t.shape) if d == 1)
    return _pt().squeeze(x, axis=axis)


def _real_imag(x: Any, imag: bool) -> Any:
    pt = _pt()
    if x.dtype.startswith("complex"):
        return pt.imag(x) if imag else pt.real(x)
    return pt.zeros_like(x) if imag else pt.identity(x)


def _fmax(a: Any, b: Any, pick: str) -> Any:
    # NumPy's fmax/fmin ignore a NaN operand; PyTensor's maximum/minimum propagate it
    pt = _pt()
    m = getattr(pt, pick)(a, b)
    return pt.switch(pt.isnan(a), b, pt.switch(pt.isnan(b), a, m))


def _table() -> dict[str, Emit]:
    pt = _pt()
    from pytensor.tensor import special

    t: dict[str, Emit] = {}
    for kind, name in _UNARY.items():
        t[kind] = (lambda fn: lambda xs, a, it, ot: fn(xs[0]))(getattr(pt, name))
    for kind, name in _BINARY.items():
        t[kind] = (lambda fn: lambda xs, a, it, ot: fn(xs[0], xs[1]))(getattr(pt, name))
    for kind, name in _REDUCE.items():
        t[kind] = (lambda fn: lambda xs, a, it, ot: fn(xs[0], axis=a["axis"], keepdims=a["keepdims"]))(
            getattr(pt, name))
    t.update({
        "positive": lambda xs, a, it, ot: pt.identity(xs[0]),
        "isfinite": lambda xs, a, it, ot: pt.isfinite(xs[0]),
        "logical_not": lambda xs, a, it, ot: pt.invert(_truthy(xs[0])),
        "logical_and": lambda xs, a, it, ot: pt.and_(_truthy(xs[0]), _truthy(xs[1])),
        "logical_or": lambda xs, a, it, ot: pt.or_(_truthy(xs[0]), _truthy(xs[1])),
        "logical_xor": lambda xs, a, it, ot: pt.xor(_truthy(xs[0]), _truthy(xs[1])),
        "hypot": lambda xs, a, it, ot: pt.sqrt(pt.sqr(xs[0]) + pt.sqr(xs[1])),
        "fmax": lambda xs, a, it, ot: _fmax(xs[0], xs[1], "maximum"),
        "fmin": lambda xs, a, it, ot: _fmax(xs[0], xs[1], "minimum"),
        "real": lambda xs, a, it, ot: _real_imag(xs[0], imag=False),
        "imag": lambda xs, a, it, ot: _real_imag(xs[0], imag=True),
        "where": lambda xs, a, it, ot: pt.switch(xs[0], xs[1], xs[2]),
        "cast": lambda xs, a, it, ot: pt.cast(xs[0], str(np.dtype(a["dtype"]))),
        # NumPy's clip is minimum(maximum(x, lo), hi), also when lo > hi; PyTensor's Clip then gives lo
        "clip": lambda xs, a, it, ot: pt.minimum(pt.maximum(xs[0], xs[1]), xs[2]),
        "mean": lambda xs, a, it, ot: _mean(xs[0], a["axis"], a["keepdims"], ot[0].dtype),
        "var": lambda xs, a, it, ot: _var(xs[0], a, ot[0].dtype, sqrt=False),
        "std": lambda xs, a, it, ot: _var(xs[0], a, ot[0].dtype, sqrt=True),
        "argmax": lambda xs, a, it, ot: pt.argmax(xs[0], axis=a["axis"], keepdims=a["keepdims"]),
        "argmin": lambda xs, a, it, ot: pt.argmin(xs[0], axis=a["axis"], keepdims=a["keepdims"]),
        "cumsum": lambda xs, a, it, ot: pt.cumsum(xs[0], axis=a["axis"]),
        "cumprod": lambda xs, a, it, ot: pt.cumprod(xs[0], axis=a["axis"]),
        "logsumexp": lambda xs, a, it, ot: _logsumexp(xs[0], a["axis"], a["keepdims"]),
        "matmul": lambda xs, a, it, ot: pt.matmul(xs[0], xs[1]),
        "einsum": lambda xs, a, it, ot: pt.einsum(a["subscripts"], *xs),
        "tensordot": lambda xs, a, it, ot: pt.tensordot(xs[0], xs[1], axes=a["axes"]),
        "vecdot": lambda xs, a, it, ot: pt.sum(pt.conj(xs[0]) * xs[1], axis=a["axis"]),
        "outer": lambda xs, a, it, ot: pt.outer(xs[0], xs[1]),
        "reshape": lambda xs, a, it, ot: pt.reshape(xs[0], a["shape"]),
        "permute_dims": lambda xs, a, it, ot: xs[0].dimshuffle(
            a["axes"] if a["axes"] is not None else tuple(range(xs[0].ndim - 1, -1, -1))),
        "broadcast_to": lambda xs, a, it, ot: pt.broadcast_to(xs[0], a["shape"]),
        "expand_dims": lambda xs, a, it, ot: pt.expand_dims(xs[0], a["axis"]),
        "squeeze": lambda xs, a, it, ot: _squeeze(xs[0], a["axis"], it[0]),
        "concat": lambda xs, a, it, ot: pt.concatenate(
            [x.flatten() for x in xs] if a["axis"] is None else xs, axis=0 if a["axis"] is None else a["axis"]),
        "stack": lambda xs, a, it, ot: pt.stack(xs, axis=a["axis"]),
        "split": lambda xs, a, it, ot: _split(xs[0], a, it, ot),
        "getitem": lambda xs, a, it, ot: xs[0][python_key(a["index"], array_result=False)],
        "take": lambda xs, a, it, ot: pt.take(xs[0], xs[1], axis=a["axis"]),
        "pad": lambda xs, a, it, ot: (pt.pad(xs[0], a["pad_width"], mode="constant",
                                             constant_values=a["constant_value"]) if a["mode"] == "constant"
                                      else pt.pad(xs[0], a["pad_width"], mode=a["mode"])),
        "flip": lambda xs, a, it, ot: pt.flip(xs[0], axis=a["axis"]),
        "roll": lambda xs, a, it, ot: _roll(xs[0], a["shift"], a["axis"]),
        "tile": lambda xs, a, it, ot: pt.tile(xs[0], a["reps"]),
        "repeat": lambda xs, a, it, ot: pt.repeat(xs[0], a["repeats"], axis=a["axis"]),
        "moveaxis": lambda xs, a, it, ot: pt.moveaxis(xs[0], a["source"], a["destination"]),
        "copy": lambda xs, a, it, ot: pt.tensor_copy(xs[0]),
        "relu": lambda xs, a, it, ot: pt.maximum(xs[0], _const(0, xs[0].dtype)),
        "softmax": lambda xs, a, it, ot: special.softmax(xs[0], axis=a["axis"]),
        "log_softmax": lambda xs, a, it, ot: special.log_softmax(xs[0], axis=a["axis"]),
        "eigh": lambda xs, a, it, ot: pt.linalg.eigh(xs[0], lower=a["UPLO"] == "L"),
        "eigvalsh": lambda xs, a, it, ot: pt.linalg.eigh(xs[0], lower=a["UPLO"] == "L")[0],
        "qr": lambda xs, a, it, ot: pt.linalg.qr(xs[0], mode=a["mode"]),
        "svd": lambda xs, a, it, ot: pt.linalg.svd(xs[0], full_matrices=a["full_matrices"]),
        "svdvals": lambda xs, a, it, ot: pt.linalg.svd(xs[0], compute_uv=False),
        "cholesky": lambda xs, a, it, ot: pt.linalg.cholesky(xs[0], lower=not a["upper"]),
        "solve": lambda xs, a, it, ot: _solve(xs[0], xs[1]),
        "inv": lambda xs, a, it, ot: pt.linalg.inv(xs[0]),
        "det": lambda xs, a, it, ot: pt.linalg.det(xs[0]),
        "slogdet": lambda xs, a, it, ot: pt.linalg.slogdet(xs[0]),
        "pinv": lambda xs, a, it, ot: _pinv(xs[0], a),
        "fma": lambda xs, a, it, ot: xs[0] * xs[1] + xs[2],
        "matmul_t": lambda xs, a, it, ot: pt.matmul(_mt(xs[0]) if a["transpose_a"] else xs[0],
                                                    _mt(xs[1]) if a["transpose_b"] else xs[1]),
        "shape": lambda xs, a, it, ot: pt.cast(xs[0].shape, "int64"),
        "arange": lambda xs, a, it, ot: pt.arange(*xs, dtype=str(ot[0].dtype)),
        "alloc": lambda xs, a, it, ot: pt.alloc(xs[0], *_entries(xs[1], it[1], "alloc's shape")),
        "reshape_to": lambda xs, a, it, ot: pt.reshape(xs[0], xs[1], ndim=len(ot[0].shape)),
        "assert_all": lambda xs, a, it, ot: _assert(xs, a["message"]),
        "slice": lambda xs, a, it, ot: xs[0][_slice_key(xs, it, a["axes"])],
        "slice_update": lambda xs, a, it, ot: pt.set_subtensor(xs[0][_slice_key([xs[0], *xs[2:]], [it[0], *it[2:]],
                                                                                 a["axes"])], xs[1]),
        "gather_nd": lambda xs, a, it, ot: xs[0][_nd_key(xs[1], it[1], a["batch_dims"])],
        "scatter_nd": lambda xs, a, it, ot: _scatter_nd(xs, it, a["reduction"]),
        "sort": lambda xs, a, it, ot: _sort(xs[0], a["axis"], a["descending"]),
        "searchsorted": lambda xs, a, it, ot: pt.cast(pt.searchsorted(xs[0], xs[1], side=a["side"]), "int64"),
        "nonzero": lambda xs, a, it, ot: pt.stack([pt.cast(i, "int64") for i in pt.nonzero(xs[0])]),
        "unique": lambda xs, a, it, ot: _unique(xs[0], a["equal_nan"]),
    })
    return t


def _sort(x: Any, axis: int, descending: bool) -> tuple[Any, Any]:
    """opgraph's stable sort: PyTensor's stable argsort, of the reversed axis when descending (as the kernel)."""
    pt = _pt()
    ax = axis % x.ndim
    if descending:
        flipped = pt.argsort(pt.flip(x, axis=ax), axis=ax, kind="stable")
        idx = x.shape[ax] - 1 - pt.flip(flipped, axis=ax)
    else:
        idx = pt.argsort(x, axis=ax, kind="stable")
    idx = pt.cast(idx, "int64")
    return pt.take_along_axis(x, idx, axis=ax), idx


def _unique(x: Any, equal_nan: bool) -> tuple[Any, ...]:
    if not equal_nan:
        raise GraphError("unique with equal_nan=False (each NaN distinct, the Array API's rule) has no PyTensor "
                         "counterpart: PyTensor's Unique merges NaNs")
    pt = _pt()
    values, first, inverse, counts = pt.unique(x, return_index=True, return_inverse=True, return_counts=True)
    return (values, pt.cast(first, "int64"), pt.cast(pt.reshape(inverse, x.shape, ndim=x.ndim), "int64"),
            pt.cast(counts, "int64"))


def _entries(vec: Any, t: TensorType, what: str) -> list[Any]:
    """The scalars of a 1-D tensor whose length the static type gives."""
    if t.shape is None or t.shape[0] is None:
        raise GraphError(f"{what} has an unknown length: PyTensor needs one scalar per dim")
    return [vec[i] for i in range(t.shape[0])]


def _assert(xs: list[Any], message: str) -> Any:
    from pytensor.raise_op import Assert

    pt = _pt()
    conds = [c if c.ndim == 0 else pt.all(c) for c in xs[1:]]  # PyTensor's conditions are scalars
    return Assert(message)(xs[0], *conds) if conds else pt.identity(xs[0])


def _slice_key(xs: list[Any], it: list[TensorType], axes: tuple[int, ...] | None) -> tuple[Any, ...]:
    x, starts, ends = xs[:3]
    steps = xs[3] if len(xs) > 3 else None
    k = _entries(starts, it[1], "slice's starts")
    key: list[Any] = [slice(None)] * x.ndim
    for j, ax in enumerate(range(len(k)) if axes is None else axes):
        key[ax] = slice(starts[j], ends[j], None if steps is None else steps[j])
    return tuple(key)


def _nd_key(idx: Any, t: TensorType, batch_dims: int) -> tuple[Any, ...]:
    """gather_nd's index rows as NumPy's advanced index: one index array per indexed axis."""
    if batch_dims:
        raise GraphError("gather_nd with batch_dims: PyTensor's advanced indexing has no batch dims")
    m = None if t.shape is None else t.shape[-1]
    if m is None:
        raise GraphError("gather_nd's index rows have an unknown length: PyTensor needs one index array per axis")
    return tuple(idx[..., j] for j in range(m))


def _scatter_nd(xs: list[Any], it: list[TensorType], reduction: str) -> Any:
    pt = _pt()
    x, idx, u = xs
    key = _nd_key(idx, it[1], 0)
    if reduction == "none":
        return pt.set_subtensor(x[key], u)
    if reduction == "add":
        return pt.inc_subtensor(x[key], u)
    raise GraphError(f"scatter_nd with reduction {reduction!r}: PyTensor only sets or increments")


def _roll(x: Any, shift: Any, axis: Any) -> Any:
    # pt.roll takes one shift and one axis: roll once per axis
    shifts = (shift,) if isinstance(shift, int) else tuple(shift)
    if axis is None:
        return _pt().roll(x, shifts[0] if len(shifts) == 1 else sum(shifts))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if len(shifts) == 1:
        shifts = shifts * len(axes)
    for sh, ax in zip(shifts, axes, strict=True):
        x = _pt().roll(x, sh, axis=ax)
    return x


def _mt(x: Any) -> Any:
    return _pt().swapaxes(x, -1, -2)


def _pinv(x: Any, a: dict[str, Any]) -> Any:
    if a["rtol"] is not None:
        raise GraphError("pinv with rtol: PyTensor's pinv has no tolerance argument")
    return _pt().linalg.pinv(x, hermitian=a["hermitian"])


_TABLE: dict[str, Emit] | None = None


def _emitters() -> dict[str, Emit]:
    global _TABLE
    if _TABLE is None:
        _TABLE = _table()
    return _TABLE


def to_pytensor(graph: Graph) -> Any:
    """``graph`` as a :class:`pytensor.graph.fg.FunctionGraph` over ``pytensor.tensor`` expressions.

    Inputs keep their names, dtypes and static shapes (unknown dims become
    ``None``); outputs are the graph's outputs in order; value names are
    kept on the PyTensor variables. The FunctionGraph is built with
    ``clone=False``. An op kind PyTensor cannot express, an op with a subgraph
    body (control flow), an input of unknown rank or an update edge raises
    :class:`~opgraph.errors.GraphError`.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (None, 3)), name="x")
    >>> b.output(b.op("matmul", x, b.op("permute_dims", x), name="gram"))
    >>> fg = to_pytensor(b.freeze())
    >>> fg.outputs[0].type
    TensorType(float32, shape=(None, None))
    """
    pt = _pt()
    from pytensor.graph.fg import FunctionGraph

    from opgraph.io.formats import refuse_subgraphs

    refuse_subgraphs(graph, "the PyTensor converter")
    if len(graph.updates):
        raise GraphError("update edges cannot be expressed in a PyTensor FunctionGraph (PyTensor keeps updates on "
                         "the shared variables of compiled functions); drop them before converting")
    table = _emitters()
    env: dict[int, Any] = {}
    for v in graph.inputs.tolist():
        t = graph.type_of(v)
        if not isinstance(t, TensorType) or t.shape is None:
            raise GraphError(f"input {graph.value_label(v)} has type {t}: PyTensor tensors need a known rank")
        env[v] = pt.tensor(name=graph.name_of(v), dtype=str(t.dtype), shape=t.shape)
    for op in graph.topological_order().tolist():
        kind = graph.kind_of(op)
        outs = graph.op_outputs(op).tolist()
        if kind == "const":
            c = pt.constant(graph.constant_of(op))
            env[outs[0]] = c
            continue
        emit = table.get(kind)
        if emit is None:
            raise GraphError(f"op {op} ({kind}{_op_name(graph, op)}) has no PyTensor counterpart")
        ins = graph.op_inputs(op).tolist()
        in_types = [graph.type_of(v) for v in ins]
        out_types = [graph.type_of(v) for v in outs]
        try:
            res = emit([env[v] for v in ins], graph.attrs_of(op), in_types, out_types)
        except GraphError as exc:
            raise GraphError(f"op {op} ({kind}{_op_name(graph, op)}): {exc}") from None
        res = list(res) if isinstance(res, (list, tuple)) else [res]
        if len(res) != len(outs):
            raise GraphError(f"op {op} ({kind}): PyTensor gave {len(res)} outputs, the op has {len(outs)}")
        for v, r, t in zip(outs, res, out_types, strict=True):
            if r.ndim != len(t.shape):
                raise GraphError(f"op {op} ({kind}): PyTensor gave rank {r.ndim}, opgraph's type is {t}")
            if r.dtype != str(t.dtype):  # PyTensor's upcasting rules differ in corners (int division, sums of ints)
                r = pt.cast(r, str(t.dtype))
            # a fresh name (None unless the graph names the value) overrides PyTensor's own ('mean', 'x.T', ...)
            r.name = graph.name_of(v)
            env[v] = r
    inputs = [env[v] for v in graph.inputs.tolist()]
    outputs = [env[v] for v in graph.outputs.tolist()]
    return FunctionGraph(inputs, outputs, clone=False)


def _op_name(graph: Graph, op: int) -> str:
    name = graph.symbols.ops.get(op)
    return f" {name!r}" if name else ""


# ---------------------------------------------------------------- PyTensor -> opgraph
_SCALAR_UNARY = {
    "Neg": "negative", "Abs": "abs", "Sign": "sign", "Exp": "exp", "Expm1": "expm1", "Log": "log", "Log1p": "log1p",
    "Log2": "log2", "Log10": "log10", "Sqrt": "sqrt", "Sqr": "square", "Reciprocal": "reciprocal", "Sin": "sin",
    "Cos": "cos", "Tan": "tan", "ArcSin": "asin", "ArcCos": "acos", "ArcTan": "atan", "Sinh": "sinh", "Cosh": "cosh",
    "Tanh": "tanh", "ArcSinh": "asinh", "ArcCosh": "acosh", "ArcTanh": "atanh", "Floor": "floor", "Ceil": "ceil",
    "Trunc": "trunc", "RoundHalfToEven": "round", "Sigmoid": "sigmoid", "Erf": "erf", "Erfc": "erfc",
    "IsNan": "isnan", "IsInf": "isinf", "Conj": "conj", "Exp2": "exp2", "Real": "real", "Imag": "imag",
}
_SCALAR_BINARY = {
    "Sub": "subtract", "TrueDiv": "divide", "IntDiv": "floor_divide", "Mod": "remainder", "Pow": "power",
    "ArcTan2": "atan2", "EQ": "equal", "NEQ": "not_equal", "LT": "less", "LE": "less_equal", "GT": "greater",
    "GE": "greater_equal",
}
# n-ary associative scalar ops (PyTensor's fusion makes add(a, b, c)); bool operands make the logical kinds
_SCALAR_NARY = {"Add": "add", "Mul": "multiply", "Maximum": "maximum", "Minimum": "minimum",
                "ScalarMaximum": "maximum", "ScalarMinimum": "minimum", "AND": "bitwise_and", "OR": "bitwise_or",
                "XOR": "bitwise_xor"}
_LOGICAL = {"bitwise_and": "logical_and", "bitwise_or": "logical_or", "bitwise_xor": "logical_xor"}
_CAREDUCE = {"Add": "sum", "Mul": "prod", "Maximum": "max", "Minimum": "min", "ScalarMaximum": "max",
             "ScalarMinimum": "min", "AND": "all", "OR": "any"}


class _Failed:
    """A value whose node could not be translated: an error only if a kept op uses it."""

    __slots__ = ("error",)

    def __init__(self, error: GraphError) -> None:
        self.error = error


def _counter(var: Any) -> int | None:
    # PyTensor numbers variables as it creates them (auto_name 'auto_<n>'): the creation order of the
    # expressions, which reproduces the op order of a graph to_pytensor wrote
    try:
        return int(str(var.auto_name).rsplit("_", 1)[1])
    except (AttributeError, IndexError, ValueError):
        return None


def _order(fgraph: Any) -> list[Any]:
    """Apply nodes and the constants they use, dependencies first, in creation order where that is known."""
    from pytensor.graph.basic import Constant

    nodes = fgraph.toposort()
    items: list[Any] = []
    seen: set[int] = set()
    for node in nodes:
        for v in node.inputs:
            if isinstance(v, Constant) and id(v) not in seen:
                seen.add(id(v))
                items.append(v)
        items.append(node)
    deps: dict[int, list[Any]] = {}
    users: dict[int, list[Any]] = {}
    for it in items:
        if isinstance(it, Constant):
            deps[id(it)] = []
            continue
        ds = {id(v.owner): v.owner for v in it.inputs if v.owner is not None}
        ds.update({id(v): v for v in it.inputs if isinstance(v, Constant)})
        deps[id(it)] = list(ds.values())
        for d in ds.values():
            users.setdefault(id(d), []).append(it)
    pos = {id(it): i for i, it in enumerate(items)}

    def key(it: Any) -> tuple[int, int]:
        n = _counter(it if isinstance(it, Constant) else it.outputs[0])
        return (n if n is not None else 1 << 62, pos[id(it)])

    missing = {id(it): len(deps[id(it)]) for it in items}
    heap = [(key(it), pos[id(it)]) for it in items if missing[id(it)] == 0]
    heapq.heapify(heap)
    out: list[Any] = []
    while heap:
        _, p = heapq.heappop(heap)
        it = items[p]
        out.append(it)
        for u in users.get(id(it), []):
            missing[id(u)] -= 1
            if missing[id(u)] == 0:
                heapq.heappush(heap, (key(u), pos[id(u)]))
    return out


def _reduced_axes(axis: Any, ndim: int) -> tuple[int, ...]:
    return normalize_axes(None if axis is None else [int(a) for a in axis], ndim)


def _is_leading_expand(op: Any) -> bool:
    order = tuple(op.new_order)
    k = len(order) - op.input_ndim
    return k >= 0 and order == ("x",) * k + tuple(range(op.input_ndim))


class _Importer:
    def __init__(self, fgraph: Any) -> None:
        self.fgraph = fgraph
        self.b = GraphBuilder(hash_cons=False)
        self.env: dict[Any, Any] = {}
        self.names: set[str] = set()

    # ------------------------------------------------------------ values
    def name(self, var: Any, val: Value) -> None:
        name = getattr(var, "name", None)
        if isinstance(name, str) and name and name not in self.names and val.name is None:
            self.names.add(name)
            self.b.name(val, name)

    def get(self, var: Any) -> Value:
        from pytensor.graph.basic import Constant

        val = self.env.get(var)
        if val is None and isinstance(var, Constant):
            val = self.env[var] = self.b.constant(np.asarray(var.data, dtype=var.type.dtype))
        if val is None:
            raise GraphError(f"{var} is neither an input of the FunctionGraph nor computed in it")
        if isinstance(val, _Failed):
            raise val.error
        return val

    def static(self, var: Any) -> np.ndarray | None:
        """The value of ``var`` when it is known before run time (constants, shapes of static dims)."""
        from pytensor.graph.basic import Constant
        from pytensor.tensor.basic import get_underlying_scalar_constant_value
        from pytensor.tensor.exceptions import NotScalarConstantError

        if isinstance(var, Constant):
            return np.asarray(var.data)
        val = self.env.get(var)
        try:
            return np.asarray(get_underlying_scalar_constant_value(var))
        except (NotScalarConstantError, TypeError, ValueError):
            pass
        if isinstance(val, Value):  # computed from constants only (shapes of static dims): fold it
            try:
                return np.asarray(self.b.run({}, [val])[0])
            except GraphError:
                return None
        return None

    def ints(self, var: Any, what: str) -> tuple[int, ...]:
        arr = self.static(var)
        if arr is None:
            raise GraphError(f"{what} must be known before run time, got the computed value {var}")
        return tuple(int(i) for i in np.ravel(arr))

    def elem_input(self, var: Any) -> Value:
        # Elemwise inserts ExpandDims of leading axes to line ranks up; NumPy broadcasting does that itself
        # (but an ExpandDims putting back a reduction's axes is read as keepdims=True, as to_pytensor writes it)
        while var.owner is not None and type(var.owner.op).__name__ == "DimShuffle" and _is_leading_expand(
                var.owner.op) and not self.restores_reduced_axes(var.owner):
            var = var.owner.inputs[0]
        return self.get(var)

    def op(self, kind: str, *args: Any, **attrs: Any) -> Any:
        return self.b.op(kind, *args, **attrs)

    def fix(self, val: Value, var: Any) -> Value:
        """Make ``val`` match ``var``'s dtype and rank where NumPy's rules and PyTensor's differ."""
        dtype = getattr(var.type, "dtype", None)
        ndim = getattr(var.type, "ndim", 0)
        rank = val.type.rank
        if rank is not None and rank < ndim:
            val = self.op("expand_dims", val, axis=tuple(range(ndim - rank)))
        if dtype is not None and val.dtype != np.dtype(dtype):
            val = self.op("cast", val, dtype=dtype)
        return val

    # ------------------------------------------------------------ nodes
    def node(self, node: Any) -> list[Value]:
        op = node.op
        name = type(op).__name__
        if name == "Blockwise":
            op = op.core_op
            name = type(op).__name__
        handler = getattr(self, f"_n_{name}", None)
        if handler is None:
            for cls in type(op).__mro__[1:]:
                handler = getattr(self, f"_n_{cls.__name__}", None)
                if handler is not None:
                    break
        if handler is None:
            raise GraphError(f"opgraph cannot translate the PyTensor op {op} ({type(op).__module__}."
                             f"{type(op).__qualname__})")
        res = handler(node, op)
        res = list(res) if isinstance(res, (list, tuple)) else [res]
        return [self.fix(v, var) for v, var in zip(res, node.outputs, strict=True)]

    def _alias(self, node: Any, op: Any) -> Value:
        return self.get(node.inputs[0])

    _n_Identity = _n_ViewOp = _n_DeepCopyOp = _n_OutputGuard = _n_SpecifyShape = _alias
    _n_TensorFromScalar = _n_ScalarFromTensor = _alias

    # elementwise
    def _n_Elemwise(self, node: Any, op: Any) -> list[Value]:
        if type(op.scalar_op).__name__ == "TrueDiv":
            m = self.mean(node)
            if m is not None:
                return [m]
        args = [self.elem_input(v) for v in node.inputs]
        outs = self.scalar(op.scalar_op, args, [o.type.dtype for o in node.outputs])
        return outs

    def scalar(self, sop: Any, args: list[Value], out_dtypes: Sequence[str]) -> list[Value]:
        name = type(sop).__name__
        if name == "Composite":
            return self.composite(sop, args)
        if name in _SCALAR_UNARY:
            out = self.op(_SCALAR_UNARY[name], args[0])
        elif name in _SCALAR_BINARY:
            out = self.op(_SCALAR_BINARY[name], args[0], args[1])
        elif name in _SCALAR_NARY:
            kind = _SCALAR_NARY[name]
            if kind in _LOGICAL and all(a.dtype == np.bool_ for a in args):
                kind = _LOGICAL[kind]
            out = args[0]
            for a in args[1:]:
                out = self.op(kind, out, a)
            if len(args) == 1:
                out = self.op("positive", out)
        elif name == "Identity":
            out = args[0]
        elif name == "Invert":
            out = self.op("logical_not" if args[0].dtype == np.bool_ else "bitwise_invert", args[0])
        elif name == "Switch":
            out = self.op("where", *args)
        elif name == "Clip":
            out = self.op("clip", *args)
        elif name == "Cast":
            out = self.op("cast", args[0], dtype=out_dtypes[0])
        elif name == "Second":  # fill: b broadcast to the shape of a and b together
            out = self.fill(args[0], args[1])
        elif name == "Softplus":  # log(1 + exp(x)), stably
            out = self.op("logaddexp", args[0], self.b.constant(np.zeros((), args[0].dtype)))
        elif name == "Log1mexp":  # log(1 - exp(x))
            out = self.op("log", self.op("negative", self.op("expm1", args[0])))
        else:
            raise GraphError(f"opgraph cannot translate the PyTensor scalar op {sop} ({type(sop).__qualname__})")
        if out.dtype != np.dtype(out_dtypes[0]):
            out = self.op("cast", out, dtype=out_dtypes[0])
        return [out]

    def fill(self, a: Value, b: Value) -> Value:
        """``b`` broadcast against ``a`` (PyTensor's second/fill)."""
        shape = broadcast_shapes(a.type.shape, b.type.shape)
        if shape is not None and all(d is not None for d in shape):
            return self.op("broadcast_to", b, shape=shape)
        if a.type.rank is None or b.type.rank is None:
            raise GraphError("second/fill of tensors of unknown rank has no opgraph counterpart")
        r = max(a.type.rank, b.type.rank)
        sa, sb = (self.op("shape", v if v.type.rank == r else self.op(
            "expand_dims", v, axis=tuple(range(r - v.type.rank)))) for v in (a, b))
        # broadcasting takes b's dim where a's is 1 (also 0 against 1), a's everywhere else
        one = self.b.constant(np.int64(1))
        return self.op("alloc", b, self.op("where", self.op("equal", sa, one), sb, sa))

    def composite(self, sop: Any, args: list[Value]) -> list[Value]:
        from pytensor.graph.basic import Constant

        inner = sop.fgraph
        env: dict[Any, Value] = dict(zip(inner.inputs, args, strict=True))

        def get(v: Any) -> Value:
            if v not in env:
                if not isinstance(v, Constant):
                    raise GraphError(f"composite {sop}: {v} is not computed")
                env[v] = self.b.constant(np.asarray(v.data, dtype=v.type.dtype))
            return env[v]

        for n in inner.toposort():
            outs = self.scalar(n.op, [get(v) for v in n.inputs], [o.type.dtype for o in n.outputs])
            env.update(zip(n.outputs, outs, strict=True))
        return [get(v) for v in inner.outputs]

    # shapes
    def _n_DimShuffle(self, node: Any, op: Any) -> Value:
        fused = self.keepdims(node)
        if fused is not None:
            return fused
        x = self.get(node.inputs[0])
        order = tuple(op.new_order)
        kept = [i for i in order if i != "x"]
        drop = tuple(i for i in range(op.input_ndim) if i not in kept)
        if drop:
            x = self.op("squeeze", x, axis=drop)
        rest = sorted(kept)
        perm = tuple(rest.index(i) for i in kept)
        if perm != tuple(range(len(perm))):
            x = self.op("permute_dims", x, axes=perm)
        expand = tuple(j for j, e in enumerate(order) if e == "x")
        if expand:
            x = self.op("expand_dims", x, axis=expand)
        if not (drop or expand) and perm == tuple(range(len(perm))):
            x = self.op("permute_dims", x, axes=perm)  # an identity DimShuffle still is a node of its own
        return x

    def reduction(self, var: Any) -> tuple[str, Any, dict[str, Any]] | None:
        """``(kind, input, attrs)`` when ``var`` is the output of a reduction (keepdims False)."""
        node = var.owner
        if node is None:
            return None
        op = node.op
        name = type(op).__name__
        ndim = node.inputs[0].type.ndim
        if name == "Argmax":
            x = node.inputs[0]
            kind = "argmax"
            if x.owner is not None and type(x.owner.op).__name__ == "Elemwise" and type(
                    x.owner.op.scalar_op).__name__ == "Neg" and x.type.dtype[0] in "fi":
                x, kind = x.owner.inputs[0], "argmin"  # pt.argmin is argmax(-x)
            axes = _reduced_axes(op.axis, ndim)
            if len(axes) == ndim and ndim != 1:
                return kind, x, {"axis": None}
            if len(axes) != 1:
                raise GraphError(f"{op}: argmax over several (not all) axes has no opgraph counterpart")
            return kind, x, {"axis": axes[0]}
        if hasattr(op, "scalar_op") and hasattr(op, "axis") and name != "Elemwise":
            kind = _CAREDUCE.get(type(op.scalar_op).__name__)
            if name == "ProdWithoutZeros":
                kind = "prod"
            if kind is None:
                raise GraphError(f"opgraph cannot translate the PyTensor reduction {op}")
            axis = None if op.axis is None else _reduced_axes(op.axis, ndim)
            return kind, node.inputs[0], {"axis": axis}
        return None

    def keepdims(self, node: Any) -> Value | None:
        """A DimShuffle putting back the reduced axes of a reduction: the reduction with keepdims=True."""
        red = self.restores_reduced_axes(node)
        if red is None:
            return None
        kind, x, attrs = red
        return self.op(kind, self.get(x), keepdims=True, **attrs)

    def restores_reduced_axes(self, node: Any) -> tuple[str, Any, dict[str, Any]] | None:
        """The reduction a DimShuffle ``node`` undoes the axis removal of, if it is one."""
        op = node.op
        src = node.inputs[0]
        if src.owner is None:
            return None
        try:
            red = self.reduction(src)
        except GraphError:
            return None
        if red is None:
            return None
        kind, x, attrs = red
        order = tuple(op.new_order)
        if [i for i in order if i != "x"] != list(range(op.input_ndim)):
            return None
        if isinstance(attrs["axis"], int):
            axes: tuple[int, ...] = (attrs["axis"] % x.type.ndim,)
        else:
            axes = _reduced_axes(attrs["axis"], x.type.ndim)
        if tuple(j for j, e in enumerate(order) if e == "x") != axes or len(order) != x.type.ndim:
            return None
        return kind, x, attrs

    def mean(self, node: Any) -> Value | None:
        """``sum(x) / n`` with ``n`` the number of summed elements (a constant): one mean op."""
        num, den = node.inputs
        while den.owner is not None and type(den.owner.op).__name__ == "DimShuffle" and _is_leading_expand(
                den.owner.op):
            den = den.owner.inputs[0]
        keep = False
        src = num
        if num.owner is not None and type(num.owner.op).__name__ == "DimShuffle":
            src, keep = num.owner.inputs[0], True
        try:
            red = self.reduction(src)
        except GraphError:
            return None
        if red is None or red[0] != "sum":
            return None
        _, x, attrs = red
        shape = x.type.shape
        axes = range(x.type.ndim) if attrs["axis"] is None else attrs["axis"]
        dims = [shape[a] for a in axes]
        n = self.static(den)
        if n is None or np.ndim(n) != 0 or any(d is None for d in dims) or float(n) != float(np.prod(dims)):
            return None
        if keep and self.keepdims(num.owner) is None:
            return None
        if x.type.dtype not in ("float16", "float32", "float64", "complex64", "complex128") and \
                node.outputs[0].type.dtype != "float64":
            return None
        return self.op("mean", self.get(x), keepdims=keep, **attrs)

    def _n_CAReduce(self, node: Any, op: Any) -> Value:
        kind, x, attrs = self.reduction(node.outputs[0])  # type: ignore[misc]
        return self.op(kind, self.get(x), **attrs)

    _n_Argmax = _n_CAReduce

    def _n_CumOp(self, node: Any, op: Any) -> Value:
        return self.op("cumsum" if op.mode == "add" else "cumprod", self.get(node.inputs[0]), axis=op.axis)

    def _n_Reshape(self, node: Any, op: Any) -> Value:
        shape = self.static(node.inputs[1])
        if shape is not None:
            return self.op("reshape", self.get(node.inputs[0]), shape=tuple(int(i) for i in np.ravel(shape)))
        return self.op("reshape_to", self.get(node.inputs[0]), self.int64(node.inputs[1]))

    def _n_Shape(self, node: Any, op: Any) -> Value:
        shape = node.inputs[0].type.shape
        if all(d is not None for d in shape):  # static dims: a constant, as PyTensor's own rewrites fold it
            return self.b.constant(np.array(shape, dtype=np.int64))
        return self.op("shape", self.get(node.inputs[0]))

    def _n_Shape_i(self, node: Any, op: Any) -> Value:
        d = node.inputs[0].type.shape[op.i]
        if d is not None:
            return self.b.constant(np.int64(d))
        return self.op("getitem", self.op("shape", self.get(node.inputs[0])), index=(int(op.i),))

    def _n_ARange(self, node: Any, op: Any) -> Value:
        return self.op("arange", *[self.get(v) for v in node.inputs], dtype=str(op.dtype))

    def _n_CheckAndRaise(self, node: Any, op: Any) -> Value:
        # Assert (and CheckAndRaise): the check stays in the graph and raises ExecutionError with its message
        msg = str(getattr(op, "msg", "") or "")
        return self.op("assert_all", *[self.get(v) for v in node.inputs], message=msg)

    def shape_vector(self, parts: Sequence[Any]) -> Value:
        """Scalars (PyTensor variables) as one 1-D int64 value: a constant when they are all known."""
        known = self.static_ints(parts)
        if known is not None:
            return self.b.constant(np.array(known, dtype=np.int64).reshape(len(known)))
        pieces = [self.op("reshape", self.int64(v), shape=(1,)) for v in parts]
        return pieces[0] if len(pieces) == 1 else self.op("concat", *pieces, axis=0)

    def int64(self, var: Any) -> Value:
        """An integer PyTensor variable (an index, a shape) as an int64 value: opgraph's shape dtype."""
        v = self.get(var)
        return v if v.dtype == np.int64 else self.op("cast", v, dtype="int64")

    def _n_MakeVector(self, node: Any, op: Any) -> Value:
        vals = [self.static(v) for v in node.inputs]
        if all(v is not None for v in vals):
            return self.b.constant(np.array([np.asarray(v).item() for v in vals], dtype=op.dtype))
        parts = [self.op("reshape", self.get(v), shape=(1,)) for v in node.inputs]
        return self.op("concat", *parts, axis=0) if parts else self.b.constant(np.zeros(0, op.dtype))

    # indexing: basic (Subtensor, IncSubtensor) and advanced (integer index arrays)
    def _n_Subtensor(self, node: Any, op: Any) -> Value:
        from pytensor.tensor.subtensor import indices_from_subtensor

        idx = list(indices_from_subtensor(node.inputs[1:], op.idx_list))
        x = self.get(node.inputs[0])
        key = self.static_key(idx)
        if key is not None:
            return self.op("getitem", x, index=key)
        # run-time bounds: slice the slice entries, then take the int entries (last first, so axes stay put)
        x = self.run_time_slices(x, [(i, e) for i, e in enumerate(idx) if isinstance(e, slice)], op)
        for i in reversed([i for i, e in enumerate(idx) if not isinstance(e, slice)]):
            x = self.op("take", x, self.int64(idx[i]), axis=i)
        return x

    def static_key(self, idx: Sequence[Any]) -> tuple[Any, ...] | None:
        """A basic index whose ints and slice bounds are all known before run time (else None)."""
        key: list[Any] = []
        for e in idx:
            if isinstance(e, slice):
                parts = [None if p is None else self.static(p) for p in (e.start, e.stop, e.step)]
                if any(p is None and q is not None for p, q in zip(parts, (e.start, e.stop, e.step), strict=True)):
                    return None
                key.append(slice(*[None if p is None else int(np.asarray(p).item()) for p in parts]))
            else:
                v = self.static(e)
                if v is None:
                    return None
                key.append(int(np.asarray(v).item()))
        return tuple(key)

    def bounds(self, entries: Sequence[tuple[int, slice]], op: Any) -> tuple[Value, Value, Value]:
        """1-D int64 starts, ends and steps of ``slice`` ops for the slices ``(axis, slice)``.

        A missing bound is the sentinel Python's slicing gives it (0 or the largest int64 for a positive
        step, the largest or smallest for a negative one), which needs the step's sign before run time."""
        hi, lo = np.iinfo(np.int64).max, np.iinfo(np.int64).min
        cols: list[list[Any]] = [[], [], []]
        for _, e in entries:
            step = 1 if e.step is None else self.static(e.step)
            if step is None and (e.start is None or e.stop is None):
                raise GraphError(f"{op}: a slice with a run-time step and a missing bound has no opgraph "
                                 "counterpart (the bound's default depends on the step's sign)")
            neg = step is not None and int(np.asarray(step).item()) < 0
            for col, bound, default in ((0, e.start, hi if neg else 0), (1, e.stop, lo if neg else hi),
                                        (2, e.step, 1)):
                cols[col].append(self.b.constant(np.int64(default)) if bound is None else bound)
        return tuple(self.vector(c) for c in cols)  # type: ignore[return-value]

    def vector(self, parts: Sequence[Any]) -> Value:
        """PyTensor scalars and opgraph values as one 1-D int64 value."""
        conv = [p if isinstance(p, Value) else self.int64(p) for p in parts]
        pieces = [self.op("reshape", v if v.dtype == np.int64 else self.op("cast", v, dtype="int64"), shape=(1,))
                  for v in conv]
        return pieces[0] if len(pieces) == 1 else self.op("concat", *pieces, axis=0)

    def run_time_slices(self, x: Value, entries: Sequence[tuple[int, slice]], op: Any) -> Value:
        entries = [(i, e) for i, e in entries if e != slice(None)]
        if not entries:
            return x
        return self.op("slice", x, *self.bounds(entries, op), axes=tuple(i for i, _ in entries))

    def _n_IncSubtensor(self, node: Any, op: Any) -> Value:
        """``x[idx] = y`` or ``x[idx] += y`` (basic indices): a slice_update, ints as length-1 slices."""
        from pytensor.tensor.subtensor import indices_from_subtensor

        idx = list(indices_from_subtensor(node.inputs[2:], op.idx_list))
        x, y = self.get(node.inputs[0]), self.get(node.inputs[1])
        if y.dtype != x.dtype:
            y = self.op("cast", y, dtype=str(x.dtype))
        ints = [i for i, e in enumerate(idx) if not isinstance(e, slice)]
        # y lines up with x[idx]: put back the axes the ints removed (after the leading ones broadcasting adds)
        out_rank = x.type.rank - len(ints)
        if y.type.rank < out_rank:
            y = self.op("expand_dims", y, axis=tuple(range(out_rank - y.type.rank)))
        if ints:
            y = self.op("expand_dims", y, axis=tuple(ints))
        entries: list[tuple[int, slice]] = []
        hi = np.iinfo(np.int64).max
        for i, e in enumerate(idx):
            if isinstance(e, slice):
                entries.append((i, e))
                continue
            k = self.static(e)
            if k is not None:  # x[-1] is x[-1:], not x[-1:0]
                k = int(np.asarray(k).item())
                entries.append((i, slice(self.b.constant(np.int64(k)), self.b.constant(np.int64(k + 1 if k != -1
                                                                                              else hi)))))
            else:
                start = self.int64(e)
                minus1 = self.op("equal", start, self.b.constant(np.int64(-1)))
                stop = self.op("where", minus1, self.b.constant(np.int64(hi)),
                               self.op("add", start, self.b.constant(np.int64(1))))
                entries.append((i, slice(start, stop)))
        entries = [(i, e) for i, e in entries if e != slice(None)]
        if not entries:  # x[...] = y: y broadcast to x's shape
            if not op.set_instead_of_inc:
                return self.op("add", x, y)
            if x.type.shape is not None and None not in x.type.shape:
                return self.op("broadcast_to", y, shape=x.type.shape)
            return self.op("alloc", y, self.op("shape", x))
        bounds = self.bounds(entries, op)
        axes = tuple(i for i, _ in entries)
        if not op.set_instead_of_inc:
            y = self.op("add", self.op("slice", x, *bounds, axes=axes), y)
        return self.op("slice_update", x, y, *bounds, axes=axes)

    def expand_masks(self, op: Any, idx: list[Any]) -> list[Any]:
        """``idx`` with each boolean mask replaced by the int64 rows of its ``nonzero`` (one per axis it covers):
        NumPy's rule, which makes the result's length data-dependent (a dynamic dim)."""
        out: list[Any] = []
        for e in idx:
            if isinstance(e, slice) or e.type.dtype != "bool":
                out.append(e)
                continue
            if e.type.ndim == 0:
                raise GraphError(f"{op}: a 0-d boolean index has no opgraph counterpart")
            out += self.nonzero_rows(e)
        return out

    def nonzero_rows(self, var: Any) -> list[Value]:
        """The int64 indices of ``var``'s non-zero elements, one 1-D value per axis (PyTensor's Nonzero)."""
        rows = self.op("nonzero", self.get(var))
        return [self.op("getitem", rows, index=(i,)) for i in range(var.type.ndim)]

    def advanced(self, op: Any, idx: list[Any]) -> tuple[list[int], list[Value]]:
        """The positions and int64 values of the index arrays (advanced indices) of ``idx``."""
        arrays = [i for i, e in enumerate(idx) if not isinstance(e, slice)]
        for i in arrays:
            if not isinstance(idx[i], Value) and idx[i].type.dtype[0] not in "iu":
                raise GraphError(f"{op}: a {idx[i].type.dtype} index array has no opgraph counterpart "
                                 "(only integer and boolean index arrays)")
        return arrays, [idx[i] if isinstance(idx[i], Value) else self.int64(idx[i]) for i in arrays]

    def nd_index(self, vals: list[Value]) -> Value:
        """Index arrays broadcast together and stacked on a last axis: gather_nd's and scatter_nd's indices."""
        shapes = {v.type.shape for v in vals}
        if len(shapes) > 1 or None in next(iter(shapes)):  # broadcast at run time: add zeros of every shape
            zero = self.b.constant(np.int64(0))
            z = self.op("multiply", vals[0], zero)
            for v in vals[1:]:
                z = self.op("add", z, self.op("multiply", v, zero))
            vals = [self.op("add", v, z) for v in vals]
        return self.op("stack", *vals, axis=-1)

    def front(self, x: Value, arrays: list[int]) -> tuple[Value, list[int]]:
        """``x`` with the indexed axes moved to the front, and the permutation used."""
        perm = arrays + [i for i in range(x.type.rank) if i not in arrays]
        if perm != list(range(len(perm))):
            x = self.op("permute_dims", x, axes=tuple(perm))
        return x, perm

    def _n_AdvancedSubtensor1(self, node: Any, op: Any) -> Value:
        return self.op("take", self.get(node.inputs[0]), self.get(node.inputs[1]), axis=0)

    def _n_AdvancedSubtensor(self, node: Any, op: Any) -> Value:
        """NumPy's advanced indexing: ``take`` for one index array, ``gather_nd`` for several."""
        from pytensor.tensor.subtensor import indices_from_subtensor

        idx = self.expand_masks(op, list(indices_from_subtensor(node.inputs[1:], op.idx_list)))
        arrays, vals = self.advanced(op, idx)
        x = self.apply_slices(self.get(node.inputs[0]), idx, op)  # slices keep their axes: first
        if len(arrays) == 1:
            return self.op("take", x, vals[0], axis=arrays[0])
        xf, _ = self.front(x, arrays)
        nd = self.nd_index(vals)
        return self.numpy_layout(self.op("gather_nd", xf, nd), arrays, nd.type.rank - 1)

    def apply_slices(self, x: Value, idx: list[Any], op: Any) -> Value:
        """``x`` sliced by the slice entries of an advanced index (the array entries left whole)."""
        if not [e for e in idx if isinstance(e, slice) and e != slice(None)]:
            return x
        key = self.static_key([e if isinstance(e, slice) else slice(None) for e in idx])
        if key is not None:
            return self.op("getitem", x, index=key)
        return self.run_time_slices(x, [(i, e) for i, e in enumerate(idx) if isinstance(e, slice)], op)

    @staticmethod
    def adjacent(arrays: list[int]) -> bool:
        return arrays == list(range(arrays[0], arrays[-1] + 1))

    def numpy_layout(self, out: Value, arrays: list[int], nb: int) -> Value:
        """gather_nd's layout (index dims, then the other axes) as NumPy's: the index dims where the index
        arrays were when they are adjacent, first otherwise."""
        if self.adjacent(arrays) and arrays[0] > 0 and nb:
            out = self.op("moveaxis", out, source=tuple(range(nb)),
                          destination=tuple(range(arrays[0], arrays[0] + nb)))
        return out

    def _n_AdvancedIncSubtensor1(self, node: Any, op: Any) -> Value:
        x, y, i = node.inputs
        return self.scatter(op, self.get(x), self.get(y), [0], [self.int64(i)])

    def _n_AdvancedIncSubtensor(self, node: Any, op: Any) -> Value:
        from pytensor.tensor.subtensor import indices_from_subtensor

        idx = self.expand_masks(op, list(indices_from_subtensor(node.inputs[2:], op.idx_list)))
        if any(isinstance(e, slice) and e != slice(None) for e in idx):
            raise GraphError(f"{op}: index arrays together with partial slices have no opgraph counterpart yet")
        arrays, vals = self.advanced(op, idx)
        return self.scatter(op, self.get(node.inputs[0]), self.get(node.inputs[1]), arrays, vals)

    def scatter(self, op: Any, x: Value, y: Value, arrays: list[int], vals: list[Value]) -> Value:
        """``x[arrays] = y`` or ``+= y`` (repeated indices accumulate, as np.add.at): one scatter_nd."""
        if getattr(op, "ignore_duplicates", False) and not op.set_instead_of_inc:
            raise GraphError(f"{op}: incrementing with ignore_duplicates has no opgraph counterpart")
        if y.dtype != x.dtype:
            y = self.op("cast", y, dtype=str(x.dtype))
        xf, perm = self.front(x, arrays)
        nd = self.nd_index(vals)
        nb = nd.type.rank - 1
        # y broadcasts to NumPy's x[arrays]; scatter_nd wants exactly that, in gather_nd's layout
        y = self.broadcast_like_index(y, xf, nd, arrays, nb)
        if self.adjacent(arrays) and arrays[0] > 0 and nb:
            y = self.op("moveaxis", y, source=tuple(range(arrays[0], arrays[0] + nb)), destination=tuple(range(nb)))
        out = self.op("scatter_nd", xf, nd, y, reduction="none" if op.set_instead_of_inc else "add")
        if perm != list(range(len(perm))):
            out = self.op("permute_dims", out, axes=tuple(int(i) for i in np.argsort(perm)))
        return out

    def broadcast_like_index(self, y: Value, xf: Value, nd: Value, arrays: list[int], nb: int) -> Value:
        """``y`` broadcast to the shape of NumPy's ``x[arrays]`` (``xf`` is x with those axes in front)."""
        k = len(arrays)
        lead = (nd.type.shape or (None,))[:-1]
        rest = (xf.type.shape or ())[k:]
        ours = (*lead, *rest)
        a0 = arrays[0] if self.adjacent(arrays) else 0
        static = None if None in ours else ours[nb:nb + a0] + ours[:nb] + ours[nb + a0:]
        if static is not None:
            return y if y.type.shape == static else self.op("broadcast_to", y, shape=static)
        s = self.op("concat", self.op("getitem", self.op("shape", nd), index=(slice(None, -1),)),
                    self.op("getitem", self.op("shape", xf), index=(slice(k, None),)), axis=0)
        if a0 and nb:
            s = self.op("concat", *[self.op("getitem", s, index=(sl,))
                                    for sl in (slice(nb, nb + a0), slice(None, nb), slice(nb + a0, None))], axis=0)
        return self.op("alloc", y, s)

    def _n_Join(self, node: Any, op: Any) -> Value:
        axis = self.ints(node.inputs[0], "a join's axis")[0]
        parts = node.inputs[1:]
        # pt.stack is a Join of ExpandDims at the join axis: one stack op
        ndim = node.outputs[0].type.ndim
        if parts and all(p.owner is not None and type(p.owner.op).__name__ == "DimShuffle"
                         and tuple(p.owner.op.new_order) == tuple(
                             [*range(axis % ndim), "x", *range(axis % ndim, ndim - 1)]) for p in parts):
            return self.op("stack", *[self.get(p.owner.inputs[0]) for p in parts], axis=axis)
        return self.op("concat", *[self.get(p) for p in parts], axis=axis)

    def _n_Split(self, node: Any, op: Any) -> tuple[Value, ...]:
        axis = self.ints(node.inputs[1], "a split's axis")[0]
        sizes = self.ints(node.inputs[2], "a split's sizes")
        if len(set(sizes)) == 1:
            sections: Any = len(sizes)
        else:
            sections = tuple(int(i) for i in np.cumsum(sizes)[:-1])
        res = self.op("split", self.get(node.inputs[0]), sections=sections, axis=axis)
        return res if isinstance(res, tuple) else (res,)

    def _n_Alloc(self, node: Any, op: Any) -> Value:
        return self.alloc(self.get(node.inputs[0]), node.inputs[1:])

    def _n_AllocEmpty(self, node: Any, op: Any) -> Value:
        # the content of an empty allocation is unspecified: zeros are one valid content
        return self.alloc(self.b.constant(np.zeros((), dtype=op.dtype)), node.inputs)

    def alloc(self, x: Value, dims: Sequence[Any]) -> Value:
        known = self.static_ints(dims)
        if known is not None:
            return self.op("broadcast_to", x, shape=known)
        return self.op("alloc", x, self.shape_vector(dims))

    def static_ints(self, parts: Sequence[Any]) -> tuple[int, ...] | None:
        vals = [self.static(v) for v in parts]
        if any(v is None for v in vals):
            return None
        return tuple(int(np.asarray(v).item()) for v in vals)

    def _n_Softmax(self, node: Any, op: Any) -> Value:
        return self.op("softmax", self.get(node.inputs[0]), axis=self._one_axis(op, node))

    def _n_LogSoftmax(self, node: Any, op: Any) -> Value:
        return self.op("log_softmax", self.get(node.inputs[0]), axis=self._one_axis(op, node))

    def _one_axis(self, op: Any, node: Any) -> int:
        axis = op.axis
        if axis is None:
            if node.inputs[0].type.ndim != 1:
                raise GraphError(f"{op} over all axes has no opgraph counterpart")
            return 0
        axis = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
        if len(axis) != 1:
            raise GraphError(f"{op} over several axes has no opgraph counterpart")
        return int(axis[0])

    def _n_Einsum(self, node: Any, op: Any) -> Value:
        return self.op("einsum", *[self.get(v) for v in node.inputs], subscripts=op.subscripts)

    # contractions, BLAS nodes of compiled graphs
    def _n_Dot(self, node: Any, op: Any) -> Value:
        a, b = (self.get(v) for v in node.inputs)
        if a.type.rank == 0 or b.type.rank == 0:
            return self.op("multiply", a, b)
        return self.op("matmul", a, b)

    _n_Dot22 = _n_Dot

    def _n_Dot22Scalar(self, node: Any, op: Any) -> Value:
        x, y, s = (self.get(v) for v in node.inputs)
        return self.op("multiply", self.op("matmul", x, y), s)

    def _n_Gemm(self, node: Any, op: Any) -> Value:  # z * b + a * (x @ y)
        z, a, x, y, b = (self.get(v) for v in node.inputs)
        return self.op("add", self.op("multiply", z, b), self.op("multiply", a, self.op("matmul", x, y)))

    _n_Gemv = _n_Gemm

    def _n_Ger(self, node: Any, op: Any) -> Value:  # A + alpha * outer(x, y)
        a, alpha, x, y = (self.get(v) for v in node.inputs)
        return self.op("add", a, self.op("multiply", alpha, self.op("outer", x, y)))

    # linalg
    def _n_MatrixInverse(self, node: Any, op: Any) -> Value:
        return self.op("inv", self.get(node.inputs[0]))

    def _n_Det(self, node: Any, op: Any) -> Value:
        return self.op("det", self.get(node.inputs[0]))

    def _n_MatrixPinv(self, node: Any, op: Any) -> Value:
        return self.op("pinv", self.get(node.inputs[0]), hermitian=bool(op.hermitian))

    def _n_Cholesky(self, node: Any, op: Any) -> Value:
        return self.op("cholesky", self.get(node.inputs[0]), upper=not op.lower)

    def _n_Solve(self, node: Any, op: Any) -> Value:
        if getattr(op, "assume_a", "gen") not in ("gen", "general"):
            raise GraphError(f"{op}: opgraph's solve assumes a general matrix")
        return self.op("solve", *[self.get(v) for v in node.inputs])

    def _n_Eigh(self, node: Any, op: Any) -> tuple[Value, ...]:
        if len(node.inputs) != 1:
            raise GraphError(f"{op}: the generalised eigenproblem has no opgraph counterpart")
        return self.op("eigh", self.get(node.inputs[0]), UPLO="L" if op.lower else "U")

    def _n_QR(self, node: Any, op: Any) -> Any:
        mode = {"full": "complete", "economic": "reduced", "r": "r"}.get(op.mode)
        if mode is None or getattr(op, "pivoting", False):
            raise GraphError(f"{op}: QR mode {op.mode!r} has no opgraph counterpart")
        return self.op("qr", self.get(node.inputs[0]), mode=mode)

    def _n_SVD(self, node: Any, op: Any) -> Any:
        if not op.compute_uv:
            return self.op("svdvals", self.get(node.inputs[0]))
        return self.op("svd", self.get(node.inputs[0]), full_matrices=bool(op.full_matrices))

    # sorting, searching and sets: opgraph's sort is stable, so ties keep their order whatever PyTensor's kind
    def _sorted(self, node: Any) -> tuple[Value, Value]:
        x = self.get(node.inputs[0])
        known = self.static(node.inputs[1])
        if known is None:
            raise GraphError(f"{node.op}: the axis must be a constant")
        axis = np.asarray(known).item()
        if axis is None:  # PyTensor's axis=None sorts the flattened array
            x, axis = self.op("reshape", x, shape=(-1,)), 0
        return self.op("sort", x, axis=int(axis))

    def _n_SortOp(self, node: Any, op: Any) -> Value:
        return self._sorted(node)[0]

    def _n_ArgSortOp(self, node: Any, op: Any) -> Value:
        return self._sorted(node)[1]

    def _n_SearchsortedOp(self, node: Any, op: Any) -> Value:
        table, values = (self.get(v) for v in node.inputs[:2])
        if len(node.inputs) > 2:  # a sorter: the table read in that order
            table = self.op("take", table, self.int64(node.inputs[2]), axis=0)
        return self.op("searchsorted", table, values, side=op.side)

    def _n_Nonzero(self, node: Any, op: Any) -> list[Value]:
        return self.nonzero_rows(node.inputs[0])

    def _n_Unique(self, node: Any, op: Any) -> tuple[Value, ...]:
        if op.axis is not None:
            raise GraphError(f"{op}: unique along an axis (rows) has no opgraph counterpart")
        values, first, inverse, counts = self.op("unique", self.get(node.inputs[0]), equal_nan=True)
        if node.inputs[0].type.ndim > 1:  # PyTensor's inverse indexes the flattened input
            inverse = self.op("reshape", inverse, shape=(-1,))
        wanted = [(op.return_index, first), (op.return_inverse, inverse), (op.return_counts, counts)]
        return (values, *(v for want, v in wanted if want))

    def _n_Pad(self, node: Any, op: Any) -> Value:
        mode = op.pad_mode
        reflect = getattr(op, "reflect_type", None)
        if mode not in ("constant", "edge", "wrap", "reflect", "symmetric") or reflect not in (None, "even"):
            raise GraphError(f"{op}: pad mode {mode!r} has no opgraph counterpart")
        rank = node.inputs[0].type.ndim
        width = np.broadcast_to(np.asarray(self.ints(node.inputs[1], "pad widths")).reshape(-1, 2)
                                if rank else np.zeros((0, 2), int), (rank, 2))
        attrs: dict[str, Any] = {"pad_width": tuple(tuple(int(i) for i in row) for row in width), "mode": mode}
        if mode == "constant":
            attrs["constant_value"] = float(np.asarray(self.static(node.inputs[2])).item())
        return self.op("pad", self.get(node.inputs[0]), **attrs)

    def _n_OpFromGraph(self, node: Any, op: Any) -> list[Value]:
        # any other OpFromGraph (pt.pad, user-defined ones): inline its inner graph
        inner = op.fgraph
        for iv, ov in zip(inner.inputs, node.inputs, strict=True):
            self.env[iv] = self.get(ov)
        self.walk(inner)
        return [self.get(v) for v in inner.outputs]

    # the whole graph
    def run(self) -> Graph:
        for var in self.fgraph.inputs:
            t = var.type
            shape = getattr(t, "shape", ())
            val = self.b.input(TensorType(t.dtype, tuple(shape)))
            self.name(var, val)
            self.env[var] = val
        self.walk(self.fgraph)
        self.b.output(*[self.get(v) for v in self.fgraph.outputs])
        from opgraph.passes.dce import dce

        # patterns (keepdims, mean, stack, argmin, broadcasting ExpandDims) leave the nodes they absorbed
        # unused; dropping them keeps the op order of what is left
        return dce(self.b.freeze()).graph

    def walk(self, fgraph: Any) -> None:
        from pytensor.graph.basic import Constant

        for item in _order(fgraph):
            if isinstance(item, Constant):
                if hasattr(item.type, "dtype"):  # not NoneConst (SpecifyShape's unknown dims, slices' gaps)
                    self.get(item)
                continue
            try:
                outs = self.node(item)
            except GraphError as exc:
                for o in item.outputs:
                    self.env[o] = _Failed(exc)
                continue
            for var, val in zip(item.outputs, outs, strict=True):
                self.env[var] = val
                self.name(var, val)


def from_pytensor(fgraph: Any) -> Graph:
    """Build a :class:`Graph` from a PyTensor :class:`~pytensor.graph.fg.FunctionGraph`.

    The FunctionGraph's inputs become graph inputs (dtype and static shape,
    ``None`` for unknown dims; names kept), its outputs the graph's outputs.
    Apply nodes are translated in topological order (creation order where
    PyTensor's variable numbering tells it, so :func:`to_pytensor`'s graphs
    come back in their op order). ``Elemwise`` nodes (fused ``Composite``
    ones too), reductions, ``DimShuffle``, ``Reshape``, ``Subtensor``,
    ``Join``, ``Split``, ``Alloc``, ``Dot`` and the BLAS nodes of compiled
    graphs, softmax, einsum, the linalg ops, shapes, ``ARange``, ``Assert``
    and (advanced, incrementing) indexing map to op kinds (see the module
    doc for unknown dims); where
    PyTensor's dtype rules differ from NumPy's a ``cast`` makes the result
    match PyTensor's type. Other ops raise :class:`~opgraph.errors.GraphError`
    naming the op. Inputs (shared variables too) are not fed values.

    >>> import numpy as np, pytensor, pytensor.tensor as pt
    >>> from pytensor.graph.fg import FunctionGraph
    >>> x = pt.matrix("x", shape=(None, 3))
    >>> y = pt.special.softmax(2 * x, axis=-1).sum(axis=0)
    >>> g = from_pytensor(FunctionGraph([x], [y]))
    >>> print(g)
    graph(%x: f64[?,3]) {
      %1: i8[] = const 2
      %2: f64[?,3] = multiply(%1, %x)
      %3: f64[?,3] = softmax(%2) {axis=1}
      %4: f64[3] = sum(%3) {axis=(0,), keepdims=False}
      return %4
    }
    >>> xv = np.arange(6.0).reshape(2, 3)
    >>> f = pytensor.function([x], y, mode=pytensor.compile.mode.Mode(linker="py"))
    >>> bool(np.allclose(g.run({"x": xv})[0], f(xv)))
    True
    """
    return _Importer(fgraph).run()


TO_PYTENSOR: tuple[str, ...] = tuple(sorted({*_UNARY, *_BINARY, *_REDUCE, "positive", "isfinite", "logical_not",
                                             "logical_and", "logical_or", "logical_xor", "hypot", "fmax", "fmin",
                                             "real", "imag", "where", "cast", "clip", "mean", "var", "std", "argmax",
                                             "argmin", "cumsum", "cumprod", "logsumexp", "matmul", "einsum",
                                             "tensordot", "vecdot", "outer", "reshape", "permute_dims",
                                             "broadcast_to", "expand_dims", "squeeze", "concat", "stack", "split",
                                             "getitem", "take", "pad", "flip", "roll", "tile", "repeat", "moveaxis",
                                             "copy", "relu", "softmax", "log_softmax", "eigh", "eigvalsh", "qr",
                                             "svd", "svdvals", "cholesky", "solve", "inv", "det", "slogdet", "pinv",
                                             "fma", "matmul_t", "shape", "arange", "alloc", "reshape_to",
                                             "assert_all", "slice", "slice_update", "gather_nd", "scatter_nd",
                                             "sort", "searchsorted", "nonzero", "unique"}))
"""The op kinds :func:`to_pytensor` writes (plus ``const``)."""

__all__ = ["TO_PYTENSOR", "from_pytensor", "to_pytensor"]
