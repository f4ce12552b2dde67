"""The backend layer: capability queries, lowering, partitioning, state, targets, shapes, threads, auto, errors.

Every behaviour is checked on each installed engine against the numpy backend's result on the same graph.
"""

from __future__ import annotations

import importlib.util
import threading

import numpy as np
import pytest

import opgraph
from opgraph import backends
from opgraph.backends.base import Backend, BackendError
from opgraph.core.registry import OpDef, register_op
from opgraph.core.types import TensorType
from opgraph.optim import SGD, Adam, training_step
from opgraph.passes.lower import lower

ENGINES = [n for n in ("jax", "torch", "onnxruntime") if importlib.util.find_spec(n) is not None]
needs_engine = pytest.mark.parametrize("name", ENGINES)


def _numpy_only_kind() -> str:
    """A user op with a NumPy kernel only: no other backend can claim it."""
    name = "test_numpy_only_softsign"
    try:
        opgraph.get_op(name)
    except KeyError:
        register_op(OpDef(name=name, id=49001, arity=1, infer=lambda ts, a: (ts[0],),
                          kernel=lambda x, out=None: np.divide(x, 1 + np.abs(x), out=out),
                          doc="x / (1 + |x|), numpy only (a test op)"))
    return name


def _mlp_graph(dtype: str = "float32") -> tuple[opgraph.Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    b = opgraph.GraphBuilder()
    x = b.input((dtype, (8, 5)), name="x")
    w = b.input((dtype, (5, 3)), name="w")
    h = b.op("tanh", b.op("matmul", x, w))
    b.output(b.op("sum", b.op("square", h), axis=1), h)
    feeds = {"x": rng.standard_normal((8, 5)).astype(dtype), "w": rng.standard_normal((5, 3)).astype(dtype)}
    return b.freeze(), feeds


def _decaying_sum_graph() -> opgraph.Graph:
    """State s <- 0.5 * s + x (an update edge); the output is sum(s')."""
    b = opgraph.GraphBuilder()
    s = b.input(("float64", (3,)), name="s")
    x = b.input(("float64", (3,)), name="x")
    new = b.op("add", b.op("multiply", s, 0.5), x)
    b.update(new, s)
    b.output(b.op("sum", new))
    return b.freeze()


def _close(got: list[np.ndarray], want: list[np.ndarray], rtol: float = 2e-5) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)


# ---------------------------------------------------------------- registry and errors
def test_registry_names_and_capability_queries() -> None:
    assert backends.names() == ("numpy", "jax", "torch", "onnxruntime", "dask", "numba", "c")
    assert "numpy" in backends.available()
    numpy_be = backends.get("numpy")
    assert numpy_be.supports("conv2d") and not numpy_be.supports("no_such_kind")
    for name in ENGINES:
        be = backends.get(name)
        assert be.supports("add") and be.supports("add", [("float32", (2,)), ("float32", (2,))])
        assert not be.supports(_numpy_only_kind())


def test_unknown_backend_is_one_line() -> None:
    g, _ = _mlp_graph()
    with pytest.raises(BackendError, match=r"^unknown backend 'tensorflow'; known: numpy, jax") as err:
        opgraph.compile(g, backend="tensorflow")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("given", "meant"), [("pytorch", "torch"), ("JAX", "jax"), ("Torch", "torch"),
                                              ("ort", "onnxruntime"), ("onnx", "onnxruntime"), ("np", "numpy"),
                                              ("Auto", "auto"), ("nmupy", "numpy"), ("onnxrutime", "onnxruntime")])
def test_unknown_backend_suggests_the_engine_meant(given: str, meant: str) -> None:
    # the engine's library name, another case or a typo: the message ends naming the backend meant, once
    g, _ = _mlp_graph()
    with pytest.raises(BackendError) as err:
        opgraph.compile(g, backend=given)
    msg = str(err.value)
    assert msg.startswith(f"unknown backend {given!r}; known: numpy, jax") and "\n" not in msg
    assert msg.endswith(f"; did you mean {meant!r}?")
    with pytest.raises(BackendError, match=f"did you mean {meant!r}"):
        opgraph.jit(lambda x: x * 2, backend=given)(np.ones(2))


def test_unknown_backend_far_from_every_name_suggests_none() -> None:
    g, _ = _mlp_graph()
    with pytest.raises(BackendError) as err:
        opgraph.compile(g, backend="tensorflow")
    assert "did you mean" not in str(err.value) and str(err.value).endswith("auto)")


