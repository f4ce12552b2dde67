"""Tests of the shape op family (ids 700-799) against NumPy."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opgraph
from opcheck import RNG_SEED, check_op, out_type, rand, run_op
from opgraph.core.registry import get_op
from opgraph.core.types import TensorType
from opgraph.errors import ExecutionError, OpBuildError, OpTypeError
from opgraph.ops.shape import VIEW_OPS, normalize_index

DTYPES = ["bool", "int8", "uint16", "float32", "float64", "complex128"]

IDS = {
    "reshape": 700, "permute_dims": 701, "broadcast_to": 702, "expand_dims": 703, "squeeze": 704,
    "concat": 705, "stack": 706, "split": 707, "getitem": 708, "take": 709, "pad": 710, "flip": 711,
    "roll": 712, "tile": 713, "repeat": 714, "moveaxis": 715, "copy": 716, "slice": 718, "slice_update": 719,
    "shape": 720, "arange": 721, "alloc": 722, "reshape_to": 723, "assert_all": 724,
}


def _pad_ref(x: np.ndarray, pad_width: Any, mode: str = "constant", constant_value: float = 0.0) -> np.ndarray:
    kw = {"constant_values": constant_value} if mode == "constant" else {}
    return np.pad(x, pad_width, mode=mode, **kw)


# NumPy references, spelled with NumPy's own functions (independent of the kernels).
REF: dict[str, Callable[..., Any]] = {
    "reshape": lambda x, shape: np.reshape(x, shape),
    "permute_dims": lambda x, axes=None: np.transpose(x, axes),
    "broadcast_to": lambda x, shape: np.broadcast_to(x, shape),
    "expand_dims": lambda x, axis: np.expand_dims(x, axis),
    "squeeze": lambda x, axis=None: np.squeeze(x, axis),
    "concat": lambda *xs, axis=0: np.concatenate(xs, axis=axis),
    "stack": lambda *xs, axis=0: np.stack(xs, axis=axis),
    "split": lambda x, sections, axis=0: np.split(x, sections, axis=axis),
    "getitem": lambda x, index: x[index],
    "take": lambda x, i, axis=None: np.take(x, i, axis=axis),
    "pad": _pad_ref,
    "flip": lambda x, axis=None: np.flip(x, axis),
    "roll": lambda x, shift, axis=None: np.roll(x, shift, axis),
    "tile": lambda x, reps: np.tile(x, reps),
    "repeat": lambda x, repeats, axis=None: np.repeat(x, repeats, axis),
    "moveaxis": lambda x, source, destination: np.moveaxis(x, source, destination),
    "copy": lambda x: np.copy(x),
}

IDX = np.array([2, -1, 0, 1], dtype=np.int64)

# (kind, inputs, attrs): an input is a shape (random data of the test's dtype) or a fixed array.
CASES: list[tuple[str, list[Any], dict[str, Any]]] = [
    ("reshape", [(2, 3)], {"shape": (3, 2)}),
    ("reshape", [(2, 3)], {"shape": (-1,)}),
    ("reshape", [(2, 3, 4)], {"shape": (4, -1)}),
    ("reshape", [(6,)], {"shape": (1, 2, 1, 3)}),
    ("reshape", [(0, 3)], {"shape": (3, 0)}),
    ("reshape", [(0, 3)], {"shape": (-1, 3)}),
    ("reshape", [()], {"shape": (1,)}),
    ("reshape", [(1,)], {"shape": ()}),
    ("permute_dims", [(2, 3, 4)], {}),
    ("permute_dims", [(2, 3, 4)], {"axes": (1, -1, 0)}),
    ("permute_dims", [(0, 3)], {"axes": None}),
    ("permute_dims", [()], {}),
    ("broadcast_to", [(3,)], {"shape": (2, 3)}),
    ("broadcast_to", [(2, 1)], {"shape": (2, 4)}),
    ("broadcast_to", [()], {"shape": (2, 2)}),
    ("broadcast_to", [(0, 1)], {"shape": (0, 5)}),
    ("broadcast_to", [(1, 3)], {"shape": (0, 3)}),
    ("expand_dims", [(2, 3)], {"axis": 0}),
    ("expand_dims", [(2, 3)], {"axis": -1}),
    ("expand_dims", [(2, 3)], {"axis": (0, 2)}),
    ("expand_dims", [(2, 3)], {"axis": (-1, 0)}),
    ("expand_dims", [(0, 3)], {"axis": 1}),
    ("expand_dims", [()], {"axis": 0}),
    ("squeeze", [(1, 3, 1)], {}),
    ("squeeze", [(1, 3, 1)], {"axis": 0}),
    ("squeeze", [(1, 3, 1)], {"axis": -1}),
    ("squeeze", [(1, 3, 1)], {"axis": (0, 2)}),
    ("squeeze", [(0, 1)], {"axis": 1}),
    ("squeeze", [()], {}),
    ("concat", [(2, 3), (4, 3)], {}),
    ("concat", [(2, 3), (2, 1)], {"axis": -1}),
    ("concat", [(2, 2), (2, 2), (2, 2)], {"axis": 1}),
    ("concat", [(0, 3), (2, 3)], {"axis": 0}),
    ("concat", [(0, 3), (0, 3)], {"axis": 0}),
    ("concat", [(3, 0), (3, 0)], {"axis": 1}),
    ("concat", [(2, 3), (3,)], {"axis": None}),
    ("concat", [(2, 3)], {}),
    ("stack", [(2, 3), (2, 3)], {}),
    ("stack", [(2, 3), (2, 3)], {"axis": -1}),
    ("stack", [(2, 3), (2, 3), (2, 3)], {"axis": 1}),
    ("stack", [(0, 3), (0, 3)], {"axis": 2}),
    ("stack", [(), (), ()], {}),
    ("split", [(6, 4)], {"sections": 3}),
    ("split", [(6, 4)], {"sections": (1, 4)}),
    ("split", [(4, 6)], {"sections": 2, "axis": -1}),
    ("split", [(5,)], {"sections": (3, 1)}),
    ("split", [(5,)], {"sections": (-2,)}),
    ("split", [(5,)], {"sections": (10,)}),
    ("split", [(4,)], {"sections": 1}),
    ("split", [(4,)], {"sections": ()}),
    ("split", [(0, 3)], {"sections": 3}),
    ("split", [(0, 3)], {"sections": (1,)}),
    ("split", [(2, 0)], {"sections": 2, "axis": 1}),
    ("take", [(4, 5), IDX], {"axis": 0}),
    ("take", [(4, 5), IDX], {"axis": -1}),
    ("take", [(4, 5), IDX], {}),
    ("take", [(4, 5), np.array([[0, -2], [3, 4]], np.int32)], {"axis": 1}),
    ("take", [(4, 5), np.array([1, 3], np.uint8)], {"axis": 0}),
    ("take", [(4, 5), np.array([-1, -4], np.int8)], {"axis": 0}),
    ("take", [(4, 5), np.zeros(0, np.int64)], {"axis": 1}),
    ("take", [(0, 3), np.array([2, 0], np.int64)], {"axis": 1}),
    ("take", [(), np.array([0, 0, -1], np.int64)], {}),
    ("take", [(), np.array([[0], [-1]], np.int64)], {"axis": -1}),
    ("take", [(0, 0), np.array([1, 2], np.int64)], {"axis": 1}),
    *[("pad", [(2, 3)], {"pad_width": 2, "mode": m}) for m in ("constant", "edge", "reflect", "symmetric", "wrap")],
    *[("pad", [(3, 2)], {"pad_width": ((1, 4), (0, 3)), "mode": m}) for m in ("edge", "reflect", "symmetric", "wrap")],
    ("pad", [(2, 3)], {"pad_width": (1, 2)}),
    ("pad", [(2, 3)], {"pad_width": ((1,), (2,)), "constant_value": 2.0}),
    ("pad", [(3,)], {"pad_width": ((2,),), "mode": "reflect"}),
    ("pad", [(1,)], {"pad_width": 3, "mode": "reflect"}),
    ("pad", [(0, 3)], {"pad_width": ((1, 1), (1, 1))}),
    ("pad", [(0, 3)], {"pad_width": ((0, 0), (1, 2)), "mode": "edge"}),
    ("pad", [()], {"pad_width": 1}),
    ("flip", [(2, 3)], {}),
    ("flip", [(2, 3)], {"axis": 0}),
    ("flip", [(2, 3)], {"axis": -1}),
    ("flip", [(2, 3, 2)], {"axis": (0, -1)}),
    ("flip", [(0, 3)], {"axis": 1}),
    ("flip", [()], {}),
    ("roll", [(2, 3)], {"shift": 1}),
    ("roll", [(2, 3)], {"shift": -2, "axis": 0}),
    ("roll", [(2, 3)], {"shift": (1, 2), "axis": (0, -1)}),
    ("roll", [(2, 3)], {"shift": (1, 2), "axis": 1}),
    ("roll", [(2, 3)], {"shift": 1, "axis": (1, 1)}),
    ("roll", [(0, 3)], {"shift": 2, "axis": 1}),
    ("roll", [()], {"shift": 1}),
    ("tile", [(2, 3)], {"reps": 2}),
    ("tile", [(2, 3)], {"reps": (2, 1, 2)}),
    ("tile", [(3,)], {"reps": (2, 2)}),
    ("tile", [(2, 3)], {"reps": (0,)}),
    ("tile", [()], {"reps": (2, 3)}),
    ("repeat", [(2, 3)], {"repeats": 2}),
    ("repeat", [(2, 3)], {"repeats": 3, "axis": 0}),
    ("repeat", [(2, 3)], {"repeats": 2, "axis": -1}),
    ("repeat", [(2, 3)], {"repeats": 0, "axis": 1}),
    ("repeat", [(0, 3)], {"repeats": 2, "axis": 0}),
    ("repeat", [()], {"repeats": 2, "axis": -1}),
    ("moveaxis", [(2, 3, 4)], {"source": 0, "destination": -1}),
    ("moveaxis", [(2, 3, 4)], {"source": (0, 1), "destination": (-1, -2)}),
    ("moveaxis", [(0, 3, 2)], {"source": 2, "destination": 0}),
    ("copy", [(2, 3)], {}),
    ("copy", [(0, 3)], {}),
    ("copy", [()], {}),
]


def _case_id(case: tuple[str, list[Any], dict[str, Any]]) -> str:
    kind, inputs, attrs = case
    shown = ",".join(str(i) if isinstance(i, tuple) else f"{i.dtype}{list(i.shape)}" for i in inputs)
    return f"{kind}[{shown}]{attrs}".replace(" ", "")


def _arrays(inputs: list[Any], dtype: Any, rng: np.random.Generator) -> list[np.ndarray]:
    return [rand(rng, i, dtype) if isinstance(i, tuple) else i for i in inputs]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_matches_numpy(case: tuple[str, list[Any], dict[str, Any]], dtype: str) -> None:
    kind, inputs, attrs = case
    arrays = _arrays(inputs, dtype, np.random.default_rng(RNG_SEED))
    check_op(kind, arrays, functools.partial(REF[kind], **attrs), **attrs)


def _run_typed(kind: str, arrays: list[np.ndarray], types: list[TensorType], attrs: dict[str, Any]) -> Any:
    b = opgraph.GraphBuilder()
    ins = [b.input(t) for t in types]
    outs = b.op(kind, *ins, **attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return [o.type for o in outs], b.run(dict(zip(ins, arrays, strict=True)), list(outs))


@pytest.mark.parametrize("unknown", ["dims", "rank"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_unknown_dims_and_rank_are_sound(case: tuple[str, list[Any], dict[str, Any]], unknown: str) -> None:
    """With every dim (or the rank) unknown, building succeeds and the runtime results fit the types."""
    kind, inputs, attrs = case
    arrays = _arrays(inputs, "float64", np.random.default_rng(RNG_SEED))
    types = [TensorType(a.dtype, None if unknown == "rank" else (None,) * a.ndim) for a in arrays]
    out_types, got = _run_typed(kind, arrays, types, attrs)  # the executor checks results against types
    want = REF[kind](*arrays, **attrs)
    want = list(want) if isinstance(want, list) else [want]
    for t, g, w in zip(out_types, got, want, strict=True):
        assert t.accepts(np.asarray(w))
        np.testing.assert_array_equal(g, w)


def test_ids_and_family() -> None:
    for name, id in IDS.items():
        d = get_op(name)
        assert (d.id, d.family, get_op(id).name) == (id, "shape", name)
        assert d.doc and d.kernel is not None
    assert VIEW_OPS <= set(IDS)


def test_concat_and_stack_promote_like_numpy() -> None:
    rng = np.random.default_rng(RNG_SEED)
    for a, b in [("bool", "int8"), ("uint16", "int8"), ("float32", "int8"), ("int8", "complex128"),
                 ("float32", "float64"), ("uint16", "float32")]:
        xa, xb = rand(rng, (2, 3), a), rand(rng, (1, 3), b)
        check_op("concat", [xa, xb], lambda p, q: np.concatenate([p, q]))
        check_op("concat", [xa, xb], lambda p, q: np.concatenate([p, q], axis=None), axis=None)
        check_op("stack", [xa, xa.astype(b)], lambda p, q: np.stack([p, q], axis=1), axis=1)


# ---------------------------------------------------------------- type rules with unknown dims
def T(shape: Any, dtype: str = "float64") -> TensorType:
    return TensorType(dtype, shape)


I64 = "int64"
INFER_CASES: list[tuple[str, list[TensorType], dict[str, Any], list[Any]]] = [
    ("reshape", [T((None, 3))], {"shape": (-1,)}, [(None,)]),
    ("reshape", [T((None, 3))], {"shape": (-1, 3)}, [(None, 3)]),
    ("reshape", [T(None)], {"shape": (2, 3)}, [(2, 3)]),
    ("reshape", [T((None, 0))], {"shape": (-1, 5)}, [(0, 5)]),
    ("permute_dims", [T((None, 3))], {}, [(3, None)]),
    ("permute_dims", [T(None)], {"axes": (1, 0)}, [(None, None)]),
    ("permute_dims", [T(None)], {}, [None]),
    ("broadcast_to", [T((None,))], {"shape": (2, 3)}, [(2, 3)]),
    ("broadcast_to", [T(None)], {"shape": (2, 3)}, [(2, 3)]),
    ("expand_dims", [T((None, 3))], {"axis": (0, -1)}, [(1, None, 3, 1)]),
    ("expand_dims", [T(None)], {"axis": 0}, [None]),
    ("squeeze", [T((None, 1))], {"axis": -1}, [(None,)]),
    ("squeeze", [T((None, 1))], {}, [None]),
    ("squeeze", [T((None, 5))], {"axis": 0}, [(5,)]),
    ("concat", [T((None, 3)), T((2, 3))], {}, [(None, 3)]),
    ("concat", [T((None, 3)), T((2, None))], {"axis": 1}, [(2, None)]),
    ("concat", [T(None), T((2, 3))], {}, [(None, 3)]),
    ("concat", [T(None), T(None)], {}, [None]),
    ("concat", [T((2, 3)), T((0, None))], {"axis": None}, [(6,)]),
    ("concat", [T((2, 3)), T((1, None))], {"axis": None}, [(None,)]),
    ("stack", [T((None, 3)), T((2, None))], {}, [(2, 2, 3)]),
    ("stack", [T(None), T((2,))], {"axis": -1}, [(2, 2)]),
    ("split", [T((None, 4))], {"sections": 2}, [(None, 4), (None, 4)]),
    ("split", [T((None,))], {"sections": (3, 1)}, [(None,), (0,), (None,)]),
    ("split", [T((None,))], {"sections": (0,)}, [(0,), (None,)]),
    ("split", [T(None)], {"sections": 3}, [None, None, None]),
    ("getitem", [T((None, 5))], {"index": (0, slice(1, 3))}, [(2,)]),
    ("getitem", [T((None, 5))], {"index": (slice(1, None), -1)}, [(None,)]),
    ("getitem", [T((None, 5))], {"index": (slice(2, 1), 0)}, [(0,)]),
    ("getitem", [T((None, 5))], {"index": (slice(-1, -3, -1),)}, [(None, 5)]),
    ("getitem", [T((None, 5))], {"index": (slice(-3, -1, -1),)}, [(0, 5)]),
    ("getitem", [T((None, 5))], {"index": (None, Ellipsis, slice(None, None, -2))}, [(1, None, 3)]),
    ("getitem", [T((None, 5))], {"index": 7}, [(5,)]),
    ("getitem", [T(None)], {"index": 0}, [None]),
    ("take", [T((None, 3)), T((4,), I64)], {"axis": 1}, [(None, 4)]),
    ("take", [T(None), T((2, 2), I64)], {}, [(2, 2)]),
    ("take", [T(None), T((2, 2), I64)], {"axis": 0}, [None]),
    ("take", [T((2, 3)), T(None, I64)], {"axis": 0}, [None]),
    ("pad", [T((None, 3))], {"pad_width": 1}, [(None, 5)]),
    ("pad", [T(None)], {"pad_width": ((1, 2), (3, 4))}, [(None, None)]),
    ("pad", [T(None)], {"pad_width": 1}, [None]),
    ("flip", [T((None, 3))], {"axis": 1}, [(None, 3)]),
    ("roll", [T(None)], {"shift": 1, "axis": 5}, [None]),
    ("tile", [T((None, 3))], {"reps": (0, 2)}, [(0, 6)]),
    ("tile", [T((None,))], {"reps": (2, 2)}, [(2, None)]),
    ("tile", [T(None)], {"reps": 2}, [None]),
    ("repeat", [T((None, 3))], {"repeats": 0}, [(0,)]),
    ("repeat", [T((None, 3))], {"repeats": 2}, [(None,)]),
    ("repeat", [T(None)], {"repeats": 2}, [(None,)]),
    ("repeat", [T((None, 3))], {"repeats": 2, "axis": 1}, [(None, 6)]),
    ("moveaxis", [T((None, 3, 4))], {"source": 0, "destination": -1}, [(3, 4, None)]),
    ("copy", [T((None, 3))], {}, [(None, 3)]),
]


@pytest.mark.parametrize(("kind", "types", "attrs", "want"), INFER_CASES)
def test_type_rules_with_unknown_dims(kind: str, types: list[TensorType], attrs: dict[str, Any],
                                      want: list[Any]) -> None:
    b = opgraph.GraphBuilder()
    outs = b.op(kind, *[b.input(t) for t in types], **attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    assert [o.type.shape for o in outs] == [w if w is None else tuple(w) for w in want]
    assert all(o.type.dtype == types[0].dtype for o in outs)


def test_reshape_unknown_dim_example() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (None, 3)))
    y = b.op("reshape", x, shape=(-1,))
    assert y.type == TensorType("float64", (None,))
    assert b.run({x: np.ones((4, 3))}, [y])[0].shape == (12,)


# ---------------------------------------------------------------- build-time errors
ERROR_CASES: list[tuple[str, list[Any], dict[str, Any], str]] = [
    ("reshape", [(2, 3)], {"shape": (4,)}, "cannot reshape"),
    ("reshape", [(2, 3)], {"shape": (-1, 4)}, "cannot reshape"),
    ("reshape", [(2, 3)], {"shape": (-1, -1)}, "one unknown dimension"),
    ("reshape", [(2, 3)], {"shape": (-1, 0)}, "size 0"),
    ("reshape", [(None, 3)], {"shape": (4,)}, "multiple of 3"),
    ("permute_dims", [(2, 3)], {"axes": (0,)}, "do not match rank"),
    ("permute_dims", [(2, 3)], {"axes": (0, -2)}, "repeated axis"),
    ("permute_dims", [(2, 3)], {"axes": (0, 2)}, "out of bounds"),
    ("broadcast_to", [(2, 3)], {"shape": (3, 3)}, "cannot broadcast"),
    ("broadcast_to", [(2, 3)], {"shape": (3,)}, "lower rank"),
    ("broadcast_to", [(3,)], {"shape": (-1, 3)}, "non-negative"),
    ("expand_dims", [(2, 3)], {"axis": 3}, "out of bounds"),
    ("expand_dims", [(2, 3)], {"axis": (0, 0)}, "repeated axis"),
    ("squeeze", [(2, 3)], {"axis": 0}, "cannot squeeze axis 0 of size 2"),
    ("squeeze", [(1, 3)], {"axis": 2}, "out of bounds"),
    ("concat", [(2, 3), (2, 4)], {}, "differ"),
    ("concat", [(2, 3), (3,)], {}, "same rank"),
    ("concat", [(), ()], {}, "zero-dimensional"),
    ("concat", [(2, 3), (2, 3)], {"axis": 2}, "out of bounds"),
    ("stack", [(2, 3), (2, 4)], {}, "differ"),
    ("stack", [(2, 3), (2, 3)], {"axis": 3}, "out of bounds"),
    ("split", [(5,)], {"sections": 2}, "equal division"),
    ("split", [(6,)], {"sections": 0}, "larger than 0"),
    ("split", [(6,)], {"sections": 1.5}, "sections"),
    ("split", [(6,)], {"sections": True}, "sections"),
    ("split", [()], {"sections": 1}, "out of bounds"),
    ("getitem", [(2, 3)], {"index": 2}, "out of bounds for axis 0 with size 2"),
    ("getitem", [(2, 3)], {"index": (slice(None), -4)}, "index -4 is out of bounds for axis 1"),
    ("getitem", [(2, 3)], {"index": (0, 0, 0)}, "too many indices"),
    ("getitem", [(2, 3)], {"index": (Ellipsis, 0, Ellipsis)}, "single ellipsis"),
    ("getitem", [(2, 3)], {"index": [0, 1]}, "basic indexing"),
    ("getitem", [(2, 3)], {"index": slice(None, None, 0)}, "step cannot be zero"),
    ("take", [(2, 3), ("float64", (2,))], {}, "integer dtype"),
    ("take", [(2, 3), ("bool", (2,))], {}, "integer dtype"),
    ("take", [(2, 3), ("int64", (2,))], {"axis": 2}, "out of bounds"),
    ("take", [(0, 3), ("int64", (2,))], {"axis": 0}, "empty axis"),
    ("pad", [(2, 3)], {"pad_width": ((1, 1), (1, 1), (1, 1))}, r"3 \(before, after\) pairs"),
    ("pad", [(2, 3)], {"pad_width": -1}, "non-negative"),
    ("pad", [(2, 3)], {"pad_width": (1, 2, 3)}, "pad_width"),
    ("pad", [(2, 3)], {"pad_width": 1.5}, "ints"),
    ("pad", [(2, 3)], {"pad_width": 1, "mode": "mean"}, "unsupported pad mode"),
    ("pad", [(0, 3)], {"pad_width": 1, "mode": "edge"}, "empty axis 0"),
    ("flip", [(2, 3)], {"axis": (0, 0)}, "repeated axis"),
    ("flip", [(2, 3)], {"axis": 2}, "out of bounds"),
    ("roll", [(2, 3)], {"shift": (1, 2, 3), "axis": (0, 1)}, "same length"),
    ("roll", [(2, 3)], {"shift": 1, "axis": 2}, "out of bounds"),
    ("tile", [(2, 3)], {"reps": -1}, "non-negative"),
    ("repeat", [(2, 3)], {"repeats": -1}, "non-negative"),
    ("repeat", [(2, 3)], {"repeats": 2, "axis": -3}, "out of bounds"),
    ("moveaxis", [(2, 3)], {"source": (0, 1), "destination": 0}, "same number"),
    ("moveaxis", [(2, 3)], {"source": (0, 0), "destination": (0, 1)}, "repeated axis"),
    ("reshape", [(2, 3)], {"shape": (6,), "order": "F"}, "unknown attribute"),
    ("split", [(2, 3)], {}, "missing required attribute 'sections'"),
]


@pytest.mark.parametrize(("kind", "inputs", "attrs", "match"), ERROR_CASES)
def test_build_errors(kind: str, inputs: list[Any], attrs: dict[str, Any], match: str) -> None:
    b = opgraph.GraphBuilder()
    ins = [b.input(i if i and isinstance(i[0], str) else ("float64", i)) for i in inputs]
    with pytest.raises(OpBuildError, match=match) as info:
        b.op(kind, *ins, **attrs)
    assert info.value.op == kind
    assert str(info.value).startswith(f"{kind}(")
    assert "test_ops_shape.py" in str(info.value)  # names the user's line


def test_build_error_example_from_brief() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3)))
    with pytest.raises(opgraph.OpBuildError, match=r"reshape\(f64\[2,3\]\): cannot reshape"):
        b.op("reshape", x, shape=(4,))


# ---------------------------------------------------------------- attribute normalisation
@pytest.mark.parametrize(("raw", "want"), [
    (1, ((1, 1),)),
    ((1, 2), ((1, 2),)),
    ([[1, 2]], ((1, 2),)),
    (((1, 2), (3, 4)), ((1, 2), (3, 4))),
    (((1,), (2,)), ((1, 1), (2, 2))),
    ((3,), ((3, 3),)),
    (np.array([[0, 1], [2, 0]]), ((0, 1), (2, 0))),
    (np.int8(2), ((2, 2),)),
])
def test_pad_width_forms(raw: Any, want: Any) -> None:
    attrs = dict(get_op("pad").normalise_attrs({"pad_width": raw}))
    assert attrs == {"pad_width": want, "mode": "constant", "constant_value": 0.0}


@pytest.mark.parametrize(("raw", "want"), [(3, 3), (np.int64(2), 2), ([1, 2], (1, 2)), (np.array([4]), (4,)),
                                           ((), ())])
def test_split_sections_forms(raw: Any, want: Any) -> None:
    assert dict(get_op("split").normalise_attrs({"sections": raw}))["sections"] == want


def test_split_of_one_section_is_one_value() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (4,)))
    y = b.op("split", x, sections=1)
    assert isinstance(y, opgraph.Value) and y.type == TensorType("float64", (4,))
    np.testing.assert_array_equal(b.run({x: np.arange(4.0)}, [y])[0], np.arange(4.0))


def test_copy_shares_no_memory_and_view_ops_copy_into_out() -> None:
    x = np.arange(6.0).reshape(2, 3)
    fn = get_op("copy").kernel_for(12)
    assert not np.shares_memory(fn(x), x)
    r = get_op("reshape").kernel_for(12)
    buf = np.empty(6)
    assert r(x, out=buf, shape=(6,)) is buf and not np.shares_memory(buf, x)


# ---------------------------------------------------------------- getitem
GETITEM_KEYS: list[Any] = [
    0, -1, 3, (1, 2), (-4, -5, -6), slice(None), slice(1, 3), slice(None, None, -1), slice(-1, -10, -2),
    slice(10, 20), slice(-20, 2), slice(3, 1), slice(None, None, 3), slice(100, None, -1), slice(-100, 100, 7),
    (slice(None), 2), (Ellipsis, 0), Ellipsis, (Ellipsis,), None, (None,), (0, None, slice(None, None, -2)),
    (None, Ellipsis, None), (slice(1, None), Ellipsis, -1), (), (0, 1, 2), (0, 1, 2, None), (0, 1, 2, Ellipsis),
    (Ellipsis, None, 1, slice(5, 0, -2)), (1, Ellipsis, 2, None), (slice(None), slice(None), slice(None), Ellipsis),
    np.int64(2), (np.int8(-1), slice(np.int64(1), None)), (slice(2, -1, -1), slice(-2, None), slice(4, -7, -3)),
]


def _key_id(key: Any) -> str:
    return repr(key).replace(" ", "")


@pytest.mark.parametrize("dtype", ["bool", "float64", "complex128"])
@pytest.mark.parametrize("key", GETITEM_KEYS, ids=_key_id)
def test_getitem_keys(key: Any, dtype: str) -> None:
    x = rand(np.random.default_rng(RNG_SEED), (4, 5, 6), dtype)
    check_op("getitem", [x], lambda a: a[key], index=key)
    # normalised keys (as the frontend passes them) give the same op
    check_op("getitem", [x], lambda a: a[key], index=normalize_index(key, 3))


@pytest.mark.parametrize(("shape", "key"), [
    ((0, 3), slice(None)), ((0, 3), (slice(None), 1)), ((0, 3), (Ellipsis, None)),
    ((0, 3), slice(None, None, -1)), ((3, 0), (1,)), ((), ()), ((), Ellipsis), ((), (None, None)),
])
def test_getitem_zero_size_and_scalars(shape: tuple[int, ...], key: Any) -> None:
    x = rand(np.random.default_rng(RNG_SEED), shape, "int8")
    check_op("getitem", [x], lambda a: a[key], index=key)


def test_normalize_index() -> None:
    assert normalize_index(3) == (3,)
    assert normalize_index(None) == (("newaxis",),)
    assert normalize_index(Ellipsis, 0) == (("ellipsis",),)
    assert normalize_index(()) == ()
    assert normalize_index((np.int64(1), slice(np.int32(2), None, -1))) == (1, ("slice", 2, None, -1))
    assert normalize_index(("slice", 1, 2, None)) == (("slice", 1, 2, None),)
    assert normalize_index((("newaxis",), 0, ("ellipsis",))) == (("newaxis",), 0, ("ellipsis",))
    for bad in ([0], np.array([0, 1]), True, np.True_, 1.0, "a", (0, [1]), slice(1.5, 2), (Ellipsis, Ellipsis),
                slice(None, None, 0), ("slice", 1), ("bogus",)):
        with pytest.raises(OpTypeError):
            normalize_index(bad)
    with pytest.raises(OpTypeError, match="too many indices"):
        normalize_index((0, None, 0), 1)


ENTRY = st.one_of(
    st.integers(-7, 7),
    st.builds(slice, st.none() | st.integers(-8, 8), st.none() | st.integers(-8, 8),
              st.none() | st.integers(-4, 4).filter(bool)),
    st.none(),
)


@st.composite
def shapes_and_keys(draw: st.DrawFn) -> tuple[tuple[int, ...], Any, tuple[bool, ...]]:
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=4)))
    entries = draw(st.lists(ENTRY, max_size=len(shape) + 2))
    if draw(st.booleans()):
        entries.insert(draw(st.integers(0, len(entries))), Ellipsis)
    key: Any = tuple(entries)
    if len(entries) == 1 and draw(st.booleans()):
        key = entries[0]  # a bare key, not a tuple
    unknown = tuple(draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape))))
    return shape, key, unknown


@settings(max_examples=250, deadline=None)
@given(shapes_and_keys())
def test_getitem_property(case: tuple[tuple[int, ...], Any, tuple[bool, ...]]) -> None:
    shape, key, unknown = case
    x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    try:
        want = np.asarray(x[key])
    except IndexError:
        want = None
    # Static shapes: the type is exactly NumPy's, or the build fails where NumPy raises.
    b = opgraph.GraphBuilder()
    v = b.input(TensorType.of(x))
    if want is None:
        with pytest.raises(OpBuildError, match="getitem"):
            b.op("getitem", v, index=key)
    else:
        y = b.op("getitem", v, index=key)
        assert y.type == TensorType(x.dtype, want.shape)
        got = b.run({v: x}, [y])[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert normalize_index(normalize_index(key, x.ndim)) == normalize_index(key, x.ndim)
    # Some dims unknown: the rank is exact, each dim is NumPy's or None.
    b = opgraph.GraphBuilder()
    v = b.input(TensorType(x.dtype, tuple(None if u else d for d, u in zip(shape, unknown, strict=True))))
    try:
        y = b.op("getitem", v, index=key)
    except OpBuildError:
        assert want is None
        return
    if want is None:
        with pytest.raises(ExecutionError):
            b.run({v: x}, [y])
        return
    assert len(y.type.shape) == want.ndim
    assert all(d is None or d == w for d, w in zip(y.type.shape, want.shape, strict=True))
    np.testing.assert_array_equal(b.run({v: x}, [y])[0], want)


# ---------------------------------------------------------------- bitcast 717
BITCAST_PAIRS = [("float32", "int32"), ("int32", "float32"), ("float64", "int64"), ("int64", "float64"),
                 ("uint32", "int32"), ("int8", "uint8"), ("uint16", "int16"), ("float16", "uint16"),
                 ("complex64", "float64"), ("complex128", "complex128"), ("bool", "uint8"), ("bool", "int8")]


def test_bitcast_id_and_family() -> None:
    d = get_op("bitcast")
    assert (d.id, d.family, get_op(717).name) == (717, "shape", "bitcast")
    assert d.doc and d.kernel is not None and d.grad is None


@pytest.mark.parametrize(("src", "dst"), BITCAST_PAIRS)
@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (2, 0, 3)])
def test_bitcast_matches_ndarray_view(src: str, dst: str, shape: tuple[int, ...]) -> None:
    x = rand(np.random.default_rng(RNG_SEED), shape, src, low=-100, high=100)
    # A reference through raw bytes rather than .view: the same buffer read back as the other dtype.
    check_op("bitcast", [x], lambda a: np.frombuffer(a.tobytes(), dtype=dst).reshape(a.shape), dtype=dst)


@pytest.mark.parametrize("src", ["uint8", "int8"])
def test_bitcast_bytes_to_bool_are_nonzero(src: str) -> None:
    x = np.array([0, 1, 2, -1 if src == "int8" else 255, 0x80 if src == "uint8" else -128], dtype=src)
    (got,) = check_op("bitcast", [x], lambda a: np.array([False, True, True, True, True]), dtype="bool")
    # Valid bools (stored as 0 or 1), so they compare, sum and read back as bytes as bools should.
    assert got.sum() == 4 and (got == np.True_).sum() == 4
    np.testing.assert_array_equal(got.view(np.uint8), [0, 1, 1, 1, 1])


def test_bitcast_known_bit_patterns() -> None:
    got = check_op("bitcast", [np.array([1.0, -2.5, 3.75], dtype=np.float32)],
                   lambda a: np.array([1065353216, -1071644672, 1081081856], dtype=np.int32), dtype="int32")[0]
    assert got.dtype == np.int32
    check_op("bitcast", [np.array(1.0)], lambda a: np.array(4607182418800017408, dtype=np.uint64), dtype=np.uint64)


def test_bitcast_result_owns_its_memory() -> None:
    # bitcast is not in VIEW_OPS, so the memory planner assumes its output never aliases x.
    x = np.arange(6, dtype=np.int32)
    (y,) = check_op("bitcast", [x], lambda a: a.view(np.float32), dtype="float32")
    assert not np.shares_memory(x, y)
    assert "bitcast" not in VIEW_OPS


def test_bitcast_round_trip_in_a_graph() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (None, 3)))
    bits = b.op("bitcast", x, dtype="uint64")
    back = b.op("bitcast", b.op("bitwise_xor", bits, b.constant(np.uint64(1 << 63))), dtype="float64")
    assert (bits.type, back.type) == (TensorType("uint64", (None, 3)), TensorType("float64", (None, 3)))
    xa = np.array([[1.5, -0.0, np.inf], [np.nan, 2.0, -7.25]])
    got = b.run({x: xa}, [back])[0]
    np.testing.assert_array_equal(got, -xa)  # flipping the sign bit negates, -0.0 and nan included
    assert np.signbit(got[0, 1]) == np.False_


@pytest.mark.parametrize(("src", "dst"), [("float32", "float64"), ("int8", "int16"), ("bool", "uint16"),
                                          ("complex128", "float64")])
def test_bitcast_rejects_other_item_sizes(src: str, dst: str) -> None:
    b = opgraph.GraphBuilder()
    with pytest.raises(OpBuildError, match="item sizes differ"):
        b.op("bitcast", b.input((src, (2,))), dtype=dst)


def test_bitcast_needs_a_dtype() -> None:
    b = opgraph.GraphBuilder()
    with pytest.raises(OpBuildError, match="missing required attribute 'dtype'"):
        b.op("bitcast", b.input(("int32", (2,))))


# ---------------------------------------------------------------- slice 718, slice_update 719 (run-time bounds)
I64_MAX, I64_MIN = int(np.iinfo(np.int64).max), int(np.iinfo(np.int64).min)

# (x shape, starts, ends, steps or None, axes or None): negative, out-of-range and sentinel bounds, negative steps
SLICES: list[tuple[tuple[int, ...], list[int], list[int], list[int] | None, tuple[int, ...] | None]] = [
    ((6,), [1], [4], None, None),
    ((6,), [-2], [100], None, None),
    ((6,), [-100], [2], [1], None),
    ((6,), [5], [-100], [-1], None),
    ((6,), [-100], [-200], [-1], None),  # a start before the front with a negative step: empty, as in Python
    ((6,), [100], [0], [-2], None),
    ((6,), [4], [1], [1], None),
    ((6,), [1], [5], [3], None),
    ((6,), [I64_MAX], [I64_MIN], [-1], None),
    ((6,), [0], [I64_MAX], [2], None),
    ((6,), [I64_MIN], [3], [1], None),
    ((4, 5), [1, -1], [3, 0], [1, -1], None),
    ((4, 5), [3, 0], [-5, 5], [-2, 2], (1, 0)),
    ((4, 5), [-1], [-3], [-1], (-1,)),
    ((4, 5), [2], [1], None, (1,)),
    ((3, 4, 5), [0, 1], [2, -1], [1, 2], (2, 0)),
    ((3, 4, 5), [-10, 10, 2], [10, -10, 3], [1, -1, 1], None),
    ((3, 4, 5), [], [], [], None),
    ((0, 3), [0], [2], [1], None),
    ((2, 0), [1, 0], [2, 5], [1, -1], None),
]


def _slice_ref(a: np.ndarray, starts: Any, ends: Any, steps: Any = None, axes: Any = None) -> np.ndarray:
    """NumPy's basic slicing, written out for the test: x[s:e:st] on each named axis."""
    key: list[Any] = [slice(None)] * a.ndim
    k = len(starts)
    for j, ax in enumerate(range(k) if axes is None else axes):
        key[ax] = slice(int(starts[j]), int(ends[j]), 1 if steps is None else int(steps[j]))
    return a[tuple(key)]


