"""Fault injection into every save format: a full disk at many byte offsets, Ctrl-C while writing and while
renaming, failing fsyncs and renames, a directory in the way. After each failure the directory must hold the
previous files byte for byte, or the complete new ones, and nothing else. Also: file modes follow the umask,
and concurrent saves (threads) never share or leave a temporary."""

from __future__ import annotations

import errno
import io
import os
import signal
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import opgraph.io
from opgraph import GraphBuilder
from opgraph.core.graph import Graph

# name -> the path saved (relative to a directory); "model" alone is the .cg set of four files
FORMATS = {"cg": "model", "json": "model.json", "onnx": "model.onnx", "graphml": "model.graphml",
           "dot": "model.dot", "pickle": "model.dag.pkl"}


def old_graph() -> Graph:
    b = GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    b.output(b.op("add", b.exp(x), np.arange(3.0)))
    return b.freeze()


def new_graph() -> Graph:
    b = GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    y = b.op("multiply", b.op("sin", x), np.linspace(0.5, 1.5, 300).reshape(100, 3))
    out = b.op("subtract", y, x)
    b.name(out, "out")
    b.output(out)
    return b.freeze()


def snapshot(d: Path) -> dict[str, bytes | str]:
    """Every entry of ``d``: a file's bytes, or "<dir>"."""
    return {p.name: "<dir>" if p.is_dir() else p.read_bytes() for p in d.iterdir()}


class Case:
    """One format: a directory holding the old save, and the bytes a clean save of the new graph gives."""

    def __init__(self, fmt: str, root: Path) -> None:
        self.fmt = fmt
        self.old, self.new = old_graph(), new_graph()
        clean = root / "clean"
        clean.mkdir()
        opgraph.io.save(self.new, clean / FORMATS[fmt])
        self.new_files = snapshot(clean)
        self.dir = root / "work"
        self.dir.mkdir()
        self.path = self.dir / FORMATS[fmt]

    def reset(self) -> dict[str, bytes | str]:
        """The old graph saved afresh (nothing else in the directory); returns its files."""
        for p in self.dir.iterdir():
            p.rmdir() if p.is_dir() else p.unlink()
        opgraph.io.save(self.old, self.path)
        before = snapshot(self.dir)
        assert before != self.new_files and set(before) == set(self.new_files)
        return before

    def save_new(self) -> None:
        opgraph.io.save(self.new, self.path)

    def check(self, before: dict[str, bytes | str], what: str) -> str:
        """The directory holds exactly the old files or exactly the new ones (then loadable, equal to new)."""
        after = snapshot(self.dir)
        assert set(after) == set(before), f"{self.fmt}, {what}: litter or loss: {sorted(after)}"
        if after == before:
            return "old"
        assert after == self.new_files, f"{self.fmt}, {what}: a mixed or partial set"
        self.check_loads_new()
        return "new"

    def check_loads_new(self) -> None:
        if self.fmt == "dot":  # drawings cannot be loaded: their bytes were compared
            return
        h = opgraph.io.load(self.path, allow_pickle=True)
        if self.fmt == "onnx":  # ONNX may rewrite ops: compare what the graphs compute
            x = np.linspace(-1, 1, 3)
            want = self.new.run({int(self.new.inputs[0]): x})
            got = h.run({int(h.inputs[0]): x})
            np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
        else:
            assert h.equals(self.new, check_names=True)


@pytest.fixture(params=list(FORMATS))
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Case:
    return Case(request.param, tmp_path)


# ----------------------------------------------------------------------------- injection tools
class Budget:
    """How many more bytes the disk takes before ``fail()`` is raised (shared by all files of a save)."""

    def __init__(self, limit: int, fail: Callable[[], BaseException]) -> None:
        self.left = limit
        self.fail = fail


