"""The optimiser on the NumPy engine: fma into ``out``, blocked ``fused_elementwise``, the fusion cost model.

References are plain NumPy expressions written here (or the unoptimised graph); block sizes are made
small with a fixture so that small arrays take the blocked path.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import opgraph
import opgraph.backends.numpy.fused as fused
import opgraph.ops.fused as ops_fused
from opgraph.backends.numpy import BACKEND as NUMPY
from opgraph.core.graph import Graph
from opgraph.memory.plan import plan_memory
from opgraph.optim import Adagrad, Momentum, training_step
from opgraph.passes import optimize
from opgraph.passes.pipeline import NUMPY_COST, FusionCost, fusion_regions

FMA = NUMPY.kernel_for("fma", 0)
MOMENTUM = NUMPY.kernel_for("sgd_momentum_update", 0)
ADAGRAD = NUMPY.kernel_for("adagrad_update", 0)


def allocated(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated while ``fn`` runs (beyond what was allocated before)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Blocks of 2 KiB (256 elements at least), so arrays of a few thousand elements run blocked."""
    monkeypatch.setattr(fused, "BLOCK_BYTES", 2048)
    fused._PLANS.clear()
    yield 256
    fused._PLANS.clear()


# ---------------------------------------------------------------- fma
N_BIG = 1 << 20


@pytest.mark.parametrize("case", ["fresh", "out_is_a", "out_is_b", "out_is_c", "scalar_b"])
def test_fma_writes_into_out_without_a_temporary(case: str) -> None:
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(N_BIG) for _ in range(3))
    if case == "scalar_b":
        b = np.asarray(1.5)
    want = a * b + c
    out = {"fresh": np.empty(N_BIG), "out_is_a": a, "out_is_b": b, "out_is_c": c, "scalar_b": np.empty(N_BIG)}[case]
    res: list[np.ndarray] = []
    used = allocated(lambda: res.append(FMA(a, b, c, out=out)))
    assert res[0] is out
    np.testing.assert_array_equal(out, want)  # bit-identical: the same two roundings as a * b + c
    assert used < want.nbytes // 4, f"{case}: {used} bytes allocated for a {want.nbytes}-byte result"


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_fma_broadcasting_and_mixed_dtypes(dtype: str) -> None:
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((300, 7)) * 10).astype(dtype)
    b = (rng.standard_normal((7,)) * 10).astype(dtype)
    c = (rng.standard_normal((300, 1)) * 10).astype(dtype)
    out = np.empty((300, 7), dtype)
    np.testing.assert_array_equal(FMA(a, b, c, out=out), a * b + c)
    np.testing.assert_array_equal(FMA(a, b, c), a * b + c)
    # the product in float32, the sum in float64: the kernel must not compute the product in float64
    a32, b32, c64 = a.astype("float32"), b.astype("float32"), c.astype("float64")
    out64 = np.empty((300, 7))
    np.testing.assert_array_equal(FMA(a32, b32, c64, out=out64), a32 * b32 + c64)


def test_fma_in_a_compiled_graph_matches_numpy() -> None:
    rng = np.random.default_rng(2)
    b = opgraph.GraphBuilder()
    x, y, z = (b.input(("float64", (64, 33)), name=n) for n in "xyz")
    t = b.fma(b.sin(x), b.cos(y), b.exp(z))          # every input of fma dies here: in place on one of them
    b.output(b.fma(t, t, b.negative(t)))             # the same value at all three positions
    g = b.freeze()
    feeds = {n: rng.standard_normal((64, 33)) for n in "xyz"}
    t_ref = np.sin(feeds["x"]) * np.cos(feeds["y"]) + np.exp(feeds["z"])
    want = t_ref * t_ref + -t_ref
    np.testing.assert_array_equal(opgraph.compile(g, backend="numpy")(feeds)[0], want)


# ---------------------------------------------------------------- fused_elementwise, blocked
UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "negative": np.negative, "abs": np.abs, "square": np.square, "relu": lambda x: np.maximum(x, 0),
    "sin": np.sin, "exp": np.exp, "tanh": np.tanh,
}
BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
}
FLOAT_ONLY = {"sin", "exp", "tanh"}


