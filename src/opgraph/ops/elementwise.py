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

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.core.registry import (
    Attr,
    Emit,
    OpDef,
    attr_dtype,
    attr_float,
    family_kinds,
    mark_traits,
    register_op,
    set_rules,
)
from opgraph.core.types import TensorType, ValueType, broadcast_shapes
from opgraph.errors import MissingDependencyError
from opgraph.ops._common import const_like, tensor, ufunc_dtypes, with_out, write_out
from opgraph.ops.batch_helpers import same_rank
from opgraph.ops.grad_helpers import is_float, mask, no_grad, scalar, unbroadcast

FAMILY = "elementwise"


def _scipy_ufunc(name: str) -> Callable[[], np.ufunc]:
    def load() -> np.ufunc:
        try:
            import scipy.special
        except ImportError as exc:  # pragma: no cover - scipy is installed by every make target
            raise MissingDependencyError("scipy", f"the {name} op") from exc
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


# ---------------------------------------------------------------- float32 kernels (erf, sigmoid, gelu)
# SciPy's float32 erf and expit run a float64 algorithm element by element (18 ms for 1.2M elements against
# 2.4 ms for torch.erf). These kernels stay in float32 and run only SIMD NumPy ufuncs, in place (each pass
# function below: input x, output o, temporaries s and r). The reference kernels run a pass function over the
# whole array; the NumPy engine (opgraph.backends.numpy.elementwise) runs the same passes on cache-sized blocks,
# or numba loops. Other dtypes keep SciPy.

# erf(x) = tanh(x * P(x^2)): P(s) = atanh(erf(sqrt s)) / sqrt s is smooth and slowly varying, and tanh damps the
# error of P where erf nears +-1, so degree 6 suffices. Minimax fit over s in [0, 16] (Lawson iterations,
# errors weighted by tanh's sensitivity). P stays increasing past s = 16, where x * P(x^2) > 9.4 and tanh
# rounds to exactly 1 in float32, so large, infinite and nan inputs need no special case.
_ERF_P = (1.128379225730896, 0.10276905447244644, -0.00019183011318091303, -0.0006197854527272284,
          8.76376943779178e-05, -5.66854623684776e-06, 1.4185680186074023e-07)
ERF_P32 = tuple(np.float32(c) for c in _ERF_P)
"""The coefficients of erf's polynomial P in float32, lowest degree first."""
# gelu(x) = 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x (1 + tanh(x * G(x^2))), G(s) = P(s / 2) / sqrt 2.
GELU_P32 = tuple(np.float32(c / 2.0 ** k / np.sqrt(2.0)) for k, c in enumerate(_ERF_P))
"""The coefficients of gelu's polynomial G in float32, lowest degree first."""
_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
_GELU_TANH_K = 0.044715
_F32 = np.dtype(np.float32)
_SIGMOID_SAFE = np.float32(88.0)  # exp(88) < float32 max (3.4e38)


def _horner(s: np.ndarray, coefs: tuple[np.float32, ...], r: np.ndarray) -> np.ndarray:
    """r = sum_k coefs[k] * s**k, in place, one pass per multiply and per add."""
    np.multiply(s, coefs[-1], out=r)
    np.add(r, coefs[-2], out=r)
    for c in coefs[-3::-1]:
        np.multiply(r, s, out=r)
        np.add(r, c, out=r)
    return r


def _float32_example(passes: Callable[..., None], x: list[float]) -> np.ndarray:
    a = np.array(x, _F32)
    o = np.empty_like(a)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        passes(a, o, np.empty_like(a), np.empty_like(a))
    return o


def erf_passes(x: np.ndarray, o: np.ndarray, s: np.ndarray, r: np.ndarray) -> None:
    """erf of float32 ``x`` into ``o`` (which may be ``x``), ``s`` and ``r`` temporaries of its shape.

    >>> _float32_example(erf_passes, [0.0, 0.5, -2.0])
    array([ 0.        ,  0.5204998 , -0.99532217], dtype=float32)
    """
    np.multiply(x, x, out=s)
    _horner(s, ERF_P32, r)
    np.multiply(r, x, out=r)
    np.tanh(r, out=o)


