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

from opgraph.core.registry import (
    Attr,
    InferFn,
    OpDef,
    attr_bool,
    attr_float,
    attr_str,
    mark_traits,
    optional,
    register_op,
    set_rules,
)
from opgraph.core.types import Shape, TensorType, ValueType, broadcast_shapes
from opgraph.errors import OpTypeError
from opgraph.ops._common import tensor, write_out
from opgraph.ops.batch_helpers import all_batched, example_ndim
from opgraph.ops.grad_helpers import eye, rank, static_shape, swap_last, unbroadcast

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
                             kernel=kernel, family=FAMILY, doc=doc, grad=_LINALG_GRADS.get(name)))


# ---------------------------------------------------------------- gradient rules
# rule(b, inputs, outputs, cotangents, attrs) -> cotangents of the inputs (see opgraph.ops.grad_helpers).
# Real dtypes. Rules hold where the function is differentiable: distinct eigenvalues (eigh) and
# singular values (svd), full rank (qr needs M >= N, pinv), positive definite (cholesky).
# Gradients of eigh/eigvalsh/cholesky are symmetrised, as for a symmetrised input (JAX).
def _mm(b: Any, *xs: Any) -> Any:
    acc = xs[0]
    for x in xs[1:]:
        acc = b.op("matmul", acc, x)
    return acc


def _n(x: Any) -> int:
    return static_shape(x.type, "linear-algebra gradient")[-1]


def _sym(b: Any, x: Any) -> Any:
    return b.op("multiply", b.op("add", x, swap_last(b, x)), b.constant(np.array(0.5, dtype=x.type.dtype)))


def _diag(b: Any, v: Any, like: Any) -> Any:
    """diag(v) for a (..., k) vector, as (..., k, k)."""
    return b.op("multiply", b.op("expand_dims", v, axis=-1), eye(b, static_shape(v.type)[-1], like))


def _col(b: Any, v: Any) -> Any:  # (...,) -> (..., 1, 1)
    return b.op("expand_dims", v, axis=(-2, -1))


def _const(b: Any, arr: np.ndarray, like: Any) -> Any:
    return b.constant(arr.astype(like.type.dtype))


def _inv_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    yt = swap_last(b, outs[0])
    return [b.op("negative", _mm(b, yt, cots[0], yt))]


def _det_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    a = ins[0]
    return [b.op("multiply", _col(b, b.op("multiply", cots[0], outs[0])), swap_last(b, b.op("inv", a)))]


def _slogdet_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    if cots[1] is None:  # the sign is piecewise constant
        return [None]
    return [b.op("multiply", _col(b, cots[1]), swap_last(b, b.op("inv", ins[0])))]


def _solve_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    a, rhs = ins
    x, g = outs[0], cots[0]
    gb = b.op("solve", swap_last(b, a), g)
    if rank(rhs.type) == 1:
        ga = b.op("multiply", b.op("expand_dims", gb, axis=-1), b.op("expand_dims", x, axis=-2))
    else:
        ga = b.op("matmul", gb, swap_last(b, x))
    return [unbroadcast(b, b.op("negative", ga), a.type), unbroadcast(b, gb, rhs.type)]


def _cholesky_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    low, g = outs[0], cots[0]
    if attrs["upper"]:
        low, g = swap_last(b, low), swap_last(b, g)
    n = _n(low)
    phi = _mm(b, swap_last(b, low), g)
    phi = b.op("multiply", phi, _const(b, np.tril(np.ones((n, n))) - 0.5 * np.eye(n), phi))
    linv = b.op("inv", low)
    return [_sym(b, _mm(b, swap_last(b, linv), phi, linv))]


def _eigh_core(b: Any, w: Any, v: Any, gw: Any, gv: Any) -> Any:
    n = _n(v)
    vt = swap_last(b, v)
    inner = None
    if gv is not None:
        diff = b.op("subtract", b.op("expand_dims", w, axis=-2), b.op("expand_dims", w, axis=-1))
        off = _const(b, 1.0 - np.eye(n), v)
        f = b.op("divide", off, b.op("add", diff, eye(b, n, v)))
        inner = b.op("multiply", f, _mm(b, vt, gv))
    if gw is not None:
        d = _diag(b, gw, v)
        inner = d if inner is None else b.op("add", inner, d)
    return _sym(b, _mm(b, v, inner, vt))


def _eigh_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    return [_eigh_core(b, outs[0], outs[1], cots[0], cots[1])]


