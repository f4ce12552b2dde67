"""The ``opgraph`` command: inspect, check, convert, run and print graph files.

    opgraph info FILE                      op counts, inputs/outputs, memory estimate
    opgraph validate FILE                  verify; exit 0 (ok) or 1 (listing the problems)
    opgraph convert IN OUT [--to FORMAT]   change format (chosen by OUT's extension by default)
    opgraph convert --list | opgraph formats   the formats and their suffixes
    opgraph run FILE --set NAME=x.npy ... [--get NAME ...] [-o OUTDIR]
    opgraph dump FILE                      the graph as text
    opgraph codegen FILE -o out.c          the graph as standalone C99 and a header

A file's format is chosen by its extension (:mod:`opgraph.io.formats`):
``.json`` is the JSON form, no extension or ``.cg`` a .cg file set,
``.onnx``, ``.graphml``, ... An error prints one line
``opgraph: error: ...`` on stderr and exits with 2 (bad usage) or 1 (any
other failure); ``--debug`` adds the traceback. A missing optional package
is named with the extra that installs it. Slow steps show transient rich
progress bars on a terminal's stderr (:class:`ProgressBars`, fed by
:mod:`opgraph.core.progress`); ``--progress`` forces them, ``--quiet`` hides them.

    >>> main(["--version"])
    opgraph 0.1.0
    0
    >>> main(["frobnicate"])
    2
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np

PROG = "opgraph"
_MAX_ROWS = 100
"""``info`` lists at most this many inputs, outputs and updates."""
PROGRESS_DELAY = 1.0
"""Seconds a command runs before its (transient) progress bars appear on a terminal."""


class UsageError(Exception):
    """Bad command-line usage (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


# ----------------------------------------------------------------------------- helpers
def _one_line(text: str) -> str:
    r"""Join a multi-line message (such as a list of verification problems) into one line.

    >>> _one_line("graph is invalid (2 problem(s)):\n  op 1: a\n  op 2: b")
    'graph is invalid (2 problem(s)): op 1: a; op 2: b'
    """
    out = ""
    for part in (p.strip() for p in str(text).splitlines()):
        if part:
            out = part if not out else out + (" " if out.endswith(":") else "; ") + part
    return out


def _err(message: str) -> None:
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)


def _amount_column() -> Any:
    """A rich column showing how far a task is: "3/7", a byte count as "34.6/50.6 MB", nothing without a total."""
    from rich.filesize import decimal
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Amount(ProgressColumn):
        def render(self, task: Any) -> Text:
            if task.total is None:
                return Text("")
            if "(bytes)" in task.description:
                return Text(f"{decimal(int(task.completed))}/{decimal(int(task.total))}", style="progress.download")
            return Text(f"{int(task.completed):,}/{int(task.total):,}", style="progress.download")

    return Amount()


