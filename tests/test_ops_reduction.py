"""Reduction ops against NumPy/SciPy: axes, keepdims, zero-size, dtype promotion, non-contiguous, out=."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import scipy.special

import opgraph
from opcheck import check_op, rand, run_op
from opgraph.core.registry import all_ops, get_op
from opgraph.core.types import TensorType

SEED = 20240501

ALL_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64", "complex64", "complex128"]



def _logsumexp_ref(x: np.ndarray, axis: Any = None, keepdims: bool = False) -> Any:
    """scipy.special.logsumexp, except where SciPy departs from NumPy's reduction rules.

    SciPy returns shape (1,) for some 0-d inputs, and fails on an empty
    array when every axis is reduced; there the exact answer is direct.
    """
    if x.ndim == 0 or x.size == 0:
        with np.errstate(divide="ignore"):
            dt = np.asarray(scipy.special.logsumexp(np.ones(2, x.dtype))).dtype
            return np.log(np.sum(np.exp(x.astype(dt)), axis=axis, keepdims=keepdims))
    return scipy.special.logsumexp(x, axis=axis, keepdims=keepdims)


# NumPy (or SciPy) reference for each op, called as ref(x, **attrs).
AXIS_REDUCTIONS: dict[str, Callable[..., Any]] = {
    "sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "mean": np.mean, "any": np.any,
    "all": np.all, "logsumexp": _logsumexp_ref,
}
MOMENTS: dict[str, Callable[..., Any]] = {"var": np.var, "std": np.std}
ARGS: dict[str, Callable[..., Any]] = {"argmax": np.argmax, "argmin": np.argmin}
CUMULATIVE: dict[str, Callable[..., Any]] = {"cumsum": np.cumsum, "cumprod": np.cumprod}
IDS = {"sum": 500, "prod": 501, "max": 502, "min": 503, "mean": 504, "any": 505, "all": 506, "var": 507,
       "std": 508, "argmax": 510, "argmin": 511, "cumsum": 520, "cumprod": 521, "logsumexp": 530}


def _tol(dtype: str, name: str) -> dict[str, float]:
    if dtype == "float16":
        return {"rtol": 1e-2, "atol": 1e-2}
    if dtype in ("float32", "complex64"):
        return {"rtol": 1e-5, "atol": 1e-5}
    if name == "logsumexp":  # a different (equally stable) formula from SciPy's
        return {"rtol": 1e-12, "atol": 1e-12}
    return {"rtol": 1e-9, "atol": 1e-12}


def _input(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, name: str) -> np.ndarray:
    # Products stay small enough for float16 and int8 accumulations.
    lo, hi = (-1.5, 1.5) if "prod" in name else (-3.0, 3.0)
    return rand(rng, shape, dtype, lo, hi)


def _ref(fn: Callable[..., Any], **kw: Any) -> Callable[[np.ndarray], Any]:
    def ref(x: np.ndarray) -> Any:
        return np.asarray(fn(x, **kw))

    return ref


def _build_type(kind: str, *types: TensorType, **attrs: Any) -> TensorType:
    b = opgraph.GraphBuilder()
    ins = [b.input(t) for t in types]
    t = b.op(kind, *ins, **attrs).type
    assert isinstance(t, TensorType)
    return t


def test_registry_ids_and_family() -> None:
    for name, id_ in IDS.items():
        d = get_op(name)
        assert d.id == id_ and d.family == "reduction" and d.arity == 1 and not d.elementwise
    names = {d.name for d in all_ops() if d.family == "reduction"}
    assert names == set(IDS)
    assert get_op("var").normalise_attrs({}) == (("axis", None), ("keepdims", False), ("correction", 0.0))
    assert get_op("argmax").normalise_attrs({"axis": np.int64(1)}) == (("axis", 1), ("keepdims", False))
    assert get_op("cumsum").normalise_attrs({}) == (("axis", None),)
    assert get_op("logsumexp").normalise_attrs({"axis": [0, 1]}) == (("axis", (0, 1)), ("keepdims", False))


# ------------------------------------------------------------------ dtype rules vs NumPy, every dtype
@pytest.mark.parametrize("name", list(IDS))
def test_dtype_rule_matches_numpy_for_every_dtype(name: str) -> None:
    ref = {**AXIS_REDUCTIONS, **MOMENTS, **ARGS, **CUMULATIVE}[name]
    for dt in ALL_DTYPES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = np.asarray(ref(np.ones((2, 3), dt))).dtype
        assert _build_type(name, TensorType(dt, (2, 3))).dtype == want, (name, dt)


# ------------------------------------------------------------------ values, dtypes, axes
REDUCE_DTYPES = ["bool", "int8", "uint8", "int32", "float16", "float32", "float64", "complex128"]


@pytest.mark.parametrize("name", list(AXIS_REDUCTIONS))
@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
@pytest.mark.parametrize(("axis", "keepdims"), [(None, False), (1, True), ((0, -1), False)])
def test_reduce_dtypes(name: str, dtype: str, axis: Any, keepdims: bool) -> None:
    rng = np.random.default_rng(SEED)
    x = _input(rng, (3, 5), dtype, name)
    check_op(name, [x], _ref(AXIS_REDUCTIONS[name], axis=axis, keepdims=keepdims), **_tol(dtype, name),
             axis=axis, keepdims=keepdims)


AXES_CASES: list[tuple[tuple[int, ...], Any]] = [
    ((2, 3, 4), None), ((2, 3, 4), 0), ((2, 3, 4), -1), ((2, 3, 4), (0, 2)), ((2, 3, 4), (-1, -3)),
    ((2, 3, 4), (2, 0, 1)), ((2, 3, 4), ()), ((5,), 0), ((), None), ((), ()),
]


@pytest.mark.parametrize("name", list(AXIS_REDUCTIONS) + list(MOMENTS))
@pytest.mark.parametrize(("shape", "axis"), AXES_CASES)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce_axes(name: str, shape: tuple[int, ...], axis: Any, keepdims: bool) -> None:
    rng = np.random.default_rng(SEED)
    x = _input(rng, shape, "float64", name)
    fn = {**AXIS_REDUCTIONS, **MOMENTS}[name]
    check_op(name, [x], _ref(fn, axis=axis, keepdims=keepdims), **_tol("float64", name), axis=axis,
             keepdims=keepdims)


@pytest.mark.parametrize("name", list(MOMENTS))
@pytest.mark.parametrize("dtype", ["int8", "uint8", "bool", "float16", "float32", "float64", "complex64",
                                   "complex128"])
@pytest.mark.parametrize("correction", [0.0, 1, 1.5])
def test_moments(name: str, dtype: str, correction: float) -> None:
    rng = np.random.default_rng(SEED)
    x = _input(rng, (4, 6), dtype, name)
    for axis in (None, -1, (0, 1)):
        check_op(name, [x], _ref(MOMENTS[name], axis=axis, ddof=correction), **_tol(dtype, name), axis=axis,
                 correction=correction)


@pytest.mark.parametrize("name", list(ARGS))
@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "float16", "float32", "float64", "complex128"])
@pytest.mark.parametrize(("shape", "axis"), [((3, 5), None), ((3, 5), 0), ((3, 5), -1), ((2, 3, 4), 1),
                                             ((7,), None), ((), None)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_argmax_argmin(name: str, dtype: str, shape: tuple[int, ...], axis: int | None, keepdims: bool) -> None:
    rng = np.random.default_rng(SEED)
    x = _input(rng, shape, dtype, name)
    (got,) = check_op(name, [x], _ref(ARGS[name], axis=axis, keepdims=keepdims), axis=axis, keepdims=keepdims)
    assert got.dtype == np.int64


@pytest.mark.parametrize("name", list(CUMULATIVE))
@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int32", "float16", "float32", "float64", "complex128"])
@pytest.mark.parametrize(("shape", "axis"), [((3, 4), None), ((3, 4), 0), ((3, 4), -1), ((2, 3, 2), 1),
                                             ((6,), None), ((), None), ((0, 3), None), ((0, 3), 1)])
def test_cumulative(name: str, dtype: str, shape: tuple[int, ...], axis: int | None) -> None:
    rng = np.random.default_rng(SEED)
    x = _input(rng, shape, dtype, name)
    check_op(name, [x], _ref(CUMULATIVE[name], axis=axis), **_tol(dtype, name), axis=axis)


# ------------------------------------------------------------------ zero-size inputs
@pytest.mark.parametrize("name", ["sum", "prod", "any", "all", "logsumexp"])
@pytest.mark.parametrize("axis", [0, 1, None, (0, 1)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce_zero_size_with_identity(name: str, axis: Any, keepdims: bool) -> None:
    x = np.zeros((0, 3))
    check_op(name, [x], _ref(AXIS_REDUCTIONS[name], axis=axis, keepdims=keepdims), axis=axis, keepdims=keepdims)


@pytest.mark.parametrize("name", ["max", "min", "mean", "var", "std"])
def test_reduce_zero_size_over_nonempty_axis(name: str) -> None:
    # (0, 3) reduced over axis 1 has no empty reductions: the result is simply (0,).
    x = np.zeros((0, 3), np.float32)
    fn = {**AXIS_REDUCTIONS, **MOMENTS}[name]
    check_op(name, [x], _ref(fn, axis=1), axis=1)


@pytest.mark.parametrize(("name", "attrs"), [("max", {"axis": 0}), ("min", {}), ("max", {"axis": (0, 1)}),
                                             ("argmax", {}), ("argmin", {"axis": 0})])
def test_empty_reduction_without_identity_raises_at_run(name: str, attrs: dict[str, Any]) -> None:
    x = np.zeros((0, 3))
    with pytest.raises(ValueError):
        {**AXIS_REDUCTIONS, **ARGS}[name](x, **attrs)  # NumPy refuses too
    with pytest.raises(opgraph.ExecutionError, match=name):
        run_op(name, x, **attrs)


def test_argmax_zero_size_over_nonempty_axis() -> None:
    x = np.zeros((0, 3))
    check_op("argmax", [x], _ref(np.argmax, axis=1), axis=1)


# ------------------------------------------------------------------ logsumexp is stable
def test_logsumexp_stable_and_special_values() -> None:
    x = np.array([[1000.0, 1000.0, -1000.0], [-np.inf, -np.inf, -np.inf], [np.inf, 0.0, 1.0], [-800.0, -801.0, 0.0]])
    with np.errstate(all="ignore"):
        (got,) = run_op("logsumexp", x, axis=1)
        want = scipy.special.logsumexp(x, axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got[0] == pytest.approx(1000.0 + np.log(2.0))
    assert got[1] == -np.inf and got[2] == np.inf


def test_logsumexp_complex() -> None:
    rng = np.random.default_rng(SEED)
    x = rand(rng, (3, 4), "complex128") * 100  # exp would overflow without the shift
    check_op("logsumexp", [x], _ref(scipy.special.logsumexp, axis=1), rtol=1e-12, axis=1)


def test_results_are_arrays_not_scalars() -> None:
    x = np.arange(6.0).reshape(2, 3)
    for name in IDS:
        fn = get_op(name).kernel_for(12)
        attrs = dict(get_op(name).normalise_attrs({}))
        assert isinstance(fn(x, **attrs), np.ndarray), name


# ------------------------------------------------------------------ unknown dims and ranks
@pytest.mark.parametrize(("name", "shape", "attrs", "want"), [
    ("sum", (None, 3), {"axis": 1}, (None,)),
    ("sum", (None, 3), {"axis": 0}, (3,)),
    ("sum", (None, 3), {"axis": -1, "keepdims": True}, (None, 1)),
    ("sum", (None, 3), {}, ()),
    ("mean", (None, 3), {"keepdims": True}, (1, 1)),
    ("var", (2, None, 4), {"axis": (0, 2)}, (None,)),
    ("max", None, {}, ()),
    ("max", None, {"keepdims": True}, None),
    ("prod", None, {"axis": 0}, None),
    ("argmax", (None, 3), {"axis": 0}, (3,)),
    ("argmin", None, {}, ()),
    ("argmin", None, {"axis": 1}, None),
    ("cumsum", (None, 3), {}, (None,)),
    ("cumsum", (2, 3), {}, (6,)),
    ("cumsum", None, {}, (None,)),
    ("cumprod", (None, 3), {"axis": 1}, (None, 3)),
    ("cumprod", None, {"axis": 1}, None),
    ("logsumexp", (None, None), {"axis": 0}, (None,)),
])
def test_unknown_dims(name: str, shape: Any, attrs: dict[str, Any], want: Any) -> None:
    t = _build_type(name, TensorType("float64", shape), **attrs)
    assert t.shape == want


def test_run_with_unknown_dims() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(TensorType("float64", (None, 3)), name="x")
    s = b.op("sum", x, axis=1)
    c = b.op("cumsum", x)
    assert s.type == TensorType("float64", (None,)) and c.type == TensorType("float64", (None,))
    data = np.arange(12.0).reshape(4, 3)
    got_s, got_c = b.run({x: data}, [s, c])
    np.testing.assert_array_equal(got_s, data.sum(axis=1))
    np.testing.assert_array_equal(got_c, np.cumsum(data))


# ------------------------------------------------------------------ build-time errors
@pytest.mark.parametrize(("name", "shape", "attrs", "reason"), [
    ("sum", (2, 3), {"axis": 2}, "out of bounds"),
    ("sum", (2, 3), {"axis": -3}, "out of bounds"),
    ("mean", (2, 3), {"axis": (0, -2)}, "repeated axis"),
    ("max", (), {"axis": 0}, "out of bounds"),
    ("var", (2, 3), {"axis": (0, 5)}, "out of bounds"),
    ("argmax", (2, 3), {"axis": 2}, "out of bounds"),
    ("argmin", (2, 3), {"axis": (0, 1)}, "expected an integer"),
    ("cumsum", (2, 3), {"axis": -3}, "out of bounds"),
    ("cumprod", (2, 3), {"axis": 1.0}, "expected an integer"),
    ("sum", (2, 3), {"keepdims": 1}, "expected a bool"),
    ("sum", (2, 3), {"axis": "0"}, "expected an integer"),
    ("sum", (2, 3), {"axes": 0}, "unknown attribute"),
    ("logsumexp", (2, 3), {"axis": 7}, "out of bounds"),
])
def test_build_errors(name: str, shape: Any, attrs: dict[str, Any], reason: str) -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", shape))
    with pytest.raises(opgraph.OpBuildError, match=reason) as info:
        b.op(name, x, **attrs)
    assert str(info.value).startswith(f"{name}(f64[")
    assert info.value.op == name


def test_build_error_names_the_user_line() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3)))
    with pytest.raises(opgraph.OpBuildError, match=r"test_ops_reduction\.py:\d+"):
        b.op("sum", x, axis=5)