def test_backend_errors_are_value_errors() -> None:
    # NumPy's habit: a bad argument value is caught by `except ValueError`
    g, _ = _mlp_graph()
    with pytest.raises(ValueError, match="unknown backend 'pytorch'"):
        opgraph.compile(g, backend="pytorch")
    with pytest.raises(ValueError, match="result='pytorch'"):
        opgraph.compile(g, backend="numpy", result="pytorch")
    missing = backends.BackendNotInstalledError("no_such_engine_pkg", "backend 'x'")  # what get() raises
    assert isinstance(missing, ValueError) and isinstance(missing, ImportError) and isinstance(missing, BackendError)
    assert missing.name == "no_such_engine_pkg" and str(missing).startswith(
        "backend 'x' needs the optional package no_such_engine_pkg: pip install no_such_engine_pkg")


def test_backend_not_installed_says_what_to_install() -> None:
    fake = Backend("test_missing_engine", module="no_such_engine_pkg", extra="no_such_engine_pkg")
    backends.register(fake)
    try:
        g, _ = _mlp_graph()
        with pytest.raises(BackendError, match=r"pip install \"opgraph\[no_such_engine_pkg\]\"") as err:
            opgraph.compile(g, backend="test_missing_engine")
        assert "\n" not in str(err.value)
    finally:
        backends._MODULES.pop("test_missing_engine")
        backends._LOADED.pop("test_missing_engine")


@needs_engine
def test_missing_op_without_partitioning_is_one_line(name: str) -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    b.output(b.op("exp", b.op(_numpy_only_kind(), b.op("sin", x))))
    with pytest.raises(BackendError, match=rf"op \d+ \(test_numpy_only_softsign\) cannot run on {name}: .*"
                                           r"partition=True") as err:
        opgraph.compile(b.freeze(), backend=name, partition=False)
    assert "\n" not in str(err.value)


@needs_engine
def test_cuda_device_absent_is_a_clear_error(name: str) -> None:
    g, _ = _mlp_graph()
    if name == "torch":
        import torch
        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present: the error path cannot be exercised")
    with pytest.raises(BackendError) as err:
        opgraph.compile(g, backend=name, device="cuda")
    assert "\n" not in str(err.value)


@needs_engine
def test_runs_on_cuda_when_present(name: str) -> None:
    if name == "torch":
        import torch
        present = torch.cuda.is_available()
    elif name == "jax":
        import jax
        present = any(d.platform == "gpu" for d in jax.devices())
    else:
        import onnxruntime
        present = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    if not present:
        pytest.skip(f"no GPU on this machine: {name}'s device='cuda' path needs one")
    g, feeds = _mlp_graph()
    _close(opgraph.compile(g, backend=name, device="cuda")(feeds), opgraph.compile(g)(feeds), rtol=1e-4)


# ---------------------------------------------------------------- results
@needs_engine
def test_whole_graph_matches_numpy(name: str) -> None:
    g, feeds = _mlp_graph()
    f = opgraph.compile(g, backend=name)
    want = opgraph.compile(g)(feeds)
    _close(f(feeds), want)
    _close(f(**feeds), want)  # keywords, and a second call on the same compiled program
    assert "1 region(s)" in f.explain()


@needs_engine
def test_partitioned_graph_matches_numpy(name: str) -> None:
    rng = np.random.default_rng(1)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (4, 6)), name="x")
    w = b.input(("float64", (6, 6)), name="w")
    h = b.op("matmul", x, w)
    mid = b.op(_numpy_only_kind(), h)           # the middle op only numpy has
    b.output(b.op("sum", b.op("exp", b.op("matmul", mid, w)), axis=0))
    g = b.freeze()
    feeds = {"x": rng.standard_normal((4, 6)), "w": rng.standard_normal((6, 6)) * 0.3}
    f = opgraph.compile(g, backend=name)
    _close(f(feeds), g.run(feeds), rtol=1e-10)
    text = f.explain()
    assert "3 region(s)" in text and f"({_numpy_only_kind()}) runs on numpy: {name} has no rule" in text
    assert f.transfers >= 2  # into numpy and back
    # h goes to numpy and mid back: 2 between engines; x and w (twice: both engine regions read it) come from the
    # caller, converted only for an engine with arrays of its own
    converted = f", 3 NumPy feed(s) converted to {name} arrays" if name in ("jax", "torch") else ""
    assert text.splitlines()[0].endswith(f"; 3 region(s), 2 transfer(s) between backends{converted} per call")


