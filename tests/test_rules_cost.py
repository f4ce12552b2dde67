"""The rewrite rules stay linear and cheap on deep graphs (issue 32): no rule scans below every candidate.

Counted, not timed: ``Emitter.inputs_of`` is how a rule (its pattern or its own matcher) looks below an op, so
the number of calls is the rules' work. On a deep sin/multiply chain with its gradient, where every multiply of
the gradient has a multiply operand (a candidate root of the GELU rule, whose matcher reads a polynomial below
it), the count must stay a small fraction of the ops and grow at most linearly with the depth; with the GELU
matcher's 32-op scan at every candidate it was about 20 per op. A GELU formula beside the chain still fuses.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.passes import Emitter, optimize


def deep_chain(steps: int) -> opgraph.Graph:
    """``steps`` times h = sin(h) * c from x, then sum, with d sum / d x; and gelu_tanh(y) written out."""
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (8,)), name="x")
    y = b.input(("float64", (8,)), name="y")

    def c(v: float) -> Any:
        return b.constant(np.float64(v))

    inner = b.multiply(c(np.sqrt(2 / np.pi)), b.add(y, b.multiply(c(0.044715), b.op("power", y, c(3.0)))))
    gelu = b.multiply(b.multiply(c(0.5), y), b.add(c(1.0), b.op("tanh", inner)))
    h = x
    for _ in range(steps):
        h = b.multiply(b.op("sin", h), c(1.0001))
    loss = b.op("sum", h)
    (gx,) = opgraph.grad(loss, [x])
    b.output(loss, gx, gelu)
    return b.freeze()


def visits(graph: opgraph.Graph, monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict[str, int]]:
    """Calls of Emitter.inputs_of during optimize(level=2), and the rule counts."""
    calls = [0]
    original = Emitter.inputs_of

    def counting(self: Emitter, op: int) -> list[int]:
        calls[0] += 1
        return original(self, op)

    with monkeypatch.context() as mp:
        mp.setattr(Emitter, "inputs_of", counting)
        rep = optimize(graph, level=2, report="data")
    return calls[0], rep.counts


def test_rule_work_is_linear_and_small_on_a_deep_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    small, large = deep_chain(250), deep_chain(1000)
    v_small, counts_small = visits(small, monkeypatch)
    v_large, counts_large = visits(large, monkeypatch)
    # the rules still do their work: the GELU formula becomes one op (the pass is not simply skipped)
    assert counts_small.get("gelu") == 1 and counts_large.get("gelu") == 1
    assert v_small > 0
    # linear in the depth (4x the ops: at most ~4x the visits; a scan per candidate that grew with depth: ~16x)
    assert v_large <= 4.5 * v_small
    # and cheap: well under one look below an op per op (a 32-op bounded scan per multiply was ~20 per op)
    assert v_large <= 0.25 * large.num_ops
    # the optimised graph still computes what the unoptimised one does (NumPy reference below)
    xv = np.linspace(-2.0, 2.0, 8)
    got = optimize(small, level=2).run(x=xv, y=xv)
    want = small.run(x=xv, y=xv)
    for a, w in zip(got, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-6)


def test_gelu_index_admits_a_root_whose_formula_a_rewrite_changed() -> None:
    # (0.25 x) * (2 tanh(u) + 2): the add below the root becomes an fma in the same pass, and the GELU rule must
    # still see the root (the index walks up from the rewritten op as well as from the tanh)
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (16,)), name="x")

    def c(v: float) -> Any:
        return b.constant(np.float32(v))

    u = b.multiply(c(np.sqrt(2 / np.pi)), b.add(x, b.multiply(c(0.044715), b.multiply(b.multiply(x, x), x))))
    b.output(b.multiply(b.multiply(c(0.25), x), b.add(b.multiply(c(2.0), b.op("tanh", u)), c(2.0))))
    rep = optimize(b.freeze(), level=2, report="data")
    assert rep.counts.get("gelu") == 1 and rep.counts.get("fma", 0) >= 1
    assert [rep.graph.kind_of(op) for op in range(rep.graph.num_ops)].count("gelu") == 1
    xv = np.linspace(-3, 3, 16, dtype=np.float32)
    ref = 0.5 * xv * (1 + np.tanh(np.sqrt(2 / np.pi) * (xv + 0.044715 * xv**3)))
    np.testing.assert_allclose(rep.graph.run(x=xv)[0], ref, rtol=1e-5, atol=1e-6)
