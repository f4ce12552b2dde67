"""Elementwise ops against NumPy/SciPy: broadcasting, zero-size, promotion, non-contiguous, out=."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special

import opgraph
from opcheck import check_op, rand
from opgraph.core.registry import all_ops
from opgraph.ops.elementwise import BINARY, UNARY

RNG = np.random.default_rng(7)

# NumPy reference for each op name; the op's kernel may use the same ufunc,
# so dtype and shape rules are checked independently below against NumPy's
# result on real arrays, and SciPy/NumPy values are the reference.
NUMPY_REF = {
    "negative": np.negative, "positive": np.positive, "abs": np.abs, "sign": np.sign, "exp": np.exp,
    "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "log2": np.log2, "log10": np.log10, "sqrt": np.sqrt,
    "square": np.square, "reciprocal": np.reciprocal, "sin": np.sin, "cos": np.cos, "tan": np.tan,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "floor": np.floor, "ceil": np.ceil,
    "trunc": np.trunc, "round": np.round, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "erf": scipy.special.erf, "gelu": lambda x: x * scipy.special.ndtr(x),
    "silu": lambda x: x * scipy.special.expit(x), "hard_swish": lambda x: x * np.clip(x / 6 + 0.5, 0, 1),
    "hard_sigmoid": lambda x: np.clip(0.2 * x + 0.5, 0, 1),
    "erfc": scipy.special.erfc, "isnan": np.isnan, "isinf": np.isinf,
    "isfinite": np.isfinite, "logical_not": np.logical_not, "bitwise_invert": np.invert, "conj": np.conj,
    "signbit": np.signbit, "exp2": np.exp2, "cbrt": np.cbrt,
    "real": lambda x: np.real(x).copy(), "imag": lambda x: np.imag(x).copy(),
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "floor_divide": np.floor_divide, "remainder": np.remainder, "power": np.power, "maximum": np.maximum,
    "minimum": np.minimum, "atan2": np.arctan2, "hypot": np.hypot, "logaddexp": np.logaddexp,
    "copysign": np.copysign, "nextafter": np.nextafter, "equal": np.equal, "not_equal": np.not_equal,
    "less": np.less, "less_equal": np.less_equal, "greater": np.greater, "greater_equal": np.greater_equal,
    "logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor,
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
    "bitwise_left_shift": np.left_shift, "bitwise_right_shift": np.right_shift, "fmax": np.fmax, "fmin": np.fmin,
    "fmod": np.fmod,
}
INT_ONLY = {"bitwise_invert", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
            "bitwise_right_shift"}
# Domain of each function, so random inputs stay where NumPy gives finite values.
DOMAIN = {"log": (0.1, 5), "log2": (0.1, 5), "log10": (0.1, 5), "sqrt": (0.0, 5), "log1p": (-0.5, 5),
          "asin": (-0.9, 0.9), "acos": (-0.9, 0.9), "atanh": (-0.9, 0.9), "acosh": (1.1, 5),
          "reciprocal": (0.5, 3), "divide": (0.5, 3), "floor_divide": (1, 4), "remainder": (1, 4), "fmod": (1, 4),
          "power": (0.5, 2), "bitwise_left_shift": (0, 5), "bitwise_right_shift": (0, 5)}


def test_reference_table_covers_every_elementwise_op() -> None:
    names = {d.name for d in all_ops() if d.family == "elementwise" and d.arity in (1, 2)}
    assert names - {"where", "cast", "clip"} <= set(NUMPY_REF)


def _dtypes(name: str) -> list[str]:
    if name in INT_ONLY:
        return ["int8", "uint16", "int64"]
    if name in ("isnan", "isinf", "isfinite", "signbit"):
        return ["float32", "float64", "int16"]
    if name in ("floor", "ceil", "trunc"):
        return ["float32", "float64"]  # integers: test_int_rounding
    if name in ("erf", "erfc", "cbrt", "logaddexp", "copysign", "nextafter", "atan2", "hypot", "fmax", "fmin"):
        return ["float32", "float64"]
    if name in ("floor_divide", "remainder", "fmod"):
        return ["float64", "int32", "uint8"]
    if name == "power":
        return ["float64", "float32", "int64"]
    if name.startswith("logical"):
        return ["bool", "float64", "int8"]
    return ["float64", "float32", "float16", "int32", "complex128"] if name not in (
        "sign", "maximum", "minimum", "less", "less_equal", "greater", "greater_equal", "sigmoid",
        "expm1", "log1p", "exp2", "real", "imag") else ["float64", "float32", "int32"]


UNARY_CASES = [(n, dt) for n, _, _ in UNARY for dt in _dtypes(n)]
BINARY_CASES = [(n, dt) for n, _, _, _ in BINARY for dt in _dtypes(n)]


@pytest.mark.parametrize(("name", "dtype"), UNARY_CASES)
@pytest.mark.parametrize("shape", [(3, 4), (0, 5), ()])
def test_unary(name: str, dtype: str, shape: tuple[int, ...]) -> None:
    lo, hi = DOMAIN.get(name, (-3, 3))
    if np.dtype(dtype).kind == "c" and name in ("sqrt", "log", "log2", "log10", "acosh", "reciprocal"):
        lo, hi = 0.5, 2
    x = rand(RNG, shape, dtype, lo, hi)
    with np.errstate(all="ignore"):
        check_op(name, [x], NUMPY_REF[name], rtol=2e-3 if dtype == "float16" else 1e-6)


def test_int_rounding() -> None:
    x = np.array([-2, 3], dtype=np.int16)
    for name in ("floor", "ceil", "trunc"):
        check_op(name, [x], NUMPY_REF[name])


@pytest.mark.parametrize(("name", "dtype"), BINARY_CASES)
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 1, 4), (3, 1)), ((0, 3), (3,)), ((), (2,))])
def test_binary(name: str, dtype: str, shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    lo, hi = DOMAIN.get(name, (-3, 3))
    a = rand(RNG, shapes[0], dtype, lo, hi)
    b = rand(RNG, shapes[1], dtype, lo, hi)
    with np.errstate(all="ignore"):
        check_op(name, [a, b], NUMPY_REF[name], rtol=2e-3 if dtype == "float16" else 1e-6)


PROMOTIONS = [("int8", "uint8"), ("int8", "float16"), ("uint64", "int64"), ("bool", "int32"),
              ("float32", "complex64"), ("int16", "float32")]


@pytest.mark.parametrize(("name", "a_dt", "b_dt"), [
    (n, a, b) for n in ("add", "multiply", "subtract", "maximum", "less", "divide") for a, b in PROMOTIONS])
def test_binary_promotion(name: str, a_dt: str, b_dt: str) -> None:
    check_op(name, [rand(RNG, (2, 3), a_dt, 1, 4), rand(RNG, (3,), b_dt, 1, 4)], NUMPY_REF[name], rtol=1e-6)


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4), (3, 4)), ((3, 1), (4,), ()), ((0, 2), (2,), (1, 2))])
def test_where(shapes: tuple[tuple[int, ...], ...]) -> None:
    c = rand(RNG, shapes[0], "bool")
    x = rand(RNG, shapes[1], "float32")
    y = rand(RNG, shapes[2], "int16")
    check_op("where", [c, x, y], np.where)


def test_where_needs_bool_condition() -> None:
    b = opgraph.GraphBuilder()
    with pytest.raises(opgraph.OpBuildError, match=r"where\(f64\[3\].*condition must be bool"):
        b.op("where", b.input(("float64", (3,))), b.input(("float64", (3,))), b.input(("float64", (3,))))


@pytest.mark.parametrize("src", ["float64", "int32", "bool", "complex64", "uint8"])
@pytest.mark.parametrize("dst", ["float32", "int8", "bool", "uint16", "complex128", "float16"])
def test_cast(src: str, dst: str) -> None:
    x = rand(RNG, (3, 4), src, 0, 100)
    with np.errstate(all="ignore"), __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")
        check_op("cast", [x], lambda a: a.astype(dst), dtype=dst)


def test_cast_version_encodes_both_dtypes() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2,)))
    y = b.op("cast", x, dtype="int8")
    z = b.op("cast", x, dtype="int16")
    g = b.freeze()
    assert g.op_version[y.producer.id] != g.op_version[z.producer.id]


def test_clip() -> None:
    check_op("clip", [rand(RNG, (4, 3)), np.float64(-1.0) * np.ones(3), np.array(1.0)], np.clip)


def test_shape_mismatch_names_op_types_and_line() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (2, 3)))
    y = b.input(("float32", (4,)))
    with pytest.raises(opgraph.OpBuildError) as info:
        b.op("multiply", x, y)
    msg = str(info.value)
    assert "multiply(f32[2,3], f32[4])" in msg
    assert "do not broadcast" in msg
    assert __file__ in msg  # the user's line
    assert info.value.op == "multiply"


def test_bool_subtract_is_a_build_error_as_in_numpy() -> None:
    with pytest.raises(TypeError):
        np.subtract(np.array([True]), np.array([False]))
    b = opgraph.GraphBuilder()
    x = b.input(("bool", (2,)))
    with pytest.raises(opgraph.OpBuildError, match=r"subtract\(bool\[2\], bool\[2\]\)"):
        b.op("subtract", x, x)


def test_bitwise_on_floats_is_a_build_error() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2,)))
    with pytest.raises(opgraph.OpBuildError, match=r"bitwise_and.*not defined for dtype"):
        b.op("bitwise_and", x, x)


def test_unknown_dims_broadcast() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (None, 3)))
    y = b.input(("float64", (1, 3)))
    s = b.op("add", x, y)
    assert s.shape == (None, 3)
    z = b.input(("float64", None))
    assert b.op("add", x, z).shape is None
    g = b.freeze()
    out = g.run({x.id: np.ones((5, 3)), y.id: np.ones((1, 3))}, [s.id])
    assert out[0].shape == (5, 3)


def test_elementwise_flags() -> None:
    from opgraph.core.registry import get_op

    assert get_op("add").commutative and not get_op("subtract").commutative
    assert get_op("exp").elementwise and get_op("exp").inplace == (0,)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int8", "int32", "int64"])
def test_fmod_takes_the_dividends_sign(dtype: str) -> None:
    # C's fmod (and ONNX Mod with fmod=1): the result has the dividend's sign, unlike remainder.
    a = np.array([-7, 7, -7, 7, 0, -1, 5, -6], dtype=dtype)
    b = np.array([3, 3, -3, -3, 2, 4, -5, 4], dtype=dtype)
    want = np.array([-1, 1, -1, 1, 0, -1, 0, -2], dtype=dtype)
    check_op("fmod", [a, b], lambda x, y: want)
    if dtype.startswith("float"):
        import math

        x, y = rand(RNG, (5, 4), dtype, -9, 9), rand(RNG, (4,), dtype, 0.5, 3) * np.array([1, -1, 1, -1], dtype)
        check_op("fmod", [x, y], lambda p, q: np.array([[math.fmod(u, v) for u, v in zip(r, q, strict=True)]
                                                         for r in p], dtype=dtype), rtol=1e-6)


def test_fmod_vs_torch() -> None:
    torch = pytest.importorskip("torch")
    from opcheck import run_op

    for dtype in ("float64", "int32"):
        x = rand(RNG, (3, 4), dtype, -20, 20)
        y = rand(RNG, (4,), dtype, 1, 6) * np.array([1, -1, 1, -1], dtype)
        (got,) = run_op("fmod", x, y)
        np.testing.assert_array_equal(got, torch.fmod(torch.from_numpy(x), torch.from_numpy(y)).numpy())


def test_fmod_grad_matches_finite_differences() -> None:
    from opgraph.autodiff import build_grad_ops

    b = opgraph.GraphBuilder()
    x, y = b.input(("float64", (2, 3))), b.input(("float64", (3,)))
    loss = b.sum(b.multiply(b.op("fmod", x, y), b.constant(np.array([[1.0, -2.0, 0.5], [3.0, 1.5, -1.0]]))))
    xa = np.array([[-2.3, 1.7, 4.1], [0.45, -3.3, 2.2]])
    ya = np.array([0.7, -0.9, 1.3])
    got = b.run({x: xa, y: ya}, build_grad_ops(b, loss, [x, y]))
    eps = 1e-6
    for k, (v, a) in enumerate(((x, xa), (y, ya))):
        fd = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            for sgn in (1, -1):
                a2 = a.copy()
                a2[i] += sgn * eps
                feeds = {x: xa, y: ya, v: a2}
                fd[i] += sgn * float(b.run(feeds, [loss])[0]) / (2 * eps)
        np.testing.assert_allclose(got[k], fd, rtol=1e-6, atol=1e-6)