@needs_engine
def test_explain_tells_host_feeds_from_transfers_between_engines(name: str) -> None:
    # a graph wholly on one engine moves nothing between engines; the caller's NumPy feeds are said apart
    g, _ = _mlp_graph()
    first = opgraph.compile(g, backend=name).explain().splitlines()[0]
    converted = f", 2 NumPy feed(s) converted to {name} arrays" if name in ("jax", "torch") else ""
    assert first == f"backend {name} (device cpu); 1 region(s), 0 transfer(s) between backends{converted} per call"


def test_explain_counts_no_feed_for_update_edge_state() -> None:
    # state stays in the engine's arrays between calls: only the data feed is converted per call
    pytest.importorskip("jax")
    b = opgraph.GraphBuilder()
    x, s = b.input(("float64", (3,)), name="x"), b.input(("float64", (3,)), name="s")
    b.update(b.add(s, x), s)
    b.output(b.op("sum", s))
    first = opgraph.compile(b.freeze(), backend="jax").explain().splitlines()[0]
    assert first.endswith("1 region(s), 0 transfer(s) between backends, 1 NumPy feed(s) converted to jax arrays "
                          "per call")


@needs_engine
def test_targets_subset(name: str) -> None:
    g, feeds = _mlp_graph()
    f = opgraph.compile(g, backend=name)
    h = int(g.outputs[1])
    mm = int(g.op_inputs(int(g.value_producer[h]))[0])  # the matmul result, not an output
    got = f(feeds, targets=[mm])
    want = g.run(feeds, [mm])
    _close(got, want)


@needs_engine
def test_update_edges_keep_state_between_calls(name: str) -> None:
    g = _decaying_sum_graph()
    f, ref = opgraph.compile(g, backend=name), opgraph.compile(g)
    xs = np.array([1.0, 2.0, 3.0])
    outs = [(f({"s": np.zeros(3), "x": xs}), ref({"s": np.zeros(3), "x": xs}))]
    for k in range(3):
        outs.append((f({"x": xs * k}), ref({"x": xs * k})))
    for got, want in outs:
        _close(got, want, rtol=1e-12)
    np.testing.assert_allclose(f.state("s"), ref.state("s"), rtol=1e-12)


@needs_engine
@pytest.mark.parametrize("optimizer", [SGD(lr=0.1), Adam(lr=0.01)], ids=["sgd", "adam"])
def test_training_through_optim(name: str, optimizer: object) -> None:
    rng = np.random.default_rng(2)
    b = opgraph.GraphBuilder()
    w = b.input(("float64", (4, 2)), name="w")
    x = b.input(("float64", (16, 4)), name="x")
    y = b.input(("float64", (16, 2)), name="y")
    loss = b.op("mean", b.op("square", b.op("subtract", b.op("matmul", x, w), y)))
    step = training_step(b, loss, [w], optimizer)  # type: ignore[arg-type]
    g = opgraph.optimize(step.graph, level=2)  # fused optimiser updates: lowered for the engine
    f, ref = opgraph.compile(g, backend=name), opgraph.compile(g)
    first = {"w": rng.standard_normal((4, 2)), **step.state}
    for i in range(5):
        feeds = {"x": rng.standard_normal((16, 4)), "y": rng.standard_normal((16, 2))}
        if i == 0:
            feeds |= first
        _close(f(dict(feeds)), ref(dict(feeds)), rtol=1e-9)
    np.testing.assert_allclose(f.state("w"), ref.state("w"), rtol=1e-9)


@needs_engine
def test_gradient_graph_matches_numpy(name: str) -> None:
    rng = np.random.default_rng(3)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (5, 3)), name="x")
    w = b.input(("float64", (3, 2)), name="w")
    loss = b.op("sum", b.op("log1p", b.op("square", b.op("sin", b.op("matmul", x, w)))))
    (gw,) = b.build_grad_ops(loss, [w])
    b.output(loss, gw)
    g = b.freeze()
    feeds = {"x": rng.standard_normal((5, 3)), "w": rng.standard_normal((3, 2))}
    _close(opgraph.compile(g, backend=name)(feeds), g.run(feeds), rtol=1e-9)


