"""NumPy's dtype semantics on torch tensors: the shims every family module of the torch engine uses.

torch has no arithmetic on uint16, uint32 and uint64: such values are computed in int64 (:func:`calc_dtype`),
ordered through int64 keys (:func:`key`, :func:`by_keys`) or moved as the signed type of their width
(:func:`bits`). Rules cast their inputs to the dtypes NumPy's loop computes in (:func:`loop_dtypes`,
:func:`with_casts`) and compute float16 in float32 (:func:`work_dtype`), as the NumPy kernels do.

    >>> import numpy as np
    >>> td(np.int8), calc_dtype(np.uint32), work_dtype(np.float16)
    (torch.int8, dtype('int64'), dtype('float32'))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from opgraph.backends.base import OpInfo, RuleFactory
from opgraph.core.types import TensorType, ValueType

Fn = Callable[..., Any]

NP_TO_TORCH: dict[np.dtype, torch.dtype] = {
    np.dtype(np.bool_): torch.bool, np.dtype(np.int8): torch.int8, np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64, np.dtype(np.uint8): torch.uint8,
    np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
    np.dtype(np.complex64): torch.complex64, np.dtype(np.complex128): torch.complex128,
    np.dtype(np.uint16): torch.uint16, np.dtype(np.uint32): torch.uint32, np.dtype(np.uint64): torch.uint64,
}
TORCH_TO_NP: dict[torch.dtype, np.dtype] = {t: d for d, t in NP_TO_TORCH.items()}
DTYPES: frozenset[str] = frozenset(d.name for d in NP_TO_TORCH)
"""The dtypes the torch backend runs. torch stores uint16, uint32 and uint64 but has little arithmetic on them:
rules compute such values in int64 (exact for uint16 and uint32; for uint64 only where arithmetic modulo 2**64
is, see :func:`opgraph.backends.torch.elementwise.uint64_limit`) or move their bits as the signed type of the
same width."""
WIDE = frozenset({np.dtype(np.uint16), np.dtype(np.uint32), np.dtype(np.uint64)})
SIGNED_BITS = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def td(dt: Any) -> torch.dtype:
    """The torch dtype of a NumPy dtype (or name).

    >>> td("float16")
    torch.float16
    """
    return NP_TO_TORCH[np.dtype(dt)]


def dtype_kind(dt: Any) -> str:
    """NumPy's kind character of dtype ``dt`` ("b", "i", "u", "f", "c").

    >>> dtype_kind("uint8"), dtype_kind(np.complex64)
    ('u', 'c')
    """
    return np.dtype(dt).kind


def calc_dtype(dt: Any) -> np.dtype:
    """The dtype a value of ``dt`` is computed in: int64 for the wide unsigned dtypes (by value for uint16 and
    uint32; uint64's bits, so only arithmetic modulo 2**64 is exact), else ``dt`` itself.

    >>> calc_dtype("uint64"), calc_dtype("uint8")
    (dtype('int64'), dtype('uint8'))
    """
    dt = np.dtype(dt)
    return np.dtype(np.int64) if dt in WIDE else dt


U64 = np.dtype(np.uint64)
_SIGN_BIT = -(2**63)


def key(x: torch.Tensor) -> torch.Tensor:
    """uint64 (or narrower unsigned) values as int64 keys of the same order: the bits with the sign bit flipped.

    >>> key(torch.from_numpy(np.array([0, 2**63], np.uint64))).tolist()
    [-9223372036854775808, 0]
    """
    return x.to(torch.int64) ^ _SIGN_BIT


def unkey(y: torch.Tensor) -> torch.Tensor:
    """The uint64 values of int64 keys (:func:`key` undone).

    >>> unkey(key(torch.from_numpy(np.array([7, 2**64 - 1], np.uint64)))).numpy()
    array([                   7, 18446744073709551615], dtype=uint64)
    """
    return (y ^ _SIGN_BIT).to(torch.uint64)


def by_keys(factory: RuleFactory, info: OpInfo, values_out: bool) -> Fn:
    """The rule of an op that only orders (compares, selects) its uint64 inputs, run on their int64 keys;
    ``values_out``: the outputs are selected values (turned back into uint64), else indices or bools.

    >>> t = TensorType("uint64", (2,))
    >>> biggest = by_keys(lambda info: lambda x: x.amax(), OpInfo("max", {}, (t,), (TensorType("uint64", ()),)), True)
    >>> biggest(torch.from_numpy(np.array([1, 2**64 - 1], np.uint64))).numpy()
    array(18446744073709551615, dtype=uint64)
    """
    proxy = OpInfo(info.kind, info.attrs, tuple(TensorType(np.int64 if t.dtype == U64 else t.dtype, t.shape)
                                                for t in info.in_types),  # type: ignore[union-attr]
                   tuple(TensorType(np.int64 if t.dtype == U64 else t.dtype, t.shape)
                         for t in info.out_types), info.op, info.version)  # type: ignore[union-attr]
    fn = factory(proxy)
    keyed = [t.dtype == U64 for t in info.in_types]  # type: ignore[union-attr]

    def run(*xs: torch.Tensor) -> Any:
        res = fn(*(key(x) if k else x for x, k in zip(xs, keyed, strict=True)))
        if not values_out:
            return res
        if isinstance(res, tuple):
            return tuple(unkey(r) if t.dtype == U64 else r for r, t in zip(res, info.out_types, strict=True))
        return unkey(res)

    return run


def bits(x: torch.Tensor) -> torch.Tensor:
    """A wide unsigned tensor's bits as the signed dtype of its width (for ops that only move elements).

    >>> bits(torch.tensor([1], dtype=torch.uint32)).dtype, bits(torch.tensor([1.0])).dtype
    (torch.int32, torch.float32)
    """
    t = SIGNED_BITS.get(x.dtype)
    return x if t is None else x.view(t)


def unbits(y: torch.Tensor, t: torch.dtype) -> torch.Tensor:
    """``y`` (moved as :func:`bits`) viewed as dtype ``t`` again.

    >>> unbits(bits(torch.tensor([5], dtype=torch.uint16)), torch.uint16).dtype
    torch.uint16
    """
    return y.view(t) if y.dtype != t and t in SIGNED_BITS else y


def cast_to(dt: Any) -> Fn:
    """A function casting a tensor to ``dt`` (a no-op when it already has it).

    >>> cast_to("int16")(torch.tensor([1.5])).dtype
    torch.int16
    """
    t = td(dt)

    def cast(x: torch.Tensor) -> torch.Tensor:
        return x if x.dtype == t else x.to(t)

    return cast


def with_casts(fn: Fn, src: Sequence[np.dtype], dst: Sequence[np.dtype]) -> Fn:
    """``fn`` called on its inputs cast from dtypes ``src`` to ``dst`` (casts decided now, not per call).

    >>> add = with_casts(torch.add, (np.dtype("int8"), np.dtype("float32")), (np.dtype("float32"),) * 2)
    >>> add(torch.tensor([1], dtype=torch.int8), torch.tensor([0.5])).dtype
    torch.float32
    """
    casts = [None if np.dtype(s) == np.dtype(d) else td(d) for s, d in zip(src, dst, strict=True)]
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


def loop_dtypes(ufunc: np.ufunc, dtypes: Sequence[np.dtype]) -> tuple[np.dtype, ...]:
    """The input dtypes of the loop NumPy's ``ufunc`` runs for inputs of ``dtypes``.

    >>> loop_dtypes(np.sqrt, (np.dtype("int8"),))
    (dtype('float16'),)
    """
    return tuple(ufunc.resolve_dtypes(tuple(dtypes) + (None,) * ufunc.nout)[:ufunc.nin])


def work_dtype(dt: Any) -> np.dtype:
    """float16 is computed in float32 and rounded once at the end, as the NumPy kernels do.

    >>> work_dtype("float16"), work_dtype("float64")
    (dtype('float32'), dtype('float64'))
    """
    dt = np.dtype(dt)
    return np.dtype(np.float32) if dt == np.float16 else dt


def fill_min(dt: Any) -> Any:
    """The value below (or equal to) every value of ``dt``: what max-pooling pads with.

    >>> fill_min("float32"), fill_min("bool"), fill_min("int8")
    (-inf, False, -128)
    """
    dt = np.dtype(dt)
    if dt.kind == "f":
        return -float("inf")
    if dt.kind == "b":
        return False
    return int(np.iinfo(dt).min)


def fix(result: Any, t: ValueType) -> Any:
    """``result`` cast to the declared dtype of type ``t``.

    >>> fix(torch.tensor([1]), TensorType("int8", (1,))).dtype
    torch.int8
    """
    want = td(t.dtype)  # type: ignore[union-attr]
    return result if result.dtype == want else result.to(want)
