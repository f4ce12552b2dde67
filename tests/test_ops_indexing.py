"""Tests of the indexing op family (ids 1100-1199).

References are written independently of the kernels: explicit loops over ``np.ndindex`` (plain
NumPy indexing, where negative indices wrap by themselves), and PyTorch where it has the op.
Gradients are checked against central finite differences.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import opgraph
from opcheck import RNG_SEED, check_op, out_type, rand, run_op
from opgraph.autodiff import build_grad_ops
from opgraph.core.registry import get_op
from opgraph.core.types import TensorType
from opgraph.errors import ExecutionError, OpBuildError

IDS = {
    "gather_elements": 1100, "scatter_elements": 1101, "gather_nd": 1102, "scatter_nd": 1103, "topk": 1104,
    "one_hot": 1105, "trilu": 1106, "reverse_sequence": 1107, "sort": 1108, "unique": 1109, "nonzero": 1110,
    "searchsorted": 1111,
}
DTYPES = ["bool", "int8", "uint16", "int64", "float32", "float64", "complex128"]
REDUCTIONS = ["none", "add", "mul", "max", "min"]
# The NumPy function each reduction combines an old and a new value with (None: the new one replaces).
COMBINE: dict[str, Any] = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def test_ids_and_family() -> None:
    for name, id_ in IDS.items():
        op = get_op(name)
        assert (op.id, op.family) == (id_, "indexing")
        assert op.doc and op.kernel is not None
    assert {o.name for o in opgraph.all_ops() if o.family == "indexing"} == set(IDS)


def _rng() -> np.random.Generator:
    return np.random.default_rng(RNG_SEED)


def _rand_indices(rng: np.random.Generator, shape: tuple[int, ...], n: int, dtype: str = "int64") -> np.ndarray:
    """Indices in [-n, n) (negative ones too), of an integer dtype (non-negative for unsigned)."""
    lo = 0 if np.dtype(dtype).kind == "u" else -n
    return rng.integers(lo, n, size=shape).astype(dtype)


def _combine(old: Any, new: Any, reduction: str) -> Any:
    fn = COMBINE[reduction]
    with np.errstate(over="ignore"):
        return new if fn is None else fn(old, new)


# ---------------------------------------------------------------- loop references
def ref_gather_elements(x: np.ndarray, idx: np.ndarray, axis: int = 0) -> np.ndarray:
    ax = axis % x.ndim
    out = np.empty(idx.shape, dtype=x.dtype)
    for pos in np.ndindex(idx.shape):
        src = list(pos)
        src[ax] = int(idx[pos])
        out[pos] = x[tuple(src)]
    return out


def ref_scatter_elements(x: np.ndarray, idx: np.ndarray, upd: np.ndarray, axis: int = 0,
                         reduction: str = "none") -> np.ndarray:
    ax = axis % x.ndim
    out = x.copy()
    for pos in np.ndindex(idx.shape):  # in order, so for "none" the last duplicate wins
        dst = list(pos)
        dst[ax] = int(idx[pos])
        out[tuple(dst)] = _combine(out[tuple(dst)], upd[pos], reduction)
    return out


def ref_gather_nd(x: np.ndarray, idx: np.ndarray, batch_dims: int = 0) -> np.ndarray:
    m = idx.shape[-1]
    out = np.empty(idx.shape[:-1] + x.shape[batch_dims + m:], dtype=x.dtype)
    for pos in np.ndindex(idx.shape[:-1]):
        out[pos] = x[pos[:batch_dims] + tuple(int(i) for i in idx[pos])]
    return out


def ref_scatter_nd(x: np.ndarray, idx: np.ndarray, upd: np.ndarray, reduction: str = "none") -> np.ndarray:
    out = x.copy()
    for pos in np.ndindex(idx.shape[:-1]):
        key = tuple(int(i) for i in idx[pos])
        out[key] = _combine(out[key], upd[pos], reduction)
    return out


def ref_topk(x: np.ndarray, k: int, axis: int = -1, largest: bool = True,
             sorted: bool = True) -> tuple[np.ndarray, np.ndarray]:
    ax = axis % x.ndim
    xm = np.moveaxis(x, ax, -1)
    vals = np.empty((*xm.shape[:-1], k), dtype=x.dtype)
    inds = np.empty((*xm.shape[:-1], k), dtype=np.int64)
    for pos in np.ndindex(xm.shape[:-1]):
        row = [v.item() for v in xm[pos]]
        order = sorted_(range(len(row)), key=lambda i: (-row[i] if largest else row[i], i))[:k]
        inds[pos] = order
        vals[pos] = [xm[pos][i] for i in order]
    return np.moveaxis(vals, -1, ax), np.moveaxis(inds, -1, ax)


sorted_ = sorted  # ref_topk's parameter shadows the builtin


def ref_one_hot(idx: np.ndarray, values: np.ndarray, depth: int, axis: int = -1) -> np.ndarray:
    ax = axis % (idx.ndim + 1)
    out = np.empty((*idx.shape[:ax], depth, *idx.shape[ax:]), dtype=values.dtype)
    for pos in np.ndindex(out.shape):
        i = int(idx[pos[:ax] + pos[ax + 1:]])
        if i < 0:
            i += depth
        out[pos] = values[1] if i == pos[ax] else values[0]
    return out


def ref_trilu(x: np.ndarray, k: int = 0, upper: bool = True) -> np.ndarray:
    out = np.zeros_like(x)
    for pos in np.ndindex(x.shape):
        i, j = pos[-2:]
        if (j - i >= k) if upper else (j - i <= k):
            out[pos] = x[pos]
    return out


def ref_reverse_sequence(x: np.ndarray, lengths: np.ndarray, batch_axis: int = 1, time_axis: int = 0) -> np.ndarray:
    ba, ta = batch_axis % x.ndim, time_axis % x.ndim
    out = np.empty_like(x)
    for pos in np.ndindex(x.shape):
        n = int(lengths[pos[ba]])
        t = pos[ta]
        src = list(pos)
        src[ta] = n - 1 - t if t < n else t
        out[pos] = x[tuple(src)]
    return out


# ---------------------------------------------------------------- gather_elements
GATHER_ELEMENTS_CASES: list[tuple[tuple[int, ...], tuple[int, ...], int]] = [
    ((4,), (6,), 0), ((3, 4), (3, 4), 0), ((3, 4), (3, 2), 1), ((3, 4), (2, 4), -1), ((3, 4), (5, 2), -2),
    ((2, 3, 4), (2, 3, 5), 2), ((2, 3, 4), (1, 2, 2), 1), ((2, 3, 4), (2, 0, 4), 0), ((3, 1), (3, 1), 1),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("xs", "ish", "axis"), GATHER_ELEMENTS_CASES)
@pytest.mark.parametrize("idt", ["int64", "int32", "int8", "uint8"])
def test_gather_elements(xs: tuple[int, ...], ish: tuple[int, ...], axis: int, dtype: str, idt: str) -> None:
    rng = _rng()
    x = rand(rng, xs, dtype)
    idx = _rand_indices(rng, ish, xs[axis], idt)
    check_op("gather_elements", [x, idx], functools.partial(ref_gather_elements, axis=axis), axis=axis)


@pytest.mark.parametrize(("xs", "ish", "axis"), GATHER_ELEMENTS_CASES)
def test_gather_elements_vs_torch(xs: tuple[int, ...], ish: tuple[int, ...], axis: int) -> None:
    torch = pytest.importorskip("torch")
    rng = _rng()
    x = rand(rng, xs, "float32")
    idx = _rand_indices(rng, ish, xs[axis])
    (got,) = run_op("gather_elements", x, idx, axis=axis)
    want = torch.gather(torch.from_numpy(x), axis, torch.from_numpy(idx % xs[axis])).numpy()
    np.testing.assert_array_equal(got, want)


def test_gather_elements_default_axis_is_0() -> None:
    x = np.arange(6.0).reshape(2, 3)
    idx = np.array([[1, 0, 1]])
    np.testing.assert_array_equal(run_op("gather_elements", x, idx)[0], [[3.0, 1.0, 5.0]])


# ---------------------------------------------------------------- scatter_elements
SCATTER_ELEMENTS_CASES: list[tuple[tuple[int, ...], tuple[int, ...], int]] = [
    ((5,), (8,), 0), ((3, 4), (3, 4), 0), ((3, 4), (3, 6), 1), ((3, 4), (2, 3), -1), ((3, 4), (6, 2), -2),
    ((2, 3, 4), (2, 3, 7), -1), ((2, 3, 4), (1, 5, 2), 1), ((2, 3, 4), (0, 3, 4), 0),
]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "float32", "float64", "complex128"])
@pytest.mark.parametrize(("xs", "ish", "axis"), SCATTER_ELEMENTS_CASES)
def test_scatter_elements(xs: tuple[int, ...], ish: tuple[int, ...], axis: int, dtype: str, reduction: str) -> None:
    if dtype == "complex128" and reduction in ("max", "min"):
        with pytest.raises(OpBuildError, match="not defined for complex"):
            out_type("scatter_elements", ("complex128", xs), ("int32", ish), ("complex128", ish), axis=axis,
                     reduction=reduction)
        return
    rng = _rng()
    x = rand(rng, xs, dtype)
    idx = _rand_indices(rng, ish, xs[axis], "int32")  # many more indices than slots: duplicates
    upd = rand(rng, ish, dtype)
    ref = functools.partial(ref_scatter_elements, axis=axis, reduction=reduction)
    check_op("scatter_elements", [x, idx, upd], ref, rtol=1e-6, axis=axis, reduction=reduction)


def test_scatter_elements_last_duplicate_wins() -> None:
    x = np.zeros(3)
    idx = np.array([1, -2, 1, 0, 1])  # -2 is 1 too
    upd = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(run_op("scatter_elements", x, idx, upd)[0], [4.0, 5.0, 0.0])
    np.testing.assert_array_equal(run_op("scatter_elements", x, idx, upd, reduction="add")[0], [4.0, 11.0, 0.0])
    np.testing.assert_array_equal(run_op("scatter_elements", x + 1, idx, upd, reduction="mul")[0], [4.0, 30.0, 1.0])
    np.testing.assert_array_equal(run_op("scatter_elements", x, idx, -upd, reduction="max")[0], [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(run_op("scatter_elements", x, idx, upd, reduction="min")[0], [0.0, 0.0, 0.0])


TORCH_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize(("xs", "ish", "axis"), SCATTER_ELEMENTS_CASES)
def test_scatter_elements_vs_torch(xs: tuple[int, ...], ish: tuple[int, ...], axis: int, reduction: str) -> None:
    torch = pytest.importorskip("torch")
    rng = _rng()
    x = rand(rng, xs, "float64")
    upd = rand(rng, ish, "float64")
    if reduction == "none":
        # torch.scatter leaves the winner of duplicate indices unspecified: use distinct ones.
        ax = axis % len(xs)
        perm = np.argsort(rng.random((*ish[:ax], xs[ax], *ish[ax + 1:])), axis=ax)
        idx = np.take(perm, np.arange(min(ish[ax], xs[ax])), axis=ax)
        upd = upd[tuple(slice(0, n) for n in idx.shape)]
    else:
        idx = _rand_indices(rng, ish, xs[axis])
    (got,) = run_op("scatter_elements", x, idx, upd, axis=axis, reduction=reduction)
    t = torch.from_numpy(x.copy())
    ti, tu = torch.from_numpy(idx % xs[axis]), torch.from_numpy(upd)
    if reduction == "none":
        t.scatter_(axis, ti, tu)
    else:
        t.scatter_reduce_(axis, ti, tu, reduce=TORCH_REDUCE[reduction], include_self=True)
    np.testing.assert_allclose(got, t.numpy(), rtol=1e-12)


# ---------------------------------------------------------------- gather_nd
GATHER_ND_CASES: list[tuple[tuple[int, ...], tuple[int, ...], int]] = [
    ((4,), (3, 1), 0), ((3, 4), (5, 2), 0), ((3, 4), (5, 1), 0), ((3, 4), (2, 3, 2), 0), ((2, 3, 4), (4, 2), 0),
    ((2, 3, 4), (2, 1), 1), ((2, 3, 4), (2, 5, 2), 1), ((2, 3, 4), (2, 3, 1), 2), ((2, 3, 4), (2, 3, 2, 1), 2),
    ((3, 4), (2, 0), 0), ((3, 4), (0, 2), 0), ((2, 3, 4), (2, 0, 1), 1),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("xs", "ish", "batch_dims"), GATHER_ND_CASES)
def test_gather_nd(xs: tuple[int, ...], ish: tuple[int, ...], batch_dims: int, dtype: str) -> None:
    rng = _rng()
    x = rand(rng, xs, dtype)
    cols = [_rand_indices(rng, ish[:-1], xs[batch_dims + j], "int32") for j in range(ish[-1])]
    idx = np.stack(cols, axis=-1) if cols else np.zeros(ish, np.int32)
    check_op("gather_nd", [x, idx], functools.partial(ref_gather_nd, batch_dims=batch_dims), batch_dims=batch_dims)


def test_gather_nd_onnx_examples() -> None:
    # The examples of the ONNX GatherND specification.
    data = np.array([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    np.testing.assert_array_equal(run_op("gather_nd", data, np.array([[0, 1], [1, 0]]))[0], [[2, 3], [4, 5]])
    np.testing.assert_array_equal(run_op("gather_nd", data, np.array([[[0, 1]], [[1, 0]]]))[0],
                                  [[[2, 3]], [[4, 5]]])
    np.testing.assert_array_equal(run_op("gather_nd", data, np.array([[1], [0]]), batch_dims=1)[0],
                                  [[2, 3], [4, 5]])
    np.testing.assert_array_equal(run_op("gather_nd", data[0], np.array([[0, 0], [1, 1]]))[0], [0, 3])


# ---------------------------------------------------------------- scatter_nd
SCATTER_ND_CASES: list[tuple[tuple[int, ...], tuple[int, ...]]] = [
    ((5,), (7, 1)), ((3, 4), (6, 2)), ((3, 4), (5, 1)), ((3, 4), (2, 3, 2)), ((2, 3, 4), (4, 2)),
    ((2, 3, 4), (0, 2)), ((2, 3), (4, 0)),
]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "float32", "float64", "complex128"])
@pytest.mark.parametrize(("xs", "ish"), SCATTER_ND_CASES)
def test_scatter_nd(xs: tuple[int, ...], ish: tuple[int, ...], dtype: str, reduction: str) -> None:
    if dtype == "complex128" and reduction in ("max", "min"):
        with pytest.raises(OpBuildError, match="not defined for complex"):
            out_type("scatter_nd", ("complex128", xs), ("int32", ish), ("complex128", ish[:-1] + xs[ish[-1]:]),
                     reduction=reduction)
        return
    rng = _rng()
    k = ish[-1]
    x = rand(rng, xs, dtype)
    cols = [_rand_indices(rng, ish[:-1], xs[j]) for j in range(k)]
    idx = np.stack(cols, axis=-1) if cols else np.zeros(ish, np.int64)
    upd = rand(rng, ish[:-1] + xs[k:], dtype)
    check_op("scatter_nd", [x, idx, upd], functools.partial(ref_scatter_nd, reduction=reduction), rtol=1e-6,
             reduction=reduction)


def test_scatter_nd_onnx_example_and_duplicates() -> None:
    # ONNX ScatterND's second example: whole slices along the first axis.
    data = np.array([[[1, 2, 3, 4], [5, 6, 7, 8], [8, 7, 6, 5], [4, 3, 2, 1]]] * 4)
    idx = np.array([[0], [2]])
    upd = np.array([[[5, 5, 5, 5], [6, 6, 6, 6], [7, 7, 7, 8], [8, 8, 8, 8]],
                    [[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3], [4, 4, 4, 4]]])
    want = data.copy()
    want[0], want[2] = upd[0], upd[1]
    np.testing.assert_array_equal(run_op("scatter_nd", data, idx, upd)[0], want)
    x = np.zeros((2, 2))
    dup = np.array([[0, 1], [-2, -1], [1, 0], [0, 1]])
    vals = np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(run_op("scatter_nd", x, dup, vals)[0], [[0.0, 4.0], [3.0, 0.0]])
    np.testing.assert_array_equal(run_op("scatter_nd", x, dup, vals, reduction="add")[0], [[0.0, 7.0], [3.0, 0.0]])
    np.testing.assert_array_equal(run_op("scatter_nd", x + 1, dup, vals, reduction="mul")[0],
                                  [[1.0, 8.0], [3.0, 1.0]])
    np.testing.assert_array_equal(run_op("scatter_nd", x, dup, -vals, reduction="min")[0],
                                  [[0.0, -4.0], [-3.0, 0.0]])
    np.testing.assert_array_equal(run_op("scatter_nd", x, dup, -vals, reduction="max")[0], np.zeros((2, 2)))


# ---------------------------------------------------------------- topk
TOPK_CASES: list[tuple[tuple[int, ...], dict[str, Any]]] = [
    ((7,), {"k": 3}), ((3, 5), {"k": 2}), ((3, 5), {"k": 5, "axis": 1}), ((3, 5), {"k": 2, "axis": 0}),
    ((3, 5), {"k": 1, "axis": -2, "largest": False}), ((2, 3, 4), {"k": 2, "axis": 1, "largest": False}),
    ((2, 3, 4), {"k": 0}), ((2, 3, 4), {"k": 4, "sorted": False}), ((0, 3), {"k": 2}), ((3, 0), {"k": 0}),
]


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int64", "float16", "float32", "float64"])
@pytest.mark.parametrize(("shape", "attrs"), TOPK_CASES)
def test_topk(shape: tuple[int, ...], attrs: dict[str, Any], dtype: str) -> None:
    x = rand(_rng(), shape, dtype, -2, 3)  # few distinct values: many ties
    check_op("topk", [x], functools.partial(ref_topk, **attrs), **attrs)


@pytest.mark.parametrize(("shape", "attrs"), TOPK_CASES)
def test_topk_vs_torch(shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    x = rand(_rng(), shape, "float64")  # distinct values: torch's tie order does not matter
    vals, inds = run_op("topk", x, **attrs)
    tv, ti = torch.topk(torch.from_numpy(x), attrs["k"], dim=attrs.get("axis", -1),
                        largest=attrs.get("largest", True), sorted=True)
    np.testing.assert_array_equal(vals, tv.numpy())
    np.testing.assert_array_equal(inds, ti.numpy())


def test_topk_ties_nan_and_extremes() -> None:
    x = np.array([1.0, 3.0, np.nan, 3.0, -np.inf, 1.0])
    vals, inds = run_op("topk", x, k=4)
    np.testing.assert_array_equal(inds, [2, 1, 3, 0])
    np.testing.assert_array_equal(vals, [np.nan, 3.0, 3.0, 1.0])
    vals, inds = run_op("topk", x, k=3, largest=False)
    np.testing.assert_array_equal(inds, [4, 0, 5])
    u = np.array([0, 65535, 7, 65535], np.uint16)
    np.testing.assert_array_equal(run_op("topk", u, k=2)[1], [1, 3])
    np.testing.assert_array_equal(run_op("topk", np.array([-0.0, 0.0]), k=1)[1], [0])


# ---------------------------------------------------------------- one_hot
ONE_HOT_CASES: list[tuple[tuple[int, ...], int, int]] = [
    ((4,), 5, -1), ((4,), 5, 0), ((2, 3), 4, -1), ((2, 3), 4, 1), ((2, 3), 4, 0), ((2, 3), 4, -3), ((), 3, 0),
    ((0, 2), 3, -1), ((3,), 0, -1), ((2, 2, 2), 2, 2),
]


@pytest.mark.parametrize("vdtype", ["bool", "int8", "float32", "float64", "complex64"])
@pytest.mark.parametrize("idt", ["int64", "int8", "uint8", "uint64"])
@pytest.mark.parametrize(("ish", "depth", "axis"), ONE_HOT_CASES)
def test_one_hot(ish: tuple[int, ...], depth: int, axis: int, idt: str, vdtype: str) -> None:
    rng = _rng()
    lo = 0 if np.dtype(idt).kind == "u" else -depth - 2
    idx = rng.integers(lo, depth + 2, size=ish).astype(idt)  # includes out-of-range indices
    values = np.array([0, 1], dtype=vdtype) if vdtype == "bool" else np.array([-2, 5]).astype(vdtype)
    check_op("one_hot", [idx, values], functools.partial(ref_one_hot, depth=depth, axis=axis), depth=depth, axis=axis)


def test_one_hot_onnx_example() -> None:
    idx = np.array([[1, 9], [2, 4]], np.float32).astype(np.int64)
    got = run_op("one_hot", idx, np.array([1, 3], np.float32), depth=10, axis=1)[0]
    want = np.ones((2, 10, 2), np.float32)
    want[0, 1, 0] = want[0, 9, 1] = want[1, 2, 0] = want[1, 4, 1] = 3
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run_op("one_hot", np.array([-1, 3, -4]), np.array([0, 1]), depth=3)[0],
                                  [[0, 0, 1], [0, 0, 0], [0, 0, 0]])


def test_one_hot_vs_torch() -> None:
    torch = pytest.importorskip("torch")
    idx = rand(_rng(), (3, 4), "int64", 0, 6)
    got = run_op("one_hot", idx, np.array([0, 1]), depth=6)[0]
    np.testing.assert_array_equal(got, torch.nn.functional.one_hot(torch.from_numpy(idx), 6).numpy())


# ---------------------------------------------------------------- trilu
TRILU_SHAPES = [(4, 4), (3, 5), (5, 3), (2, 3, 4), (2, 1, 3, 3), (0, 3), (3, 0), (2, 0, 2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", TRILU_SHAPES)
@pytest.mark.parametrize("k", [0, 1, -1, 2, -4, 7])
@pytest.mark.parametrize("upper", [True, False])
def test_trilu(shape: tuple[int, ...], k: int, upper: bool, dtype: str) -> None:
    x = rand(_rng(), shape, dtype)
    check_op("trilu", [x], functools.partial(ref_trilu, k=k, upper=upper), k=k, upper=upper)


@pytest.mark.parametrize("shape", TRILU_SHAPES)
@pytest.mark.parametrize("k", [0, 1, -2])
def test_trilu_vs_torch(shape: tuple[int, ...], k: int) -> None:
    torch = pytest.importorskip("torch")
    x = rand(_rng(), shape, "float32")
    t = torch.from_numpy(x)
    np.testing.assert_array_equal(run_op("trilu", x, k=k)[0], torch.triu(t, k).numpy())
    np.testing.assert_array_equal(run_op("trilu", x, k=k, upper=False)[0], torch.tril(t, k).numpy())


# ---------------------------------------------------------------- reverse_sequence
REVSEQ_CASES: list[tuple[tuple[int, ...], int, int]] = [
    ((4, 3), 1, 0), ((3, 4), 0, 1), ((5, 3, 2), 1, 0), ((3, 5, 2), 0, 1), ((2, 3, 5), -2, -1), ((2, 4, 3), 2, 1),
    ((0, 3), 1, 0), ((3, 0), 1, 0),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("shape", "batch_axis", "time_axis"), REVSEQ_CASES)
@pytest.mark.parametrize("ldt", ["int64", "int32", "uint8"])
def test_reverse_sequence(shape: tuple[int, ...], batch_axis: int, time_axis: int, dtype: str, ldt: str) -> None:
    rng = _rng()
    x = rand(rng, shape, dtype)
    nt, nb = shape[time_axis], shape[batch_axis]
    lengths = rng.integers(0, nt + 1, size=nb).astype(ldt)
    ref = functools.partial(ref_reverse_sequence, batch_axis=batch_axis, time_axis=time_axis)
    check_op("reverse_sequence", [x, lengths], ref, batch_axis=batch_axis, time_axis=time_axis)


def test_reverse_sequence_onnx_example() -> None:
    x = np.array([[0.0, 4.0, 8.0, 12.0], [1.0, 5.0, 9.0, 13.0], [2.0, 6.0, 10.0, 14.0], [3.0, 7.0, 11.0, 15.0]])
    got = run_op("reverse_sequence", x, np.array([4, 3, 2, 1]), batch_axis=1, time_axis=0)[0]
    want = [[3.0, 6.0, 9.0, 12.0], [2.0, 5.0, 8.0, 13.0], [1.0, 4.0, 10.0, 14.0], [0.0, 7.0, 11.0, 15.0]]
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- ONNX's reference implementation
def _onnx_run(op_type: str, inputs: list[np.ndarray], **attrs: Any) -> list[np.ndarray]:
    onnx = pytest.importorskip("onnx")
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" for k in range(len(inputs))]
    n_out = 2 if op_type == "TopK" else 1
    node = helper.make_node(op_type, names, [f"o{k}" for k in range(n_out)], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                      for n, a in zip(names, inputs, strict=True)],
        [helper.make_tensor_value_info(f"o{k}", onnx.TensorProto.UNDEFINED, None) for k in range(n_out)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return list(ReferenceEvaluator(model).run(None, dict(zip(names, inputs, strict=True))))


def test_against_onnx_reference() -> None:
    rng = _rng()
    x = rand(rng, (3, 4, 5), "float32")
    idx = _rand_indices(rng, (3, 2, 5), 4)
    for got, want in [
        (run_op("gather_elements", x, idx, axis=1), _onnx_run("GatherElements", [x, idx], axis=1)),
        (run_op("gather_nd", x, idx[..., :2] % 3, batch_dims=0), _onnx_run("GatherND", [x, idx[..., :2] % 3])),
        (run_op("gather_nd", x, idx[:, :, :1] % 4, batch_dims=1),
         _onnx_run("GatherND", [x, idx[:, :, :1] % 4], batch_dims=1)),
        (run_op("topk", x, k=3, axis=1), _onnx_run("TopK", [x, np.array([3])], axis=1)),
        (run_op("topk", x, k=2, axis=-1, largest=False),
         _onnx_run("TopK", [x, np.array([2])], axis=-1, largest=0)),
        (run_op("one_hot", idx, np.array([0.5, 2.0], np.float32), depth=4, axis=1),
         _onnx_run("OneHot", [idx, np.array(4), np.array([0.5, 2.0], np.float32)], axis=1)),
        (run_op("trilu", x, k=1), _onnx_run("Trilu", [x, np.array(1)])),
        (run_op("trilu", x, k=-1, upper=False), _onnx_run("Trilu", [x, np.array(-1)], upper=0)),
        (run_op("reverse_sequence", x, np.array([1, 3, 2, 3]), batch_axis=1, time_axis=0),
         _onnx_run("ReverseSequence", [x, np.array([1, 3, 2, 3])], batch_axis=1, time_axis=0)),
    ]:
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
    for red in ("add", "mul", "max", "min"):
        u = rand(rng, (3, 2, 5), "float32")
        np.testing.assert_allclose(run_op("scatter_elements", x, idx, u, axis=1, reduction=red)[0],
                                   _onnx_run("ScatterElements", [x, idx, u], axis=1, reduction=red)[0], rtol=1e-6)
        nd_idx = np.array([[0, 1], [2, -1], [0, 1]])
        u2 = rand(rng, (3, 5), "float32")
        np.testing.assert_allclose(run_op("scatter_nd", x, nd_idx, u2, reduction=red)[0],
                                   _onnx_run("ScatterND", [x, nd_idx % [3, 4], u2], reduction=red)[0], rtol=1e-6)


# ---------------------------------------------------------------- type rules
T = TensorType
F64, I64 = "float64", "int64"

INFER_CASES: list[tuple[str, list[TensorType], dict[str, Any], list[Any]]] = [
    ("gather_elements", [T(F64, (None, 3)), T(I64, (2, None))], {"axis": 0}, [(F64, (2, None))]),
    ("gather_elements", [T(F64, None), T(I64, (2, 2))], {"axis": 1}, [(F64, (2, 2))]),
    ("gather_elements", [T(F64, (2, 3)), T(I64, None)], {"axis": 1}, [(F64, (None, None))]),
    ("gather_elements", [T(F64, None), T(I64, None)], {}, [(F64, None)]),
    ("scatter_elements", [T(F64, (None, 3)), T(I64, (2, None)), T(F64, (None, 3))], {}, [(F64, (None, 3))]),
    ("gather_nd", [T(F64, (2, None, 4)), T(I64, (5, 2))], {}, [(F64, (5, 4))]),
    ("gather_nd", [T(F64, (2, 3, 4)), T(I64, (None, 7, 1))], {"batch_dims": 1}, [(F64, (2, 7, 4))]),
    ("gather_nd", [T(F64, (2, 3, 4)), T(I64, (5, None))], {}, [(F64, None)]),
    ("gather_nd", [T(F64, None), T(I64, (5, 2))], {}, [(F64, None)]),
    ("scatter_nd", [T(F64, (2, None)), T(I64, (5, 1)), T(F64, (5, None))], {}, [(F64, (2, None))]),
    ("topk", [T("float32", (None, 5))], {"k": 2}, [("float32", (None, 2)), (I64, (None, 2))]),
    ("topk", [T("float32", (None, 5))], {"k": 2, "axis": 0}, [("float32", (2, 5)), (I64, (2, 5))]),
    ("topk", [T("int8", None)], {"k": 2}, [("int8", None), (I64, None)]),
    ("one_hot", [T("int32", (None, 3)), T("float32", (2,))], {"depth": 4}, [("float32", (None, 3, 4))]),
    ("one_hot", [T("int32", (None, 3)), T("bool", (None,))], {"depth": 4, "axis": 0}, [("bool", (4, None, 3))]),
    ("one_hot", [T("int32", None), T("float32", (2,))], {"depth": 4}, [("float32", None)]),
    ("trilu", [T(F64, (None, None))], {}, [(F64, (None, None))]),
    ("trilu", [T(F64, None)], {"upper": False}, [(F64, None)]),
    ("reverse_sequence", [T(F64, (None, 3, 2)), T("int32", (None,))], {}, [(F64, (None, 3, 2))]),
]


@pytest.mark.parametrize(("kind", "types", "attrs", "want"), INFER_CASES)
def test_type_rules_with_unknown_dims(kind: str, types: list[TensorType], attrs: dict[str, Any],
                                      want: list[Any]) -> None:
    b = opgraph.GraphBuilder()
    outs = b.op(kind, *[b.input(t) for t in types], **attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    assert [o.type for o in outs] == [T(dt, shape) for dt, shape in want]


def test_unknown_dims_run() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (None, 4)))
    i = b.input(("int64", (None, None)))
    vals, inds = b.op("topk", x, k=2)
    g = b.op("gather_elements", x, i, axis=1)
    xa = np.arange(12.0).reshape(3, 4)
    ia = np.array([[0, -1], [1, 2], [3, 3]])
    got = b.run({x: xa, i: ia}, [vals, inds, g])
    np.testing.assert_array_equal(got[0], xa[:, [3, 2]])
    np.testing.assert_array_equal(got[2], ref_gather_elements(xa, ia, 1))


ERROR_CASES: list[tuple[str, list[Any], dict[str, Any], str]] = [
    ("gather_elements", [(2, 3), ("float64", (2, 3))], {}, "indices must have an integer dtype"),
    ("gather_elements", [(2, 3), ("bool", (2, 3))], {}, "indices must have an integer dtype"),
    ("gather_elements", [(2, 3), ("int64", (2,))], {}, "indices must have x's rank"),
    ("gather_elements", [(2, 3), ("int64", (2, 3))], {"axis": 2}, "axis 2 is out of bounds for rank 2"),
    ("gather_elements", [(2, 3), ("int64", (2, 4))], {"axis": 0}, "larger than x's 3"),
    ("gather_elements", [(), ("int64", ())], {}, "rank >= 1"),
    ("gather_elements", [(0, 3), ("int64", (1, 3))], {}, "empty axis"),
    ("gather_elements", [(2, 3), ("int64", (2, 3))], {"axis": 1.0}, "expected an integer"),
    ("scatter_elements", [(2, 3), ("int64", (2, 3)), ("float32", (2, 3))], {}, "updates have dtype float32"),
    ("scatter_elements", [(2, 3), ("float64", (2, 3)), (2, 3)], {}, "integer dtype"),
    ("scatter_elements", [(2, 3), ("int64", (2, 3)), (2, 2)], {}, "indices and updates differ along axis 1"),
    ("scatter_elements", [(2, 3), ("int64", (2, 3)), (2,)], {}, "updates has rank 1"),
    ("scatter_elements", [(2, 3), ("int64", (2, 3)), (2, 3)], {"axis": -3}, "out of bounds"),
    ("scatter_elements", [(2, 3), ("int64", (2, 3)), (2, 3)], {"reduction": "sum"}, "reduction must be one of"),
    ("scatter_elements", [(2, 3), ("int64", (3, 3)), (3, 3)], {"axis": 1}, "larger than x's 2"),
    ("gather_nd", [(2, 3), ("float32", (2, 1))], {}, "integer dtype"),
    ("gather_nd", [(2, 3), ("int64", (2, 3))], {}, "larger than x's rank 2"),
    ("gather_nd", [(2, 3), ("int64", ())], {}, "indices must have rank >= 1"),
    ("gather_nd", [(2, 3), ("int64", (2, 1))], {"batch_dims": 2}, "batch_dims=2 must be less"),
    ("gather_nd", [(2, 3), ("int64", (3, 1))], {"batch_dims": 1}, "batch dim 0 of x and indices differ"),
    ("gather_nd", [(2, 3), ("int64", (2, 1))], {"batch_dims": -1}, "must be >= 0"),
    ("scatter_nd", [(2, 3), ("int64", (4, 1)), (4, 2)], {}, "updates have the wrong size along axis 1"),
    ("scatter_nd", [(2, 3), ("int64", (4, 1)), (4,)], {}, "updates have rank 1, expected 2"),
    ("scatter_nd", [(2, 3), ("int64", (4, 3)), (4,)], {}, "larger than x's rank 2"),
    ("scatter_nd", [(2, 3), ("int8", (4, 2)), ("int8", (4,))], {}, "updates have dtype int8"),
    ("scatter_nd", [(2, 3), ("int64", (4, 2)), (4,)], {"reduction": "prod"}, "reduction must be one of"),
    ("topk", [(2, 3)], {"k": 4}, r"k=4 is larger than axis 1 \(size 3\)"),
    ("topk", [(2, 3)], {"k": -1}, "must be >= 0"),
    ("topk", [(2, 3)], {"k": 1, "axis": 2}, "out of bounds"),
    ("topk", [()], {"k": 0}, "rank >= 1"),
    ("topk", [("complex128", (3,))], {"k": 1}, "complex"),
    ("topk", [(2, 3)], {}, "missing required attribute 'k'"),
    ("one_hot", [("float32", (3,)), (2,)], {"depth": 3}, "indices must have an integer dtype"),
    ("one_hot", [("int64", (3,)), (3,)], {"depth": 3}, r"values must be \[off_value, on_value\]"),
    ("one_hot", [("int64", (3,)), (2, 1)], {"depth": 3}, "values must be"),
    ("one_hot", [("int64", (3,)), (2,)], {"depth": 3, "axis": 2}, "out of bounds"),
    ("one_hot", [("int64", (3,)), (2,)], {"depth": -1}, "must be >= 0"),
    ("trilu", [(3,)], {}, "rank >= 2"),
    ("trilu", [(3, 3)], {"upper": 1}, "expected a bool"),
    ("reverse_sequence", [(3,), ("int64", (3,))], {}, "rank >= 2"),
    ("reverse_sequence", [(3, 2), ("int64", (3,))], {}, "lengths must have one entry per batch entry"),
    ("reverse_sequence", [(3, 2), ("float64", (2,))], {}, "lengths must have an integer dtype"),
    ("reverse_sequence", [(3, 2), ("int64", (2, 1))], {}, "lengths must have rank 1"),
    ("reverse_sequence", [(3, 2), ("int64", (2,))], {"batch_axis": 0}, "are the same axis"),
    ("reverse_sequence", [(3, 2), ("int64", (2,))], {"time_axis": 2}, "out of bounds"),
]


@pytest.mark.parametrize(("kind", "inputs", "attrs", "match"), ERROR_CASES)
def test_build_errors(kind: str, inputs: list[Any], attrs: dict[str, Any], match: str) -> None:
    b = opgraph.GraphBuilder()
    ins = [b.input(i if i and isinstance(i[0], str) else ("float64", i)) for i in inputs]
    with pytest.raises(OpBuildError, match=match) as info:
        b.op(kind, *ins, **attrs)
    assert info.value.op == kind
    assert "test_ops_indexing.py" in str(info.value)


RUN_ERRORS: list[tuple[str, list[np.ndarray], dict[str, Any], str]] = [
    ("gather_elements", [np.zeros((2, 3)), np.array([[0, 3]])], {"axis": 1}, "index 3 is out of bounds for axis 1"),
    ("gather_elements", [np.zeros((2, 3)), np.array([[-4]])], {"axis": 1}, "index -4 is out of bounds"),
    ("scatter_elements", [np.zeros(3), np.array([0, 5]), np.ones(2)], {}, "index 5 is out of bounds"),
    ("gather_nd", [np.zeros((2, 3)), np.array([[1, 3]])], {}, "index 3 is out of bounds for axis 1"),
    ("scatter_nd", [np.zeros((2, 3)), np.array([[-3]]), np.ones((1, 3))], {}, "index -3 is out of bounds"),
    ("reverse_sequence", [np.zeros((3, 2)), np.array([1, 4])], {}, r"lengths must be in \[0, 3\]"),
]


@pytest.mark.parametrize(("kind", "arrays", "attrs", "match"), RUN_ERRORS)
def test_run_time_errors(kind: str, arrays: list[np.ndarray], attrs: dict[str, Any], match: str) -> None:
    with pytest.raises(ExecutionError, match=match):
        run_op(kind, *arrays, **attrs)


def test_run_time_shape_checks_with_unknown_dims() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (None,)))
    i = b.input(("int64", (None,)))
    u = b.input(("float64", (None,)))
    y = b.op("scatter_elements", x, i, u)
    with pytest.raises(ExecutionError, match="indices have shape"):
        b.run({x: np.zeros(3), i: np.array([0, 1]), u: np.ones(3)}, [y])
    k = b.op("topk", x, k=3)[0]
    with pytest.raises(ExecutionError, match="k=3 is larger"):
        b.run({x: np.zeros(2)}, [k])


# ---------------------------------------------------------------- gradients (central finite differences)
def _check_grad(kind: str, wrt: list[np.ndarray], fixed: list[Any], build: Callable[..., Any] | None = None,
                **attrs: Any) -> None:
    """Gradient of sum(w * kind(...)) for the float64 inputs ``wrt`` (inputs first, then ``fixed``)."""
    rng = np.random.default_rng(5)
    b = opgraph.GraphBuilder()
    ins = [b.input(TensorType.of(a)) for a in wrt]
    consts = [b.constant(np.asarray(c)) for c in fixed]
    args = build(ins, consts) if build else [*ins, *consts]
    out = b.op(kind, *args, **attrs)
    y = out[0] if isinstance(out, tuple) else out
    w = b.constant(rng.standard_normal(y.type.shape))
    loss = b.op("sum", b.op("multiply", y, w))
    grads = build_grad_ops(b, loss, ins)
    feeds = dict(zip(ins, wrt, strict=True))
    got = b.run(feeds, grads)
    eps = 1e-6
    for k, a in enumerate(wrt):
        fd = np.zeros_like(a)
        for pos in np.ndindex(a.shape):
            for sgn in (1, -1):
                a2 = a.copy()
                a2[pos] += sgn * eps
                fd[pos] += sgn * float(b.run({**feeds, ins[k]: a2}, [loss])[0]) / (2 * eps)
        np.testing.assert_allclose(got[k], fd, rtol=1e-5, atol=1e-6, err_msg=f"{kind} {attrs} input {k}")


def _x(*shape: int) -> np.ndarray:
    # Distinct values, so topk's selection does not change under the finite-difference steps.
    return np.random.default_rng(11).permutation(int(np.prod(shape))).reshape(shape) * 0.37 + 0.1


DUP2 = np.array([[1, -1, 0, 1], [2, 2, 0, -3]])  # duplicates along axis 1 of a (2, 3) tensor


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_grad(axis: int) -> None:
    idx = np.array([[1, -1, 0], [1, 1, 0]]) if axis == 0 else np.array([[2, 0, 0, -1], [1, 1, 1, 0]])
    _check_grad("gather_elements", [_x(2, 3)], [idx], axis=axis)


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_elements_grad(reduction: str) -> None:
    _check_grad("scatter_elements", [_x(2, 3), _x(2, 4)], [DUP2], build=lambda i, c: [i[0], c[0], i[1]], axis=1,
                reduction=reduction)
    _check_grad("scatter_elements", [_x(3, 2), _x(2, 2)], [np.array([[0, 2], [-1, 1]])],
                build=lambda i, c: [i[0], c[0], i[1]], axis=0, reduction=reduction)


def test_scatter_grad_unsupported_reduction() -> None:
    b = opgraph.GraphBuilder()
    x, u = b.input(("float64", (3,))), b.input(("float64", (2,)))
    y = b.op("scatter_elements", x, b.constant(np.array([0, 1])), u, reduction="mul")
    with pytest.raises(NotImplementedError, match="reduction 'mul'"):
        build_grad_ops(b, b.op("sum", y), [x, u])


def test_gather_nd_grad() -> None:
    _check_grad("gather_nd", [_x(3, 4)], [np.array([[0, 1], [2, -1], [0, 1]])])
    _check_grad("gather_nd", [_x(3, 4)], [np.array([[[1], [1]], [[0], [-1]]])])


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_nd_grad(reduction: str) -> None:
    idx = np.array([[0, 1], [2, -1], [0, 1], [1, 0]])
    _check_grad("scatter_nd", [_x(3, 4), _x(4)], [idx], build=lambda i, c: [i[0], c[0], i[1]], reduction=reduction)
    _check_grad("scatter_nd", [_x(3, 4), _x(3, 4)], [np.array([[2], [-1], [0]])],
                build=lambda i, c: [i[0], c[0], i[1]], reduction=reduction)


@pytest.mark.parametrize("attrs", [{"k": 2}, {"k": 3, "axis": 0, "largest": False}, {"k": 1, "axis": -2}])
def test_topk_grad(attrs: dict[str, Any]) -> None:
    _check_grad("topk", [_x(3, 4)], [], **attrs)


def test_one_hot_grad() -> None:
    _check_grad("one_hot", [np.array([0.3, 1.7])], [np.array([[0, 5, -1], [2, 1, 1]])], build=lambda i, c: [c[0], i[0]],
                depth=3, axis=1)


@pytest.mark.parametrize("attrs", [{}, {"k": 1}, {"k": -1, "upper": False}])
def test_trilu_grad(attrs: dict[str, Any]) -> None:
    _check_grad("trilu", [_x(2, 3, 4)], [], **attrs)


def test_reverse_sequence_grad() -> None:
    _check_grad("reverse_sequence", [_x(4, 3, 2)], [np.array([4, 0, 2])])
    _check_grad("reverse_sequence", [_x(3, 4)], [np.array([1, 4, 3])], batch_axis=0, time_axis=1)


def test_compiled_runtime_matches_executor() -> None:
    # The compiled runtime writes into planned buffers and may let scatters overwrite x's buffer in place.
    from opgraph.runtime.compiled import compile

    b = opgraph.GraphBuilder()
    x = b.input(("float64", (4, 5)), name="x")
    lens = b.input(("int64", (5,)), name="lens")
    h = b.op("exp", x)
    vals, inds = b.op("topk", h, k=3, axis=0)
    s = b.op("scatter_elements", b.op("negative", h), inds, vals, axis=0, reduction="add")
    s2 = b.op("scatter_nd", b.op("sin", h), b.constant(np.array([[0, 1], [3, -1], [0, 1]])),
              b.op("gather_nd", h, b.constant(np.array([[1, 1], [2, 2], [3, 3]]))), reduction="max")
    t = b.op("trilu", b.op("reverse_sequence", s, lens, batch_axis=1, time_axis=0), k=-1)
    oh = b.op("one_hot", inds, b.constant(np.array([0.0, 1.0])), depth=4, axis=1)
    g_el = b.op("gather_elements", t, inds, axis=0)
    b.output(t, s2, oh, g_el, vals)
    g = b.freeze().verify()
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 5)), "lens": np.array([4, 0, 1, 3, 2])}
    want = g.run(feeds)
    f = compile(g)
    for _ in range(2):
        for got, w in zip(f(feeds), want, strict=True):
            np.testing.assert_array_equal(got, w)


# ---------------------------------------------------------------- sort, unique, nonzero, searchsorted
def ref_sort(x: np.ndarray, axis: int = -1, descending: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A loop reference: each lane's positions ordered by (value, position), or (-value, position); NaN largest."""
    ax = axis % x.ndim
    moved = np.moveaxis(x, ax, -1)
    order = np.empty(moved.shape, dtype=np.int64)
    for lane in np.ndindex(moved.shape[:-1]):
        row = moved[lane]

        def key(i: int, row: np.ndarray = row) -> tuple[Any, ...]:
            v = row[i].item()  # a Python number: negating it neither wraps (uint) nor fails (bool)
            nan = v != v
            rank = (1, 0) if nan else (0, v)
            if descending:
                rank = (-rank[0], -rank[1]) if not nan else (-1, 0)
            return (*rank, i)

        order[lane] = sorted(range(row.shape[0]), key=key)
    order = np.moveaxis(order, -1, ax)
    return np.take_along_axis(x, order, axis=ax), order


