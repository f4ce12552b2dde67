"""Issue 16: the `opgraph` command's messages say what is wrong and what to do; `formats` says what works here;
`optimize --level 3` and every `-o` suffix; progress reports from the library reach a sink and complete."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opgraph
import opgraph.io
from opgraph import GraphBuilder
from opgraph.cli.main import main
from opgraph.core import progress
from opgraph.errors import OPTIONAL_PACKAGES, GraphError
from opgraph.io.formats import formats, known_suffixes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest depends on tomli before 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("opgraph: error: ") and "Traceback" not in err, err
    return lines[0]


def blocked(code: str, *packages: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where ``packages`` cannot be imported (as if not installed)."""
    block = "".join(f"sys.modules[{p!r}] = None; " for p in packages)
    return subprocess.run([sys.executable, "-c", f"import sys; {block}\n{code}"], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def small_graph(updates: bool = True) -> opgraph.Graph:
    b = GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    s = b.input(("float64", ()), name="s")
    y = b.op("multiply", b.op("exp", x), 2.0, name="y")
    total = b.op("sum", y, name="total")
    b.output(y, total)
    if updates:
        b.update(b.add(s, total), s)
    return b.freeze()


def chain(n_ops: int, inputs: int = 1) -> opgraph.Graph:
    """A chain of n_ops elementwise ops (with repeated subexpressions for CSE) on f64[4] inputs."""
    b = GraphBuilder()
    xs = [b.input(("float64", (4,)), name=f"x{i}") for i in range(inputs)]
    v = xs[0]
    for i in range(n_ops // 2):
        v = b.op("add", b.op("multiply", v, 0.5), xs[i % inputs])
    b.output(v)
    return b.freeze()


# ----------------------------------------------------------------------------- missing optional packages
def test_extras_table_matches_pyproject() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    dist = {"sklearn": "scikit-learn"}
    for package, extra in OPTIONAL_PACKAGES.items():
        names = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in extras[extra]}
        assert dist.get(package, package) in names, (package, extra)


def test_missing_package_is_a_library_error_with_the_extra(tmp_path: Path) -> None:
    code = ("import opgraph, opgraph.io\n"
            "from opgraph.errors import MissingDependencyError, GraphError\n"
            "b = opgraph.GraphBuilder(); b.output(b.op('exp', b.input(('float64', (2,)), name='x')))\n"
            "try:\n    opgraph.io.save(b.freeze(), 'g.graphml')\n"
            "except MissingDependencyError as e:\n"
            "    assert isinstance(e, ImportError) and isinstance(e, GraphError) and e.name == 'networkx'\n"
            "    print(e)\n")
    proc = blocked(code, "networkx", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    msg = proc.stdout.strip()
    assert msg.startswith("saving graphml files needs the optional package networkx: pip install 'opgraph[interop]'")
    # a source checkout, and the command runs outside its root: the install line has absolute paths
    assert f"install -e '{Path(opgraph.__file__).parents[2]}[interop]'" in msg
    assert not (tmp_path / "g.graphml").exists()


def test_missing_package_on_the_command_line(tmp_path: Path) -> None:
    opgraph.io.save(small_graph(), tmp_path / "m.json")
    proc = blocked("from opgraph.cli.main import main; sys.exit(main(['convert', 'm.json', 'm.graphml']))",
                   "networkx", cwd=tmp_path)
    line = one_error_line(proc.stderr)
    assert proc.returncode == 1
    assert "needs the optional package networkx" in line and "pip install 'opgraph[interop]'" in line
    proc = blocked("from opgraph.cli.main import main; sys.exit(main(['convert', 'm.json', 'm.dask.pkl']))",
                   "dask", cwd=tmp_path)
    assert proc.returncode == 1 and "optional package dask" in one_error_line(proc.stderr)


def test_formats_says_what_works_here_and_what_to_install() -> None:
    proc = blocked("from opgraph.cli.main import main; sys.exit(main(['formats']))", "networkx", "pytensor")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in proc.stdout.splitlines() if line.startswith("│") and line.split("│")[1].strip()}
    assert rows["graphml"][1:3] == ["no: needs networkx", "no: needs networkx"]
    assert rows["pytensor"][1:3] == ["no: needs pytensor", "no: needs pytensor"]
    assert rows["json"][1:3] == ["yes", "yes"] and rows["cg"][1:3] == ["yes", "yes"]
    assert rows["dag"][1:3] == ["--allow-pickle", "yes"]
    assert "to use the formats that need networkx: pip install 'opgraph[interop]'" in proc.stdout
    # and without anything blocked, what the table says is what load/save do here
    for f in formats():
        assert f.missing() == [p for p in f.requires if not opgraph.io.formats.has_package(p)] + \
            [b for b in f.binaries if __import__("shutil").which(b) is None]


def test_backend_not_installed_and_kernel_needing_scipy() -> None:
    code = ("import numpy as np, opgraph\n"
            "from opgraph.errors import MissingDependencyError\n"
            "b = opgraph.GraphBuilder(); x = b.input(('float64', (2,)), name='x'); b.output(b.op('erf', x))\n"
            "g = b.freeze()\n"
            "for f in (lambda: opgraph.compile(g, backend='jax'), lambda: g.run({'x': np.zeros(2)})):\n"
            "    try:\n        f()\n    except MissingDependencyError as e:\n        print(e)\n")
    proc = blocked(code, "jax", "scipy")
    assert proc.returncode == 0, proc.stderr
    jax, erf = proc.stdout.splitlines()
    assert jax.startswith("backend 'jax' needs the optional package jax: pip install 'opgraph[jax]'")
    assert erf.startswith("the erf op needs the optional package scipy: pip install 'opgraph[scipy]'")


# ----------------------------------------------------------------------------- backends
def test_unknown_backend_is_named_with_the_choices(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    g = small_graph()
    with pytest.raises(opgraph.backends.BackendError) as lib:
        opgraph.compile(g, backend="foo")
    msg = str(lib.value)
    assert msg.startswith("unknown backend 'foo'; known: numpy, jax, torch, onnxruntime, dask, numba, c, auto "
                          "(installed here: numpy")
    opgraph.io.save(g, tmp_path / "m.json")
    np.save(tmp_path / "x.npy", np.ones(3))
    code, _, err = run(capsys, "run", tmp_path / "m.json", "--set", f"x={tmp_path / 'x.npy'}", "--backend", "foo")
    assert code == 1 and one_error_line(err) == f"opgraph: error: {msg}"


# ----------------------------------------------------------------------------- optimize
def test_optimize_level_3_as_documented(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    g = small_graph()
    opgraph.io.save(g, tmp_path / "m.json")
    code, _, err = run(capsys, "optimize", tmp_path / "m.json", "--level", "3", "-o", tmp_path / "o.json")
    assert code == 0, err
    got = opgraph.io.load(tmp_path / "o.json")
    assert got == opgraph.optimize(g, level=3)
    x = np.array([0.1, -0.5, 2.0])
    np.testing.assert_allclose(got.run({"x": x})[1], g.run({"x": x})[1])
    assert run(capsys, "optimize", tmp_path / "m.json", "--level", "4")[0] == 2
    code, help_text, _ = run(capsys, "optimize", "--help")
    assert "3:" in help_text and "fused_elementwise" in help_text.replace("\n", " ")


def test_optimize_output_suffixes_follow_the_format_table(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    g = small_graph(updates=False)  # ONNX and the dict forms hold no update edges
    opgraph.io.save(g, tmp_path / "m.json")
    code, help_text, _ = run(capsys, "optimize", "--help")
    flat = " ".join(help_text.split())
    for suffix in known_suffixes():
        assert suffix in flat, suffix
    expected = opgraph.optimize(g)
    tried = 0
    for f in formats():
        if f.missing():  # not usable here: the error must say so (checked above); nothing to compare
            continue
        out = tmp_path / f"o{f.suffixes[0]}"
        code, _, err = run(capsys, "optimize", tmp_path / "m.json", "-o", out)
        assert code == 0, (f.name, err)
        assert out.exists() or Path(str(out)[:-len(".cg")] + ".cg").exists(), f.name
        if f.loadable:
            back = opgraph.io.load(out, allow_pickle=True)
            x = np.array([0.1, -0.5, 2.0])
            np.testing.assert_allclose(back.run({"x": x})[1], expected.run({"x": x})[1])
        tried += 1
    assert tried >= 8
    code, _, err = run(capsys, "optimize", tmp_path / "m.json", "-o", tmp_path / "o.txt")
    assert code == 2 and "unknown file extension '.txt'" in one_error_line(err)
    assert not (tmp_path / "o.txt").exists()


def test_report_title_keeps_a_long_path_whole(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    deep = tmp_path / ("a-rather-long-directory-name-" * 4) / ("and-another-one-" * 4)
    deep.mkdir(parents=True)
    path = deep / "model_with_a_long_name.json"
    opgraph.io.save(small_graph(), path)
    code, out, _ = run(capsys, "optimize", path, "--level", "1")
    assert code == 0
    assert f"optimize {path} (level 1)" in out.splitlines()


# ----------------------------------------------------------------------------- paths, shapes, feeds
def test_info_on_a_directory_lists_its_graph_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    code, _, err = run(capsys, "info", out)
    line = one_error_line(err)
    assert code == 1 and f"{out} is a directory" in line and "holds none" in line and ".json" in line
    opgraph.io.save(small_graph(), out / "a.cg")
    opgraph.io.save(small_graph(), out / "b.json")
    (out / "notes.txt").write_text("x")
    code, _, err = run(capsys, "info", out)
    line = one_error_line(err)
    assert line.endswith(f"graph files in it: {out / 'a.cg'}, {out / 'b.json'}")


def test_input_shape_of_the_wrong_rank_names_the_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")  # the interop extra; `make test` installs it
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])
    axes = helper.make_tensor("ax", TensorProto.INT64, [1], [1])
    node = helper.make_node("ReduceSum", ["x", "ax"], ["y"], keepdims=0, name="sq")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], initializer=[axes]),
                              opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    code, _, err = run(capsys, "convert", tmp_path / "m.onnx", tmp_path / "m.json", "--input-shape", "x=7")
    line = one_error_line(err)
    assert code == 1 and "input x has rank 2 in the graph (dims N, 3)" in line
    assert "the given shape (7,) has rank 1" in line
    with pytest.raises(GraphError, match=r"input x has rank 2"):  # the library says the same
        opgraph.io.load(tmp_path / "m.onnx", input_shapes={"x": (7,)})
    from opgraph.io.onnx import OnnxImportError, from_onnx

    with pytest.raises(OnnxImportError, match=r"input x has rank 2 in the graph \(dims N, 3\) and the given "):
        from_onnx(model, input_shapes={"x": (7,)})  # from_onnx applies input_shapes: the check is there


def test_an_object_array_among_many_feeds_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    g = chain(20, inputs=10)
    opgraph.io.save(g, tmp_path / "m.json")
    args: list[object] = []
    for i in range(10):
        path = tmp_path / f"x{i}.npy"
        if i == 6:
            np.save(path, np.array([{"a": 1}, None, 2, 3], dtype=object), allow_pickle=True)
        else:
            np.save(path, np.ones(4))
        args += ["--set", f"x{i}={path}"]
    code, _, err = run(capsys, "run", tmp_path / "m.json", *args)
    line = one_error_line(err)
    assert code == 1 and f"--set x6={tmp_path / 'x6.npy'}" in line
    assert "Python objects" in line and "pickle" in line
    assert not any(f"x{i}.npy" in line for i in range(10) if i != 6)


# ----------------------------------------------------------------------------- progress
N_OPS = 100_000


def test_library_steps_report_named_tasks_that_complete(tmp_path: Path) -> None:
    from opgraph.memory import plan_memory

    g = chain(N_OPS)
    sink = progress.RecordingSink()
    with progress.installed(sink):
        opt = opgraph.optimize(g, level=1)
        plan_memory(opt)
        opgraph.compile(opt)
        (res,) = opt.run({"x0": np.ones(4)})
        opgraph.io.save(g, tmp_path / "g.json")
        opgraph.io.save(g, tmp_path / "g.cg")
        back = opgraph.io.load(tmp_path / "g.json")
        opgraph.io.load(tmp_path / "g.cg")
    assert not progress.active()
    assert back == g
    np.testing.assert_allclose(res, g.run({"x0": np.ones(4)})[0])
    names = sink.names
    for prefix in ("optimize: cse", "optimize: dce", "plan: dfs schedule", "plan: memory on the",
                   "compile: ", "run: ", f"saving {tmp_path / 'g.json'}", f"loading {tmp_path / 'g.json'}",
                   f"loading {tmp_path / 'g.json'}: parsing JSON", f"saving {tmp_path / 'g'}.cg", "loading "):
        assert any(n.startswith(prefix) for n in names), (prefix, names)
    assert sorted(sink.finished) == sorted(names)  # every task ended
    for name in names:
        total = sink.totals[name]
        if total is not None:
            assert sink.done[name] == pytest.approx(total), name  # bars reach completion
    parse = next(n for n in names if "parsing JSON" in n)
    assert sink.totals[parse] == os.path.getsize(tmp_path / "g.json")
    run_task = next(n for n in names if n.startswith("run: "))
    assert sink.totals[run_task] >= N_OPS // 2


def test_no_sink_no_reports() -> None:
    assert not progress.active()
    assert progress.task("x", total=1) is progress.NO_TASK
    items = [1, 2, 3]
    assert progress.iterate(items, "x") is items  # the executor's loop runs over the list itself


def test_command_line_progress_bars(tmp_path: Path) -> None:
    opgraph.io.save(chain(N_OPS), tmp_path / "g.json")
    cmd = [sys.executable, "-m", "opgraph.cli.main"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "100"}
    forced = subprocess.run([*cmd, "--progress", "optimize", "g.json", "-o", "o.cg"], capture_output=True,
                            text=True, cwd=tmp_path, env=env, timeout=300)
    assert forced.returncode == 0, forced.stderr
    assert "optimize: cse" in forced.stderr and "loading g.json" in forced.stderr
    assert forced.stdout.strip().endswith("ops)")
    for quiet in (["--progress", "--quiet"], []):  # --quiet wins; without a terminal no bars by default
        proc = subprocess.run([*cmd, *quiet, "plan", "g.json"], capture_output=True, text=True, cwd=tmp_path,
                              env=env, timeout=300)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("level", [0, 2])
def test_convert_a_training_step_to_onnx_with_its_updates_as_outputs(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path, level: int) -> None:
    """``convert g.cg g.onnx`` of a training step names ``--onnx-updates outputs``, which writes each new state
    value as an output ``<input>.next``; ONNX Runtime's step equals opgraph's, with the optimiser's fused ops
    (level 2: matmul_t, and sgd_momentum_update where it pays) written as their decompositions."""
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from opgraph.core.registry import get_op

    sys.path.insert(0, str(ROOT / "examples"))
    import demo

    g = demo.build_step(64).graph  # the step examples/demo.py saves as out/mlp_step.cg
    if level:
        g = opgraph.optimize(g, level=level, cost=None)
        kinds = {g.kind_of(op) for op in range(g.num_ops)}
        assert "matmul_t" in kinds and all(get_op(k).decompose for k in kinds & {"matmul_t", "sgd_momentum_update"})
    src, dst = tmp_path / "step.cg", tmp_path / "step.onnx"
    opgraph.io.save(g, src)
    code, _, err = run(capsys, "convert", src, dst)
    assert code == 1 and "--onnx-updates outputs" in one_error_line(err) and not dst.exists()
    assert run(capsys, "convert", src, tmp_path / "step.json", "--onnx-updates", "outputs")[0] == 2  # ONNX only
    code, out, err = run(capsys, "convert", src, dst, "--onnx-updates", "outputs")
    assert code == 0 and "(onnx:" in out, err
    model = onnx.load(dst)
    onnx.checker.check_model(model, full_check=True)
    state = [g.name_of(v) for v in g.updates[:, 1].tolist()]
    assert [o.name for o in model.graph.output] == [g.name_of(v) or "output_0" for v in g.outputs.tolist()] + [
        f"{n}.next" for n in state]
    rng = np.random.default_rng(7)
    feeds = {g.name_of(v): rng.standard_normal(g.type_of(v).shape) for v in g.inputs.tolist()}
    session = ort.InferenceSession(dst.read_bytes(), providers=["CPUExecutionProvider"])
    got = session.run(None, feeds)
    want = g.run(feeds, [*g.outputs.tolist(), *g.updates[:, 0].tolist()])  # the outputs, then each new state
    assert len(got) == len(want) == len(g.outputs) + len(state) > 1
    for a, w in zip(got, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-10, atol=1e-12)
