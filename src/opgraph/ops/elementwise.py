"""Elementwise ops: arithmetic, math functions, comparisons, logic, where, cast.

Most are NumPy (or SciPy) ufuncs; their dtype rules are NumPy's own, asked
of the ufunc with ``resolve_dtypes``, so results match NumPy exactly.
Ids: unary 1-199, binary 200-399, others 400-499.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("int8", (3,)), name="x")
    >>> y = b.op("sqrt", x)       # NumPy computes sqrt of int8 in float16
    >>> y.type
    f16[3]
    >>> b.run({x: np.array([1, 4, 9], np.int8)}, [y])[0]
    array([1., 2., 3.], dtype=float16)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from opgraph.core.registry import Attr, OpDef, attr_dtype, register_op
from opgraph.core.types import TensorType, ValueType, broadcast_shapes
from opgraph.ops._common import tensor, ufunc_dtypes, with_out, write_out
from opgraph.ops.grad_helpers import is_float, mask, no_grad, scalar, unbroadcast

FAMILY = "elementwise"


def _scipy_ufunc(name: str) -> Callable[[], np.ufunc]:
    def load() -> np.ufunc:
        try:
            import scipy.special
        except ImportError as exc:  # pragma: no cover - scipy is installed by every make target
            raise ImportError(f"the {name} op needs SciPy: pip install 'opgraph[scipy]'") from exc
        return getattr(scipy.special, name)

    return load


class _LazyUfunc:
    """A ufunc looked up on first use (SciPy is imported only when needed)."""

    def __init__(self, load: Callable[[], np.ufunc]) -> None:
        self._load = load
        self._ufunc: np.ufunc | None = None

    def get(self) -> np.ufunc:
        if self._ufunc is None:
            self._ufunc = self._load()
        return self._ufunc


def _ufunc_op(name: str, id: int, ufunc: np.ufunc | _LazyUfunc, doc: str, *,
              commutative: bool = False) -> OpDef:
    get = ufunc.get if isinstance(ufunc, _LazyUfunc) else (lambda: ufunc)

    def infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
        ts = [tensor(t) for t in in_types]
        shape = broadcast_shapes(*(t.shape for t in ts))
        return tuple(TensorType(dt, shape) for dt in ufunc_dtypes(get(), [t.dtype for t in ts]))

    def kernel(*args: np.ndarray, out: Any = None) -> Any:
        return get()(*args, out=out)

    kernel.__name__ = f"{name}_numpy"
    nin = 1 if doc.startswith("unary") else 2
    return register_op(OpDef(
        name=name, id=id, arity=nin, infer=infer, kernels={"numpy": kernel},
        elementwise=True, commutative=commutative, inplace=tuple(range(nin)),
        family=FAMILY, doc=doc, grad=GRADS.get(name),
    ))


# name, id, ufunc. Ids are stable: append, never renumber.
UNARY: list[tuple[str, int, Any]] = [
    ("negative", 1, np.negative), ("positive", 2, np.positive), ("abs", 3, np.absolute),
    ("sign", 4, np.sign), ("exp", 5, np.exp), ("expm1", 6, np.expm1), ("log", 7, np.log),
    ("log1p", 8, np.log1p), ("log2", 9, np.log2), ("log10", 10, np.log10), ("sqrt", 11, np.sqrt),
    ("square", 12, np.square), ("reciprocal", 13, np.reciprocal), ("sin", 14, np.sin),
    ("cos", 15, np.cos), ("tan", 16, np.tan), ("asin", 17, np.arcsin), ("acos", 18, np.arccos),
    ("atan", 19, np.arctan), ("sinh", 20, np.sinh), ("cosh", 21, np.cosh), ("tanh", 22, np.tanh),
    ("asinh", 23, np.arcsinh), ("acosh", 24, np.arccosh), ("atanh", 25, np.arctanh),
    ("floor", 26, np.floor), ("ceil", 27, np.ceil), ("trunc", 28, np.trunc), ("round", 29, None),
    ("sigmoid", 30, _LazyUfunc(_scipy_ufunc("expit"))), ("erf", 31, _LazyUfunc(_scipy_ufunc("erf"))),
    ("isnan", 32, np.isnan), ("isinf", 33, np.isinf), ("isfinite", 34, np.isfinite),
    ("logical_not", 35, np.logical_not), ("bitwise_invert", 36, np.invert), ("conj", 37, np.conjugate),
    ("signbit", 38, np.signbit), ("exp2", 39, np.exp2), ("cbrt", 40, np.cbrt),
    ("erfc", 41, _LazyUfunc(_scipy_ufunc("erfc"))), ("real", 42, np.real), ("imag", 43, np.imag),
]
BINARY: list[tuple[str, int, Any, bool]] = [
    ("add", 200, np.add, True), ("subtract", 201, np.subtract, False),
    ("multiply", 202, np.multiply, True), ("divide", 203, np.divide, False),
    ("floor_divide", 204, np.floor_divide, False), ("remainder", 205, np.remainder, False),
    ("power", 206, np.power, False), ("maximum", 207, np.maximum, True),
    ("minimum", 208, np.minimum, True), ("atan2", 209, np.arctan2, False),
    ("hypot", 210, np.hypot, True), ("logaddexp", 211, np.logaddexp, True),
    ("copysign", 212, np.copysign, False), ("nextafter", 213, np.nextafter, False),
    ("equal", 220, np.equal, True), ("not_equal", 221, np.not_equal, True),
    ("less", 222, np.less, False), ("less_equal", 223, np.less_equal, False),
    ("greater", 224, np.greater, False), ("greater_equal", 225, np.greater_equal, False),
    ("logical_and", 230, np.logical_and, True), ("logical_or", 231, np.logical_or, True),
    ("logical_xor", 232, np.logical_xor, True), ("bitwise_and", 240, np.bitwise_and, True),
    ("bitwise_or", 241, np.bitwise_or, True), ("bitwise_xor", 242, np.bitwise_xor, True),
    ("bitwise_left_shift", 243, np.left_shift, False),
    ("bitwise_right_shift", 244, np.right_shift, False),
    ("fmax", 245, np.fmax, True), ("fmin", 246, np.fmin, True),
    ("fmod", 247, np.fmod, False),
]


# ---------------------------------------------------------------- gradient rules
# A rule is rule(b, inputs, outputs, cotangents, attrs) -> one cotangent (or None) per input;
# see opgraph.ops.grad_helpers. Conventions at non-differentiable points follow JAX:
# abs'(0) = 1, maximum/minimum split ties 0.5/0.5, sign/floor/ceil/trunc/round have zero gradient.
def _unary(fn: Callable[[Any, Any, Any, Any], Any]) -> Callable[..., list[Any]]:
    def rule(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
        return [fn(b, ins[0], outs[0], cots[0])]

    return rule


def _binary(fn: Callable[[Any, Any, Any, Any, Any], tuple[Any, Any]]) -> Callable[..., list[Any]]:
    def rule(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
        g1, g2 = fn(b, ins[0], ins[1], outs[0], cots[0])
        return [None if g is None or not is_float(x.type) else unbroadcast(b, g, x.type)
                for g, x in ((g1, ins[0]), (g2, ins[1]))]

    return rule


def _m(b: Any, *xs: Any) -> Any:  # product of several values
    acc = xs[0]
    for x in xs[1:]:
        acc = b.op("multiply", acc, x)
    return acc


def _d(b: Any, x: Any, y: Any) -> Any:
    return b.op("divide", x, y)


def _c(b: Any, v: float, like: Any) -> Any:
    return scalar(b, v, like)


def _one_minus_sq(b: Any, x: Any) -> Any:
    return b.op("subtract", _c(b, 1.0, x), b.op("square", x))


def _ties(b: Any, x1: Any, x2: Any, g: Any, win: str) -> tuple[Any, Any]:
    # maximum (win="greater") / minimum (win="less"): the winner gets g, ties split it evenly (JAX).
    half = _c(b, 0.5, g)
    w1 = b.op("where", b.op(win, x1, x2), _c(b, 1.0, g), b.op("where", b.op("equal", x1, x2), half, _c(b, 0.0, g)))
    w2 = b.op("subtract", _c(b, 1.0, g), w1)
    return _m(b, g, w1), _m(b, g, w2)


_LN2, _LN10 = float(np.log(2.0)), float(np.log(10.0))
_UNARY_GRADS: dict[str, Callable[[Any, Any, Any, Any], Any]] = {
    "negative": lambda b, x, y, g: b.op("negative", g),
    "positive": lambda b, x, y, g: g,
    "abs": lambda b, x, y, g: b.op("where", b.op("greater_equal", x, _c(b, 0.0, x)), g, b.op("negative", g)),
    "exp": lambda b, x, y, g: _m(b, g, y),
    "expm1": lambda b, x, y, g: _m(b, g, b.op("add", y, _c(b, 1.0, y))),
    "log": lambda b, x, y, g: _d(b, g, x),
    "log1p": lambda b, x, y, g: _d(b, g, b.op("add", x, _c(b, 1.0, x))),
    "log2": lambda b, x, y, g: _d(b, g, _m(b, x, _c(b, _LN2, x))),
    "log10": lambda b, x, y, g: _d(b, g, _m(b, x, _c(b, _LN10, x))),
    "sqrt": lambda b, x, y, g: _d(b, _m(b, g, _c(b, 0.5, g)), y),
    "square": lambda b, x, y, g: _m(b, g, _m(b, x, _c(b, 2.0, x))),
    "reciprocal": lambda b, x, y, g: b.op("negative", _m(b, g, b.op("square", y))),
    "sin": lambda b, x, y, g: _m(b, g, b.op("cos", x)),
    "cos": lambda b, x, y, g: b.op("negative", _m(b, g, b.op("sin", x))),
    "tan": lambda b, x, y, g: _m(b, g, b.op("add", _c(b, 1.0, y), b.op("square", y))),
    "asin": lambda b, x, y, g: _d(b, g, b.op("sqrt", _one_minus_sq(b, x))),
    "acos": lambda b, x, y, g: b.op("negative", _d(b, g, b.op("sqrt", _one_minus_sq(b, x)))),
    "atan": lambda b, x, y, g: _d(b, g, b.op("add", _c(b, 1.0, x), b.op("square", x))),
    "sinh": lambda b, x, y, g: _m(b, g, b.op("cosh", x)),
    "cosh": lambda b, x, y, g: _m(b, g, b.op("sinh", x)),
    "tanh": lambda b, x, y, g: _m(b, g, _one_minus_sq(b, y)),
    "asinh": lambda b, x, y, g: _d(b, g, b.op("sqrt", b.op("add", b.op("square", x), _c(b, 1.0, x)))),
    "acosh": lambda b, x, y, g: _d(b, g, b.op("sqrt", b.op("subtract", b.op("square", x), _c(b, 1.0, x)))),
    "atanh": lambda b, x, y, g: _d(b, g, _one_minus_sq(b, x)),
    "sigmoid": lambda b, x, y, g: _m(b, g, y, b.op("subtract", _c(b, 1.0, y), y)),
    "erf": lambda b, x, y, g: _m(b, g, _c(b, 2.0 / np.sqrt(np.pi), g),
                                 b.op("exp", b.op("negative", b.op("square", x)))),
    "erfc": lambda b, x, y, g: _m(b, g, _c(b, -2.0 / np.sqrt(np.pi), g),
                                  b.op("exp", b.op("negative", b.op("square", x)))),
    "exp2": lambda b, x, y, g: _m(b, g, y, _c(b, _LN2, y)),
    "cbrt": lambda b, x, y, g: _d(b, g, _m(b, _c(b, 3.0, y), b.op("square", y))),
    "conj": lambda b, x, y, g: b.op("conj", g),
    "real": lambda b, x, y, g: g if not x.type.dtype.kind == "c" else None,
}
_BINARY_GRADS: dict[str, Callable[[Any, Any, Any, Any, Any], tuple[Any, Any]]] = {
    "add": lambda b, x1, x2, y, g: (g, g),
    "subtract": lambda b, x1, x2, y, g: (g, b.op("negative", g)),
    "multiply": lambda b, x1, x2, y, g: (_m(b, g, x2), _m(b, g, x1)),
    "divide": lambda b, x1, x2, y, g: (_d(b, g, x2), b.op("negative", _d(b, _m(b, g, y), x2))),
    # d/dx x**p = p x**(p-1); d/dp x**p = log(x) x**p with log(0) read as 0 (JAX).
    "power": lambda b, x1, x2, y, g: (
        _m(b, g, x2, b.op("power", x1, b.op("subtract", x2, _c(b, 1.0, x2)))),
        _m(b, g, y, b.op("log", b.op("where", b.op("equal", x1, _c(b, 0.0, x1)), _c(b, 1.0, x1), x1)))),
    "maximum": lambda b, x1, x2, y, g: _ties(b, x1, x2, g, "greater"),
    "minimum": lambda b, x1, x2, y, g: _ties(b, x1, x2, g, "less"),
    "fmax": lambda b, x1, x2, y, g: _ties(b, x1, x2, g, "greater"),
    "fmin": lambda b, x1, x2, y, g: _ties(b, x1, x2, g, "less"),
    "atan2": lambda b, x1, x2, y, g: (
        _d(b, _m(b, g, x2), b.op("add", b.op("square", x1), b.op("square", x2))),
        b.op("negative", _d(b, _m(b, g, x1), b.op("add", b.op("square", x1), b.op("square", x2))))),
    "hypot": lambda b, x1, x2, y, g: (_d(b, _m(b, g, x1), y), _d(b, _m(b, g, x2), y)),
    "logaddexp": lambda b, x1, x2, y, g: (_m(b, g, b.op("exp", b.op("subtract", x1, y))),
                                          _m(b, g, b.op("exp", b.op("subtract", x2, y)))),
    "copysign": lambda b, x1, x2, y, g: (
        b.op("where", b.op("equal", b.op("signbit", x1), b.op("signbit", x2)), g, b.op("negative", g)), None),
    "remainder": lambda b, x1, x2, y, g: (g, b.op("negative", _m(b, g, b.op("floor_divide", x1, x2)))),
    # fmod(x1, x2) = x1 - trunc(x1 / x2) * x2: remainder's rule with the quotient truncated, not floored.
    "fmod": lambda b, x1, x2, y, g: (g, b.op("negative", _m(b, g, b.op("trunc", _d(b, x1, x2))))),
}

# Zero gradient (piecewise constant, comparisons, logic, integer/bit ops): not an error, no cotangent.
ZERO_GRAD = ("sign", "floor", "ceil", "trunc", "round", "isnan", "isinf", "isfinite", "logical_not",
             "bitwise_invert", "signbit", "imag", "floor_divide", "nextafter", "equal", "not_equal", "less",
             "less_equal", "greater", "greater_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and",
             "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift")
GRADS: dict[str, Callable[..., Any]] = {
    **{k: _unary(f) for k, f in _UNARY_GRADS.items()},
    **{k: _binary(f) for k, f in _BINARY_GRADS.items()},
    **dict.fromkeys(ZERO_GRAD, no_grad),
}


def _where_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    cond, x, y = ins
    (g,) = cots
    zero = _c(b, 0.0, g)
    return [None, unbroadcast(b, b.op("where", cond, g, zero), x.type) if is_float(x.type) else None,
            unbroadcast(b, b.op("where", cond, zero, g), y.type) if is_float(y.type) else None]


def _cast_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    (x,), (g,) = ins, cots
    if not (is_float(x.type) and is_float(outs[0].type)):
        return [None]
    return [b.op("cast", g, dtype=x.type.dtype)]


def _clip_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # The gradient goes to x where lo <= x <= hi, to lo where x < lo, to hi where x > hi.
    x, lo, hi = ins
    (g,) = cots
    below, above = b.op("less", x, lo), b.op("greater", x, hi)
    inside = b.op("logical_not", b.op("logical_or", below, above))
    return [unbroadcast(b, mask(b, m, g), t.type) if is_float(t.type) else None
            for m, t in ((inside, x), (below, lo), (above, hi))]

for _name, _id, _uf in UNARY:
    if isinstance(_uf, (np.ufunc, _LazyUfunc)):  # round, real and imag are registered below
        _ufunc_op(_name, _id, _uf, f"unary elementwise: NumPy's {getattr(_uf, '__name__', _name)}")
for _name, _id, _uf, _comm in BINARY:
    _ufunc_op(_name, _id, _uf, f"binary elementwise with broadcasting: NumPy's {_uf.__name__}",
              commutative=_comm)


def _part_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    (t,) = (tensor(x) for x in in_types)
    dt = np.dtype(np.float32) if t.dtype == np.complex64 else (
        np.dtype(np.float64) if t.dtype == np.complex128 else t.dtype)
    return (TensorType(dt, t.shape),)


for _name, _id, _fn in (("real", 42, np.real), ("imag", 43, np.imag)):
    register_op(OpDef(
        name=_name, id=_id, arity=1, infer=_part_infer,
        kernels={"numpy": with_out(lambda x, _f=_fn: np.array(_f(x), copy=True))},
        elementwise=True, family=FAMILY, doc=f"NumPy's {_name}: the {_name} part (identity on reals for real)",
        grad=GRADS[_name],
    ))


def _round_kernel(x: np.ndarray, out: Any = None) -> np.ndarray:
    if x.dtype.kind in "biu":  # integers are already round; np.rint would turn them into floats
        return write_out(x.copy(), out)
    return np.rint(x, out=out)


register_op(OpDef(
    name="round", id=29, arity=1, infer=lambda ts, a: (tensor(ts[0]),), kernels={"numpy": _round_kernel},
    elementwise=True, inplace=(0,), family=FAMILY, grad=no_grad,
    doc="round half to even, keeping the dtype (NumPy's round with decimals=0)",
))


def _where_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    cond, x, y = (tensor(t) for t in in_types)
    if cond.dtype != np.bool_:
        from opgraph.errors import OpTypeError

        raise OpTypeError(f"condition must be bool, got {cond.dtype}")
    shape = broadcast_shapes(cond.shape, x.shape, y.shape)
    return (TensorType(np.result_type(x.dtype, y.dtype), shape),)


def _where_kernel(cond: np.ndarray, x: np.ndarray, y: np.ndarray, out: Any = None) -> np.ndarray:
    if out is None:
        return np.where(cond, x, y)
    np.copyto(out, y, casting="unsafe")
    np.copyto(out, x, casting="unsafe", where=cond)
    return out


register_op(OpDef(
    name="where", id=400, arity=3, infer=_where_infer, kernels={"numpy": _where_kernel},
    # Not x (position 1): the kernel copies y into out before reading x.
    elementwise=True, inplace=(2,), family=FAMILY, grad=_where_grad,
    doc="where(cond, x, y): x where cond else y, with broadcasting (NumPy's where)",
))


def _cast_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    (t,) = (tensor(x) for x in in_types)
    return (TensorType(attrs["dtype"], t.shape),)


def _cast_version(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> int:
    from opgraph.core.dtypes import dtype_code

    (t,) = in_types
    return dtype_code(t.dtype) * 16 + dtype_code(attrs["dtype"])  # type: ignore[union-attr]


def _cast_kernel(x: np.ndarray, out: Any = None, *, dtype: str) -> np.ndarray:
    if out is None:
        return np.array(x, dtype=dtype, copy=True)
    np.copyto(out, x, casting="unsafe")
    return out


register_op(OpDef(
    name="cast", id=401, arity=1, infer=_cast_infer, version=_cast_version,
    attrs={"dtype": Attr(attr_dtype, doc="target dtype")}, kernels={"numpy": _cast_kernel},
    elementwise=True, family=FAMILY, grad=_cast_grad,
    doc="cast(x, dtype): NumPy's astype with unsafe casting (the version encodes source and target dtype)",
))


def _clip_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x, lo, hi = (tensor(t) for t in in_types)
    return (TensorType(np.result_type(x.dtype, lo.dtype, hi.dtype),
                       broadcast_shapes(x.shape, lo.shape, hi.shape)),)


register_op(OpDef(
    name="clip", id=402, arity=3, infer=_clip_infer,
    kernels={"numpy": lambda x, lo, hi, out=None: np.clip(x, lo, hi, out=out)},
    elementwise=True, inplace=(0,), family=FAMILY, grad=_clip_grad,
    doc="clip(x, lo, hi): NumPy's clip with array bounds",
))