def sigmoid_passes(x: np.ndarray, o: np.ndarray, s: np.ndarray, r: np.ndarray) -> None:
    """sigmoid of float32 ``x`` into ``o`` (which may be ``x`` or ``r``), ``s`` and ``r`` temporaries.

    >>> _float32_example(sigmoid_passes, [0.0, 2.0, -100.0])
    array([5.0000000e-01, 8.8079715e-01, 3.7835059e-44], dtype=float32)
    """
    if x.max() <= _SIGMOID_SAFE:
        # e / (1 + e) with e = exp(x): three passes, relative accuracy down to the subnormals (exp underflows
        # gracefully); exp(x) cannot overflow below 88.
        np.exp(x, out=r)
        np.add(r, np.float32(1.0), out=s)
        np.divide(r, s, out=o)
        return
    # Inputs above 88 (or a nan): e / (1 + e) or 1 / (1 + e) with e = exp(-|x|), which never overflows.
    np.absolute(x, out=r)
    np.negative(r, out=r)
    np.exp(r, out=r)
    np.add(r, np.float32(1.0), out=s)
    np.copyto(r, np.float32(1.0), where=x >= 0)
    np.divide(r, s, out=o)


def gelu_passes(x: np.ndarray, o: np.ndarray, s: np.ndarray, r: np.ndarray) -> None:
    """gelu (``approximate="none"``) of float32 ``x`` into ``o`` (which may be ``x``), ``s``, ``r`` temporaries.

    >>> _float32_example(gelu_passes, [-1.0, 0.0, 2.0])
    array([-0.15865523,  0.        ,  1.9544997 ], dtype=float32)
    """
    np.multiply(x, x, out=s)
    _horner(s, GELU_P32, r)
    np.multiply(r, x, out=r)
    np.tanh(r, out=r)
    np.add(r, np.float32(1.0), out=r)
    np.multiply(x, np.float32(0.5), out=s)  # 0.5 x first: (1 + t) x would overflow for x near float32's max
    np.multiply(r, s, out=o)


def gelu_tanh_passes(x: np.ndarray, o: np.ndarray, s: np.ndarray, r: np.ndarray) -> None:
    """gelu (``approximate="tanh"``) of float32 ``x`` into ``o`` (which may be ``x``), ``s``, ``r`` temporaries.

    >>> _float32_example(gelu_tanh_passes, [-1.0, 0.0, 2.0])
    array([-0.158808 ,  0.       ,  1.9545977], dtype=float32)
    """
    # The formula of torch's gelu(approximate="tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
    np.multiply(x, x, out=r)
    np.multiply(r, np.float32(_SQRT_2_OVER_PI * _GELU_TANH_K), out=r)
    np.add(r, np.float32(_SQRT_2_OVER_PI), out=r)
    np.multiply(r, x, out=r)
    np.tanh(r, out=r)
    np.add(r, np.float32(1.0), out=r)
    np.multiply(x, np.float32(0.5), out=s)
    np.multiply(r, s, out=o)


