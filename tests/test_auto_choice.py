"""backend="auto"'s choice: failures named in explain(), candidates skipped by the estimates, the measurements and
the budget, and the on-disk cache of choices (a second process compiles only the chosen engine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph import backends
from opgraph.backends.base import Backend, BackendError
from opgraph.runtime import auto, choice_cache
from opgraph.runtime.auto import EngineCost, choose

COMPILED: list[str] = []
"""Names of the fake engines compiled so far (in order)."""
CALLS: dict[str, int] = {}
"""Calls of each fake engine's program."""


class Fake(Backend):
    """An engine running ``exp`` with numpy, counting its compiles and calls: ``t_broken*`` fails to compile (an
    invalid program, as onnxruntime refusing an exported model), ``t_sleepy*`` sleeps 0.1 s per call,
    ``t_slowcompile*`` 0.05 s in its compile."""

    def compile_graph(self, graph: opgraph.Graph, *, device: str | None = None, donate: Sequence[int] = (),
                      **options: Any) -> Any:
        COMPILED.append(self.name)
        if self.name.startswith("t_slowcompile"):
            time.sleep(0.05)
        if self.name.startswith("t_broken"):
            raise BackendError("[ONNXRuntimeError] : 10 : INVALID_GRAPH : Unrecognized attribute: dilations\nmore")

        def run(args: Sequence[Any]) -> list[Any]:
            CALLS[self.name] = CALLS.get(self.name, 0) + 1
            if self.name.startswith("t_sleepy"):
                time.sleep(0.1)
            return [np.exp(args[0])]

        return run


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``engines(name=EngineCost or None, ...)``: register fake engines with these cost constants; auto chooses
    among exactly the names given (numpy included where named)."""
    made: list[str] = []

    def setup(**costs: EngineCost | None) -> None:
        for name, cost in costs.items():
            if name != "numpy":
                backends.register(Fake(name, rules={"exp": np.exp}))
                made.append(name)
            if cost is not None:
                monkeypatch.setitem(auto.COSTS, name, cost)
        monkeypatch.setattr(backends, "available", lambda: tuple(costs))

    COMPILED.clear()
    CALLS.clear()
    yield setup
    for name in made:
        backends.unregister(name)


def _exp_graph(n: int | None = 4) -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (n,)), name="x")
    b.output(b.op("exp", x))
    return b.freeze()


FEEDS = {"x": np.array([0.0, 1.0, 2.0, 3.0])}


def test_an_engine_that_fails_to_compile_is_named_in_explain(engines: Any) -> None:
    engines(t_broken=None, numpy=None)  # no cost model: ranked first, compiled first, fails
    f = opgraph.compile(_exp_graph(), backend="auto", cache=False)
    np.testing.assert_array_equal(f(FEEDS)[0], np.exp(FEEDS["x"]))
    assert COMPILED == ["t_broken"] and f.choice.backend == "numpy"
    why = "BackendError: [ONNXRuntimeError] : 10 : INVALID_GRAPH : Unrecognized attribute: dilations"
    assert f.choice.failures == {"t_broken": why}  # the error's first line
    text = f.explain()
    assert f"t_broken failed ({why})" in text.splitlines()[0]
    assert f"  t_broken: failed: {why} (ranked 1; no cost model for t_broken)" in text.splitlines()


def test_only_candidates_that_can_win_are_compiled_and_timed(engines: Any) -> None:
    # dynamic shapes: the work is unknown, so the pre-ranking's call contest keeps every engine with a small compile
    engines(numpy=None,
            t_sleepy=EngineCost(0.03, 0.0, 0.0, 0.0, 0.0),  # ranked first (no overhead), 0.1 s per call
            t_dispatch=EngineCost(0.01, 0.0, 0.0, 10.0, 0.0),  # 10 s estimated per call: the measurements rule it out
            t_huge=EngineCost(100.0, 0.0, 0.0, 0.0, 0.0))  # 100 s compile estimated: more than the budget
    choice = choose(_exp_graph(None), FEEDS, budget=5.0, cache=False)
    assert choice.order == ["t_sleepy", "numpy", "t_dispatch"]
    assert COMPILED == ["t_sleepy"] and choice.backend == "numpy"
    status = choice.status()
    assert status["t_huge"].startswith("left out: compile estimated at 1e+02 s for 1 op(s), more than the whole "
                                       "budget (5 s)")
    assert status["t_dispatch"].startswith("skipped: not compiled: its overhead alone, estimated at 1e+04 ms per "
                                           "call, is more than 2x numpy's measured ")
    assert status["t_sleepy"].startswith("skipped: not timed: its warm-up calls took ")
    assert status["numpy"] == "timed" and set(choice.timings) == {"numpy"}
    # t_sleepy ran its first call and its warm-up calls (at least one, at most three), never a timing block
    assert 2 <= CALLS["t_sleepy"] <= 4 and set(choice.compile_seconds) == {"t_sleepy", "numpy"}
    decision = choice.decision()
    assert "  numpy: timed: median " in decision and " block(s) of " in decision
    assert "(ranked 2; estimated: " in decision


def test_the_budget_stops_compiling(engines: Any) -> None:
    engines(t_first=EngineCost(0.001, 0.0, 0.0, 0.0, 0.0),  # compiled first: the budget counts from its warm-up
            t_sleepy=EngineCost(0.002, 0.0, 0.0, 0.0, 0.0),  # its warm-up (>= 0.2 s) spends the 0.1 s budget
            t_late=EngineCost(0.003, 0.0, 0.0, 0.0, 0.0))
    choice = choose(_exp_graph(), FEEDS, budget=0.1, cache=False)
    assert COMPILED == ["t_first", "t_sleepy"] and choice.backend == "t_first"
    assert choice.skipped["t_late"] == "not compiled: the budget (0.1 s after the first compile) ran out"
    assert "budget 0.1 s after the first compile" in choice.decision().splitlines()[0]
    np.testing.assert_array_equal(choice.compiled(FEEDS)[0], np.exp(FEEDS["x"]))


def test_the_first_compile_scales_the_compile_estimates(engines: Any) -> None:
    engines(t_slowcompile=EngineCost(0.001, 0.0, 0.0, 0.0, 0.0),  # measured >= 50x its estimate
            t_next=EngineCost(0.004, 0.0, 0.0, 0.0, 0.0))  # so estimated at >= 0.2 s: more than the 0.1 s budget
    choice = choose(_exp_graph(), FEEDS, budget=0.1, cache=False)
    assert COMPILED == ["t_slowcompile"] and choice.backend == "t_slowcompile"
    why = choice.skipped["t_next"]
    assert why.startswith("not compiled: compile estimated at ") and why.endswith(" of the budget left")
    assert "(0.004 s by the cost model, times " in why


def test_an_engine_s_one_off_first_compile_counts_in_its_estimate(engines: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """numba's interpreter takes ~30 s to compile where no cached copy is on disk: auto must not start that."""
    engines(numpy=None, t_cold=EngineCost(0.001, 0.0, 0.0, 0.0, 0.0))
    monkeypatch.setattr(backends.get("t_cold"), "first_compile_seconds", lambda: 30.0)
    choice = choose(_exp_graph(), FEEDS, budget=5.0, cache=False)
    assert "t_cold" not in COMPILED and choice.backend == "numpy"
    assert choice.status()["t_cold"].startswith("left out: compile estimated at 30 s")
    monkeypatch.setattr(backends.get("t_cold"), "first_compile_seconds", lambda: 0.0)  # paid already
    COMPILED.clear()
    assert "t_cold" in COMPILED or "t_cold" in choose(_exp_graph(), FEEDS, budget=5.0, cache=False).compile_seconds