def _slice_arrays(shape: tuple[int, ...], st: list[int], en: list[int], sp: list[int] | None,
                  dtype: Any = np.int64) -> list[np.ndarray]:
    bounds = [np.array(st, dtype=np.int64), np.array(en, dtype=np.int64)]
    if sp is not None:
        bounds.append(np.array(sp, dtype=np.int64))
    if np.dtype(dtype) != np.int64 and all(abs(v) < 100 for b in bounds for v in b.tolist()):
        bounds = [b.astype(dtype) for b in bounds]
    return bounds


def _slice_case_id(case: Any) -> str:
    shape, st, en, sp, axes = case
    return f"{shape}[{st}:{en}:{sp}]axes={axes}".replace(" ", "")


@pytest.mark.parametrize("bound_dtype", ["int64", "int32", "int8"])
@pytest.mark.parametrize("case", SLICES, ids=_slice_case_id)
def test_slice_matches_numpy_slicing(case: Any, bound_dtype: str) -> None:
    shape, st, en, sp, axes = case
    x = rand(np.random.default_rng(RNG_SEED), shape, "float32")
    bounds = _slice_arrays(shape, st, en, sp, bound_dtype)
    check_op("slice", [x, *bounds], lambda a, *b: _slice_ref(a, *b[:2], b[2] if len(b) > 2 else None, axes),
             axes=axes)


