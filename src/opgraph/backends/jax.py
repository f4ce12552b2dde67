"""The jax backend: a graph as one ``jax.jit`` function of ``jax.numpy``/``lax`` calls (XLA).

Each op kind has a rule (below, in ``RULES``) making the ``jax.numpy`` call
for one op from its static facts; :func:`~opgraph.backends.base.straight_line`
writes the graph as one Python function of those calls, and ``jax.jit``
compiles it whole, so XLA fuses across ops. Results keep NumPy's dtypes: each
op's result is cast to its declared dtype where JAX's promotion differs
(at trace time, so it costs nothing per call). Constants are passed to the
jitted function as arguments, placed on the device once. Update-edge state
passed back in is donated, so XLA may write the new state over the old.

Control flow lowers to ``lax``: ``call`` inlines its body, ``cond`` is ``lax.cond``, ``while_loop``
``lax.while_loop`` (``max_trip`` adds a trip counter to the carry) and ``scan`` ``lax.scan``; each body is
translated by this same rule table (see :func:`~opgraph.backends.base.body_program`). Not claimed: a
``while_loop`` with stacked per-trip results (their length is known only at run time; jit results have static
shapes), a loop whose body changes a carry's type, a ``cond`` whose branches return different types.

Importing this module turns on ``jax_enable_x64`` (opgraph's float64 and
int64 must stay 64-bit), as PyTensor's JAX backend does.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> b.output(b.op("tanh", b.op("multiply", x, 2.0)))
    >>> f = opgraph.compile(b.freeze(), backend="jax")
    >>> f(x=np.array([0.0, 0.5, 1.0]))[0].round(4)
    array([0.    , 0.7616, 0.964 ])
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
from jax import lax

from opgraph.backends.base import (
    Backend,
    BackendError,
    Executable,
    OpInfo,
    body_program,
    conform_args,
    input_dtypes,
    straight_line,
)
from opgraph.core.graph import Graph
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType

jax.config.update("jax_enable_x64", True)

Rule = Callable[[OpInfo], Callable[..., Any]]
RULES: dict[str, Rule] = {}
LIMITS: dict[str, Callable[[OpInfo], str | None]] = {}
DTYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                    "float32", "float64", "complex64", "complex128"})


def rule(*kinds: str) -> Callable[[Rule], Rule]:
    """Register a rule factory for op kinds."""
    def register(fn: Rule) -> Rule:
        for k in kinds:
            RULES[k] = fn
        return fn
    return register


def _common(info: OpInfo) -> np.dtype:
    return np.result_type(*info.in_dtypes) if info.in_dtypes else info.out_dtype


def _work_dtype(info: OpInfo) -> np.dtype:
    """The dtype NumPy computes an op in: the inputs' common dtype, or the float result's for integer inputs
    (NumPy's exp of int32 is float64; JAX's would be float32)."""
    common = _common(info)
    out = info.out_dtype
    return out if out.kind in "fc" and common.kind in "biu" else common


def _promoting(fn: Callable[..., Any]) -> Rule:
    """Cast every input to the dtype NumPy computes in first (JAX's promotion differs)."""
    def factory(info: OpInfo) -> Callable[..., Any]:
        dt = _work_dtype(info)
        if all(d == dt for d in info.in_dtypes):
            return fn
        return lambda *xs: fn(*(x.astype(dt) for x in xs))
    return factory


_UNARY = {
    "negative": jnp.negative, "positive": jnp.positive, "abs": jnp.abs, "sign": jnp.sign, "exp": jnp.exp,
    "expm1": jnp.expm1, "log": jnp.log, "log1p": jnp.log1p, "log2": jnp.log2, "log10": jnp.log10,
    "sqrt": jnp.sqrt, "square": jnp.square, "reciprocal": jnp.reciprocal, "sin": jnp.sin, "cos": jnp.cos,
    "tan": jnp.tan, "asin": jnp.arcsin, "acos": jnp.arccos, "atan": jnp.arctan, "sinh": jnp.sinh,
    "cosh": jnp.cosh, "tanh": jnp.tanh, "asinh": jnp.arcsinh, "acosh": jnp.arccosh, "atanh": jnp.arctanh,
    "floor": jnp.floor, "ceil": jnp.ceil, "trunc": jnp.trunc, "round": jnp.round, "sigmoid": jax.nn.sigmoid,
    "erf": jsp.erf, "isnan": jnp.isnan, "isinf": jnp.isinf, "isfinite": jnp.isfinite,
    "logical_not": jnp.logical_not, "bitwise_invert": jnp.invert, "conj": jnp.conj, "signbit": jnp.signbit,
    "exp2": jnp.exp2, "cbrt": jnp.cbrt, "erfc": jsp.erfc, "real": jnp.real, "imag": jnp.imag,
    "relu": lambda x: jnp.where(x > 0, x, jnp.where(jnp.isnan(x), x, jnp.zeros((), x.dtype)))
    if jnp.issubdtype(x.dtype, jnp.floating) else jnp.maximum(x, jnp.zeros((), x.dtype)),
}
_BINARY = {
    "add": jnp.add, "subtract": jnp.subtract, "multiply": jnp.multiply, "divide": jnp.true_divide,
    "floor_divide": jnp.floor_divide, "remainder": jnp.remainder, "power": jnp.power, "maximum": jnp.maximum,
    "minimum": jnp.minimum, "atan2": jnp.arctan2, "hypot": jnp.hypot, "logaddexp": jnp.logaddexp,
    "copysign": jnp.copysign, "nextafter": jnp.nextafter, "equal": jnp.equal, "not_equal": jnp.not_equal,
    "less": jnp.less, "less_equal": jnp.less_equal, "greater": jnp.greater, "greater_equal": jnp.greater_equal,
    "logical_and": jnp.logical_and, "logical_or": jnp.logical_or, "logical_xor": jnp.logical_xor,
    "bitwise_and": jnp.bitwise_and, "bitwise_or": jnp.bitwise_or, "bitwise_xor": jnp.bitwise_xor,
    "bitwise_left_shift": jnp.left_shift, "bitwise_right_shift": jnp.right_shift, "fmax": jnp.fmax,
    "fmin": jnp.fmin, "fmod": jnp.fmod,
}
for _k, _f in _UNARY.items():
    RULES[_k] = _promoting(_f)
for _k, _f in _BINARY.items():
    RULES[_k] = _promoting(_f)


@rule("where")
def _where(info: OpInfo) -> Callable[..., Any]:
    dt = np.result_type(*info.in_dtypes[1:])
    return lambda c, x, y: jnp.where(c.astype(bool), x.astype(dt), y.astype(dt))


@rule("cast")
def _cast(info: OpInfo) -> Callable[..., Any]:
    dt = np.dtype(info.attrs["dtype"])
    return lambda x: x.astype(dt)


@rule("clip")
def _clip(info: OpInfo) -> Callable[..., Any]:
    dt = _common(info)
    return lambda x, lo, hi: jnp.minimum(jnp.maximum(x.astype(dt), lo.astype(dt)), hi.astype(dt))


@rule("fma")
def _fma(info: OpInfo) -> Callable[..., Any]:
    dt = _common(info)
    return lambda a, b, c: a.astype(dt) * b.astype(dt) + c.astype(dt)


# ---------------------------------------------------------------- reductions
def _axis(info: OpInfo) -> Any:
    ax = info.attrs.get("axis")
    return None if ax is None else (ax,) if isinstance(ax, int) else tuple(ax)


def _reduce(fn: Callable[..., Any], with_dtype: bool) -> Rule:
    def factory(info: OpInfo) -> Callable[..., Any]:
        ax, kd, dt = _axis(info), info.attrs.get("keepdims", False), info.out_dtype
        if with_dtype:
            return lambda x: fn(x, axis=ax, keepdims=kd, dtype=dt)
        if dt.kind in "fc" and info.in_dtypes[0].kind in "biu":  # logsumexp of integers: in NumPy's float
            return lambda x: fn(x.astype(dt), axis=ax, keepdims=kd)
        return lambda x: fn(x, axis=ax, keepdims=kd)
    return factory


RULES.update({"sum": _reduce(jnp.sum, True), "prod": _reduce(jnp.prod, True), "max": _reduce(jnp.max, False),
              "min": _reduce(jnp.min, False), "mean": _reduce(jnp.mean, True), "any": _reduce(jnp.any, False),
              "all": _reduce(jnp.all, False), "logsumexp": _reduce(jsp.logsumexp, False)})


@rule("var", "std")
def _var(info: OpInfo) -> Callable[..., Any]:
    fn = jnp.var if info.kind == "var" else jnp.std
    ax, kd, ddof = _axis(info), info.attrs["keepdims"], info.attrs["correction"]
    work = info.out_dtype if info.in_dtypes[0].kind in "biu" else info.in_dtypes[0]
    return lambda x: fn(x.astype(work), axis=ax, keepdims=kd, ddof=ddof)


@rule("argmax", "argmin")
def _argmax(info: OpInfo) -> Callable[..., Any]:
    fn = jnp.argmax if info.kind == "argmax" else jnp.argmin
    ax, kd = _axis(info), info.attrs["keepdims"]
    if ax is None:
        if kd:
            rank = len(info.in_types[0].shape)  # type: ignore[union-attr,arg-type]
            return lambda x: fn(x.reshape(-1)).astype(np.int64).reshape((1,) * rank)
        return lambda x: fn(x.reshape(-1)).astype(np.int64)
    (a,) = ax
    return lambda x: fn(x, axis=a, keepdims=kd).astype(np.int64)


@rule("cumsum", "cumprod")
def _cum(info: OpInfo) -> Callable[..., Any]:
    fn = jnp.cumsum if info.kind == "cumsum" else jnp.cumprod
    ax, dt = _axis(info), info.out_dtype
    if ax is None:
        return lambda x: fn(x.reshape(-1), dtype=dt)
    (a,) = ax
    return lambda x: fn(x, axis=a, dtype=dt)


# ---------------------------------------------------------------- contractions
RULES["matmul"] = _promoting(jnp.matmul)
RULES["outer"] = _promoting(jnp.outer)


@rule("einsum")
def _einsum(info: OpInfo) -> Callable[..., Any]:
    subs, dt = info.attrs["subscripts"], info.out_dtype
    return lambda *xs: jnp.einsum(subs, *(x.astype(dt) for x in xs), precision=lax.Precision.HIGHEST)


@rule("tensordot")
def _tensordot(info: OpInfo) -> Callable[..., Any]:
    axes, dt = info.attrs["axes"], info.out_dtype
    return lambda a, b: jnp.tensordot(a.astype(dt), b.astype(dt), axes=axes)


@rule("vecdot")
def _vecdot(info: OpInfo) -> Callable[..., Any]:
    axis, dt = info.attrs["axis"], info.out_dtype
    return lambda a, b: jnp.sum(jnp.conj(a.astype(dt)) * b.astype(dt), axis=axis)


@rule("matmul_t")
def _matmul_t(info: OpInfo) -> Callable[..., Any]:
    ta, tb, dt = info.attrs["transpose_a"], info.attrs["transpose_b"], info.out_dtype

    def mm(a: Any, b: Any) -> Any:
        a, b = a.astype(dt), b.astype(dt)
        return jnp.matmul(jnp.swapaxes(a, -1, -2) if ta else a, jnp.swapaxes(b, -1, -2) if tb else b)
    return mm


# ---------------------------------------------------------------- shape
@rule("reshape")
def _reshape(info: OpInfo) -> Callable[..., Any]:
    shape = tuple(info.attrs["shape"])
    return lambda x: jnp.reshape(x, shape)


@rule("permute_dims")
def _permute(info: OpInfo) -> Callable[..., Any]:
    axes = info.attrs["axes"]
    return lambda x: jnp.transpose(x, axes)


@rule("broadcast_to")
def _broadcast_to(info: OpInfo) -> Callable[..., Any]:
    shape = tuple(info.attrs["shape"])
    return lambda x: jnp.broadcast_to(x, shape)


@rule("expand_dims")
def _expand_dims(info: OpInfo) -> Callable[..., Any]:
    axis = tuple(info.attrs["axis"])
    return lambda x: jnp.expand_dims(x, axis)


@rule("squeeze")
def _squeeze(info: OpInfo) -> Callable[..., Any]:
    axis = _axis(info)
    return lambda x: jnp.squeeze(x, axis)


@rule("concat")
def _concat(info: OpInfo) -> Callable[..., Any]:
    axis, dt = info.attrs["axis"], info.out_dtype
    if axis is None:
        return lambda *xs: jnp.concatenate([x.reshape(-1).astype(dt) for x in xs])
    return lambda *xs: jnp.concatenate([x.astype(dt) for x in xs], axis=axis)


@rule("stack")
def _stack(info: OpInfo) -> Callable[..., Any]:
    axis, dt = info.attrs["axis"], info.out_dtype
    return lambda *xs: jnp.stack([x.astype(dt) for x in xs], axis=axis)


@rule("split")
def _split(info: OpInfo) -> Callable[..., Any]:
    sections, axis = info.attrs["sections"], info.attrs["axis"]
    if isinstance(sections, int):
        return lambda x: tuple(jnp.split(x, sections, axis=axis))

    def split(x: Any) -> tuple[Any, ...]:  # as np.split: pieces x[a:b] between the points, Python slice rules
        ax = axis % x.ndim
        points = [0, *sections, x.shape[ax]]
        lead = (slice(None),) * ax
        return tuple(x[(*lead, slice(a, b))] for a, b in itertools.pairwise(points))
    return split


@rule("getitem")
def _getitem(info: OpInfo) -> Callable[..., Any]:
    from opgraph.ops.shape import python_key

    key = python_key(info.attrs["index"], array_result=False)
    return lambda x: x[key]


@rule("take")
def _take(info: OpInfo) -> Callable[..., Any]:
    axis = info.attrs["axis"]
    return lambda x, i: jnp.take(x, i, axis=axis, mode="wrap")


def _take_limit(info: OpInfo) -> str | None:
    shape, axis = info.in_types[0].shape, info.attrs["axis"]  # type: ignore[union-attr]
    if shape == ():
        return "jax takes from arrays of rank >= 1"
    if shape is None or any(d is None for d in shape) or (0 in shape if axis is None else shape[axis] == 0):
        return "jax cannot take from an empty (or unknown-length) axis"
    return None


LIMITS["take"] = _take_limit


@rule("sort")
def _sort(info: OpInfo) -> Callable[..., Any]:
    axis, descending = info.attrs["axis"], bool(info.attrs["descending"])

    def sort(x: Any) -> tuple[Any, Any]:
        # jnp.argsort is stable in both directions and sorts NaN last (first descending): the NumPy kernel's order
        idx = jnp.argsort(x, axis=axis, stable=True, descending=descending).astype(jnp.int64)
        return jnp.take_along_axis(x, idx, axis=axis), idx

    return sort


@rule("searchsorted")
def _searchsorted(info: OpInfo) -> Callable[..., Any]:
    side = info.attrs["side"]
    return lambda table, values: jnp.searchsorted(table, values, side=side).astype(jnp.int64)


@rule("slice")
def _slice(info: OpInfo) -> Callable[..., Any]:
    # claimed only with a static result (see _slice_limit): then every sliced axis is empty, and so is x
    return lambda x, *bounds: x


@rule("slice_update")
def _slice_update(info: OpInfo) -> Callable[..., Any]:
    """x with x[slices] = update for bounds traced at run time, as a mask over x's static shape (a step of 0,
    an error in NumPy, cannot raise inside jit: it updates nothing)."""
    axes = info.attrs["axes"]

    def positions(n: int, s: Any, e: Any, st: Any) -> tuple[Any, Any]:
        """Which of an axis's n positions Python's x[s:e:st] keeps, and where each sits in the slice (traced
        bounds: the mask form of slice.indices)."""
        # bounds past either end act like -n-1 or n (this also keeps INT64_MAX + n from wrapping around)
        s, e = (jnp.clip(v.astype(jnp.int64), -n - 1, n) for v in (s, e))
        s, e = (jnp.where(v < 0, v + n, v) for v in (s, e))
        up = st > 0
        s = jnp.where(up, jnp.clip(s, 0, n), jnp.where(s < 0, -1, jnp.minimum(s, n - 1)))
        e = jnp.where(up, jnp.clip(e, 0, n), jnp.where(e < 0, -1, jnp.minimum(e, n - 1)))
        pos = jnp.arange(n)
        off = pos - s
        inside = jnp.where(up, (pos >= s) & (pos < e), (pos <= s) & (pos > e)) & (off % st == 0)
        return inside, jnp.where(inside, off // st, 0)

    def slice_update(x: Any, update: Any, starts: Any, ends: Any, steps: Any = None) -> Any:
        k = starts.shape[0]
        sliced = tuple(range(k)) if axes is None else tuple(a % x.ndim for a in axes)
        steps = jnp.ones(k, jnp.int64) if steps is None else steps.astype(jnp.int64)
        if update.size == 0:  # it broadcasts to the slice, so the slice is empty too
            return x
        u = update.reshape((1,) * (x.ndim - update.ndim) + update.shape)
        mask = jnp.ones(x.shape, bool)
        index = []
        for d, n in enumerate(x.shape):
            if d in sliced:
                j = sliced.index(d)
                inside, at = positions(n, starts[j], ends[j], steps[j])
            else:
                inside, at = jnp.ones(n, bool), jnp.arange(n)
            shape = [-1 if i == d else 1 for i in range(x.ndim)]
            mask = mask & inside.reshape(shape)
            index.append((jnp.zeros_like(at) if u.shape[d] == 1 else jnp.minimum(at, u.shape[d] - 1)).reshape(shape))
        return jnp.where(mask, u[tuple(index)] if x.ndim else u, x)

    return slice_update


def _slice_limit(info: OpInfo) -> str | None:
    out = info.out_types[0].shape  # type: ignore[union-attr]
    if info.kind == "slice" and (out is None or None in out):
        return "slice's result size depends on its run-time bounds; jax.jit needs static shapes"
    bounds = info.in_types[2]
    if bounds.shape is None or bounds.shape[0] is None:  # type: ignore[union-attr]
        return "jax needs the number of slice bounds"
    return None


LIMITS["slice"] = LIMITS["slice_update"] = _slice_limit


@rule("flip")
def _flip(info: OpInfo) -> Callable[..., Any]:
    axis = _axis(info)
    return lambda x: jnp.flip(x, axis)


@rule("roll")
def _roll(info: OpInfo) -> Callable[..., Any]:
    shift, axis = info.attrs["shift"], info.attrs["axis"]
    return lambda x: jnp.roll(x, shift, axis)


@rule("tile")
def _tile(info: OpInfo) -> Callable[..., Any]:
    reps = tuple(info.attrs["reps"])
    return lambda x: jnp.tile(x, reps)


@rule("repeat")
def _repeat(info: OpInfo) -> Callable[..., Any]:
    repeats, axis = info.attrs["repeats"], info.attrs["axis"]
    n = info.out_shape[axis if axis is not None else 0] if info.out_shape is not None else None
    return lambda x: jnp.repeat(x, np.asarray(repeats), axis=axis, total_repeat_length=n)


@rule("moveaxis")
def _moveaxis(info: OpInfo) -> Callable[..., Any]:
    src, dst = info.attrs["source"], info.attrs["destination"]
    return lambda x: jnp.moveaxis(x, src, dst)


@rule("copy")
def _copy(info: OpInfo) -> Callable[..., Any]:
    return lambda x: x


@rule("pad")
def _pad(info: OpInfo) -> Callable[..., Any]:
    pw, mode, cv = info.attrs["pad_width"], info.attrs["mode"], info.attrs["constant_value"]
    if mode == "constant":
        return lambda x: jnp.pad(x, pw, mode="constant", constant_values=jnp.asarray(cv).astype(x.dtype))
    return lambda x: jnp.pad(x, pw, mode=mode)


# ---------------------------------------------------------------- nn
@rule("softmax", "log_softmax")
def _softmax(info: OpInfo) -> Callable[..., Any]:
    fn = jax.nn.softmax if info.kind == "softmax" else jax.nn.log_softmax
    axis = info.attrs["axis"]
    return lambda x: fn(x, axis=axis)


@rule("conv2d")
def _conv2d(info: OpInfo) -> Callable[..., Any]:
    from opgraph.ops.nn import pad4

    a = info.attrs
    t, bo, le, ri = pad4(a["padding"])
    pads = [(t, bo), (le, ri)]
    dt = info.out_dtype

    def conv(x: Any, w: Any) -> Any:
        batched = x.ndim == 4  # a (C, H, W) input is one sample
        y = lax.conv_general_dilated((x if batched else x[None]).astype(dt), w.astype(dt), tuple(a["stride"]),
                                     pads, rhs_dilation=tuple(a["dilation"]), feature_group_count=a["groups"],
                                     precision=lax.Precision.HIGHEST)
        return y if batched else y[0]
    return conv


@rule("max_pool2d", "avg_pool2d")
def _pool2d(info: OpInfo) -> Callable[..., Any]:
    from opgraph.ops.nn import pad4

    a = info.attrs
    k = tuple(a["kernel_size"])
    s = tuple(a["stride"] if a["stride"] is not None else k)
    t, bo, le, ri = pad4(a["padding"])
    lead = len(info.in_types[0].shape) - 2  # type: ignore[union-attr,arg-type]
    pads = ((0, 0),) * lead + ((t, bo), (le, ri))
    win, strides = (1,) * lead + k, (1,) * lead + s
    if info.kind == "max_pool2d":
        return lambda x: lax.reduce_window(x, -jnp.inf, lax.max, win, strides, pads)
    count_pad = a["count_include_pad"]

    def avg(x: Any) -> Any:
        total = lax.reduce_window(x, jnp.zeros((), x.dtype), lax.add, win, strides, pads)
        if count_pad:
            return total / np.prod(k)
        ones = jnp.ones((1,) * lead + x.shape[-2:], x.dtype)
        n = lax.reduce_window(ones, jnp.zeros((), x.dtype), lax.add, win, strides, pads)
        return total / n
    return avg


def _spatial(info: OpInfo, nsp: int) -> tuple[tuple[int, ...], list[tuple[int, int]], tuple[int, ...]]:
    a = info.attrs
    stride = tuple(a["stride"]) if a.get("stride") is not None else (1,) * nsp
    pads = [tuple(p) for p in a["padding"]] if a.get("padding") is not None else [(0, 0)] * nsp
    dil = tuple(a["dilation"]) if a.get("dilation") is not None else (1,) * nsp
    return stride, pads, dil  # type: ignore[return-value]


@rule("conv")
def _conv(info: OpInfo) -> Callable[..., Any]:
    nsp = len(info.in_types[0].shape) - 2  # type: ignore[union-attr,arg-type]
    stride, pads, dil = _spatial(info, nsp)
    groups, dt = info.attrs["groups"], info.out_dtype
    return lambda x, w: lax.conv_general_dilated(x.astype(dt), w.astype(dt), stride, pads, rhs_dilation=dil,
                                                 feature_group_count=groups, precision=lax.Precision.HIGHEST)


@rule("max_pool", "avg_pool")
def _pool(info: OpInfo) -> Callable[..., Any]:
    nsp = len(info.in_types[0].shape) - 2  # type: ignore[union-attr,arg-type]
    stride, pads, dil = _spatial(info, nsp)
    k = tuple(info.attrs["kernel_size"])
    win, strides, wdil = (1, 1, *k), (1, 1, *stride), (1, 1, *dil)
    full = [(0, 0), (0, 0), *pads]
    if info.kind == "max_pool":
        return lambda x: lax.reduce_window(x, -jnp.inf, lax.max, win, strides, full, window_dilation=wdil)
    count_pad = info.attrs["count_include_pad"]

    def avg(x: Any) -> Any:
        zero = jnp.zeros((), x.dtype)
        total = lax.reduce_window(x, zero, lax.add, win, strides, full, window_dilation=wdil)
        if count_pad:  # without ceil_mode every window lies inside the padded input: all its cells count
            return total / np.prod(k)
        ones = jnp.ones((1, 1, *x.shape[2:]), x.dtype)
        return total / lax.reduce_window(ones, zero, lax.add, win, strides, full, window_dilation=wdil)
    return avg


def _pool_limit(info: OpInfo) -> str | None:
    if info.attrs.get("ceil_mode"):
        return "jax's rule has no ceil_mode (its partial last windows)"
    return _float_input(info)


LIMITS["max_pool"] = _pool_limit
LIMITS["avg_pool"] = _pool_limit


def _float_input(info: OpInfo) -> str | None:
    return None if info.in_dtypes and info.in_dtypes[0].kind == "f" else "jax's rule here is for floats"


LIMITS["max_pool2d"] = _float_input
LIMITS["avg_pool2d"] = _float_input


def _real_input(info: OpInfo) -> str | None:
    return "jax orders complex numbers differently from NumPy" if info.in_dtypes[0].kind == "c" else None


for _k in ("argmax", "argmin", "max", "min", "maximum", "minimum", "fmax", "fmin", "clip", "sign"):
    LIMITS[_k] = _real_input
LIMITS["reciprocal"] = lambda info: ("NumPy's integer reciprocal (1 // x, platform-defined at 0) is not JAX's"
                                     if info.in_dtypes[0].kind in "biu" else None)


# ---------------------------------------------------------------- linalg
@rule("inv")
def _inv(info: OpInfo) -> Callable[..., Any]:
    return jnp.linalg.inv


@rule("det")
def _det(info: OpInfo) -> Callable[..., Any]:
    return jnp.linalg.det


@rule("solve")
def _solve(info: OpInfo) -> Callable[..., Any]:
    vector = len(info.in_types[1].shape) == 1  # type: ignore[union-attr,arg-type]
    dt = info.out_dtype
    if vector:
        return lambda a, b: jnp.linalg.solve(a.astype(dt), b.astype(dt)[..., None])[..., 0]
    return lambda a, b: jnp.linalg.solve(a.astype(dt), b.astype(dt))


@rule("cholesky")
def _cholesky(info: OpInfo) -> Callable[..., Any]:
    upper = info.attrs["upper"]
    return lambda a: jnp.linalg.cholesky(a, upper=upper)


@rule("eigvalsh")
def _eigvalsh(info: OpInfo) -> Callable[..., Any]:
    uplo, dt = info.attrs["UPLO"], info.out_dtype
    real = np.result_type(dt, np.float32)
    work = np.promote_types(info.in_dtypes[0], real) if info.in_dtypes[0].kind in "fc" else real
    # only the UPLO triangle is read, as NumPy does (JAX symmetrises by default)
    return lambda a: jnp.linalg.eigh(a.astype(work), UPLO=uplo, symmetrize_input=False).eigenvalues


@rule("pinv")
def _pinv(info: OpInfo) -> Callable[..., Any]:
    rtol, herm = info.attrs["rtol"], info.attrs["hermitian"]
    return lambda a: jnp.linalg.pinv(a, rtol=rtol, hermitian=herm)


@rule("svdvals")
def _svdvals(info: OpInfo) -> Callable[..., Any]:
    return lambda a: jnp.linalg.svd(a, compute_uv=False)


@rule("slogdet")
def _slogdet(info: OpInfo) -> Callable[..., Any]:
    return lambda a: tuple(jnp.linalg.slogdet(a))


# ---------------------------------------------------------------- indexing and signal
@rule("trilu")
def _trilu(info: OpInfo) -> Callable[..., Any]:
    k, upper = info.attrs["k"], info.attrs["upper"]
    return (lambda x: jnp.triu(x, k)) if upper else (lambda x: jnp.tril(x, k))


@rule("one_hot")
def _one_hot(info: OpInfo) -> Callable[..., Any]:
    depth, axis = info.attrs["depth"], info.attrs["axis"]
    rank = len(info.out_shape)  # type: ignore[arg-type]
    ax = axis % rank
    dt = info.out_dtype

    def one_hot(i: Any, values: Any) -> Any:
        i = jnp.where(i < 0, i + depth, i)
        hot = jnp.expand_dims(i, ax) == jnp.arange(depth).reshape((depth,) + (1,) * (rank - 1 - ax))
        return jnp.where(hot, values[1].astype(dt), values[0].astype(dt))
    return one_hot


@rule("fft")
def _fft(info: OpInfo) -> Callable[..., Any]:
    a = info.attrs
    fn = jnp.fft.ifft if a["inverse"] else jnp.fft.fft
    return lambda x: fn(x, n=a["n"], axis=a["axis"], norm=a["norm"])


@rule("rfft", "irfft")
def _rfft(info: OpInfo) -> Callable[..., Any]:
    a = info.attrs
    fn = jnp.fft.rfft if info.kind == "rfft" else jnp.fft.irfft
    # compute in the declared result's precision (float16 and float32 inputs give complex64 as in NumPy)
    wide = info.out_dtype in (np.complex128, np.float64)
    work = (np.complex128 if wide else np.complex64) if info.kind == "irfft" else (np.float64 if wide else np.float32)
    return lambda x: fn(x.astype(work), n=a["n"], axis=a["axis"], norm=a["norm"])


# ---------------------------------------------------------------- control flow
def _body_fn(body: Subgraph) -> Callable[..., tuple[Any, ...]]:
    """``body`` as a function of jax arrays returning its results as a tuple (its graph translated by the same
    rule table, nested bodies included; generated once per body). Traced inside the caller's ``jax.jit``."""
    def make() -> Callable[..., tuple[Any, ...]]:
        fn, consts, _src = body_program(BACKEND, body, lambda info: RULES[info.kind](info), fix=_fix)
        held = [jnp.asarray(c) for c in consts]
        return lambda *args: fn(held, *args)

    return body.cache(("jax-fn",), make)  # type: ignore[no-any-return]


def _results(res: Sequence[Any], n: int) -> Any:
    """A rule returns one value for a one-result op and a tuple otherwise (see straight_line)."""
    return res[0] if n == 1 else tuple(res)


def _truth(pred: Any) -> Any:
    """A one-element predicate as the scalar bool lax wants (nonzero is true, as in the NumPy kernel)."""
    return jnp.reshape(pred, ()).astype(bool)


@rule("call")
def _call(info: OpInfo) -> Callable[..., Any]:
    f, n = _body_fn(info.attrs["body"]), len(info.out_types)
    return lambda *args: _results(f(*args), n)


@rule("cond")
def _cond(info: OpInfo) -> Callable[..., Any]:
    then_f, else_f = _body_fn(info.attrs["then_body"]), _body_fn(info.attrs["else_body"])
    n = len(info.out_types)

    def cond(pred: Any, *operands: Any) -> Any:
        return _results(lax.cond(_truth(pred), lambda ops: tuple(then_f(*ops)), lambda ops: tuple(else_f(*ops)),
                                 operands), n)
    return cond


@rule("while_loop")
def _while_loop(info: OpInfo) -> Callable[..., Any]:
    a = info.attrs
    test, step = _body_fn(a["cond_body"]), _body_fn(a["body"])
    nc, max_trip, n = a["num_consts"], a["max_trip"], len(info.out_types)

    def while_loop(*ins: Any) -> Any:
        consts, init = ins[:nc], tuple(ins[nc:])
        if max_trip is None:
            out = lax.while_loop(lambda carry: _truth(test(*consts, *carry)[0]),
                                 lambda carry: tuple(step(*consts, *carry)), init)
        else:  # a trip counter joins the carry; the cond body is evaluated as well (bodies are pure)
            _, out = lax.while_loop(
                lambda s: (s[0] < max_trip) & _truth(test(*consts, *s[1])[0]),
                lambda s: (s[0] + 1, tuple(step(*consts, *s[1]))), (jnp.zeros((), np.int64), init))
        return _results(out, n)
    return while_loop


@rule("scan")
def _scan(info: OpInfo) -> Callable[..., Any]:
    a = info.attrs
    step = _body_fn(a["body"])
    nc, ncarry, length, reverse, n = a["num_consts"], a["num_carry"], a["length"], a["reverse"], len(info.out_types)

    def scan(*ins: Any) -> Any:
        consts, init, xs = ins[:nc], tuple(ins[nc:nc + ncarry]), tuple(ins[nc + ncarry:])

        def f(carry: tuple[Any, ...], x: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            res = step(*consts, *carry, *x)
            return tuple(res[:ncarry]), tuple(res[ncarry:])

        carry, ys = lax.scan(f, init, xs, length=length, reverse=reverse)
        return _results((*carry, *ys), n)
    return scan


def _carry_limit(body: Subgraph, first: int, count: int) -> str | None:
    """lax's loops keep each carry's type across trips: the body must return exactly the types it takes."""
    ins, outs = body.in_types[first:first + count], body.out_types[:count]
    for i, (t, o) in enumerate(zip(ins, outs, strict=True)):
        if t != o:
            return f"jax's loops need each carry to keep its type: body {body.label} takes carry[{i}] as {t} " \
                   f"and returns {o}"
    return None


def _cond_limit(info: OpInfo) -> str | None:
    t, e = info.attrs["then_body"], info.attrs["else_body"]
    for i, (a, b) in enumerate(zip(t.out_types, e.out_types, strict=True)):
        if a != b:
            return f"jax.lax.cond needs both branches to return the same types: result {i} is {a} in then " \
                   f"body {t.label} and {b} in else body {e.label}"
    return None


def _while_limit(info: OpInfo) -> str | None:
    body, nc = info.attrs["body"], info.attrs["num_consts"]
    ncarry = len(info.in_types) - nc
    if body.num_outputs > ncarry:
        return ("jax.lax.while_loop cannot stack per-trip results (ys): their length is known only at run time "
                "and jax.jit results have static shapes (a max_trip buffer would need slicing to the trip count "
                "outside jit)")
    return _carry_limit(body, nc, ncarry)


def _scan_limit(info: OpInfo) -> str | None:
    return _carry_limit(info.attrs["body"], info.attrs["num_consts"], info.attrs["num_carry"])


LIMITS.update({"cond": _cond_limit, "while_loop": _while_limit, "scan": _scan_limit})


# ---------------------------------------------------------------- the backend
def _fix(result: Any, t: Any) -> Any:
    """At trace time: make the result the declared type (NumPy's dtype; a broadcast where JAX kept a scalar)."""
    r = jnp.asarray(result)
    if isinstance(t, TensorType):
        if r.dtype != t.dtype:
            r = r.astype(t.dtype)
        if t.is_static and r.shape != t.shape:
            r = r.reshape(t.shape) if r.size == t.size else jnp.broadcast_to(r, t.shape)
    return r


class _JaxExecutable(Executable):
    def __init__(self, fn: Callable[..., Any], consts: list[Any], device: Any, graph: Graph) -> None:
        self.fn = fn
        self.consts = consts
        self.device = device
        self.graph = graph
        self.dtypes = input_dtypes(graph)

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        # jit would trace a wrong dtype as it is (or its fixes wrap it): feeds follow opgraph's rule instead
        return list(self.fn(self.consts, *conform_args(self.graph, self.dtypes, args)))


class JaxBackend(Backend):
    """XLA through ``jax.jit`` (see the module doc)."""

    lowers_bodies = True

    def _device(self, device: str | None) -> Any:
        name = self.check_device(device)
        kind, _, index = name.partition(":")
        platform = "gpu" if kind in ("cuda", "gpu") else kind
        try:
            devs = jax.devices(platform)
        except RuntimeError:
            raise BackendError(f"jax reports no {kind} device here (jax.devices({platform!r}) failed)") from None
        return devs[int(index) if index else 0]

    def check_device(self, device: str | None) -> str:
        name = super().check_device(device)
        if name.split(":")[0] in ("cuda", "gpu"):
            try:
                jax.devices("gpu")
            except RuntimeError:
                raise BackendError("jax reports no GPU device here; install jax[cuda] on a machine with one, "
                                   "or use device='cpu'") from None
        return name

    def compile_graph(self, graph: Graph, *, device: str | None = None, donate: Sequence[int] = (),
                      **options: Any) -> Executable:
        """One ``jax.jit`` function for ``graph``; ``donate``d inputs may be overwritten by XLA."""
        if options:
            raise TypeError(f"the jax backend takes no option(s) {sorted(options)}")
        dev = self._device(device)
        fn, consts, _src = straight_line(graph, lambda info: RULES[info.kind](info), fix=_fix)
        jitted = jax.jit(fn, donate_argnums=tuple(1 + i for i in donate))
        return _JaxExecutable(jitted, [jax.device_put(c, dev) for c in consts], dev, graph)

    def from_numpy(self, array: np.ndarray, device: str | None = None) -> Any:
        return jax.device_put(array, self._device(device))

    def to_numpy(self, array: Any) -> np.ndarray:
        # a read-only view of the JAX buffer; the runtime copies what it hands to users or keeps as state
        return np.asarray(array)


BACKEND = JaxBackend("jax", rules=RULES, dtypes=DTYPES, limits=LIMITS, module="jax", extra="jax",
                     devices=("cpu", "cuda", "gpu"), doc="XLA through jax.jit (CPU build here; GPU with jax[cuda])")
