"""Batching rules of the indexing, nn, linalg, signal and control families against a loop over examples.

Each rule runs on the cases of ``test_autodiff_rules.CASES`` with its float inputs batched (all of them, and each
alone with the others shared), and the batched result must be the op run on each example with NumPy. Control
flow is checked against a loop and against ``jax.vmap`` of the same ``jax.lax`` program.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.core.registry import family_kinds, get_op
from test_autodiff_rules import CASES

B = 3
FAMILIES = ("indexing", "nn", "linalg", "signal")

# kinds left to vmap's fallback (a loop over the examples), and why
NO_BATCH_RULE = {
    "unique": "the result's length depends on each example's values: examples do not stack",
    "nonzero": "the result's length depends on each example's values: examples do not stack",
}
# kinds whose rule leaves some cases to the fallback, and which
PARTIAL = {"one_hot": "a batched (off, on) pair of values"}

EXTRA: dict[str, list[dict[str, Any]]] = {
    "gather_elements": [{"args": ((3, 4), ("int", (3, 2), 4)), "attrs": {"axis": 1}, "pre": None}],
    "gather_nd": [{"args": ((3, 4), ("int", (2, 2), 3)), "attrs": {}, "pre": None}],
    "scatter_nd": [{"args": ((3, 4), ("int", (2, 1), 3), (2, 4)), "attrs": {"reduction": "add"}, "pre": None}],
    "scatter_elements": [{"args": ((2, 3), ("int", (2, 4), 3), (2, 4)), "attrs": {"axis": 1, "reduction": "add"},
                          "pre": None}],
    "one_hot": [{"args": (("int", (2, 3), 3), ("const", np.array([0.0, 1.0]))), "attrs": {"depth": 3},
                 "pre": None}],
    "reverse_sequence": [{"args": ((4, 3, 2), ("int", (3,), 5)), "attrs": {}, "pre": None}],
    "searchsorted": [{"args": (("sorted", (5,)), (2, 3)), "attrs": {}, "pre": None},
                     {"args": (("sorted", (5,)), (4,)), "attrs": {"side": "right"}, "pre": None}],
    "unique": [], "nonzero": [],
    "max_pool_argmax": [{"args": ((1, 2, 5, 5),), "attrs": {"kernel_size": (2, 2), "stride": (2, 2)}, "pre": None}],
    "resize": [{"args": ((1, 2, 3, 4),), "attrs": {"sizes": (1, 2, 5, 3), "mode": "linear"}, "pre": None},
               {"args": ((1, 2, 3, 4),), "attrs": {"sizes": (1, 2, 6, 2), "mode": "cubic",
                                                   "coordinate_transformation_mode": "align_corners"}, "pre": None}],
    "grid_sample": [{"args": ((1, 2, 4, 5), ("unit", (1, 3, 2, 2))), "attrs": {}, "pre": None}],
    "conv2d": [{"args": ((1, 4, 5, 5), (4, 2, 3, 3)), "attrs": {"groups": 2}, "pre": None}],
    "conv_transpose": [{"args": ((2, 4, 3, 3), (4, 1, 2, 2)), "attrs": {"stride": (2, 2), "groups": 2},
                        "pre": None}],
    "eig": [{"args": ((3, 3),), "attrs": {}, "pre": None}],
    "solve": [{"args": ((2, 3, 3), (3, 2)), "attrs": {}, "pre": None},
              {"args": ((3, 3), (2, 3, 1)), "attrs": {}, "pre": None}],
}


def _kinds() -> list[str]:
    return [k for f in FAMILIES for k in family_kinds(f)]


def _cases(kind: str) -> list[dict[str, Any]]:
    return list(CASES.get(kind, [])) + EXTRA.get(kind, [])


def test_every_kind_has_a_rule_or_a_reason() -> None:
    for kind in _kinds():
        op = get_op(kind)
        assert (op.batch is not None) != (kind in NO_BATCH_RULE), kind
        assert kind in NO_BATCH_RULE or _cases(kind), f"{kind} has a batching rule but no case"


def _example(spec: Any, rng: np.random.Generator, pre: Any) -> tuple[np.ndarray, bool]:
    """One example's array for ``spec``, and whether the test may batch it (inputs, not constants)."""
    if isinstance(spec, tuple) and spec and isinstance(spec[0], str):
        kind, arg = spec[0], spec[1]
        if kind == "const":
            return np.asarray(arg), False
        if kind == "int":
            return rng.integers(0, spec[2], arg), True
        if kind == "sorted":
            return np.sort(rng.standard_normal(arg)), True
        lo, hi = {"pos": (0.5, 2.0), "unit": (-0.8, 0.8), "gt1": (1.5, 3.0)}[kind]
        a = rng.uniform(lo, hi, arg)
    else:
        a = rng.standard_normal(spec)
    if pre is not None:
        b = opgraph.GraphBuilder()
        x = b.input(("float64", a.shape))
        a = b.run({x: a}, [pre(b, x)])[0]
    return a, True