def limited_fdopen(budget: Budget) -> Callable[..., Any]:
    """An os.fdopen whose files fail at the raw write, as a full disk does (possibly during flush or close)."""

    class LimitedFileIO(io.FileIO):
        def write(self, b: Any) -> int:
            if self.closed:
                raise ValueError("write to closed file")
            if budget.left <= 0:
                raise budget.fail()
            data = memoryview(b).cast("B")[:budget.left]
            n = super().write(data) or 0
            budget.left -= n
            return n

    def fdopen(fd: int, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        assert mode == "wb"
        return io.BufferedWriter(LimitedFileIO(fd, "w"))

    return fdopen


def nth_call(real: Callable[..., Any], n: int, effect: Callable[..., Any]) -> Callable[..., Any]:
    """``real`` except that call number ``n`` (from 1) of this thread runs ``effect(*args)`` instead.

    Calls from other threads go to ``real`` uncounted: a library's background thread (a compile cache writing
    its files) must not take the save's turn."""
    calls = [0]
    owner = threading.get_ident()

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != owner:
            return real(*args, **kwargs)
        calls[0] += 1
        if calls[0] == n:
            return effect(*args, **kwargs)
        return real(*args, **kwargs)

    return wrapper


def count_calls(case: Case, monkeypatch: pytest.MonkeyPatch, name: str) -> int:
    """How many times a clean save of the new graph calls os.<name>."""
    real = getattr(os, name)
    calls = [0]
    owner = threading.get_ident()

    def counting(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == owner:
            calls[0] += 1
        return real(*args, **kwargs)

    case.reset()
    with monkeypatch.context() as m:
        m.setattr(os, name, counting)
        case.save_new()
    assert snapshot(case.dir) == case.new_files
    return calls[0]


def fail_with(exc: BaseException) -> Callable[..., Any]:
    def effect(*args: Any, **kwargs: Any) -> Any:
        raise exc
    return effect


# ----------------------------------------------------------------------------- the faults
def test_full_disk_and_interrupt_while_writing(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    total = sum(len(v) for v in case.new_files.values() if isinstance(v, bytes))
    offsets = sorted({0, 1, 7, 100, total // 3, total // 2, total - 1, total})
    for offset in offsets:
        for fail in (lambda: OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt):
            before = case.reset()
            budget = Budget(offset, fail)
            with monkeypatch.context() as m:
                m.setattr(os, "fdopen", limited_fdopen(budget))
                if offset >= total:  # the whole file set fits: the save succeeds
                    case.save_new()
                    assert case.check(before, "no fault") == "new"
                    continue
                with pytest.raises(type(fail())):
                    case.save_new()
            assert case.check(before, f"{fail().__class__.__name__} at byte {offset}") == "old"


def test_fsync_failures(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    n = count_calls(case, monkeypatch, "fsync")
    assert n >= 2  # the file(s), then the directory
    for k in range(1, n + 1):
        before = case.reset()
        with monkeypatch.context() as m:
            m.setattr(os, "fsync", nth_call(os.fsync, k, fail_with(OSError(errno.EIO, "I/O error"))))
            with pytest.raises(OSError, match="I/O error"):
                case.save_new()
        # the last fsync is the directory's after the renames: the new files are then in place
        assert case.check(before, f"fsync {k} of {n}") == ("new" if k == n else "old")


@pytest.mark.parametrize("no_hard_links", [False, True])
def test_rename_failures(case: Case, monkeypatch: pytest.MonkeyPatch, no_hard_links: bool) -> None:
    """Each rename fails in turn: before renaming, after renaming (Ctrl-C just after the call), or with EIO."""
    if no_hard_links:  # a file system without hard links: existing targets are moved aside instead
        monkeypatch.setattr(os, "link", fail_with(OSError(errno.EPERM, "Operation not permitted")))
    n = count_calls(case, monkeypatch, "replace")
    assert n == len(case.new_files)
    real_replace = os.replace

    def replace_then_interrupt(src: Any, dst: Any) -> None:
        real_replace(src, dst)
        raise KeyboardInterrupt

    faults: list[tuple[str, Callable[..., Any], type[BaseException]]] = [
        ("EIO", fail_with(OSError(errno.EIO, "I/O error")), OSError),
        ("Ctrl-C", fail_with(KeyboardInterrupt()), KeyboardInterrupt),
        ("Ctrl-C after it", replace_then_interrupt, KeyboardInterrupt),
    ]
    for k in range(1, n + 1):
        for what, effect, exc in faults:
            before = case.reset()
            with monkeypatch.context() as m:
                m.setattr(os, "replace", nth_call(real_replace, k, effect))
                with pytest.raises(exc):
                    case.save_new()
            state = case.check(before, f"rename {k} of {n}: {what}")
            # a set is rolled back; one file is replaced or not, as the single rename went
            assert state == ("new" if n == 1 and what == "Ctrl-C after it" else "old")


def test_directory_in_the_way(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    names = sorted(case.new_files)
    for name in names:
        # already there: refused before anything is written
        before = case.reset()
        (case.dir / name).unlink()
        (case.dir / name).mkdir()
        before[name] = "<dir>"
        with pytest.raises(IsADirectoryError):
            case.save_new()
        assert case.check(before, f"directory at {name}") == "old"

        # appears while the files are written (another process): found at the commit, rolled back
        before = case.reset()
        before[name] = "<dir>"

        def make_dir(fd: int, name: str = name) -> None:
            (case.dir / name).unlink()
            (case.dir / name).mkdir()
            os.fsync(fd)

        with monkeypatch.context() as m:
            m.setattr(os, "fsync", nth_call(os.fsync, 1, make_dir))
            with pytest.raises(IsADirectoryError):
                case.save_new()
        assert case.check(before, f"directory appearing at {name}") == "old"


def test_ctrl_c_during_the_commit_is_held_back(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real SIGINT during the renames is raised once the set is complete, not in the middle."""
    before = case.reset()
    n = len(case.new_files)

    def replace_and_signal(src: Any, dst: Any) -> None:
        real_replace(src, dst)
        os.kill(os.getpid(), signal.SIGINT)

    real_replace = os.replace
    # Python's own SIGINT handler, SIGINT unblocked: what an interactive user has. Another test in the same worker
    # process may have left a handler of its own or a signal mask behind (seen under pytest-xdist in the full suite)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    try:
        handler = signal.getsignal(signal.SIGINT)
        with monkeypatch.context() as m:
            m.setattr(os, "replace", nth_call(real_replace, 1 if n == 1 else 2, replace_and_signal))
            with pytest.raises(KeyboardInterrupt):
                case.save_new()
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, outer)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    assert case.check(before, "SIGINT during the renames") == "new"


# ----------------------------------------------------------------------------- modes, threads
@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("fmt", ["cg", "json", "dot"])
def test_modes_follow_the_umask(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / FORMATS[fmt]
    for mask in (0o022, 0o027, 0o002, 0o077):
        for p in tmp_path.iterdir():
            p.unlink()
        with umask(mask):
            opgraph.io.save(new_graph(), path)
            with open(tmp_path / "reference", "wb"):  # what a plain open() gives
                pass
        want = stat.S_IMODE((tmp_path / "reference").stat().st_mode)
        assert want == 0o666 & ~mask
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        assert set(modes.values()) == {want}, modes
    # an existing file keeps its mode when saved over, as rewriting it in place would
    for p in tmp_path.iterdir():
        p.chmod(0o640 if p.name != "reference" else 0o600)
    with umask(0o077):
        opgraph.io.save(old_graph(), path)
    assert {stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir() if p.name != "reference"} == {0o640}


@pytest.mark.parametrize("fmt", ["dot", "cg"])
def test_concurrent_saves_in_threads(tmp_path: Path, fmt: str) -> None:
    """Two threads saving different graphs to the same path: the result is one complete save, no litter."""
    graphs = [old_graph(), new_graph()]
    expected = []
    for i, g in enumerate(graphs):
        (tmp_path / str(i)).mkdir()
        opgraph.io.save(g, tmp_path / str(i) / FORMATS[fmt])
        expected.append(snapshot(tmp_path / str(i)))
    work = tmp_path / "work"
    work.mkdir()
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def worker(g: Graph) -> None:
        try:
            start.wait()
            for _ in range(15):
                opgraph.io.save(g, work / FORMATS[fmt])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(g,)) for g in graphs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert snapshot(work) in expected


def test_atomic_files_directly(tmp_path: Path) -> None:
    """The writer itself: an error in the block, and a path given twice."""
    from opgraph.core.atomic import atomic_files

    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"A")
    with pytest.raises(ZeroDivisionError), atomic_files([a, b]) as (fa, fb):
        fa.write(b"new a")
        fb.write(b"new b")
        1 / 0  # noqa: B018
    assert snapshot(tmp_path) == {"a": b"A"}
    with pytest.raises(ValueError, match="twice"), atomic_files([a, tmp_path / "." / "a"]):
        pass
    with atomic_files([a, b]) as (fa, fb):
        fa.write(b"new a")
        fb.write(b"new b")
    assert snapshot(tmp_path) == {"a": b"new a", "b": b"new b"}
