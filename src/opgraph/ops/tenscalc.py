"""TensCalc's registered function types (``lib/CGregistration.m``), ids 10001-30002.

TensCalc's .cg files carry no value types: every variable is a double
tensor whose shape the writer does not record. So every kind here has the
same type rule: ``nout`` outputs (the attribute, taken from the file's
record) of type float64 with unknown rank. Parameters (signs, sizes,
subscripts, function strings) arrive as constant inputs placed first, as
TensCalc passes them.

A kind without a NumPy kernel still loads, prints and saves; evaluating it
raises an ExecutionError naming the function type.

    >>> from opgraph.core.registry import get_op
    >>> get_op(10009).name, get_op("Ssum").id
    ('Vplus', 20001)

Each kind is registered next to its kernel (:func:`tenscalc_op`). The
kernels follow TensCalc's own code (commit f127cb59):

* scalar functions 20001-20032: the C that TensCalc emits for each
  instruction (``lib/csparse/instructionsTableUTHash.c``, the writer of
  ``compile2C``), operand order and evaluation order included;
* tensor functions 10001-10030: the MATLAB code TensCalc emits for them
  (``lib/@csparse/writeMatlabInstructions.m``, with ``lib/clp.m``,
  ``lib/myeye.m``, ...) and the sizes of ``lib/@Tcalculus/Tcalculus.m``;
  ``Vlu``/``Vmldivide_*`` follow the C path (``sparsity_lu.m``,
  ``sparsity_mldivide_l1.m``, ``sparsity_mldivide_u.m``), whose factorisation
  is a tensor (the MATLAB path keeps a struct);
* ``scalars2ftensor``/``ftensor2scalars``: ``lib/@csparse/saveScalarized.m``.

Value conventions. A TensCalc tensor of size ``[]`` is a 0-d array, ``[n]``
a 1-d array, ``[m n]`` a 2-d array, and so on; element order is MATLAB's
column-major order wherever it matters (reshape, subscripts, the outputs of
``ftensor2scalars``). Parameters are MATLAB arrays as written in .cgc files:
``[1 -1]`` may arrive as shape ``(2,)`` or ``(1, 2)``, ``[]`` as ``(0, 0)``;
kernels read them in column-major order. Double constants arrive in MATLAB's
shape (a TensCalc ``[3]`` vector as ``(3, 1)``, a scalar as ``(1, 1)``):
kernels that know an operand's rank (from tprod indices, subscripts, ...)
reshape it, and elementwise kernels prefer the shape of an operand that is
not in MATLAB's normal form (``ndim >= 2`` without trailing singletons past
the second), since only a TensCalc-shaped value can have such a shape.

    >>> import numpy as np
    >>> vplus(np.array([[1, -1]]), np.array([1.0, 2.0]), np.array([[0.5], [0.5]]))
    array([0.5, 1.5])
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from opgraph.core.registry import Attr, OpDef, attr_int, register_op
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import OpTypeError
from opgraph.ops._common import write_out

FAMILY = "tenscalc"

Kernel = Callable[..., Any]

#: (id, name, TensCalc's description), as in lib/CGregistration.m (filled by the registrations below).
FUNCTIONS: list[tuple[int, str, str]] = []

KERNELS: dict[str, Kernel] = {}
"""NumPy kernels by function name, for the kinds opgraph can evaluate."""

NO_KERNEL: dict[str, str] = {}
"""Kinds registered without a kernel, with the reason."""

DBL_MAX = float(np.finfo(np.float64).max)


def _infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    n = attrs["nout"]
    if n < 0:
        raise OpTypeError(f"nout must be >= 0, got {n}")
    return (TensorType("float64", None),) * n


def _version(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> int:
    return 0  # TensCalc computes in double only


def _register(id_: int, name: str, desc: str, kernel: Kernel | None = None, *, reason: str = "") -> None:
    FUNCTIONS.append((id_, name, desc))
    if kernel is not None:
        KERNELS[name] = kernel
    else:
        NO_KERNEL[name] = reason
    register_op(OpDef(
        name=name, id=id_, arity=None, infer=_infer, version=_version,
        attrs={"nout": Attr(attr_int, 1, "number of outputs (from the file's record)")},
        kernel=kernel,
        family=FAMILY, doc=f"TensCalc {name}: {desc}",
    ))


def _finish(result: Any, out: Any) -> Any:
    """Results as float64 arrays, written into ``out`` when given."""
    if isinstance(result, tuple):
        result = tuple(np.asarray(r, dtype=np.float64) for r in result)
    else:
        result = np.asarray(result, dtype=np.float64)
    return write_out(result, out)


def tenscalc_op(id_: int, name: str, desc: str, *, multi: bool = False) -> Callable[[Kernel], Kernel]:
    """Register TensCalc kind ``name`` (id ``id_``) with the decorated function as its NumPy kernel.

    The function computes the result from the input arrays; the registered
    kernel adds the contract shared by every kind: the ``nout`` attribute
    (which must be 1 unless ``multi``, then the function receives it),
    float64 results and ``out=``.

    >>> from opgraph.core.registry import get_op
    >>> KERNELS["Ssum"] is ssum, get_op("Ssum").kernel_for(0) is ssum
    (True, True)
    >>> ssum(np.array([1, 1]), np.array(1.0), np.array(2.0), nout=2)
    Traceback (most recent call last):
    ...
    ValueError: Ssum has one output, the record says nout=2
    """

    def deco(fn: Kernel) -> Kernel:
        @functools.wraps(fn)
        def kernel(*arrays: Any, out: Any = None, nout: int = 1, **kw: Any) -> Any:
            if multi:
                return _finish(fn(*arrays, nout=nout, **kw), out)
            if nout != 1:
                raise ValueError(f"{name} has one output, the record says nout={nout}")
            return _finish(fn(*arrays, **kw), out)

        _register(id_, name, desc, kernel)
        return kernel

    return deco


# ================================================================ argument helpers
def _f64(a: Any) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def _sc(a: Any) -> np.ndarray:
    """A scalar operand: a size-1 array (a (1, 1) .cgc constant) becomes 0-d; others broadcast."""
    a = _f64(a)
    return a.reshape(()) if a.size == 1 and a.ndim else a


def _ints(p: Any, what: str = "parameter") -> np.ndarray:
    """A MATLAB integer parameter as a 1-d int64 array in column-major order."""
    a = np.asarray(p)
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise ValueError(f"{what} must hold integers, got {a.tolist()}")
    elif a.dtype.kind not in "iub":
        raise ValueError(f"{what} must be numeric, got dtype {a.dtype}")
    return a.ravel(order="F").astype(np.int64)


def _size(p: Any, what: str = "size") -> tuple[int, ...]:
    s = _ints(p, what)
    if np.any(s < 0):
        raise ValueError(f"{what} must be non-negative, got {s.tolist()}")
    return tuple(int(v) for v in s)


def _text(p: Any) -> str:
    """A 30001 string constant (raw characters as a uint8 array) as str."""
    if isinstance(p, str):
        return p
    a = np.asarray(p)
    if a.dtype.kind not in "iu":
        raise ValueError(f"expected a string constant (uint8 characters), got dtype {a.dtype}")
    return bytes(a.ravel(order="F").astype(np.uint8)).decode("latin-1")


def _is_colon(p: Any) -> bool:
    a = np.asarray(p)
    return a.dtype == np.uint8 and a.size == 1 and int(a.ravel()[0]) == ord(":")


def _strip(shape: Sequence[int]) -> tuple[int, ...]:
    s = list(shape)
    while s and s[-1] == 1:
        s.pop()
    return tuple(s)


def _matlab_form(shape: Sequence[int]) -> bool:
    """True for shapes MATLAB can give an array (ndim >= 2, no trailing 1 after the 2nd dim).

    >>> _matlab_form((3, 1)), _matlab_form((3,)), _matlab_form(()), _matlab_form((2, 3, 1))
    (True, False, False, False)
    """
    return len(shape) >= 2 and (len(shape) == 2 or shape[-1] != 1)


def as_rank(a: Any, ndim: int, what: str = "operand") -> np.ndarray:
    """View ``a`` with ``ndim`` dimensions by adding or dropping trailing singletons.

    This is how a MATLAB-shaped constant becomes the TensCalc tensor an op
    expects (column-major order is unchanged by trailing singletons).

    >>> as_rank(np.zeros((3, 1)), 1).shape, as_rank(np.zeros((1, 1)), 0).shape, as_rank(np.zeros(3), 2).shape
    ((3,), (), (3, 1))
    """
    a = _f64(a)
    if a.ndim == ndim:
        return a
    core = _strip(a.shape)
    if len(core) > ndim:
        raise ValueError(f"{what} of shape {a.shape} cannot be seen as a tensor with {ndim} dimension(s)")
    return a.reshape(core + (1,) * (ndim - len(core)))


def _same_size(arrays: Sequence[np.ndarray], what: str) -> list[np.ndarray]:
    """Operands of an elementwise TensCalc op (same size; size-1 operands broadcast as scalars)."""
    big = [a for a in arrays if a.size != 1]
    pool = big or list(arrays)
    target = next((a.shape for a in pool if not _matlab_form(a.shape)), pool[0].shape)
    out = []
    for a in arrays:
        if a.shape == target:
            out.append(a)
        elif a.size == 1 and big:
            out.append(a.reshape(()))
        elif _strip(a.shape) == _strip(target):
            out.append(a.reshape(target))
        else:
            raise ValueError(f"{what}: operands of sizes {a.shape} and {target} differ")
    return out


def _dims(p: Any, x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """A 1-based dimension list; ``x`` padded with singletons to have every listed dimension."""
    dims = _ints(p, "dimension")
    if np.any(dims < 1):
        raise ValueError(f"dimensions are 1-based, got {dims.tolist()}")
    nd = max([x.ndim, *dims.tolist()])
    x = x.reshape(x.shape + (1,) * (nd - x.ndim))
    return x, tuple(sorted({int(d) - 1 for d in dims}))


# ================================================================ scalar functions (C code of compile2C)
def _check_pairs(ops: Sequence[Any], name: str) -> None:
    if len(ops) % 2:
        raise ValueError(f"{name} takes operands in pairs, got {len(ops)}")


@tenscalc_op(20001, "Ssum", "sum(parameters.*operands), parameters = +1/-1 for addition/subtraction of each operand")
def ssum(signs: Any, *operands: Any) -> np.ndarray:
    """``+a1-a2+...``: a positive sign adds, any other subtracts, left to right (C ``I_sum``).

    >>> ssum(np.array([1, -1, 1]), np.array(1.0), np.array(2.0), np.array(4.0))
    array(3.)
    """
    s = _ints(signs, "signs")
    if len(s) != len(operands) or not operands:
        raise ValueError(f"Ssum has {len(s)} signs for {len(operands)} operands")
    acc: Any = None
    for sign, a in zip(s, operands, strict=True):
        a = _sc(a)
        acc = (a if sign > 0 else -a) if acc is None else (acc + a if sign > 0 else acc - a)
    return acc


@tenscalc_op(20002, "Ssumprod",
             "sum(prod(operands,1)) = a1*a2*...*am+b1*b2*...*bm+..., parameters = [m; # sums]")
def ssumprod(params: Any, *operands: Any) -> np.ndarray:
    """Sum of ``s`` products of ``m`` consecutive operands, ``params = [m, s]`` (C ``I_sumprod``).

    >>> ssumprod(np.array([2, 2]), *map(np.array, [1.0, 2.0, 3.0, 4.0]))
    array(14.)
    """
    p = _ints(params)
    if len(p) != 2 or p[0] < 1 or p[1] < 1 or p[0] * p[1] != len(operands):
        raise ValueError(f"Ssumprod parameters {p.tolist()} do not fit {len(operands)} operands")
    m = int(p[0])
    acc: Any = None
    for j in range(int(p[1])):
        prod = _sc(operands[j * m])
        for a in operands[j * m + 1:(j + 1) * m]:
            prod = prod * _sc(a)
        acc = prod if acc is None else acc + prod
    return acc


def _dot(ops: Sequence[Any]) -> Any:
    """``a1*b1+a2*b2+...`` left to right."""
    acc: Any = None
    for i in range(0, len(ops), 2):
        t = _sc(ops[i]) * _sc(ops[i + 1])
        acc = t if acc is None else acc + t
    return acc


@tenscalc_op(20006, "Sminus_dot", "-a1*b1-a2*b2-..., operands = a1,b1,a2,b2,...")
def sminus_dot(*ops: Any) -> np.ndarray:
    """``-(a1*b1+a2*b2+...)`` (C ``I_minus_dot``).

    >>> sminus_dot(*map(np.array, [1.0, 2.0, 3.0, 4.0]))
    array(-14.)
    """
    _check_pairs(ops, "Sminus_dot")
    return -_dot(ops)


@tenscalc_op(20007, "Sminus_dot_div", "(-a1*b1-a2*b2-...)/a0, operands = a0,a1,b1,a2,b2,...")
def sminus_dot_div(a0: Any, *ops: Any) -> np.ndarray:
    """``-(a1*b1+...)/a0``: the first operand is the divisor (C ``I_minus_dot_div``).

    >>> sminus_dot_div(*map(np.array, [2.0, 1.0, 2.0, 3.0, 4.0]))
    array(-7.)
    """
    _check_pairs(ops, "Sminus_dot_div")
    with np.errstate(all="ignore"):
        return -_dot(ops) / _sc(a0)


@tenscalc_op(20008, "Splus_minus_dot", "a0-a1*b1-a2*b2-..., operands = a0,a1,b1,a2,b2,...")
def splus_minus_dot(a0: Any, *ops: Any) -> np.ndarray:
    """``a0-(a1*b1+...)`` (C ``I_plus_minus_dot``).

    >>> splus_minus_dot(*map(np.array, [20.0, 1.0, 2.0, 3.0, 4.0]))
    array(6.)
    """
    _check_pairs(ops, "Splus_minus_dot")
    return _sc(a0) - _dot(ops)


@tenscalc_op(20009, "Splus_sqr", "a1^2+a2^2+...")
def splus_sqr(*ops: Any) -> np.ndarray:
    """``a1*a1+a2*a2+...`` (C ``I_plus_sqr``).

    >>> splus_sqr(np.array(3.0), np.array(4.0))
    array(25.)
    """
    return _dot([a for a in ops for _ in (0, 1)])


@tenscalc_op(20010, "Splus_minus_dot_div", "(a0-a1*b1-a2*b2-...)/b0, operands = a0,b0,a1,b1,a2,b2,...")
def splus_minus_dot_div(a0: Any, b0: Any, *ops: Any) -> np.ndarray:
    """``(a0-(a1*b1+...))/b0``: operands ``a0, b0, a1, b1, ...`` (C ``I_plus_minus_dot_div``).

    >>> splus_minus_dot_div(*map(np.array, [20.0, 2.0, 1.0, 2.0, 3.0, 4.0]))
    array(3.)
    """
    _check_pairs(ops, "Splus_minus_dot_div")
    with np.errstate(all="ignore"):
        return (_sc(a0) - _dot(ops)) / _sc(b0)


def _running(first: Any, ops: Sequence[Any], keep_new: Callable[[Any, Any], Any]) -> Any:
    """C's ``m=first; if (keep_new(m, a)) m=a;`` over the operands (NaN handling included)."""
    m = first
    for a in ops:
        a = _sc(a)
        m = np.where(keep_new(m, a), a, m)
    return m