def random_program(rng: np.random.Generator, n_operands: int, n_steps: int, dtype: str,
                   ) -> tuple[tuple[tuple[Any, ...], ...], Callable[..., np.ndarray]]:
    """A random program over ``n_operands`` operands and its reference, written with NumPy ufuncs."""
    unary = [k for k in UNARY if dtype.startswith("float") or k not in FLOAT_ONLY]
    steps: list[tuple[Any, ...]] = []
    for i in range(n_steps):
        pick = lambda: int(rng.integers(-n_operands, i)) if i else int(rng.integers(-n_operands, 0))  # noqa: E731
        first = i - 1 if i else -1  # a chain, with other operands and earlier steps mixed in
        if rng.random() < 0.4:
            steps.append((unary[rng.integers(len(unary))], first))
        elif rng.random() < 0.15:
            steps.append(("fma", first, pick(), pick()))
        else:
            steps.append((list(BINARY)[rng.integers(len(BINARY))], first, pick()))

    def reference(*xs: np.ndarray) -> np.ndarray:
        vals: list[np.ndarray] = []
        with np.errstate(all="ignore"):
            for kind, *refs in steps:
                args = [xs[-r - 1] if r < 0 else vals[r] for r in refs]
                if kind == "fma":
                    vals.append(args[0] * args[1] + args[2])
                else:
                    vals.append((UNARY | BINARY)[kind](*args))
        return vals[-1]

    return tuple(steps), reference


def operands(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, broadcast: bool) -> list[np.ndarray]:
    def make(s: tuple[int, ...]) -> np.ndarray:
        if dtype.startswith("int"):
            return rng.integers(-3, 4, s).astype(dtype)
        return (rng.standard_normal(s) * 0.5).astype(dtype)

    shapes = [shape, shape, ()]
    if broadcast and len(shape) >= 2:
        shapes += [(1, *shape[1:]), (shape[0], *([1] * (len(shape) - 1))), shape[-1:]]
    return [make(s) for s in shapes]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("shape", [(2051,), (37, 61), (5, 3, 301), (3, 700), (), (0,), (4, 0, 3)])
@pytest.mark.parametrize("seed", range(4))
def test_blocked_matches_numpy(small_blocks: int, dtype: str, shape: tuple[int, ...], seed: int) -> None:
    rng = np.random.default_rng(seed)
    xs = operands(rng, shape, dtype, broadcast=True)
    program, reference = random_program(rng, len(xs), int(rng.integers(2, 9)), dtype)
    want = reference(*xs)
    with np.errstate(all="ignore"):
        got = fused._fused_kernel(*xs, program=program)
        np.testing.assert_array_equal(got, want)
        out = np.empty(want.shape, want.dtype)
        assert fused._fused_kernel(*xs, out=out, program=program) is out
        np.testing.assert_array_equal(out, want)
        if len(shape) >= 2:  # a non-contiguous result: every other column of a wider array
            wide = np.empty((*shape[:-1], 2 * shape[-1]), want.dtype)
            fused._fused_kernel(*xs, out=wide[..., ::2], program=program)
            np.testing.assert_array_equal(wide[..., ::2], want)
        if shape and xs[0].size:  # a transposed (non-contiguous) operand
            ts = [xs[0].T.copy().T, *xs[1:]]
            np.testing.assert_array_equal(fused._fused_kernel(*ts, program=program), want)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_blocked_result_in_an_operands_memory(small_blocks: int, dtype: str) -> None:
    """The planner may give the result an operand's buffer (in place); a partial overlap must also work."""
    rng = np.random.default_rng(7)
    for seed in range(6):
        xs = operands(rng, (9, 333), dtype, broadcast=True)
        program, reference = random_program(np.random.default_rng(seed), len(xs), 6, dtype)
        want = reference(*xs)
        for k in (0, 1):
            if want.dtype != xs[k].dtype:
                continue
            ys = [x.copy() for x in xs]
            with np.errstate(all="ignore"):
                assert fused._fused_kernel(*ys, out=ys[k], program=program) is ys[k]
            np.testing.assert_array_equal(ys[k], want)
        # a result overlapping an operand shifted by one row: computed aside, then copied
        if want.dtype == xs[0].dtype:
            big = np.concatenate([xs[0], xs[0][:1]])
            ys = [big[:-1], *xs[1:]]
            with np.errstate(all="ignore"):
                fused._fused_kernel(*ys, out=big[1:], program=program)
            np.testing.assert_array_equal(big[1:], want)


