"""The torch backend: a graph as one straight-line function of PyTorch calls, optionally ``torch.compile``-d.

Every op kind the backend claims has a *rule* in :data:`RULES`: called once
per op at compile time with the op's static facts (:class:`OpInfo`), it
returns the function computing that op on ``torch.Tensor`` values with
NumPy's semantics and result dtype (inputs are first cast to the dtypes NumPy's
loop computes in, reductions are given NumPy's accumulator dtype, and so on).
:func:`~opgraph.backends.base.straight_line` turns the graph into one Python
function of those calls; with ``compile=True`` (or a ``mode``) it is wrapped
in ``torch.compile(fn, mode=mode, dynamic=False)``.

Where torch's result dtype would still differ from the declared one, the
first call of each input-shape signature runs a checking variant that casts
such results and records their ops; the function is then generated again
with casts on exactly those ops, so later calls do no checks.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("int8", (3,)), name="x")
    >>> b.output(b.op("sum", x), b.op("sqrt", x))  # NumPy's dtypes: int64 and float16
    >>> f = opgraph.compile(b.freeze(), backend="torch")
    >>> f(x=np.array([100, 100, 100], np.int8))
    [array(300), array([10., 10., 10.], dtype=float16)]

The backend on its own: an executable takes and returns ``torch.Tensor`` values.

    >>> from opgraph import backends
    >>> tb = backends.get("torch")
    >>> exe = tb.compile_graph(b.freeze())
    >>> [tb.to_numpy(y) for y in exe([tb.from_numpy(np.array([1, 4, 9], np.int8))])]
    [array(14), array([1., 2., 3.], dtype=float16)]
    >>> tb.supports("matmul"), tb.supports("Vplus")
    (True, False)

Control flow runs as Python: ``cond`` an ``if`` on the predicate, ``while_loop`` a ``while``, ``scan`` a
``for`` writing into preallocated stacked tensors, over each body's generated function (the same rule table,
:func:`~opgraph.backends.base.body_program`); under ``torch.compile`` these ops run eagerly between the
compiled pieces (see docs/backends.md for why not ``torch.cond`` and friends).

torch has little arithmetic on uint16, uint32 and uint64: rules compute
them in int64 (by value for uint16 and uint32; uint64 as its bits, which is
exact modulo 2**64, and ordered through keys with the sign bit flipped).

Not claimed (see :data:`LIMITS`): the TensCalc kinds; uint64 division,
right shifts, powers and the other elementwise kinds that are not exact on
its bits; integer ``reciprocal`` (NumPy's value at 0 depends on the
platform); complex ``erf``, ``erfc`` and ``power``; ``eigh`` and ``svd``
(the signs of eigenvectors and singular vectors depend on the LAPACK build).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from opgraph.backends.base import (
    Backend,
    BackendError,
    Executable,
    Limit,
    OpInfo,
    RuleFactory,
    body_program,
    has_dtype,
    input_dtypes,
    straight_line,
)
from opgraph.core.feeds import coerce_feed
from opgraph.core.graph import Graph
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import ExecutionError

Fn = Callable[..., Any]

_NP_TO_TORCH: dict[np.dtype, torch.dtype] = {
    np.dtype(np.bool_): torch.bool, np.dtype(np.int8): torch.int8, np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64, np.dtype(np.uint8): torch.uint8,
    np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
    np.dtype(np.complex64): torch.complex64, np.dtype(np.complex128): torch.complex128,
    np.dtype(np.uint16): torch.uint16, np.dtype(np.uint32): torch.uint32, np.dtype(np.uint64): torch.uint64,
}
DTYPES: frozenset[str] = frozenset(d.name for d in _NP_TO_TORCH)
"""The dtypes the torch backend runs. torch stores uint16, uint32 and uint64 but has little arithmetic on them:
rules compute such values in int64 (exact for uint16 and uint32; for uint64 only where arithmetic modulo 2**64
is, see :data:`LIMITS`) or move their bits as the signed type of the same width."""
_WIDE = frozenset({np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.uint64)})
_SIGNED_BITS = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def _td(dt: Any) -> torch.dtype:
    """The torch dtype of a NumPy dtype (or name)."""
    return _NP_TO_TORCH[np.dtype(dt)]


def _kind(dt: Any) -> str:
    return np.dtype(dt).kind


def _calc(dt: Any) -> np.dtype:
    """The dtype a value of ``dt`` is computed in: int64 for the wide unsigned dtypes (by value for uint16 and
    uint32; uint64's bits, so only arithmetic modulo 2**64 is exact), else ``dt`` itself."""
    dt = np.dtype(dt)
    return np.dtype(np.int64) if dt in _WIDE else dt


_U64 = np.dtype(np.uint64)
_SIGN_BIT = -(2**63)


def _key(x: torch.Tensor) -> torch.Tensor:
    """uint64 (or narrower unsigned) values as int64 keys of the same order: the bits with the sign bit flipped."""
    return x.to(torch.int64) ^ _SIGN_BIT


def _unkey(y: torch.Tensor) -> torch.Tensor:
    return (y ^ _SIGN_BIT).to(torch.uint64)


def _by_keys(factory: RuleFactory, info: OpInfo, values_out: bool) -> Fn:
    """The rule of an op that only orders (compares, selects) its uint64 inputs, run on their int64 keys;
    ``values_out``: the outputs are selected values (turned back into uint64), else indices or bools."""
    proxy = OpInfo(info.kind, info.attrs, tuple(TensorType(np.int64 if t.dtype == _U64 else t.dtype, t.shape)
                                                for t in info.in_types),  # type: ignore[union-attr]
                   tuple(TensorType(np.int64 if t.dtype == _U64 else t.dtype, t.shape)
                         for t in info.out_types), info.op, info.version)  # type: ignore[union-attr]
    fn = factory(proxy)
    keyed = [t.dtype == _U64 for t in info.in_types]  # type: ignore[union-attr]

    def run(*xs: torch.Tensor) -> Any:
        res = fn(*(_key(x) if k else x for x, k in zip(xs, keyed, strict=True)))
        if not values_out:
            return res
        if isinstance(res, tuple):
            return tuple(_unkey(r) if t.dtype == _U64 else r for r, t in zip(res, info.out_types, strict=True))
        return _unkey(res)

    return run


def _bits(x: torch.Tensor) -> torch.Tensor:
    """A wide unsigned tensor's bits as the signed dtype of its width (for ops that only move elements)."""
    t = _SIGNED_BITS.get(x.dtype)
    return x if t is None else x.view(t)


def _unbits(y: torch.Tensor, t: torch.dtype) -> torch.Tensor:
    return y.view(t) if y.dtype != t and t in _SIGNED_BITS else y


def _cast_to(dt: Any) -> Fn:
    """A function casting a tensor to ``dt`` (a no-op when it already has it)."""
    t = _td(dt)

    def cast(x: torch.Tensor) -> torch.Tensor:
        return x if x.dtype == t else x.to(t)

    return cast


def _with_casts(fn: Fn, src: Sequence[np.dtype], dst: Sequence[np.dtype]) -> Fn:
    """``fn`` called on its inputs cast from dtypes ``src`` to ``dst`` (casts decided now, not per call)."""
    casts = [None if np.dtype(s) == np.dtype(d) else _td(d) for s, d in zip(src, dst, strict=True)]
    if not any(c is not None for c in casts):
        return fn
    if len(casts) == 1:
        (c,) = casts
        return lambda x: fn(x.to(c))
    if len(casts) == 2:
        ca, cb = casts
        if ca is None:
            return lambda a, b: fn(a, b.to(cb))
        if cb is None:
            return lambda a, b: fn(a.to(ca), b)
        return lambda a, b: fn(a.to(ca), b.to(cb))
    return lambda *xs: fn(*(x if c is None else x.to(c) for x, c in zip(xs, casts, strict=True)))


def _loop_dtypes(ufunc: np.ufunc, dtypes: Sequence[np.dtype]) -> tuple[np.dtype, ...]:
    """The input dtypes of the loop NumPy's ``ufunc`` runs for inputs of ``dtypes``."""
    return tuple(ufunc.resolve_dtypes(tuple(dtypes) + (None,) * ufunc.nout)[:ufunc.nin])


def _work(dt: Any) -> np.dtype:
    """float16 is computed in float32 and rounded once at the end, as the NumPy kernels do."""
    dt = np.dtype(dt)
    return np.dtype(np.float32) if dt == np.float16 else dt


def _fill_min(dt: Any) -> Any:
    dt = np.dtype(dt)
    if dt.kind == "f":
        return -float("inf")
    if dt.kind == "b":
        return False
    return int(np.iinfo(dt).min)


# ================================================================ limits
def _no_complex_loop(why: str) -> Limit:
    def limit(info: OpInfo) -> str | None:
        loop = _loop_dtypes(_ufunc_of(info.kind), info.in_dtypes)
        return why if any(_kind(d) == "c" for d in loop) else None

    return limit


def _no_int_reciprocal(info: OpInfo) -> str | None:
    if _kind(info.in_dtypes[0]) in "biu":
        return "NumPy's integer reciprocal of 0 depends on the platform"
    return None


# ================================================================ elementwise
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


def _same(fn: Fn) -> Callable[[np.dtype], Fn]:
    return lambda dt: fn


def _not_bool(fn: Fn) -> Callable[[np.dtype], Fn]:
    """``fn``, except on NumPy's bool loop, where the op is the identity (torch has no bool kernel)."""
    return lambda dt: (lambda x: x.clone()) if dt.kind == "b" else fn


def _c_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # Part by part: torch's complex add scales b by alpha = 1 + 0j, which turns an infinite part into NaN.
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
    "add": _real_or(torch.add, _c_add), "subtract": _real_or(torch.sub, _c_sub), "multiply": _same(torch.mul),
    "divide": _same(torch.div), "floor_divide": _int_safe(torch.floor_divide),
    "remainder": _int_safe(torch.remainder), "power": _same(torch.pow),
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
    "fmod": _int_safe(torch.fmod),
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
        res = cmp(_key(a), _key(b))  # right wherever the int64 operand is >= 0
        return torch.where(signed < 0, below, res)

    return compare


def _ufunc_rule(kind: str, make: Callable[[np.dtype], Fn]) -> RuleFactory:
    def factory(info: OpInfo) -> Fn:
        loop = _loop_dtypes(_ufunc_of(kind), info.in_dtypes)
        if kind in _COMPARISONS and set(loop) == {_U64, np.dtype(np.int64)}:
            return _mixed_comparison(kind, loop[0] == _U64)
        if kind in _ORDER_UFUNCS and loop[0] == _U64:
            # uint64 (NumPy promotes the other operand to it): ordered on int64 keys, every input keyed
            fn = make(np.dtype(np.int64))
            values = kind in ("maximum", "minimum", "fmax", "fmin")
            return lambda *xs: (_unkey if values else (lambda r: r))(fn(*(_key(x) for x in xs)))
        loop = tuple(_calc(d) for d in loop)
        return _with_casts(make(loop[0]), info.in_dtypes, loop)

    factory.__name__ = f"{kind}_rule"
    return factory


def _round_rule(info: OpInfo) -> Fn:
    return _round


def _real_rule(info: OpInfo) -> Fn:
    return torch.real if _kind(info.in_dtypes[0]) == "c" else (lambda x: x)


def _imag_rule(info: OpInfo) -> Fn:
    return torch.imag if _kind(info.in_dtypes[0]) == "c" else torch.zeros_like


def _where_rule(info: OpInfo) -> Fn:
    out = info.out_dtype
    return _with_casts(torch.where, info.in_dtypes, (np.dtype(bool), out, out))


def _cast_rule(info: OpInfo) -> Fn:
    src, dst = np.dtype(info.in_dtypes[0]), info.out_dtype
    t = _td(dst)
    if src.kind == "c" and dst.kind != "c":  # NumPy drops the imaginary part (bool: either part nonzero)
        return (lambda x: x != 0) if dst.kind == "b" else (lambda x: x.real.to(t))
    # Floats to integers truncate toward zero in both; values out of range are undefined in both.
    return lambda x: x.to(t)


def _lex_gt(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return (p.real > q.real) | ((p.real == q.real) & (p.imag > q.imag))


def _lex_lt(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return (p.real < q.real) | ((p.real == q.real) & (p.imag < q.imag))


def _clip_rule(info: OpInfo) -> Fn:
    out = info.out_dtype
    if out == _U64:  # every input promotes to uint64: clip on int64 keys
        return _by_keys(_clip_rule, OpInfo(info.kind, info.attrs, (TensorType(_U64, None),) * 3, info.out_types),
                        True)

    def clip(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        return torch.minimum(torch.maximum(x, lo), hi)  # NumPy's definition (lo > hi gives hi; NaN propagates)

    def clip_complex(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        # NumPy's complex clip: a NaN x stays, NaN bounds lose, the order is lexicographic.
        x = torch.where(_cnan(x) | _lex_gt(x, lo), x, lo)
        return torch.where(_cnan(x) | _lex_lt(x, hi), x, hi)

    calc = _calc(out)
    return _with_casts(clip_complex if out.kind == "c" else clip, info.in_dtypes, (calc, calc, calc))


# ================================================================ reductions
def _dims(axis: Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim)) if axis is None else tuple(a % ndim for a in axis)


def _reduction(kind: str) -> RuleFactory:
    def factory(info: OpInfo) -> Fn:
        axis, keep = info.attrs["axis"], info.attrs["keepdims"]
        src, out = np.dtype(info.in_dtypes[0]), info.out_dtype
        if src == _U64 and kind in ("max", "min"):
            return _by_keys(_reduction(kind), info, True)
        if (src in _WIDE or out in _WIDE) and kind in ("sum", "prod", "max", "min"):
            # computed in int64: by value (uint16, uint32), or modulo 2**64 for sums and products
            inner = _reduction(kind)(OpInfo(kind, info.attrs, (TensorType(np.int64, None),),
                                            (TensorType(_calc(out), None),)))
            return lambda x: inner(x.to(torch.int64))
        to_out = _cast_to(out)
        t_out = _td(out)
        if axis is not None and len(axis) == 0:  # no axis reduced: NumPy's identity (with the result dtype)
            if kind in ("any", "all"):
                return lambda x: x != 0
            if kind == "logsumexp":
                work = _td(_work(out))
                return lambda x: _lse(x.to(work), (), keep).to(t_out)
            if out.kind == "c" and kind in ("prod", "mean"):
                # NumPy multiplies by 1 (prod) or divides by the count 1 (mean): complex infinities become NaN.
                one = torch.ones((), dtype=t_out)
                return (lambda x: x.to(t_out) * one) if kind == "prod" else (lambda x: x.to(t_out) / one)
            return lambda x: x.clone() if x.dtype == t_out else x.to(t_out)
        if kind == "sum":
            work = _td(_work(out))
            if src == np.float16:
                return lambda x: torch.sum(x.to(work), _dims(axis, x.ndim), keepdim=keep).to(t_out)
            return lambda x: torch.sum(x, _dims(axis, x.ndim), keepdim=keep, dtype=t_out)
        if kind == "prod":
            def prod(x: torch.Tensor) -> torch.Tensor:
                if axis is None and not keep:
                    return torch.prod(x, dtype=t_out)
                for d in sorted(_dims(axis, x.ndim), reverse=True):
                    x = torch.prod(x, d, keepdim=keep, dtype=t_out)
                return to_out(x)

            return prod
        if kind in ("max", "min") and src.kind == "c":
            def lex(x: torch.Tensor) -> torch.Tensor:
                dims = _dims(axis, x.ndim)
                flat, idx = _lex_arg(x, dims, kind == "max")
                res = torch.gather(flat, -1, idx.unsqueeze(-1)).squeeze(-1)
                return res.reshape([1 if d in dims else n for d, n in enumerate(x.shape)]) if keep else res

            return lex
        if kind in ("max", "min"):
            fn = torch.amax if kind == "max" else torch.amin
            return lambda x: fn(x, _dims(axis, x.ndim), keepdim=keep) if x.ndim else x.clone()
        if kind == "mean":
            work = _td(_work(out))
            return lambda x: torch.mean(x.to(work), _dims(axis, x.ndim), keepdim=keep).to(t_out)
        if kind in ("any", "all"):
            fn = torch.any if kind == "any" else torch.all

            def anyall(x: torch.Tensor) -> torch.Tensor:
                if x.dtype != torch.bool:
                    x = x != 0
                return fn(x, _dims(axis, x.ndim), keepdim=keep) if x.ndim else x.clone()

            return anyall
        if kind == "logsumexp":
            work = _td(_work(out))
            return lambda x: _lse(x.to(work), _dims(axis, x.ndim), keep).to(t_out)
        raise KeyError(kind)

    factory.__name__ = f"{kind}_rule"
    return factory


def _lse(x: torch.Tensor, dims: tuple[int, ...], keep: bool) -> torch.Tensor:
    """scipy.special.logsumexp: shift by the (finite) maximum real part, over ``dims`` (all when empty)."""
    real = x.real if x.is_complex() else x
    if not dims:  # nothing reduced (torch would read an empty dim tuple as every dim)
        shift = torch.where(torch.isfinite(real), real, torch.zeros_like(real))
        return torch.log(torch.exp(x - shift)) + shift
    if real.numel() == 0:
        shift = torch.zeros_like(torch.sum(real, dims, keepdim=True))
    else:
        shift = torch.amax(real, dims, keepdim=True)
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    total = torch.sum(torch.exp(x - shift), dims, keepdim=keep)
    if not keep:
        shift = shift.reshape(total.shape)
    return torch.log(total) + shift


def _moment_rule(info: OpInfo) -> Fn:
    axis, keep, corr = info.attrs["axis"], info.attrs["keepdims"], float(info.attrs["correction"])
    out = info.out_dtype
    src = np.dtype(info.in_dtypes[0])
    work = _td(src if src.kind == "c" else _work(out))  # complex keeps its precision; the result is real
    t_out = _td(out)
    sqrt = info.kind == "std"

    def moment(x: torch.Tensor) -> torch.Tensor:
        x = x.to(work)
        dims = _dims(axis, x.ndim)
        n = 1
        for d in dims:
            n *= x.shape[d]
        # NumPy: sum(|x - mean|^2) / (n - ddof), with mean taken over the same axes.
        mean = torch.mean(x, dims, keepdim=True) if dims else x
        dev = x - mean
        sq = (dev.real * dev.real + dev.imag * dev.imag) if dev.is_complex() else dev * dev
        total = torch.sum(sq, dims, keepdim=keep) if dims else sq
        res = total / max(n - corr, 0.0)  # NumPy clamps the divisor at 0 (giving inf or NaN)
        return (torch.sqrt(res) if sqrt else res).to(t_out)

    return moment


def _lex_arg(x: torch.Tensor, dims: tuple[int, ...], largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Complex ``x`` with ``dims`` moved last and flattened, and the index along that last axis of NumPy's
    lexicographic argmax (argmin): the first NaN (in either part), else the first largest (smallest) value."""
    kept = [d for d in range(x.ndim) if d not in dims]
    k = 1
    for d in dims:
        k *= x.shape[d]
    flat = x.permute(*kept, *dims).reshape(*(x.shape[d] for d in kept), k)
    re, im = flat.real, flat.imag
    nan = torch.isnan(re) | torch.isnan(im)
    ext = torch.amax if largest else torch.amin
    far = torch.full_like(re, -float("inf") if largest else float("inf"))
    best_re = ext(torch.where(nan, far, re), -1, keepdim=True)
    cand = (re == best_re) & ~nan
    best_im = ext(torch.where(cand, im, far), -1, keepdim=True)
    first = torch.argmax((cand & (im == best_im)).to(torch.uint8), -1)
    first_nan = torch.argmax(nan.to(torch.uint8), -1)
    return flat, torch.where(nan.any(-1), first_nan, first)


def _arg_rule(info: OpInfo) -> Fn:
    axis, keep = info.attrs["axis"], info.attrs["keepdims"]
    fn = torch.argmax if info.kind == "argmax" else torch.argmin
    is_bool = _kind(info.in_dtypes[0]) == "b"
    if np.dtype(info.in_dtypes[0]) == _U64:
        return _by_keys(_arg_rule, info, False)
    if np.dtype(info.in_dtypes[0]) in _WIDE:
        inner = _arg_rule(OpInfo(info.kind, info.attrs, (TensorType(np.int64, None),), info.out_types))
        return lambda x: inner(x.to(torch.int64))
    if _kind(info.in_dtypes[0]) == "c":
        largest = info.kind == "argmax"

        def lex_arg(x: torch.Tensor) -> torch.Tensor:
            if axis is None:
                idx = _lex_arg(x.reshape(-1), (0,), largest)[1]
                return idx.reshape((1,) * x.ndim) if keep else idx
            ax = axis % max(x.ndim, 1)
            idx = _lex_arg(x, (ax,) if x.ndim else (), largest)[1]
            return idx.unsqueeze(ax) if keep and x.ndim else idx

        return lex_arg

    def arg(x: torch.Tensor) -> torch.Tensor:
        if is_bool:
            x = x.to(torch.uint8)
        if axis is None:
            r = fn(x.reshape(-1))
            return r.reshape((1,) * x.ndim) if keep else r
        return fn(x, axis % max(x.ndim, 1), keepdim=keep) if x.ndim else fn(x.reshape(-1)).reshape(())

    return arg


def _cum_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    t_out = _td(_calc(info.out_dtype))
    wide = np.dtype(info.in_dtypes[0]) in _WIDE
    fn = torch.cumsum if info.kind == "cumsum" else torch.cumprod
    half = np.dtype(info.in_dtypes[0]) == np.float16

    def cum(x: torch.Tensor) -> torch.Tensor:
        if wide:
            x = x.to(torch.int64)
        if axis is None:
            x, d = x.reshape(-1), 0
        else:
            d = axis % max(x.ndim, 1)
        if half:
            # NumPy rounds the running total to float16 at every step: do the same, one step at a time.
            parts = list(torch.unbind(x, d))
            acc: list[torch.Tensor] = []
            for p in parts:
                acc.append(p if not acc else (acc[-1] + p if info.kind == "cumsum" else acc[-1] * p))
            return torch.stack(acc, d) if acc else x.clone()
        return fn(x, d, dtype=t_out)

    return cum


# ================================================================ contractions
def _int_exact(out: np.dtype) -> tuple[torch.dtype, Fn]:
    """Integer and bool products are computed in int64 (exact modulo 2**64, so narrowing wraps as NumPy's
    narrow arithmetic does); bools are then 'any nonzero'. Returns (compute dtype, finish)."""
    if out.kind == "b":
        return torch.int64, lambda r: r != 0
    if out.kind in "iu":
        t = _td(out)
        return torch.int64, lambda r: r.to(t)
    t = _td(out)
    return t, lambda r: r


def _matmul_rule(info: OpInfo) -> Fn:
    loop = _loop_dtypes(np.matmul, info.in_dtypes)
    comp, finish = _int_exact(np.dtype(loop[0]))
    return _matmul_fn(comp, finish, False, False)


def _matmul_fn(comp: torch.dtype, finish: Fn, ta: bool, tb: bool) -> Fn:
    def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if ta:
            a = a.transpose(-1, -2)
        if tb:
            b = b.transpose(-1, -2)
        return finish(torch.matmul(a.to(comp), b.to(comp)))

    return matmul


def _matmul_t_rule(info: OpInfo) -> Fn:
    loop = _loop_dtypes(np.matmul, info.in_dtypes)
    comp, finish = _int_exact(np.dtype(loop[0]))
    return _matmul_fn(comp, finish, bool(info.attrs["transpose_a"]), bool(info.attrs["transpose_b"]))


def _einsum_rule(info: OpInfo) -> Fn:
    from opgraph.ops.contraction import einsum_signature

    shapes = [t.shape for t in info.in_types]  # type: ignore[union-attr]
    explicit, _ = einsum_signature(info.attrs["subscripts"], shapes)
    comp, finish = _int_exact(info.out_dtype)

    def einsum(*xs: torch.Tensor) -> torch.Tensor:
        return finish(torch.einsum(explicit, *(x.to(comp) for x in xs)))

    return einsum


def _tensordot_rule(info: OpInfo) -> Fn:
    from opgraph.ops.contraction import tensordot_axes

    axes = info.attrs["axes"]
    comp, finish = _int_exact(info.out_dtype)

    def tensordot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ax_a, ax_b = tensordot_axes(axes, a.ndim, b.ndim)
        return finish(torch.tensordot(a.to(comp), b.to(comp), dims=(list(ax_a), list(ax_b))))

    return tensordot


def _vecdot_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    loop = _calc(_loop_dtypes(np.vecdot, info.in_dtypes)[0])
    t = _td(loop)
    is_bool = loop.kind == "b"

    def vecdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a = torch.movedim(a.to(t), axis % a.ndim, -1)
        b = torch.movedim(b.to(t), axis % b.ndim, -1)
        if is_bool:
            return torch.any(a & b, -1)
        return torch.sum(torch.conj_physical(a) * b, -1, dtype=t)

    return vecdot


def _outer_rule(info: OpInfo) -> Fn:
    loop = tuple(_calc(d) for d in _loop_dtypes(np.multiply, info.in_dtypes))
    return _with_casts(lambda a, b: torch.outer(a.reshape(-1), b.reshape(-1)), info.in_dtypes, loop)


# ================================================================ shape
def _reshape_rule(info: OpInfo) -> Fn:
    shape = tuple(info.attrs["shape"])
    return lambda x: torch.reshape(x, shape)


def _permute_rule(info: OpInfo) -> Fn:
    axes = info.attrs["axes"]
    if axes is None:
        return lambda x: x.permute(tuple(range(x.ndim - 1, -1, -1)))
    axes = tuple(axes)
    return lambda x: x.permute(axes)


def _broadcast_to_rule(info: OpInfo) -> Fn:
    shape = tuple(info.attrs["shape"])
    return lambda x: torch.broadcast_to(x, shape)


def _expand_dims_rule(info: OpInfo) -> Fn:
    axis = tuple(info.attrs["axis"])

    def expand_dims(x: torch.Tensor) -> torch.Tensor:
        rank = x.ndim + len(axis)
        for a in sorted(a % rank for a in axis):
            x = x.unsqueeze(a)
        return x

    return expand_dims


def _squeeze_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    if axis is None:
        return lambda x: x.squeeze()
    if not axis:
        return lambda x: x
    return lambda x: x.squeeze(tuple(a % x.ndim for a in axis))


def _concat_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    casts = [_cast_to(info.out_dtype)] * len(info.in_types)
    if axis is None:
        return lambda *xs: torch.cat([c(x).reshape(-1) for c, x in zip(casts, xs, strict=True)], 0)
    return lambda *xs: torch.cat([c(x) for c, x in zip(casts, xs, strict=True)], axis)


def _stack_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    cast = _cast_to(info.out_dtype)
    return lambda *xs: torch.stack([cast(x) for x in xs], axis)


def _split_rule(info: OpInfo) -> Fn:
    sections, axis = info.attrs["sections"], info.attrs["axis"]
    n_out = len(info.out_types)

    def split(x: torch.Tensor) -> Any:
        ax = axis % x.ndim
        if isinstance(sections, int):
            size = x.shape[ax] // sections
            bounds: list[int | None] = [i * size for i in range(sections)] + [None]
        else:
            bounds = [0, *sections, None]
        lead = (slice(None),) * ax
        parts = tuple(x[(*lead, slice(bounds[i], bounds[i + 1]))] for i in range(n_out))
        return parts[0] if n_out == 1 else parts

    return split


def _getitem_rule(info: OpInfo) -> Fn:
    index = tuple(info.attrs["index"])

    def plan(ndim: int) -> tuple[tuple[Any, ...], list[tuple[int, int | None, int | None, int]]]:
        used = sum(1 for e in index if isinstance(e, int) or e[0] == "slice")
        full = ("slice", None, None, None)
        entries = list(index)
        if ("ellipsis",) in entries:
            i = entries.index(("ellipsis",))
            entries[i:i + 1] = [full] * (ndim - used)
        else:
            entries += [full] * (ndim - used)
        key: list[Any] = []
        flips: list[tuple[int, int | None, int | None, int]] = []
        dim = 0
        for e in entries:
            if isinstance(e, int):
                key.append(e)
            elif e[0] == "newaxis":
                key.append(None)
                dim += 1
            else:
                _, start, stop, step = e
                if step is not None and step < 0:  # torch slices forward only: flip afterwards
                    key.append(slice(None))
                    flips.append((dim, start, stop, step))
                else:
                    key.append(slice(start, stop, step))
                dim += 1
        return tuple(key), flips

    plans: dict[int, Any] = {}

    def getitem(x: torch.Tensor) -> torch.Tensor:
        p = plans.get(x.ndim)
        if p is None:
            p = plans[x.ndim] = plan(x.ndim)
        key, flips = p
        y = x[key]
        for d, start, stop, step in flips:
            n = y.shape[d]
            r = range(*slice(start, stop, step).indices(n))
            lead = (slice(None),) * d
            if len(r) == 0:
                y = y[(*lead, slice(0, 0))]
            else:
                first = n - 1 - r.start
                y = _unbits(_bits(y).flip(d), y.dtype)[(*lead, slice(first, first + (len(r) - 1) * -step + 1, -step))]
        return y

    return getitem


def _slice_ranges(x: torch.Tensor, bounds: Sequence[torch.Tensor | None], axes: Any) -> list[range | None]:
    """The positions each axis of ``x`` keeps under ``slice``'s run-time bounds (None: the whole axis)."""
    from opgraph.ops.shape import slice_key

    starts, ends, steps = (None if b is None else _bits(b).tolist() for b in bounds)
    key = slice_key(x.ndim, starts, ends, steps, axes)
    return [None if k == slice(None) else range(*k.indices(n)) for k, n in zip(key, x.shape, strict=True)]


def _slice_rule(info: OpInfo) -> Fn:
    axes = info.attrs["axes"]

    def slice_(x: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
               steps: torch.Tensor | None = None) -> torch.Tensor:
        y = x
        for d, r in enumerate(_slice_ranges(x, (starts, ends, steps), axes)):
            if r is None:
                continue
            lead = (slice(None),) * d
            if len(r) == 0:
                y = y[(*lead, slice(0, 0))]
            elif r.step > 0:
                y = y[(*lead, slice(r.start, r.stop, r.step))]
            else:  # torch slices forward only: the flipped axis, sliced forward
                first = y.shape[d] - 1 - r.start
                y = _unbits(_bits(y).flip(d), y.dtype)[(*lead, slice(first, first + (len(r) - 1) * -r.step + 1,
                                                                       -r.step))]
        return y

    return slice_


def _slice_update_rule(info: OpInfo) -> Fn:
    axes = info.attrs["axes"]

    def slice_update(x: torch.Tensor, update: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
                     steps: torch.Tensor | None = None) -> torch.Tensor:
        ranges = _slice_ranges(x, (starts, ends, steps), axes)
        y = _bits(x).clone()
        if x.ndim == 0:
            y[...] = _bits(update)
            return _unbits(y, x.dtype)
        idx = []
        for d, r in enumerate(ranges):  # one index vector per axis, broadcast against each other
            r = range(x.shape[d]) if r is None else r
            pos = torch.arange(len(r), device=x.device) * r.step + r.start
            idx.append(pos.reshape([-1 if i == d else 1 for i in range(x.ndim)]))
        lens = [int(i.numel()) for i in idx]
        y[tuple(idx)] = _bits(update).expand(lens)
        return _unbits(y, x.dtype)

    return slice_update


def _take_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]

    def take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        idx = idx.to(torch.int64)
        if axis is None or x.ndim == 0:
            x, ax = x.reshape(-1), 0
        else:
            ax = axis % x.ndim
        n = x.shape[ax]
        shape = (*x.shape[:ax], *idx.shape, *x.shape[ax + 1:])
        if x.numel() == 0:  # an empty result (NumPy checks no index then)
            return x.new_empty(shape)
        idx = torch.where(idx < 0, idx + n, idx)
        return x[(slice(None),) * ax + (idx.reshape(-1),)].reshape(shape)

    return take


def _pad_index(n: int, before: int, after: int, mode: str, device: torch.device) -> torch.Tensor:
    """Source positions of every padded position along one axis (NumPy's pad modes, large pads included)."""
    i = torch.arange(-before, n + after, device=device)
    if mode == "edge":
        return i.clamp(0, n - 1)
    if mode == "wrap":
        return torch.remainder(i, n)
    if mode == "reflect":
        if n == 1:
            return torch.zeros_like(i)
        p = 2 * (n - 1)
        j = torch.remainder(i, p)
        return torch.where(j >= n, p - j, j)
    p = 2 * n  # symmetric
    j = torch.remainder(i, p)
    return torch.where(j >= n, p - 1 - j, j)


def _pad_rule(info: OpInfo) -> Fn:
    pw, mode = tuple(info.attrs["pad_width"]), info.attrs["mode"]
    dt = info.out_dtype
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        fill = np.array(info.attrs["constant_value"]).astype(dt).item()

    def pad(x: torch.Tensor) -> torch.Tensor:
        pairs = pw * x.ndim if len(pw) == 1 else pw
        if mode == "constant":
            shape = tuple(d + b + a for d, (b, a) in zip(x.shape, pairs, strict=True))
            out = torch.full(shape, fill, dtype=x.dtype, device=x.device)
            out[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, pairs, strict=True))] = x
            return out
        for ax, (b, a) in enumerate(pairs):
            if b or a:
                x = x[(slice(None),) * ax + (_pad_index(x.shape[ax], b, a, mode, x.device),)]
        return x

    return pad


def _flip_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    return lambda x: _unbits(torch.flip(_bits(x), _dims(axis, x.ndim)), x.dtype) if x.ndim else x.clone()


def _roll_rule(info: OpInfo) -> Fn:
    shift, axis = tuple(info.attrs["shift"]), info.attrs["axis"]

    def roll(x: torch.Tensor) -> torch.Tensor:
        if x.numel() == 0:
            return x.clone()
        if axis is None:
            return torch.roll(x.reshape(-1), sum(shift)).reshape(x.shape)
        shifts, dims = shift, tuple(axis)
        if len(shifts) == 1:
            shifts = shifts * len(dims)
        if len(dims) == 1:
            dims = dims * len(shifts)
        return torch.roll(x, shifts, dims)

    return roll


def _tile_rule(info: OpInfo) -> Fn:
    reps = tuple(info.attrs["reps"])
    return (lambda x: torch.tile(x, reps)) if reps else (lambda x: x.clone())


def _repeat_rule(info: OpInfo) -> Fn:
    repeats, axis = info.attrs["repeats"], info.attrs["axis"]

    def repeat(x: torch.Tensor) -> torch.Tensor:
        if axis is None or x.ndim == 0:
            return torch.repeat_interleave(x.reshape(-1), repeats, 0)
        return torch.repeat_interleave(x, repeats, axis % x.ndim)

    return repeat


def _moveaxis_rule(info: OpInfo) -> Fn:
    src, dst = tuple(info.attrs["source"]), tuple(info.attrs["destination"])
    return lambda x: torch.movedim(x, src, dst)


def _copy_rule(info: OpInfo) -> Fn:
    return lambda x: x.clone(memory_format=torch.contiguous_format)


def _bitcast_rule(info: OpInfo) -> Fn:
    t = _td(info.out_dtype)
    if info.out_dtype == np.bool_ and np.dtype(info.in_dtypes[0]) != np.bool_:
        return lambda x: x.view(torch.uint8) != 0  # any set bit reads as True, as the NumPy kernel
    return lambda x: x.view(t).clone()


# ================================================================ nn
def _relu_rule(info: OpInfo) -> Fn:
    if _kind(info.in_dtypes[0]) == "u":
        return lambda x: x.clone()
    return torch.relu


def _softmax_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]
    out = info.out_dtype
    work, t_out = _td(_work(out)), _td(out)
    log = info.kind == "log_softmax"

    def softmax(x: torch.Tensor) -> torch.Tensor:
        # The NumPy kernel's arithmetic: shift by the max (0 where it is not finite), then normalise.
        x = x.to(work)
        if x.numel() == 0:
            return x.to(t_out)
        m = torch.amax(x, axis, keepdim=True)
        s = x - torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        if log:
            r = s - torch.log(torch.sum(torch.exp(s), axis, keepdim=True))
        else:
            e = torch.exp(s)
            r = e / torch.sum(e, axis, keepdim=True)
        return r.to(t_out)

    return softmax


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _torch_pads(pairs: Sequence[tuple[int, int]]) -> list[int]:
    """(begin, end) pairs of the trailing axes, first to last, as F.pad's flat list (last axis first)."""
    flat: list[int] = []
    for b, e in reversed(pairs):
        flat += [b, e]
    return flat


def _conv2d_rule(info: OpInfo) -> Fn:
    from opgraph.ops.nn import pad4

    out = info.out_dtype
    work, t_out = _td(_work(out)), _td(out)
    top, bottom, left, right = pad4(info.attrs["padding"])
    stride, dilation, groups = tuple(info.attrs["stride"]), tuple(info.attrs["dilation"]), info.attrs["groups"]
    symmetric = top == bottom and left == right

    def conv2d(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x, w = x.to(work), w.to(work)
        if symmetric:
            return F.conv2d(x, w, None, stride, (top, left), dilation, groups).to(t_out)
        x = F.pad(x, [left, right, top, bottom])
        return F.conv2d(x, w, None, stride, 0, dilation, groups).to(t_out)

    return conv2d


def _windows(xp: torch.Tensor, spans: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
             outs: Sequence[int]) -> torch.Tensor:
    """(N, C, *outs, K): the (dilated, strided) windows of the trailing spatial axes of a padded input, the
    K = prod(kernel) taps of each in C order (as ``np.ndindex(*kernel)``)."""
    nsp = len(spans)
    lead = xp.ndim - nsp
    for i, (span, s) in enumerate(zip(spans, strides, strict=True)):
        xp = xp.unfold(lead + i, span, s)
    key = (*(slice(None),) * lead, *(slice(0, o) for o in outs), *(slice(None, None, d) for d in dilations))
    w = xp[key]
    taps = 1
    for k in w.shape[lead + nsp:]:
        taps *= k
    return w.reshape(*w.shape[:lead + nsp], taps)


def _max_pool2d_rule(info: OpInfo) -> Fn:
    if np.dtype(info.in_dtypes[0]) == _U64:
        return _by_keys(_max_pool2d_rule, info, True)
    from opgraph.ops.nn import pad4

    kernel = tuple(info.attrs["kernel_size"])
    stride = tuple(info.attrs["stride"]) if info.attrs["stride"] is not None else kernel
    top, bottom, left, right = pad4(info.attrs["padding"])
    dt = np.dtype(info.in_dtypes[0])
    fill = _fill_min(dt)
    wide = dt in _WIDE
    if dt.kind == "f" and top == bottom and left == right:
        return lambda x: F.max_pool2d(x, kernel, stride, (top, left))

    def max_pool2d(x: torch.Tensor) -> torch.Tensor:
        if wide:
            x = x.to(torch.int64)
        xp = F.pad(x, [left, right, top, bottom], value=fill) if top or bottom or left or right else x
        ho, wo = (xp.shape[-2] - kernel[0]) // stride[0] + 1, (xp.shape[-1] - kernel[1]) // stride[1] + 1
        return torch.amax(_windows(xp, kernel, stride, (1, 1), (ho, wo)), -1)

    return max_pool2d


def _avg_pool2d_rule(info: OpInfo) -> Fn:
    from opgraph.ops.nn import pad4

    kernel = tuple(info.attrs["kernel_size"])
    stride = tuple(info.attrs["stride"]) if info.attrs["stride"] is not None else kernel
    top, bottom, left, right = pad4(info.attrs["padding"])
    include = bool(info.attrs["count_include_pad"])
    out = info.out_dtype
    work, t_out = _td(_work(out)), _td(out)
    if top == bottom and left == right:
        return lambda x: F.avg_pool2d(x.to(work), kernel, stride, (top, left), False, include).to(t_out)

    def avg_pool2d(x: torch.Tensor) -> torch.Tensor:
        x = x.to(work)
        pads = [left, right, top, bottom]
        total = F.avg_pool2d(F.pad(x, pads), kernel, stride, 0, False, True)
        if include:
            return total.to(t_out)
        ones = torch.ones((1, *x.shape[-2:]), dtype=work, device=x.device)
        share = F.avg_pool2d(F.pad(ones, pads), kernel, stride, 0, False, True)
        return (total / share).to(t_out)

    return avg_pool2d


def _geometry(info: OpInfo, nsp: int) -> Any:
    from opgraph.ops.nn import _Geometry

    return _Geometry(dict(info.attrs), nsp)


def _conv_rule(info: OpInfo) -> Fn:
    out = info.out_dtype
    work, t_out = _td(_work(out)), _td(out)
    nsp = len(info.in_types[1].shape) - 2  # type: ignore[union-attr, arg-type]
    geo = _geometry(info, nsp)
    groups = info.attrs["groups"]
    conv = _CONV[nsp]
    symmetric = all(b == e for b, e in geo.pads)
    stride, dilation = tuple(geo.stride), tuple(geo.dilation)
    pads = _torch_pads(geo.pads)

    def conv_nd(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x, w = x.to(work), w.to(work)
        if symmetric:
            return conv(x, w, None, stride, tuple(b for b, _ in geo.pads), dilation, groups).to(t_out)
        return conv(F.pad(x, pads), w, None, stride, 0, dilation, groups).to(t_out)

    return conv_nd


def _conv_transpose_rule(info: OpInfo) -> Fn:
    out = info.out_dtype
    work, t_out = _td(_work(out)), _td(out)
    nsp = len(info.in_types[1].shape) - 2  # type: ignore[union-attr, arg-type]
    geo = _geometry(info, nsp)
    groups = info.attrs["groups"]
    conv_t = _CONV_T[nsp]
    stride, dilation = tuple(geo.stride), tuple(geo.dilation)
    # The full (unpadded) result, extended by output_padding at the end, then cut by the (begin, end) pads:
    # F.pad with negative amounts crops.
    crop = _torch_pads([(-b, op - e) for (b, e), op in zip(geo.pads, geo.output_padding, strict=True)])
    needs_crop = any(crop)

    def conv_transpose(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = conv_t(x.to(work), w.to(work), None, stride, 0, 0, groups, dilation)
        return (F.pad(y, crop) if needs_crop else y).to(t_out)

    return conv_transpose


def _pool_plan(info: OpInfo) -> Callable[[tuple[int, ...]], Any]:
    from opgraph.ops.nn import _PoolPlan

    attrs = dict(info.attrs)
    plans: dict[tuple[int, ...], Any] = {}

    def plan(sizes: tuple[int, ...]) -> Any:
        p = plans.get(sizes)
        if p is None:
            p = plans[sizes] = _PoolPlan(sizes, attrs)
        return p

    return plan


def _pool_windows(x: torch.Tensor, p: Any, fill: Any) -> torch.Tensor:
    pads = _torch_pads(p.pad_width[2:])
    xp = F.pad(x, pads, value=fill) if any(pads) else x
    return _windows(xp, p.spans, p.geo.stride, p.geo.dilation, p.outs)


def _max_pool_rule(info: OpInfo) -> Fn:
    if np.dtype(info.in_dtypes[0]) == _U64:
        return _by_keys(_max_pool_rule, info, True)
    plan = _pool_plan(info)
    fill = _fill_min(info.in_dtypes[0])
    if np.dtype(info.in_dtypes[0]) in _WIDE:
        return lambda x: torch.amax(_pool_windows(x.to(torch.int64), plan(tuple(x.shape[2:])), fill), -1)
    return lambda x: torch.amax(_pool_windows(x, plan(tuple(x.shape[2:])), fill), -1)


def _max_pool_argmax_rule(info: OpInfo) -> Fn:
    if np.dtype(info.in_dtypes[0]) == _U64:
        return _by_keys(_max_pool_argmax_rule, info, False)
    plan = _pool_plan(info)
    dt = np.dtype(info.in_dtypes[0])
    fill = _fill_min(dt)
    is_float = dt.kind == "f"

    def max_pool_argmax(x: torch.Tensor) -> torch.Tensor:
        if x.dtype in _SIGNED_BITS:
            x = x.to(torch.int64)
        sizes = tuple(x.shape[2:])
        p = plan(sizes)
        v = _pool_windows(x, p, fill)
        n = 1
        for s in sizes:
            n *= s
        pos = torch.arange(n, device=x.device).reshape(1, 1, *sizes)
        pw = _pool_windows(pos, p, -1)
        valid = pw >= 0
        m = torch.amax(torch.where(valid, v, torch.full_like(v, fill)), -1, keepdim=True)
        hit = valid & (v == m)
        if is_float:
            hit = hit | (valid & torch.isnan(v) & torch.isnan(m))
        first = torch.argmax(hit.to(torch.uint8), -1, keepdim=True)  # the first in window order
        return torch.gather(pw.expand(*v.shape), -1, first).squeeze(-1)

    return max_pool_argmax


def _avg_pool_rule(info: OpInfo) -> Fn:
    plan = _pool_plan(info)
    out = info.out_dtype
    work, t_out = _td(_work(out)), _td(out)
    include = bool(info.attrs["count_include_pad"])
    divisors: dict[tuple[Any, ...], torch.Tensor] = {}

    def avg_pool(x: torch.Tensor) -> torch.Tensor:
        sizes = tuple(x.shape[2:])
        p = plan(sizes)
        total = torch.sum(_pool_windows(x.to(work), p, 0), -1)
        d = divisors.get((sizes, x.device))
        if d is None:
            d = divisors[(sizes, x.device)] = torch.from_numpy(np.maximum(p.counts(include), 1)).to(x.device, work)
        return (total / d).to(t_out)

    return avg_pool


def _lp_pool_rule(info: OpInfo) -> Fn:
    plan = _pool_plan(info)
    out = info.out_dtype
    work, t_out = _td(_work(out)), _td(out)
    p_norm = float(info.attrs["p"])

    def lp_pool(x: torch.Tensor) -> torch.Tensor:
        p = plan(tuple(x.shape[2:]))
        a = torch.abs(x).to(work)
        powered = a * a if p_norm == 2 else torch.pow(a, p_norm)
        total = torch.sum(_pool_windows(powered, p, 0), -1)
        return (torch.sqrt(total) if p_norm == 2 else torch.pow(total, 1.0 / p_norm)).to(t_out)

    return lp_pool


def _lrn_rule(info: OpInfo) -> Fn:
    size, alpha, beta, bias = (info.attrs[k] for k in ("size", "alpha", "beta", "bias"))
    out = info.out_dtype
    work, t_out = _td(_work(out)), _td(out)
    before, after = (size - 1) // 2, size // 2

    def lrn(x: torch.Tensor) -> torch.Tensor:
        xw = x.to(work)
        sq = torch.movedim(xw * xw, 1, -1)
        sums = torch.sum(F.pad(sq, [before, after]).unfold(-1, size, 1), -1)
        return (xw / torch.pow(bias + (alpha / size) * torch.movedim(sums, -1, 1), beta)).to(t_out)

    return lrn


def _resize_rule(info: OpInfo) -> Fn:
    from opgraph.ops.nn import resize_coordinates, resize_taps

    attrs = dict(info.attrs)
    sizes, scales, roi = attrs["sizes"], attrs["scales"], attrs["roi"]
    ctm = attrs["coordinate_transformation_mode"]
    dt = np.dtype(info.in_dtypes[0])
    work = dt if attrs["mode"] == "nearest" else _work(dt)
    t_work, t_out = _td(work), _td(dt)
    fill = np.asarray(attrs["extrapolation_value"]).astype(work).item()
    plans: dict[tuple[int, ...], Any] = {}

    def plan(shape: tuple[int, ...]) -> Any:
        """Per axis: None (unchanged), an empty take, or (indices (n_out, taps), weights or None); the mask of
        outputs outside the input (tf_crop_and_resize), or None. Computed with the NumPy kernel's helpers."""
        rank = len(shape)
        steps: list[Any] = []
        outside = np.zeros((1,) * rank, bool)
        for axis, (n_in, n_out) in enumerate(zip(shape, sizes, strict=True)):
            scale = scales[axis] if scales is not None else (n_out / n_in if n_in else 1.0)
            box = (roi[axis], roi[axis + rank]) if roi is not None else (0.0, 1.0)
            identity = n_out == n_in and np.isclose(scale, 1.0, rtol=1e-9, atol=0) and \
                (ctm != "tf_crop_and_resize" or box == (0.0, 1.0))
            if identity or n_out == 0:
                steps.append(None if identity else (torch.zeros(0, dtype=torch.int64), None))
                continue
            xo = resize_coordinates(n_in, n_out, scale, ctm, box)
            if ctm == "tf_crop_and_resize":
                mshape = [1] * rank
                mshape[axis] = n_out
                outside = outside | ((xo < 0) | (xo > n_in - 1)).reshape(mshape)
            idx, weights = resize_taps(xo, n_in, attrs)
            wshape = [1] * rank
            wshape[axis] = n_out
            steps.append((torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64)),
                          None if weights is None else [torch.from_numpy(np.ascontiguousarray(
                              weights[:, t].astype(work).reshape(wshape))) for t in range(idx.shape[1])]))
        mask = torch.from_numpy(outside) if outside.any() else None
        return steps, mask

    def resize(x: torch.Tensor) -> torch.Tensor:
        key = tuple(x.shape)
        p = plans.get(key)
        if p is None:
            p = plans[key] = plan(key)
        steps, mask = p
        res = x.to(t_work)
        for axis, step in enumerate(steps):
            if step is None:
                continue
            idx, weights = step
            idx = idx.to(x.device)
            if weights is None:
                res = torch.index_select(res, axis, idx.reshape(-1)) if idx.ndim == 1 else \
                    torch.index_select(res, axis, idx[:, 0])
                continue
            acc = None
            for t, w in enumerate(weights):
                term = torch.index_select(res, axis, idx[:, t]) * w.to(x.device)
                acc = term if acc is None else acc + term
            res = acc
        if mask is not None:
            res = torch.where(mask.to(x.device), torch.full((), fill, dtype=t_work, device=x.device), res)
        return res.to(t_out)

    return resize


def _reflect_t(v: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """The NumPy kernel's ``_reflect``: fold coordinates outside [lo, hi] back in."""
    span = hi - lo
    if span <= 0:
        return torch.full_like(v, lo)
    below, above = v < lo, v > hi
    dist = torch.where(below, lo - v, v - hi)
    flips = torch.trunc(dist / span)
    rest = dist - flips * span
    even = torch.remainder(flips, 2) == 0
    folded = torch.where(below == even, lo + rest, hi - rest)
    return torch.where(below | above, folded, v)


def _grid_sample_rule(info: OpInfo) -> Fn:
    from opgraph.ops.nn import grid_sample_taps

    mode, padding_mode, align = info.attrs["mode"], info.attrs["padding_mode"], bool(info.attrs["align_corners"])
    work = np.result_type(_work(info.in_dtypes[0]), _work(info.in_dtypes[1]))
    t_work, t_out = _td(work), _td(info.in_dtypes[0])

    def grid_sample(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        nsp = x.ndim - 2
        n = x.shape[0]
        xw = torch.movedim(x.to(t_work), 1, -1)  # (N, *in, C): the gathered (N, *out) axes come first
        axes_taps: list[list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]] = []
        for axis in range(nsp):
            size = x.shape[2 + axis]
            coord = grid[..., nsp - 1 - axis].to(torch.float64)  # the grid lists (x, y, z): the last axis first
            pos = (coord + 1) / 2 * (size - 1) if align else ((coord + 1) * size - 1) / 2
            lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
            if mode == "nearest":
                pos = torch.round(pos)  # half to even
            if padding_mode == "border":
                pos = torch.where((pos < lo) | (pos > hi), pos.clamp(0, size - 1), pos)
            elif padding_mode == "reflection":
                pos = _reflect_t(pos, lo, hi)
            base = torch.floor(pos)
            t = pos - base
            offsets, weights = grid_sample_taps(mode, t)
            taps = []
            for off, wgt in zip(offsets, weights, strict=True):
                idx = base + off
                valid = None
                if padding_mode == "zeros":
                    valid = (idx >= 0) & (idx < size)
                elif padding_mode == "reflection":
                    idx = torch.trunc(_reflect_t(idx, lo, hi))
                taps.append((idx.clamp(0, size - 1).to(torch.int64), wgt, valid))
            axes_taps.append(taps)
        batch = torch.arange(n, device=x.device).reshape(n, *(1,) * (grid.ndim - 2))
        acc = torch.zeros((*grid.shape[:-1], x.shape[1]), dtype=t_work, device=x.device)
        for combo in np.ndindex(*(len(t) for t in axes_taps)):
            weight: Any = 1.0
            for axis, k in enumerate(combo):
                _, wgt, valid = axes_taps[axis][k]
                if wgt is not None:
                    weight = weight * wgt
                if valid is not None:
                    weight = weight * valid
            index = (batch, *(axes_taps[axis][k][0] for axis, k in enumerate(combo)))
            wt = torch.as_tensor(weight, dtype=torch.float64, device=x.device).to(t_work)
            acc = acc + xw[index] * wt[..., None]
        return torch.movedim(acc, -1, 1).to(t_out)

    return grid_sample


# ================================================================ linalg
def _linalg_work(info: OpInfo) -> torch.dtype:
    from opgraph.ops.linalg import linalg_dtypes

    return _td(linalg_dtypes(*info.in_dtypes)[0])


def _linalg_rule(kind: str) -> RuleFactory:
    def factory(info: OpInfo) -> Fn:
        work = _linalg_work(info)
        a = info.attrs
        fns: dict[str, Fn] = {
            "eigh": lambda x: tuple(torch.linalg.eigh(x, UPLO=a.get("UPLO", "L"))),
            "eigvalsh": lambda x: torch.linalg.eigvalsh(x, UPLO=a.get("UPLO", "L")),
            "qr": lambda x: tuple(torch.linalg.qr(x, mode=a.get("mode", "reduced"))),
            "svd": lambda x: tuple(torch.linalg.svd(x, full_matrices=bool(a.get("full_matrices", False)))),
            "svdvals": torch.linalg.svdvals,
            "cholesky": lambda x: torch.linalg.cholesky(x, upper=bool(a.get("upper", False))),
            "inv": torch.linalg.inv,
            "det": torch.linalg.det,
            "slogdet": lambda x: tuple(torch.linalg.slogdet(x)),
            "pinv": lambda x: torch.linalg.pinv(x, rtol=a.get("rtol"), hermitian=bool(a.get("hermitian", False))),
        }
        fn = fns[kind]
        return lambda x: fn(x.to(work))

    factory.__name__ = f"{kind}_rule"
    return factory


def _solve_rule(info: OpInfo) -> Fn:
    work = _linalg_work(info)

    def solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.to(work), b.to(work)
        if b.ndim == 1:
            return torch.linalg.solve(a, b)
        # NumPy 2: a b of rank >= 2 is a stack of matrices; broadcast the batch dims so torch cannot read it
        # as a batch of vectors.
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        return torch.linalg.solve(a.expand(*batch, *a.shape[-2:]), b.expand(*batch, *b.shape[-2:]))

    return solve


# ================================================================ fused
def _fma_rule(info: OpInfo) -> Fn:
    a, b, c = info.in_dtypes
    mloop = _loop_dtypes(np.multiply, (a, b))
    (m,) = np.multiply.resolve_dtypes((*mloop, None))[2:]
    aloop = tuple(_calc(d) for d in _loop_dtypes(np.add, (m, c)))
    mloop = tuple(_calc(d) for d in mloop)
    mul = _with_casts(torch.mul, (a, b), mloop)
    add = _with_casts(_c_add if aloop[0].kind == "c" else torch.add, (m, c), aloop)
    return lambda x, y, z: add(mul(x, y), z)


def _fused_rule(info: OpInfo) -> Fn:
    from opgraph.ops.fused import step_types

    program = info.attrs["program"]
    types = step_types(program, tuple(info.in_types))
    steps: list[tuple[Fn, tuple[int, ...]]] = []
    for i, (kind, *refs) in enumerate(program):
        args = tuple(info.in_types[-r - 1] if r < 0 else types[r] for r in refs)
        fn = RULES[kind](OpInfo(kind, {}, args, (types[i],)))
        cast = _cast_to(types[i].dtype)
        steps.append((lambda *xs, _f=fn, _c=cast: _c(_f(*xs)), tuple(refs)))

    def fused(*xs: torch.Tensor) -> torch.Tensor:
        vals: list[torch.Tensor] = []
        for fn, refs in steps:
            vals.append(fn(*(xs[-r - 1] if r < 0 else vals[r] for r in refs)))
        return vals[-1]

    return fused


def _scalar(v: float, dt: np.dtype) -> torch.Tensor:
    """A 0-d CPU tensor of ``v`` in ``dt`` (NumPy's kernels round their scalar attributes to the dtype first);
    CPU scalars combine with tensors on any device."""
    return torch.tensor(np.asarray(v, dtype=dt).item(), dtype=_td(dt))


def _momentum_rule(info: OpInfo) -> Fn:
    dt = np.dtype(info.in_dtypes[0])
    lr, mu = _scalar(info.attrs["lr"], dt), _scalar(info.attrs["mu"], dt)

    def momentum(p: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v2 = mu * v + g
        return p - lr * v2, v2

    return momentum


def _adagrad_rule(info: OpInfo) -> Fn:
    dt = np.dtype(info.in_dtypes[0])
    lr, eps = _scalar(info.attrs["lr"], dt), _scalar(info.attrs["eps"], dt)

    def adagrad(p: torch.Tensor, acc: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        acc2 = acc + g * g
        return p - (lr * g) / (torch.sqrt(acc2) + eps), acc2

    return adagrad


def _adam_rule(info: OpInfo) -> Fn:
    dt = np.dtype(info.in_dtypes[0])
    s = {k: _scalar(info.attrs[k], dt) for k in ("lr", "b1", "c1", "b2", "c2", "eps")}
    square_first = bool(info.attrs["square_first"])
    fixed = info.kind == "adam_update"
    bcs = (_scalar(info.attrs["bc1"], dt), _scalar(info.attrs["bc2"], dt)) if fixed else None

    def core(p: torch.Tensor, m: torch.Tensor, v: torch.Tensor, g: torch.Tensor, bc1: torch.Tensor,
             bc2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m2 = s["b1"] * m + s["c1"] * g
        tmp = (g * g) * s["c2"] if square_first else (s["c2"] * g) * g
        v2 = s["b2"] * v + tmp
        den = torch.sqrt(v2 / bc2) + s["eps"]
        return p - (s["lr"] * (m2 / bc1)) / den, m2, v2

    if bcs is not None:
        return lambda p, m, v, g: core(p, m, v, g, *bcs)
    return core


# ================================================================ indexing
def _wrap(idx: torch.Tensor, n: int) -> torch.Tensor:
    """Indices into an axis of size ``n`` as int64, negatives counted from the end; out of range raises."""
    idx = idx.to(torch.int64)
    if idx.numel() and bool(((idx < -n) | (idx >= n)).any()):
        bad = idx[(idx < -n) | (idx >= n)][0].item()
        raise IndexError(f"index {bad} is out of bounds for an axis of size {n}")
    return torch.where(idx < 0, idx + n, idx)


def _gather_elements_rule(info: OpInfo) -> Fn:
    axis = info.attrs["axis"]

    def gather_elements(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        ax = axis % x.ndim
        return _unbits(torch.gather(_bits(x), ax, _wrap(idx, x.shape[ax])), x.dtype)

    return gather_elements


_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _last_wins(n: int, lin: torch.Tensor) -> torch.Tensor:
    """For each of ``n`` targets, the position in ``lin`` (target per update) of its last update, or -1."""
    owner = torch.full((n,), -1, dtype=torch.int64, device=lin.device)
    ids = torch.arange(lin.numel(), device=lin.device)
    return owner.scatter_reduce(0, lin, ids, "amax", include_self=True)


def _scatter_rows(xf: torch.Tensor, lin: torch.Tensor, upd: torch.Tensor, reduction: str) -> torch.Tensor:
    """A copy of ``xf`` (P, *rest) with rows ``lin`` (L,) combined with ``upd`` (L, *rest)."""
    if lin.numel() == 0:
        return xf.clone()
    if xf.dtype == torch.uint64 and reduction in ("max", "min"):  # ordered on int64 keys
        return _unkey(_scatter_rows(_key(xf), lin, _key(upd), reduction))
    if xf.dtype in _SIGNED_BITS:  # in int64: by value (uint16, uint32) or modulo 2**64 (uint64)
        return _scatter_rows(xf.to(torch.int64), lin, upd.to(torch.int64), reduction).to(xf.dtype)
    if reduction == "none":
        owner = _last_wins(xf.shape[0], lin)
        hit = owner >= 0
        res = xf.clone()
        res[hit] = upd[owner[hit]]
        return res
    is_bool = xf.dtype == torch.bool
    work = xf.to(torch.int64) if is_bool else xf
    u = upd.to(torch.int64) if is_bool else upd
    index = lin.reshape(-1, *(1,) * (u.ndim - 1)).expand(u.shape)
    res = work.scatter_reduce(0, index, u, _SCATTER_REDUCE[reduction], include_self=True)
    return res != 0 if is_bool else res


def _scatter_elements_rule(info: OpInfo) -> Fn:
    axis, reduction = info.attrs["axis"], info.attrs["reduction"]

    def scatter_elements(x: torch.Tensor, idx: torch.Tensor, upd: torch.Tensor) -> torch.Tensor:
        ax = axis % x.ndim
        i = _wrap(idx, x.shape[ax])
        # Every update's flat target position in x: its own coordinates with the axis one replaced.
        grids = torch.meshgrid(*(torch.arange(s, device=x.device) for s in i.shape), indexing="ij")
        coords = [i if d == ax else g for d, g in enumerate(grids)]
        lin = torch.zeros_like(i)
        for d, c in enumerate(coords):
            lin = lin * x.shape[d] + c
        res = _scatter_rows(x.reshape(-1), lin.reshape(-1), upd.reshape(-1), reduction)
        return res.reshape(x.shape)

    return scatter_elements


def _gather_nd_rule(info: OpInfo) -> Fn:
    bd = info.attrs["batch_dims"]

    def gather_nd(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        m = idx.shape[-1]
        nb = 1
        for s in x.shape[:bd]:
            nb *= s
        n = 1
        for s in idx.shape[bd:-1]:
            n *= s
        xr = x.reshape(nb, *x.shape[bd:])
        ir = idx.reshape(nb, n, m)
        cols = [_wrap(ir[..., j], x.shape[bd + j]) for j in range(m)]
        rows = torch.arange(nb, device=x.device)[:, None].expand(nb, n)
        res = xr[(rows, *cols)]
        return res.reshape(*idx.shape[:-1], *x.shape[bd + m:])

    return gather_nd


def _scatter_nd_rule(info: OpInfo) -> Fn:
    reduction = info.attrs["reduction"]

    def scatter_nd(x: torch.Tensor, idx: torch.Tensor, upd: torch.Tensor) -> torch.Tensor:
        k = idx.shape[-1]
        lead = idx.shape[:-1]
        n_rows = 1
        for s in x.shape[:k]:
            n_rows *= s
        lin = torch.zeros(lead, dtype=torch.int64, device=x.device)
        for j in range(k):
            lin = lin * x.shape[j] + _wrap(idx[..., j], x.shape[j])
        rest = x.shape[k:]
        res = _scatter_rows(x.reshape(n_rows, *rest), lin.reshape(-1), upd.reshape(-1, *rest), reduction)
        return res.reshape(x.shape)

    return scatter_nd


def _topk_rule(info: OpInfo) -> Fn:
    k, axis, largest = info.attrs["k"], info.attrs["axis"], bool(info.attrs["largest"])

    def topk(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ax = axis % x.ndim
        # A stable sort keeps ties in index order; torch sorts NaN as the largest, as the NumPy kernel does.
        vals, idx = torch.sort(x, dim=ax, descending=largest, stable=True)
        return vals.narrow(ax, 0, k), idx.narrow(ax, 0, k)

    return topk


def _sort_rule(info: OpInfo) -> Fn:
    axis, descending = info.attrs["axis"], bool(info.attrs["descending"])

    def sort(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # stable in both directions, NaN largest: the NumPy kernel's order
        return torch.sort(x, dim=axis % x.ndim, descending=descending, stable=True)

    return sort


def _searchsorted_rule(info: OpInfo) -> Fn:
    right = info.attrs["side"] == "right"

    def searchsorted(table: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(table, values.contiguous(), right=right)

    return searchsorted


def _one_hot_rule(info: OpInfo) -> Fn:
    depth, axis = info.attrs["depth"], info.attrs["axis"]
    signed = _kind(info.in_dtypes[0]) == "i"

    def one_hot(idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        ax = axis % (idx.ndim + 1)
        i = idx.to(torch.int64)
        if signed:
            i = torch.where(i < 0, i + depth, i)
        pos = torch.arange(depth, device=idx.device).reshape(depth, *(1,) * (idx.ndim - ax))
        hot = i.unsqueeze(ax) == pos
        return torch.where(hot, values[1], values[0])

    return one_hot


def _trilu_rule(info: OpInfo) -> Fn:
    k, upper = info.attrs["k"], bool(info.attrs["upper"])
    fn = torch.triu if upper else torch.tril
    return lambda x: _unbits(fn(_bits(x), k), x.dtype)


def _reverse_sequence_rule(info: OpInfo) -> Fn:
    batch_axis, time_axis = info.attrs["batch_axis"], info.attrs["time_axis"]

    def reverse_sequence(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        ba, ta = batch_axis % x.ndim, time_axis % x.ndim
        nt = x.shape[ta]
        lens = lengths.to(torch.int64)
        if lens.numel() and bool(((lens < 0) | (lens > nt)).any()):
            raise ValueError(f"lengths must be in [0, {nt}] (the time axis' size), got {lens.tolist()}")
        t = torch.arange(nt, device=x.device)
        src = torch.where(t < lens[:, None], lens[:, None] - 1 - t, t)  # (batch, time)
        xm = torch.movedim(x, (ba, ta), (0, 1))
        index = src.reshape(*src.shape, *(1,) * (xm.ndim - 2)).expand(xm.shape)
        return _unbits(torch.movedim(torch.gather(_bits(xm), 1, index), (0, 1), (ba, ta)), x.dtype)

    return reverse_sequence


# ================================================================ signal
def _fft_empty(fn: Fn, length: Callable[[int], int], axis: int, out: torch.dtype) -> Fn:
    """``fn``, except for an empty input (which MKL refuses): the transform of zeros (padded to n) is zeros."""

    def run(x: torch.Tensor) -> torch.Tensor:
        if x.numel():
            return fn(x)
        ax = axis % x.ndim
        shape = (*x.shape[:ax], length(x.shape[ax]), *x.shape[ax + 1:])
        return torch.zeros(shape, dtype=out, device=x.device)

    return run


def _fft_rule(info: OpInfo) -> Fn:
    axis, n, norm = info.attrs["axis"], info.attrs["n"], info.attrs["norm"]
    fn = torch.fft.ifft if info.attrs.get("inverse") else torch.fft.fft
    return _fft_empty(lambda x: fn(x, n=n, dim=axis, norm=norm), lambda m: m if n is None else n, axis,
                      _td(info.out_dtype))


def _rfft_rule(info: OpInfo) -> Fn:
    axis, n, norm = info.attrs["axis"], info.attrs["n"], info.attrs["norm"]
    work = torch.float32 if info.out_dtype == np.complex64 else torch.float64
    return _fft_empty(lambda x: torch.fft.rfft(x.to(work), n=n, dim=axis, norm=norm),
                      lambda m: (m if n is None else n) // 2 + 1, axis, _td(info.out_dtype))


def _irfft_rule(info: OpInfo) -> Fn:
    axis, n, norm = info.attrs["axis"], info.attrs["n"], info.attrs["norm"]
    return _fft_empty(lambda x: torch.fft.irfft(x, n=n, dim=axis, norm=norm),
                      lambda m: 2 * (m - 1) if n is None else n, axis, _td(info.out_dtype))


# ================================================================ the tables
RULES: dict[str, RuleFactory] = {
    **{k: _ufunc_rule(k, m) for k, m in {**_UNARY, **_BINARY}.items()},
    "round": _round_rule, "real": _real_rule, "imag": _imag_rule,
    "where": _where_rule, "cast": _cast_rule, "clip": _clip_rule,
    **{k: _reduction(k) for k in ("sum", "prod", "max", "min", "mean", "any", "all", "logsumexp")},
    "var": _moment_rule, "std": _moment_rule, "argmax": _arg_rule, "argmin": _arg_rule,
    "cumsum": _cum_rule, "cumprod": _cum_rule,
    "matmul": _matmul_rule, "einsum": _einsum_rule, "tensordot": _tensordot_rule, "vecdot": _vecdot_rule,
    "outer": _outer_rule,
    "reshape": _reshape_rule, "permute_dims": _permute_rule, "broadcast_to": _broadcast_to_rule,
    "expand_dims": _expand_dims_rule, "squeeze": _squeeze_rule, "concat": _concat_rule, "stack": _stack_rule,
    "split": _split_rule, "getitem": _getitem_rule, "take": _take_rule, "pad": _pad_rule, "flip": _flip_rule,
    "roll": _roll_rule, "tile": _tile_rule, "repeat": _repeat_rule, "moveaxis": _moveaxis_rule,
    "copy": _copy_rule, "bitcast": _bitcast_rule, "slice": _slice_rule, "slice_update": _slice_update_rule,
    "relu": _relu_rule, "softmax": _softmax_rule, "log_softmax": _softmax_rule, "conv2d": _conv2d_rule,
    "max_pool2d": _max_pool2d_rule, "avg_pool2d": _avg_pool2d_rule, "conv": _conv_rule,
    "conv_transpose": _conv_transpose_rule, "max_pool": _max_pool_rule, "max_pool_argmax": _max_pool_argmax_rule,
    "avg_pool": _avg_pool_rule, "lp_pool": _lp_pool_rule, "lrn": _lrn_rule, "resize": _resize_rule,
    "grid_sample": _grid_sample_rule,
    **{k: _linalg_rule(k) for k in ("eigh", "eigvalsh", "qr", "svd", "svdvals", "cholesky", "inv", "det",
                                    "slogdet", "pinv")},
    "solve": _solve_rule,
    "fma": _fma_rule, "matmul_t": _matmul_t_rule, "fused_elementwise": _fused_rule,
    "sgd_momentum_update": _momentum_rule, "adagrad_update": _adagrad_rule, "adam_update": _adam_rule,
    "adam_update_t": _adam_rule,
    "gather_elements": _gather_elements_rule, "scatter_elements": _scatter_elements_rule,
    "gather_nd": _gather_nd_rule, "scatter_nd": _scatter_nd_rule, "topk": _topk_rule, "one_hot": _one_hot_rule,
    "sort": _sort_rule, "searchsorted": _searchsorted_rule,
    "trilu": _trilu_rule, "reverse_sequence": _reverse_sequence_rule,
    "fft": _fft_rule, "rfft": _rfft_rule, "irfft": _irfft_rule,
}
"""op kind -> rule factory (see the module doc)."""


def _fused_limit(info: OpInfo) -> str | None:
    from opgraph.ops.fused import step_types

    program = info.attrs["program"]
    types = step_types(program, tuple(info.in_types))
    for i, (kind, *refs) in enumerate(program):
        args = tuple(info.in_types[-r - 1] if r < 0 else types[r] for r in refs)
        why = BACKEND.why_not(OpInfo(kind, {}, args, (types[i],)))
        if why is not None:
            return f"step {i}: {why}"
    return None


def _lapack_vectors(info: OpInfo) -> str | None:
    return ("eigenvector and singular-vector signs (phases) depend on the LAPACK build: torch's differ from "
            "NumPy's")


_MODULAR = frozenset({
    "add", "subtract", "multiply", "negative", "positive", "square", "bitwise_and", "bitwise_or", "bitwise_xor",
    "bitwise_invert", "bitwise_left_shift", "equal", "not_equal", "logical_and", "logical_or", "logical_xor",
    "logical_not", "isnan", "isinf", "isfinite", "floor", "ceil", "trunc",
})
"""Elementwise kinds whose uint64 loop is exact on int64 bits (arithmetic modulo 2**64, bits, equality)."""
_UFUNC_KINDS = frozenset({*_UNARY, *_BINARY})


def _wide_limit(info: OpInfo) -> str | None:
    """uint64 is computed on int64 bits (or, to order it, on int64 keys): division, right shifts and the like are
    not exact there (uint16 and uint32 are computed by value in int64, which is exact)."""
    if info.kind in _UFUNC_KINDS:
        loop = _loop_dtypes(_ufunc_of(info.kind), info.in_dtypes)
        if _U64 in loop and info.kind not in _MODULAR | _ORDER_UFUNCS:
            return (f"NumPy computes {info.kind} in uint64, which torch cannot (only add, multiply, bits, "
                    "comparisons)")
    return None


def _limit(kind: str, own: Limit | None) -> Limit:
    def limit(info: OpInfo) -> str | None:
        if any(d in _WIDE for d in (*info.in_dtypes, *(t.dtype for t in info.out_types))):  # type: ignore[union-attr]
            why = _wide_limit(info)
            if why is not None:
                return why
        return own(info) if own is not None else None

    return limit


_OWN_LIMITS: dict[str, Limit] = {
    "eigh": _lapack_vectors, "svd": _lapack_vectors,
    "reciprocal": _no_int_reciprocal,
    "erf": _no_complex_loop("torch has no complex erf"), "erfc": _no_complex_loop("torch has no complex erfc"),
    "power": _no_complex_loop("NumPy's complex power multiplies out integer exponents (torch: exp(b log a)), "
                              "which differ at infinities and NaN"),
    "fused_elementwise": _fused_limit,
    "searchsorted": lambda info: ("torch's searchsorted has no unsigned kernels (uint16/32/64)"
                                  if any(np.dtype(d).kind == "u" and np.dtype(d).itemsize > 1
                                         for d in info.in_dtypes) else None),
}
LIMITS: dict[str, Limit] = {kind: _limit(kind, _OWN_LIMITS.get(kind)) for kind in RULES}
"""op kind -> why the torch backend cannot run a particular op of that kind (None: it can)."""


# ================================================================ control flow
class _Body:
    """A body as a function of torch tensors returning its results as a tuple: its graph translated by the same
    rule table (nested bodies included), generated once per body; constants are moved to each device once."""

    def __init__(self, body: Subgraph) -> None:
        self.fn, self.consts, self.source = body_program(BACKEND, body, lambda info: RULES[info.kind](info),
                                                         fix=_fix)
        self.held: dict[torch.device, list[torch.Tensor]] = {}

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dev = args[0].device if args else _CPU
        held = self.held.get(dev)
        if held is None:
            held = self.held[dev] = [_from_numpy(c, dev) for c in self.consts]
        return self.fn(held, *args)  # type: ignore[no-any-return]

    def own(self, results: Sequence[torch.Tensor], args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The results, each one that is an argument or a constant of the body cloned: the runtime hands an op's
        results to users as NumPy views, which must not alias a feed or a constant used by the next call."""
        shared = {id(a) for a in args} | {id(c) for held in self.held.values() for c in held}
        return [r.clone() if id(r) in shared else r for r in results]


_CPU = torch.device("cpu")


def _body_fn(body: Subgraph) -> _Body:
    return body.cache(("torch-fn",), lambda: _Body(body))  # type: ignore[no-any-return]


def _results(res: Sequence[torch.Tensor], n: int) -> Any:
    return res[0] if n == 1 else tuple(res)


def _truth(pred: torch.Tensor) -> bool:
    """A one-element predicate as a Python bool (nonzero, NaN included, is true: NumPy's ``bool``)."""
    return bool(pred.reshape(-1)[0])


def _empty_stack(t: ValueType, device: torch.device) -> torch.Tensor:
    """The stacked results of zero trips: as the NumPy kernel, shape (0, *t.shape) where t's shape is known."""
    shape = t.shape if isinstance(t, TensorType) and t.is_static else ()  # type: ignore[union-attr]
    return torch.empty((0, *shape), dtype=_td(t.dtype), device=device)  # type: ignore[union-attr]


def _device_of(xs: Sequence[torch.Tensor]) -> torch.device:
    return xs[0].device if xs else _CPU


def _call_rule(info: OpInfo) -> Fn:
    f, n = _body_fn(info.attrs["body"]), len(info.out_types)
    return lambda *args: _results(f.own(f(*args), args), n)


def _cond_rule(info: OpInfo) -> Fn:
    then_f, else_f = _body_fn(info.attrs["then_body"]), _body_fn(info.attrs["else_body"])
    n = len(info.out_types)

    def cond(pred: torch.Tensor, *operands: torch.Tensor) -> Any:
        f = then_f if _truth(pred) else else_f
        return _results(f.own(f(*operands), operands), n)
    return cond


def _while_loop_rule(info: OpInfo) -> Fn:
    a = info.attrs
    test, step = _body_fn(a["cond_body"]), _body_fn(a["body"])
    nc, max_trip, n = a["num_consts"], a["max_trip"], len(info.out_types)
    ncarry = len(info.in_types) - nc
    y_types = a["body"].out_types[ncarry:]

    def while_loop(*ins: torch.Tensor) -> Any:
        consts, carry = ins[:nc], ins[nc:]
        ys: list[list[torch.Tensor]] = [[] for _ in y_types]
        trips = 0
        while (max_trip is None or trips < max_trip) and _truth(test(*consts, *carry)[0]):
            res = step(*consts, *carry)
            carry = res[:ncarry]
            for acc, y in zip(ys, res[ncarry:], strict=True):
                acc.append(y)
            trips += 1
        dev = _device_of(ins)
        stacked = [torch.stack(acc) if acc else _empty_stack(t, dev) for acc, t in zip(ys, y_types, strict=True)]
        return _results([*step.own(carry, ins), *stacked], n)
    return while_loop


def _scan_rule(info: OpInfo) -> Fn:
    a = info.attrs
    step = _body_fn(a["body"])
    nc, ncarry, length, reverse, n = a["num_consts"], a["num_carry"], a["length"], a["reverse"], len(info.out_types)
    y_types = a["body"].out_types[ncarry:]

    def scan(*ins: torch.Tensor) -> Any:
        consts, carry, xs = ins[:nc], ins[nc:nc + ncarry], ins[nc + ncarry:]
        trips = length if length is not None else xs[0].shape[0]
        bufs: list[torch.Tensor | None] = [None] * len(y_types)
        for i in range(trips - 1, -1, -1) if reverse else range(trips):
            res = step(*consts, *carry, *(x[i] for x in xs))
            carry = res[:ncarry]
            for j, y in enumerate(res[ncarry:]):
                buf = bufs[j]
                if buf is None:  # each y's shape is known once the body has run (its type may leave dims open)
                    buf = bufs[j] = torch.empty((trips, *y.shape), dtype=y.dtype, device=y.device)
                buf[i] = y
        dev = _device_of(ins)
        ys = [b if b is not None else _empty_stack(t, dev) for b, t in zip(bufs, y_types, strict=True)]
        return _results([*step.own(carry, ins), *ys], n)
    return scan


_CONTROL: dict[str, RuleFactory] = {"call": _call_rule, "cond": _cond_rule, "while_loop": _while_loop_rule,
                                    "scan": _scan_rule}
"""Control-flow rules: Python ``if``/``while``/``for`` over the bodies' generated functions (eager; under
``torch.compile`` each runs outside the compiled graph: see :class:`TorchBackend`)."""
RULES.update(_CONTROL)
LIMITS.update({kind: _limit(kind, None) for kind in _CONTROL})


# ================================================================ the backend
def _fix(result: Any, t: ValueType) -> Any:
    """``result`` cast to the declared dtype of type ``t``."""
    want = _td(t.dtype)  # type: ignore[union-attr]
    return result if result.dtype == want else result.to(want)


class _TorchExecutable(Executable):
    """One graph as a straight-line torch function (see :class:`TorchBackend`)."""

    def __init__(self, graph: Graph, device: torch.device, compile: bool, mode: str | None) -> None:
        self.graph = graph
        self._inputs = list(zip(graph.inputs.tolist(), input_dtypes(graph), strict=True))
        self.device = device
        self._compile = compile
        self._mode = mode
        self._rules: dict[int, Fn] = {}
        self._needs_fix: set[int] = set()
        self._lock = threading.Lock()
        self._seen: set[tuple[Any, ...]] = set()
        checking, consts, self.source = straight_line(graph, self._checked_rule)
        self._checking = checking
        with torch.inference_mode():
            self._consts = [_from_numpy(c, device) for c in consts]
        self._fast = self._generate()

    def _rule(self, info: OpInfo) -> Fn:
        fn = self._rules.get(info.op)
        if fn is None:
            fn = RULES[info.kind](info)
            if self._compile and info.kind in _CONTROL:
                # a data-dependent branch or trip count: dynamo would break the graph there or unroll the loop
                # (torch 2.13's scan does not compile on CPU); the op runs eagerly between compiled pieces
                fn = torch._dynamo.disable(fn)
            self._rules[info.op] = fn
        return fn

    def _checked_rule(self, info: OpInfo) -> Fn:
        """The op's rule, casting results whose dtype is not the declared one and recording the op."""
        fn = self._rule(info)
        wants = [_td(t.dtype) for t in info.out_types]  # type: ignore[union-attr]
        op, needs = info.op, self._needs_fix

        def checked(*args: Any) -> Any:
            res = fn(*args)
            if len(wants) == 1:
                if res.dtype != wants[0]:
                    needs.add(op)
                    res = res.to(wants[0])
                return res
            out = []
            for r, w in zip(res, wants, strict=True):
                if r.dtype != w:
                    needs.add(op)
                    r = r.to(w)
                out.append(r)
            return tuple(out)

        return checked

    def _generate(self) -> Fn:
        fn, _consts, self.source = straight_line(self.graph, self._rule, fix=_fix, fix_ops=frozenset(self._needs_fix))
        if self._compile:
            fn = torch.compile(fn, mode=self._mode, dynamic=False)
        return fn  # type: ignore[no-any-return]

    def _check_inputs(self, xs: Sequence[torch.Tensor]) -> None:
        """Each input against its declared type (once per shape signature)."""
        inputs = self.graph.inputs.tolist()
        if len(xs) != len(inputs):
            raise ExecutionError(f"the graph takes {len(inputs)} input(s), got {len(xs)}")
        for v, x in zip(inputs, xs, strict=True):
            t = self.graph.type_of(v)
            shape = t.shape  # type: ignore[union-attr]
            ok = x.dtype == _td(t.dtype) and (shape is None or (  # type: ignore[union-attr]
                x.ndim == len(shape) and all(d is None or d == n for d, n in zip(shape, x.shape, strict=True))))
            if not ok:
                raise ExecutionError(f"input {self.graph.value_label(v)} expects {t}, got a tensor of dtype "
                                     f"{x.dtype} and shape {tuple(x.shape)}")

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        # a tensor must match exactly (checked below); NumPy and Python feeds follow opgraph's feed rule
        xs = [(a if a.device == self.device else a.to(self.device)) if isinstance(a, torch.Tensor)
              else _from_numpy(a if has_dtype(a, dt) else coerce_feed(self.graph, v, a), self.device)
              for a, (v, dt) in zip(args, self._inputs, strict=False)]
        key = tuple((tuple(x.shape), x.dtype) for x in xs)
        with torch.inference_mode():
            if key not in self._seen:
                self._check_inputs(xs)
                with self._lock:
                    known = len(self._needs_fix)
                    out = self._checking(self._consts, *xs)
                    if len(self._needs_fix) != known:
                        self._fast = self._generate()
                    self._seen.add(key)
                return list(out)
            return list(self._fast(self._consts, *xs))


def _from_numpy(a: np.ndarray, device: Any) -> torch.Tensor:
    a = np.asarray(a)
    if not (a.flags.writeable and a.dtype.isnative and a.flags.c_contiguous):
        a = np.array(a, dtype=a.dtype.newbyteorder("=") if not a.dtype.isnative else a.dtype, order="C", copy=True)
    t = torch.from_numpy(a)
    return t if device is None or torch.device(device) == t.device else t.to(device)


class TorchBackend(Backend):
    """PyTorch: the graph as one straight-line function of torch calls (see the module doc)."""

    lowers_bodies = True

    def check_device(self, device: str | None) -> str:
        dev = super().check_device(device)
        if dev.split(":")[0] == "cuda" and not torch.cuda.is_available():
            raise BackendError(f"backend {self.name!r} cannot run on {dev!r}: torch reports no CUDA device")
        return dev

    def compile_graph(self, graph: Graph, *, device: str | None = None, donate: Sequence[int] = (),
                      compile: bool = False, mode: str | None = None, threads: int | None = None,
                      **options: Any) -> Executable:
        """``graph`` as one torch function on ``device``; ``compile=True`` (or a ``mode``) wraps it in
        ``torch.compile(fn, mode=mode, dynamic=False)``; ``threads`` sets torch's (global) thread count.

        ``donate`` is accepted and ignored: every rule computes new tensors.
        """
        if options:
            raise TypeError(f"the torch backend takes no option(s) {sorted(options)}")
        dev = torch.device(self.check_device(device))
        if threads is not None:
            torch.set_num_threads(int(threads))
        return _TorchExecutable(graph, dev, compile or mode is not None, mode)

    def from_numpy(self, array: np.ndarray, device: str | None = None) -> Any:
        return _from_numpy(array, self.check_device(device))

    def to_numpy(self, array: Any) -> np.ndarray:
        if not isinstance(array, torch.Tensor):
            return np.asarray(array)
        return array.detach().cpu().resolve_conj().resolve_neg().numpy()  # type: ignore[no-any-return]


BACKEND = TorchBackend(
    "torch", rules=RULES, dtypes=DTYPES, limits=LIMITS, module="torch", extra="torch", devices=("cpu", "cuda"),
    doc="PyTorch: one straight-line function of torch calls per graph, optionally torch.compile-d (CPU or CUDA)")