@pytest.mark.parametrize("dtype", DTYPES)
def test_slice_and_slice_update_dtypes(dtype: str) -> None:
    rng = np.random.default_rng(RNG_SEED)
    x, u = rand(rng, (4, 5), dtype), rand(rng, (1, 2), dtype)
    b = [np.array([3, 1]), np.array([-5, 5]), np.array([-2, 2])]
    check_op("slice", [x, *b], lambda a, *bb: a[3:-5:-2, 1:5:2])

    def put(a: np.ndarray, v: np.ndarray, *bb: Any) -> np.ndarray:
        y = a.copy()
        y[3:-5:-2, 1:5:2] = v
        return y

    check_op("slice_update", [x, u, *b], put)


@pytest.mark.parametrize("case", SLICES, ids=_slice_case_id)
def test_slice_update_matches_numpy_assignment(case: Any) -> None:
    shape, st, en, sp, axes = case
    rng = np.random.default_rng(RNG_SEED)
    x = rand(rng, shape, "float64")
    bounds = _slice_arrays(shape, st, en, sp)
    part = _slice_ref(x, *bounds[:2], bounds[2] if sp is not None else None, axes)
    # the update as big as the slice, and broadcast from a scalar and from size-1 axes
    for u in (rand(rng, part.shape, "float64"), np.array(7.5), rand(rng, (1,) * part.ndim, "float64")[..., :1]):
        def put(a: np.ndarray, v: np.ndarray, *b: Any) -> np.ndarray:
            y = a.copy()
            y[_key_of(a.ndim, *b[:2], b[2] if len(b) > 2 else None, axes)] = v
            return y

        check_op("slice_update", [x, u, *bounds], put, axes=axes)


