"""The torch engine's rules and limits for the elementwise ops (:mod:`opgraph.ops.elementwise`).

A kind computed by a NumPy ufunc runs on its loop's dtypes (:func:`~opgraph.backends.torch.dtypes.loop_dtypes`);
complex order, sign and add follow NumPy's loops where torch's differ.

    >>> import numpy as np
    >>> from opgraph.backends.base import OpInfo
    >>> from opgraph.core.types import TensorType
    >>> t = TensorType("int8", (2,))
    >>> BACKEND.rules["sqrt"](OpInfo("sqrt", {}, (t,), (TensorType("float16", (2,)),)))(torch.tensor([4, 9],
    ...     dtype=torch.int8))
    tensor([2., 3.], dtype=torch.float16)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from opgraph.backends.base import Limit, OpInfo, RuleFactory
from opgraph.backends.torch import BACKEND
from opgraph.backends.torch.dtypes import (
    U64,
    WIDE,
    Fn,
    by_keys,
    calc_dtype,
    dtype_kind,
    key,
    loop_dtypes,
    td,
    unkey,
    with_casts,
    work_dtype,
)
from opgraph.core.types import TensorType


def _csign(z: torch.Tensor) -> torch.Tensor:
    """NumPy's complex sign z / |z|, with its rules for infinite and NaN parts."""
    re, im = z.real, z.imag
    mag = torch.hypot(re, im)
    zero, one = torch.zeros_like(re), torch.ones_like(re)
    nan = torch.full_like(re, float("nan"))
    finite = torch.isfinite(mag) & (mag != 0)
    out_re = torch.where(finite, re / torch.where(finite, mag, one), zero)
    out_im = torch.where(finite, im / torch.where(finite, mag, one), zero)
    inf = torch.isinf(mag)
    re_inf, im_inf = torch.isinf(re), torch.isinf(im)
    out_re = torch.where(inf, torch.where(re_inf & im_inf, nan, torch.where(re_inf, torch.copysign(one, re), zero)),
                         out_re)
    out_im = torch.where(inf, torch.where(re_inf & im_inf, nan, torch.where(re_inf, zero, torch.copysign(one, im))),
                         out_im)
    out_re = torch.where(torch.isnan(mag), nan, out_re)
    out_im = torch.where(torch.isnan(mag), nan, out_im)
    return torch.complex(out_re, out_im)


def _sign(dt: np.dtype) -> Fn:
    if dt.kind == "c":
        return _csign
    if dt.kind == "f":
        return lambda x: torch.where(torch.isnan(x), x, torch.sign(x))
    return torch.sign


def _round(x: torch.Tensor) -> torch.Tensor:
    if x.is_complex():
        return torch.complex(torch.round(x.real), torch.round(x.imag))
    if x.is_floating_point():
        return torch.round(x)
    return x.clone()


def _cbrt(x: torch.Tensor) -> torch.Tensor:
    return torch.copysign(torch.abs(x).pow(1.0 / 3.0), x)


def _int_safe(op: Fn) -> Callable[[np.dtype], Fn]:
    """An integer division-like op that gives NumPy's 0 (instead of raising) where the divisor is 0."""

    def make(dt: np.dtype) -> Fn:
        if dt.kind not in "iu":
            return op

        def run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            zero = b == 0
            q = op(a, torch.where(zero, torch.ones_like(b), b))
            return torch.where(zero, torch.zeros_like(q), q)

        return run

    return make