@tenscalc_op(20011, "Smin", "min(a1,a2,...)")
def smin(*ops: Any) -> np.ndarray:
    """``m=a1; if (m>ai) m=ai`` (C ``I_min``; a NaN ``a1`` stays, later NaNs are skipped).

    >>> smin(np.array(3.0), np.array(-1.0), np.array(2.0))
    array(-1.)
    """
    return _running(_sc(ops[0]), ops[1:], np.greater)


@tenscalc_op(20012, "Smin0", "min(0,a1,a2,...)")
def smin0(*ops: Any) -> np.ndarray:
    """``min(0,a1,...)`` as ``m=0; if (m>ai) m=ai`` (C ``I_min0``).

    >>> smin0(np.array(3.0), np.array(2.0))
    array(0.)
    """
    return _running(np.float64(0.0), ops, np.greater)


@tenscalc_op(20013, "Smax", "max(a1,a2,...)")
def smax(*ops: Any) -> np.ndarray:
    """``m=a1; if (m<ai) m=ai`` (C ``I_max``).

    >>> smax(np.array(3.0), np.array(-1.0), np.array(5.0))
    array(5.)
    """
    return _running(_sc(ops[0]), ops[1:], np.less)


@tenscalc_op(20014, "Smax0", "max(0,a1,a2,...)")
def smax0(*ops: Any) -> np.ndarray:
    """``max(0,a1,...)`` as ``m=0; if (m<ai) m=ai`` (C ``I_max0``).

    >>> smax0(np.array(-3.0), np.array(-2.0))
    array(0.)
    """
    return _running(np.float64(0.0), ops, np.less)