def _key_of(ndim: int, starts: Any, ends: Any, steps: Any, axes: Any) -> tuple[slice, ...]:
    key: list[Any] = [slice(None)] * ndim
    for j, ax in enumerate(range(len(starts)) if axes is None else axes):
        key[ax] = slice(int(starts[j]), int(ends[j]), 1 if steps is None else int(steps[j]))
    return tuple(key)


def test_slice_random_bounds_against_numpy() -> None:
    """Many random bounds (several axes, out of range, negative steps) on one op each, as NumPy slices."""
    rng = np.random.default_rng(RNG_SEED)
    x = np.arange(60.0).reshape(3, 4, 5)
    for _ in range(60):
        k = int(rng.integers(1, 4))
        axes = tuple(int(a) for a in rng.permutation(3)[:k]) if rng.random() < 0.5 else None
        st, en = rng.integers(-8, 8, k), rng.integers(-8, 8, k)
        sp = rng.choice([-3, -2, -1, 1, 2, 3], k)
        key = _key_of(3, st, en, sp, axes)
        (got,) = run_op("slice", x, st, en, sp, axes=axes)
        np.testing.assert_array_equal(got, x[key])
        u = rng.standard_normal(x[key].shape)
        want = x.copy()
        want[key] = u
        (got,) = run_op("slice_update", x, u, st, en, sp, axes=axes)
        np.testing.assert_array_equal(got, want)