def _run_op(kind: str, args: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    b = opgraph.GraphBuilder()
    ins = [b.input((a.dtype, a.shape)) for a in args]
    res = b.op(kind, *ins, **attrs)
    res = list(res) if isinstance(res, tuple) else [res]
    return b.run(dict(zip(ins, args, strict=True)), res)


def _check_rule(kind: str, case: dict[str, Any], flags: tuple[bool, ...], rng: np.random.Generator) -> None:
    per = [[_example(s, rng, case["pre"]) for s in case["args"]] for _ in range(B)]
    floats = [f for _, f in per[0]]
    batched = tuple(f and flag for f, flag in zip(floats, flags, strict=True))
    if not any(batched):
        return  # vmap runs an op on unbatched inputs as it is
    # an unbatched input is example 0's for every example
    examples = [[per[e][i][0] if batched[i] else per[0][i][0] for i in range(len(floats))] for e in range(B)]
    b = opgraph.GraphBuilder()
    ins, feeds = [], {}
    for i, f in enumerate(batched):
        arr = np.stack([ex[i] for ex in examples]) if f else examples[0][i]
        v = b.constant(arr) if not floats[i] and not f else b.input((arr.dtype, arr.shape))
        if floats[i] or f:
            feeds[v] = arr
        ins.append(v)
    op = get_op(kind)
    attrs = dict(op.normalise_attrs(case["attrs"]))
    outs = op.batch(b, ins, batched, B, attrs)
    if outs is None:
        assert kind in PARTIAL, f"{kind}'s rule declined {case} with batched={batched}"
        return
    got = b.run(feeds, list(outs))
    want = [_run_op(kind, ex, case["attrs"]) for ex in examples]
    assert len(got) == len(want[0])
    for j, g in enumerate(got):
        expect = np.stack([w[j] for w in want])
        assert g.shape == expect.shape, (kind, j, g.shape, expect.shape)
        assert g.dtype == expect.dtype, (kind, j, g.dtype, expect.dtype)
        np.testing.assert_allclose(g, expect, rtol=1e-9, atol=1e-9, err_msg=f"{kind} {case['attrs']} {batched}")


def _patterns(n_float: int) -> list[tuple[bool, ...]]:
    pats = [(True,) * n_float]
    if n_float > 1:
        pats += [tuple(i == k for i in range(n_float)) for k in range(n_float)]
    return pats


@pytest.mark.parametrize("kind", sorted(k for k in _kinds() if k not in NO_BATCH_RULE))
def test_rule_matches_a_loop(kind: str) -> None:
    rng = np.random.default_rng(sum(map(ord, kind)))
    for case in _cases(kind):
        n = len(case["args"])
        for flags in _patterns(n):
            _check_rule(kind, case, flags, rng)