def test_blocked_uses_cache_sized_scratch_only() -> None:
    """A chain over a large array allocates nothing but its result (the chain runs in the result's blocks)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1 << 21).astype(np.float32)
    program = (("sin", -1), ("multiply", 0, -2), ("add", 1, -3), ("tanh", 2), ("exp", 3), ("abs", 4))
    k1, k2 = np.asarray(1.5, np.float32), np.asarray(0.25, np.float32)
    want = np.abs(np.exp(np.tanh(np.sin(x) * k1 + k2)))
    out = np.empty_like(x)
    fused._fused_kernel(x, k1, k2, out=out, program=program)  # the plan is made and cached here
    used = allocated(lambda: fused._fused_kernel(x, k1, k2, out=out, program=program))
    np.testing.assert_array_equal(out, want)
    assert used < 64 * 1024
    # in place on the operand: then one block of scratch per live intermediate
    y = x.copy()
    used = allocated(lambda: fused._fused_kernel(y, k1, k2, out=y, program=program))
    np.testing.assert_array_equal(y, want)
    assert used <= 2 * fused.BLOCK_BYTES


def test_blocks_cover_the_array_once() -> None:
    for shape, block in (((7, 5, 3), 4), ((2, 1000), 300), ((3, 4), 100), ((10,), 3)):
        seen = np.zeros(shape, dtype=int)
        for sl, bshape, count in fused._blocks(shape, block):
            seen[sl] += 1
            assert seen[sl].shape == bshape and count == int(np.prod(bshape)) and count <= block
        assert (seen == 1).all()


# ---------------------------------------------------------------- optimiser updates in place
@pytest.mark.parametrize("kernel,ref,attrs", [
    (MOMENTUM, lambda p, v, g: ((p - 0.1 * (0.9 * v + g)), 0.9 * v + g), {"lr": 0.1, "mu": 0.9}),
    (ADAGRAD, lambda p, a, g: (p - (0.1 * g) / (np.sqrt(a + g * g) + 1e-8), a + g * g), {"lr": 0.1, "eps": 1e-8}),
])
def test_update_kernels_with_outputs_in_their_inputs_memory(kernel: Any, ref: Any, attrs: dict[str, float]) -> None:
    """Every output/input pairing the planner can choose for inplace=(0, 1, 2) gives the plain result."""
    rng = np.random.default_rng(4)
    base = [rng.random(50) + 0.5 for _ in range(3)]
    want = ref(*base)
    # output 0 takes any input; output 1 any input but the first (the planner offers position 0 to output 0 first)
    for k0 in (None, 0, 1, 2):
        for k1 in (None, 1, 2):
            if k0 is not None and k0 == k1:
                continue
            xs = [b.copy() for b in base]
            outs = (np.empty(50) if k0 is None else xs[k0], np.empty(50) if k1 is None else xs[k1])
            got = kernel(*xs, out=outs, **attrs)
            for w, o, r in zip(want, outs, got, strict=True):
                assert r is o
                np.testing.assert_array_equal(o, w)


def test_update_fusion_does_not_raise_planned_memory() -> None:
    """A small MLP's training step: optimising must not plan more bytes than level 0 (momentum did: the fused
    update could not reuse the gradient's buffer)."""
    for opt in (Momentum(lr=0.05, mu=0.9), Adagrad(lr=0.05)):
        g = _step_graph(opt)
        base = plan_memory(g).total_bytes
        for level in (1, 2, 3):
            assert plan_memory(optimize(g, level=level)).total_bytes <= base, (opt, level)


def _step_graph(opt: Any) -> Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (32, 64)), name="x")
    y = b.input(("float64", (32, 10)), name="y")
    p = [b.input(("float64", s), name=n) for n, s in (("w1", (64, 128)), ("b1", (128,)), ("w2", (128, 10)),
                                                       ("b2", (10,)))]
    logits = b.add(b.matmul(b.relu(b.add(b.matmul(x, p[0]), p[1])), p[2]), p[3])
    loss = b.negative(b.mean(b.sum(b.multiply(y, b.log_softmax(logits, axis=-1)), axis=1)))
    return training_step(b, loss, p, opt).graph