def _eigvalsh_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    w, v = b.op("eigh", ins[0], UPLO=attrs["UPLO"])
    return [_eigh_core(b, w, v, cots[0], None)]


def _svd_core(b: Any, a: Any, u: Any, s: Any, vh: Any, gu: Any, gs: Any, gvh: Any) -> Any:
    # Townsend (2016), real case: F_ij = 1 / (s_j^2 - s_i^2) off the diagonal.
    m, n = static_shape(a.type)[-2:]
    k = min(m, n)
    ut = swap_last(b, u)
    terms = []
    if gs is not None:
        terms.append(_diag(b, gs, u))
    s2 = b.op("square", s)
    if gu is not None or gvh is not None:
        diff = b.op("subtract", b.op("expand_dims", s2, axis=-2), b.op("expand_dims", s2, axis=-1))
        f = b.op("divide", _const(b, 1.0 - np.eye(k), u), b.op("add", diff, eye(b, k, u)))
    s_row, s_col = b.op("expand_dims", s, axis=-2), b.op("expand_dims", s, axis=-1)
    extra = []
    if gu is not None:
        utgu = _mm(b, ut, gu)
        j = b.op("multiply", f, b.op("subtract", utgu, swap_last(b, utgu)))
        terms.append(b.op("multiply", j, s_row))
        if m > k:  # (I - U U^T) gU S^-1 V^T
            proj = b.op("subtract", gu, _mm(b, u, utgu))
            extra.append(_mm(b, b.op("divide", proj, s_row), vh))
    if gvh is not None:
        gv = swap_last(b, gvh)
        vtgv = _mm(b, vh, gv)
        kk = b.op("multiply", f, b.op("subtract", vtgv, swap_last(b, vtgv)))
        terms.append(b.op("multiply", s_col, kk))
        if n > k:  # U S^-1 gV^T (I - V V^T)
            proj = b.op("subtract", gvh, _mm(b, swap_last(b, vtgv), vh))
            extra.append(_mm(b, u, b.op("divide", proj, s_col)))
    inner = terms[0]
    for t in terms[1:]:
        inner = b.op("add", inner, t)
    out = _mm(b, u, inner, vh)
    for e in extra:
        out = b.op("add", out, e)
    return out


def _svd_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    a = ins[0]
    m, n = static_shape(a.type)[-2:]
    if attrs["full_matrices"] and m != n and (cots[0] is not None or cots[2] is not None):
        raise NotImplementedError("svd gradient with full_matrices=True of a non-square matrix")
    return [_svd_core(b, a, *outs, *cots)]


def _svdvals_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    u, _, vh = b.op("svd", ins[0])
    return [_mm(b, b.op("multiply", u, b.op("expand_dims", cots[0], axis=-2)), vh)]


def _qr_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # A = QR, M >= N, reduced: gA = (gQ + Q copyltu(M)) R^-T with M = R gR^T - gQ^T Q.
    a = ins[0]
    q, r = outs
    gq, gr = cots
    m, n = static_shape(a.type)[-2:]
    if m < n or (attrs["mode"] == "complete" and m != n):
        raise NotImplementedError(f"qr gradient needs M >= N and the reduced mode, got {a.type}, mode={attrs['mode']}")
    mm = None
    if gr is not None:
        mm = _mm(b, r, swap_last(b, gr))
    if gq is not None:
        t = _mm(b, swap_last(b, gq), q)
        mm = b.op("negative", t) if mm is None else b.op("subtract", mm, t)
    low = b.op("multiply", mm, _const(b, np.tril(np.ones((n, n)), -1), mm))
    copyltu = b.op("add", b.op("add", low, swap_last(b, low)), b.op("multiply", mm, eye(b, n, mm)))
    rhs = _mm(b, q, copyltu)
    if gq is not None:
        rhs = b.op("add", gq, rhs)
    return [swap_last(b, b.op("solve", r, swap_last(b, rhs)))]


def _pinv_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    a, x, g = ins[0], outs[0], cots[0]
    m, n = static_shape(a.type)[-2:]
    xt, gt = swap_last(b, x), swap_last(b, g)
    term1 = b.op("negative", _mm(b, xt, g, xt))
    p = b.op("subtract", eye(b, m, a), _mm(b, a, x))  # I - A X  (M x M)
    term2 = _mm(b, p, gt, x, xt)
    q = b.op("subtract", eye(b, n, a), _mm(b, x, a))  # I - X A  (N x N)
    term3 = _mm(b, xt, x, gt, q)
    return [b.op("add", b.op("add", term1, term2), term3)]