class ProgressBars:
    """A progress sink (:mod:`opgraph.core.progress`) drawing rich bars on stderr, transient.

    Tasks are collected from the start, but the bars appear only when some task is still running ``delay``
    seconds after the first one began (so quick commands print nothing); the work runs in the calling thread,
    so errors and Ctrl-C behave as without bars. ``force_terminal`` draws them on a stderr that is not a
    terminal (``--progress``).

    >>> from opgraph.core import progress
    >>> bars = ProgressBars(delay=60.0)
    >>> with progress.installed(bars), progress.task("optimize: cse", total=10) as t:
    ...     t.advance(10)
    >>> bars.close()
    """

    def __init__(self, delay: float = PROGRESS_DELAY, force_terminal: bool = False) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True, force_terminal=True if force_terminal else None)
        self._bars = Progress(TextColumn("{task.description}", markup=False), BarColumn(), _amount_column(),
                              TimeElapsedColumn(), console=console, transient=True,
                              redirect_stdout=False, redirect_stderr=False)  # results stay on stdout
        self.delay = delay
        self._lock = threading.Lock()
        self._open = 0
        self._shown = False
        self._timer: threading.Timer | None = None

    def start(self, name: str, total: float | None) -> Any:
        """A task begins: add its bar (shown once the delay has passed)."""
        with self._lock:
            handle = self._bars.add_task(name, total=total)
            self._open += 1
            if not self._shown and self._timer is None:
                if self.delay <= 0:
                    self._show_locked()
                else:
                    self._timer = threading.Timer(self.delay, self._show)
                    self._timer.daemon = True
                    self._timer.start()
            return handle

    def advance(self, handle: Any, amount: float) -> None:
        """Move a bar."""
        self._bars.advance(handle, amount)

    def finish(self, handle: Any) -> None:
        """A task ended: remove its bar."""
        with self._lock:
            self._open -= 1
            with contextlib.suppress(KeyError):
                self._bars.remove_task(handle)

    def _show(self) -> None:
        with self._lock:
            self._timer = None
            if self._open and not self._shown:
                self._show_locked()

    def _show_locked(self) -> None:
        with contextlib.suppress(Exception):  # no usable terminal: no bars
            self._bars.start()
            self._shown = True

    def close(self) -> None:
        """Stop drawing (the transient bars are erased)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._shown:
                with contextlib.suppress(Exception):
                    self._bars.stop()
                self._shown = False


def _progress_sink(args: argparse.Namespace) -> ProgressBars | None:
    """The bars a command shows: none with --quiet; forced with --progress; else only on a terminal's stderr."""
    if getattr(args, "quiet", False):
        return None
    forced = getattr(args, "progress", False)
    if not (forced or _isatty(sys.stderr)):
        return None
    try:
        return ProgressBars(delay=0.0 if forced else PROGRESS_DELAY, force_terminal=forced)
    except Exception:  # rich missing or unusable: run without bars
        return None


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:
        return False


def _load(path: str, fmt: str | None = None, allow_pickle: bool = False, **options: Any) -> Any:
    from opgraph.io.formats import PickleRefusedError, load

    try:
        return load(path, format=fmt, allow_pickle=allow_pickle, **options)
    except PickleRefusedError as exc:
        # The library's message names allow_pickle=True; on the command line the switch is --allow-pickle.
        raise PickleRefusedError(exc.path, exc.format, "use 'opgraph convert --allow-pickle'") from None


def _save(graph: Any, path: str, fmt: str, inline_limit: int | None, onnx_updates: str | None = None,
          onnx_nan_semantics: str | None = None) -> None:
    from opgraph.io.formats import save

    options: dict[str, Any] = {} if inline_limit is None else {"inline_limit": inline_limit}
    if onnx_updates is not None:
        options["updates"] = onnx_updates  # to_onnx's updates=: "outputs" writes each new state as an output
    if onnx_nan_semantics is not None:
        options["nan_semantics"] = onnx_nan_semantics  # to_onnx's: "onnx" writes no NaN guards
    save(graph, path, format=fmt, **options)