def test_the_choice_is_cached_on_disk(engines: Any, tmp_path: Path) -> None:
    engines(t_first=EngineCost(0.001, 0.0, 0.0, 0.0, 0.0), t_sleepy=EngineCost(0.002, 0.0, 0.0, 0.0, 0.0))
    first = choose(_exp_graph(), FEEDS, cache=tmp_path)
    files = list(tmp_path.glob("*.json"))
    assert first.backend == "t_first" and first.cached is None and len(files) == 1
    assert json.loads(files[0].read_text())["backend"] == "t_first"
    calls = dict(CALLS)
    COMPILED.clear()
    # a graph built again (another object, nothing kept in memory): only the chosen engine compiles, nothing runs
    again = choose(_exp_graph(), FEEDS, cache=tmp_path)
    assert again.cached == str(files[0]) and again.backend == "t_first" and COMPILED == ["t_first"]
    assert CALLS == calls
    assert again.status() == first.status() and again.timings == first.timings
    assert "read from the cache" in again.report() and "read from the cache" in again.decision()
    np.testing.assert_array_equal(again.compiled(FEEDS)[0], np.exp(FEEDS["x"]))
    # other shapes, or the cache turned off: chosen afresh
    COMPILED.clear()
    other = choose(_exp_graph(3), {"x": np.zeros(3)}, cache=tmp_path)
    assert other.cached is None and COMPILED == ["t_first", "t_sleepy"] and len(list(tmp_path.glob("*.json"))) == 2
    assert choose(_exp_graph(), FEEDS, cache=False).cached is None