_LINALG_GRADS: dict[str, Any] = {
    "inv": _inv_grad, "det": _det_grad, "slogdet": _slogdet_grad, "solve": _solve_grad, "cholesky": _cholesky_grad,
    "eigh": _eigh_grad, "eigvalsh": _eigvalsh_grad, "svd": _svd_grad, "svdvals": _svdvals_grad, "qr": _qr_grad,
    "pinv": _pinv_grad,
}


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


# ---------------------------------------------------------------- eig
def _complex_of(work: np.dtype) -> np.dtype:
    return np.dtype(np.complex64 if work in (np.float32, np.complex64) else np.complex128)


def _eig_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, work, _real = _one_input(in_types)
    parts = _matrix(a, square=True)
    c = _complex_of(work)
    return TensorType(c, _shape(parts, "m")), TensorType(c, _shape(parts, "m", "m"))


def _eig_kernel(a: np.ndarray, out: Any = None) -> tuple[np.ndarray, ...]:
    work, _real = linalg_dtypes(a.dtype)
    c = _complex_of(work)
    # numpy.linalg.eig returns real arrays when every eigenvalue is real; the Array API's are always complex.
    w, v = np.linalg.eig(a.astype(work, copy=False))
    return write_out((w.astype(c, copy=False), v.astype(c, copy=False)), out)


_op("eig", 911, _eig_infer, _eig_kernel,
    doc="eig(a) -> (eigenvalues (..., M), eigenvectors (..., M, M)): eigen-decomposition of general square "
        "matrices, always complex (complex64 for float32/complex64 input, else complex128); eigenvectors are "
        "the columns, normalised to unit length (numpy.linalg.eig); the order of the eigenvalues is LAPACK's")


# ---------------------------------------------------------------- traits (see OpDef)
mark_traits("promotes", "det")


