"""Messages at the edges (issue 32, point 7): each names what the user gave.

``opgraph run --set`` with a file that is not a .npy file; saving where the
user cannot write (the target named, never the temporary); running out of
memory in a compiled call (the op, the bytes, the memory_limit setting); and
DeprecationWarnings from generated NumPy programs turned into errors by the
project's warning filters.
"""

from __future__ import annotations

import builtins
import errno
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import tomllib

import opgraph
from opgraph import GraphBuilder
from opgraph.backends.numpy import arena, codegen
from opgraph.cli.main import main
from opgraph.core.atomic import atomic_files
from opgraph.io.jsonfmt import save_json

ROOT = Path(__file__).resolve().parent.parent


def error_line(capsys: pytest.CaptureFixture[str], *argv: object) -> str:
    code = main([str(a) for a in argv])
    _, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("opgraph: error: "), err
    return lines[0]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    b = GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    b.output(b.op("maximum", x, 0.5, name="y"))
    path = tmp_path / "ok.json"
    save_json(b.freeze(), path)
    return path


# ----------------------------------------------------------------------------- --set with a file it cannot read
def test_set_with_random_bytes_names_the_file_the_formats_and_the_offset(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, model: Path) -> None:
    garbage = tmp_path / "garbage.json"
    data = b"\x07" + np.random.default_rng(0).bytes(199)  # no magic of .npy, .npz or pickle at byte 0
    garbage.write_bytes(data)
    line = error_line(capsys, "run", model, "--set", f"x={garbage}")
    assert f"--set x={garbage}" in line and "not a value file opgraph can read" in line
    assert ".npy" in line and ".npz" in line and "byte offset 0" in line and repr(data[:6]) in line
    assert "Python objects" not in line and "dtype object" not in line


def test_set_with_a_truncated_npy_names_where_the_data_stops(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, model: Path) -> None:
    good = tmp_path / "good.npy"
    np.save(good, np.array([1.0, 2.0, 3.0]))
    whole = good.read_bytes()
    cut = tmp_path / "cut.npy"
    cut.write_bytes(whole[:-5])
    line = error_line(capsys, "run", model, "--set", f"x={cut}")
    header_end = len(whole) - 3 * 8  # NumPy wrote 24 bytes of data after the header
    assert f"--set x={cut}" in line and "truncated" in line
    assert f"byte offset {header_end}" in line and f"ends at byte offset {len(whole) - 5}" in line
    # the whole file still runs, and gives NumPy's answer
    code = main(["run", str(model), "--set", f"x={good}"])
    out, _ = capsys.readouterr()
    assert code == 0 and repr(np.maximum(np.array([1.0, 2.0, 3.0]), 0.5)) in out


def test_set_with_a_pickle_or_a_bad_header(capsys: pytest.CaptureFixture[str], tmp_path: Path, model: Path) -> None:
    import pickle

    pkl = tmp_path / "x.pkl"
    pkl.write_bytes(pickle.dumps([1.0, 2.0, 3.0], protocol=4))
    line = error_line(capsys, "run", model, "--set", f"x={pkl}")
    assert f"--set x={pkl}" in line and "pickle" in line and "Python objects" not in line
    good = tmp_path / "good.npy"
    np.save(good, np.zeros(3))
    whole = good.read_bytes()
    bad = tmp_path / "bad.npy"
    bad.write_bytes(whole[:12] + b"zzzz" + whole[16:])  # a header dict that is not NumPy's
    line = error_line(capsys, "run", model, "--set", f"x={bad}")
    assert f"--set x={bad}" in line and "header" in line and "byte offset 8" in line