def _human_bytes(n: int) -> str:
    """Bytes for people.

    >>> _human_bytes(100), _human_bytes(1024 ** 2)
    ('100 B', '1.0 MiB (1,048,576 bytes)')
    """
    if n < 1024:
        return f"{n} B"
    value, exp = float(n), 0
    while value >= 1024 and exp < 5:
        value /= 1024
        exp += 1
    return f"{value:.1f} {' KMGTP'[exp]}iB ({n:,} bytes)"


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a table with rich (plain text when rich is missing)."""
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        print(title)
        for row in rows:
            print("  " + "  ".join(str(c) for c in row))
        return
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=120)
    # The title (often naming a path) on its own line, never wrapped: a path broken mid-word cannot be copied.
    console.print(Text(title), soft_wrap=True)
    table = Table()
    for i, col in enumerate(columns):
        table.add_column(col, justify="right" if i and all(isinstance(r[i], int) for r in rows) else "left",
                         overflow="fold")
    for row in rows:
        table.add_row(*(Text(str(c)) for c in row))  # Text: names are not markup
    console.print(table)


def _file_stem(label: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.+-]", "_", label.lstrip("%"))
    return "_" + stem[1:] if stem.startswith(".") else stem


# ----------------------------------------------------------------------------- commands
def _cmd_info(args: argparse.Namespace) -> int:
    """``opgraph info FILE``."""
    from opgraph.core.registry import get_op
    from opgraph.core.subgraph import subgraphs_of
    from opgraph.core.types import TensorType

    g = _load(args.file)
    ids, counts = np.unique(g.op_kind, return_counts=True)
    kinds = {get_op(int(k)).name: int(c) for k, c in zip(ids, counts, strict=True)}
    per_type = np.bincount(g.value_type, minlength=len(g.types))
    static_bytes, dynamic = 0, 0
    for t, count in zip(g.types, per_type.tolist(), strict=True):
        nb = t.nbytes if isinstance(t, TensorType) else 0
        if nb is None:
            dynamic += count
        else:
            static_bytes += nb * count
    const_bytes = sum(int(c.nbytes) for c in g.constants)
    summary = [
        ("file", args.file),
        ("ops", g.num_ops),
        ("values", g.num_values),
        ("constants", len(g.constants)),
        ("inputs", len(g.inputs)),
        ("outputs", len(g.outputs)),
        ("updates", len(g.updates)),
        ("values of static type", _human_bytes(static_bytes)),
        ("values of dynamic type (not counted)", dynamic),
        ("constants data", _human_bytes(const_bytes)),
        ("memory estimate (values + constants)", _human_bytes(static_bytes + const_bytes)),
    ]
    _table("graph", ("", "value"), summary)
    _table("ops by kind", ("kind", "count"), sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    gateways = [("input", g.value_label(int(v)), repr(g.type_of(int(v)))) for v in g.inputs]
    gateways += [("output", g.value_label(int(v)), repr(g.type_of(int(v)))) for v in g.outputs]
    gateways += [("update", f"{g.value_label(int(s))} -> {g.value_label(int(d))}", repr(g.type_of(int(d))))
                 for s, d in g.updates]
    if len(gateways) > _MAX_ROWS:
        gateways = [*gateways[:_MAX_ROWS], ("...", f"{len(gateways) - _MAX_ROWS} more", "")]
    _table("inputs and outputs", ("role", "value", "type"), gateways)
    bodies = subgraphs_of(g, recursive=True)
    if bodies:  # each once, bodies of bodies too
        rows = [(b.name or "<body>", f"({', '.join(map(repr, b.in_types))}) -> ({', '.join(map(repr, b.out_types))})",
                 b.graph.num_ops) for b in bodies]
        if len(rows) > _MAX_ROWS:
            rows = [*rows[:_MAX_ROWS], ("...", f"{len(rows) - _MAX_ROWS} more", "")]
        _table("subgraphs (bodies of control-flow ops)", ("name", "signature", "ops"), rows)
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    """``opgraph validate FILE``: 0 when the graph verifies, else 1 with the problems on stdout."""
    from opgraph.errors import FormatError, VerifyError

    problems: list[str] = []
    try:
        g = _load(args.file)
        g.verify()
    except FormatError as exc:
        if isinstance(exc.__cause__, VerifyError):
            problems = list(exc.__cause__.problems)
        else:
            msg = str(exc)
            problems = [msg[len(args.file) + 2:] if msg.startswith(args.file + ": ") else msg]
    except VerifyError as exc:
        problems = list(exc.problems)
    if problems:
        print(f"{args.file}: invalid ({len(problems)} problem{'s' if len(problems) != 1 else ''})")
        for p in problems:
            print(f"  {_one_line(p)}")
        return 1
    print(f"{args.file}: ok ({g.num_ops} ops, {g.num_values} values, {len(g.constants)} constants)")
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    """``opgraph convert IN OUT [--to F] [--from F] [--allow-pickle] [--inline-limit N] [--input-shape N=D,...]
    [--onnx-updates refuse|outputs] [--onnx-nan-semantics numpy|onnx]``."""
    from opgraph.io.formats import UnknownFormatError, format_for_path

    if args.inline_limit is not None and args.inline_limit < 0:
        raise UsageError("--inline-limit must be >= 0")
    try:
        src = format_for_path(args.input, args.from_format)
        dst = format_for_path(args.output, args.to)
    except UnknownFormatError as exc:  # a misspelt extension is a usage problem: say what exists
        raise UsageError(f"{exc}; or choose with --from/--to") from None
    if not src.loadable:
        raise UsageError(f"{args.input}: {src.name} files are drawings; they cannot be converted back")
    if args.inline_limit is not None and dst.name != "json":
        raise UsageError("--inline-limit applies to JSON output only")
    if args.onnx_updates is not None and dst.name != "onnx":
        raise UsageError("--onnx-updates applies to ONNX output only")
    if args.onnx_nan_semantics is not None and dst.name != "onnx":
        raise UsageError("--onnx-nan-semantics applies to ONNX output only")
    options = {}
    if args.input_shape:
        if src.name != "onnx":
            raise UsageError("--input-shape applies to ONNX input only")
        options["input_shapes"] = dict(_input_shape(item) for item in args.input_shape)
    g = _load(args.input, src.name, args.allow_pickle, **options)
    _save(g, args.output, dst.name, args.inline_limit, args.onnx_updates, args.onnx_nan_semantics)
    print(f"{args.input} -> {args.output} ({dst.name}: {g.num_ops} ops, {g.num_values} values)")
    return 0


def _input_shape(item: str) -> tuple[str, tuple[int, ...]]:
    """Parse ``NAME=D1,D2,...`` (``--input-shape``).

    >>> _input_shape("x=1,3,224,224"), _input_shape("scalar=")
    (('x', (1, 3, 224, 224)), ('scalar', ()))
    """
    name, sep, dims = item.partition("=")
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError:
        shape = (-1,)
    if not sep or not name or any(d < 0 for d in shape):
        raise UsageError(f"--input-shape expects NAME=D1,D2,... with sizes >= 0, got {item!r}")
    return name, shape


class _ListFormats(argparse.Action):
    """``convert --list``: print the formats and exit, like ``--help`` (so IN and OUT stay required)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        _cmd_formats(namespace)
        parser.exit(0)


