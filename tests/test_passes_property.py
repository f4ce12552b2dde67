"""Property test: optimising a random graph never changes what it computes.

Random graphs mix arithmetic, special constants (0, -0.0, 1, 2) that trigger the
simplification rules, multiply-add chains (fma), transposes around matmul,
reshapes, broadcasts, reductions over size-1 axes, duplicates (cse), dead
ops (dce), constant subgraphs (folding), outputs and update edges. Integer
graphs must agree exactly; float graphs within a tight tolerance (every
rule the default pipeline applies is exact, so they agree bit for bit in
practice).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opgraph
from opgraph.passes import optimize

N = 2
SHAPE = (N, N)
CONSTS = [0.0, -0.0, 1.0, 2.0, 0.5]

UNARY_F = ["negative", "exp", "abs", "sqrt_abs", "copy", "positive", "square"]
UNARY_I = ["negative", "abs", "copy", "positive", "square"]
BINARY = ["add", "subtract", "multiply", "maximum", "matmul", "fma_shape"]
SHAPEOPS = ["transpose", "transpose2", "reshape2", "broadcast", "sum1", "cast_same"]


@st.composite
def programs(draw: Any) -> tuple[str, list[tuple[Any, ...]], int]:
    dtype = draw(st.sampled_from(["float64", "int64"]))
    n_inputs = draw(st.integers(1, 3))
    steps = []
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "const", "shape"]))
        a = draw(st.integers(0, 10**6))
        b = draw(st.integers(0, 10**6))
        if kind == "unary":
            steps.append(("unary", draw(st.sampled_from(UNARY_F if dtype == "float64" else UNARY_I)), a))
        elif kind == "binary":
            steps.append(("binary", draw(st.sampled_from(BINARY + (["divide"] if dtype == "float64" else []))), a, b))
        elif kind == "const":
            steps.append(("const", draw(st.sampled_from(CONSTS)), draw(st.booleans())))
        else:
            steps.append(("shape", draw(st.sampled_from(SHAPEOPS)), a))
    n_out = draw(st.integers(1, 3))
    return dtype, steps, n_inputs * 16 + n_out


def build(dtype: str, steps: list[tuple[Any, ...]], code: int, seed: int) -> tuple[opgraph.Graph, list[np.ndarray]]:
    n_inputs, n_out = divmod(code, 16)
    b = opgraph.GraphBuilder(hash_cons=seed % 2 == 0)
    ins = [b.input((dtype, SHAPE), name=f"in{i}") for i in range(n_inputs)]
    vals = list(ins)
    for st_ in steps:
        if st_[0] == "unary":
            x = vals[st_[2] % len(vals)]
            name = st_[1]
            if name == "sqrt_abs":
                v = b.sqrt(b.abs(x))
            else:
                v = b.op(name, x)
        elif st_[0] == "binary":
            x, y = vals[st_[2] % len(vals)], vals[st_[3] % len(vals)]
            if st_[1] == "fma_shape":
                v = b.add(b.multiply(x, y), vals[(st_[2] + st_[3]) % len(vals)])
            else:
                v = b.op(st_[1], x, y)
        elif st_[0] == "const":
            c = np.array(st_[1], dtype=dtype)
            v = b.constant(np.full(SHAPE, c) if st_[2] else c)
            if v.type.shape == ():
                v = b.add(vals[-1], v) if st_[1] in (0.0, -0.0) else b.multiply(vals[-1], v)
        else:
            x = vals[st_[2] % len(vals)]
            name = st_[1]
            if name == "transpose":
                v = b.permute_dims(x)
            elif name == "transpose2":
                v = b.permute_dims(b.permute_dims(x, axes=(1, 0)))
            elif name == "reshape2":
                v = b.reshape(b.reshape(x, shape=(N * N,)), shape=SHAPE)
            elif name == "broadcast":
                v = b.add(b.broadcast_to(b.sum(x, axis=0, keepdims=True), shape=SHAPE), x)
            elif name == "sum1":
                v = b.sum(b.reshape(x, shape=(N, N, 1)), axis=2)
                if v.type.dtype != np.dtype(dtype):
                    v = b.cast(v, dtype=dtype)
            else:
                v = b.cast(x, dtype=dtype)
        if v.type.shape == SHAPE and v.type.dtype == np.dtype(dtype):
            vals.append(v)
    outs = vals[-n_out:]
    b.output(*outs)
    if n_inputs > 1 and len(vals) > n_inputs:
        b.update(vals[-1], ins[1])
    rng = np.random.default_rng(seed)
    if dtype == "int64":
        arrays = [rng.integers(-4, 5, SHAPE) for _ in ins]
    else:
        arrays = [rng.standard_normal(SHAPE) for _ in ins]
        if seed % 5 == 0:
            arrays[0][0, 0] = np.inf
        if seed % 7 == 0:
            arrays[-1][0, 1] = -0.0
    return b.freeze(), arrays


def run(g: opgraph.Graph, arrays: list[np.ndarray]) -> list[np.ndarray]:
    feeds = {int(v): a for v, a in zip(g.inputs, arrays, strict=True)}
    targets = [*g.outputs.tolist(), *g.updates[:, 0].tolist()]
    with np.errstate(all="ignore"):
        return g.run(feeds, targets)


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs(), st.integers(0, 2**16))
def test_optimize_preserves_results(prog: tuple[str, list[tuple[Any, ...]], int], seed: int) -> None:
    dtype, steps, code = prog
    g, arrays = build(dtype, steps, code, seed)
    level = 2 + seed % 2  # level 3 adds elementwise-chain fusion on top of level 2
    o = optimize(g, level=level, cost=None)  # fuse even these small graphs
    o.verify()
    assert len(o.outputs) == len(g.outputs) and len(o.updates) == len(g.updates)
    for want, got in zip(run(g, arrays), run(o, arrays), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        if dtype == "int64":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=0, equal_nan=True)
            # signed zeros survive too: every default rule is exact (NaN sign bits are unspecified by IEEE)
            ok = ~np.isnan(want)
            np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))
    assert optimize(o, level=level, cost=None) == o  # a fixed point