def test_slice_types_with_unknown_dims() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(T((None, 5, 0, 3)))
    s, e = b.input(T((2,), I64)), b.input(T((2,), I64))
    assert b.op("slice", x, s, e).type.shape == (None, None, 0, 3)
    assert b.op("slice", x, s, e, axes=(-1, 1)).type.shape == (None, None, 0, None)
    assert b.op("slice", x, s, e, axes=(2, 3)).type.shape == (None, 5, 0, None)
    n = b.input(T((None,), "int32"))
    assert b.op("slice", x, n, n).type.shape == (None, None, 0, None)  # how many axes: known at run time
    assert b.op("slice", b.input(T(None)), s, e).type == T(None)
    assert b.op("slice_update", x, b.input(T((None,))), s, e).type == x.type
    # run with every dim unknown: the results fit the declared types and are NumPy's
    xa = np.arange(24.0).reshape(2, 3, 4)
    bounds = [np.array([2, -1]), np.array([-10, 0]), np.array([-1, -2])]
    got_types, got = _run_typed("slice", [xa, *bounds], [T((None,) * 3), *(T((None,), I64),) * 3], {"axes": (2, 0)})
    want = xa[-1:0:-2, :, 2:-10:-1]
    assert got_types[0].shape == (None, None, None)
    np.testing.assert_array_equal(got[0], want)