@tenscalc_op(20015, "Smax_abs", "max(|a1|,|a2|,...)")
def smax_abs(*ops: Any) -> np.ndarray:
    """``m=|a1|; if (m<|ai|) m=|ai|`` (C ``I_max_abs``).

    >>> smax_abs(np.array(3.0), np.array(-5.0))
    array(5.)
    """
    return _running(np.abs(_sc(ops[0])), [np.abs(_sc(a)) for a in ops[1:]], np.less)


@tenscalc_op(20016, "Sclp", "largest c>=0 such that ai + c bi >= 0, operands = a1,b1,...,an,bn")
def sclp(*ops: Any) -> np.ndarray:
    """``m=DBL_MAX; for each pair: if (bi<0) {x=-ai/bi; if (m>x) m=x;}`` (C ``I_clp``).

    The result is DBL_MAX (not inf) when no ``bi`` is negative.

    >>> sclp(np.array(1.0), np.array(-2.0), np.array(3.0), np.array(1.0))
    array(0.5)
    >>> float(sclp(np.array(1.0), np.array(2.0))) == DBL_MAX
    True
    """
    _check_pairs(ops, "Sclp")
    m: Any = np.float64(DBL_MAX)
    with np.errstate(all="ignore"):
        for i in range(0, len(ops), 2):
            a, b = _sc(ops[i]), _sc(ops[i + 1])
            x = -a / b
            m = np.where((b < 0) & (m > x), x, m)
    return m


@tenscalc_op(20003, "Sinv", "1/denominator")
def sinv(a: Any) -> np.ndarray:
    """``1/a`` (C ``I_inv``).

    >>> sinv(np.array(4.0))
    array(0.25)
    """
    with np.errstate(all="ignore"):
        return 1.0 / _sc(a)


@tenscalc_op(20004, "Sminus_inv_sqr", "-1/denominator^2")
def sminus_inv_sqr(a: Any) -> np.ndarray:
    """``-1/(a*a)`` (C ``I_minus_inv_sqr``).

    >>> sminus_inv_sqr(np.array(2.0))
    array(-0.25)
    """
    a = _sc(a)
    with np.errstate(all="ignore"):
        return -1.0 / (a * a)


@tenscalc_op(20005, "Sdiv", "numerator/denominator")
def sdiv(a: Any, b: Any) -> np.ndarray:
    """``a/b`` (C ``I_div``).

    >>> sdiv(np.array(3.0), np.array(4.0))
    array(0.75)
    """
    with np.errstate(all="ignore"):
        return _sc(a) / _sc(b)