@needs_engine
def test_dynamic_batch_one_variant_per_shape(name: str) -> None:
    b = opgraph.GraphBuilder()
    x = b.input(TensorType("float32", (None, 4)), name="x")
    b.output(b.op("softmax", b.op("multiply", x, 3.0), axis=-1))
    g = b.freeze()
    f = opgraph.compile(g, backend=name)
    rng = np.random.default_rng(4)
    for n in (2, 7, 2):
        xs = rng.standard_normal((n, 4)).astype(np.float32)
        _close(f(x=xs), g.run({"x": xs}))
    regions = f.variant(tuple(f.outputs)).regions
    assert len(regions) == 1 and len(regions[0].executables) == 2  # shapes (2, 4) and (7, 4), each compiled once


@needs_engine
def test_calls_from_several_threads(name: str) -> None:
    g, _ = _mlp_graph("float64")
    f = opgraph.compile(g, backend=name)
    rng = np.random.default_rng(5)
    cases = [{"x": rng.standard_normal((8, 5)), "w": rng.standard_normal((5, 3))} for _ in range(8)]
    wants = [g.run(c) for c in cases]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(5):
                _close(f(cases[i]), wants[i], rtol=1e-10)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@needs_engine
def test_incremental_evaluation_reruns_only_changed_regions(name: str) -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    y = b.input(("float64", (3,)), name="y")
    ex = b.op("exp", b.op("sin", x))                        # region on the engine, reads x only
    mid = b.op(_numpy_only_kind(), y)                       # numpy region, reads y only
    out = b.op("add", b.op("multiply", ex, 2.0), mid)       # engine region reading both
    b.output(out)
    g = b.freeze()
    ctx, ref = opgraph.compile(g, backend=name).context(), opgraph.compile(g).context()
    for c in (ctx, ref):
        c.set("x", np.zeros(3))
        c.set("y", np.ones(3))
    np.testing.assert_allclose(ctx.get(out), ref.get(out), rtol=1e-12)
    first = ctx.kernel_calls
    assert first == 5
    np.testing.assert_allclose(ctx.get(out), ref.get(out), rtol=1e-12)
    assert ctx.kernel_calls == first                        # nothing changed: free
    for c in (ctx, ref):
        c.set("y", np.full(3, 2.0))
    np.testing.assert_allclose(ctx.get(out), ref.get(out), rtol=1e-12)
    assert ctx.kernel_calls == first + 2                    # the numpy op and the final add; not sin, exp, multiply
    np.testing.assert_allclose(ctx.get(ex), ref.get(ex), rtol=1e-12)
    np.testing.assert_allclose(ctx.get("x"), np.zeros(3))


@needs_engine
def test_incremental_update_applies_update_edges(name: str) -> None:
    b = opgraph.GraphBuilder()
    s = b.input(("float64", (2,)), name="s")
    new = b.op("multiply", s, 3.0)
    b.update(new, s)
    b.output(new)
    g = b.freeze()
    ctx = opgraph.compile(g, backend=name).context()
    ctx.set("s", np.ones(2))
    ctx.update()
    ctx.update()
    np.testing.assert_allclose(ctx.get("s"), np.full(2, 9.0))
    with pytest.raises(opgraph.ExecutionError, match="cannot be set"):
        ctx.set(new, np.ones(2))


# ---------------------------------------------------------------- auto
def test_auto_picks_the_fastest_and_reports_timings() -> None:
    g, feeds = _mlp_graph()
    f = opgraph.compile(g, backend="auto", example_inputs=feeds, budget=5.0)
    choice = f.choice
    assert choice is not None and choice.backend in backends.available()
    ok = {k: t for k, t in choice.timings.items() if t is not None}
    assert set(ok) >= {"numpy"} and choice.backend in ok and not set(choice.failures) & set(ok)
    assert choice.timings[choice.backend] == min(ok.values())
    assert f.explain().startswith(f"auto chose {choice.backend}: ")
    _close(f(feeds), g.run(feeds))


def test_auto_without_examples_decides_on_first_call() -> None:
    g, feeds = _mlp_graph()
    f = opgraph.compile(g, backend="auto", budget=3.0)
    assert f.choice is None and "first call" in f.explain()
    _close(f(feeds), g.run(feeds))
    assert f.choice is not None


# ---------------------------------------------------------------- lowering (before / expected)
def _lowered_kinds(g: opgraph.Graph, banned: set[str]) -> list[str]:
    res = lower(g, lambda op: op.kind not in banned)
    return [res.graph.kind_of(op) for op in res.graph.topological_order().tolist() if res.graph.kind_of(op) != "const"]