def test_slice_step_zero_and_bad_bounds_at_run_time() -> None:
    x = np.arange(6.0)
    with pytest.raises(ExecutionError, match="slice step cannot be zero"):
        run_op("slice", x, np.array([0]), np.array([3]), np.array([0]))
    with pytest.raises(ExecutionError, match="slice step cannot be zero"):
        run_op("slice_update", x, np.array(1.0), np.array([0]), np.array([3]), np.array([0]))
    b = opgraph.GraphBuilder()
    xv, s = b.input(T((6,))), b.input(T((None,), I64))
    y = b.op("slice", xv, s, s)
    with pytest.raises(ExecutionError, match="do not fit the axes"):
        b.run({xv: x, s: np.array([0, 1])}, [y])  # two bounds for a 1-D x
    with pytest.raises(ExecutionError, match="could not broadcast"):  # NumPy's own message
        run_op("slice_update", x, np.ones(2), np.array([0]), np.array([3]))


@pytest.mark.parametrize(("kind", "inputs", "attrs", "match"), [
    ("slice", [(4,), ("float64", (1,)), ("int64", (1,))], {}, "integer dtype"),
    ("slice", [(4,), ("int64", (1, 1)), ("int64", (1,))], {}, "must be 1-D"),
    ("slice", [(4,), ("int64", (1,)), ("int64", (2,))], {}, "different lengths"),
    ("slice", [(4, 4), ("int64", (2,)), ("int64", (2,))], {"axes": (0,)}, "name 1 axes"),
    ("slice", [(4, 4), ("int64", (2,)), ("int64", (2,))], {"axes": (0, -2)}, "repeated axis"),
    ("slice", [(4, 4), ("int64", (1,)), ("int64", (1,))], {"axes": (2,)}, "out of bounds"),
    ("slice", [(4,), ("int64", (2,)), ("int64", (2,))], {}, "2 bounds for an input of rank 1"),
    ("slice", [(4,), ("int64", (1,))], {}, "at least 3 input"),
    ("slice", [(4,), *[("int64", (1,))] * 4], {}, "takes x, starts, ends and optionally steps, got 5"),
    ("slice_update", [(4,), ("float32", ()), ("int64", (1,)), ("int64", (1,))], {}, "cast it first"),
    ("slice_update", [(4, 3), (2, 2), ("int64", (1,)), ("int64", (1,))], {"axes": (0,)}, "does not broadcast"),
    ("slice_update", [(4,), (1, 1), ("int64", (1,)), ("int64", (1,))], {}, "more axes than x"),
])
def test_slice_build_errors(kind: str, inputs: list[Any], attrs: dict[str, Any], match: str) -> None:
    test_build_errors(kind, inputs, attrs, match)


