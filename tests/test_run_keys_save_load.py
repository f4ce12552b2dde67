"""Issue 16: ``run(x=...)`` and ``"%x"`` keys everywhere, ``opgraph.save``/``opgraph.load``, custom ops on load.

The reference for every result is NumPy computing the same function.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import opgraph
from opgraph.cli.main import main as cli_main
from opgraph.errors import FeedError, FormatError, GraphError, UnknownKeyError
from opgraph.runtime.compiled import Program

ENGINES = [e for e in ("jax", "torch", "onnxruntime") if importlib.util.find_spec(e) is not None]
RNG = np.random.default_rng(16)
XA = RNG.standard_normal((2, 3))
WA = RNG.standard_normal((3, 4))


def _build() -> tuple[opgraph.GraphBuilder, opgraph.Graph]:
    """tanh(x @ w) + x.sum(), inputs ``x`` (id 0) and ``w`` (id 1)."""
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3)), name="x")
    w = b.input(("float64", (3, 4)), name="w")
    b.output(b.op("add", b.op("tanh", b.op("matmul", x, w)), b.op("sum", x), name="y"))
    return b, b.freeze()


def _want(xa: np.ndarray = XA, wa: np.ndarray = WA) -> np.ndarray:
    return np.tanh(xa @ wa) + xa.sum()


@pytest.fixture(scope="module")
def graph() -> opgraph.Graph:
    return _build()[1]


# ------------------------------------------------------------------ the same keys on every path
KEYS = {
    "names": {"x": XA, "w": WA},
    "labels": {"%x": XA, "%w": WA},  # the spelling of dumps, errors and `opgraph run --set`
    "ids": {0: XA, 1: WA},
    "id labels": {"%0": XA, "1": WA},
}


@pytest.mark.parametrize("keys", list(KEYS))
def test_dict_keys_and_keywords_agree_with_numpy(graph: opgraph.Graph, keys: str) -> None:
    feeds = KEYS[keys]
    want = _want()
    np.testing.assert_allclose(graph.run(feeds)[0], want, rtol=1e-12)
    np.testing.assert_allclose(graph.run(x=XA, w=WA)[0], want, rtol=1e-12)
    np.testing.assert_allclose(graph.run({"x": XA}, w=WA)[0], want, rtol=1e-12)  # both forms in one call
    np.testing.assert_allclose(opgraph.compile(graph)(feeds)[0], want, rtol=1e-12)
    np.testing.assert_allclose(opgraph.compile(graph)(x=XA, w=WA)[0], want, rtol=1e-12)
    np.testing.assert_allclose(Program(graph, "numpy")(feeds)[0], want, rtol=1e-12)
    np.testing.assert_allclose(Program(graph, "numpy")(x=XA, w=WA)[0], want, rtol=1e-12)
    b, _ = _build()
    np.testing.assert_allclose(b.run(feeds)[0], want, rtol=1e-12)
    np.testing.assert_allclose(b.run(x=XA, w=WA)[0], want, rtol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_engines_take_the_same_keys(graph: opgraph.Graph, engine: str) -> None:
    want = _want()
    tol = dict(rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(opgraph.compile(graph, backend=engine)(x=XA, w=WA)[0], want, **tol)
    np.testing.assert_allclose(opgraph.compile(graph, backend=engine)({"%x": XA, "%w": WA})[0], want, **tol)
    np.testing.assert_allclose(graph.run(backend=engine, x=XA, w=WA)[0], want, **tol)
    np.testing.assert_allclose(graph.run({"%x": XA, 1: WA}, backend=engine)[0], want, **tol)


def test_cli_set_keys_match_run(graph: opgraph.Graph, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.json"
    opgraph.save(graph, path)
    np.save(tmp_path / "x.npy", XA)
    np.save(tmp_path / "w.npy", WA)
    out = tmp_path / "out"
    code = cli_main(["run", str(path), "--set", f"%x={tmp_path / 'x.npy'}", "--set", f"w={tmp_path / 'w.npy'}",
                     "-o", str(out)])
    capsys.readouterr()
    assert code == 0
    got = np.load(out / "y.npy")
    np.testing.assert_allclose(got, _want(), rtol=1e-12)
    np.testing.assert_array_equal(got, graph.run({"%x": XA, "%w": WA})[0])


# ------------------------------------------------------------------ errors
def test_a_keyword_and_a_key_for_one_input_is_an_error(graph: opgraph.Graph) -> None:
    b, _ = _build()
    for call in (graph.run, b.run, Program(graph, "numpy"), opgraph.compile(graph), opgraph.compile(graph, "auto")):
        with pytest.raises(FeedError, match=r"input %x is fed twice: by key 'x' and by keyword x="):
            call({"x": XA, "w": WA}, x=XA)
        with pytest.raises(FeedError, match=r"input %x is fed twice: by key 0 and by key '%x'"):
            call({0: XA, "%x": XA, "w": WA})


def test_an_unknown_keyword_lists_the_inputs(graph: opgraph.Graph) -> None:
    b, _ = _build()
    for call in (graph.run, b.run, Program(graph, "numpy"), opgraph.compile(graph)):
        with pytest.raises(UnknownKeyError, match=r"the graph's inputs: x, w; did you mean 'x'"):
            call(xx=XA, w=WA)
    with pytest.raises(UnknownKeyError, match=r"no input named 'y' \(keyword y=\), and %y is computed by the "
                                              r"graph; the graph's inputs: x, w"):
        graph.run(x=XA, w=WA, y=XA)
    with pytest.raises(UnknownKeyError, match=r"no value named '%q'; the graph's inputs: x, w"):
        graph.run({"%q": XA})


def test_an_input_named_like_a_parameter_is_fed_by_the_dict() -> None:
    b = opgraph.GraphBuilder()
    t = b.input(("float64", (3,)), name="targets")
    b.output(b.op("exp", t))
    g = b.freeze()
    ta = np.array([0.0, 1.0, 2.0])
    np.testing.assert_allclose(g.run({"targets": ta})[0], np.exp(ta), rtol=1e-12)
    for call in (g.run, Program(g, "numpy")):
        np.testing.assert_allclose(call({"targets": ta})[0], np.exp(ta), rtol=1e-12)
        with pytest.raises(UnknownKeyError, match=r"targets= is the list of values to compute: feed the input "
                                                  r"named 'targets' through the dict"):
            call(targets=np.array([0.5, 1.5, 2.5]))


# ------------------------------------------------------------------ opgraph.save / opgraph.load
@pytest.mark.parametrize("suffix", [".cg", ".json"])
def test_save_load_round_trip(graph: opgraph.Graph, tmp_path: Path, suffix: str) -> None:
    assert opgraph.save is opgraph.io.save and opgraph.load is opgraph.io.load
    path = tmp_path / f"model{suffix}"
    opgraph.save(graph, path)
    back = opgraph.load(path)
    assert back.equals(graph, check_names=True)
    xb, wb = RNG.standard_normal((2, 3)), RNG.standard_normal((3, 4))
    got = back.run(x=xb, w=wb)[0]
    np.testing.assert_array_equal(got, graph.run(x=xb, w=wb)[0])
    np.testing.assert_allclose(got, _want(xb, wb), rtol=1e-12)


# ------------------------------------------------------------------ custom ops in a fresh process
MYOPS = '''
import numpy as np
import opgraph
from opgraph.core.registry import OpDef

def _softplus(x, out=None):
    return np.logaddexp(0.0, x, out=out)

opgraph.register_op(OpDef(name="softplus", id=41616, arity=1, infer=lambda t, a: t, elementwise=True,
                          kernel=_softplus))
'''
SUFFIXES = [".cg", ".json", ".tdag.pkl", *([".graphml"] if importlib.util.find_spec("networkx") else []),
            *([".dask.pkl"] if importlib.util.find_spec("dask") else [])]


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.fixture(scope="module")
def custom_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("custom")
    (d / "myops.py").write_text(MYOPS)
    saved = _python(f"""
        import opgraph, myops
        b = opgraph.GraphBuilder()
        x = b.input(("float64", (5,)), name="x")
        b.output(b.op("softplus", x, name="y"))
        for suffix in {SUFFIXES!r}:
            opgraph.save(b.freeze(), "model" + suffix)
        """, d)
    assert saved.returncode == 0, saved.stderr
    return d


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_loading_an_unregistered_op_says_how_to_register_it(custom_files: Path, suffix: str) -> None:
    got = _python(f"""
        import opgraph
        try:
            opgraph.load("model{suffix}", allow_pickle=True)
        except opgraph.GraphError as exc:
            print(type(exc).__name__, exc)
        """, custom_files)
    assert got.returncode == 0, got.stderr
    msg = got.stdout
    assert msg.startswith("FormatError"), msg
    assert "'softplus'" in msg and "not a built-in op" in msg
    assert "registered in this process before loading" in msg and "opgraph.register_op(" in msg
    assert "import the module that registers it" in msg


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_registered_custom_op_loads_and_runs(custom_files: Path, suffix: str) -> None:
    xs = RNG.standard_normal(5) * 10
    np.save(custom_files / "x.npy", xs)
    got = _python(f"""
        import numpy as np, opgraph, myops
        g = opgraph.load("model{suffix}", allow_pickle=True)
        np.save("y{suffix}.npy", g.run(x=np.load("x.npy"))[0])
        """, custom_files)
    assert got.returncode == 0, got.stderr
    np.testing.assert_allclose(np.load(custom_files / f"y{suffix}.npy"), np.logaddexp(0.0, xs), rtol=1e-12)


def test_a_misspelt_op_kind_gets_close_names(tmp_path: Path) -> None:
    path = tmp_path / "typo.json"
    path.write_text('{"format": "opgraph", "version": 1, "ops": [{"op": "matmull"}]}')
    with pytest.raises(FormatError, match=r"unknown op kind 'matmull': it is not a built-in op; .*"
                                          r"did you mean 'matmul'"):
        opgraph.load(path)


def test_dict_dag_loader_says_the_same(tmp_path: Path) -> None:
    from opgraph.io.dag import parse_fn

    with pytest.raises(GraphError, match=r"unknown op kind 'softplus': it is not a built-in op; .*"
                                         r"opgraph\.register_op\("):
        parse_fn(("softplus", {}))


def test_cg_names_a_different_op_registered_under_the_saved_id(custom_files: Path) -> None:
    (custom_files / "otherops.py").write_text(MYOPS.replace('name="softplus"', 'name="other_softplus"'))
    got = _python("""
        import opgraph, otherops
        try:
            opgraph.load("model.cg")
        except opgraph.FormatError as exc:
            print(exc)
        """, custom_files)
    assert got.returncode == 0, got.stderr
    assert "function type 41616 was op 'softplus' when saved; this process registers 'other_softplus'" in got.stdout


def test_the_op_by_op_loop_refuses_an_input_fed_twice_too(graph: opgraph.Graph,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # programs longer than CODEGEN_LIMIT run in a loop instead of generated code: the same rule applies there
    import opgraph.backends.numpy.arena as numpy_backend

    monkeypatch.setattr(numpy_backend, "CODEGEN_LIMIT", 0)
    step = opgraph.compile(graph)
    with pytest.raises(FeedError, match=r"input %x is fed twice: by key 0 and by key '%x'"):
        step({0: XA, "%x": XA, "w": WA})
    np.testing.assert_allclose(step({"%x": XA, "w": WA})[0], graph.run({"x": XA, "w": WA})[0], rtol=0)
