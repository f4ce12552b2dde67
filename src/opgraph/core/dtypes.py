"""The dtypes opgraph supports, their stable codes, and NumPy's promotion rules.

A dtype is represented by ``numpy.dtype``; this module only fixes *which*
dtypes are allowed and gives each a stable small integer code (used for op
versions and in files).

    >>> from opgraph.core.dtypes import as_dtype, promote, dtype_code
    >>> promote(as_dtype("int8"), as_dtype("float32"))
    dtype('float32')
    >>> dtype_code("float64")
    12
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opgraph.errors import OpTypeError

#: Stable codes. Never renumber: they appear in op versions and in files.
DTYPE_CODES: dict[str, int] = {
    "bool": 1,
    "int8": 2,
    "int16": 3,
    "int32": 4,
    "int64": 5,
    "uint8": 6,
    "uint16": 7,
    "uint32": 8,
    "uint64": 9,
    "float16": 10,
    "float32": 11,
    "float64": 12,
    "complex64": 13,
    "complex128": 14,
}
CODE_DTYPES: dict[int, np.dtype] = {c: np.dtype(n) for n, c in DTYPE_CODES.items()}
SUPPORTED: frozenset[np.dtype] = frozenset(CODE_DTYPES.values())

bool_ = np.dtype("bool")
int8, int16, int32, int64 = (np.dtype(f"int{b}") for b in (8, 16, 32, 64))
uint8, uint16, uint32, uint64 = (np.dtype(f"uint{b}") for b in (8, 16, 32, 64))
float16, float32, float64 = (np.dtype(f"float{b}") for b in (16, 32, 64))
complex64, complex128 = np.dtype("complex64"), np.dtype("complex128")


def as_dtype(dtype: Any) -> np.dtype:
    """Normalise anything NumPy accepts as a dtype to a supported ``np.dtype``.

    >>> as_dtype(float)
    dtype('float64')
    >>> as_dtype("datetime64")
    Traceback (most recent call last):
    ...
    opgraph.errors.OpTypeError: unsupported dtype datetime64; opgraph supports bool, int8, ...
    """
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise OpTypeError(f"not a dtype: {dtype!r}") from exc
    if dt.byteorder == ">":
        dt = dt.newbyteorder("=")
    if dt not in SUPPORTED:
        raise OpTypeError(f"unsupported dtype {dt}; opgraph supports bool, int8, ...")
    return dt


def dtype_code(dtype: Any) -> int:
    """The stable integer code of a dtype (see ``DTYPE_CODES``).

    >>> dtype_code("bool")
    1
    """
    return DTYPE_CODES[as_dtype(dtype).name]


def promote(*dtypes: np.dtype) -> np.dtype:
    """Result dtype of combining arrays of these dtypes, by NumPy's rules.

    >>> promote(as_dtype("uint8"), as_dtype("int8"))
    dtype('int16')
    """
    return as_dtype(np.result_type(*dtypes))


def is_bool(dt: np.dtype) -> bool:
    """True for the boolean dtype.

    >>> is_bool(bool_)
    True
    """
    return dt.kind == "b"


def is_integer(dt: np.dtype) -> bool:
    """True for signed and unsigned integer dtypes (not bool).

    >>> is_integer(uint8), is_integer(float32)
    (True, False)
    """
    return dt.kind in "iu"


def is_floating(dt: np.dtype) -> bool:
    """True for real floating-point dtypes.

    >>> is_floating(float16)
    True
    """
    return dt.kind == "f"


def is_complex(dt: np.dtype) -> bool:
    """True for complex dtypes.

    >>> is_complex(complex64)
    True
    """
    return dt.kind == "c"


def is_inexact(dt: np.dtype) -> bool:
    """True for floating and complex dtypes.

    >>> is_inexact(int32)
    False
    """
    return dt.kind in "fc"


def default_float_for(dt: np.dtype) -> np.dtype:
    """The dtype NumPy computes float functions in for inputs of ``dt``.

    Integers and bools go to the smallest float that holds them exactly
    (``np.sqrt(np.int8(4))`` is float16), as NumPy does.

    >>> default_float_for(int32), default_float_for(float32)
    (dtype('float64'), dtype('float32'))
    """
    if is_inexact(dt):
        return dt
    return as_dtype(np.result_type(dt, np.float16))
