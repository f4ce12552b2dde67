"""Tests of the linalg ops.

The kernels call numpy.linalg, so matching numpy.linalg alone proves
little: each op is run through a graph with the shared harness (exact
dtype and shape as numpy.linalg, non-contiguous inputs, ``out=``), and its
results are then checked for the properties that define them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.linalg

from opcheck import check_op, out_type, rand, run_op
from opgraph.core.registry import get_op
from opgraph.core.types import TensorType
from opgraph.errors import OpBuildError

DTYPES = ["float32", "float64", "int64", "complex128", "complex64"]
BATCHES = [(), (2, 3), (0,)]


def H(a: np.ndarray) -> np.ndarray:
    """Conjugate transpose of a stack of matrices."""
    return np.conj(np.swapaxes(a, -1, -2))


def eye_like(a: np.ndarray) -> np.ndarray:
    return np.broadcast_to(np.eye(a.shape[-1]), a.shape)


def close(dtype: Any) -> dict[str, float]:
    """Tolerances for identities checked in a dtype's precision."""
    single = np.dtype(dtype) in (np.float32, np.complex64)
    return {"rtol": 2e-4, "atol": 2e-4} if single else {"rtol": 1e-9, "atol": 1e-9}


def harness_tol(dtype: Any) -> dict[str, float]:
    single = np.dtype(dtype) in (np.float32, np.complex64)
    return {"rtol": 1e-5, "atol": 1e-6} if single else {"rtol": 1e-12, "atol": 1e-12}


def general(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Random matrices, well conditioned when square (diagonally dominant)."""
    a = rand(rng, shape, dtype)
    if shape[-1] == shape[-2]:
        a = a + (4 * shape[-1] * np.eye(shape[-1])).astype(a.dtype)
    return a


def hermitian_pd(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Random Hermitian positive-definite matrices (integer ones for integer dtypes)."""
    a = rand(rng, shape, dtype)
    return a @ H(a) + (shape[-1] * np.eye(shape[-1])).astype(a.dtype)


def np_ref(name: str, **kwargs: Any) -> Any:
    fn = getattr(np.linalg, name)
    return lambda *arrays: (lambda r: tuple(r) if isinstance(r, tuple) else r)(fn(*arrays, **kwargs))


# ---------------------------------------------------------------- decompositions
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("UPLO", ["L", "U"])
def test_eigh(rng: np.random.Generator, dtype: str, batch: tuple[int, ...], UPLO: str) -> None:
    a = hermitian_pd(rng, (*batch, 4, 4), dtype)
    # Only the UPLO triangle may be read: spoil the other one.
    spoiled = a.copy()
    other = np.tril_indices(4, -1) if UPLO == "U" else np.triu_indices(4, 1)
    spoiled[..., other[0], other[1]] = 99
    w, v = check_op("eigh", [spoiled], np_ref("eigh", UPLO=UPLO), UPLO=UPLO, **harness_tol(dtype))
    assert w.dtype == np.finfo(v.dtype).dtype
    np.testing.assert_allclose((v * w[..., None, :]) @ H(v), a, **close(dtype))
    np.testing.assert_allclose(H(v) @ v, eye_like(v), **close(dtype))
    assert (np.diff(w, axis=-1) >= 0).all()
    (wv,) = check_op("eigvalsh", [spoiled], np_ref("eigvalsh", UPLO=UPLO), UPLO=UPLO, **harness_tol(dtype))
    np.testing.assert_allclose(wv, w, **close(dtype))
    np.testing.assert_allclose(wv.sum(axis=-1), np.trace(a, axis1=-2, axis2=-1).real, **close(dtype))


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 5, 3), (2, 3, 3, 5), (0, 3, 3), (2, 0, 3)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["reduced", "complete"])
def test_qr(rng: np.random.Generator, dtype: str, shape: tuple[int, ...], mode: str) -> None:
    a = general(rng, shape, dtype)
    q, r = check_op("qr", [a], np_ref("qr", mode=mode), mode=mode, **harness_tol(dtype))
    m, n = shape[-2:]
    k = min(m, n) if mode == "reduced" else m
    assert q.shape == (*shape[:-2], m, k) and r.shape == (*shape[:-2], k, n)
    np.testing.assert_allclose(q @ r, a, **close(dtype))
    np.testing.assert_allclose(H(q) @ q, np.broadcast_to(np.eye(k), (*q.shape[:-2], k, k)), **close(dtype))
    np.testing.assert_array_equal(np.tril(r, -1), 0)


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 5, 3), (2, 3, 3, 5), (0, 3, 3)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("full_matrices", [False, True])
def test_svd(rng: np.random.Generator, dtype: str, shape: tuple[int, ...], full_matrices: bool) -> None:
    a = general(rng, shape, dtype)
    u, s, vh = check_op("svd", [a], np_ref("svd", full_matrices=full_matrices), full_matrices=full_matrices,
                        **harness_tol(dtype))
    m, n = shape[-2:]
    k = min(m, n)
    assert u.shape[-2:] == ((m, m) if full_matrices else (m, k))
    assert vh.shape[-2:] == ((n, n) if full_matrices else (k, n))
    assert s.dtype == np.finfo(u.dtype).dtype and s.shape == (*shape[:-2], k)
    np.testing.assert_allclose((u[..., :k] * s[..., None, :]) @ vh[..., :k, :], a, **close(dtype))
    np.testing.assert_allclose(H(u) @ u, eye_like(H(u) @ u), **close(dtype))
    np.testing.assert_allclose(vh @ H(vh), eye_like(vh @ H(vh)), **close(dtype))
    assert (np.diff(s, axis=-1) <= 0).all() and (s >= 0).all()
    (sv,) = check_op("svdvals", [a], np_ref("svdvals"), **harness_tol(dtype))
    np.testing.assert_allclose(sv, s, **close(dtype))
    np.testing.assert_allclose((sv**2).sum(axis=-1), (np.abs(a) ** 2).sum(axis=(-2, -1)), **close(dtype))