def test_lower_fma_and_matmul_t() -> None:
    b = opgraph.GraphBuilder()
    a = b.input(("float64", (3, 4)), name="a")
    c = b.input(("float64", (3, 3)), name="c")
    m = b.op("matmul_t", a, a, transpose_b=True)
    b.output(b.op("fma", m, 2.0, c))
    g = b.freeze()
    assert _lowered_kinds(g, {"fma", "matmul_t"}) == ["permute_dims", "matmul", "multiply", "add"]
    assert [g.kind_of(op) for op in range(g.num_ops) if g.kind_of(op) != "const"] == ["matmul_t", "fma"]  # untouched
    rng = np.random.default_rng(6)
    feeds = {"a": rng.standard_normal((3, 4)), "c": rng.standard_normal((3, 3))}
    low = lower(g, lambda op: op.kind not in {"fma", "matmul_t"}).graph
    np.testing.assert_allclose(low.run(feeds)[0], g.run(feeds)[0], rtol=1e-14)


@pytest.mark.parametrize("subs,shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("bij,bjk->bik", [(5, 2, 3), (5, 3, 4)]),
    ("ijk,jl->lki", [(2, 3, 4), (3, 5)]),
    ("ij,kj->", [(3, 4), (2, 4)]),
    ("abc,cd->dba", [(2, 3, 4), (4, 5)]),
    ("i,i->i", [(4,), (4,)]),
    ("ij,j->i", [(3, 4), (4,)]),
])
def test_lower_einsum_ttgt_matches_numpy(subs: str, shapes: list[tuple[int, ...]]) -> None:
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(s) for s in shapes]
    b = opgraph.GraphBuilder()
    ins = [b.input(TensorType.of(a)) for a in arrays]
    b.output(b.op("einsum", *ins, subscripts=subs))
    low = lower(b.freeze(), lambda op: op.kind != "einsum").graph
    kinds = {low.kind_of(op) for op in range(low.num_ops)}
    assert "einsum" not in kinds and "matmul" in kinds
    got = low.run({v.id: a for v, a in zip(ins, arrays, strict=True)})[0]
    np.testing.assert_allclose(got, np.einsum(subs, *arrays), rtol=1e-12, atol=1e-12)


def test_lower_tensordot_outer_vecdot_match_numpy() -> None:
    rng = np.random.default_rng(8)
    a, c = rng.standard_normal((3, 4, 5)), rng.standard_normal((5, 4, 2))
    v1, v2 = rng.standard_normal(3) + 1j * rng.standard_normal(3), rng.standard_normal(3) + 0j
    b = opgraph.GraphBuilder()
    ia, ic, i1, i2 = (b.input(TensorType.of(x)) for x in (a, c, v1, v2))
    b.output(b.op("tensordot", ia, ic, axes=((1, 2), (1, 0))), b.op("outer", i1, i2), b.op("vecdot", i1, i2))
    g = b.freeze()
    low = lower(g, lambda op: op.kind not in {"tensordot", "outer", "vecdot"}).graph
    assert not {"tensordot", "outer", "vecdot"} & {low.kind_of(op) for op in range(low.num_ops)}
    got = low.run({ia: a, ic: c, i1: v1, i2: v2})
    np.testing.assert_allclose(got[0], np.tensordot(a, c, axes=((1, 2), (1, 0))), rtol=1e-12)
    np.testing.assert_allclose(got[1], np.outer(v1, v2), rtol=1e-12)
    np.testing.assert_allclose(got[2], np.vecdot(v1, v2), rtol=1e-12)


