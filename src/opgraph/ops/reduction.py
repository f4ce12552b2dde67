"""Reduction ops: sum, prod, max, min, mean, any, all, var, std, argmax, argmin, cumsum, cumprod, logsumexp.

Result dtypes are NumPy's own: each op asks its NumPy function once per
input dtype (on a tiny array) and caches the answer, so ``sum`` of int8 is
int64, ``sum`` of uint8 is uint64, ``mean`` of an integer is float64, and so
on, exactly as NumPy returns them. Ids 500-599.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("int8", (2, 3)), name="x")
    >>> s = b.op("sum", x, axis=1)
    >>> s.type
    i64[2]
    >>> m = b.op("mean", x, axis=(0, 1), keepdims=True)
    >>> m.type
    f64[1,1]
    >>> b.run({x: np.array([[1, 2, 3], [4, 5, 6]], np.int8)}, [s, m])
    [array([ 6, 15]), array([[3.5]])]

Axes follow NumPy, with one deviation: an axis must be in range for the
input's rank, so a 0-d input takes only ``axis=None`` (NumPy also lets some
reductions take ``axis=0`` or ``-1`` on 0-d arrays).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.core.registry import (
    Attr,
    OpDef,
    attr_axes,
    attr_bool,
    attr_float,
    attr_int,
    family_kinds,
    mark_traits,
    optional,
    register_op,
    set_rules,
)
from opgraph.core.types import Shape, TensorType, ValueType, normalize_axes
from opgraph.errors import OpTypeError
from opgraph.ops import batch_helpers as bh
from opgraph.ops._common import normalize_axis, tensor, write_out
from opgraph.ops.grad_helpers import broadcast_like, expand_reduced, no_grad, reduced_count, scalar
from opgraph.ops.jvp_helpers import linear

FAMILY = "reduction"

# The NumPy function whose result dtype each op reproduces. logsumexp follows
# mean's rule (integers and bool become float64, floats and complex keep
# their dtype), which is what scipy.special.logsumexp returns.
_DTYPE_PROBES: dict[str, Callable[[np.ndarray], Any]] = {
    "sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "mean": np.mean,
    "any": np.any, "all": np.all, "var": np.var, "std": np.std,
    "argmax": np.argmax, "argmin": np.argmin, "cumsum": np.cumsum, "cumprod": np.cumprod,
    "logsumexp": np.mean,
}


@functools.cache
def _probe_dtype(op: str, dtype: np.dtype) -> np.dtype:
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            result = _DTYPE_PROBES[op](np.ones((2,), dtype=dtype))
    except (TypeError, ValueError) as exc:
        raise OpTypeError(f"not defined for dtype {dtype}") from exc
    return np.asarray(result).dtype


def result_dtype(op: str, dtype: Any) -> np.dtype:
    """The dtype NumPy's function for reduction ``op`` returns for inputs of ``dtype``.

    >>> result_dtype("sum", "uint8"), result_dtype("mean", "int16"), result_dtype("var", "complex64")
    (dtype('uint64'), dtype('float64'), dtype('float32'))
    """
    return _probe_dtype(op, np.dtype(dtype))


def reduce_shape(shape: Shape, axes: tuple[int, ...] | None, keepdims: bool) -> Shape:
    """Shape of reducing ``shape`` over ``axes`` (None: all), allowing unknown dims and rank.

    Raises :class:`~opgraph.errors.OpTypeError` for an axis out of range or repeated.

    >>> reduce_shape((2, None, 4), (-1,), False)
    (2, None)
    >>> reduce_shape((2, 3), None, True)
    (1, 1)
    >>> reduce_shape(None, None, False)
    ()
    """
    if shape is None:
        return () if axes is None and not keepdims else None
    ax = set(normalize_axes(axes, len(shape)))
    if keepdims:
        return tuple(1 if i in ax else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in ax)


def _arr(result: Any, out: Any) -> Any:
    # NumPy returns scalars for 0-d results; hand back arrays (or ``out``).
    return out if out is not None else np.asarray(result)


# ---------------------------------------------------------------- plain reductions
def _reduce_infer(name: str) -> Callable[[tuple[ValueType, ...], dict[str, Any]], tuple[TensorType, ...]]:
    def infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
        (t,) = (tensor(x) for x in in_types)
        return (TensorType(result_dtype(name, t.dtype), reduce_shape(t.shape, attrs["axis"], attrs["keepdims"])),)

    return infer


_UFUNC_OF = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum,
             "any": np.logical_or, "all": np.logical_and}
_MEAN_DIRECT = frozenset(np.dtype(t) for t in ("float32", "float64", "complex64", "complex128"))


def _reduce_kernel(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    ufunc = _UFUNC_OF.get(name)

    def kernel(x: np.ndarray, out: np.ndarray | None = None, *, axis: tuple[int, ...] | None,
               keepdims: bool) -> np.ndarray:
        if out is not None and x.dtype == np.float16:
            # NumPy accumulates float16 in float32 only when it allocates the result itself.
            return write_out(fn(x, axis=axis, keepdims=keepdims), out)
        if out is not None and ufunc is not None:
            # what np.sum & co. call after ~1 us of argument handling; the accumulator dtype is out's,
            # which is the dtype NumPy's function gives (result_dtype)
            return ufunc.reduce(x, axis=axis, out=out, keepdims=keepdims)  # type: ignore[no-any-return]
        if out is not None and name == "mean" and x.dtype in _MEAN_DIRECT and out.dtype == x.dtype:
            # np.mean's own steps for these dtypes: a sum in x's dtype, then a division in place
            np.add.reduce(x, axis=axis, out=out, keepdims=keepdims)
            count = x.size if axis is None else int(np.prod([x.shape[a] for a in axis]))
            return np.true_divide(out, count, out=out)  # type: ignore[no-any-return]
        return _arr(fn(x, axis=axis, keepdims=keepdims, out=out), out)

    def specialize(in_types: Sequence[Any], out_types: Sequence[Any],
                   attrs: Mapping[str, Any]) -> tuple[Callable[..., Any], tuple[Any, ...], tuple[Any, ...]] | None:
        if ufunc is None or in_types[0].dtype == np.float16:
            return None
        return ufunc.reduce, (attrs["axis"], None), (attrs["keepdims"],)  # reduce(x, axis, dtype, out, keepdims)

    kernel.__name__ = f"{name}_numpy"
    kernel.specialize = specialize  # type: ignore[attr-defined]
    return kernel


def _moment_kernel(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(x: np.ndarray, out: np.ndarray | None = None, *, axis: tuple[int, ...] | None,
               keepdims: bool, correction: float) -> np.ndarray:
        if out is not None and x.dtype == np.float16:  # as in _reduce_kernel
            return write_out(fn(x, axis=axis, keepdims=keepdims, ddof=correction), out)
        return _arr(fn(x, axis=axis, keepdims=keepdims, ddof=correction, out=out), out)

    kernel.__name__ = f"{name}_numpy"
    return kernel


_AXES = Attr(attr_axes, None, "axis or axes to reduce over; None reduces over all")
_KEEPDIMS = Attr(attr_bool, False, "keep reduced axes as size-1 dims")
_CORRECTION = Attr(attr_float, 0.0, "degrees-of-freedom correction (NumPy's ddof)")

# name, id, NumPy function. Ids are stable: append, never renumber.
REDUCTIONS: list[tuple[str, int, Callable[..., Any]]] = [
    ("sum", 500, np.sum), ("prod", 501, np.prod), ("max", 502, np.max), ("min", 503, np.min),
    ("mean", 504, np.mean), ("any", 505, np.any), ("all", 506, np.all),
]
MOMENTS: list[tuple[str, int, Callable[..., Any]]] = [("var", 507, np.var), ("std", 508, np.std)]


# ---------------------------------------------------------------- gradient rules
# rule(b, inputs, outputs, cotangents, attrs) -> cotangents of the inputs (see opgraph.ops.grad_helpers).
# max/min split the gradient evenly between tied maxima (JAX); prod divides by x (undefined at zeros).
def _back(b: Any, g: Any, x: Any, attrs: dict[str, Any]) -> Any:
    return broadcast_like(b, expand_reduced(b, g, x.type, attrs["axis"], attrs["keepdims"]), x)


def _sum_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    return [_back(b, cots[0], ins[0], attrs)]


def _mean_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    n = reduced_count(ins[0].type, attrs["axis"])
    return [_back(b, b.op("divide", cots[0], scalar(b, float(n), cots[0])), ins[0], attrs)]


def _prod_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x = ins[0]
    gy = b.op("multiply", cots[0], outs[0])
    return [b.op("divide", _back(b, gy, x, attrs), x)]


def _extremum_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x = ins[0]
    y = _back(b, outs[0], x, attrs)
    hit = b.op("cast", b.op("equal", x, y), dtype=x.type.dtype)
    count = b.op("sum", hit, axis=attrs["axis"], keepdims=True)
    share = b.op("divide", hit, count)
    return [b.op("multiply", share, _back(b, cots[0], x, attrs))]


def _centered(b: Any, x: Any, attrs: dict[str, Any]) -> tuple[Any, float]:
    n = reduced_count(x.type, attrs["axis"])
    mean = b.op("mean", x, axis=attrs["axis"], keepdims=True)
    return b.op("subtract", x, mean), float(n - attrs["correction"])


def _var_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x = ins[0]
    c, dof = _centered(b, x, attrs)
    g = _back(b, cots[0], x, attrs)
    return [b.op("multiply", g, b.op("multiply", c, scalar(b, 2.0 / dof, c)))]


def _std_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x = ins[0]
    c, dof = _centered(b, x, attrs)
    g = _back(b, b.op("divide", cots[0], outs[0]), x, attrs)
    return [b.op("multiply", g, b.op("multiply", c, scalar(b, 1.0 / dof, c)))]


def _logsumexp_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x = ins[0]
    p = b.op("exp", b.op("subtract", x, _back(b, outs[0], x, attrs)))
    return [b.op("multiply", p, _back(b, cots[0], x, attrs))]


def _flat(b: Any, g: Any, x: Any, axis: int | None) -> tuple[Any, int]:
    return (b.op("reshape", g, shape=(-1,)), 0) if axis is None else (g, axis)


def _reverse_cumsum(b: Any, g: Any, axis: int) -> Any:
    return b.op("flip", b.op("cumsum", b.op("flip", g, axis=axis), axis=axis), axis=axis)


def _cumsum_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x, axis = ins[0], attrs["axis"]
    g, ax = _flat(b, cots[0], x, axis)
    r = _reverse_cumsum(b, g, ax)
    return [b.op("reshape", r, shape=x.type.shape) if axis is None else r]


def _cumprod_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # d/dx_i: sum_{j >= i} g_j y_j / x_i (x must have no zeros).
    x, axis = ins[0], attrs["axis"]
    gy, ax = _flat(b, b.op("multiply", cots[0], outs[0]), x, axis)
    r = _reverse_cumsum(b, gy, ax)
    if axis is None:
        r = b.op("reshape", r, shape=x.type.shape)
    return [b.op("divide", r, x)]


_REDUCTION_GRADS: dict[str, Callable[..., Any]] = {
    "sum": _sum_grad, "prod": _prod_grad, "max": _extremum_grad, "min": _extremum_grad, "mean": _mean_grad,
    "any": no_grad, "all": no_grad, "var": _var_grad, "std": _std_grad,
}

for _name, _id, _fn in REDUCTIONS:
    register_op(OpDef(
        name=_name, id=_id, arity=1, infer=_reduce_infer(_name), kernel=_reduce_kernel(_name, _fn),
        attrs={"axis": _AXES, "keepdims": _KEEPDIMS}, family=FAMILY, grad=_REDUCTION_GRADS[_name],
        doc=f"{_name}(x, axis=None, keepdims=False): NumPy's {_fn.__name__} over the given axes",
    ))

for _name, _id, _fn in MOMENTS:
    register_op(OpDef(
        name=_name, id=_id, arity=1, infer=_reduce_infer(_name), kernel=_moment_kernel(_name, _fn),
        attrs={"axis": _AXES, "keepdims": _KEEPDIMS, "correction": _CORRECTION}, family=FAMILY,
        grad=_REDUCTION_GRADS[_name],
        doc=f"{_name}(x, axis=None, keepdims=False, correction=0.0): NumPy's {_fn.__name__} with ddof=correction",
    ))


# ---------------------------------------------------------------- argmax, argmin
def _arg_infer(name: str) -> Callable[[tuple[ValueType, ...], dict[str, Any]], tuple[TensorType, ...]]:
    def infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
        (t,) = (tensor(x) for x in in_types)
        axis = attrs["axis"]
        shape = reduce_shape(t.shape, None if axis is None else (axis,), attrs["keepdims"])
        return (TensorType(result_dtype(name, t.dtype), shape),)

    return infer


def _arg_kernel(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(x: np.ndarray, out: np.ndarray | None = None, *, axis: int | None, keepdims: bool) -> np.ndarray:
        return _arr(fn(x, axis=axis, keepdims=keepdims, out=out), out)

    kernel.__name__ = f"{name}_numpy"
    return kernel


for _name, _id, _fn in (("argmax", 510, np.argmax), ("argmin", 511, np.argmin)):
    register_op(OpDef(
        name=_name, id=_id, arity=1, infer=_arg_infer(_name), kernel=_arg_kernel(_name, _fn),
        attrs={"axis": Attr(optional(attr_int), None, "axis to search; None searches the flattened array"),
               "keepdims": _KEEPDIMS},
        family=FAMILY, grad=no_grad,
        doc=f"{_name}(x, axis=None, keepdims=False): NumPy's {_fn.__name__} (int64 indices; "
            "with axis None, the index into the flattened array)",
    ))


# ---------------------------------------------------------------- cumsum, cumprod
def cumulative_shape(shape: Shape, axis: int | None) -> Shape:
    """Shape of a cumulative op (``cumsum``) along ``axis``; None flattens, as NumPy does.

    >>> cumulative_shape((2, 3), None), cumulative_shape((2, None), None), cumulative_shape((2, 3), -1)
    ((6,), (None,), (2, 3))
    """
    if axis is None:
        if shape is None or any(d is None for d in shape):
            return (None,)
        return (int(np.prod(shape, dtype=np.int64)),)
    if shape is None:
        return None
    normalize_axis(axis, len(shape))
    return shape


def _cum_infer(name: str) -> Callable[[tuple[ValueType, ...], dict[str, Any]], tuple[TensorType, ...]]:
    def infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
        (t,) = (tensor(x) for x in in_types)
        return (TensorType(result_dtype(name, t.dtype), cumulative_shape(t.shape, attrs["axis"])),)

    return infer


def _cum_kernel(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(x: np.ndarray, out: np.ndarray | None = None, *, axis: int | None) -> np.ndarray:
        return _arr(fn(x, axis=axis, out=out), out)

    kernel.__name__ = f"{name}_numpy"
    return kernel


for _name, _id, _fn in (("cumsum", 520, np.cumsum), ("cumprod", 521, np.cumprod)):
    register_op(OpDef(
        name=_name, id=_id, arity=1, infer=_cum_infer(_name), kernel=_cum_kernel(_name, _fn),
        attrs={"axis": Attr(optional(attr_int), None, "axis to accumulate along; None flattens first")},
        family=FAMILY, grad=_cumsum_grad if _name == "cumsum" else _cumprod_grad,
        doc=f"{_name}(x, axis=None): NumPy's {_fn.__name__} (axis None: over the flattened array)",
    ))


# ---------------------------------------------------------------- logsumexp
def logsumexp(x: np.ndarray, axis: tuple[int, ...] | None = None, keepdims: bool = False,
              out: np.ndarray | None = None) -> np.ndarray:
    """``log(sum(exp(x)))`` over ``axis``, computed stably by shifting by the maximum.

    Like ``scipy.special.logsumexp``: integer and bool inputs give float64,
    complex inputs are shifted by the maximum real part, and a reduction over
    no elements gives ``-inf``.

    >>> logsumexp(np.array([1000.0, 1000.0]))
    array(1000.69314718)
    >>> logsumexp(np.zeros((2, 0)), axis=(1,))
    array([-inf, -inf])
    """
    a = np.asarray(x)
    a = a.astype(result_dtype("logsumexp", a.dtype), copy=False)
    real = a.real if a.dtype.kind == "c" else a
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        shift = np.max(real, axis=axis, keepdims=True, initial=-np.inf)
        shift = np.where(np.isfinite(shift), shift, 0).astype(real.dtype, copy=False)
        total = np.sum(np.exp(a - shift), axis=axis, keepdims=keepdims)
        if not keepdims:
            shift = shift.reshape(np.shape(total))
        result = np.log(total, out=out)
        result = np.add(result, shift, out=out)
    return _arr(result, out)


def _logsumexp_kernel(x: np.ndarray, out: np.ndarray | None = None, *, axis: tuple[int, ...] | None,
                      keepdims: bool) -> np.ndarray:
    return logsumexp(x, axis=axis, keepdims=keepdims, out=out)


register_op(OpDef(
    name="logsumexp", id=530, arity=1, infer=_reduce_infer("logsumexp"), kernel=_logsumexp_kernel,
    attrs={"axis": _AXES, "keepdims": _KEEPDIMS}, family=FAMILY, grad=_logsumexp_grad,
    doc="logsumexp(x, axis=None, keepdims=False): log(sum(exp(x))) computed stably, as scipy.special.logsumexp",
))


# ---------------------------------------------------------------- traits
mark_traits("linear_time", *family_kinds(FAMILY))
mark_traits("promotes", "cumsum", "logsumexp", "mean", "prod", "std", "sum", "var")
mark_traits("truth_valued", "all", "any")


# ---------------------------------------------------------------- tangent rules
# sum, mean and cumsum are linear: the op on the tangent (their transposed gradients broadcast and sum back).
set_rules("jvp", {k: linear(k) for k in ("sum", "mean", "cumsum")})


# ---------------------------------------------------------------- batching rules (vmap)
def _batch_reduce(kind: str) -> Callable[..., list[Any]]:
    """A reduction over per-example axes: the same axes shifted past the batch axis (None: every per-example
    axis, never the batch axis)."""

    def rule(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int, attrs: Mapping[str, Any]) -> list[Any]:
        (x,) = ins
        a = dict(attrs)
        a["axis"] = bh.batch_axes(attrs["axis"], bh.ndim(x) - 1)
        return [b.op(kind, x, **a)]

    rule.__name__ = f"_batch_{kind}"
    return rule


def _batch_flat(kind: str) -> Callable[..., list[Any]]:
    """argmax/argmin/cumsum/cumprod: one axis shifted; axis None (the flattened example) flattens each example."""

    def rule(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int, attrs: Mapping[str, Any]) -> list[Any]:
        (x,) = ins
        r = bh.ndim(x) - 1
        a = dict(attrs)
        if attrs["axis"] is not None:
            a["axis"] = bh.batch_axis(attrs["axis"], r)
            return [b.op(kind, x, **a)]
        a["axis"] = 1
        keep = a.pop("keepdims", False)
        y = b.op(kind, b.op("reshape", x, shape=(int(size), -1)), **a)
        if keep:  # every per-example axis kept as size 1
            y = b.op("reshape", y, shape=(int(size),) + (1,) * r)
        return [y]

    rule.__name__ = f"_batch_{kind}"
    return rule


set_rules("batch", {
    **{k: _batch_reduce(k) for k in ("sum", "prod", "max", "min", "mean", "any", "all", "var", "std", "logsumexp")},
    **{k: _batch_flat(k) for k in ("argmax", "argmin", "cumsum", "cumprod")},
})