def _whole_f32(passes: Callable[..., None], x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """``passes(x, out, tmp1, tmp2)`` once over the whole of ``x`` (cast to float32), into ``out``."""
    x = np.asarray(x, dtype=_F32)
    direct = out is not None and out.dtype == _F32 and out.shape == x.shape
    res = out if direct else np.empty(x.shape, _F32)
    # x * x of a large x is inf by design; gelu(-inf) is 0 * inf = nan, as in the formula torch uses
    if x.size:  # sigmoid's passes take a maximum, which an empty array has not
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            passes(x, res, np.empty(x.shape, _F32), np.empty(x.shape, _F32))
    if out is not None and not direct:
        np.copyto(out, res, casting="unsafe")
        return out
    return res  # type: ignore[return-value]


class _Float32Ufunc(_LazyUfunc):
    """A SciPy ufunc whose float32 loop is NumPy passes (no SciPy needed for float32 inputs)."""

    def __init__(self, load: Callable[[], np.ufunc], passes: Callable[..., None]) -> None:
        super().__init__(load)
        self.passes = passes

    def __call__(self, x: np.ndarray, out: Any = None) -> Any:
        if isinstance(x, np.ndarray) and x.dtype == _F32:
            return _whole_f32(self.passes, x, out)
        return self.get()(x, out=out)

    def dtypes(self, dtypes: list[np.dtype]) -> tuple[np.dtype, ...]:
        """Result dtypes: the input's for float32/float64 (no SciPy needed), else SciPy's loop resolution."""
        if len(dtypes) == 1 and dtypes[0] in (np.float32, np.float64):
            return (dtypes[0],)
        return ufunc_dtypes(self.get(), dtypes)


def erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The error function; float32 without SciPy (within 4 ulp of the correctly rounded value), else SciPy's.

    float32 computes tanh(x * P(x**2)) with a degree-6 minimax polynomial P (:func:`erf_passes`): at most
    3.6 ulp from erf rounded to float32 over a dense sweep of [-4.5, 4.5] plus the tails (the test measures
    it), about 10x faster than SciPy's float32 erf; nan, +-inf and -0.0 give nan, +-1 and -0.0. Other dtypes
    (float64, complex) use ``scipy.special.erf``.

    >>> import numpy as np
    >>> erf(np.array([0.0, 0.5, -2.0], np.float32))
    array([ 0.        ,  0.5204998 , -0.99532217], dtype=float32)
    """
    return _ERF(x, out=out)  # type: ignore[no-any-return]


def sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The logistic function 1 / (1 + exp(-x)); float32 without SciPy (within 4 ulp), else ``scipy.special.expit``.

    float32 computes e / (1 + e) with e = exp(x) (:func:`sigmoid_passes`); an array holding an input above 88
    (where exp(x) would overflow) or a nan uses e = exp(-|x|) and 1 / (1 + e) for x >= 0. Tiny results keep
    their relative accuracy down to the subnormals. At most 4 ulp (mostly NumPy's float32 exp), measured over
    a dense sweep.

    >>> import numpy as np
    >>> sigmoid(np.array([0.0, 2.0, -100.0], np.float32))
    array([5.0000000e-01, 8.8079715e-01, 3.7835059e-44], dtype=float32)
    """
    return _SIGMOID(x, out=out)  # type: ignore[no-any-return]


_ERF = _Float32Ufunc(_scipy_ufunc("erf"), erf_passes)
_SIGMOID = _Float32Ufunc(_scipy_ufunc("expit"), sigmoid_passes)


def _ufunc_op(name: str, id: int, ufunc: np.ufunc | _LazyUfunc, doc: str, *,
              commutative: bool = False) -> OpDef:
    get = ufunc.get if isinstance(ufunc, _LazyUfunc) else (lambda: ufunc)
    dtypes = ufunc.dtypes if isinstance(ufunc, _Float32Ufunc) else (lambda dts: ufunc_dtypes(get(), dts))

    def infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
        ts = [tensor(t) for t in in_types]
        shape = broadcast_shapes(*(t.shape for t in ts))
        return tuple(TensorType(dt, shape) for dt in dtypes([t.dtype for t in ts]))

    def ufunc_kernel(*args: np.ndarray, out: Any = None) -> Any:
        return get()(*args, out=out)

    def fast_kernel(x: np.ndarray, out: Any = None) -> Any:
        return ufunc(x, out=out)  # type: ignore[operator]

    kernel = fast_kernel if isinstance(ufunc, _Float32Ufunc) else ufunc_kernel
    kernel.__name__ = f"{name}_numpy"
    if isinstance(ufunc, np.ufunc):  # runtimes may call the ufunc itself (the wrapper only adds a call)
        kernel.ufunc = ufunc  # type: ignore[attr-defined]
    nin = 1 if doc.startswith("unary") else 2
    return register_op(OpDef(
        name=name, id=id, arity=nin, infer=infer, kernel=kernel,
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
    ("sigmoid", 30, _SIGMOID), ("erf", 31, _ERF),
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
    # the parts of a complex value: cotangents complex(g, 0) and complex(0, -g), JAX's transposes of real and imag
    "real": lambda b, x, y, g: b.op("cast", g, dtype=x.type.dtype) if x.type.dtype.kind == "c" else g,
    "imag": lambda b, x, y, g: (_m(b, b.op("cast", g, dtype=x.type.dtype), b.constant(np.array(-1j, x.type.dtype)))
                                if x.type.dtype.kind == "c" else None),
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
             "bitwise_invert", "signbit", "floor_divide", "nextafter", "equal", "not_equal", "less",
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

_FAST_DOCS = {
    "erf": "unary elementwise: the error function; float32 by a NumPy kernel (tanh of a degree-6 minimax "
           "polynomial, at most 4 ulp from the correctly rounded value, measured), other dtypes by SciPy's erf",
    "sigmoid": "unary elementwise: 1 / (1 + exp(-x)); float32 by a NumPy kernel (at most 4 ulp, measured; exact "
               "down to the subnormals), other dtypes by SciPy's expit",
}
for _name, _id, _uf in UNARY:
    if isinstance(_uf, (np.ufunc, _LazyUfunc)):  # round, real and imag are registered below
        _ufunc_op(_name, _id, _uf, _FAST_DOCS.get(_name)
                  or f"unary elementwise: NumPy's {getattr(_uf, '__name__', _name)}")
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
        kernel=with_out(lambda x, _f=_fn: np.array(_f(x), copy=True)),
        elementwise=True, family=FAMILY, doc=f"NumPy's {_name}: the {_name} part (identity on reals for real)",
        grad=GRADS[_name],
    ))


def _round_kernel(x: np.ndarray, out: Any = None) -> np.ndarray:
    if x.dtype.kind in "biu":  # integers are already round; np.rint would turn them into floats
        return write_out(x.copy(), out)
    return np.rint(x, out=out)


register_op(OpDef(
    name="round", id=29, arity=1, infer=lambda ts, a: (tensor(ts[0]),), kernel=_round_kernel,
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
    name="where", id=400, arity=3, infer=_where_infer, kernel=_where_kernel,
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
    attrs={"dtype": Attr(attr_dtype, doc="target dtype")}, kernel=_cast_kernel,
    elementwise=True, family=FAMILY, grad=_cast_grad,
    doc="cast(x, dtype): NumPy's astype with unsafe casting (the version encodes source and target dtype)",
))


def _clip_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x, lo, hi = (tensor(t) for t in in_types)
    return (TensorType(np.result_type(x.dtype, lo.dtype, hi.dtype),
                       broadcast_shapes(x.shape, lo.shape, hi.shape)),)


register_op(OpDef(
    name="clip", id=402, arity=3, infer=_clip_infer,
    kernel=lambda x, lo, hi, out=None: np.clip(x, lo, hi, out=out),
    elementwise=True, inplace=(0,), family=FAMILY, grad=_clip_grad,
    doc="clip(x, lo, hi): NumPy's clip with array bounds",
))


# ---------------------------------------------------------------- gelu
def _gelu_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    (t,) = (tensor(x) for x in in_types)
    if t.dtype.kind != "f":
        from opgraph.errors import OpTypeError

        raise OpTypeError(f"gelu needs a floating-point input, got {t.dtype}")
    return (t,)


def _gelu_numpy(x: np.ndarray, approximate: str) -> np.ndarray:
    # The textbook formulas (those of torch and of ONNX's Gelu), for dtypes other than float32.
    if approximate == "tanh":
        inner = x * (np.asarray(_SQRT_2_OVER_PI, x.dtype) * (1 + np.asarray(_GELU_TANH_K, x.dtype) * x * x))
        return np.asarray(0.5 * x * (1 + np.tanh(inner)), dtype=x.dtype)
    # x * Phi(x) with SciPy's ndtr: accurate also in the left tail, where 1 + erf(x / sqrt 2) cancels.
    return np.asarray(x * _LazyUfunc(_scipy_ufunc("ndtr")).get()(x), dtype=x.dtype)


def gelu(x: np.ndarray, out: np.ndarray | None = None, *, approximate: str = "none") -> np.ndarray:
    """GELU: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), or torch's ``approximate="tanh"`` form.

    The tanh form is 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). float32 runs NumPy passes
    without SciPy. ``"none"`` computes 0.5 x (1 + tanh(x * G(x^2))), the erf kernel's polynomial rescaled:
    at most 5 ulp from x * Phi(x) rounded to float32 for x >= -1 (torch's gelu: 5.1); below, as in the
    formula 0.5 x (1 + erf(x / sqrt 2)) that torch and ONNX use, 1 + erf cancels, so the error is bounded
    absolutely: at most 1e-7 * |x| (torch's: 3.3e-7 * |x|), measured. ``"tanh"`` evaluates torch's formula
    in float32. float16 computes in float32; float64 uses SciPy's ndtr (``"none"``) or NumPy (``"tanh"``).

    >>> import numpy as np
    >>> gelu(np.array([-1.0, 0.0, 2.0], np.float32))
    array([-0.15865523,  0.        ,  1.9544997 ], dtype=float32)
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    x = np.asarray(x)
    if x.dtype in (np.float16, np.float32):
        passes = gelu_tanh_passes if approximate == "tanh" else gelu_passes
        if x.dtype == np.float16:
            return write_out(_whole_f32(passes, x, None).astype(np.float16), out)
        return _whole_f32(passes, x, out)
    return write_out(_gelu_numpy(x, approximate), out)  # type: ignore[no-any-return]


def _gelu_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    (x,), (g,) = ins, cots
    if attrs["approximate"] == "tanh":
        # d/dx 0.5 x (1 + t) = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2), t = tanh(c (x + k x^3))
        xx = b.op("square", x)
        u = _m(b, _c(b, _SQRT_2_OVER_PI, x), x, b.op("add", _c(b, 1.0, x), _m(b, _c(b, _GELU_TANH_K, x), xx)))
        t = b.op("tanh", u)
        du = _m(b, _c(b, _SQRT_2_OVER_PI, x), b.op("add", _c(b, 1.0, x), _m(b, _c(b, 3 * _GELU_TANH_K, x), xx)))
        d = b.op("add", _m(b, _c(b, 0.5, x), b.op("add", _c(b, 1.0, x), t)),
                 _m(b, _c(b, 0.5, x), x, _one_minus_sq(b, t), du))
        return [_m(b, g, d)]
    # d/dx x Phi(x) = Phi(x) + x phi(x)
    cdf = _m(b, _c(b, 0.5, x), b.op("add", _c(b, 1.0, x), b.op("erf", _m(b, x, _c(b, 1 / np.sqrt(2.0), x)))))
    pdf = _m(b, _c(b, 1 / np.sqrt(2 * np.pi), x), b.op("exp", _m(b, _c(b, -0.5, x), b.op("square", x))))
    return [_m(b, g, b.op("add", cdf, _m(b, x, pdf)))]


def _attr_approximate(v: Any) -> str:
    v = str(v)
    if v not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {v!r}")
    return v


def _gelu_parts(e: Emit, ins: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    (x,) = ins
    dt = tensor(e.type_of(x)).dtype

    def c(v: float) -> Any:
        return const_like(e, v, x)

    if attrs["approximate"] == "tanh":
        inner = e.op("multiply", x, e.op("add", c(1.0), e.op("multiply", c(0.044715), e.op("multiply", x, x))))
        t = e.op("tanh", e.op("multiply", c(float(np.sqrt(2 / np.pi))), inner))
    else:
        t = e.op("erf", e.op("multiply", x, c(float(1 / np.sqrt(2)))))
    if tensor(e.type_of(t)).dtype != dt:  # SciPy's erf widens float16
        t = e.op("cast", t, dtype=dt)
    return e.op("multiply", e.op("multiply", c(0.5), x), e.op("add", c(1.0), t))


register_op(OpDef(
    name="gelu", id=44, arity=1, infer=_gelu_infer,
    attrs={"approximate": Attr(_attr_approximate, "none", doc="'none' (x * Phi(x), through erf) or 'tanh'")},
    kernel=gelu, elementwise=True, inplace=(0,), family=FAMILY, grad=_gelu_grad, decompose=_gelu_parts,
    doc="gelu(x, approximate): x * Phi(x), or torch's tanh approximation; float32 by a NumPy kernel (at most "
        "5 ulp for x >= -1, absolute error 1e-7 * |x| below, as the erf formula), float64 by SciPy's ndtr",
))


# ---------------------------------------------------------------- silu, hard_sigmoid, hard_swish
# Activations that models export as two or three elementwise ops (x * sigmoid(x); x * clip(x / 6 + 1/2, 0, 1)):
# one op runs them in one sweep (per cache-sized block on the NumPy engine), one pass over memory instead of two
# or three (the ``silu`` and ``hard_swish`` rules of opgraph.passes.rules, the ONNX importer's HardSwish and
# HardSigmoid).
def _float_infer(name: str) -> Callable[[tuple[ValueType, ...], dict[str, Any]], tuple[TensorType, ...]]:
    def infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
        (t,) = (tensor(x) for x in in_types)
        if t.dtype.kind != "f":
            from opgraph.errors import OpTypeError

            raise OpTypeError(f"{name} needs a floating-point input, got {t.dtype}")
        return (t,)

    return infer


def silu_passes(x: np.ndarray, o: np.ndarray, s: np.ndarray, r: np.ndarray) -> None:
    """silu of float32 ``x`` into ``o`` (which may be ``x``), ``s`` and ``r`` temporaries of its shape.

    >>> _float32_example(silu_passes, [-1.0, 0.0, 2.0])
    array([-0.2689414,  0.       ,  1.7615943], dtype=float32)
    """
    # sigmoid into r (sigmoid_passes may write its output into its own scratch r), then x * r: o is written
    # last, so o may be x
    sigmoid_passes(x, r, s, r)
    np.multiply(x, r, out=o)


def _silu_exact(x: np.ndarray) -> np.ndarray:
    # x * sigmoid(x) with sigmoid = e / (1 + e) or 1 / (1 + e), e = exp(-|x|): no overflow for any x
    e = np.exp(-np.abs(x))
    return np.asarray(x * (np.where(x >= 0, np.ones((), x.dtype), e) / (1 + e)), dtype=x.dtype)


def silu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """SiLU (swish): x * sigmoid(x), torch's ``silu``.

    float32 runs NumPy passes (:func:`silu_passes`), the sigmoid of the ``sigmoid`` kernel and the product:
    at most 5 ulp from x * sigmoid(x) rounded to
    float32 for x >= -87, absolute error below 3e-43 below (where sigmoid(x) is subnormal; torch's float32
    formula gives -0.0 there), measured; -inf gives nan as torch's x / (1 + exp(-x)) does. float16 computes
    in float32; float64 evaluates x * sigmoid(x) with exp(-|x|), which never overflows.

    >>> import numpy as np
    >>> silu(np.array([-1.0, 0.0, 2.0], np.float32))
    array([-0.2689414,  0.       ,  1.7615943], dtype=float32)
    """
    x = np.asarray(x)
    if x.dtype in (np.float16, np.float32):
        if x.dtype == np.float16:
            return write_out(_whole_f32(silu_passes, x, None).astype(np.float16), out)
        return _whole_f32(silu_passes, x, out)
    return write_out(_silu_exact(x), out)  # type: ignore[no-any-return]


def _silu_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # d/dx x s(x) = s + x s (1 - s)
    (x,), (g,) = ins, cots
    s = b.op("sigmoid", x)
    if s.type.dtype != x.type.dtype:  # SciPy's expit widens float16
        s = b.op("cast", s, dtype=x.type.dtype)
    return [_m(b, g, b.op("add", s, _m(b, x, s, b.op("subtract", _c(b, 1.0, s), s))))]


def _silu_parts(e: Emit, ins: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    (x,) = ins
    s = e.op("sigmoid", x)
    dt = tensor(e.type_of(x)).dtype
    if tensor(e.type_of(s)).dtype != dt:  # SciPy's expit widens float16
        s = e.op("cast", s, dtype=dt)
    return e.op("multiply", x, s)


register_op(OpDef(
    name="silu", id=45, arity=1, infer=_float_infer("silu"), kernel=silu, elementwise=True,
    inplace=(0,), family=FAMILY, grad=_silu_grad, decompose=_silu_parts,
    doc="silu(x): x * sigmoid(x) (swish); float32 by a NumPy kernel, sigmoid and product per cache-sized block "
        "(at most 5 ulp for x >= -87, measured), float64 exactly as x * sigmoid(x)",
))


# The clip ufunc itself: np.clip's Python wrapper costs 1.5 us a call, a tenth of a pass over 32K elements.
_CLIP_UFUNC: Any = getattr(getattr(np, "_core", np), "umath", None)
_CLIP_UFUNC = getattr(_CLIP_UFUNC, "clip", None) or np.clip


def hard_passes(alpha: float, beta: float, swish: bool) -> Callable[..., None]:
    """The NumPy passes ``(x, o, s, r)`` of hard_swish (``swish``) or hard_sigmoid (slope ``alpha``, offset
    ``beta``) on float32 ``x`` into ``o`` (which may be ``x``); only in-place hard_swish uses ``r``.

    >>> _float32_example(hard_passes(1 / 6, 0.5, True), [-4.0, -1.0, 0.0, 1.0, 4.0])
    array([-0.        , -0.33333334,  0.        ,  0.6666667 ,  4.        ], dtype=float32)
    """
    a, c = np.float32(alpha), np.float32(beta)
    zero, one, three, six, sixth = (np.float32(v) for v in (0.0, 1.0, 3.0, 6.0, 1 / 6))

    def passes(x: np.ndarray, o: np.ndarray, s: np.ndarray, r: np.ndarray) -> None:
        if swish:
            # torch's x * relu6(x + 3) / 6: x + 3 is exact near x = -3, where x / 6 + 1/2 would cancel
            t = r if np.may_share_memory(x, o) else o  # a temporary only in place (x is read last)
            np.add(x, three, out=t)
            _CLIP_UFUNC(t, zero, six, out=t)  # keeps a nan
            np.multiply(t, x, out=t)
            np.multiply(t, sixth, out=o)
            return
        np.multiply(x, a, out=o)  # reads x once: safe in place
        np.add(o, c, out=o)
        _CLIP_UFUNC(o, zero, one, out=o)

    return passes


def _hard(x: np.ndarray, out: np.ndarray | None, alpha: float, beta: float, swish: bool) -> np.ndarray:
    if x.dtype in (np.float16, np.float32):
        passes = hard_passes(alpha, beta, swish)
        if x.dtype == np.float16:
            return write_out(_whole_f32(passes, x, None).astype(np.float16), out)
        return _whole_f32(passes, x, out)
    if swish:
        y = x * np.clip(x + np.asarray(3, x.dtype), 0, 6) / np.asarray(6, x.dtype)
    else:
        y = np.clip(x * np.asarray(alpha, x.dtype) + np.asarray(beta, x.dtype), 0, 1)
    return write_out(np.asarray(y, dtype=x.dtype), out)  # type: ignore[no-any-return]


def hard_sigmoid(x: np.ndarray, out: np.ndarray | None = None, *, alpha: float = 0.2,
                 beta: float = 0.5) -> np.ndarray:
    """ONNX HardSigmoid: max(0, min(1, alpha * x + beta)) (torch's ``hardsigmoid`` is alpha=1/6, beta=1/2).

    float32 runs NumPy passes (:func:`hard_passes`); nan stays nan.

    >>> import numpy as np
    >>> hard_sigmoid(np.array([-4.0, 0.0, 1.0, 4.0], np.float32), alpha=1 / 6)
    array([0.       , 0.5      , 0.6666667, 1.       ], dtype=float32)
    """
    return _hard(np.asarray(x), out, alpha, beta, False)


def hard_swish(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """ONNX HardSwish: x * max(0, min(1, x / 6 + 1/2)), torch's ``hardswish`` x * relu6(x + 3) / 6.

    Computed as torch does, x * clip(x + 3, 0, 6) * (1/6): x + 3 is exact near -3, where x / 6 + 1/2 cancels,
    so the result is within 3 ulp everywhere (measured). float32 runs NumPy passes (:func:`hard_passes`); nan
    stays nan.

    >>> import numpy as np
    >>> hard_swish(np.array([-4.0, -1.0, 0.0, 1.0, 4.0], np.float32))
    array([-0.        , -0.33333334,  0.        ,  0.6666667 ,  4.        ], dtype=float32)
    """
    return _hard(np.asarray(x), out, 1 / 6, 0.5, True)


def _hard_sigmoid_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # alpha where the line is inside (0, 1), else 0 (torch's hardsigmoid_backward at alpha = 1/6)
    (x,), (g,) = ins, cots
    t = b.op("add", _m(b, x, _c(b, attrs["alpha"], x)), _c(b, attrs["beta"], x))
    inside = b.op("logical_and", b.op("greater", t, _c(b, 0.0, t)), b.op("less", t, _c(b, 1.0, t)))
    return [mask(b, inside, _m(b, g, _c(b, attrs["alpha"], g)))]


def _hard_swish_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # d/dx x t = t + x / 6 = x / 3 + 1/2 inside, 0 below, 1 above (torch's hardswish_backward)
    (x,), (g,) = ins, cots
    t = b.op("add", _m(b, x, _c(b, 1 / 6, x)), _c(b, 0.5, x))
    d = b.op("where", b.op("less_equal", t, _c(b, 0.0, t)), _c(b, 0.0, x),
             b.op("where", b.op("greater_equal", t, _c(b, 1.0, t)), _c(b, 1.0, x),
                  b.op("add", _m(b, x, _c(b, 1 / 3, x)), _c(b, 0.5, x))))
    return [_m(b, g, d)]


def _hard_sigmoid_parts(e: Emit, ins: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    (x,) = ins
    line = e.op("add", e.op("multiply", x, const_like(e, attrs["alpha"], x)), const_like(e, attrs["beta"], x))
    return e.op("clip", line, const_like(e, 0.0, x), const_like(e, 1.0, x))


def _hard_swish_parts(e: Emit, ins: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    (x,) = ins
    relu6 = e.op("clip", e.op("add", x, const_like(e, 3.0, x)), const_like(e, 0.0, x), const_like(e, 6.0, x))
    return e.op("multiply", e.op("multiply", relu6, x), const_like(e, 1 / 6, x))


register_op(OpDef(
    name="hard_sigmoid", id=46, arity=1, infer=_float_infer("hard_sigmoid"),
    attrs={"alpha": Attr(attr_float, 0.2, doc="slope"), "beta": Attr(attr_float, 0.5, doc="offset")},
    kernel=hard_sigmoid, elementwise=True, inplace=(0,), family=FAMILY, grad=_hard_sigmoid_grad,
    decompose=_hard_sigmoid_parts,
    doc="hard_sigmoid(x, alpha=0.2, beta=0.5): max(0, min(1, alpha * x + beta)) (ONNX HardSigmoid); float32 by "
        "a blocked NumPy kernel",
))
register_op(OpDef(
    name="hard_swish", id=47, arity=1, infer=_float_infer("hard_swish"), kernel=hard_swish,
    elementwise=True, inplace=(0,), family=FAMILY, grad=_hard_swish_grad, decompose=_hard_swish_parts,
    doc="hard_swish(x): x * max(0, min(1, x / 6 + 1/2)) (ONNX HardSwish, torch's hardswish); float32 by a "
        "blocked NumPy kernel (one compiled loop with numba)",
))


# ---------------------------------------------------------------- traits
COMPUTE_BOUND: frozenset[str] = mark_traits(
    "compute_bound", "exp", "expm1", "exp2", "log", "log1p", "log2", "log10", "sqrt", "cbrt", "sin", "cos", "tan",
    "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sigmoid", "erf", "erfc", "divide",
    "floor_divide", "remainder", "fmod", "power", "atan2", "hypot", "logaddexp", "reciprocal")
"""Kinds whose NumPy loops compute for longer than they move memory (transcendental functions, division): in
float64 fusing them gains nothing (measured: 0.98-1.03x), see :class:`opgraph.passes.pipeline.FusionCost`."""


mark_traits("linear_time", *family_kinds(FAMILY))
mark_traits("no_fuse", "where", "clip", "real", "imag")
mark_traits(
    "promotes",
    "abs", "acos", "acosh", "add", "asin", "asinh", "atan", "atanh", "bitwise_and", "bitwise_invert",
    "bitwise_or", "bitwise_xor", "ceil", "clip", "cos", "cosh", "divide", "erf", "erfc", "exp", "exp2", "expm1",
    "floor", "floor_divide", "fmod", "hypot", "log", "log10", "log1p", "log2", "logaddexp", "maximum",
    "minimum", "multiply", "negative", "positive", "power", "reciprocal", "remainder", "round", "sigmoid",
    "sign", "sin", "sinh", "sqrt", "square", "subtract", "tan", "tanh", "trunc")
mark_traits("truth_valued", "logical_and", "logical_not", "logical_or", "logical_xor")
mark_traits("comparison", "equal", "greater", "greater_equal", "less", "less_equal", "not_equal")


# ---------------------------------------------------------------- tangent rules (the rest transpose their gradients)
# real and imag are real-linear: the op on the tangent. Their gradient rules give a complex input no cotangent,
# so the transposed rules would drop the tangent of a complex input (rfft(x) -> real: zero).
set_rules("jvp", {
    "real": lambda b, ins, outs, tans, attrs: [b.op("real", tans[0]) if ins[0].type.dtype.kind == "c" else tans[0]],
    "imag": lambda b, ins, outs, tans, attrs: [b.op("imag", tans[0]) if ins[0].type.dtype.kind == "c" else None],
})


# ---------------------------------------------------------------- batching rules (vmap)
def _batched_like(kind: str) -> Callable[..., list[Any]]:
    """The batching rule of an n-ary broadcasting kind: the same op on operands lined up by
    :func:`~opgraph.ops.batch_helpers.same_rank` (the batch axis in front of the examples' broadcast axes)."""

    def rule(b: Any, ins: Sequence[Any], batched: Sequence[bool], size: int, attrs: Mapping[str, Any]) -> list[Any]:
        return [b.op(kind, *same_rank(b, ins, batched), **attrs)]

    rule.__name__ = f"_batch_{kind}"
    return rule


set_rules("batch", {kind: _batched_like(kind) for kind in family_kinds(FAMILY)})