SORT_CASES: list[tuple[tuple[int, ...], dict[str, Any]]] = [
    ((7,), {}), ((3, 5), {}), ((3, 5), {"axis": 0}), ((3, 5), {"descending": True}),
    ((2, 3, 4), {"axis": 1, "descending": True}), ((0, 3), {}), ((3, 0), {"axis": 0}),
]


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int64", "float16", "float32", "float64"])
@pytest.mark.parametrize(("shape", "attrs"), SORT_CASES)
def test_sort(shape: tuple[int, ...], attrs: dict[str, Any], dtype: str) -> None:
    x = rand(_rng(), shape, dtype, -2, 3)  # few distinct values: stability matters
    check_op("sort", [x], functools.partial(ref_sort, **attrs), **attrs)


def test_sort_nan_and_stability_vs_torch() -> None:
    torch = pytest.importorskip("torch")
    x = np.array([[1.0, np.nan, -np.inf, 1.0, 0.0, -0.0, np.nan, 2.0]])
    for descending in (False, True):
        vals, idx = run_op("sort", x, descending=descending)
        tv, ti = torch.sort(torch.from_numpy(x), dim=-1, descending=descending, stable=True)
        np.testing.assert_array_equal(vals, tv.numpy())
        np.testing.assert_array_equal(idx, ti.numpy())


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int64", "float32", "float64", "complex128"])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (0,), (2, 0, 3), ()])
def test_unique(shape: tuple[int, ...], dtype: str) -> None:
    x = rand(_rng(), shape, dtype, -2, 3)
    if dtype == "float64" and x.size:
        x.flat[0] = x.flat[-1] = np.nan  # each NaN is its own value (the Array API)

    def ref(a: np.ndarray) -> list[np.ndarray]:
        flat = a.ravel()
        values: list[Any] = []
        first: list[int] = []
        inverse = np.empty(flat.shape, dtype=np.int64)
        for i, v in enumerate(flat):
            hit = [j for j, u in enumerate(values) if u == v]  # NaN != NaN: a new entry
            if hit:
                inverse[i] = hit[0]
            else:
                inverse[i] = len(values)
                values.append(v)
                first.append(i)
        order = sorted(range(len(values)), key=lambda j: (np.isnan(values[j]) if a.dtype.kind in "fc" else False,
                                                          values[j].real if a.dtype.kind == "c" else values[j],
                                                          values[j].imag if a.dtype.kind == "c" else 0, j))
        rank = np.empty(len(values), dtype=np.int64)
        rank[order] = np.arange(len(values))
        counts = np.bincount(inverse, minlength=len(values)).astype(np.int64)
        return [np.array([values[j] for j in order], dtype=a.dtype), np.array(first, dtype=np.int64)[order],
                rank[inverse].reshape(a.shape) if len(values) else inverse.reshape(a.shape), counts[order]]

    check_op("unique", [x], ref, check_out=False)


