"""opgraph.numpy as an Array API 2025.12 namespace: one test per behaviour the standard's suite checks.

The full suite (data-apis/array-api-tests) runs from a clone outside the repository (see
docs/array-api.md); these tests keep each fix from regressing, against NumPy as the reference.
Indexing is property-tested with hypothesis: NumPy's own indexing of the same key is the oracle.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import opgraph
import opgraph.numpy as onp

SETTINGS = settings(max_examples=60, deadline=None)


# ---------------------------------------------------------------- namespace and inspection
def test_version_and_namespace() -> None:
    assert onp.__array_api_version__ == "2025.12"
    assert onp.asarray([1.0]).__array_namespace__() is onp


def test_info_tells_the_truth() -> None:
    info = onp.__array_namespace_info__()
    caps = info.capabilities()
    assert caps["boolean indexing"] and caps["data-dependent shapes"]
    # what it claims works: a boolean mask, and a data-dependent shape
    x = onp.asarray([1, -2, 3])
    np.testing.assert_array_equal(x[x > 0].eval(), [1, 3])
    assert onp.unique_values(x).shape == (3,)
    assert info.devices() == ("cpu",) and info.default_device() == "cpu"
    assert info.default_dtypes()["indexing"] == np.int64
    assert set(info.dtypes(kind="real floating")) == {"float32", "float64"}
    assert "complex64" in info.dtypes() and "float16" not in info.dtypes()


def test_finfo_fields_are_python_floats() -> None:
    for dt in (onp.float32, onp.float64, onp.complex64):
        fi, ref = onp.finfo(dt), np.finfo(dt)
        for field in ("eps", "max", "min", "smallest_normal"):
            value = getattr(fi, field)
            assert type(value) is float and value == float(getattr(ref, field))
        assert fi.bits == ref.bits and fi.dtype == ref.dtype


# ---------------------------------------------------------------- creation and manipulation fixes
def test_arange_step_with_stop_only() -> None:
    assert onp.arange(10, step=3).shape == (4,)
    np.testing.assert_array_equal(onp.arange(10, step=3).eval(), np.arange(0, 10, 3))
    # the case that made the suite try to allocate 8 GiB
    assert onp.arange(1004188477.0, step=100653397890458).shape == (1,)


@pytest.mark.parametrize("fn", ["sum", "prod", "cumulative_sum", "cumulative_prod"])
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "float32"])
def test_reduction_dtype_argument_is_the_result_dtype(fn: str, dtype: str) -> None:
    x = np.array([[1, 2], [3, 4]], dtype=np.int8)
    kw = {"axis": 1} if fn.startswith("cumulative") else {}
    got = getattr(onp, fn)(onp.asarray(x), dtype=dtype, **kw)
    assert got.dtype == np.dtype(dtype)
    npfn = {"sum": np.sum, "prod": np.prod, "cumulative_sum": np.cumsum, "cumulative_prod": np.cumprod}[fn]
    np.testing.assert_array_equal(got.eval(), npfn(x, dtype=dtype, **kw))


def test_repeat_with_an_array_of_counts() -> None:
    x = np.array([[1, 2, 3], [4, 5, 6]])
    for counts, axis in ((np.array([1, 0, 2]), 1), (np.array([2, 1]), 0), (np.array([3]), None),
                         (np.arange(6) % 3, None)):
        got = onp.repeat(onp.asarray(x), onp.asarray(counts), axis=axis)
        np.testing.assert_array_equal(got.eval(), np.repeat(x, counts, axis=axis))


def test_unstack_of_size_zero_and_broadcast_arrays_tuple() -> None:
    assert onp.unstack(onp.zeros((0, 3))) == ()
    parts = onp.unstack(onp.asarray(np.arange(6).reshape(2, 3)), axis=1)
    assert len(parts) == 3 and all(p.shape == (2,) for p in parts)
    out = onp.broadcast_arrays(onp.ones((2, 1)), onp.ones(3))
    assert isinstance(out, tuple) and [o.shape for o in out] == [(2, 3), (2, 3)]


def test_expand_dims_out_of_range_is_an_index_error() -> None:
    with pytest.raises(IndexError):
        onp.expand_dims(onp.ones(2), axis=3)
    with pytest.raises(IndexError):
        onp.unstack(onp.ones(2), axis=1)


def test_slices_take_0d_integer_arrays() -> None:
    x = onp.asarray(np.arange(10))
    np.testing.assert_array_equal(x[onp.asarray(2):onp.asarray(8):onp.asarray(3)].eval(), np.arange(2, 8, 3))


def test_broadcast_shapes_and_meshgrid() -> None:
    assert onp.broadcast_shapes((2, 1), (1, 3), ()) == (2, 3)
    assert onp.broadcast_shapes() == ()
    with pytest.raises(ValueError):
        onp.broadcast_shapes((2,), (3,))
    a, b = np.arange(3), np.arange(4.0).astype(np.int64)
    for indexing in ("xy", "ij"):
        got = onp.meshgrid(onp.asarray(a), onp.asarray(b), onp.asarray(a), indexing=indexing)
        for g, w in zip(got, np.meshgrid(a, b, a, indexing=indexing), strict=True):
            np.testing.assert_array_equal(g.eval(), w)


# ---------------------------------------------------------------- sorting, sets, searching
@SETTINGS
@given(hnp.arrays(st.sampled_from([np.int8, np.float32, np.float64]), hnp.array_shapes(min_dims=1, max_dims=3)),
       st.integers(-1, 0), st.booleans())
def test_sort_and_argsort_vs_numpy(x: np.ndarray, axis: int, descending: bool) -> None:
    got_v = onp.sort(onp.asarray(x), axis=axis, descending=descending).eval()
    got_i = onp.argsort(onp.asarray(x), axis=axis, descending=descending).eval()
    if descending:  # stable descending: NumPy's stable sort of the negated order keys, as array-api-strict
        want_i = np.flip(np.argsort(np.flip(x, axis=axis), axis=axis, kind="stable"), axis=axis)
        want_i = x.shape[axis] - 1 - want_i
    else:
        want_i = np.argsort(x, axis=axis, kind="stable")
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_array_equal(got_v, np.take_along_axis(x, want_i, axis=axis))


@SETTINGS
@given(hnp.arrays(st.sampled_from([np.int16, np.float64]), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0),
                  elements=st.integers(-3, 3)))
def test_unique_functions_vs_numpy(x: np.ndarray) -> None:
    lx = onp.asarray(x)
    values, first, inverse, counts = np.unique(x.ravel(), return_index=True, return_inverse=True,
                                               return_counts=True)
    allr = onp.unique_all(lx)
    np.testing.assert_array_equal(allr.values.eval(), values)
    np.testing.assert_array_equal(allr.indices.eval(), first)
    np.testing.assert_array_equal(allr.inverse_indices.eval(), inverse.reshape(x.shape))
    np.testing.assert_array_equal(allr.counts.eval(), counts)
    assert allr.values.shape == values.shape and allr.inverse_indices.shape == x.shape
    np.testing.assert_array_equal(onp.unique_values(lx).eval(), values)
    np.testing.assert_array_equal(onp.unique_counts(lx).counts.eval(), counts)
    np.testing.assert_array_equal(onp.unique_inverse(lx).inverse_indices.eval(), inverse.reshape(x.shape))


def test_unique_keeps_each_nan() -> None:
    got = onp.unique_values(onp.asarray([np.nan, 1.0, np.nan])).eval()
    assert got.shape == (3,) and np.isnan(got[1:]).all()


def test_data_dependent_shapes_inside_a_graph() -> None:
    # Traced: the dim is unknown; the same graph then gives outputs of different lengths.
    x = onp.placeholder((6,), "int64", name="x")
    (rows,) = onp.nonzero(x)
    vals = onp.unique_values(x)
    assert rows.shape == (None,) and vals.shape == (None,)
    g = onp.to_graph([rows, vals], inputs=[x])
    for data in (np.array([0, 1, 0, 2, 2, 0]), np.array([5, 4, 3, 2, 1, 7])):
        got_rows, got_vals = g.run({"x": data})
        np.testing.assert_array_equal(got_rows, np.nonzero(data)[0])
        np.testing.assert_array_equal(got_vals, np.unique(data))


@SETTINGS
@given(hnp.arrays(np.int32, hnp.array_shapes(min_dims=1, max_dims=3), elements=st.integers(-2, 2)))
def test_nonzero_and_count_nonzero_vs_numpy(x: np.ndarray) -> None:
    got = onp.nonzero(onp.asarray(x))
    for g, w in zip(got, np.nonzero(x), strict=True):
        np.testing.assert_array_equal(g.eval(), w)
        assert g.dtype == np.int64
    np.testing.assert_array_equal(onp.count_nonzero(onp.asarray(x), axis=0).eval(), np.count_nonzero(x, axis=0))


def test_searchsorted_isin_take_along_axis() -> None:
    table = np.array([1.0, 2.0, 2.0, 5.0])
    v = np.array([[0.0, 2.0], [5.0, 9.0]])
    for side in ("left", "right"):
        np.testing.assert_array_equal(onp.searchsorted(onp.asarray(table), onp.asarray(v), side=side).eval(),
                                      np.searchsorted(table, v, side=side))
    sorter = np.array([3, 0, 2, 1])
    np.testing.assert_array_equal(
        onp.searchsorted(onp.asarray(table[np.argsort(sorter)]), onp.asarray(v), sorter=onp.asarray(sorter)).eval(),
        np.searchsorted(table[np.argsort(sorter)], v, sorter=sorter))
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 10, (4, 5)), rng.integers(0, 10, 7)
    for invert in (False, True):
        np.testing.assert_array_equal(onp.isin(onp.asarray(a), onp.asarray(b), invert=invert).eval(),
                                      np.isin(a, b, invert=invert))
    nan = onp.isin(onp.asarray([np.nan, 1.0]), onp.asarray([np.nan, 1.0])).eval()
    np.testing.assert_array_equal(nan, [False, True])
    np.testing.assert_array_equal(onp.isin(onp.asarray([1, 2]), onp.asarray(np.zeros(0, int))).eval(), [0, 0])
    x, idx = rng.standard_normal((3, 4)), rng.integers(0, 4, (1, 4))
    np.testing.assert_array_equal(onp.take_along_axis(onp.asarray(x), onp.asarray(idx), axis=1).eval(),
                                  np.take_along_axis(x, np.broadcast_to(idx, (3, 4)), axis=1))


def test_diff_vs_numpy() -> None:
    x = np.array([[1, 4, 9, 16], [2, 3, 5, 7]])
    for kw in ({}, {"n": 2}, {"axis": 0}, {"n": 0}, {"prepend": np.zeros((2, 1), int), "append": x[:, :2]}):
        lazy_kw = {k: onp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
        np.testing.assert_array_equal(onp.diff(onp.asarray(x), **lazy_kw).eval(), np.diff(x, **kw))
    b = np.array([True, True, False])
    np.testing.assert_array_equal(onp.diff(onp.asarray(b)).eval(), np.diff(b))


# ---------------------------------------------------------------- indexing
_SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)


@st.composite
def _int_array_keys(draw: st.DrawFn) -> tuple[np.ndarray, tuple[object, ...]]:
    shape = draw(_SHAPES)
    x = np.arange(int(np.prod(shape))).reshape(shape)
    key: list[object] = []
    for side in shape:
        kind = draw(st.sampled_from(["int", "array", "slice", "array"]))
        if kind == "int":
            key.append(draw(st.integers(-side, side - 1)))
        elif kind == "slice":
            key.append(slice(draw(st.integers(-side, side)), None, draw(st.sampled_from([1, 2, -1]))))
        else:
            key.append(draw(hnp.arrays(np.int64, draw(st.sampled_from([(2,), (1,), (2, 1), (1, 2)])),
                                       elements=st.integers(-side, side - 1))))
    if draw(st.booleans()) and len(key) > 1:
        key = [*key[:-1], Ellipsis]
    return x, tuple(key)


@SETTINGS
@given(_int_array_keys())
def test_integer_array_indexing_vs_numpy(case: tuple[np.ndarray, tuple[object, ...]]) -> None:
    x, key = case
    lazy_key = tuple(onp.asarray(k) if isinstance(k, np.ndarray) else k for k in key)
    want = x[key]
    got = onp.asarray(x)[lazy_key]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.eval(), want)


@SETTINGS
@given(_int_array_keys(), st.integers(-50, -1))
def test_setitem_vs_numpy(case: tuple[np.ndarray, tuple[object, ...]], value: int) -> None:
    x, key = case
    lazy = onp.asarray(x, copy=True)
    before = lazy[...]  # an array computed from the old value keeps it (functional update)
    lazy[tuple(onp.asarray(k) if isinstance(k, np.ndarray) else k for k in key)] = value
    want = x.copy()
    want[key] = value
    np.testing.assert_array_equal(lazy.eval(), want)
    np.testing.assert_array_equal(before.eval(), x)


@SETTINGS
@given(hnp.arrays(np.float64, _SHAPES, elements=st.floats(-5, 5)), st.data())
def test_boolean_masks_vs_numpy(x: np.ndarray, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, x.ndim))
    mask = data.draw(hnp.arrays(np.bool_, x.shape[:k]))
    lazy = onp.asarray(x)
    got = lazy[onp.asarray(mask)]
    assert got.shape == x[mask].shape
    np.testing.assert_array_equal(got.eval(), x[mask])
    updated = onp.asarray(x, copy=True)
    updated[onp.asarray(mask)] = -1.0
    want = x.copy()
    want[mask] = -1.0
    np.testing.assert_array_equal(updated.eval(), want)


def test_mask_from_a_placeholder_records_a_dynamic_dim() -> None:
    x = onp.placeholder((5,), name="x")
    picked = x[x > 0]
    assert picked.shape == (None,)
    g = onp.to_graph([picked], inputs=[x])
    data = np.array([1.0, -1.0, 2.0, -3.0, 4.0])
    np.testing.assert_array_equal(g.run({"x": data})[0], data[data > 0])


def test_setitem_with_computed_indices_in_a_graph() -> None:
    # MLP-style: one-hot targets written through integer indexing with a placeholder label vector
    labels = onp.placeholder((4,), "int64", name="labels")
    onehot = onp.zeros((4, 3))
    onehot[onp.arange(4), labels] = 1.0
    g = onp.to_graph([onehot], inputs=[labels])
    data = np.array([2, 0, 1, 2])
    np.testing.assert_array_equal(g.run({"labels": data})[0], np.eye(3)[data])


def test_setitem_value_is_cast_and_old_handles_unchanged() -> None:
    x = onp.asarray(np.arange(4))
    y = x + 1
    alias = x
    copy = onp.asarray(x, copy=True)
    x[1:3] = 7.9  # int array: the value is cast, as NumPy does
    np.testing.assert_array_equal(x.eval(), [0, 7, 7, 3])
    np.testing.assert_array_equal(alias.eval(), [0, 7, 7, 3])  # same handle, same array
    np.testing.assert_array_equal(copy.eval(), [0, 1, 2, 3])
    np.testing.assert_array_equal(y.eval(), [1, 2, 3, 4])


def test_bad_masks_and_indices_are_index_errors() -> None:
    x = onp.ones((3, 4))
    with pytest.raises(IndexError):
        x[onp.asarray([True, False])]
    with pytest.raises(IndexError):
        x[0, 0, 0]
    with pytest.raises(IndexError):
        x[onp.asarray([0]), 7]


# ---------------------------------------------------------------- linalg and fft extensions
def test_linalg_extensions_vs_numpy() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 4, 4))
    la = onp.asarray(a)
    np.testing.assert_allclose(onp.linalg.matrix_power(la, 3).eval(), np.linalg.matrix_power(a, 3))
    np.testing.assert_allclose(onp.linalg.matrix_power(la, -2).eval(), np.linalg.matrix_power(a, -2), rtol=1e-8)
    np.testing.assert_allclose(onp.linalg.matrix_power(la, 0).eval(), np.broadcast_to(np.eye(4), a.shape))
    low = a[0] @ np.diag([1.0, 1.0, 0.0, 0.0]) @ a[1]
    assert int(onp.linalg.matrix_rank(onp.asarray(low))) == np.linalg.matrix_rank(low) == 2
    np.testing.assert_array_equal(onp.linalg.matrix_rank(la, rtol=onp.asarray([0.0, 2.0])).eval(),
                                  np.linalg.matrix_rank(a, rtol=np.array([0.0, 2.0])))
    for offset in (-2, 0, 1, 5):
        np.testing.assert_array_equal(onp.linalg.diagonal(la, offset=offset).eval(),
                                      np.diagonal(a, offset=offset, axis1=-2, axis2=-1))
    u, v = rng.standard_normal((5, 3)), rng.standard_normal((3,))
    np.testing.assert_allclose(onp.linalg.cross(onp.asarray(u), onp.asarray(v)).eval(), np.cross(u, v))
    np.testing.assert_allclose(onp.linalg.cross(onp.asarray(u.T), onp.asarray(u.T), axis=0).eval(), 0.0)
    w = onp.linalg.eigvals(la).eval()
    np.testing.assert_allclose(np.sort_complex(w), np.sort_complex(np.linalg.eigvals(a)), rtol=1e-10)
    rtol = np.array([0.1, 0.9])
    np.testing.assert_allclose(onp.linalg.pinv(la, rtol=onp.asarray(rtol)).eval(), np.linalg.pinv(a, rtol=rtol))
    np.testing.assert_allclose(onp.linalg.pinv(la, rtol=0.5).eval(), np.linalg.pinv(a, rtol=0.5))


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
def test_fft_namespace_vs_numpy(norm: str) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6)) + 1j * rng.standard_normal((4, 6))
    r = rng.standard_normal((4, 6))
    lx, lr = onp.asarray(x), onp.asarray(r)
    f, nf = onp.fft, np.fft
    close = {"rtol": 1e-10, "atol": 1e-10}
    np.testing.assert_allclose(f.fft(lx, n=5, norm=norm).eval(), nf.fft(x, n=5, norm=norm), **close)
    np.testing.assert_allclose(f.ifft(lx, axis=0, norm=norm).eval(), nf.ifft(x, axis=0, norm=norm), **close)
    np.testing.assert_allclose(f.fftn(lx, norm=norm).eval(), nf.fftn(x, norm=norm), **close)
    np.testing.assert_allclose(f.ifftn(lx, s=(3, 4), norm=norm).eval(), nf.ifftn(x, s=(3, 4), axes=(0, 1), norm=norm),
                               **close)
    np.testing.assert_allclose(f.rfft(lr, norm=norm).eval(), nf.rfft(r, norm=norm), **close)
    np.testing.assert_allclose(f.irfft(lx, n=7, norm=norm).eval(), nf.irfft(x, n=7, norm=norm), **close)
    np.testing.assert_allclose(f.rfftn(lr, norm=norm).eval(), nf.rfftn(r, norm=norm), **close)
    np.testing.assert_allclose(f.irfftn(lx, norm=norm).eval(), nf.irfftn(x, norm=norm), **close)
    np.testing.assert_allclose(f.hfft(lx, norm=norm).eval(), nf.hfft(x, norm=norm), **close)
    np.testing.assert_allclose(f.ihfft(lr, norm=norm).eval(), nf.ihfft(r, norm=norm), **close)
    np.testing.assert_allclose(f.fftfreq(7, d=0.5).eval(), nf.fftfreq(7, d=0.5))
    np.testing.assert_allclose(f.rfftfreq(8).eval(), nf.rfftfreq(8))
    np.testing.assert_array_equal(f.fftshift(lr).eval(), nf.fftshift(r))
    np.testing.assert_array_equal(f.ifftshift(lr, axes=1).eval(), nf.ifftshift(r, axes=1))


# ---------------------------------------------------------------- DLPack
def test_dlpack_both_ways() -> None:
    x = onp.asarray(np.arange(6.0).reshape(2, 3)) * 2
    np.testing.assert_array_equal(np.from_dlpack(x), np.arange(6.0).reshape(2, 3) * 2)
    assert x.__dlpack_device__() == (1, 0)
    np.testing.assert_array_equal(onp.from_dlpack(np.arange(3)).eval(), np.arange(3))
    torch = pytest.importorskip("torch")
    t = torch.from_dlpack(x)
    np.testing.assert_array_equal(t.numpy(), np.arange(6.0).reshape(2, 3) * 2)
    np.testing.assert_array_equal(onp.from_dlpack(torch.arange(4)).eval(), np.arange(4))
    np.testing.assert_array_equal(onp.asarray(torch.arange(3.0)).eval(), np.arange(3.0))


@pytest.mark.parametrize("suffix", [".json", ".cg"])
def test_graph_of_new_ops_round_trips_through_files(tmp_path: pytest.TempPathFactory, suffix: str) -> None:
    x = onp.placeholder((5,), name="x")
    values, idx = onp.sort(x), onp.argsort(x, descending=True)
    g = onp.to_graph([values, idx, onp.unique_values(x), onp.searchsorted(values, x)], inputs=[x])
    path = tmp_path / f"g{suffix}"  # type: ignore[operator]
    opgraph.io.save(g, path)
    again = opgraph.io.load(path)
    data = np.array([3.0, 1.0, 2.0, 1.0, 0.5])
    for got, want in zip(again.run({"x": data}), g.run({"x": data}), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("engine", opgraph.backends.available())
def test_data_dependent_graph_runs_on_every_engine(engine: str) -> None:
    # Ops an engine lacks (nonzero, unique) run on NumPy between the engine's parts; the dims stay dynamic.
    x = onp.placeholder((6,), name="x")
    g = onp.to_graph([onp.sort(x[x > 0]) * 2, onp.unique_counts(x).counts], inputs=[x])
    f = opgraph.compile(g, backend=engine)
    for data in (np.array([3.0, -1, 2, 5, -2, 2]), np.array([-1.0, -1, -1, -1, 7, -1])):
        got = f({"x": data})
        np.testing.assert_array_equal(got[0], np.sort(data[data > 0]) * 2)
        np.testing.assert_array_equal(got[1], np.unique(data, return_counts=True)[1])