def _cmd_formats(args: argparse.Namespace) -> int:
    """``opgraph formats`` (and ``opgraph convert --list``): the table of formats."""
    from opgraph.io.formats import formats

    rows, hints = [], {}
    for f in formats():
        missing = f.missing()
        here = "yes" if not missing else "no: needs " + ", ".join(missing)
        load = "no (drawing)" if not f.loadable else (here if missing else "--allow-pickle" if f.pickle else "yes")
        rows.append((f.name, " ".join(f.suffixes), load, here, f.round_trip, f.description))
        for m in missing:
            hints[m] = _install_hint(m)
    _table("formats (chosen by the longest matching suffix; no extension: cg)",
           ("format", "suffixes", "load here", "save here", "round trip", "description"), rows)
    for m, hint in hints.items():
        print(f"to use the formats that need {m}: {hint}")
    return 0


def _install_hint(missing: str) -> str:
    """How to install a missing package (or Graphviz's ``dot`` program).

    >>> _install_hint("networkx").startswith("pip install 'opgraph[interop]'")
    True
    """
    if missing == "dot":
        from opgraph.viz import INSTALL_HINT

        return INSTALL_HINT
    from opgraph.errors import install_hint

    return install_hint(missing)


def _cmd_run(args: argparse.Namespace) -> int:
    """``opgraph run FILE --set NAME=x.npy ... [--get NAME ...] [-o OUTDIR]``."""
    from opgraph.core.atomic import atomic_files
    from opgraph.core.feeds import value_id

    _set_items(args.set)  # a malformed --set is refused before the graph loads
    g = _load(args.file)
    feeds = read_feeds(g, args.set)
    if args.get:
        targets = [value_id(g, name) for name in args.get]
    else:
        targets = [int(v) for v in g.outputs]
        if not targets:
            raise UsageError("the graph declares no outputs; choose values with --get NAME")
    if args.backend == "auto":  # Graph.run's choice (kept on the graph), with this command's budget, reported
        from opgraph.runtime.auto import cached_choice, run_auto

        results = run_auto(g, feeds, targets, budget=args.budget)
        print(f"{PROG}: {cached_choice(g).report()}", file=sys.stderr)  # type: ignore[union-attr]
    else:
        results = g.run(feeds, targets, backend=args.backend)
    if args.outdir is None:
        for v, arr in zip(targets, results, strict=True):
            print(f"{g.value_label(v)} = {arr!r}")
        return 0
    os.makedirs(args.outdir, exist_ok=True)
    written: dict[str, int] = {}
    for v, arr in zip(targets, results, strict=True):
        stem = _file_stem(g.value_label(v))
        if written.get(stem, v) != v:
            raise ValueError(f"two values would both be saved as {stem}.npy")
        written[stem] = v
        path = os.path.join(args.outdir, stem + ".npy")
        with atomic_files([path]) as (f,):
            np.save(f, np.asarray(arr), allow_pickle=False)
        print(f"wrote {path}")
    return 0


