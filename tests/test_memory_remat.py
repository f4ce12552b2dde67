"""Rematerialisation under a budget, and batch-sliced kernels in the compiled runtime."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph
from opgraph.backends.numpy import arena as compiled_mod
from opgraph.memory import plan_memory
from opgraph.memory.remat import rematerialize
from opgraph.runtime.compiled import compile


def forward_backward_chain(n: int, size: int = 1000) -> opgraph.Graph:
    """A chain h_i = tanh(h_{i-1}) whose every h_i is used again in reverse order (as a backward pass does)."""
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (size,)), name="x")
    hs = [x]
    for _ in range(n):
        hs.append(b.op("tanh", hs[-1]))
    g = b.op("sin", hs[-1])
    for h in reversed(hs[1:-1]):
        g = b.op("multiply", g, b.op("subtract", 1.0, b.op("square", h)))
    b.output(g)
    return b.freeze()


@pytest.mark.parametrize("n", [16, 24])
def test_remat_fits_budget_and_keeps_results(n: int) -> None:
    g = forward_backward_chain(n)
    item = 8000
    full = plan_memory(g).total_bytes
    assert full >= n * item
    budget = int(2 * np.sqrt(n) + 2) * item  # ~ Chen et al.'s O(sqrt(n)) memory, below half the plan for n=16
    r = rematerialize(g, budget)
    assert r.fits and r.plan.total_bytes <= budget < r.original_bytes == full
    assert r.extra_kernels > 0 and r.extra_bytes_computed >= r.extra_kernels * item
    assert r.graph.num_ops == g.num_ops + r.extra_kernels
    x = np.random.default_rng(0).standard_normal(1000)
    want = g.run({"x": x})[0]
    np.testing.assert_allclose(compile(r.graph)(x=x)[0], want, rtol=1e-12)
    np.testing.assert_allclose(r.graph.run({"x": x})[0], want, rtol=1e-12)


def test_remat_reports_when_budget_cannot_be_met() -> None:
    g = forward_backward_chain(4)
    r = rematerialize(g, 64)
    assert not r.fits
    assert r.plan.total_bytes <= r.original_bytes


def test_remat_keeps_update_edges() -> None:
    b = opgraph.GraphBuilder()
    s = b.input(("float64", (100,)), name="s")
    a = b.op("exp", s)
    c = b.op("tanh", b.op("sin", b.op("cos", a)))
    new = b.op("add", b.op("multiply", c, a), s)
    b.output(b.op("sum", new))
    b.update(new, s)
    g = b.freeze()
    r = rematerialize(g, plan_memory(g).total_bytes - 1)
    f0, f1 = compile(g), compile(r.graph)
    x = np.linspace(0, 0.1, 100)
    for k in range(3):
        feeds = {"s": x} if k == 0 else {}
        np.testing.assert_allclose(f1(feeds)[0], f0(feeds)[0], rtol=1e-12)


def test_batch_sliced_pooling_matches_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled_mod, "WORKSPACE_LIMIT", 4096)
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (8, 4, 16, 16)), name="x")
    w = b.constant(np.random.default_rng(1).standard_normal((6, 4, 3, 3)).astype(np.float32))
    h = b.op("relu", b.op("conv2d", x, w, padding=1))
    b.output(b.op("avg_pool2d", b.op("max_pool2d", h, kernel_size=2), kernel_size=2))
    g = b.freeze()
    f = compile(g)
    sliced = {g.kind_of(step[4]) for step in f.program if step[5] == 3}
    assert sliced == {"max_pool2d", "avg_pool2d"}  # the convolution bounds its own workspace
    feeds = {"x": np.random.default_rng(2).standard_normal((8, 4, 16, 16)).astype(np.float32)}
    for got, want in zip(f(feeds), g.run(feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