def _fd_check(build: Callable[[Any, list[Any]], Any], arrays: list[np.ndarray], eps: float = 1e-6) -> None:
    """Reverse-mode gradients of sum(w * build(...)) with respect to each float array vs central differences."""
    from opgraph.autodiff import build_grad_ops

    rng = np.random.default_rng(RNG_SEED)
    b = opgraph.GraphBuilder()
    ins = [b.input(TensorType.of(a)) for a in arrays]
    y = build(b, ins)
    shape = b.run(dict(zip(ins, arrays, strict=True)), [y])[0].shape
    loss = b.sum(b.multiply(y, b.constant(rng.standard_normal(shape))))
    wrt = [(v, a) for v, a in zip(ins, arrays, strict=True) if a.dtype.kind == "f"]
    grads = b.run(dict(zip(ins, arrays, strict=True)), build_grad_ops(b, loss, [v for v, _ in wrt]))
    for (v, a), g in zip(wrt, grads, strict=True):
        fd = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            for sgn in (1, -1):
                a2 = a.copy()
                a2[i] += sgn * eps
                feeds = {w: (a2 if w is v else arr) for w, arr in zip(ins, arrays, strict=True)}
                fd[i] += sgn * float(b.run(feeds, [loss])[0]) / (2 * eps)
        assert g.shape == a.shape
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", [c for c in SLICES if 0 not in c[0]], ids=_slice_case_id)
def test_slice_gradients_match_finite_differences(case: Any) -> None:
    shape, st, en, sp, axes = case
    x = np.random.default_rng(1).standard_normal(shape)
    bounds = _slice_arrays(shape, st, en, sp)
    _fd_check(lambda b, v: b.op("slice", *v, axes=axes), [x, *bounds])
    part = _slice_ref(x, *bounds[:2], bounds[2] if sp is not None else None, axes)
    for u_shape in (part.shape, (1,) * len(part.shape), part.shape[1:]):  # broadcast updates sum their cotangent
        u = np.random.default_rng(2).standard_normal(u_shape)
        _fd_check(lambda b, v: b.op("slice_update", *v, axes=axes), [x, u, *bounds])


def test_slice_results_own_their_memory() -> None:
    # slice is not one of VIEW_OPS: its result depends on the bounds' values, so it must not alias x
    x = np.arange(6.0)
    (y,) = check_op("slice", [x, np.array([1]), np.array([4])], lambda a, s, e: a[1:4])
    assert not np.shares_memory(x, y) and "slice" not in VIEW_OPS
    (z,) = check_op("slice_update", [x, np.array(0.0), np.array([1]), np.array([4])],
                    lambda a, *_: np.concatenate([a[:1], np.zeros(3), a[4:]]))
    assert not np.shares_memory(x, z)
    np.testing.assert_array_equal(x, np.arange(6.0))  # x itself is left alone


# ---------------------------------------------------------------- run-time shapes: shape 720, arange 721, alloc 722,
# reshape_to 723, assert_all 724
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 0, 4), (1, 2, 3, 4)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_shape_matches_numpy(shape: tuple[int, ...], dtype: str) -> None:
    x = rand(np.random.default_rng(RNG_SEED), shape, dtype)
    check_op("shape", [x], lambda a: np.array(np.shape(a), dtype=np.int64))


def test_shape_types_and_dynamic_dims() -> None:
    assert out_type("shape", TensorType("float32", (None, 3))) == TensorType("int64", (2,))
    assert out_type("shape", TensorType("float32", None)) == TensorType("int64", (None,))
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (None, 3)))
    s = b.op("shape", x)
    for n in (1, 5):  # the same graph, two run-time sizes
        np.testing.assert_array_equal(b.run({x: np.zeros((n, 3))}, [s])[0], np.shape(np.zeros((n, 3))))


ARANGES = [(0, 5, 1), (2, 11, 3), (5, 0, -1), (5, 0, 1), (-3.0, 2.5, 0.5), (1, 2.0, 0.25), (0, 0, 1), (10, -10, -7)]