def test_a_corrupted_cache_file_is_ignored_with_a_warning(engines: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    engines(t_first=EngineCost(0.001, 0.0, 0.0, 0.0, 0.0))
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OPGRAPH_AUTO_CACHE", "1")
    choose(_exp_graph(), FEEDS)  # the default cache: $OPGRAPH_CACHE_DIR/auto
    (path,) = (tmp_path / "auto").glob("*.json")
    key = path.stem
    for bad in ('{"backend": "t_fir', '{"format": 1, "key": "other", "backend": "t_first"}',
                json.dumps({"format": 1, "key": key, "backend": "t_first", "timings": [1, 2]})):
        path.write_text(bad)
        COMPILED.clear()
        with pytest.warns(RuntimeWarning, match=r"auto: ignoring the choice cache file .*\.json"):
            got = choose(_exp_graph(), FEEDS)
        assert got.cached is None and got.backend == "t_first" and COMPILED == ["t_first"]
        assert json.loads(path.read_text())["backend"] == "t_first"  # rewritten whole
    monkeypatch.setenv("OPGRAPH_AUTO_CACHE", "0")
    path.unlink()
    choose(_exp_graph(), FEEDS)
    assert not path.exists() and not [p for p in path.parent.iterdir() if p.suffix == ".tmp"]


def test_a_second_process_reads_the_choice(tmp_path: Path) -> None:
    script = (
        "import numpy as np, opgraph\n"
        "b = opgraph.GraphBuilder(); x = b.input(('float64', (3,)), name='x')\n"
        "b.output(b.op('tanh', b.op('exp', x)))\n"
        "f = opgraph.compile(b.freeze(), backend='auto', candidates=('numpy',))\n"
        "print(f(np.zeros(3))[0].tolist()); print(f.explain().splitlines()[0])\n")
    env = {**os.environ, "OPGRAPH_CACHE_DIR": str(tmp_path), "OPGRAPH_AUTO_CACHE": "1",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
            for _ in range(2)]
    (path,) = (tmp_path / "auto").glob("*.json")
    for r in runs:
        assert r.stdout.splitlines()[0] == str([float(np.tanh(1.0))] * 3)
    assert runs[0].stdout.splitlines()[1].startswith("auto chose numpy: numpy ")
    assert runs[1].stdout.splitlines()[1].startswith(f"auto chose numpy (read from the cache {path}: nothing timed")


def test_the_key_follows_what_the_choice_depends_on() -> None:
    g = _exp_graph()
    key = choice_cache.choice_key(g, FEEDS, ["numpy"])
    assert key == choice_cache.choice_key(_exp_graph(), {"x": FEEDS["x"] + 1}, ["numpy"])  # values aside
    assert key != choice_cache.choice_key(g, {"x": FEEDS["x"].astype(np.float32)}, ["numpy"])
    assert key != choice_cache.choice_key(g, FEEDS, ["numpy", "torch"])
    assert key != choice_cache.choice_key(g, FEEDS, ["numpy"], device="cpu")
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (4,)), name="x")
    b.output(b.op("add", x, b.const(np.arange(4.0))))
    c = opgraph.GraphBuilder()
    y = c.input(("float64", (4,)), name="x")
    c.output(c.op("add", y, c.const(np.arange(4.0) + 1)))
    assert choice_cache.graph_hash(b.freeze()) != choice_cache.graph_hash(c.freeze())  # small constants by value
