"""Contraction ops against NumPy: matmul, einsum, tensordot, vecdot, outer.

Shapes (broadcasting, 1-D promotion, zero-size, 0-d), dtype promotion,
non-contiguous inputs and out= (via the harness), unknown dims, and
build-time errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opgraph
from opcheck import check_op, rand, run_op
from opgraph.core.registry import all_ops, get_op
from opgraph.core.types import TensorType
from opgraph.ops.contraction import _einsum_plan, einsum_signature, matmul_shape

SEED = 99

IDS = {"matmul": 600, "einsum": 601, "tensordot": 602, "vecdot": 603, "outer": 604}

DTYPE_PAIRS = [("float64", "float64"), ("float32", "float64"), ("float32", "float32"), ("float16", "float16"),
               ("int8", "uint8"), ("int32", "float32"), ("bool", "bool"), ("bool", "int8"),
               ("complex64", "float32"), ("complex128", "complex128")]


def _tol(*dtypes: str) -> dict[str, float]:
    if "float16" in dtypes:
        return {"rtol": 1e-2, "atol": 1e-2}
    if any(d in ("float32", "complex64") for d in dtypes):
        return {"rtol": 1e-5, "atol": 1e-5}
    return {"rtol": 1e-10, "atol": 1e-12}


def _arrays(shapes: list[tuple[int, ...]], dtypes: list[str] | str = "float64") -> list[np.ndarray]:
    rng = np.random.default_rng(SEED)
    if isinstance(dtypes, str):
        dtypes = [dtypes] * len(shapes)
    return [rand(rng, s, d) for s, d in zip(shapes, dtypes, strict=True)]


def _build(kind: str, *types: Any, **attrs: Any) -> Any:
    b = opgraph.GraphBuilder()
    ins = [b.input(TensorType(*t) if isinstance(t, tuple) else t) for t in types]
    return b.op(kind, *ins, **attrs)


def test_registry_ids_and_family() -> None:
    for name, id_ in IDS.items():
        d = get_op(name)
        assert d.id == id_ and d.family == "contraction" and not d.elementwise
    assert {d.name for d in all_ops() if d.family == "contraction"} == set(IDS)
    assert get_op("einsum").arity is None and get_op("einsum").min_inputs == 1
    assert get_op("einsum").normalise_attrs({"subscripts": "ij"}) == (("subscripts", "ij"), ("optimize", "auto"))
    assert get_op("tensordot").normalise_attrs({"axes": [[0, 1], [1, 0]]}) == (("axes", ((0, 1), (1, 0))),)
    assert get_op("tensordot").normalise_attrs({}) == (("axes", 2),)
    assert get_op("vecdot").normalise_attrs({}) == (("axis", -1),)


# ------------------------------------------------------------------ matmul
MATMUL_SHAPES = [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 2)),
                 ((4,), (5, 4, 2)), ((2, 3, 4), (4,)), ((0, 3), (3, 4)), ((3, 0), (0, 4)), ((2, 0, 3), (3, 1)),
                 ((1, 1), (1, 1))]


@pytest.mark.parametrize(("sa", "sb"), MATMUL_SHAPES)
def test_matmul_shapes(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    check_op("matmul", _arrays([sa, sb]), np.matmul, **_tol("float64"))


@pytest.mark.parametrize(("da", "db"), DTYPE_PAIRS)
def test_matmul_dtypes(da: str, db: str) -> None:
    for sa, sb in (((3, 4), (4, 5)), ((2, 3, 4), (4,)), ((4,), (4,))):
        check_op("matmul", _arrays([sa, sb], [da, db]), np.matmul, **_tol(da, db))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=0, max_size=3), st.lists(st.integers(1, 3), min_size=0, max_size=3),
       st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.booleans(), st.booleans())
def test_matmul_shape_rule_matches_numpy(ba: list[int], bb: list[int], n: int, k: int, m: int, vec_a: bool,
                                         vec_b: bool) -> None:
    # Batch dims drawn independently: NumPy decides whether they broadcast.
    sa = (k,) if vec_a else (*ba, n, k)
    sb = (k,) if vec_b else (*bb, k, m)
    try:
        want: Any = np.matmul(np.ones(sa), np.ones(sb)).shape
    except ValueError:
        want = None
    if want is None:
        with pytest.raises(opgraph.OpTypeError):
            matmul_shape(sa, sb)
    else:
        assert matmul_shape(sa, sb) == want


# ------------------------------------------------------------------ einsum
EINSUM_CASES: list[tuple[str, list[tuple[int, ...]]]] = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ij,jk,kl,lm", [(2, 3), (3, 4), (4, 5), (5, 2)]),
    ("ba", [(2, 3)]),
    ("aB", [(2, 3)]),
    ("Ba,aC", [(2, 3), (3, 4)]),
    ("ii", [(3, 3)]),
    ("ii->i", [(3, 3)]),
    ("iij->ji", [(3, 3, 2)]),
    ("ij->", [(3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    (",i->i", [(), (4,)]),
    ("", [()]),
    ("ij,ij->ij", [(1, 3), (2, 3)]),
    ("ij,jk->ik", [(2, 1), (3, 4)]),
    ("...ij,...jk->...ik", [(5, 1, 2, 3), (4, 3, 2)]),
    ("...ij,...jk", [(5, 1, 2, 3), (4, 3, 2)]),
    ("i...j,jk", [(2, 5, 3), (3, 4)]),
    ("i...j,jk->k...i", [(2, 5, 6, 3), (3, 4)]),
    ("...i,...i", [(5, 3), (2, 1, 3)]),
    ("...,...->...", [(2, 3), (3,)]),
    ("ij->...ij", [(2, 3)]),
    ("...i,i->...", [(0, 3), (3,)]),
    ("ij,jk->ik", [(0, 3), (3, 4)]),
    ("ij,jk->ik", [(2, 0), (0, 4)]),
    (" ij , jk -> ik ", [(2, 3), (3, 4)]),
    ("bij,bjk->bik", [(4, 2, 3), (4, 3, 5)]),
    ("abc,cd,db->a", [(2, 3, 4), (4, 5), (5, 3)]),
]


@pytest.mark.parametrize(("subscripts", "shapes"), EINSUM_CASES)
def test_einsum_cases(subscripts: str, shapes: list[tuple[int, ...]]) -> None:
    arrays = _arrays(shapes)
    check_op("einsum", arrays, lambda *xs: np.einsum(subscripts, *xs), **_tol("float64"), subscripts=subscripts)


@pytest.mark.parametrize(("da", "db"), DTYPE_PAIRS)
def test_einsum_dtypes(da: str, db: str) -> None:
    for subscripts, shapes in (("ij,jk", [(2, 3), (3, 4)]), ("i,i->", [(5,), (5,)]), ("ij,j->ij", [(2, 3), (3,)])):
        arrays = _arrays(shapes, [da, db])
        check_op("einsum", arrays, lambda *xs, s=subscripts: np.einsum(s, *xs), **_tol(da, db),
                 subscripts=subscripts)


def test_einsum_three_mixed_dtypes_compute_in_the_result_dtype() -> None:
    # np.einsum casts every operand to the common dtype first; so must the contraction order opt_einsum picks.
    arrays = _arrays([(2, 8), (8, 2), (2, 40)], ["int8", "int8", "float64"])  # int8 pair contracted first
    arrays[0] = arrays[0] * np.int8(40)  # int8 intermediates would overflow
    check_op("einsum", arrays, lambda *xs: np.einsum("ij,jk,kl->il", *xs), subscripts="ij,jk,kl->il")


@pytest.mark.parametrize("optimize", ["auto", "greedy", "optimal", "dp", "branch-2"])
def test_einsum_optimize(optimize: str) -> None:
    arrays = _arrays([(2, 3), (3, 4), (4, 5), (5, 2)])
    check_op("einsum", arrays, lambda *xs: np.einsum("ij,jk,kl,lm->im", *xs), **_tol("float64"),
             subscripts="ij,jk,kl,lm->im", optimize=optimize)


@pytest.mark.parametrize(("subscripts", "shapes"), EINSUM_CASES)
@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128"])
def test_einsum_gemm_program_matches_numpy(subscripts: str, shapes: list[tuple[int, ...]], dtype: str) -> None:
    """The NumPy engine's einsum for static shapes: opt_einsum's pairwise steps, each a GEMM by gemm_layout, the
    last written into ``out`` (also a non-contiguous ``out``)."""
    from opgraph.ops.contraction import _einsum_specialize

    arrays = [a.astype(dtype) for a in _arrays(shapes)]
    _, out_shape = einsum_signature(subscripts, shapes)
    got = _einsum_specialize([TensorType.of(a) for a in arrays], [TensorType(dtype, out_shape)],
                             {"subscripts": subscripts, "optimize": "auto"})
    if "..." in subscripts:
        assert got is None  # the general kernel runs it
        return
    assert got is not None
    call, before, after = got
    out = np.full(out_shape, np.nan, dtype)
    assert call(*arrays, *before, out, *after) is out
    np.testing.assert_allclose(out, np.einsum(subscripts, *arrays), **_tol(dtype))
    if len(out_shape) == 2:
        strided = np.full(out_shape[::-1], np.nan, dtype).T
        call(*arrays, strided)
        np.testing.assert_allclose(strided, np.einsum(subscripts, *arrays), **_tol(dtype))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from("abcde"), max_size=4, unique=True), min_size=2, max_size=2),
       st.permutations("abcde"), st.integers(0, 5), st.integers(0, 2**32 - 1))
def test_gemm_layout_matches_einsum(terms: list[list[str]], order: list[str], keep: int, seed: int) -> None:
    from opgraph.ops.contraction import gemm, gemm_layout

    la, lb = ("".join(t) for t in terms)
    lo = "".join(c for c in order if c in la + lb)[:keep]
    rng = np.random.default_rng(seed)
    size = {c: int(rng.integers(1, 4)) for c in "abcde"}
    a, b = rng.standard_normal([size[c] for c in la]), rng.standard_normal([size[c] for c in lb])
    layout = gemm_layout(la, lb, lo, size)
    assert layout is not None
    want = np.einsum(f"{la},{lb}->{lo}", a, b)
    np.testing.assert_allclose(gemm(layout, a, b), want, rtol=1e-10, atol=1e-12)
    out = np.empty(want.shape)
    assert gemm(layout, a, b, out) is out
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)


def test_einsum_plans_are_cached() -> None:
    arrays = _arrays([(3, 7), (7, 2)])
    run_op("einsum", *arrays, subscripts="ij,jk->ki")
    before = _einsum_plan.cache_info().hits
    run_op("einsum", *arrays, subscripts="ij,jk->ki")
    assert _einsum_plan.cache_info().hits > before
    assert _einsum_plan.cache_info().maxsize is not None


@pytest.mark.parametrize(("subscripts", "shapes"), EINSUM_CASES)
def test_einsum_signature_matches_numpy(subscripts: str, shapes: list[tuple[int, ...]]) -> None:
    explicit, shape = einsum_signature(subscripts, shapes)
    arrays = [np.ones(s) for s in shapes]
    assert shape == np.einsum(subscripts, *arrays).shape
    np.testing.assert_array_equal(np.einsum(explicit, *arrays), np.einsum(subscripts, *arrays))


# ------------------------------------------------------------------ tensordot
TENSORDOT_CASES: list[tuple[tuple[int, ...], tuple[int, ...], Any]] = [
    ((2, 3, 4), (3, 4, 5), 2), ((2, 3), (3, 4), 1), ((2, 3), (4, 5), 0), ((3, 4), (3, 4), 2),
    ((2, 3, 4), (4, 3, 5), ((1, 2), (1, 0))), ((2, 3, 4), (4, 3, 5), ([-2, -1], [1, 0])),
    ((2, 3), (3, 2), (1, 0)), ((2, 3), (3, 2), ((0,), (1,))), ((0, 3), (3, 4), 1), ((2, 0), (0, 4), 1),
    ((), (3,), 0), ((3, 4), (4, 3), ((), ())),
]


@pytest.mark.parametrize(("sa", "sb", "axes"), TENSORDOT_CASES)
def test_tensordot(sa: tuple[int, ...], sb: tuple[int, ...], axes: Any) -> None:
    check_op("tensordot", _arrays([sa, sb]), lambda a, b: np.tensordot(a, b, axes=axes), **_tol("float64"),
             axes=axes)


@pytest.mark.parametrize(("da", "db"), DTYPE_PAIRS)
def test_tensordot_dtypes(da: str, db: str) -> None:
    check_op("tensordot", _arrays([(2, 3, 4), (3, 4, 2)], [da, db]), np.tensordot, **_tol(da, db))
    check_op("tensordot", _arrays([(3,), (3,)], [da, db]), lambda a, b: np.tensordot(a, b, axes=1),
             **_tol(da, db), axes=1)


# ------------------------------------------------------------------ vecdot
VECDOT_CASES: list[tuple[tuple[int, ...], tuple[int, ...], int]] = [
    ((5,), (5,), -1), ((3, 4), (4,), -1), ((2, 1, 5), (3, 5), -1), ((3, 4, 5), (4, 5), -2),
    ((3, 4, 5), (3, 4, 5), 0), ((4, 3), (4, 3), 0), ((0, 3), (3,), -1), ((3, 0), (1, 0), -1),
]


@pytest.mark.parametrize(("sa", "sb", "axis"), VECDOT_CASES)
def test_vecdot(sa: tuple[int, ...], sb: tuple[int, ...], axis: int) -> None:
    check_op("vecdot", _arrays([sa, sb]), lambda a, b: np.vecdot(a, b, axis=axis), **_tol("float64"), axis=axis)


@pytest.mark.parametrize(("da", "db"), DTYPE_PAIRS)
def test_vecdot_dtypes(da: str, db: str) -> None:
    check_op("vecdot", _arrays([(3, 4), (2, 1, 4)], [da, db]), np.vecdot, **_tol(da, db))


def test_vecdot_conjugates_the_first_argument() -> None:
    x1, x2 = np.array([1 + 2j, 3 - 1j]), np.array([2 - 1j, 1j])
    (got,) = run_op("vecdot", x1, x2)
    assert got == np.sum(np.conj(x1) * x2) and got != np.sum(x1 * x2)


# ------------------------------------------------------------------ outer
@pytest.mark.parametrize(("sa", "sb"), [((3,), (4,)), ((2, 3), (4,)), ((), (4,)), ((0,), (3,)), ((2, 2), (3, 1))])
def test_outer(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    check_op("outer", _arrays([sa, sb]), np.outer, **_tol("float64"))


@pytest.mark.parametrize(("da", "db"), DTYPE_PAIRS)
def test_outer_dtypes(da: str, db: str) -> None:
    check_op("outer", _arrays([(3,), (2, 2)], [da, db]), np.outer, **_tol(da, db))


# ------------------------------------------------------------------ results are arrays
def test_zero_d_results_are_arrays() -> None:
    a = np.arange(3.0)
    for kind, attrs in (("matmul", {}), ("einsum", {"subscripts": "i,i"}), ("tensordot", {"axes": 1}),
                        ("vecdot", {"axis": -1})):
        r = opgraph.core.registry.resolve(kind, [TensorType.of(a)] * 2, attrs)
        got = get_op(kind).kernel_for(r.version)(a, a, **dict(r.attrs))
        assert isinstance(got, np.ndarray) and got.shape == () and got == 5.0, kind


# ------------------------------------------------------------------ unknown dims and ranks
@pytest.mark.parametrize(("kind", "types", "attrs", "want"), [
    ("matmul", [(None, 3), (3, 4)], {}, (None, 4)),
    ("matmul", [(2, None), (None, 4)], {}, (2, 4)),
    ("matmul", [(None, 2, 3), (5, 1, 3, None)], {}, (5, None, 2, None)),
    ("matmul", [(3,), (None, 3, 4)], {}, (None, 4)),
    ("matmul", [None, (3, 4)], {}, None),
    ("einsum", [(None, 3), (3, None)], {"subscripts": "ij,jk"}, (None, None)),
    ("einsum", [(1, 3), (None, 3)], {"subscripts": "ij,ij->ij"}, (None, 3)),
    ("einsum", [(2, 3), (None, 3)], {"subscripts": "ij,ij->ij"}, (2, 3)),
    ("einsum", [None, (3, 4)], {"subscripts": "ij,jk->ik"}, (None, 4)),
    ("einsum", [None, (3, 4)], {"subscripts": "...j,jk->...k"}, None),
    ("einsum", [None, (3, 4)], {"subscripts": "...j,jk->k"}, (4,)),
    ("einsum", [(None, 2, 3), (3,)], {"subscripts": "...j,j"}, (None, 2)),
    ("tensordot", [(None, 3), (3, 4)], {"axes": 1}, (None, 4)),
    ("tensordot", [None, (3, 4)], {"axes": 1}, None),
    ("tensordot", [(3, 4), None], {"axes": ((0,), (-1,))}, None),
    ("vecdot", [(None, 3), (3,)], {}, (None,)),
    ("vecdot", [(2, None), (1, None)], {}, (2,)),
    ("vecdot", [None, (3,)], {}, None),
    ("outer", [(None, 3), (4,)], {}, (None, 4)),
    ("outer", [None, (2, 2)], {}, (None, 4)),
])
def test_unknown_dims(kind: str, types: list[Any], attrs: dict[str, Any], want: Any) -> None:
    v = _build(kind, *(TensorType("float64", s) for s in types), **attrs)
    assert v.type.shape == want


def test_run_with_unknown_dims() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(TensorType("float64", (None, 3)), name="x")
    w = b.input(TensorType("float64", (3, 2)), name="w")
    y = b.op("matmul", x, w)
    z = b.op("einsum", x, w, subscripts="ij,jk->k")
    assert y.type.shape == (None, 2) and z.type.shape == (2,)
    xs, ws = _arrays([(5, 3), (3, 2)])
    got_y, got_z = b.run({x: xs, w: ws}, [y, z])
    np.testing.assert_allclose(got_y, xs @ ws)
    np.testing.assert_allclose(got_z, np.einsum("ij,jk->k", xs, ws))


# ------------------------------------------------------------------ build-time errors
F64 = "float64"


@pytest.mark.parametrize(("kind", "shapes", "attrs", "reason"), [
    ("matmul", [(2, 3), (4, 5)], {}, r"\[2,3\] and \[4,5\] do not match"),
    ("matmul", [(2, 3), (4,)], {}, r"\[2,3\] and \[4\] do not match"),
    ("matmul", [(3,), (4,)], {}, "do not match"),
    ("matmul", [(), (3,)], {}, "rank >= 1"),
    ("matmul", [(2, 2, 3), (3, 3, 4)], {}, "batch dims"),
    ("einsum", [(2, 3)], {"subscripts": "ij,jk"}, "name 2 operand"),
    ("einsum", [(2, 3), (3, 4), (4, 5)], {"subscripts": "ij,jk"}, "name 2 operand"),
    ("einsum", [(2, 3), (4, 5)], {"subscripts": "ij,jk->ik"}, "'j' has sizes"),
    ("einsum", [(2, 3)], {"subscripts": "ii"}, "repeats subscript 'i'"),
    ("einsum", [(2, 3)], {"subscripts": "ijk"}, "rank 2"),
    ("einsum", [(2, 3)], {"subscripts": "i"}, "rank 2"),
    ("einsum", [(2, 3)], {"subscripts": "i1"}, "invalid subscript"),
    ("einsum", [(2, 3)], {"subscripts": "i..j"}, "ellipsis"),
    ("einsum", [(2, 3)], {"subscripts": "ij->k"}, "'k' does not appear"),
    ("einsum", [(2, 2)], {"subscripts": "ij->ii"}, "repeat"),
    ("einsum", [(2, 3)], {"subscripts": "...i->i"}, "no '...'"),
    ("einsum", [(2, 3), (4, 3)], {"subscripts": "...i,...i->...i"}, "do not broadcast"),
    ("einsum", [(2, 3)], {"subscripts": "i->j->i"}, "'->'"),
    ("einsum", [(2, 3)], {"subscripts": "ij", "optimize": "fastest"}, "unknown optimize"),
    ("einsum", [(2, 3)], {}, "missing required attribute 'subscripts'"),
    ("tensordot", [(2, 3), (4, 5)], {"axes": 1}, "do not match"),
    ("tensordot", [(2, 3), (3, 5)], {"axes": 3}, "more axes"),
    ("tensordot", [(2, 3), (3, 5)], {"axes": -1}, ">= 0"),
    ("tensordot", [(2, 3), (3, 5)], {"axes": ((0, 1), (0,))}, "name 2 axes of a"),
    ("tensordot", [(2, 3), (3, 5)], {"axes": ((2,), (0,))}, "out of bounds"),
    ("tensordot", [(3, 3), (3, 3)], {"axes": ((0, 0), (0, 1))}, "repeated axis"),
    ("tensordot", [(3, 3), (3, 3)], {"axes": "x"}, "axes must be"),
    ("tensordot", [None, (3, 5)], {"axes": 3}, "more axes"),
    ("tensordot", [None, (3, 5)], {"axes": -2}, ">= 0"),
    ("tensordot", [(2, 3), None], {"axes": ((5,), (0,))}, "out of bounds"),
    ("vecdot", [(3, 4), (3, 5)], {}, "do not match"),
    ("vecdot", [(2, 4), (3, 4)], {}, "batch dims"),
    ("vecdot", [(3, 4), (4,)], {"axis": -2}, "out of bounds"),
    ("vecdot", [(), (4,)], {}, "rank >= 1"),
])
def test_build_errors(kind: str, shapes: list[Any], attrs: dict[str, Any], reason: str) -> None:
    b = opgraph.GraphBuilder()
    ins = [b.input((F64, s)) for s in shapes]
    with pytest.raises(opgraph.OpBuildError, match=reason) as info:
        b.op(kind, *ins, **attrs)
    assert str(info.value).startswith(f"{kind}(f64")
    assert info.value.op == kind


def test_matmul_error_names_both_shapes_and_the_line() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3)))
    y = b.input(("float64", (4, 5)))
    with pytest.raises(opgraph.OpBuildError) as info:
        b.op("matmul", x, y)
    msg = str(info.value)
    assert msg.startswith("matmul(f64[2,3], f64[4,5]):")
    assert "[2,3]" in msg and "[4,5]" in msg and "test_ops_contraction.py" in msg