# ----------------------------------------------------------------------------- saving where one cannot write
@pytest.mark.skipif(not os.path.isdir("/proc/self") or not os.path.isdir("/sys/kernel"), reason="Linux only")
def test_saving_into_proc_names_the_target(capsys: pytest.CaptureFixture[str], model: Path) -> None:
    """/proc and /sys refuse new files even to root (ENOENT and EACCES)."""
    line = error_line(capsys, "convert", model, "/proc/o.json")
    assert line.startswith("opgraph: error: /proc/o.json: ") and ".tmp" not in line and "/proc" in line
    with pytest.raises(OSError) as info, atomic_files(["/proc/o.json"]) as (f,):
        f.write(b"never")
    assert info.value.filename == "/proc/o.json" and ".tmp" not in str(info.value)
    assert ".tmp" in str(info.value.__cause__)  # the temporary is only a detail, in the chained original
    line = error_line(capsys, "convert", model, "/sys/o.json")
    assert line == "opgraph: error: /sys/o.json: cannot create it in /sys: Permission denied"
    with pytest.raises(PermissionError) as denied, atomic_files(["/sys/o.json"]):
        pass
    assert denied.value.filename == "/sys/o.json"


def test_saving_into_a_missing_directory_names_it(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                  model: Path) -> None:
    target = tmp_path / "nodir" / "o.json"
    line = error_line(capsys, "convert", model, target)
    assert line == f"opgraph: error: {target}: no such directory {tmp_path / 'nodir'}"
    with pytest.raises(FileNotFoundError) as info, atomic_files([target]):
        pass
    assert info.value.filename == str(target) and info.value.errno == errno.ENOENT


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="root writes into a mode-0500 directory: the permission check does not bite")
def test_saving_into_a_read_only_directory_names_the_target(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                            model: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        line = error_line(capsys, "convert", model, locked / "o.json")
        assert line.startswith(f"opgraph: error: {locked / 'o.json'}: ") and "Permission denied" in line
        assert ".tmp" not in line
        with pytest.raises(PermissionError) as info, atomic_files([locked / "o.json"]):
            pass
        assert info.value.filename == str(locked / "o.json")
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o700)


def test_a_full_disk_while_writing_names_the_target(tmp_path: Path) -> None:
    target = tmp_path / "o.bin"
    target.write_bytes(b"old")
    with pytest.raises(OSError) as info, atomic_files([target]) as (f,):
        f.write(b"new")
        raise OSError(errno.ENOSPC, "No space left on device")  # as a raw write on a full disk raises it
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert "No space left on device" in info.value.strerror
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["o.bin"]


# ----------------------------------------------------------------------------- out of memory during a call
# 10**8 x 10**8 float64 = 8e16 bytes: beyond any address space, so NumPy refuses at once, whatever the
# overcommit setting; the inputs are one element, broadcast as a view.
N = 10**8
HUGE = N * N * 8


def huge_graph(as_output: bool) -> opgraph.Graph:
    b = GraphBuilder()
    x = b.input(("float64", (1, 1)), name="x")
    big = b.op("exp", b.op("broadcast_to", x, shape=(N, N)), name="big")
    b.output(big if as_output else b.op("sum", big, name="total"))
    return b.freeze()


def exp_op(g: opgraph.Graph) -> int:
    return next(op for op in range(g.num_ops) if g.kind_of(op) == "exp")


@pytest.mark.parametrize("codegen_limit", [arena.CODEGEN_LIMIT, 0], ids=["generated", "loop"])
def test_a_call_out_of_memory_names_the_op_the_bytes_and_the_limit(monkeypatch: pytest.MonkeyPatch,
                                                                   codegen_limit: int) -> None:
    monkeypatch.setattr(arena, "CODEGEN_LIMIT", codegen_limit)
    g = huge_graph(as_output=True)  # an output: its buffer is allocated by each call
    f = opgraph.compile(g, memory_limit=None)
    with pytest.raises(opgraph.OutOfMemoryError) as info:
        f(x=np.ones((1, 1)))
    e = info.value
    assert isinstance(e, MemoryError) and isinstance(e, opgraph.ExecutionError)
    op = exp_op(g)
    # the loop path allocates the output's buffer with up to 64 bytes of alignment padding
    assert e.op == op and e.requested is not None and HUGE <= e.requested <= HUGE + 64 and e.limit is None
    text = str(e)
    assert f"op {op} (exp), named 'big'" in text and f"{e.requested} bytes" in text and "memory_limit=None" in text


