"""backend="auto": the pre-ranking's recorded reasons, Graph.run and the CLI's run and plan, results against NumPy."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import opgraph
from opgraph import backends
from opgraph.backends.base import Backend
from opgraph.cli.main import main
from opgraph.io.jsonfmt import save_json
from opgraph.runtime import auto
from opgraph.runtime.auto import AutoCompiled, cached_choice, choose, rank

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from auto_costs import scalar_graph

from test_io_json import small_graph

ENGINES = [n for n in ("numpy", "jax", "torch", "onnxruntime") if n in backends.available()]
TIMED = [n for n in backends.available() if n not in auto.NOT_TIMED]
"""What auto chooses among by default (numba too, where installed)."""


def _numpy_chain(n: int, x: float, w: float) -> float:
    y = x
    for i in range(n):
        y = (np.sin, lambda v: v * w, lambda v: v + w, np.tanh)[i % 4](y)
    return float(y)


def _two_outputs() -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    z = b.input(("float64", (3,)), name="z")
    b.output(b.op("exp", x, name="ex"), b.op("multiply", z, 2.0, name="dz"))
    return b.freeze()


# ----------------------------------------------------------------------------- the pre-ranking (no timing)
def test_fine_grained_graph_leaves_out_what_cannot_win() -> None:
    g, _ = scalar_graph(3000)
    r = rank(g, ENGINES, budget=2.0)
    assert r["numpy"].verdict is None and r["numpy"].ops == 3000
    if "jax" in r:  # XLA's compile of 3000 ops: seconds, more than the budget
        assert r["jax"].verdict is not None and r["jax"].verdict.startswith("compile estimated at ")
        assert "for 3000 op(s), more than the whole budget (2 s)" in r["jax"].verdict
    if "torch" in r:  # eager dispatch per op: more than twice the overhead of the cheapest engine
        assert r["torch"].verdict is not None and r["torch"].verdict.startswith("cannot win: at least ")
        assert "3000 op(s) at 3.6 us/op" in r["torch"].verdict
    if "onnxruntime" in r:
        assert r["onnxruntime"].verdict is None
    # the same graph with a budget that covers XLA's compile: jax is timed (its calls are the cheapest)
    assert all(e.verdict is None for n, e in rank(g, ENGINES, budget=60.0).items() if n in ("jax", "numpy"))


def test_big_matmul_keeps_every_engine() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (1024, 1024)), name="x")
    w = b.input(("float32", (1024, 1024)), name="w")
    b.output(b.op("relu", b.op("matmul", b.op("relu", b.op("matmul", x, w)), w)))
    r = rank(b.freeze(), ENGINES)
    assert {n: e.verdict for n, e in r.items()} == dict.fromkeys(ENGINES)
    # two matmuls of 2 * 1024**3 flops, two relus reading and writing 1024**2 elements each
    assert auto.profile(b.freeze()).work_seconds == pytest.approx(2 * 2 * 1024**3 * auto.FLOP_SECONDS
                                                                  + 2 * 2 * 1024**2 * auto.ELEMENT_SECONDS)


def test_an_engine_that_partitions_into_many_regions_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    b = opgraph.GraphBuilder()
    y = b.input(("float64", (4,)), name="x")
    for i in range(200):
        y = b.op("sin" if i % 2 == 0 else "cos", y)
    b.output(y)
    g = b.freeze()
    backends.register(Backend("t_sin_only", rules={"sin": np.sin}))
    try:
        monkeypatch.setitem(auto.COSTS, "t_sin_only", auto.COSTS["onnxruntime"])
        est = rank(g, ["numpy", "t_sin_only"])["t_sin_only"]
    finally:
        backends.unregister("t_sin_only")
    assert (est.ops, est.numpy_ops, est.transfers, est.regions) == (100, 100, 199, 200)
    assert est.verdict is not None and est.verdict.startswith("cannot win: ")
    assert "100 on numpy, 199 transfer(s)" in est.verdict


def test_dynamic_shapes_leave_the_call_contest_out() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (None,)), name="x")
    b.output(b.op("exp", x))
    g = b.freeze()
    assert auto.profile(g).work_seconds is None
    assert all(e.verdict is None for e in rank(g, ENGINES, budget=20.0).values())


# ----------------------------------------------------------------------------- timing what is left
def test_choose_times_only_what_can_win_and_matches_numpy() -> None:
    g, feeds = scalar_graph(2000)
    choice = choose(g, feeds, budget=1.0, allow_numerics=True)
    status = choice.status()
    if "numba" in backends.available():  # the register machine runs it whole: numpy (seconds to compile) is not timed
        assert status["numba"] == "timed" and choice.backend == "numba"
        assert status["numpy"].startswith("left out: cannot win") and "numba at most" in status["numpy"]
    else:
        assert status["numpy"] == "timed" and choice.timings["numpy"] is not None
    if "jax" in ENGINES:
        assert status["jax"].startswith("left out: compile estimated at ") and "jax" not in choice.compile_seconds
    if "torch" in ENGINES:
        assert status["torch"].startswith("left out: cannot win") and "torch" not in choice.timings
    assert {n for n, s in status.items() if s == "timed"} <= set(choice.compile_seconds)
    assert set(choice.compile_seconds) <= {n for n, s in status.items()
                                           if s == "timed" or s.startswith("skipped: not timed")}
    assert choice.seconds >= sum(choice.compile_seconds.values())
    got = choice.compiled(feeds)[0]
    np.testing.assert_allclose(got, _numpy_chain(2000, 0.3, 0.9), rtol=1e-12)
    text = AutoCompiled(g, budget=1.0)  # explain() before the choice
    assert "first call" in text.explain()


@pytest.mark.skipif("jax" not in ENGINES, reason="jax is not installed")
def test_named_candidates_are_all_timed() -> None:
    g, feeds = scalar_graph(50)  # jax's per-call overhead loses to numpy's here: the pre-ranking would leave it out
    assert rank(g, ["numpy", "jax"])["jax"].verdict.startswith("cannot win: ")
    choice = choose(g, feeds, budget=0.5, candidates=("numpy", "jax"), allow_numerics=True)
    assert choice.status() == {"numpy": "timed", "jax": "timed"} and not choice.left_out
    assert "jax: timed: median " in choice.decision() and "estimated: compile " in choice.decision()
    np.testing.assert_allclose(choice.compiled(feeds)[0], _numpy_chain(50, 0.3, 0.9), rtol=1e-12)


def test_auto_compiled_calls_like_a_program() -> None:
    g = _two_outputs()
    x, z = np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0])
    f = opgraph.compile(g, backend="auto", budget=0.3, candidates=("numpy",))
    assert f.program is None and f.compile_seconds == 0.0
    ex, dz = f(x, z)  # positional: the inputs in order
    np.testing.assert_array_equal(ex, np.exp(x))
    np.testing.assert_array_equal(dz, z * 2.0)
    assert f.program is f.choice.compiled and f.compile_seconds == f.choice.seconds > 0
    np.testing.assert_array_equal(f({"x": x, "z": z})[1], z * 2.0)
    np.testing.assert_array_equal(f(x=x, z=z)[0], np.exp(x))
    with pytest.raises(opgraph.errors.FeedError, match=r"got 3 positional arguments for 2 inputs: the graph's inputs "
                                                       r"are x: f64\[3\], z: f64\[3\]"):
        f(x, z, z)
    text = f.explain()
    assert text.startswith("auto chose numpy: ")
    assert "how auto decided" in text and "numpy: timed: median " in text and ", compile " in text
    assert "backend numpy (device cpu)" in text


# ----------------------------------------------------------------------------- Graph.run
def test_graph_run_auto_chooses_once(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _two_outputs()
    x, z = np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0])
    calls = []
    real = auto.choose
    monkeypatch.setattr(auto, "choose", lambda *a, **k: calls.append(k) or real(*a, **k))
    got = g.run({"x": x}, ["ex"], backend="auto")  # only the targets' inputs are fed, as on numpy
    np.testing.assert_array_equal(got[0], np.exp(x))
    choice = cached_choice(g)
    assert choice is not None and choice.backend in TIMED and len(calls) == 1
    for _ in range(2):
        both = g.run(x=x, z=z, backend="auto")
        np.testing.assert_array_equal(both[1], z * 2.0)
    assert len(calls) == 1 and cached_choice(g) is choice


# ----------------------------------------------------------------------------- the command line
@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A graph with an update edge (run applies none) and a dynamic-shape twin."""
    save_json(small_graph(), tmp_path / "model.json")
    np.save(tmp_path / "x.npy", np.array([1.0, 2.0, 3.0]))
    d = opgraph.GraphBuilder()
    d.output(d.op("exp", d.input(("float64", (None,)), name="v")))
    save_json(d.freeze(), tmp_path / "dyn.json")
    return tmp_path


