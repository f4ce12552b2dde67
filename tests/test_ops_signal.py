"""Tests of the signal op family (ids 1200-1299): fft, rfft, irfft.

The references do not call NumPy's FFT: they multiply by an explicit DFT matrix, and build irfft's
Hermitian spectrum by hand. ``scipy.fft`` (a second FFT implementation) is checked as well.
Gradients are checked against central finite differences over the real and imaginary parts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.fft

import opgraph
from opcheck import RNG_SEED, check_op, out_type, rand, run_op
from opgraph.autodiff import build_grad_ops
from opgraph.core.registry import get_op
from opgraph.core.types import TensorType
from opgraph.errors import ExecutionError, OpBuildError

IDS = {"fft": 1200, "rfft": 1201, "irfft": 1202}
NORMS = ["backward", "ortho", "forward"]


def test_ids_and_family() -> None:
    for name, id_ in IDS.items():
        op = get_op(name)
        assert (op.id, op.family, get_op(id_).name) == (id_, "signal", name)
        assert op.doc and op.kernel is not None and op.grad is not None
    assert {o.name for o in opgraph.all_ops() if o.family == "signal"} == set(IDS)


# ---------------------------------------------------------------- references (no np.fft)
def _fit(x: np.ndarray, axis: int, n: int) -> np.ndarray:
    """x zero-padded or cut along axis to length n."""
    m = x.shape[axis]
    if m >= n:
        return np.take(x, np.arange(n), axis=axis)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, n - m)
    return np.pad(x, pad)


def _scale(n: int, norm: str, inverse: bool) -> float:
    if norm == "ortho":
        return 1 / np.sqrt(n)
    return 1 / n if (norm == "forward") != inverse else 1.0


def ref_fft(x: np.ndarray, axis: int = -1, n: int | None = None, inverse: bool = False,
            norm: str = "backward") -> np.ndarray:
    """The DFT as a matrix product (in complex128, then x's precision)."""
    ax = axis % x.ndim
    n = x.shape[ax] if n is None else n
    xf = np.moveaxis(_fit(x.astype(np.complex128), ax, n), ax, -1)
    k = np.arange(n)
    sign = 1 if inverse else -1
    mat = np.exp(sign * 2j * np.pi * np.outer(k, k) / n)
    y = (xf @ mat.T) * _scale(n, norm, inverse)
    out_dt = x.dtype if x.dtype.kind == "c" else (np.complex64 if x.dtype in (np.float16, np.float32)
                                                  else np.complex128)
    return np.moveaxis(y, -1, ax).astype(out_dt)


def ref_rfft(x: np.ndarray, axis: int = -1, n: int | None = None, norm: str = "backward") -> np.ndarray:
    ax = axis % x.ndim
    n = x.shape[ax] if n is None else n
    full = ref_fft(x, ax, n, norm=norm)
    return np.take(full, np.arange(n // 2 + 1), axis=ax)


def ref_irfft(x: np.ndarray, axis: int = -1, n: int | None = None, norm: str = "backward") -> np.ndarray:
    """The inverse DFT of the Hermitian spectrum that the one-sided x stands for, built entry by entry."""
    ax = axis % x.ndim
    n = 2 * (x.shape[ax] - 1) if n is None else n
    half = np.moveaxis(_fit(x.astype(np.complex128), ax, n // 2 + 1), ax, -1)
    full = np.zeros((*half.shape[:-1], n), dtype=np.complex128)
    for k in range(n // 2 + 1):
        # The DC bin, and for even n the Nyquist bin, are their own mirror images: only their real parts count.
        self_mirror = k == 0 or 2 * k == n
        full[..., k] = half[..., k].real if self_mirror else half[..., k]
        if not self_mirror:
            full[..., n - k] = np.conj(half[..., k])
    y = ref_fft(full, -1, inverse=True, norm=norm).real
    return np.moveaxis(y, -1, ax).astype(np.float32 if x.dtype == np.complex64 else np.float64)


def _tol(dtype: Any) -> dict[str, float]:
    single = np.dtype(dtype) in (np.complex64, np.float32, np.float16)
    return {"rtol": 2e-4, "atol": 2e-4} if single else {"rtol": 1e-9, "atol": 1e-9}


# ---------------------------------------------------------------- values
FFT_CASES = [((8,), {}), ((3, 5), {}), ((3, 5), {"axis": 0}), ((2, 3, 4), {"axis": 1, "n": 6}),
             ((2, 3, 4), {"axis": -1, "n": 3}), ((4, 1), {"axis": 0, "n": 1}), ((2, 7), {"n": 16})]


@pytest.mark.parametrize(("shape", "attrs"), FFT_CASES)
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("norm", NORMS)
def test_fft(shape: tuple[int, ...], attrs: dict[str, Any], dtype: str, inverse: bool, norm: str) -> None:
    x = rand(np.random.default_rng(RNG_SEED), shape, dtype)
    check_op("fft", [x], lambda a: ref_fft(a, inverse=inverse, norm=norm, **attrs), inverse=inverse, norm=norm,
             **attrs, **_tol(dtype))


@pytest.mark.parametrize(("shape", "attrs"), [*FFT_CASES, ((5,), {"n": 2}), ((3, 6), {"axis": 0, "n": 5})])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int16", "bool"])
@pytest.mark.parametrize("norm", NORMS)
def test_rfft(shape: tuple[int, ...], attrs: dict[str, Any], dtype: str, norm: str) -> None:
    x = rand(np.random.default_rng(RNG_SEED), shape, dtype)
    check_op("rfft", [x], lambda a: ref_rfft(a, norm=norm, **attrs), norm=norm, **attrs, **_tol(dtype))


IRFFT_CASES = [((5,), {}), ((4,), {"n": 7}), ((3, 5), {}), ((3, 5), {"axis": 0}), ((2, 3, 4), {"axis": 1, "n": 4}),
               ((2, 3, 4), {"n": 2}), ((2, 6), {"n": 16}), ((1,), {"n": 1}), ((2, 2), {"n": 3, "axis": 0})]


@pytest.mark.parametrize(("shape", "attrs"), IRFFT_CASES)
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("norm", NORMS)
def test_irfft(shape: tuple[int, ...], attrs: dict[str, Any], dtype: str, norm: str) -> None:
    x = rand(np.random.default_rng(RNG_SEED), shape, dtype)
    check_op("irfft", [x], lambda a: ref_irfft(a, norm=norm, **attrs), norm=norm, **attrs, **_tol(dtype))


def test_references_agree_with_numpy_fft() -> None:
    # The references are only as good as their agreement with the definition NumPy implements.
    rng = np.random.default_rng(RNG_SEED)
    x = rand(rng, (3, 6), "complex128")
    for norm in NORMS:
        np.testing.assert_allclose(ref_fft(x, 0, 5, False, norm), np.fft.fft(x, 5, 0, norm), atol=1e-12)
        np.testing.assert_allclose(ref_fft(x, 1, 8, True, norm), np.fft.ifft(x, 8, 1, norm), atol=1e-12)
        np.testing.assert_allclose(ref_rfft(x.real, 1, 7, norm), np.fft.rfft(x.real, 7, 1, norm), atol=1e-12)
        np.testing.assert_allclose(ref_irfft(x, 1, 9, norm), np.fft.irfft(x, 9, 1, norm), atol=1e-12)
        np.testing.assert_allclose(ref_irfft(x, 1, None, norm), np.fft.irfft(x, None, 1, norm), atol=1e-12)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("norm", NORMS)
def test_against_scipy_fft(dtype: str, norm: str) -> None:
    rng = np.random.default_rng(RNG_SEED)
    x = rand(rng, (4, 6), dtype)
    real = x.real.copy()
    tol = _tol(dtype)
    for kind, arr, want, attrs in [
        ("fft", x, scipy.fft.fft(x, n=9, axis=0, norm=norm), {"axis": 0, "n": 9}),
        ("fft", x, scipy.fft.ifft(x, n=4, norm=norm), {"n": 4, "inverse": True}),
        ("rfft", real, scipy.fft.rfft(real, n=5, norm=norm), {"n": 5}),
        ("rfft", real, scipy.fft.rfft(real, axis=0, norm=norm), {"axis": 0}),
        ("irfft", x, scipy.fft.irfft(x, norm=norm), {}),
        ("irfft", x, scipy.fft.irfft(x, n=7, axis=0, norm=norm), {"axis": 0, "n": 7}),
    ]:
        (got,) = run_op(kind, arr, norm=norm, **attrs)
        assert got.dtype == want.dtype, (kind, got.dtype, want.dtype)  # scipy keeps single precision too
        np.testing.assert_allclose(got, want, **tol, err_msg=f"{kind} {attrs}")


def test_round_trips() -> None:
    rng = np.random.default_rng(RNG_SEED)
    b = opgraph.GraphBuilder()
    z = b.input(("complex128", (3, 8)))
    r = b.input(("float64", (3, 7)))
    back = b.op("fft", b.op("fft", z, axis=0, norm="ortho"), axis=0, inverse=True, norm="ortho")
    rback = b.op("irfft", b.op("rfft", r), n=7)
    za, ra = rand(rng, (3, 8), "complex128"), rand(rng, (3, 7))
    got_z, got_r = b.run({z: za, r: ra}, [back, rback])
    np.testing.assert_allclose(got_z, za, atol=1e-12)
    np.testing.assert_allclose(got_r, ra, atol=1e-12)


def test_empty_and_padded_axes() -> None:
    # A zero-length axis needs n; other axes may be empty.
    x = np.zeros((0, 3), dtype=np.complex128)
    check_op("fft", [x], lambda a: ref_fft(a, axis=0, n=2), axis=0, n=2)
    check_op("fft", [x], lambda a: ref_fft(a), noncontig=False)
    check_op("rfft", [x.real], lambda a: ref_rfft(a), noncontig=False)


# ---------------------------------------------------------------- type rules
def T(dtype: str, shape: Any) -> TensorType:
    return TensorType(dtype, shape)


INFER_CASES = [
    ("fft", [T("complex64", (None, 4))], {}, ("complex64", (None, 4))),
    ("fft", [T("complex64", (None, 4))], {"axis": 0, "n": 3}, ("complex64", (3, 4))),
    ("fft", [T("complex128", (2, None))], {}, ("complex128", (2, None))),
    ("fft", [T("complex128", None)], {"n": 5}, ("complex128", None)),
    ("rfft", [T("float32", (None, 8))], {}, ("complex64", (None, 5))),
    ("rfft", [T("float16", (3,))], {"n": 7}, ("complex64", (4,))),
    ("rfft", [T("int8", (3, None))], {}, ("complex128", (3, None))),
    ("rfft", [T("float64", (3, None))], {"n": 6}, ("complex128", (3, 4))),
    ("rfft", [T("float64", None)], {}, ("complex128", None)),
    ("irfft", [T("complex64", (None, 5))], {}, ("float32", (None, 8))),
    ("irfft", [T("complex128", (5, 2))], {"axis": 0, "n": 3}, ("float64", (3, 2))),
    ("irfft", [T("complex128", (4, None))], {}, ("float64", (4, None))),
    ("irfft", [T("complex128", (4, None))], {"n": 9}, ("float64", (4, 9))),
    ("irfft", [T("complex64", None)], {}, ("float32", None)),
]


@pytest.mark.parametrize(("kind", "types", "attrs", "want"), INFER_CASES)
def test_type_rules_with_unknown_dims(kind: str, types: list[TensorType], attrs: dict[str, Any],
                                      want: tuple[str, Any]) -> None:
    assert out_type(kind, *types, **attrs) == T(*want)


def test_unknown_dims_run() -> None:
    rng = np.random.default_rng(RNG_SEED)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (None, None)))
    spec = b.op("rfft", x, n=6)
    y = b.op("irfft", spec)
    z = b.op("fft", b.op("cast", x, dtype="complex128"), axis=0)
    xa = rand(rng, (3, 5))
    got = b.run({x: xa}, [spec, y, z])  # the executor checks each result against its type
    np.testing.assert_allclose(got[0], ref_rfft(xa, n=6), atol=1e-12)
    np.testing.assert_allclose(got[1], ref_irfft(ref_rfft(xa, n=6)), atol=1e-12)
    np.testing.assert_allclose(got[2], ref_fft(xa, axis=0), atol=1e-12)


BUILD_ERRORS = [
    ("fft", [T("float64", (4,))], {}, "x must be complex, got float64 .use rfft"),
    ("irfft", [T("float32", (4,))], {}, "x must be complex, got float32"),
    ("rfft", [T("complex64", (4,))], {}, "x must be real, got complex64"),
    ("fft", [T("complex64", ())], {}, "rank >= 1"),
    ("fft", [T("complex64", (3,))], {"axis": 1}, "axis 1 is out of bounds"),
    ("fft", [T("complex64", (0, 3))], {"axis": 0}, "cannot transform an empty axis"),
    ("rfft", [T("float32", (3, 0))], {}, "cannot transform an empty axis"),
    ("irfft", [T("complex64", (1,))], {}, "default n = 2 . .m - 1. = 0"),
    ("fft", [T("complex64", (3,))], {"n": 0}, "n must be >= 1"),
    ("fft", [T("complex64", (3,))], {"norm": "none"}, "norm must be one of backward, ortho, forward"),
    ("rfft", [T("float32", (3,))], {"inverse": True}, "unknown attribute"),
]


@pytest.mark.parametrize(("kind", "types", "attrs", "match"), BUILD_ERRORS)
def test_build_errors(kind: str, types: list[TensorType], attrs: dict[str, Any], match: str) -> None:
    b = opgraph.GraphBuilder()
    with pytest.raises(OpBuildError, match=match):
        b.op(kind, *[b.input(t) for t in types], **attrs)


def test_run_time_error_on_empty_axis_of_unknown_length() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("complex128", (None,)))
    y = b.op("fft", x)
    with pytest.raises(ExecutionError):
        b.run({x: np.zeros(0, dtype=np.complex128)}, [y])


# ---------------------------------------------------------------- gradients (central finite differences)
# The losses take the real part of complex outputs with a cast (real's rule has no complex case), which warns.
no_complex_warning = pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning")


def _check_grad(kind: str, x: np.ndarray, **attrs: Any) -> None:
    """Gradient of the real loss Re(sum(c * kind(x))) against finite differences.

    For a complex input x = a + ib the autodiff layer's cotangent is dL/da - i dL/db (the convention
    of multiply's rule, g * x2 without a conjugate); for a real input it is dL/da.
    """
    rng = np.random.default_rng(7)
    b = opgraph.GraphBuilder()
    xin = b.input(TensorType.of(x))
    y = b.op(kind, xin, **attrs)
    c = rng.standard_normal(y.type.shape) + (1j * rng.standard_normal(y.type.shape) if y.dtype.kind == "c" else 0)
    loss = b.op("sum", b.op("cast", b.op("multiply", y, b.constant(c.astype(y.dtype))), dtype="float64"))
    (g,) = build_grad_ops(b, loss, [xin])
    got = b.run({xin: x}, [g])[0]
    assert got.dtype == x.dtype and got.shape == x.shape

    def f(a: np.ndarray) -> float:
        return float(b.run({xin: a}, [loss])[0])

    eps = 1e-6
    want = np.zeros(x.shape, dtype=x.dtype)
    for pos in np.ndindex(x.shape):
        for unit in ((1, 1j) if x.dtype.kind == "c" else (1,)):
            step = np.zeros_like(x)
            step[pos] = eps * unit
            d = (f(x + step) - f(x - step)) / (2 * eps)
            want[pos] += d if unit == 1 else -1j * d
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{kind} {attrs}")


GRAD_ATTRS = [{}, {"axis": 0}, {"n": 7}, {"n": 3, "axis": 0, "norm": "ortho"}, {"n": 8, "norm": "forward"}]


@no_complex_warning
@pytest.mark.parametrize("attrs", GRAD_ATTRS)
@pytest.mark.parametrize("inverse", [False, True])
def test_fft_grad(attrs: dict[str, Any], inverse: bool) -> None:
    _check_grad("fft", rand(np.random.default_rng(1), (4, 5), "complex128"), inverse=inverse, **attrs)


@no_complex_warning
@pytest.mark.parametrize("attrs", [*GRAD_ATTRS, {"n": 6}, {"n": 2}])
def test_rfft_grad(attrs: dict[str, Any]) -> None:
    _check_grad("rfft", rand(np.random.default_rng(2), (4, 5)), **attrs)


@no_complex_warning
@pytest.mark.parametrize("attrs", [*GRAD_ATTRS, {"n": 9}, {"n": 12}, {"n": 2, "axis": 0}])
def test_irfft_grad(attrs: dict[str, Any]) -> None:
    _check_grad("irfft", rand(np.random.default_rng(3), (4, 5), "complex128"), **attrs)


def test_single_precision_grads_keep_dtypes() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (2, 6)))
    spec = b.op("rfft", x)
    loss = b.op("sum", b.op("irfft", spec, n=6))
    gx = build_grad_ops(b, loss, [x])[0]
    assert gx.type == TensorType("float32", (2, 6))
    got = b.run({x: np.ones((2, 6), dtype=np.float32)}, [gx])[0]
    # irfft(rfft(x), n) is the identity, so the gradient of its sum is all ones.
    np.testing.assert_allclose(got, np.ones((2, 6)), atol=1e-5)


def test_compiled_runtime_matches_executor() -> None:
    # The compiled runtime writes into planned (possibly reused) buffers through the kernels' out=.
    from opgraph.runtime.compiled import compile

    b = opgraph.GraphBuilder()
    x = b.input(("float32", (4, 6)), name="x")
    spec = b.op("rfft", b.op("exp", x), axis=0, n=8)
    full = b.op("fft", spec, inverse=True, norm="ortho")
    back = b.op("irfft", b.op("fft", full, norm="ortho"), axis=0, n=8)
    b.output(spec, full, back)
    g = b.freeze().verify()
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)}
    want = g.run(feeds)
    f = compile(g)
    for _ in range(2):
        for got, w in zip(f(feeds), want, strict=True):
            np.testing.assert_array_equal(got, w)