def _set_items(items: Sequence[str] | None) -> list[tuple[str, str]]:
    """``--set NAME=FILE.npy`` arguments as (name, path) pairs.

    >>> _set_items(["x=a.npy"])
    [('x', 'a.npy')]
    """
    settings = []
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--set expects NAME=FILE.npy, got {item!r}")
        settings.append((name, path))
    return settings


def read_feeds(g: Any, items: Sequence[str] | None) -> dict[int, np.ndarray]:
    """The feeds of ``--set NAME=FILE.npy`` arguments, by input id (an unknown name lists the inputs).

    >>> read_feeds(None, [])
    {}
    """
    from opgraph.core.feeds import input_id

    feeds: dict[int, np.ndarray] = {}
    for name, path in _set_items(items):
        v = input_id(g, name, verb="set")  # an unknown name lists the inputs and close names
        feeds[v] = _load_npy(path, name)
    return feeds


_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a .npz archive (an empty one has only the end record)
_TRIED = "tried .npy (a NumPy array file, starting with the bytes \\x93NUMPY) and .npz (a zip archive)"


def _load_npy(path: str, name: str) -> np.ndarray:
    """The array of a ``--set NAME=PATH`` file; every error names the file, the input and the byte offset.

    The header is read and checked first (``numpy.lib.format``), so a file that is not a .npy file is
    refused for what it is, and a truncated one by the byte offset where its data stops short.

    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x.npy")
    >>> with open(p, "wb") as f:
    ...     _ = f.write(b"hello")
    >>> _load_npy(p, "x")
    Traceback (most recent call last):
      ...
    opgraph.errors.FormatError: --set x=...x.npy: not a value file opgraph can read (tried .npy ... byte offset 0 ...
    """
    from opgraph.errors import FormatError
    from opgraph.io.formats import check_regular_file

    check_regular_file(path, "a .npy file")
    where = f"--set {name}={path}"
    with open(path, "rb") as f:
        head = f.read(len(_NPY_MAGIC))
        if head.startswith(_ZIP_MAGICS):
            raise FormatError(f"{where}: expected a .npy file holding one array, got a .npz archive")
        if not head.startswith(_NPY_MAGIC):
            if len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5:  # pickle protocols 2-5 start so
                raise FormatError(f"{where}: the file is a Python pickle, not a .npy file; opgraph refuses pickles "
                                  "because loading them can run arbitrary code: save the array with numpy.save")
            raise FormatError(f"{where}: not a value file opgraph can read ({_TRIED}): at byte offset 0 it holds "
                              f"{head!r}, not the .npy magic {_NPY_MAGIC!r}")
        f.seek(0)
        try:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _fortran, dtype = read(f)
        except (ValueError, EOFError, SyntaxError) as exc:
            raise FormatError(f"{where}: a .npy file whose header (from byte offset {len(_NPY_MAGIC) + 2}) cannot "
                              f"be read: {exc}") from None
        data_at = f.tell()
    if dtype.hasobject:
        raise FormatError(f"{where}: the file holds an array of Python objects (dtype object); "
                          "opgraph refuses those because loading them needs pickle, which can run arbitrary "
                          "code: save a numeric array instead")
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
    size = os.path.getsize(path)
    if size - data_at < need:
        raise FormatError(f"{where}: a truncated .npy file: its header declares {dtype} {tuple(shape)} "
                          f"({need} bytes from byte offset {data_at}), but the file ends at byte offset {size}")
    try:
        return np.load(path, allow_pickle=False)  # type: ignore[no-any-return]
    except (ValueError, EOFError) as exc:
        raise FormatError(f"{where}: not a readable .npy file: {exc}") from None