def test_cli_run_auto(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    code = main(["run", str(model / "model.json"), "--set", f"x={model / 'x.npy'}", "--backend", "auto",
                 "--budget", "0.5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.splitlines() == ["%y = array([2., 4., 6.])", "%total = array(12.)"]
    assert err.startswith("opgraph: auto chose ") and len(err.splitlines()) == 1


def test_cli_plan_auto(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    code = main(["plan", str(model / "model.json"), "--backend", "auto", "--budget", "0.5",
                 "--set", f"x={model / 'x.npy'}"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "timed on seeded random inputs for %s (--set NAME=FILE.npy gives your own)"
    chosen = lines[1].removeprefix("auto chose ").split(":")[0]
    assert chosen in TIMED and lines[2].startswith("how auto decided (")
    decided = {ln.split(":")[0].strip(): ln.split(":", 1)[1] for ln in lines[3:3 + len(TIMED)]}
    assert set(decided) == set(TIMED)
    assert all(v.startswith((" timed: median ", " left out: ", " skipped: ")) for v in decided.values())
    assert f"backend {chosen} (device cpu); " in out


def test_cli_plan_auto_needs_dynamic_inputs_given(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    code = main(["plan", str(model / "dyn.json"), "--backend", "auto"])
    _out, err = capsys.readouterr()
    assert code == 2
    assert "input %v has type f64[?]: give it with --set v=FILE.npy" in err and len(err.splitlines()) == 1