def test_unique_has_a_dynamic_dim() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("int64", (5,)))
    values, first, inverse, counts = b.op("unique", x)
    assert (values.type, first.type, inverse.type, counts.type) == (
        TensorType("int64", (None,)), TensorType("int64", (None,)), TensorType("int64", (5,)),
        TensorType("int64", (None,)))
    for data in (np.array([1, 1, 1, 1, 1]), np.array([5, 4, 3, 2, 1])):  # one graph, outputs of sizes 1 and 5
        got = b.run({x: data}, [values, counts])
        np.testing.assert_array_equal(got[0], np.unique(data))
        np.testing.assert_array_equal(got[1], np.unique(data, return_counts=True)[1])


@pytest.mark.parametrize("dtype", ["bool", "int8", "float64", "complex64"])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 0, 3), (2, 3, 2)])
def test_nonzero(shape: tuple[int, ...], dtype: str) -> None:
    x = rand(_rng(), shape, dtype, -1, 2)

    def ref(a: np.ndarray) -> np.ndarray:
        hits = [pos for pos in np.ndindex(a.shape) if a[pos] != 0]
        return np.array(hits, dtype=np.int64).reshape(len(hits), a.ndim).T

    check_op("nonzero", [x], ref, check_out=False)


def test_nonzero_of_0d_is_an_error() -> None:
    b = opgraph.GraphBuilder()
    with pytest.raises(OpBuildError, match="0-d"):
        b.op("nonzero", b.input(("float64", ())))


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("dtype", ["int8", "uint16", "float32", "float64"])
def test_searchsorted(side: str, dtype: str) -> None:
    table = np.sort(rand(_rng(), (9,), dtype, -3, 4))
    values = rand(np.random.default_rng(3), (3, 4), dtype, -4, 5)

    def ref(a: np.ndarray, v: np.ndarray) -> np.ndarray:
        out = np.empty(v.shape, dtype=np.int64)
        for pos in np.ndindex(v.shape):
            out[pos] = sum(1 for t in a if (t < v[pos] if side == "left" else t <= v[pos]))
        return out

    check_op("searchsorted", [table, values], ref, side=side)


def test_searchsorted_needs_a_1d_table() -> None:
    b = opgraph.GraphBuilder()
    with pytest.raises(OpBuildError, match="1-D"):
        b.op("searchsorted", b.input(("float64", (2, 2))), b.input(("float64", (3,))))
    with pytest.raises(OpBuildError, match="side"):
        b.op("searchsorted", b.input(("float64", (2,))), b.input(("float64", (3,))), side="middle")


@pytest.mark.parametrize("attrs", [{}, {"axis": 0, "descending": True}])
def test_sort_grad(attrs: dict[str, Any]) -> None:
    _check_grad("sort", [_x(3, 4)], [], **attrs)


def test_unique_equal_nan_merges_nans() -> None:
    x = np.array([np.nan, 2.0, np.nan, 1.0, 2.0])
    got = run_op("unique", x, equal_nan=True)
    want = np.unique(x, return_index=True, return_inverse=True, return_counts=True, equal_nan=True)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert got[0].shape == (3,)  # the two NaNs are one value
    assert run_op("unique", x)[0].shape == (4,)  # default: each NaN its own value