def test_optimised_momentum_step_runs_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops_fused, "UPDATE_MIN", {k: (0, 0) for k in ops_fused.UPDATE_MIN})  # fused, numba or not
    g = _step_graph(Momentum(lr=0.05, mu=0.9))
    o = optimize(g, level=2)
    assert any(o.kind_of(op) == "sgd_momentum_update" for op in range(o.num_ops))
    rng = np.random.default_rng(5)
    feeds = {n: rng.standard_normal(g.type_of(int(v)).shape) for n, v in
             ((g.name_of(int(v)), v) for v in g.inputs)}
    fa, fb = opgraph.compile(g, backend="numpy"), opgraph.compile(o, backend="numpy")
    for _ in range(3):
        np.testing.assert_allclose(fb(dict(feeds))[0], fa(dict(feeds))[0], rtol=1e-12)


# ---------------------------------------------------------------- the cost model (before/expected graphs)
def chain(shape: tuple[int, ...], dtype: str, kinds: tuple[str, ...]) -> Graph:
    b = opgraph.GraphBuilder()
    h = b.input((dtype, shape), name="x")
    k = b.constant(np.asarray(0.5, dtype))
    for kind in kinds:
        h = b.op(kind, h, k) if kind in BINARY else b.op(kind, h)
    b.output(h)
    return b.freeze()


def fused_chain(shape: tuple[int, ...], dtype: str, kinds: tuple[str, ...]) -> Graph:
    b = opgraph.GraphBuilder()
    x = b.input((dtype, shape), name="x")
    ins = [x, b.constant(np.asarray(0.5, dtype))] if any(k in BINARY for k in kinds) else [x]
    prog = []
    for i, kind in enumerate(kinds):
        src = i - 1 if i else -1
        prog.append((kind, src, -2) if kind in BINARY else (kind, src))
    b.output(b.fused_elementwise(*ins, program=tuple(prog)))
    return b.freeze()


BIG32 = (1 << 20,)  # 4 MiB of float32: the smallest result the NumPy cost model fuses
MIXED = ("sin", "multiply", "tanh", "add")
CHEAP = ("add", "multiply", "abs", "subtract")
HEAVY = ("sin", "exp", "tanh", "sqrt")


@pytest.mark.parametrize("shape,dtype,kinds,fuses", [
    (BIG32, "float32", MIXED, True),                 # large, narrow, 4 steps
    ((1000,), "float32", MIXED, False),              # small: every op already runs in cache
    (((1 << 20) - 1,), "float32", MIXED, False),     # just under 4 MiB
    (BIG32, "float32", ("add", "multiply"), False),  # two steps: the fused kernel's overhead is not repaid
    ((1 << 19,), "float64", CHEAP, True),            # float64 memory-bound steps pay
    ((1 << 19,), "float64", HEAVY, False),           # float64 transcendental steps do not
    ((1 << 19,), "float64", ("sin", "exp", "add", "multiply"), False),  # two memory-bound steps of four
])
def test_fusion_applied_only_where_it_pays(shape: tuple[int, ...], dtype: str, kinds: tuple[str, ...],
                                           fuses: bool) -> None:
    g = chain(shape, dtype, kinds)
    o = optimize(g, level=3)
    assert o == (fused_chain(shape, dtype, kinds) if fuses else optimize(g, level=2)), o
    assert optimize(o, level=3) == o  # a fixed point
    assert fusion_regions(g, NUMPY_COST)[1:].all() == fuses  # op 0 is the constant
    # without a cost model every region is fused
    assert optimize(g, level=3, cost=None) == fused_chain(shape, dtype, kinds)


def test_fused_large_chain_equals_unfused() -> None:
    g = chain(BIG32, "float32", MIXED + CHEAP)
    o = optimize(g, level=3)
    assert sum(o.kind_of(op) == "fused_elementwise" for op in range(o.num_ops)) == 1
    x = np.random.default_rng(6).standard_normal(BIG32).astype(np.float32)
    want = opgraph.compile(g, backend="numpy")({"x": x})[0]
    np.testing.assert_array_equal(opgraph.compile(o, backend="numpy")({"x": x})[0], want)


def test_a_region_is_fused_whole_or_not_at_all() -> None:
    """Two regions in one graph: only the one that pays is fused, in full."""
    b = opgraph.GraphBuilder()
    x = b.input(("float32", BIG32), name="x")
    s = b.input(("float32", (100,)), name="s")
    big = b.sin(b.tanh(b.exp(b.sin(x))))
    small = b.sin(b.tanh(b.exp(b.sin(s))))
    b.output(big, small)
    o = optimize(b.freeze(), level=3)
    kinds = [o.kind_of(op) for op in range(o.num_ops)]
    assert kinds.count("fused_elementwise") == 1 and kinds.count("sin") == 2 and kinds.count("exp") == 1