def _unary(id_: int, name: str, desc: str, c_code: str, fn: Callable[[np.ndarray], Any]) -> Kernel:
    """Register a one-operand scalar kind computing ``fn`` (C code ``c_code``).

    >>> KERNELS["SDatan"](np.array(1.0))
    array(0.5)
    """

    def compute(a: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(_sc(a))

    compute.__doc__ = f"TensCalc {name}: ``{c_code}`` (C code of compile2C)."
    compute.__name__ = compute.__qualname__ = name.lower()
    return tenscalc_op(id_, name, desc)(compute)


def _datan(a: np.ndarray) -> Any:
    return 1.0 / (1.0 + a * a)


def _ddatan(a: np.ndarray) -> Any:
    d = 1.0 + a * a
    return -2.0 * a / d / d


_unary(20017, "Sexp", "exp(a1)", "exp(a)", np.exp)
_unary(20018, "Slog", "log(a1)", "log(a)", np.log)
_unary(20019, "Scos", "cos(a1)", "cos(a)", np.cos)
_unary(20020, "Sminus_cos", "-cos(a1)", "-cos(a)", lambda a: -np.cos(a))
_unary(20021, "Ssin", "sin(a1)", "sin(a)", np.sin)
_unary(20022, "Sminus_sin", "-sin(a1)", "-sin(a)", lambda a: -np.sin(a))
_unary(20023, "Sabs", "abs(a1)", "fabs(a)", np.abs)
_unary(20024, "Ssqrt", "sqrt(a1)", "sqrt(a)", np.sqrt)
_unary(20025, "SDsqrt", ".5/sqrt(a1)", ".5*pow(a,-.5)", lambda a: 0.5 * np.power(a, -0.5))
_unary(20026, "SDDsqrt", "-.25/sqrt(a1)^3", "-.25*pow(a,-1.5)", lambda a: -0.25 * np.power(a, -1.5))
_unary(20027, "Ssqr", "a1^2", "a*a", lambda a: a * a)
_unary(20028, "S2times", "2*a1", "2*a", lambda a: 2.0 * a)
_unary(20029, "S2", "2 (operand ignored)", "2", lambda a: np.full(np.shape(a), 2.0))
_unary(20030, "Satan", "atan(a1)", "atan(a)", np.arctan)
_unary(20031, "SDatan", "1/(1+a1^2)", "1/(1+a*a)", _datan)
_unary(20032, "SDDatan", "-2*a1/(1+a1^2)^2", "-2*a/(1+a*a)/(1+a*a)", _ddatan)


# ================================================================ tensor <-> scalars (saveScalarized.m)
def subscripts_matrix(subscripts: Any, nnz: int) -> np.ndarray:
    """The ``[ndim x nnz]`` 1-based subscripts of a ``scalars2ftensor`` as a 2-d int64 array.

    saveScalarized writes them as 20002 (shape ``(ndim, nnz)``), as 20001
    when ``nnz == 1`` (a 1-d ``(ndim,)`` array, empty for a scalar).

    >>> subscripts_matrix(np.array([2, 3]), 1).tolist(), subscripts_matrix(np.array([[1, 2, 3]]), 3).shape
    ([[2], [3]], (1, 3))
    """
    s = np.asarray(subscripts)
    if s.ndim == 1:
        if nnz == 1:
            s = s.reshape(-1, 1)
        elif s.size == nnz:
            s = s.reshape(1, -1)
        elif s.size == 0 and nnz == 0:
            s = s.reshape(0, 0)
        else:
            raise ValueError(f"subscripts of shape {s.shape} do not fit {nnz} values")
    elif s.ndim == 2:
        if s.shape[1] != nnz and not (s.size == 0 and nnz <= 1):
            raise ValueError(f"subscripts of shape {s.shape} do not fit {nnz} values")
    else:
        raise ValueError(f"subscripts must be a matrix, got shape {s.shape}")
    return _ints(s, "subscripts").reshape(s.shape, order="F")


@tenscalc_op(30001, "scalars2ftensor", "tensor = f(subscripts, a1, a2, ...): scalars into a full tensor")
def scalars2ftensor(subscripts: Any, *values: Any, shape: Sequence[int] | None = None) -> np.ndarray:
    """A full tensor whose entry at 1-based column ``k`` of ``subscripts`` is ``values[k]``; other entries 0.

    The files do not store the tensor's size: it is ``shape`` when given,
    else the largest subscript in each dimension (exact for a get whose
    last entry along every dimension is structurally nonzero, always the
    case for full tensors). A scalar has ``ndim == 0`` (empty subscripts).

    >>> scalars2ftensor(np.array([[1, 2], [2, 1]]), np.array(5.0), np.array(7.0))
    array([[0., 5.],
           [7., 0.]])
    >>> scalars2ftensor(np.array([[1]]), np.array(5.0), shape=(3,))
    array([5., 0., 0.])
    >>> scalars2ftensor(np.zeros(0, np.int64), np.array(4.0))
    array(4.)
    """
    subs = subscripts_matrix(subscripts, len(values))
    ndim = subs.shape[0]
    if ndim == 0:
        return _f64(values[0]).reshape(()) if values else np.float64(0.0)
    if np.any(subs < 1):
        raise ValueError("subscripts are 1-based: found one < 1")
    top = subs.max(axis=1) if subs.shape[1] else np.zeros(ndim, np.int64)
    if shape is None:
        shape = tuple(int(t) for t in top)
    shape = tuple(int(d) for d in shape)
    if len(shape) != ndim or any(t > d for t, d in zip(top, shape, strict=True)):
        raise ValueError(f"subscripts up to {top.tolist()} do not fit a tensor of size {list(shape)}")
    full = np.zeros(shape, dtype=np.float64)
    if values:
        full[tuple(subs - 1)] = [float(_f64(v).reshape(())) for v in values]
    return full


@tenscalc_op(30002, "ftensor2scalars", "[a1, a2, ...] = f(tensor): a full tensor into scalars (column-major)",
             multi=True)
def ftensor2scalars(tensor: Any, *, nout: int) -> Any:
    """The ``nout`` entries of a full tensor, as 0-d arrays in MATLAB column-major order.

    >>> ftensor2scalars(np.array([[1.0, 2.0], [3.0, 4.0]]), nout=4)
    (array(1.), array(3.), array(2.), array(4.))
    """
    flat = _f64(tensor).ravel(order="F")
    if flat.size != nout:
        raise ValueError(f"a tensor with {flat.size} entries cannot fill {nout} outputs")
    outs = tuple(np.array(v) for v in flat)
    return outs[0] if nout == 1 else outs


# ================================================================ tensor functions (writeMatlabInstructions.m)
@tenscalc_op(10001, "Vzeros", "Tzeros(size)")
def vzeros(osize: Any) -> np.ndarray:
    """A tensor of zeros of TensCalc size ``osize`` (``[]`` gives a scalar).

    >>> vzeros(np.array([[2, 1]])).shape, vzeros(np.zeros((0, 0), np.int64)).shape
    ((2, 1), ())
    """
    return np.zeros(_size(osize))


@tenscalc_op(10002, "Vones", "Tones(size)")
def vones(osize: Any) -> np.ndarray:
    """A tensor of ones of TensCalc size ``osize``.

    >>> vones(np.array([3]))
    array([1., 1., 1.])
    """
    return np.ones(_size(osize))


@tenscalc_op(10003, "Veye", "Teye(size)")
def veye(osize: Any) -> np.ndarray:
    """TensCalc's identity tensor (``lib/myeye.m``): size ``[s, s]``, 1 where both halves of the subscript agree.

    >>> veye(np.array([[2, 2]]))
    array([[1., 0.],
           [0., 1.]])
    >>> veye(np.array([[2, 3, 2, 3]])).shape
    (2, 3, 2, 3)
    """
    size = _size(osize)
    half = len(size) // 2
    if len(size) % 2 or size[:half] != size[half:]:
        raise ValueError(f"Teye needs a size [s s], got {list(size)}")
    if not size:
        return np.float64(1.0)
    n = int(np.prod(size[:half]))
    return np.eye(n).reshape(size, order="F")


@tenscalc_op(10004, "Vsubsref", "subsref(i1,i2,...,a)")
def vsubsref(*args: Any) -> np.ndarray:
    """``a(i1,i2,...)`` with 1-based index vectors (``':'`` for all); the result has one dimension per index.

    >>> a = np.arange(6.0).reshape(2, 3)
    >>> vsubsref(np.array([[2.0]]), np.array([[3.0, 1.0]]), a)
    array([[5., 3.]])
    >>> vsubsref(np.frombuffer(b":", np.uint8), np.array([2.0]), a)
    array([[1.],
           [4.]])
    """
    *index, a = args
    x = as_rank(a, len(index), "subsref operand")
    subs = []
    for k, ix in enumerate(index):
        if _is_colon(ix):
            subs.append(np.arange(x.shape[k]))
            continue
        i = _ints(ix, f"index {k + 1}")
        if np.any(i < 1) or np.any(i > x.shape[k]):
            raise IndexError(f"index {k + 1} {i.tolist()} outside 1..{x.shape[k]}")
        subs.append(i - 1)
    return x[np.ix_(*subs)] if subs else x.copy()


@tenscalc_op(10005, "Vrepmat", "repmat(size,a)")
def vrepmat(reps: Any, a: Any) -> np.ndarray:
    """``repmat(a, reps)``: ``a`` (seen with ``len(reps)`` dimensions, a vector as a column) tiled.

    >>> vrepmat(np.array([[1, 2]]), np.array([1.0, 2.0]))
    array([[1., 1.],
           [2., 2.]])
    """
    r = _size(reps, "repmat size")
    return np.tile(as_rank(a, len(r), "repmat operand"), r)


@tenscalc_op(10006, "Vcat", "cat(dim,a,b,...)")
def vcat(dim: Any, *operands: Any) -> np.ndarray:
    """``cat(dim, a, b, ...)`` along the 1-based ``dim``; operands get trailing singletons as in Tcalculus/cat.

    >>> vcat(np.array([1]), np.array([1.0, 2.0]), np.array([3.0]))
    array([1., 2., 3.])
    >>> vcat(np.array([2]), np.array([1.0, 2.0]), np.array([[3.0], [4.0]]))
    array([[1., 3.],
           [2., 4.]])
    """
    d = _ints(dim, "dim")
    if len(d) != 1 or d[0] < 1:
        raise ValueError(f"cat dimension must be one integer >= 1, got {d.tolist()}")
    arrs = [_f64(a) for a in operands]
    if not arrs:
        raise ValueError("cat of nothing")
    native = [a.ndim for a in arrs if not _matlab_form(a.shape)]
    nd = max([int(d[0]), *(native or [a.ndim for a in arrs])])
    arrs = [as_rank(a, nd, "cat operand") for a in arrs]
    keep = [a for a in arrs if a.size] or arrs[:1]
    return np.concatenate(keep, axis=int(d[0]) - 1)


@tenscalc_op(10007, "Vreshape", "reshape(size,a)")
def vreshape(osize: Any, a: Any) -> np.ndarray:
    """``reshape(a, osize)`` in MATLAB's column-major order.

    >>> vreshape(np.array([[2, 2]]), np.array([1.0, 2.0, 3.0, 4.0]))
    array([[1., 3.],
           [2., 4.]])
    """
    return _f64(a).reshape(_size(osize), order="F")


@tenscalc_op(10008, "Vfull", "full(a)")
def vfull(a: Any) -> np.ndarray:
    """``full(a)``: the same values (NumPy arrays are always full).

    >>> vfull(np.array([1.0, 0.0]))
    array([1., 0.])
    """
    return _f64(a).copy()


@tenscalc_op(10009, "Vplus", "plus(signs,a,b,...)")
def vplus(signs: Any, *operands: Any) -> np.ndarray:
    """``+a-b+...``: a positive sign adds, any other subtracts, left to right (``I_Mplus``).

    >>> vplus(np.array([1, -1]), np.array([1.0, 2.0]), np.array([0.5, 0.5]))
    array([0.5, 1.5])
    """
    s = _ints(signs, "signs")
    if len(s) != len(operands) or not operands:
        raise ValueError(f"Vplus has {len(s)} signs for {len(operands)} operands")
    arrs = _same_size([_f64(a) for a in operands], "Vplus")
    acc: Any = None
    for sign, a in zip(s, arrs, strict=True):
        acc = (a if sign > 0 else -a) if acc is None else (acc + a if sign > 0 else acc - a)
    return acc


def _tprod(osize: Any, sumsizes: Any, *pairs: Any) -> np.ndarray:
    osz, ssz = _size(osize, "tprod size"), _size(sumsizes, "tprod sum sizes")
    if not pairs or len(pairs) % 2:
        raise ValueError(f"tprod takes (tensor, indices) pairs, got {len(pairs)} inputs")
    if len(osz) + len(ssz) > 52:
        raise ValueError("tprod with more than 52 indices")
    args: list[Any] = []
    for k in range(0, len(pairs), 2):
        idx = _ints(pairs[k + 1], "tprod indices")
        x = as_rank(pairs[k], len(idx), "tprod operand")
        labels = []
        for d, i in enumerate(idx.tolist()):
            if i > 0 and i <= len(osz):
                label, want = i - 1, osz[i - 1]
            elif i < 0 and -i <= len(ssz):
                label, want = len(osz) - i - 1, ssz[-i - 1]
            else:
                raise ValueError(f"tprod index {i} outside size {list(osz)} / sums {list(ssz)}")
            if x.shape[d] != want:
                raise ValueError(f"tprod operand {k // 2 + 1} has size {x.shape[d]} in dimension {d + 1}, "
                                 f"index {i} needs {want}")
            labels.append(label)
        args += [x, labels]
    used = {lab for k in range(1, len(args), 2) for lab in args[k]}
    if not set(range(len(osz))) <= used:
        raise ValueError("tprod has output dimensions that no operand indexes")
    return np.einsum(*args, list(range(len(osz))), optimize=len(pairs) > 4)


@tenscalc_op(10010, "Vtprod", "tprod(size,sumsize,a,ia,b,ib,...)")
def vtprod(osize: Any, sumsizes: Any, *pairs: Any) -> np.ndarray:
    """TensCalc's tensor product (``lib/@Tcalculus/tprod.m``, ``lib/mytprod.m``).

    ``y(i1,...,in) = sum over j1,...,jm of a(...)*b(...)*...``: index ``k > 0``
    of an operand is output dimension ``k``, index ``-k`` the ``k``-th summed
    one; repeated indices take diagonals. ``osize``/``sumsizes`` are the
    sizes of the output and of the sums.

    >>> A, x = np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([1.0, 1.0])
    >>> vtprod(np.array([2]), np.array([2]), A, np.array([[1, -1]]), x, np.array([-1]))
    array([3., 7.])
    >>> vtprod(np.zeros((0, 0), np.int64), np.array([2]), x, np.array([-1]), x, np.array([-1]))
    array(2.)
    """
    return _tprod(osize, sumsizes, *pairs)


NO_KERNEL_TPROD_MATLAB = (
    "no TensCalc writer emits it (saveVectorized.m has no case for 'tprod_matlab' and stops with 'missing "
    "type'), so the order of its size/index inputs is not defined; its values would be Vtprod's (mytprod)")
_register(10011, "Vtprod_matlab", "tprod_matlab(...)", reason=NO_KERNEL_TPROD_MATLAB)


@tenscalc_op(10012, "Vnorm2", "norm2(a)")
def vnorm2(a: Any) -> np.ndarray:
    """``sum(a(:).^2)``, a scalar.

    >>> vnorm2(np.array([[3.0], [4.0]]))
    array(25.)
    """
    x = _f64(a).ravel(order="F")
    return np.sum(x * x)


@tenscalc_op(10013, "Vnorminf", "norminf(a)")
def vnorminf(a: Any) -> np.ndarray:
    """``max(abs(a(:)))``, a scalar (MATLAB's max skips NaN).

    >>> vnorminf(np.array([1.0, -5.0, 2.0]))
    array(5.)
    """
    return np.fmax.reduce(np.abs(_f64(a)).ravel())


@tenscalc_op(10014, "Vmin", "min(dim,a,b,...)")
def vmin(dims: Any, a: Any) -> np.ndarray:
    """``min(a,[],dims)`` with the reduced dimensions removed (MATLAB's min skips NaN).

    >>> vmin(np.array([2]), np.array([[1.0, 5.0], [7.0, 3.0]]))
    array([1., 3.])
    """
    x, axes = _dims(dims, _f64(a))
    return np.fmin.reduce(x, axis=axes)


@tenscalc_op(10015, "Vmax", "max(dim,a,b,...)")
def vmax(dims: Any, a: Any) -> np.ndarray:
    """``max(a,[],dims)`` with the reduced dimensions removed (MATLAB's max skips NaN).

    >>> vmax(np.array([1]), np.array([[1.0, 5.0], [7.0, 3.0]]))
    array([7., 5.])
    """
    x, axes = _dims(dims, _f64(a))
    return np.fmax.reduce(x, axis=axes)


@tenscalc_op(10016, "Vall", "all(dim,a,b,...)")
def vall(dims: Any, a: Any) -> np.ndarray:
    """``all(a,dims)`` as 1.0/0.0 with the reduced dimensions removed (NaN counts as nonzero).

    >>> vall(np.array([1]), np.array([[1.0, 0.0], [2.0, 3.0]]))
    array([1., 0.])
    """
    x, axes = _dims(dims, _f64(a))
    return np.all(x != 0, axis=axes)


@tenscalc_op(10017, "Vany", "any(dim,a,b,...)")
def vany(dims: Any, a: Any) -> np.ndarray:
    """``any(a,dims)`` as 1.0/0.0 with the reduced dimensions removed.

    >>> vany(np.array([[1, 2]]), np.array([[0.0, 0.0], [2.0, 0.0]]))
    array(1.)
    """
    x, axes = _dims(dims, _f64(a))
    return np.any(x != 0, axis=axes)


@tenscalc_op(10018, "Vabs", "abs(a)")
def vabs(a: Any) -> np.ndarray:
    """``abs(a)``.

    >>> vabs(np.array([-1.0, 2.0]))
    array([1., 2.])
    """
    return np.abs(_f64(a))


@tenscalc_op(10019, "Vclp", "clp(a,b)")
def vclp(a: Any, b: Any) -> np.ndarray:
    """``lib/clp.m``: ``min(-a(k)./b(k))`` over the entries with ``b(k)<0``, ``inf`` if there are none.

    >>> vclp(np.array([1.0, 3.0]), np.array([-2.0, 1.0]))
    array(0.5)
    >>> vclp(np.array([1.0]), np.array([1.0]))
    array(inf)
    """
    x, dx = _same_size([_f64(a), _f64(b)], "Vclp")
    x, dx = np.broadcast_arrays(x, dx)
    k = dx < 0
    if not np.any(k):
        return np.float64(np.inf)
    with np.errstate(all="ignore"):
        return np.fmin.reduce(-x[k] / dx[k])


# ---------------------------------------------------------------- Vcompose: a parser for TensCalc's function strings
_HEADER = re.compile(r"\s*@\s*\(\s*([A-Za-z_]\w*)\s*\)(.*)\Z", re.S)
_TOKEN = re.compile(r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)|(?P<name>[A-Za-z_]\w*)"
                    r"|(?P<op>\.\*|\./|\.\^|[-+*/^(),]))")


