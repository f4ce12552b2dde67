"""Linear-algebra ops: decompositions, solves, inverses and determinants (``numpy.linalg``).

Every op works on the last two axes and is batched over the leading ones
exactly as ``numpy.linalg`` is; result dtypes are NumPy's: float32 and
complex64 stay single precision, integers and bools are computed in
float64, and float16 is rejected (LAPACK has no half precision).
Decompositions return several outputs; ``svd`` follows the Array API
(``full_matrices=False`` by default, returns ``(U, S, Vh)``). Ids 900-999.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> a = b.input(("float32", (None, 5, 3)), name="a")
    >>> q, r = b.op("qr", a)
    >>> q.type, r.type
    (f32[?,5,3], f32[?,3,3])
    >>> b.op("svd", a)[1].type
    f32[?,3]
    >>> b.op("det", b.input(("int64", (4, 4)))).type
    f64[]
    >>> m, v = b.input(("float32", (2, 2)), name="m"), b.input(("float32", (2,)), name="v")
    >>> x = b.op("solve", m, v)
    >>> b.run({m: np.array([[2, 1], [1, 3]], np.float32), v: np.array([3, 5], np.float32)}, [x])[0]
    array([0.8, 1.4], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from opgraph.core.registry import Attr, InferFn, OpDef, attr_bool, attr_float, attr_str, optional, register_op
from opgraph.core.types import Shape, TensorType, ValueType, broadcast_shapes
from opgraph.errors import OpTypeError
from opgraph.ops._common import tensor, write_out

FAMILY = "linalg"

Dim = int | None
Batch = tuple[Dim, ...]

_LAPACK_DTYPES = {np.dtype(t): t for t in (np.float32, np.float64, np.complex64, np.complex128)}


# ---------------------------------------------------------------- type-rule helpers
def linalg_dtypes(*dtypes: Any) -> tuple[np.dtype, np.dtype]:
    """The dtype ``numpy.linalg`` computes in for inputs of ``dtypes``, and its real counterpart.

    Single precision stays single, anything not floating or complex becomes
    float64, complex wins over real; float16 is an OpTypeError.

    >>> linalg_dtypes("float32")
    (dtype('float32'), dtype('float32'))
    >>> linalg_dtypes("int8", "complex64")
    (dtype('complex128'), dtype('float64'))
    """
    is_complex = is_double = False
    for dt in map(np.dtype, dtypes):
        if dt.kind in "fc":
            if dt not in _LAPACK_DTYPES:
                raise OpTypeError(f"dtype {dt} is not supported by linalg ops (LAPACK takes float32, float64, "
                                  f"complex64 or complex128; integers and bools are computed in float64)")
            is_complex |= dt.kind == "c"
            is_double |= dt in (np.float64, np.complex128)
        else:
            is_double = True
    work = np.dtype((np.complex128 if is_double else np.complex64) if is_complex else
                    (np.float64 if is_double else np.float32))
    return work, np.dtype(np.finfo(work).dtype)


def _matrix(t: TensorType, what: str = "a", *, square: bool = False) -> tuple[Batch, Dim, Dim] | None:
    """Split a stack-of-matrices shape into (batch, rows, cols); None for unknown rank."""
    if t.shape is None:
        return None
    if len(t.shape) < 2:
        raise OpTypeError(f"{what} must be a matrix or a stack of matrices (rank >= 2), got rank {len(t.shape)}")
    *batch, m, n = t.shape
    if square:
        if m is not None and n is not None and m != n:
            raise OpTypeError(f"{what} must be square in its last two dims, got {m}x{n}")
        m = n = m if m is not None else n
    return tuple(batch), m, n


def _min(m: Dim, n: Dim) -> Dim:
    if m == 0 or n == 0:
        return 0
    return None if m is None or n is None else min(m, n)


def _one_input(in_types: tuple[ValueType, ...]) -> tuple[TensorType, np.dtype, np.dtype]:
    (a,) = (tensor(t, "a") for t in in_types)
    work, real = linalg_dtypes(a.dtype)
    return a, work, real


def _shape(parts: tuple[Batch, Dim, Dim] | None, *tail: str) -> Shape:
    """Batch dims followed by the named dims ('m', 'n' or 'k' = min(m, n)); None for unknown rank."""
    if parts is None:
        return None
    batch, m, n = parts
    dims = {"m": m, "n": n, "k": _min(m, n)}
    return (*batch, *(dims[d] for d in tail))


# ---------------------------------------------------------------- attribute normalisers
def attr_uplo(v: Any) -> str:
    """Normalise ``UPLO``: which triangle of a Hermitian matrix is read, 'L' or 'U'.

    >>> attr_uplo("u")
    'U'
    """
    s = attr_str(v).upper()
    if s not in ("L", "U"):
        raise OpTypeError(f"UPLO must be 'L' or 'U', got {v!r}")
    return s


def attr_qr_mode(v: Any) -> str:
    """Normalise the ``mode`` of qr: 'reduced' or 'complete'.

    >>> attr_qr_mode("complete")
    'complete'
    """
    s = attr_str(v)
    if s not in ("reduced", "complete"):
        raise OpTypeError(f"qr mode must be 'reduced' or 'complete', got {v!r}")
    return s


def _op(name: str, id: int, infer: InferFn, kernel: Callable[..., Any], doc: str,
        attrs: dict[str, Attr] | None = None, arity: int = 1) -> OpDef:
    kernel.__name__ = f"{name}_numpy"
    return register_op(OpDef(name=name, id=id, arity=arity, infer=infer, attrs=attrs or {},
                             kernels={"numpy": kernel}, family=FAMILY, doc=doc))


def _tuple(result: Any, out: Any) -> tuple[np.ndarray, ...]:
    # numpy.linalg returns named tuples; kernels return plain tuples (or the out buffers).
    return write_out(tuple(result), out)


_UPLO = {"UPLO": Attr(attr_uplo, "L", doc="'L' or 'U': the triangle that is read")}


# ---------------------------------------------------------------- eigh, eigvalsh
def _eigh_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, work, real = _one_input(in_types)
    parts = _matrix(a, square=True)
    return TensorType(real, _shape(parts, "m")), TensorType(work, _shape(parts, "m", "m"))


def _eigh_kernel(a: np.ndarray, out: Any = None, *, UPLO: str) -> tuple[np.ndarray, ...]:
    return _tuple(np.linalg.eigh(a, UPLO=UPLO), out)


_op("eigh", 900, _eigh_infer, _eigh_kernel, attrs=_UPLO,
    doc="eigh(a) -> (eigenvalues ascending, eigenvectors as columns) of Hermitian matrices (numpy.linalg.eigh)")


def _eigvalsh_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, _work, real = _one_input(in_types)
    return (TensorType(real, _shape(_matrix(a, square=True), "m")),)


def _eigvalsh_kernel(a: np.ndarray, out: Any = None, *, UPLO: str) -> np.ndarray:
    return write_out(np.linalg.eigvalsh(a, UPLO=UPLO), out)


_op("eigvalsh", 908, _eigvalsh_infer, _eigvalsh_kernel, attrs=_UPLO,
    doc="eigvalsh(a): ascending eigenvalues of Hermitian matrices (numpy.linalg.eigvalsh)")


# ---------------------------------------------------------------- qr
def _qr_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, work, _real = _one_input(in_types)
    parts = _matrix(a)
    inner = "k" if attrs["mode"] == "reduced" else "m"
    return TensorType(work, _shape(parts, "m", inner)), TensorType(work, _shape(parts, inner, "n"))


def _qr_kernel(a: np.ndarray, out: Any = None, *, mode: str) -> tuple[np.ndarray, ...]:
    return _tuple(np.linalg.qr(a, mode=mode), out)


_op("qr", 901, _qr_infer, _qr_kernel,
    attrs={"mode": Attr(attr_qr_mode, "reduced", doc="'reduced': Q (M, K), R (K, N); 'complete': Q (M, M)")},
    doc="qr(a) -> (Q, R) with a = Q @ R, Q orthonormal columns, R upper triangular (numpy.linalg.qr)")


# ---------------------------------------------------------------- svd, svdvals, pinv
def _svd_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, work, real = _one_input(in_types)
    parts = _matrix(a)
    u, v = ("m", "n") if attrs["full_matrices"] else ("k", "k")
    return (TensorType(work, _shape(parts, "m", u)), TensorType(real, _shape(parts, "k")),
            TensorType(work, _shape(parts, v, "n")))


def _svd_kernel(a: np.ndarray, out: Any = None, *, full_matrices: bool) -> tuple[np.ndarray, ...]:
    return _tuple(np.linalg.svd(a, full_matrices=full_matrices), out)


_op("svd", 902, _svd_infer, _svd_kernel,
    attrs={"full_matrices": Attr(attr_bool, False, doc="square U (M, M) and Vh (N, N) instead of (M, K), (K, N)")},
    doc="svd(a) -> (U, S, Vh) with a = U @ diag(S) @ Vh, S descending (Array API semantics: "
        "full_matrices=False by default)")


def _svdvals_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, _work, real = _one_input(in_types)
    return (TensorType(real, _shape(_matrix(a), "k")),)


def _svdvals_kernel(a: np.ndarray, out: Any = None) -> np.ndarray:
    return write_out(np.linalg.svdvals(a), out)


_op("svdvals", 909, _svdvals_infer, _svdvals_kernel,
    doc="svdvals(a): singular values, descending (numpy.linalg.svdvals)")


def _pinv_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, work, _real = _one_input(in_types)
    parts = _matrix(a, square=attrs["hermitian"])
    return (TensorType(work, _shape(parts, "n", "m")),)


def _pinv_kernel(a: np.ndarray, out: Any = None, *, rtol: float | None, hermitian: bool) -> np.ndarray:
    work, _real = linalg_dtypes(a.dtype)
    return write_out(np.linalg.pinv(a.astype(work, copy=False), rtol=rtol, hermitian=hermitian), out)


_op("pinv", 910, _pinv_infer, _pinv_kernel,
    attrs={"rtol": Attr(optional(attr_float), None,
                        doc="singular values below rtol * largest are dropped; None: max(M, N) * eps"),
           "hermitian": Attr(attr_bool, False, doc="a is Hermitian (computed with eigh; must be square)")},
    doc="pinv(a): Moore-Penrose pseudo-inverse, (..., N, M) (numpy.linalg.pinv with the Array API's rtol)")


# ---------------------------------------------------------------- cholesky, inv, det, slogdet
def _square_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, work, _real = _one_input(in_types)
    return (TensorType(work, _shape(_matrix(a, square=True), "m", "m")),)


def _cholesky_kernel(a: np.ndarray, out: Any = None, *, upper: bool) -> np.ndarray:
    return write_out(np.linalg.cholesky(a, upper=upper), out)


def _inv_kernel(a: np.ndarray, out: Any = None) -> np.ndarray:
    return write_out(np.linalg.inv(a), out)


_op("cholesky", 903, _square_infer, _cholesky_kernel,
    attrs={"upper": Attr(attr_bool, False, doc="return U with a = U^H @ U instead of L with a = L @ L^H")},
    doc="cholesky(a): the lower (or upper) Cholesky factor of Hermitian positive-definite matrices")

_op("inv", 905, _square_infer, _inv_kernel,
    doc="inv(a): inverse of square matrices (numpy.linalg.inv)")


def _det_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, work, _real = _one_input(in_types)
    return (TensorType(work, _shape(_matrix(a, square=True))),)


def _det_kernel(a: np.ndarray, out: Any = None) -> np.ndarray:
    return write_out(np.linalg.det(a), out)


_op("det", 906, _det_infer, _det_kernel,
    doc="det(a): determinant of square matrices, shape (...) (numpy.linalg.det)")


def _slogdet_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, work, real = _one_input(in_types)
    shape = _shape(_matrix(a, square=True))
    return TensorType(work, shape), TensorType(real, shape)


def _slogdet_kernel(a: np.ndarray, out: Any = None) -> tuple[np.ndarray, ...]:
    return _tuple(np.linalg.slogdet(a), out)


_op("slogdet", 907, _slogdet_infer, _slogdet_kernel,
    doc="slogdet(a) -> (sign, logabsdet) with det = sign * exp(logabsdet); sign is complex for complex a")


# ---------------------------------------------------------------- solve
def _solve_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, b = tensor(in_types[0], "a"), tensor(in_types[1], "b")
    work, _real = linalg_dtypes(a.dtype, b.dtype)
    parts = _matrix(a, "a", square=True)
    if b.shape is not None and len(b.shape) == 0:
        raise OpTypeError("b must be a vector (M,) or a stack of matrices (..., M, K), got a scalar")
    if parts is None or b.shape is None:
        return (TensorType(work, None),)
    batch, m, _ = parts
    if len(b.shape) == 1:  # NumPy 2: only an exactly 1-d b is a vector
        mb, shape = b.shape[0], (*batch, m if m is not None else b.shape[0])
    else:
        *bbatch, mb, k = b.shape
        try:
            batch = broadcast_shapes(tuple(batch), tuple(bbatch))  # type: ignore[assignment]
        except OpTypeError:
            raise OpTypeError(f"batch dims {tuple(batch)} of a and {tuple(bbatch)} of b do not broadcast") from None
        shape = (*batch, m if m is not None else mb, k)  # type: ignore[misc]
    if m is not None and mb is not None and m != mb:
        raise OpTypeError(f"a is {m}x{m} but b has {mb} rows")
    return (TensorType(work, shape),)


def _solve_kernel(a: np.ndarray, b: np.ndarray, out: Any = None) -> np.ndarray:
    return write_out(np.linalg.solve(a, b), out)


_op("solve", 904, _solve_infer, _solve_kernel, arity=2,
    doc="solve(a, b): x with a @ x = b; b is (M,) or (..., M, K) as in NumPy 2, batch dims broadcast")