# ---------------------------------------------------------------- real TensCalc files
@needs_engine
@pytest.mark.parametrize("case", ["linalg", "nonlinear"])
def test_tenscalc_scalarized_files_reproduce_reference_on_backend(name: str, case: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """TensCalc's scalar functions are lowered to elementwise ops that run on the engine; scalars2ftensor and
    ftensor2scalars stay on numpy. The values TensCalc computed are reproduced to 1e-12."""
    import functools

    import test_ops_tenscalc as tc
    from opgraph.runtime.executor import execute

    graph = opgraph.io.load(f"{tc.DATA}/{case}/scalarized")
    gateways = {gw.name: ({"set": 1, "get": 2, "copy": 3}[gw.kind], list(gw.values), list(gw.destinations))
                for gw in opgraph.io.cg.gateways(graph)}
    monkeypatch.setattr(tc, "execute", functools.partial(execute, backend=name))
    assert tc.replay(graph, gateways, tc._reference(case)["steps"])
    text = opgraph.compile(graph, backend=name).explain()
    assert "lowered: " in text and "lower.Ssum" in text
    assert f"on {name}: " in text  # the scalar arithmetic really ran on the engine


def test_auto_keeps_state_and_exposes_the_chosen_program() -> None:
    g = _decaying_sum_graph()
    f, ref = opgraph.compile(g, backend="auto", budget=3.0), opgraph.compile(g)
    with pytest.raises(AttributeError, match="chosen on the first call"):
        f.state("s")
    timed = opgraph.compile(g, backend="auto", budget=3.0, example_inputs={"s": np.ones(3), "x": np.ones(3)})
    with pytest.raises(opgraph.ExecutionError, match="missing feed for input %s"):
        timed(x=np.ones(3))  # the timing calls left no state behind
    first = {"s": np.zeros(3), "x": np.ones(3)}
    _close(f(dict(first)), ref(dict(first)), rtol=1e-12)
    for _ in range(3):
        _close(f(x=np.ones(3)), ref(x=np.ones(3)), rtol=1e-12)
    np.testing.assert_allclose(f.state("s"), ref.state("s"), rtol=1e-12)


@needs_engine
def test_state_read_by_two_regions_is_not_donated(name: str) -> None:
    """A state input read by the engine's region and by a numpy region after it must outlive the first."""
    b = opgraph.GraphBuilder()
    s = b.input(("float64", (4,)), name="s")
    new = b.op("add", b.op("exp", s), 1.0)
    b.update(new, s)
    b.output(b.op("add", b.op(_numpy_only_kind(), new), b.op(_numpy_only_kind(), s)))
    g = b.freeze()
    f, ref = opgraph.compile(g, backend=name), opgraph.compile(g)
    s0 = np.linspace(-1, 0, 4)
    _close(f(s=s0), ref(s=s0), rtol=1e-12)
    for _ in range(2):
        _close(f(), ref(), rtol=1e-12)


@needs_engine
def test_results_are_writable_arrays_of_their_own(name: str) -> None:
    g, feeds = _mlp_graph()
    f = opgraph.compile(g, backend=name)
    a, _h = f(feeds)
    a += 1.0  # the numpy backend's results are writable; so are every backend's
    again = f(feeds)
    np.testing.assert_allclose(again[0] + 1.0, a, rtol=1e-6)


@needs_engine
def test_results_that_are_inputs_or_constants(name: str) -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (3,)), name="x")
    c = b.constant(np.arange(3, dtype=np.float32))
    b.output(x, c, b.op("add", x, c), x)
    g = b.freeze()
    xs = np.ones(3, np.float32)
    got = opgraph.compile(g, backend=name)(x=xs)
    _close(got, g.run({"x": xs}))
    got[0][0] = 7.0  # results never alias the caller's feed or the graph's constants
    assert xs[0] == 1.0 and got[3][0] == 1.0 and g.run({"x": xs})[1][0] == 0.0


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is an optional extra")
def test_torch_compile_option_matches_numpy() -> None:
    g, feeds = _mlp_graph()
    f = opgraph.compile(g, backend="torch", compile=True, mode="default")
    _close(f(feeds), g.run(feeds))
    _close(f(feeds), g.run(feeds))
    with pytest.raises(TypeError, match="no_such_option"):
        opgraph.compile(g, backend="jax", no_such_option=1)


@needs_engine
@pytest.mark.parametrize("with_nan", [False, True])
def test_max_pool_propagates_nan_as_numpy(name: str, with_nan: bool) -> None:
    """Engines' max pools skip NaN unless told otherwise; opgraph's max pool propagates it (NumPy's max does)."""
    x = np.random.default_rng(9).standard_normal((2, 3, 6, 6)).astype(np.float32)
    if with_nan:
        x[0, 1, 2, 3] = np.nan
        x[1, 2, 0, 0] = np.nan
    b = opgraph.GraphBuilder()
    xv = b.input(TensorType.of(x), name="x")
    b.output(b.op("max_pool2d", xv, kernel_size=2), b.op("max_pool", xv, kernel_size=(3, 3), stride=(2, 2)))
    g = b.freeze()
    got, want = opgraph.compile(g, backend=name)(x=x), g.run({"x": x})
    for a, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, w)
    assert np.isnan(want[0]).sum() == (2 if with_nan else 0)