def test_an_arena_out_of_memory_at_compile_names_the_largest_buffers_op() -> None:
    g = huge_graph(as_output=False)  # an intermediate: in the arena, allocated by compile
    with pytest.raises(opgraph.OutOfMemoryError) as info:
        opgraph.compile(g, memory_limit=None)
    e = info.value
    op = exp_op(g)
    assert e.op == op and e.requested is not None and e.requested >= HUGE and e.limit is None
    assert f"op {op} (exp), named 'big'" in str(e) and "memory_limit=None" in str(e)


def test_graph_run_out_of_memory_names_the_op() -> None:
    g = huge_graph(as_output=True)
    with pytest.raises(opgraph.OutOfMemoryError) as info:
        g.run({"x": np.ones((1, 1))})
    assert info.value.op == exp_op(g) and info.value.requested == HUGE
    assert "Graph.run" in str(info.value) and "named 'big'" in str(info.value)


def test_a_set_limit_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    limit = 1 << 62  # above the plan (8e16), so compile accepts it; NumPy still cannot allocate
    f = opgraph.compile(huge_graph(as_output=True), memory_limit=limit)
    with pytest.raises(opgraph.OutOfMemoryError) as info:
        f(x=np.ones((1, 1)))
    assert info.value.limit == limit and f"memory_limit={limit}" in str(info.value)


# ----------------------------------------------------------------------------- DeprecationWarnings of generated code
def configured_filters() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(config["tool"]["pytest"]["ini_options"]["filterwarnings"])


def apply_filter(entry: str) -> None:
    """One ``action:message:category:module`` line as pytest applies an ini entry (module as a regex)."""
    action, message, category, module = [*entry.split(":"), "", "", ""][:4]
    warnings.filterwarnings(action, message=message, category=getattr(builtins, category or "Warning"),
                            module=module)


def maximum_program() -> opgraph.Graph:
    b = GraphBuilder()
    x = b.input(("float64", (4,)), name="x")
    b.output(b.op("minimum", b.op("maximum", x, 0.5), 2.0))
    return b.freeze()


def test_generated_programs_pass_out_by_keyword_to_maximum_and_minimum() -> None:
    f = opgraph.compile(maximum_program())
    x = np.array([-1.0, 0.0, 1.0, 3.0])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = f(x=x)[0]
    assert not [w for w in seen if issubclass(w.category, DeprecationWarning)], [str(w.message) for w in seen]
    np.testing.assert_array_equal(got, np.minimum(np.maximum(x, 0.5), 2.0))
    assert f.code.count("out=") >= 2


def test_a_deprecation_warning_in_a_generated_program_is_an_error_under_the_project_filters(
        monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [e for e in configured_filters() if "DeprecationWarning" in e]
    assert entries, "pyproject.toml no longer turns DeprecationWarnings into errors"
    monkeypatch.setattr(codegen, "KEYWORD_OUT", frozenset())  # the old code: np.maximum(x, y, out)
    f = opgraph.compile(maximum_program())
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for entry in entries:
            apply_filter(entry)
        with pytest.raises(opgraph.ExecutionError) as info:
            f(x=np.zeros(4))
    assert isinstance(info.value.__cause__, DeprecationWarning)
    assert "positional" in str(info.value.__cause__)
    with warnings.catch_warnings(record=True) as seen:  # what the filter matched: the generated module's name
        warnings.simplefilter("always")
        f(x=np.zeros(4))
    modules = {w.filename for w in seen if issubclass(w.category, DeprecationWarning)}
    assert modules and all(m.startswith("<opgraph program") for m in modules)


def test_the_lazy_numpy_frontend_keeps_the_error_a_memory_error_and_names_the_users_line() -> None:
    import opgraph.numpy as onp

    a = onp.exp(onp.broadcast_to(onp.asarray(np.ones((1, 1))), (N, N)))
    with pytest.raises(opgraph.OutOfMemoryError) as info:
        np.asarray(a)
    assert isinstance(info.value, MemoryError) and info.value.requested == HUGE
    assert "(exp)" in str(info.value) and f"evaluating the array built at {__file__}" in str(info.value)
