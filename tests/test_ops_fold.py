"""The one constant folder (opgraph.ops.fold) and the op traits it reads."""

from __future__ import annotations

import numpy as np

import opgraph
from opgraph.core.registry import OpDef, get_op, has_trait, mark_traits, register_op
from opgraph.core.types import TensorType
from opgraph.ops.fold import fits, fold
from opgraph.passes import fold_constants


def _draw_infer(in_types: tuple, attrs: dict) -> tuple:
    return in_types


def test_nondeterministic_kinds_never_fold() -> None:
    d = register_op(OpDef(name="test_fold_draw", id=50201, arity=1, infer=_draw_infer,
                          kernel=lambda x, out=None: x + np.random.random(x.shape), family="user"),
                    replace=True)
    t = TensorType("float64", (2,))
    assert fold(d, {}, 12, [np.zeros(2)], [t], limit=16) is not None
    mark_traits("nondeterministic", "test_fold_draw")
    assert has_trait("test_fold_draw", "nondeterministic")
    assert fold(d, {}, 12, [np.zeros(2)], [t], limit=16) is None
    b = opgraph.GraphBuilder()
    b.output(b.op("test_fold_draw", b.constant(np.zeros(2))))
    assert fold_constants(b.freeze()).counts == {}


def test_fold_guard_is_data_on_the_op() -> None:
    assert get_op("while_loop").fold_guard is not None
    assert not get_op("while_loop").fold_guard({"max_trip": None}, [])
    assert get_op("add").fold_guard is None


def test_empty_inputs_count_their_other_dims() -> None:
    empty = TensorType("float32", (2**40, 0))
    assert not fits([empty], [TensorType("float32", (2**40, 1))], 2**20)
    assert not fits([empty], [TensorType("float32", (0,))], 2**20)
    assert fits([TensorType("float32", (3, 0))], [TensorType("float32", (0,))], 3)


def test_errors_policy_per_caller() -> None:
    d = get_op("divide")
    t = TensorType("float64", ())
    args = [np.float64(1.0), np.float64(0.0)]
    assert fold(d, {}, 12, args, [t], limit=1, errstate="ignore")[0] == np.inf  # type: ignore[index]
    assert fold(d, {}, 12, args, [t], limit=1, errstate="raise") is None
    bad = [np.zeros(2), np.zeros(3)]
    assert fold(get_op("add"), {}, 12, bad, [TensorType("float64", (2,))], limit=8) is None
    try:
        fold(get_op("add"), {}, 12, bad, [TensorType("float64", (2,))], limit=8, catch=False)
    except ValueError:
        pass
    else:
        raise AssertionError("catch=False lets the kernel's error through")