def test_regions_with_broadcast_operands_are_not_fused() -> None:
    """A bias broadcast to the result (a CNN's bias + residual + relu): the blocks are strided, no gain."""
    def graph(bias_shape: tuple[int, ...]) -> Graph:
        b = opgraph.GraphBuilder()
        x = b.input(("float32", (64, 32, 32, 32)), name="x")
        r = b.input(("float32", (64, 32, 32, 32)), name="r")
        bias = b.input(("float32", bias_shape), name="bias")
        b.output(b.relu(b.add(b.add(x, bias), r)))
        return b.freeze()

    g = graph((1, 32, 1, 1))
    assert optimize(g, level=3) == optimize(g, level=2) == g
    fused_all = optimize(g, level=3, cost=FusionCost(broadcast=True))
    assert [fused_all.kind_of(op) for op in range(fused_all.num_ops)] == ["fused_elementwise"]
    one = graph((1, 1, 1, 1))  # one element: cut per block like a scalar, so fused
    assert [optimize(one, level=3).kind_of(op) for op in range(1)] == ["fused_elementwise"]


def test_cost_model_arguments() -> None:
    cost = FusionCost(min_steps=2, min_bytes=0)
    g = chain((10,), "float64", ("add", "multiply"))
    assert optimize(g, level=3, cost=cost) == fused_chain((10,), "float64", ("add", "multiply"))
    assert optimize(g, level=3) == optimize(g, level=2)


def test_small_chain_fusion_without_cost_model() -> None:
    """With ``cost=None`` level 3 fuses as before the cost model (the shape of tests/test_passes.py's case)."""
    F = ("float64", (2, 3))
    b = opgraph.GraphBuilder()
    x, w, c = b.input(F), b.input(F), b.input(("float64", (3,)))
    t = b.exp(b.negative(b.multiply(x, w)))
    b.output(b.subtract(b.add(t, c), b.abs(x)), b.sqrt(w))
    g = b.freeze()
    e = opgraph.GraphBuilder()
    x, w, c = e.input(F), e.input(F), e.input(("float64", (3,)))
    prog = (("multiply", -1, -2), ("negative", 0), ("exp", 1), ("add", 2, -3), ("abs", -1), ("subtract", 3, 4))
    e.output(e.fused_elementwise(x, w, c, program=prog), e.sqrt(w))
    assert optimize(g, level=3, cost=None) == e.freeze()
    assert optimize(g, level=3) == optimize(g, level=2)


# ---------------------------------------------------------------- planned memory never grows (issue 16)
def _demo_mlp_step() -> Graph:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import demo

    return demo.build_step(64).graph  # what examples/demo.py saves as out/mlp_step.cg


def _bench_model(name: str) -> Graph:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from memory_models import build

    return build(name, scale=0.05)[0]


def _optimizer_step(opt: str) -> Graph:
    import opgraph.optim as optim

    return _step_graph({"SGD": optim.SGD(lr=0.05), "Adagrad": optim.Adagrad(lr=0.05),
                        "Adam": optim.Adam(lr=0.01)}[opt])


PLANNED_GRAPHS: dict[str, Callable[[], Graph]] = {
    "demo_mlp_step": _demo_mlp_step, "sgd_step": lambda: _optimizer_step("SGD"),
    "adagrad_step": lambda: _optimizer_step("Adagrad"), "adam_step": lambda: _optimizer_step("Adam"),
    **{f"bench_{n}": (lambda n=n: _bench_model(n)) for n in ("mlp", "mlp_train", "resnet", "inception", "chain")},
}


@pytest.mark.parametrize("name", list(PLANNED_GRAPHS))
def test_no_level_plans_more_memory_than_the_unoptimised_graph(name: str) -> None:
    """DESIGN.md: a rewrite is kept only where it does not make the graph larger. Every level, with the NumPy
    cost model and with every elementwise region fused (cost=None), on each schedule the planner offers."""
    g = PLANNED_GRAPHS[name]()
    for schedule in ("best", "dfs", "greedy"):
        base = plan_memory(g, schedule=schedule).total_bytes
        for level, cost in ((1, NUMPY_COST), (2, NUMPY_COST), (3, NUMPY_COST), (3, None)):
            planned = plan_memory(optimize(g, level=level, cost=cost), schedule=schedule).total_bytes
            assert planned <= base, (schedule, level, cost, planned, base)