@pytest.mark.parametrize("dtype", [None, "int32", "float32", "float64"])
@pytest.mark.parametrize(("start", "stop", "step"), ARANGES)
def test_arange_matches_numpy(start: Any, stop: Any, step: Any, dtype: Any) -> None:
    args = [np.asarray(v) for v in (start, stop, step)]
    check_op("arange", args, lambda *a: np.arange(*a, dtype=dtype), dtype=dtype)


def test_arange_types_and_errors() -> None:
    i64, f32 = TensorType("int64", ()), TensorType("float32", ())
    assert out_type("arange", i64, i64, i64) == TensorType("int64", (None,))
    assert out_type("arange", i64, f32, i64) == TensorType(np.result_type(np.int64, np.float32), (None,))
    assert out_type("arange", i64, i64, i64, dtype="float32") == TensorType("float32", (None,))
    with pytest.raises(OpBuildError, match="must be 0-d"):
        out_type("arange", TensorType("int64", (2,)), i64, i64)
    with pytest.raises(OpBuildError, match="real number"):
        out_type("arange", TensorType("complex128", ()), i64, i64)
    with pytest.raises(ExecutionError, match="step cannot be zero"):
        run_op("arange", np.int64(0), np.int64(3), np.int64(0))


ALLOCS = [((), (2, 3)), ((3,), (2, 3)), ((2, 1), (2, 4)), ((1, 3), (0, 3)), ((4,), (4,)), ((), ()),
          ((2, 1, 3), (5, 2, 4, 3))]


@pytest.mark.parametrize(("x_shape", "target"), ALLOCS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_alloc_matches_numpy_broadcast(x_shape: tuple[int, ...], target: tuple[int, ...], dtype: str) -> None:
    x = rand(np.random.default_rng(RNG_SEED), x_shape, dtype)
    (y,) = check_op("alloc", [x, np.array(target, dtype=np.int64)], lambda a, s: np.broadcast_to(a, tuple(s)).copy())
    assert y.flags.writeable and not np.shares_memory(x, y)


def test_alloc_types_and_errors() -> None:
    shape2 = TensorType("int64", (2,))
    assert out_type("alloc", TensorType("float32", (3,)), shape2) == TensorType("float32", (None, 3))
    assert out_type("alloc", TensorType("float32", (1,)), shape2) == TensorType("float32", (None, None))
    assert out_type("alloc", TensorType("float32", ()), TensorType("int32", (None,))) == TensorType("float32", None)
    with pytest.raises(OpBuildError, match="lower rank"):
        out_type("alloc", TensorType("float32", (2, 3, 4)), shape2)
    with pytest.raises(OpBuildError, match="integer dtype"):
        out_type("alloc", TensorType("float32", ()), TensorType("float32", (2,)))
    with pytest.raises(ExecutionError, match="broadcast"):
        run_op("alloc", np.ones(3), np.array([2, 4]))


RESHAPES = [((2, 3), (3, 2)), ((2, 3), (-1,)), ((2, 3, 4), (4, -1)), ((6,), (1, 2, 1, 3)), ((0, 3), (-1, 3)),
            ((), (1,)), ((1,), ()), ((2, 3), (6,))]


@pytest.mark.parametrize(("x_shape", "target"), RESHAPES)
@pytest.mark.parametrize("dtype", ["int8", "float64", "complex128"])
def test_reshape_to_matches_numpy(x_shape: tuple[int, ...], target: tuple[int, ...], dtype: str) -> None:
    x = rand(np.random.default_rng(RNG_SEED), x_shape, dtype)
    check_op("reshape_to", [x, np.array(target, dtype=np.int32)], lambda a, s: np.reshape(a, tuple(s)))


def test_reshape_to_types_and_errors() -> None:
    assert out_type("reshape_to", TensorType("float32", (2, 3)), TensorType("int64", (1,))) == \
        TensorType("float32", (6,))
    assert out_type("reshape_to", TensorType("float32", (None, 3)), TensorType("int64", (3,))) == \
        TensorType("float32", (None, None, None))
    with pytest.raises(OpBuildError, match="into shape"):
        out_type("reshape_to", TensorType("float32", (2, 3)), TensorType("int64", (0,)))
    with pytest.raises(OpBuildError, match="1-D"):
        out_type("reshape_to", TensorType("float32", (2, 3)), TensorType("int64", (1, 2)))
    with pytest.raises(ExecutionError, match="reshape"):
        run_op("reshape_to", np.ones((2, 3)), np.array([4, 2]))


def test_assert_all_passes_x_through_or_raises_its_message() -> None:
    x = np.arange(6.0).reshape(2, 3)
    (y,) = check_op("assert_all", [x, np.array(True), np.array([1, 2])], lambda a, *c: a.copy(), message="m")
    assert not np.shares_memory(x, y)
    check_op("assert_all", [x], lambda a: a.copy())
    with pytest.raises(ExecutionError, match="x must be positive"):
        run_op("assert_all", x, np.array([True, False]), message="x must be positive")
    with pytest.raises(ExecutionError, match="assertion failed"):
        run_op("assert_all", x, np.array(0))


def test_assert_all_checks_on_every_run_of_a_compiled_graph() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (None,)), name="x")
    y = b.op("assert_all", x, b.op("all", b.op("greater", x, 0.0)), message="x > 0")
    b.output(b.op("log", y))
    prog = opgraph.compile(b.freeze())
    np.testing.assert_allclose(prog.run({"x": np.ones(3)})[0], np.log(np.ones(3)))
    with pytest.raises(ExecutionError, match="x > 0"):
        prog.run({"x": -np.ones(3)})


def test_run_time_shape_ops_compose_with_dynamic_dims() -> None:
    # x.reshape(x.shape[0], -1) and zeros of x's shape, run at two batch sizes from one compiled graph
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (None, 2, 3)), name="x")
    s = b.op("shape", x)
    n = b.op("getitem", s, index=(slice(0, 1),))
    flat = b.op("reshape_to", x, b.op("concat", n, b.constant(np.array([-1], np.int64))))
    rows = b.op("arange", b.constant(np.int64(0)), b.op("getitem", s, index=(0,)), b.constant(np.int64(1)))
    z = b.op("alloc", b.constant(np.float32(0)), s)
    b.output(flat, rows, z)
    prog = opgraph.compile(b.freeze())
    for k in (1, 4):
        a = np.random.default_rng(k).standard_normal((k, 2, 3)).astype(np.float32)
        got = prog.run({"x": a})
        for g, w in zip(got, [a.reshape(k, -1), np.arange(k), np.zeros_like(a)], strict=True):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)


def test_run_time_shape_gradients_match_finite_differences() -> None:
    x = np.random.default_rng(3).standard_normal((2, 3))
    _fd_check(lambda b, v: b.op("reshape_to", v[0], b.op("shape", b.op("permute_dims", v[0]))), [x])
    _fd_check(lambda b, v: b.op("alloc", v[0], b.constant(np.array([4, 2, 3]))), [x])
    _fd_check(lambda b, v: b.op("assert_all", v[0], b.op("greater", v[0], -100.0)), [x])
    _fd_check(lambda b, v: b.op("arange", v[0], b.constant(4.0), v[1]), [np.array(0.5), np.array(0.75)])