def _pow2(k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """2**k (0 <= k < the dtype's largest exponent) exactly, built from its bits: ``torch.ldexp`` multiplies by a
    power of two that is itself computed, and overflows before the product would."""
    fi = torch.finfo(dtype)
    nmant = round(-math.log2(fi.eps))
    bias = round(math.log2(fi.max)) - 1
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[fi.bits // 8]
    return ((k.to(ints) + bias) << nmant).view(dtype)


def _fmod(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C's (NumPy's) exact ``fmod`` for floats, also where the quotient a / b overflows.

    torch's vectorised CPU kernel computes fmod exactly wherever ``a / b`` is finite and gives NaN where it
    overflows (``fmod(1.797e308, 0.5)``, ``fmod(1, 5e-324)``). fmod(a, b) = fmod(fmod(a, c), b) for any
    c = b * 2**k (a multiple of b, exact in binary), so ``a`` is first reduced twice by such a c, k chosen to keep
    each quotient below 2**(maxexp - 1): two steps close the widest exponent gap (subnormal b, largest a), and
    where the gap is small k is 0 and the steps change nothing (fmod(r, b) = r for |r| < |b|). Zeros keep the
    sign of ``a``; NaN and infinite operands flow through as C gives them (fmod(a, +-inf) = a).
    """
    fi = torch.finfo(a.dtype)
    step = round(math.log2(fi.max)) - 2
    _, eb = torch.frexp(b)
    for _ in range(2):
        _, ea = torch.frexp(a)
        k = torch.clamp(ea.to(torch.int64) - eb.to(torch.int64) - step, min=0, max=2 * step)
        half = k // 2
        c = b * _pow2(half, a.dtype) * _pow2(k - half, a.dtype)
        a = torch.fmod(a, c)
    return torch.fmod(a, b)


def _remainder(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """NumPy's float ``remainder`` (``npy_divmod``): the exact fmod, moved by b where its sign differs from b's;
    a zero takes b's sign."""
    mod = _fmod(a, b)
    res = torch.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)
    return torch.where(mod == 0, torch.copysign(torch.zeros_like(mod), b), res)


def _float_exact(fn: Fn, int_op: Fn) -> Callable[[np.dtype], Fn]:
    """``fn`` on float loops, torch's ``int_op`` with NumPy's 0 for a 0 divisor (:func:`_int_safe`) elsewhere."""
    ints = _int_safe(int_op)
    return lambda dt: fn if dt.kind == "f" else ints(dt)


def _same(fn: Fn) -> Callable[[np.dtype], Fn]:
    return lambda dt: fn


def _not_bool(fn: Fn) -> Callable[[np.dtype], Fn]:
    """``fn``, except on NumPy's bool loop, where the op is the identity (torch has no bool kernel)."""
    return lambda dt: (lambda x: x.clone()) if dt.kind == "b" else fn


def c_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """NumPy's complex ``a + b``, part by part (torch's complex add scales b by alpha = 1 + 0j, which turns an
    infinite part into NaN).

    >>> c_add(torch.tensor([complex(1, float("inf"))]), torch.tensor([1 + 1j]))
    tensor([2.+infj])
    """
    return torch.complex(a.real + b.real, a.imag + b.imag)


def _c_sub(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.complex(a.real - b.real, a.imag - b.imag)


def _real_or(real: Fn, cplx: Fn) -> Callable[[np.dtype], Fn]:
    """``real``, or ``cplx`` on NumPy's complex loops."""
    return lambda dt: cplx if dt.kind == "c" else real


# NumPy orders complex values lexicographically (real part first); these are its loops' macros (CGE, CLT, ...),
# whose NaN rules the ufuncs keep: a NaN in either part of one operand fails the real-part test.
def _cnan(z: torch.Tensor) -> torch.Tensor:
    return torch.isnan(z.real) | torch.isnan(z.imag)


def _c_order(real_cmp: Fn, eq_cmp: Fn) -> Fn:
    def cmp(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        both = ~torch.isnan(x.imag) & ~torch.isnan(y.imag)
        return (real_cmp(x.real, y.real) & both) | ((x.real == y.real) & eq_cmp(x.imag, y.imag))

    return cmp


_CLT, _CLE = _c_order(torch.lt, torch.lt), _c_order(torch.lt, torch.le)
_CGT, _CGE = _c_order(torch.gt, torch.gt), _c_order(torch.gt, torch.ge)


def _c_pick(keep_first: Fn, nan_of: int) -> Fn:
    """maximum/minimum (``nan_of`` 0: a NaN first operand wins) and fmax/fmin (1: a NaN second operand loses)."""

    def pick(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.where(_cnan(x if nan_of == 0 else y) | keep_first(x, y), x, y)

    return pick


_UNARY: dict[str, Callable[[np.dtype], Fn]] = {
    "negative": _same(torch.neg), "positive": _same(torch.positive), "abs": _not_bool(torch.abs), "sign": _sign,
    "exp": _same(torch.exp), "expm1": _same(torch.expm1), "log": _same(torch.log), "log1p": _same(torch.log1p),
    "log2": _same(torch.log2), "log10": _same(torch.log10), "sqrt": _same(torch.sqrt),
    "square": _same(torch.square), "reciprocal": _same(torch.reciprocal), "sin": _same(torch.sin),
    "cos": _same(torch.cos), "tan": _same(torch.tan), "asin": _same(torch.asin), "acos": _same(torch.acos),
    "atan": _same(torch.atan), "sinh": _same(torch.sinh), "cosh": _same(torch.cosh), "tanh": _same(torch.tanh),
    "asinh": _same(torch.asinh), "acosh": _same(torch.acosh), "atanh": _same(torch.atanh),
    "floor": _not_bool(torch.floor), "ceil": _not_bool(torch.ceil), "trunc": _not_bool(torch.trunc),
    "sigmoid": _same(torch.sigmoid), "erf": _same(torch.special.erf), "erfc": _same(torch.special.erfc),
    "isnan": _same(torch.isnan), "isinf": _same(torch.isinf), "isfinite": _same(torch.isfinite),
    "logical_not": _same(torch.logical_not), "bitwise_invert": _same(torch.bitwise_not),
    "conj": _same(torch.conj_physical), "signbit": _same(torch.signbit), "exp2": _same(torch.exp2),
    "cbrt": _same(_cbrt),
}
_BINARY: dict[str, Callable[[np.dtype], Fn]] = {
    "add": _real_or(torch.add, c_add), "subtract": _real_or(torch.sub, _c_sub), "multiply": _same(torch.mul),
    "divide": _same(torch.div), "floor_divide": _int_safe(torch.floor_divide),
    "remainder": _float_exact(_remainder, torch.remainder), "power": _same(torch.pow),
    "maximum": _real_or(torch.maximum, _c_pick(_CGE, 0)),
    "minimum": _real_or(torch.minimum, _c_pick(_CLE, 0)), "atan2": _same(torch.atan2), "hypot": _same(torch.hypot),
    "logaddexp": _same(torch.logaddexp), "copysign": _same(torch.copysign), "nextafter": _same(torch.nextafter),
    "equal": _same(torch.eq), "not_equal": _same(torch.ne), "less": _real_or(torch.lt, _CLT),
    "less_equal": _real_or(torch.le, _CLE), "greater": _real_or(torch.gt, _CGT),
    "greater_equal": _real_or(torch.ge, _CGE), "logical_and": _same(torch.logical_and),
    "logical_or": _same(torch.logical_or), "logical_xor": _same(torch.logical_xor),
    "bitwise_and": _same(torch.bitwise_and), "bitwise_or": _same(torch.bitwise_or),
    "bitwise_xor": _same(torch.bitwise_xor), "bitwise_left_shift": _same(torch.bitwise_left_shift),
    "bitwise_right_shift": _same(torch.bitwise_right_shift), "fmax": _real_or(torch.fmax, _c_pick(_CGE, 1)),
    "fmin": _real_or(torch.fmin, _c_pick(_CLE, 1)),
    "fmod": _float_exact(_fmod, torch.fmod),
}


_UFUNCS: dict[str, Any] = {}


def _ufunc_of(kind: str) -> np.ufunc:
    """The NumPy (or SciPy) ufunc of elementwise kind ``kind``, whose loops give the dtypes to compute in."""
    if not _UFUNCS:
        from opgraph.ops.elementwise import BINARY, UNARY

        _UFUNCS.update((name, uf) for name, _id, uf, *_ in (*UNARY, *BINARY))
    uf = _UFUNCS[kind]
    return uf.get() if hasattr(uf, "get") else uf  # type: ignore[no-any-return]


_ORDER_UFUNCS = frozenset({"maximum", "minimum", "fmax", "fmin", "less", "less_equal", "greater", "greater_equal"})
_COMPARISONS = {"equal": torch.eq, "not_equal": torch.ne, "less": torch.lt, "less_equal": torch.le,
                "greater": torch.gt, "greater_equal": torch.ge}


def _mixed_comparison(kind: str, unsigned_first: bool) -> Fn:
    """NumPy's exact comparison of uint64 with int64: a negative int64 is below every uint64, the rest compare on
    int64 keys."""
    cmp = _COMPARISONS[kind]
    below = bool(cmp(torch.tensor(1), torch.tensor(0)) if unsigned_first else cmp(torch.tensor(0), torch.tensor(1)))

    def compare(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        signed = b if unsigned_first else a
        res = cmp(key(a), key(b))  # right wherever the int64 operand is >= 0
        return torch.where(signed < 0, below, res)

    return compare


def _ufunc_rule(make: Callable[[np.dtype], Fn]) -> RuleFactory:
    """The rule of an elementwise kind computed by a NumPy loop: ``make(loop dtype)`` on the inputs cast to the
    loop's dtypes (uint64 ordered on int64 keys)."""

    def factory(info: OpInfo) -> Fn:
        kind = info.kind
        loop = loop_dtypes(_ufunc_of(kind), info.in_dtypes)
        if kind in _COMPARISONS and set(loop) == {U64, np.dtype(np.int64)}:
            return _mixed_comparison(kind, loop[0] == U64)
        if kind in _ORDER_UFUNCS and loop[0] == U64:
            # uint64 (NumPy promotes the other operand to it): ordered on int64 keys, every input keyed
            fn = make(np.dtype(np.int64))
            values = kind in ("maximum", "minimum", "fmax", "fmin")
            return lambda *xs: (unkey if values else (lambda r: r))(fn(*(key(x) for x in xs)))
        loop = tuple(calc_dtype(d) for d in loop)
        return with_casts(make(loop[0]), info.in_dtypes, loop)

    return factory


BACKEND.rules_from({**_UNARY, **_BINARY}, _ufunc_rule)


@BACKEND.rule("round")
def _round_rule(info: OpInfo) -> Fn:
    return _round


@BACKEND.rule("real")
def _real_rule(info: OpInfo) -> Fn:
    return torch.real if dtype_kind(info.in_dtypes[0]) == "c" else (lambda x: x)


@BACKEND.rule("imag")
def _imag_rule(info: OpInfo) -> Fn:
    return torch.imag if dtype_kind(info.in_dtypes[0]) == "c" else torch.zeros_like


@BACKEND.rule("where")
def _where_rule(info: OpInfo) -> Fn:
    out = info.out_dtype
    return with_casts(torch.where, info.in_dtypes, (np.dtype(bool), out, out))


@BACKEND.rule("cast")
def _cast_rule(info: OpInfo) -> Fn:
    src, dst = np.dtype(info.in_dtypes[0]), info.out_dtype
    t = td(dst)
    if src.kind == "c" and dst.kind != "c":  # NumPy drops the imaginary part (bool: either part nonzero)
        return (lambda x: x != 0) if dst.kind == "b" else (lambda x: x.real.to(t))
    # Floats to integers truncate toward zero in both; values out of range are undefined in both.
    return lambda x: x.to(t)


def _lex_gt(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return (p.real > q.real) | ((p.real == q.real) & (p.imag > q.imag))


def _lex_lt(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return (p.real < q.real) | ((p.real == q.real) & (p.imag < q.imag))


@BACKEND.rule("clip")
def _clip_rule(info: OpInfo) -> Fn:
    out = info.out_dtype
    if out == U64:  # every input promotes to uint64: clip on int64 keys
        return by_keys(_clip_rule, OpInfo(info.kind, info.attrs, (TensorType(U64, None),) * 3, info.out_types),
                       True)

    def clip(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        return torch.minimum(torch.maximum(x, lo), hi)  # NumPy's definition (lo > hi gives hi; NaN propagates)

    def clip_complex(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        # NumPy's complex clip: a NaN x stays, NaN bounds lose, the order is lexicographic.
        x = torch.where(_cnan(x) | _lex_gt(x, lo), x, lo)
        return torch.where(_cnan(x) | _lex_lt(x, hi), x, hi)

    calc = calc_dtype(out)
    return with_casts(clip_complex if out.kind == "c" else clip, info.in_dtypes, (calc, calc, calc))


# ---------------------------------------------------------------- activations
# One torch kernel each (one pass over memory, as torch eager runs them), not the decomposition into three to
# six elementwise ops that lowering would run; float16 is computed in float32 and rounded once, as the NumPy
# kernels do. The formulas are the ones the op docs quote as torch's (gelu's erf and tanh forms, x * sigmoid(x),
# x * relu6(x + 3) / 6), within the tolerance the op suite allows of the NumPy kernels.
def _in_work(fn: Fn, dt: np.dtype) -> Fn:
    """``fn`` computed in :func:`~opgraph.backends.torch.dtypes.work_dtype` of ``dt``, the result in ``dt``."""
    work, t = td(work_dtype(dt)), td(dt)
    if work == t:
        return fn
    return lambda x: fn(x.to(work)).to(t)


@BACKEND.rule("gelu")
def _gelu_rule(info: OpInfo) -> Fn:
    """torch's gelu (erf form or ``approximate="tanh"``).

    >>> t = TensorType("float16", (2,))
    >>> BACKEND.rules["gelu"](OpInfo("gelu", {"approximate": "none"}, (t,), (t,)))(torch.tensor([-1.0, 2.0],
    ...     dtype=torch.float16))
    tensor([-0.1587,  1.9541], dtype=torch.float16)
    """
    approximate = str(info.attrs["approximate"])
    return _in_work(lambda x: F.gelu(x, approximate=approximate), info.out_dtype)


@BACKEND.rule("silu")
def _silu_rule(info: OpInfo) -> Fn:
    return _in_work(F.silu, info.out_dtype)


@BACKEND.rule("hard_swish")
def _hard_swish_rule(info: OpInfo) -> Fn:
    return _in_work(F.hardswish, info.out_dtype)


@BACKEND.rule("hard_sigmoid")
def _hard_sigmoid_rule(info: OpInfo) -> Fn:
    """ONNX's clip(alpha * x + beta, 0, 1): the line then the clip in place on its own result (two passes)."""
    work = work_dtype(info.out_dtype)
    alpha, beta = (float(np.asarray(info.attrs[k], work)) for k in ("alpha", "beta"))
    return _in_work(lambda x: torch.mul(x, alpha).add_(beta).clamp_(0.0, 1.0), info.out_dtype)


# ================================================================ limits
_MODULAR = frozenset({
    "add", "subtract", "multiply", "negative", "positive", "square", "bitwise_and", "bitwise_or", "bitwise_xor",
    "bitwise_invert", "bitwise_left_shift", "equal", "not_equal", "logical_and", "logical_or", "logical_xor",
    "logical_not", "isnan", "isinf", "isfinite", "floor", "ceil", "trunc",
})
"""Elementwise kinds whose uint64 loop is exact on int64 bits (arithmetic modulo 2**64, bits, equality)."""
_UFUNC_KINDS = frozenset({*_UNARY, *_BINARY})


def uint64_limit(info: OpInfo) -> str | None:
    """Why torch cannot run an op whose NumPy loop is uint64 (None: it can).

    uint64 is computed on int64 bits (or, to order it, on int64 keys): division, right shifts and the like are
    not exact there (uint16 and uint32 are computed by value in int64, which is exact). Only kinds computed by
    a NumPy loop can fail it; the torch package registers it for every kind without a limit of its own, and
    the elementwise kinds' own limits check it first.

    >>> u = TensorType("uint64", (2,))
    >>> uint64_limit(OpInfo("floor_divide", {}, (u, u), (u,)))
    'NumPy computes floor_divide in uint64, which torch cannot (only add, multiply, bits, comparisons)'
    >>> uint64_limit(OpInfo("add", {}, (u, u), (u,))) is None
    True
    """
    if any(d in WIDE for d in (*info.in_dtypes, *(t.dtype for t in info.out_types))):  # type: ignore[union-attr]
        if info.kind in _UFUNC_KINDS:
            loop = loop_dtypes(_ufunc_of(info.kind), info.in_dtypes)
            if U64 in loop and info.kind not in _MODULAR | _ORDER_UFUNCS:
                return (f"NumPy computes {info.kind} in uint64, which torch cannot (only add, multiply, bits, "
                        "comparisons)")
    return None


def _no_complex_loop(why: str) -> Limit:
    def limit(info: OpInfo) -> str | None:
        wide = uint64_limit(info)
        if wide is not None:
            return wide
        loop = loop_dtypes(_ufunc_of(info.kind), info.in_dtypes)
        return why if any(dtype_kind(d) == "c" for d in loop) else None

    return limit


BACKEND.limit("erf")(_no_complex_loop("torch has no complex erf"))
BACKEND.limit("erfc")(_no_complex_loop("torch has no complex erfc"))
BACKEND.limit("power")(_no_complex_loop("NumPy's complex power multiplies out integer exponents "
                                        "(torch: exp(b log a)), which differ at infinities and NaN"))


@BACKEND.limit("reciprocal")
def _reciprocal_limit(info: OpInfo) -> str | None:
    wide = uint64_limit(info)
    if wide is not None:
        return wide
    if dtype_kind(info.in_dtypes[0]) in "biu":
        return "NumPy's integer reciprocal of 0 depends on the platform"
    return None