def _round(x: np.ndarray) -> Any:
    # MATLAB's (and C's) round: halves away from zero; x - trunc(x) is exact.
    t = np.trunc(x)
    return t + np.where(np.abs(x - t) >= 0.5, np.sign(x), 0.0)


#: The functions a compose string may call: MATLAB semantics on real doubles.
COMPOSE_FUNCTIONS: dict[str, Callable[[np.ndarray], Any]] = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "atan": np.arctan,
    "abs": np.abs, "sign": np.sign, "round": _round, "ceil": np.ceil, "floor": np.floor,
    "relu": lambda x: np.where(x > 0, x, 0.0),          # lib/relu.m: max(x,0) (NaN -> 0)
    "heaviside": lambda x: np.heaviside(x, 0.5),        # 0 -> .5, NaN -> NaN
    "srelu": lambda x: np.log(1 + np.exp(x)),           # lib/srelu.m
    "sqr": lambda x: x * x,                             # lib/sqr.m: x.^2
    "cube": lambda x: x * x * x,                        # lib/cube.m: x.^3
}

#: The function strings TensCalc's code generators recognise for compose
#: (computeScalarInstructions.m and writeMatlabInstructions.m); all parse.
TENSCALC_COMPOSE_STRINGS: tuple[str, ...] = (
    "@(x__)log(x__)", "@(x__)1./x__", "@(x__)-1./x__.^2", "@(x__)2./x__.^3", "@(x__)exp(x__)",
    "@(x__)sin(x__)", "@(x__)-sin(x__)", "@(x__)cos(x__)", "@(x__)-cos(x__)",
    "@(x__)round(x__)", "@(x__)ceil(x__)", "@(x__)floor(x__)", "@(x__)abs(x__)", "@(x__)sign(x__)",
    "@(x__)sqrt(x__)", "@(x__).5./sqrt(x__)", "@(x__)-.25./x__.^1.5",
    "@(x__)x__.^2", "@(x__)2*x__", "@(x__)2*ones(size(x__))", "@(x__)x__.^3", "@(x__)3*x__.^2", "@(x__)6*x__",
    "@(x__)atan(x__)", "@(x__)1./(1+x__.^2)", "@(x__)-2*x__./(1+x__.^2).^2",
    "@(x__)log(1+x__)/log(2)", "@(x__)1./(1+x__)/log(2)", "@(x__)-1./(1+x__).^2",
    "@(x__)log(1+exp(x__))", "@(x__)1./(1+exp(-x__))", "@(x__)1./(2+exp(-x__)+exp(x__))",
    "@(x__)relu(x__)", "@(x__)heaviside(x__)", "@(x__)zeros(size(x__))",
)