def test_svd_default_is_array_api() -> None:
    u, s, vh = out_type("svd", TensorType("float64", (6, 4)))
    assert (u, s, vh) == (TensorType("float64", (6, 4)), TensorType("float64", (4,)), TensorType("float64", (4, 4)))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky(rng: np.random.Generator, dtype: str, batch: tuple[int, ...], upper: bool) -> None:
    a = hermitian_pd(rng, (*batch, 4, 4), dtype)
    (c,) = check_op("cholesky", [a], np_ref("cholesky", upper=upper), upper=upper, **harness_tol(dtype))
    if upper:
        np.testing.assert_array_equal(np.tril(c, -1), 0)
        np.testing.assert_allclose(H(c) @ c, a, **close(dtype))
    else:
        np.testing.assert_array_equal(np.triu(c, 1), 0)
        np.testing.assert_allclose(c @ H(c), a, **close(dtype))
    assert (np.diagonal(c, axis1=-2, axis2=-1).real > 0).all()


# ---------------------------------------------------------------- solve, inv, det, slogdet, pinv
@pytest.mark.parametrize("a_shape, b_shape", [
    ((4, 4), (4,)), ((4, 4), (4, 2)), ((2, 3, 4, 4), (2, 3, 4, 2)), ((2, 3, 4, 4), (4,)),
    ((2, 3, 4, 4), (3, 4, 1)), ((3, 4, 4), (2, 1, 4, 3)), ((0, 3, 3), (0, 3, 2)), ((0, 3, 3), (3,)),
    ((3, 3), (0, 3, 2)),
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_solve(rng: np.random.Generator, dtype: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    a, b = general(rng, a_shape, dtype), rand(rng, b_shape, dtype)
    (x,) = check_op("solve", [a, b], np.linalg.solve, **harness_tol(dtype))
    ax = (a @ x[..., None])[..., 0] if b.ndim == 1 else a @ x
    np.testing.assert_allclose(ax, np.broadcast_to(b, ax.shape), **close(dtype))


@pytest.mark.parametrize("a_dtype, b_dtype, want", [
    ("float32", "float64", "float64"), ("int32", "float32", "float64"), ("complex64", "float32", "complex64"),
    ("complex64", "float64", "complex128"), ("float32", "float32", "float32"), ("int8", "int8", "float64"),
])
def test_solve_dtypes(rng: np.random.Generator, a_dtype: str, b_dtype: str, want: str) -> None:
    a, b = general(rng, (3, 3), a_dtype), rand(rng, (3, 2), b_dtype)
    (x,) = check_op("solve", [a, b], np.linalg.solve, **harness_tol(want))
    assert x.dtype == want
    np.testing.assert_allclose(a @ x, b, **close(want))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_inv(rng: np.random.Generator, dtype: str, batch: tuple[int, ...]) -> None:
    a = general(rng, (*batch, 4, 4), dtype)
    (ai,) = check_op("inv", [a], np.linalg.inv, **harness_tol(dtype))
    np.testing.assert_allclose(ai @ a, eye_like(a), **close(dtype))
    np.testing.assert_allclose(a @ ai, eye_like(a), **close(dtype))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_det_slogdet(rng: np.random.Generator, dtype: str, batch: tuple[int, ...]) -> None:
    a = rand(rng, (*batch, 4, 4), dtype)  # not diagonally dominant: signs vary
    (d,) = check_op("det", [a], np.linalg.det, **harness_tol(dtype))
    a64 = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
    tol = close(dtype)
    np.testing.assert_allclose(d, scipy.linalg.det(a64) if a.size else np.zeros(batch), rtol=tol["rtol"],
                               atol=tol["atol"] * 100)
    np.testing.assert_allclose(d, np.prod(np.linalg.eigvals(a64), axis=-1), rtol=tol["rtol"],
                               atol=tol["atol"] * 100)
    sign, logabs = check_op("slogdet", [a], np_ref("slogdet"), **harness_tol(dtype))
    assert sign.dtype == d.dtype and logabs.dtype == np.finfo(d.dtype).dtype
    np.testing.assert_allclose(np.abs(sign), np.where(d == 0, 0.0, 1.0), **tol)  # small int matrices can be singular
    np.testing.assert_allclose(sign * np.exp(logabs), d, rtol=tol["rtol"] * 10, atol=tol["atol"] * 100)


def test_det_of_integers_is_float64() -> None:
    a = np.array([[[2, 1], [7, 4]], [[1, 2], [2, 4]]], np.int32)
    (d,) = check_op("det", [a], np.linalg.det)
    assert d.dtype == np.float64
    np.testing.assert_allclose(d, [1.0, 0.0], atol=1e-12)
    sign, logabs = check_op("slogdet", [a], np_ref("slogdet"))
    np.testing.assert_array_equal(sign, [1.0, 0.0])
    assert logabs[1] == -np.inf


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 5, 3), (2, 3, 3, 5), (0, 3, 3), (2, 0, 3)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_pinv(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> None:
    a = rand(rng, shape, dtype)
    work = np.linalg.inv(np.eye(1, dtype=a.dtype)).dtype
    (p,) = check_op("pinv", [a], lambda a: np.linalg.pinv(a.astype(work), rtol=None), **harness_tol(dtype))
    assert p.shape == (*shape[:-2], shape[-1], shape[-2])
    tol = close(dtype)
    # The four Moore-Penrose conditions.
    np.testing.assert_allclose(a @ p @ a, a, **tol)
    np.testing.assert_allclose(p @ a @ p, p, **tol)
    np.testing.assert_allclose(H(a @ p), a @ p, **tol)
    np.testing.assert_allclose(H(p @ a), p @ a, **tol)


def test_pinv_attrs(rng: np.random.Generator) -> None:
    # check_op's own rtol= is its tolerance, so pinv's rtol attribute is exercised with run_op here.
    # A rank-1 matrix plus a tiny perturbation: rtol decides whether the perturbation is inverted.
    u = rng.standard_normal((4, 1))
    a = u @ u.T + 1e-9 * np.diag([1.0, 2.0, 3.0, 4.0])
    (p,) = run_op("pinv", a, rtol=1e-6)
    np.testing.assert_allclose(p, np.linalg.pinv(u @ u.T), rtol=1e-5)
    (p_h,) = run_op("pinv", a, rtol=1e-6, hermitian=True)
    np.testing.assert_allclose(p_h, p, rtol=1e-6, atol=1e-9)
    # max(M, N) * eps keeps a perturbation: 1e-5 here, as inverting 1e-9 is conditioned too badly (~1e9) for the
    # backend suite, which re-runs this on every engine, to compare engines' LAPACKs at float64 tolerance
    (p_default,) = run_op("pinv", u @ u.T + 1e-5 * np.diag([1.0, 2.0, 3.0, 4.0]))
    assert np.abs(p_default).max() > 1e4
    buf = np.empty((4, 4))
    assert get_op("pinv").kernel(a, out=buf, rtol=1e-6, hermitian=False) is buf
    np.testing.assert_allclose(buf, p, rtol=1e-12)
    spd = hermitian_pd(rng, (2, 4, 4), np.float64)
    (p_spd,) = check_op("pinv", [spd], lambda a: np.linalg.pinv(a, rtol=None, hermitian=True), hermitian=True,
                        rtol=1e-10)
    np.testing.assert_allclose(p_spd, np.linalg.inv(spd), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_eig(rng: np.random.Generator, dtype: str, batch: tuple[int, ...]) -> None:
    a = rand(rng, (*batch, 4, 4), dtype)  # general (non-symmetric): complex eigenvalues
    w, v = run_op("eig", a)
    want = np.complex64 if a.dtype in (np.float32, np.complex64) else np.complex128
    assert w.dtype == v.dtype == want and w.shape == (*batch, 4) and v.shape == (*batch, 4, 4)
    tol = close(dtype)
    a_c = a.astype(want)
    # A v = v diag(w) (LAPACK's order is not fixed, so check the decomposition, not the order) ...
    np.testing.assert_allclose(a_c @ v, v * w[..., None, :], rtol=tol["rtol"] * 10, atol=tol["atol"] * 100)
    np.testing.assert_allclose(np.linalg.norm(v, axis=-2), np.ones((*batch, 4)), **tol)
    # ... and the eigenvalues are NumPy's as a multiset
    ref = np.linalg.eigvals(a.astype(np.complex128))
    key = lambda z: np.sort_complex(np.round(z, 4))  # noqa: E731
    np.testing.assert_allclose(key(w.astype(np.complex128)), key(ref), rtol=1e-3, atol=1e-3)


def test_eig_real_spectrum_is_complex() -> None:
    w, _ = run_op("eig", np.array([[2.0, 1.0], [0.0, 3.0]]))
    assert w.dtype == np.complex128
    np.testing.assert_allclose(np.sort(w.real), [2.0, 3.0])
    np.testing.assert_array_equal(w.imag, 0.0)


# ---------------------------------------------------------------- type rules
SQUARE_OPS = ["eigh", "eigvalsh", "cholesky", "inv", "det", "slogdet", "eig"]
ALL_ONE_INPUT = [*SQUARE_OPS, "qr", "svd", "svdvals", "pinv"]


@pytest.mark.parametrize("kind", SQUARE_OPS)
def test_square_required(kind: str) -> None:
    with pytest.raises(OpBuildError, match=r"a must be square in its last two dims, got 3x4"):
        out_type(kind, TensorType("float64", (2, 3, 4)))
    # Unknown dims cannot be checked, but a known one fixes the other.
    types = out_type(kind, TensorType("float64", (None, 3)))
    types = types if isinstance(types, tuple) else (types,)
    assert all(t.shape in ((), (3,), (3, 3)) for t in types)


@pytest.mark.parametrize("kind", ALL_ONE_INPUT)
def test_rank_and_dtype_errors(kind: str) -> None:
    for shape in [(), (4,)]:
        with pytest.raises(OpBuildError, match=f"stack of matrices \\(rank >= 2\\), got rank {len(shape)}"):
            out_type(kind, TensorType("float64", shape))
    with pytest.raises(OpBuildError, match="float16 is not supported by linalg ops"):
        out_type(kind, TensorType("float16", (3, 3)))
    types = out_type(kind, TensorType("float32", None))
    types = types if isinstance(types, tuple) else (types,)
    assert all(t.shape is None for t in types)
    # bool and integers are computed in float64, as numpy.linalg does (eig's results are complex).
    types = out_type(kind, TensorType("bool", (3, 3)))
    types = types if isinstance(types, tuple) else (types,)
    assert all(t.dtype == (np.complex128 if kind == "eig" else np.float64) for t in types)


@pytest.mark.parametrize("kind, attrs", [
    ("eigh", {}), ("eigh", {"UPLO": "u"}), ("eigvalsh", {}), ("qr", {}), ("qr", {"mode": "complete"}),
    ("svd", {}), ("svd", {"full_matrices": True}), ("svdvals", {}), ("cholesky", {"upper": True}), ("inv", {}),
    ("det", {}), ("slogdet", {}), ("pinv", {}), ("pinv", {"rtol": 1e-3, "hermitian": True}),
])
@pytest.mark.parametrize("shape", [(2, 5, 5), (None, 4, 4), (3, None, None), (0, 3, 3)])
@pytest.mark.parametrize("dtype", ["float32", "int16", "complex64"])
def test_types_match_numpy(kind: str, attrs: dict[str, Any], shape: tuple[int | None, ...], dtype: str) -> None:
    """The inferred types agree with what numpy.linalg returns for a concrete input of that type."""
    types = out_type(kind, TensorType(dtype, shape), **attrs)
    types = types if isinstance(types, tuple) else (types,)
    concrete = tuple(5 if d is None else d for d in shape)
    a = np.broadcast_to(np.eye(concrete[-1]) * 2, concrete).astype(dtype)
    fn = getattr(np.linalg, kind)
    np_attrs = {"full_matrices": False, **attrs} if kind == "svd" else attrs
    res = fn(a, **np_attrs)
    res = tuple(res) if isinstance(res, tuple) else (res,)
    assert len(types) == len(res)
    for t, r in zip(types, res, strict=True):
        assert t.accepts(r), f"{kind}{attrs}: type {t} does not accept numpy's {r.dtype}{r.shape}"


def test_qr_and_svd_shapes() -> None:
    f = "float64"
    assert out_type("qr", TensorType(f, (7, 3)), mode="complete") == (TensorType(f, (7, 7)), TensorType(f, (7, 3)))
    assert out_type("qr", TensorType(f, (None, 3, 7))) == (TensorType(f, (None, 3, 3)), TensorType(f, (None, 3, 7)))
    assert out_type("qr", TensorType(f, (None, 3))) == (TensorType(f, (None, None)), TensorType(f, (None, 3)))
    assert out_type("svd", TensorType(f, (0, 5)))[1] == TensorType(f, (0,))
    assert out_type("svd", TensorType("complex64", (2, None, 3)), full_matrices=True) == (
        TensorType("complex64", (2, None, None)), TensorType("float32", (2, None)),
        TensorType("complex64", (2, 3, 3)))
    assert out_type("pinv", TensorType(f, (2, 5, 3))) == TensorType(f, (2, 3, 5))


def test_solve_types() -> None:
    f, c = "float64", "complex64"
    assert out_type("solve", TensorType(f, (2, 4, 4)), TensorType(f, (4,))) == TensorType(f, (2, 4))
    assert out_type("solve", TensorType(f, (2, 1, 4, 4)), TensorType(f, (3, 4, 5))) == TensorType(f, (2, 3, 4, 5))
    assert out_type("solve", TensorType(f, (None, None)), TensorType(f, (6, 2))) == TensorType(f, (6, 2))
    assert out_type("solve", TensorType(c, (3, 3)), TensorType("int32", (3,))) == TensorType("complex128", (3,))
    assert out_type("solve", TensorType(f, None), TensorType(f, (3,))) == TensorType(f, None)
    # NumPy 2: b of rank a.ndim - 1 is a stack of matrices, not of vectors.
    assert out_type("solve", TensorType(f, (2, 3, 3)), TensorType(f, (3, 3))) == TensorType(f, (2, 3, 3))


@pytest.mark.parametrize("a, b, match", [
    ((3, 4), (3,), "a must be square"),
    ((3, 3), (4,), "a is 3x3 but b has 4 rows"),
    ((2, 3, 3), (2, 4, 1), "a is 3x3 but b has 4 rows"),
    ((3, 3), (), "b must be a vector"),
    ((2, 3, 3), (3, 3, 1), r"batch dims \(2,\) of a and \(3,\) of b do not broadcast"),
    ((3,), (3,), "rank >= 2"),
])
def test_solve_errors(a: tuple[int, ...], b: tuple[int, ...], match: str) -> None:
    with pytest.raises(OpBuildError, match=match):
        out_type("solve", TensorType("float64", a), TensorType("float64", b))


@pytest.mark.parametrize("kind, attrs, match", [
    ("eigh", {"UPLO": "X"}, "UPLO must be 'L' or 'U'"),
    ("eigvalsh", {"UPLO": 1}, "expected a string"),
    ("qr", {"mode": "r"}, "qr mode must be 'reduced' or 'complete'"),
    ("svd", {"full_matrices": 1}, "expected a bool"),
    ("cholesky", {"lower": True}, "unknown attribute"),
    ("pinv", {"hermitian": True}, "must be square"),
])
def test_attr_errors(kind: str, attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(OpBuildError, match=match):
        out_type(kind, TensorType("float64", (3, 4) if kind == "pinv" else (3, 3)), **attrs)