def _cmd_dump(args: argparse.Namespace) -> int:
    """``opgraph dump FILE [--limit N]``."""
    g = _load(args.file)
    print(g.dump(limit=args.limit or None))
    return 0


# ----------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``opgraph`` command.

    >>> build_parser().parse_args(["dump", "g.json"]).command
    'dump'
    """
    from opgraph._version import __version__  # the root package would import every layer

    parser = _Parser(prog=PROG, description="Inspect, check, convert, run and print opgraph graph files "
                                            "(.json: the JSON form; no extension or .cg: a .cg file set; "
                                            "'opgraph formats' lists the others).")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument("--progress", action="store_true",
                        help="draw progress bars on stderr even when it is not a terminal (and at once)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    common.add_argument("--progress", action="store_true", default=argparse.SUPPRESS,
                        help="draw progress bars on stderr even when it is not a terminal (and at once)")
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress bars")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("info", parents=[common], help="op counts, inputs and outputs, memory estimate")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("validate", parents=[common], help="verify a graph file (exit 0 if valid, 1 if not)")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(func=_cmd_validate)

    from opgraph.io.formats import formats

    names = [f.name for f in formats()]
    p = sub.add_parser("convert", parents=[common], help="convert between formats (see 'opgraph formats')",
                       description="Load IN and save it as OUT; formats are chosen by the files' extensions "
                                   "(the longest matching suffix) unless --from/--to name them.")
    p.add_argument("input", metavar="IN")
    p.add_argument("output", metavar="OUT")
    p.add_argument("--to", choices=names, metavar="FORMAT",
                   help=f"output format (default: by OUT's extension): {', '.join(names)}")
    p.add_argument("--from", dest="from_format", choices=[f.name for f in formats() if f.loadable],
                   metavar="FORMAT", help="input format (default: by IN's extension)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="allow loading IN when it is a pickle (.dag.pkl, .dask.pkl, ...): pickles can run "
                        "arbitrary code when loaded, so use this only for files you trust")
    p.add_argument("--inline-limit", type=int, metavar="N",
                   help="JSON: constants with more than N elements are stored as base64 (default 256)")
    p.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                   help="ONNX input: fix the shape of an input with symbolic dimensions (repeatable)")
    p.add_argument("--onnx-updates", choices=("refuse", "outputs"),
                   help="ONNX output of a graph with update edges (a training step): 'outputs' writes each new "
                        "state value as an extra output named after its input (w.next for w), which the caller "
                        "feeds back; default 'refuse' (ONNX models have no state)")
    p.add_argument("--onnx-nan-semantics", choices=("numpy", "onnx"),
                   help="ONNX output: 'onnx' writes max pools, max/min reductions, argmax and argmin as ONNX's "
                        "operators alone (what a model imported from ONNX computed); default 'numpy' adds the "
                        "guards that make them propagate NaN as opgraph (NumPy) does")
    p.add_argument("--list", action=_ListFormats, help="list the formats and their suffixes, then exit")
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("formats", parents=[common], help="list the file formats and their suffixes")
    p.set_defaults(func=_cmd_formats)

    p = sub.add_parser("run", parents=[common], help="evaluate a graph on .npy inputs")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--set", action="append", metavar="NAME=FILE.npy", help="feed an input (repeatable)")
    p.add_argument("--get", action="append", metavar="NAME",
                   help="value to compute (repeatable; default: the graph's outputs)")
    p.add_argument("-o", "--outdir", metavar="OUTDIR", help="save each result as OUTDIR/NAME.npy instead of printing")
    p.add_argument("--backend", default="numpy",
                   help="backend to run on: numpy (default), jax, torch, onnxruntime or auto (the fastest installed; "
                        "the choice is reported on stderr)")
    p.add_argument("--budget", type=float, default=2.0, metavar="SECONDS",
                   help="with --backend auto: seconds to spend, after the first engine's compile, compiling and "
                        "timing the others that can win (default 2)")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("dump", parents=[common], help="print the graph as text")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--limit", type=int, default=2000, metavar="N", help="print at most N ops (0: all; default 2000)")
    p.set_defaults(func=_cmd_dump)

    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).add_parser(sub, common)
    return parser


COMMAND_MODULES: tuple[str, ...] = ("opgraph.cli.optimize_cmd", "opgraph.cli.plan_cmd", "opgraph.cli.viz_cmd",
                                     "opgraph.cli.codegen_cmd")
"""Modules adding more subcommands; each has ``add_parser(subparsers, common)``, which adds its
parser with ``parents=[common]`` and sets ``func`` (a function of the parsed args returning the exit status).
Helpers for them (``load_graph``, ``save_graph``, ``print_table``, :func:`read_feeds`) are the ones below."""


def load_graph(path: str) -> Any:
    """Load a graph file for a subcommand (the loader reports its progress)."""
    return _load(path)


def save_graph(graph: Any, path: str, fmt: str | None = None) -> None:
    """Save a graph for a subcommand in the format of ``path``'s extension (or ``fmt``)."""
    from opgraph.io.formats import format_for_path

    _save(graph, path, format_for_path(path, fmt).name, None)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a rich table the way every subcommand does."""
    _table(title, columns, rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``opgraph`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        _err(str(exc))
        return 2
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else 0
    if args.command is None:
        _err(f"choose a command (see '{PROG} --help')")
        return 2
    from opgraph.core import progress

    sink = _progress_sink(args)
    previous = progress.install(sink) if sink is not None else None
    try:
        return int(args.func(args))
    except UsageError as exc:
        _err(f"{exc} (see '{PROG} {args.command} --help')")
        return 2
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:  # e.g. `opgraph dump big.json | head`
        with contextlib.suppress(Exception):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        _err(_describe(exc, args.debug))
        return 1
    finally:
        if sink is not None:
            sink.close()
            progress.install(previous)


def _describe(exc: BaseException, debug: bool) -> str:
    from opgraph.errors import GraphError
    from opgraph.io.formats import missing_dependency

    if isinstance(exc, ImportError):  # an optional package missing: say which extra installs it
        exc = missing_dependency(exc, "this command") or exc
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    if isinstance(exc, (GraphError, OSError, ValueError, ImportError)):
        return str(exc) or type(exc).__name__
    hint = "" if debug else " (run with --debug for a traceback)"
    return f"{type(exc).__name__}: {exc}{hint}"


if __name__ == "__main__":
    raise SystemExit(main())