class _Parser:
    """Recursive descent over MATLAB's precedence: ``+ -`` < ``* / .* ./`` < unary ``- +`` < ``^ .^`` (left)."""

    def __init__(self, text: str, var: str) -> None:
        self.toks: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None:
                raise ValueError(f"unexpected character {text[pos:].lstrip()[:1]!r}")
            kind = m.lastgroup or "op"
            self.toks.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0
        self.var = var

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.toks):
            raise ValueError("unexpected end of expression")
        tok = self.toks[self.i]
        if want is not None and tok[1] != want:
            raise ValueError(f"expected {want!r}, found {tok[1]!r}")
        self.i += 1
        return tok

    def parse(self) -> tuple[Any, ...]:
        node = self.sum()
        if self.i != len(self.toks):
            raise ValueError(f"unexpected {self.toks[self.i][1]!r}")
        return node

    def sum(self) -> tuple[Any, ...]:
        node = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()[1]
            node = ("bin", op, node, self.product())
        return node

    def product(self) -> tuple[Any, ...]:
        node = self.unary()
        while self.peek() in ("*", "/", ".*", "./"):
            op = self.take()[1].lstrip(".")
            node = ("bin", op, node, self.unary())
        return node

    def unary(self) -> tuple[Any, ...]:
        if self.peek() in ("-", "+"):
            op = self.take()[1]
            operand = self.unary()
            return ("neg", operand) if op == "-" else operand
        return self.power()

    def power(self) -> tuple[Any, ...]:
        node = self.primary()
        while self.peek() in ("^", ".^"):
            self.take()
            sign = 1
            while self.peek() in ("-", "+"):  # MATLAB accepts 2^-1
                sign *= -1 if self.take()[1] == "-" else 1
            exponent = self.primary()
            node = ("bin", "^", node, exponent if sign > 0 else ("neg", exponent))
        return node

    def primary(self) -> tuple[Any, ...]:
        kind, text = self.take()
        if kind == "num":
            return ("num", float(text))
        if text == "(":
            node = self.sum()
            self.take(")")
            return node
        if kind != "name":
            raise ValueError(f"unexpected {text!r}")
        if text == self.var:
            return ("var",)
        if text in ("ones", "zeros"):
            self.take("(")
            self.take("size")
            self.take("(")
            node = self.sum()
            self.take(")")
            self.take(")")
            return ("fill", 1.0 if text == "ones" else 0.0, node)
        if text not in COMPOSE_FUNCTIONS:
            raise ValueError(f"function {text!r} is not one compose strings may call")
        self.take("(")
        node = self.sum()
        self.take(")")
        return ("call", text, node)