# ---------------------------------------------------------------- tangent rules
# The classical forward derivatives (Giles 2008, "Extended collection of matrix derivative results"), fewer
# ops than the transposed gradient rules: no inverse where a solve does, no symmetrising of the result. As the
# gradient rules (and JAX), eigh, eigvalsh and cholesky see the symmetric part of the input's tangent.
def _jvp_inv(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    y = outs[0]
    return [b.op("negative", _mm(b, y, tans[0], y))]


def _trace_solve(b: Any, a: Any, t: Any) -> Any:
    """trace(a^-1 t) over the last two axes, as sum(a^-T * t)."""
    return b.op("sum", b.op("multiply", swap_last(b, b.op("inv", a)), t), axis=(-2, -1))


def _jvp_det(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    return [b.op("multiply", outs[0], _trace_solve(b, ins[0], tans[0]))]


def _jvp_slogdet(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    return [None, _trace_solve(b, ins[0], tans[0])]


def _jvp_solve(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    # a x = rhs: a dx = drhs - da x
    a, x = ins[0], outs[0]
    ta, tb = tans
    r = tb
    if ta is not None:
        dax = b.op("matmul", ta, x)
        r = b.op("negative", dax) if r is None else b.op("subtract", r, dax)
    return [b.op("solve", a, r)]


def _jvp_cholesky(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    # a = l l^T: dl = l phi(l^-1 da l^-T), phi keeps the lower triangle and halves the diagonal
    low = swap_last(b, outs[0]) if attrs["upper"] else outs[0]
    n = _n(low)
    s = b.op("solve", low, _sym(b, tans[0]))            # l^-1 da
    s = b.op("solve", low, swap_last(b, s))             # l^-1 (l^-1 da)^T = l^-1 da l^-T (da symmetric)
    phi = b.op("multiply", s, _const(b, np.tril(np.ones((n, n))) - 0.5 * np.eye(n), s))
    dl = _mm(b, low, phi)
    return [swap_last(b, dl) if attrs["upper"] else dl]


def _eig_tangent(b: Any, v: Any, t: Any) -> Any:
    """v^T sym(t) v: the input's tangent in the eigenbasis."""
    return _mm(b, swap_last(b, v), _sym(b, t), v)


def _diag_of(b: Any, m: Any) -> Any:
    return b.op("sum", b.op("multiply", m, eye(b, _n(m), m)), axis=-1)


def _jvp_eigh(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    # dw = diag(m), dv = v (f * m), m = v^T da v, f_ij = 1 / (w_j - w_i) off the diagonal
    w, v = outs
    n = _n(v)
    m = _eig_tangent(b, v, tans[0])
    diff = b.op("subtract", b.op("expand_dims", w, axis=-2), b.op("expand_dims", w, axis=-1))
    f = b.op("divide", _const(b, 1.0 - np.eye(n), v), b.op("add", diff, eye(b, n, v)))
    return [_diag_of(b, m), _mm(b, v, b.op("multiply", f, m))]


def _jvp_eigvalsh(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    _, v = b.op("eigh", ins[0], UPLO=attrs["UPLO"])
    return [_diag_of(b, _eig_tangent(b, v, tans[0]))]


def _jvp_svd(b: Any, ins: Any, outs: Any, tans: Any, attrs: dict[str, Any]) -> list[Any]:
    # Reduced a = u diag(s) vh, ds = u^T da v: ds -> diag(dS), du = u (f * (dS s + (dS s)^T)),
    # dv = v (f * (s dS + (s dS)^T)), f_ij = 1 / (s_j^2 - s_i^2) off the diagonal; plus the parts of da
    # outside the spans of u (M > N) or v (N > M).
    a, (u, s, vh), ta = ins[0], outs, tans[0]
    m, n = static_shape(a.type)[-2:]
    if attrs["full_matrices"] and m != n:
        raise NotImplementedError("svd tangent with full_matrices=True of a non-square matrix")
    k = min(m, n)
    v = swap_last(b, vh)
    da_v = _mm(b, ta, v)
    ds = _mm(b, swap_last(b, u), da_v)
    s2 = b.op("square", s)
    diff = b.op("subtract", b.op("expand_dims", s2, axis=-2), b.op("expand_dims", s2, axis=-1))
    f = b.op("divide", _const(b, 1.0 - np.eye(k), u), b.op("add", diff, eye(b, k, u)))
    s_row, s_col = b.op("expand_dims", s, axis=-2), b.op("expand_dims", s, axis=-1)
    dss, sds = b.op("multiply", ds, s_row), b.op("multiply", s_col, ds)
    du = _mm(b, u, b.op("multiply", f, b.op("add", dss, swap_last(b, dss))))
    dv = _mm(b, v, b.op("multiply", f, b.op("add", sds, swap_last(b, sds))))
    if m > k:  # (I - u u^T) da v / s
        du = b.op("add", du, b.op("divide", b.op("subtract", da_v, _mm(b, u, ds)), s_row))
    if n > k:  # (I - v v^T) da^T u / s
        dat_u = _mm(b, swap_last(b, ta), u)
        dv = b.op("add", dv, b.op("divide", b.op("subtract", dat_u, _mm(b, v, swap_last(b, ds))), s_row))
    return [du, _diag_of(b, ds), swap_last(b, dv)]


set_rules("jvp", {"svd": _jvp_svd, "inv": _jvp_inv, "det": _jvp_det, "slogdet": _jvp_slogdet, "solve": _jvp_solve,
                  "cholesky": _jvp_cholesky, "eigh": _jvp_eigh, "eigvalsh": _jvp_eigvalsh})


# ---------------------------------------------------------------- batching rules (vmap)
# Every kind takes leading batch dims already, so vmap's axis is one more of them; solve lines up its two
# operands' batch dims first (a 1-d b is a vector only when exactly 1-d, as NumPy 2 has it).
def _leading_batch(kind: str) -> Any:
    def rule(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
        res = b.op(kind, ins[0], **attrs)
        return list(res) if isinstance(res, (tuple, list)) else [res]
    return rule


def _solve_batch(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    a, rhs = all_batched(b, ins, batched, size)
    vector = example_ndim(ins[1], batched[1]) == 1
    if vector:
        rhs = b.op("expand_dims", rhs, axis=-1)
    # batch dims align from the right: pad the shorter stack after vmap's axis
    ra, rb = len(static_shape(a.type)), len(static_shape(rhs.type))
    if ra < rb:
        a = b.op("expand_dims", a, axis=tuple(range(1, 1 + rb - ra)))
    elif rb < ra:
        rhs = b.op("expand_dims", rhs, axis=tuple(range(1, 1 + ra - rb)))
    x = b.op("solve", a, rhs)
    return [b.op("squeeze", x, axis=-1) if vector else x]


set_rules("batch", {
    **{k: _leading_batch(k) for k in ("eigh", "qr", "svd", "cholesky", "inv", "det", "slogdet", "eigvalsh",
                                      "svdvals", "pinv", "eig")},
    "solve": _solve_batch,
})
