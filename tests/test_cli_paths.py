"""Paths that are not graph files get one clear line, and nothing blocks on them (issue 15, item 11)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from opgraph import GraphBuilder
from opgraph.cli.main import main
from opgraph.io.formats import formats
from opgraph.io.jsonfmt import save_json

READABLE = [s for f in formats() if f.loadable for s in f.suffixes]


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("opgraph: error: ") and "Traceback" not in err, err
    return code, lines[0]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    b = GraphBuilder()
    x = b.input(("int8", (3,)), name="x")
    b.input(("float64", ()), name="scale")
    b.output(b.op("copy", x, name="y"))
    path = tmp_path / "model.json"
    save_json(b.freeze(), path)
    return path


@pytest.mark.parametrize("cmd", ["run", "info", "dump"])
def test_dev_null_is_not_a_graph_file(capsys: pytest.CaptureFixture[str], cmd: str) -> None:
    code, line = run(capsys, cmd, os.devnull)
    assert code == 1
    assert f"{os.devnull} is a character device, not a graph file" in line
    assert "no extension means a .cg file set" in line and ".cg does not exist" in line
    assert all(s in line for s in READABLE) and ".svg" not in line  # the readable formats only
    assert "No such file" not in line


def test_validate_reports_dev_null_as_an_invalid_file(capsys: pytest.CaptureFixture[str]) -> None:
    # validate reports a file it cannot read as invalid (like a malformed file), on stdout, exit 1
    code = main(["validate", os.devnull])
    out, err = capsys.readouterr()
    assert code == 1 and err == ""
    assert out.startswith(f"{os.devnull}: invalid (1 problem)")
    assert f"{os.devnull} is a character device, not a graph file" in out


def test_library_load_refuses_what_is_not_a_graph_file(tmp_path: Path) -> None:
    """opgraph.io.load makes the same checks as the CLI: a FIFO in a .cg set is refused, not read (it would block)."""
    from opgraph.errors import FormatError
    from opgraph.io import load, save

    b = GraphBuilder()
    b.output(b.op("exp", b.input(("float64", (2,)), name="x")))
    save(b.freeze(), tmp_path / "m.cg")
    os.unlink(tmp_path / "m.cgc")
    os.mkfifo(tmp_path / "m.cgc")
    with pytest.raises(FormatError, match=r"m\.cgc is a FIFO \(named pipe\), not a \.cgc file"):
        load(tmp_path / "m.cg")
    with pytest.raises(FormatError, match="is a directory, not a graph file"):
        load(tmp_path)
    (tmp_path / "e.json").write_bytes(b"")
    with pytest.raises(FormatError, match=r"e\.json is empty \(0 bytes\), not a json file"):
        load(tmp_path / "e.json")


def test_a_directory_an_empty_file_and_a_bare_name(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, line = run(capsys, "info", tmp_path)
    assert code == 1 and f"{tmp_path} is a directory, not a graph file" in line
    (tmp_path / "d.json").mkdir()
    code, line = run(capsys, "info", tmp_path / "d.json")
    assert code == 1 and "d.json is a directory, not a json file" in line and ".onnx" in line
    (tmp_path / "empty.json").write_bytes(b"")
    code, line = run(capsys, "info", tmp_path / "empty.json")
    assert code == 1 and "empty.json is empty (0 bytes), not a json file" in line
    (tmp_path / "notes").write_text("hello")
    code, line = run(capsys, "dump", tmp_path / "notes")
    assert code == 1 and "notes is a file without an extension" in line and "notes.cg does not exist" in line
    code, line = run(capsys, "info", tmp_path / "nothing")
    assert code == 1 and "nothing: No such file (nor a .cg file set" in line
    code, line = run(capsys, "info", tmp_path / "nothing.json")
    assert code == 1 and "nothing.json: No such file or directory" in line


def test_a_bare_name_next_to_its_cg_file_set_still_loads(capsys: pytest.CaptureFixture[str], model: Path,
                                                          tmp_path: Path) -> None:
    assert main(["convert", str(model), str(tmp_path / "set.cg")]) == 0
    (tmp_path / "set").mkdir()  # a directory of the same name does not hide the file set
    capsys.readouterr()
    assert main(["info", str(tmp_path / "set")]) == 0
    assert "%x" in capsys.readouterr().out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_fifo_is_refused_without_blocking(tmp_path: Path, model: Path) -> None:
    for name in ("pipe", "pipe.json", "pipe.npy"):
        os.mkfifo(tmp_path / name)
    cli = [sys.executable, "-m", "opgraph.cli.main"]
    for argv in (["info", "pipe"], ["run", "pipe.json"], ["run", str(model), "--set", "x=pipe.npy"]):
        # nothing writes to the pipes: opening one would block until the timeout
        proc = subprocess.run(cli + argv, capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert proc.returncode == 1, proc.stderr
        assert "is a FIFO (named pipe), not a" in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_run_checks_npy_paths_and_feed_values(capsys: pytest.CaptureFixture[str], model: Path,
                                              tmp_path: Path) -> None:
    code, line = run(capsys, "run", model, "--set", f"x={os.devnull}")
    assert code == 1 and f"{os.devnull} is a character device, not a .npy file" in line
    np.save(tmp_path / "wide.npy", np.array([300, -300, 1000]))
    code, line = run(capsys, "run", model, "--set", f"x={tmp_path / 'wide.npy'}")
    assert code == 1 and "input %x expects i8[3]: value 300 at index 0 does not fit in int8" in line
    np.save(tmp_path / "f.npy", np.array([1.0, 2.0, 3.0]))
    code, line = run(capsys, "run", model, "--set", f"x={tmp_path / 'f.npy'}")
    assert code == 1 and "input %x expects i8[3], got an array of dtype float64" in line
    code, line = run(capsys, "run", model, "--set", f"scal={tmp_path / 'f.npy'}")
    assert code == 1 and "no value named 'scal'; the graph's inputs: x, scale; did you mean 'scale'?" in line
    np.save(tmp_path / "ok.npy", np.array([1, -2, 3]))  # int64 values that fit: converted
    assert main(["run", str(model), "--set", f"x={tmp_path / 'ok.npy'}"]) == 0
    assert capsys.readouterr().out.strip() == f"%y = {np.array([1, -2, 3], np.int8)!r}"