@functools.lru_cache(maxsize=256)
def parse_compose(fun: str) -> tuple[Any, ...]:
    """Parse a TensCalc compose function string (``@(x)expr`` or a bare function name) into a tree.

    Only numbers, the bound variable, ``+ - * / .* ./ ^ .^``, parentheses,
    :data:`COMPOSE_FUNCTIONS` and ``ones/zeros(size(...))`` are accepted;
    nothing is ever evaluated as code. Raises ValueError otherwise.

    >>> parse_compose("@(x__)-1./x__.^2")
    ('bin', '/', ('neg', ('num', 1.0)), ('bin', '^', ('var',), ('num', 2.0)))
    >>> parse_compose("@(x) eval(x)")
    Traceback (most recent call last):
    ...
    ValueError: compose function '@(x) eval(x)': function 'eval' is not one compose strings may call
    """
    if len(fun) > 1000:
        raise ValueError("compose function string too long")
    try:
        m = _HEADER.match(fun)
        if m is None:
            name = fun.strip()
            if name not in COMPOSE_FUNCTIONS:
                raise ValueError("not '@(var)expression' nor a known function name")
            return ("call", name, ("var",))
        return _Parser(m.group(2), m.group(1)).parse()
    except ValueError as exc:
        raise ValueError(f"compose function {fun!r}: {exc}") from None


def _evaluate(node: tuple[Any, ...], x: np.ndarray) -> Any:
    kind = node[0]
    if kind == "num":
        return np.float64(node[1])
    if kind == "var":
        return x
    if kind == "neg":
        return -_evaluate(node[1], x)
    if kind == "call":
        return COMPOSE_FUNCTIONS[node[1]](np.asarray(_evaluate(node[2], x), dtype=np.float64))
    if kind == "fill":
        return np.full(np.shape(_evaluate(node[2], x)), node[1])
    op, a, b = node[1], _evaluate(node[2], x), _evaluate(node[3], x)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b
    return np.power(a, b)


def compose_apply(fun: str, x: Any) -> np.ndarray:
    """Apply a compose function string to every entry of ``x`` (see :func:`parse_compose`).

    Operators act entry by entry (compose applies ``fun`` to each scalar).
    Where MATLAB would return complex numbers (``sqrt``/``log`` of a negative
    number) the result is NaN, as in TensCalc's C code.

    >>> compose_apply("@(x__)1./(1+x__.^2)", np.array([0.0, 1.0]))
    array([1. , 0.5])
    """
    x = _f64(x)
    with np.errstate(all="ignore"):
        y = _evaluate(parse_compose(fun), x)
    return np.broadcast_to(np.asarray(y, dtype=np.float64), x.shape).copy()


@tenscalc_op(10020, "Vcompose", "compose(fun,a)")
def vcompose(fun: Any, a: Any) -> np.ndarray:
    """``fun`` (a string constant such as ``@(x__)exp(x__)``) applied to every entry of ``a``.

    >>> vcompose(np.frombuffer(b"@(x__)x__.^2", np.uint8), np.array([1.0, -3.0]))
    array([1., 9.])
    """
    return compose_apply(_text(fun), a)


# ---------------------------------------------------------------- LU (the C path: sparsity_lu.m and friends)
@tenscalc_op(10021, "Vlu", "lu(a)")
def vlu(a: Any) -> np.ndarray:
    """The LU factorisation of a square matrix, packed: unit-diagonal ``L`` below, ``U`` on and above the diagonal.

    TensCalc's C path eliminates column by column with fixed pivots
    (``sparsity_lu.m``: ``LU(r,c)/=LU(p,c); LU(r,j)-=LU(r,c)*LU(p,j)``); its
    row/column permutations are chosen when code is generated and are not
    stored in .cg files, so opgraph uses none. The value is only meant for
    ``Vmldivide_l1``/``Vmldivide_u`` (as in TensCalc), whose composition is ``a\\b``.

    >>> vlu(np.array([[2.0, 1.0], [4.0, 5.0]]))
    array([[2., 1.],
           [2., 3.]])
    """
    lu = as_rank(a, 2, "lu operand").copy()
    n = lu.shape[0]
    if lu.shape != (n, n):
        raise ValueError(f"LU of a non-square matrix {lu.shape}")
    with np.errstate(all="ignore"):
        for k in range(n - 1):
            lu[k + 1:, k] /= lu[k, k]
            lu[k + 1:, k + 1:] -= np.outer(lu[k + 1:, k], lu[k, k + 1:])
    return lu


def _lu_rhs(lu: Any, b: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    m = as_rank(lu, 2, f"{name} factorisation")
    n = m.shape[0]
    if m.shape != (n, n):
        raise ValueError(f"{name}: the factorisation must be square, got {m.shape}")
    x = _f64(b).copy()
    if x.ndim not in (1, 2) or x.shape[0] != n:
        raise ValueError(f"{name}: right-hand side of shape {x.shape} for a {n}x{n} factorisation")
    return m, x


@tenscalc_op(10023, "Vmldivide_l1", "mldivide_l1(a,b)")
def vmldivide_l1(lu: Any, b: Any) -> np.ndarray:
    """``L\\b`` with ``L`` the unit lower triangle of a packed LU (``sparsity_mldivide_l1.m``).

    ``b`` is a vector ``[n]`` or a matrix ``[n m]``; row ``r`` becomes ``b(r) - L(r,1:r-1)*x(1:r-1)``.

    >>> vmldivide_l1(np.array([[2.0, 1.0], [2.0, 3.0]]), np.array([3.0, 9.0]))
    array([3., 3.])
    """
    m, x = _lu_rhs(lu, b, "Vmldivide_l1")
    for r in range(1, m.shape[0]):
        x[r] = x[r] - m[r, :r] @ x[:r]
    return x


@tenscalc_op(10024, "Vmldivide_u", "mldivide_u(a,b)")
def vmldivide_u(lu: Any, b: Any) -> np.ndarray:
    """``U\\b`` with ``U`` the upper triangle (diagonal included) of a packed LU (``sparsity_mldivide_u.m``).

    Row ``r`` (last first) becomes ``(b(r) - U(r,r+1:n)*x(r+1:n)) / U(r,r)``.

    >>> vmldivide_u(np.array([[2.0, 1.0], [2.0, 3.0]]), np.array([3.0, 3.0]))
    array([1., 1.])
    """
    m, x = _lu_rhs(lu, b, "Vmldivide_u")
    n = m.shape[0]
    with np.errstate(all="ignore"):
        for r in range(n - 1, -1, -1):
            x[r] = (x[r] - m[r, r + 1:] @ x[r + 1:]) / m[r, r]
    return x


NO_KERNEL_CHOL = (
    "TensCalc implements chol in neither code generator (computeScalarInstructions.m has its 'chol' case "
    "commented out, writeMatlabInstructions.m has no I_Mchol case), so its value (which triangle, which "
    "permutation) is undefined")
_register(10022, "Vchol", "chol(a)", reason=NO_KERNEL_CHOL)


@tenscalc_op(10025, "Vmtimes", "mtimes(...)")
def vmtimes(a: Any, b: Any) -> np.ndarray:
    """``a*b`` with Tcalculus/mtimes's rules (inputs ``a, b``; no TensCalc writer emits this kind).

    Matrix*matrix, matrix*vector ``[m]``, vector'*matrix ``[n]``, vector'*vector
    (a scalar); a scalar (size 1, e.g. a ``(1, 1)`` constant) scales the other operand.

    >>> vmtimes(np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([1.0, 1.0]))
    array([3., 7.])
    >>> vmtimes(np.array([1.0, 2.0]), np.array([3.0, 4.0]))
    array(11.)
    """
    x, y = _f64(a), _f64(b)
    if x.ndim in (1, 2) and y.ndim in (1, 2) and x.shape[-1 if x.ndim == 2 else 0] == y.shape[0]:
        return x @ y
    if x.size == 1:
        return x.reshape(()) * y
    if y.size == 1:
        return x * y.reshape(())
    raise ValueError(f"mtimes of sizes {x.shape} and {y.shape}")


def _transpose(a: Any) -> np.ndarray:
    x = _f64(a)
    if x.ndim > 2:
        raise ValueError(f"transpose of a tensor with {x.ndim} dimensions")
    return x.T.copy()  # Tcalculus: no effect on scalars and vectors


@tenscalc_op(10026, "Vctranspose", "ctranspose(a)")
def vctranspose(a: Any) -> np.ndarray:
    """``a'`` of a matrix (TensCalc is real: same as transpose); scalars and vectors unchanged.

    >>> vctranspose(np.array([[1.0, 2.0]]))
    array([[1.],
           [2.]])
    """
    return _transpose(a)


@tenscalc_op(10027, "Vtranspose", "transpose(a)")
def vtranspose(a: Any) -> np.ndarray:
    """``a.'`` of a matrix; scalars and vectors unchanged.

    >>> vtranspose(np.array([1.0, 2.0]))
    array([1., 2.])
    """
    return _transpose(a)


@tenscalc_op(10028, "Vrdivide", "rdivide(a,b)")
def vrdivide(a: Any, b: Any) -> np.ndarray:
    """``a./b`` entry by entry; either side may be a scalar.

    >>> vrdivide(np.array([1.0, 3.0]), np.array(2.0))
    array([0.5, 1.5])
    """
    x, y = _same_size([_f64(a), _f64(b)], "Vrdivide")
    with np.errstate(all="ignore"):
        return x / y


@tenscalc_op(10029, "Vsum", "sum(dim,a,b,...)")
def vsum(dims: Any, a: Any) -> np.ndarray:
    """``sum(a, dims)`` with the summed dimensions removed (Tcalculus/sum; every listed dimension is summed).

    >>> vsum(np.array([1]), np.array([[1.0, 2.0], [3.0, 4.0]]))
    array([4., 6.])
    """
    x, axes = _dims(dims, _f64(a))
    return np.sum(x, axis=axes)


@tenscalc_op(10030, "Vdiag", "diag(a)")
def vdiag(a: Any) -> np.ndarray:
    """The ``[n n]`` diagonal matrix of a vector ``[n]`` (``spdiags(a,0,n,n)``; TensCalc's diag takes vectors only).

    >>> vdiag(np.array([1.0, 2.0]))
    array([[1., 0.],
           [0., 2.]])
    """
    x = _f64(a)
    if x.ndim > 1 and sum(d != 1 for d in x.shape) > 1:
        raise ValueError(f"diag of a tensor of shape {x.shape}: TensCalc's diag takes a vector")
    return np.diag(x.ravel(order="F"))


FUNCTIONS.sort()
