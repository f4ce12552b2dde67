"""The registry of graph file formats behind :func:`opgraph.io.save`, :func:`opgraph.io.load` and ``opgraph convert``.

Each :class:`Format` has a name, the file suffixes that select it, a
``save`` and (unless it is a drawing) a ``load`` function, and a short
description. :func:`format_for_path` picks the format of a path by its
longest matching suffix (case-insensitive); a path without an extension is
a .cg file set.

==============  ============================================  =========================================
format          suffixes                                      what
==============  ============================================  =========================================
``cg``          ``.cg .cgc .cgio .cgs`` (and no extension)    TensCalc .cg file set (:mod:`opgraph.io.cg`)
``json``        ``.json``                                     the JSON form (:mod:`opgraph.io.jsonfmt`)
``onnx``        ``.onnx``                                     ONNX model (:mod:`opgraph.io.onnx`)
``graphml``     ``.graphml``                                  the networkx bipartite form as GraphML
``dot``         ``.dot .gv``                                  drawing: DOT text (save only)
``svg``/...     ``.svg .png .pdf``                            drawing rendered by Graphviz (save only)
``dag`` ...     ``.dag.pkl .tdag.pkl .idag.pkl .unidag.pkl``  pickled :class:`~opgraph.io.dag.DagForm`
``dask``        ``.dask.pkl``                                 pickled Dask graph
``pytensor``    ``.pytensor.pkl``                             pickled PyTensor ``FunctionGraph``
==============  ============================================  =========================================

Pickles can run arbitrary code when they are loaded, so loading one needs
``allow_pickle=True``. Every save converts first and writes afterwards,
atomically: a graph a format cannot hold (update edges in ONNX, an op
PyTensor does not know) is an :class:`UnsupportedGraphError` and no file is
left behind.

**Control flow.** Subgraph bodies (``call``, ``cond``, ``while_loop``,
``scan``) are stored by .cg (records of type 9002), JSON (version 2
``subgraphs``) and ONNX (``If``/``Loop``/``Scan``); the pickled dict-DAG
and Dask forms keep them as Python objects. GraphML and PyTensor refuse a
graph with bodies, naming the first op that has one (:func:`refuse_subgraphs`).

    >>> format_for_path("model.unidag.pkl").name, format_for_path("runs/v1.2/model").name
    ('unidag', 'cg')
    >>> get_format("onnx").suffixes, get_format("svg").loadable
    (('.onnx',), False)
    >>> format_for_path("model.txt")
    Traceback (most recent call last):
      ...
    opgraph.io.formats.UnknownFormatError: model.txt: unknown file extension '.txt'; known: .cg, .cgc, ...

**GraphML.** The file is the graph of :func:`opgraph.io.nx.to_networkx`
with node ids ``v<id>`` (values) and ``o<id>`` (ops). Attributes GraphML
cannot hold are JSON strings: a value's ``type`` (``{"dtype", "shape"}``),
an op's ``attrs`` (each value encoded as in the JSON form, see
:func:`opgraph.io.jsonfmt.encode_value`: tuples are arrays, a constant's
array is ``{"ndarray": {"dtype", "shape", "base64"}}``), an edge's
``indices`` and the graph's ``inputs``, ``outputs`` and ``updates``, plus
``symbols`` (constant names, descriptions and io gateway names, constants
referred to by their const op) and ``file_meta``. A name XML cannot carry
as text (control characters) is stored JSON-encoded as ``name_json``
instead of ``name``. Loading puts values and ops back at the numbers of
their node ids (:func:`~opgraph.io.nx.from_networkx` numbers in builder
order), so ``load(save(g))`` equals ``g`` names, descriptions and
``file_meta`` included, TensCalc's graphs too.

**Dask.** A ``.dask.pkl`` file holds the dict ``{"dsk", "keys", "inputs",
"types"}``: the Dask graph of :func:`opgraph.io.dask.to_dask` (written
without feeds unless ``feeds=`` is given, so the inputs are keys the user
must fill in before running it), the output keys, the input keys and their
types (so the file loads back with the same input types).

**Adding a format.** A module (or package, split by job as ``io/cg/``:
layout, encoding, writer, reader) that translates between the core
:class:`~opgraph.core.graph.Graph` and the file, and one
``register(Format(name, suffixes, description, save, load))`` at the end
of this module. A loader checks every declared length and index before it
allocates or uses it, never executes code (a pickle only with
``allow_pickle=True``) and raises :class:`~opgraph.errors.FormatError`
naming the file and the offset; a saver converts first and writes through
:func:`opgraph.core.atomic.atomic_files`. Tests: round trips in
``tests/test_io_<format>.py``, and the format's loader in the fuzzers
(``tests/test_fuzz_loaders.py``, ``tools/fuzz.py``). A format registered
for a session, used and removed:

    >>> import numpy as np, opgraph, os, tempfile
    >>> from opgraph.io import jsonfmt
    >>> _ = register(Format("doc_json", (".docjson",), "JSON under another suffix",
    ...                     save=jsonfmt.save_json, load=jsonfmt.load_json))
    >>> b = opgraph.GraphBuilder(); b.output(b.op("exp", b.input(("f8", (2,)), name="x")))
    >>> path = os.path.join(tempfile.mkdtemp(), "g.docjson")
    >>> _ = save(b.freeze(), path); load(path).equals(b.freeze())
    True
    >>> unregister("doc_json")
"""

from __future__ import annotations

import importlib.util
import inspect
import io
import os
import pickle
import shutil
import stat
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opgraph.core import progress
from opgraph.core.feeds import did_you_mean
from opgraph.core.graph import Graph
from opgraph.errors import OPTIONAL_PACKAGES, FormatError, GraphError, MissingDependencyError

Saver = Callable[..., None]
Loader = Callable[..., Graph]


class UnknownFormatError(GraphError, ValueError):
    """A path's extension (or a format name) names no known format; the message lists the known ones."""


class UnsupportedGraphError(GraphError, ValueError):
    """The chosen format cannot hold this graph (nothing was written)."""


class NotLoadableError(GraphError, ValueError):
    """The format can be written but not read back (drawings)."""


class UnknownOptionError(GraphError, TypeError):
    """A keyword argument of :func:`load` or :func:`save` that the file's format does not take (a typo, say).

    Raised before the file is opened: it is the caller's mistake, not the file's (nor the graph's).
    """


class PickleRefusedError(GraphError, ValueError):
    """Loading a pickle was refused because ``allow_pickle=True`` was not given."""

    def __init__(self, path: str, fmt: str, how: str = "pass allow_pickle=True") -> None:
        super().__init__(f"{path}: {fmt} files are Python pickles, and loading a pickle can run arbitrary code; "
                         f"{how} only for files you trust")
        self.path = path
        self.format = fmt


@dataclass(frozen=True)
class Format:
    """One file format: ``save(graph, path, **options)`` and ``load(path, **options)`` (None: save only)."""

    name: str
    suffixes: tuple[str, ...]
    description: str
    save: Saver
    load: Loader | None = None
    pickle: bool = False
    round_trip: str = "exact"
    """How ``load(save(g))`` compares with ``g``: shown by ``opgraph convert --list``."""
    requires: tuple[str, ...] = ()
    """Optional Python packages both directions need (see :data:`opgraph.errors.OPTIONAL_PACKAGES`)."""
    binaries: tuple[str, ...] = ()
    """Programs saving needs on PATH (Graphviz's ``dot`` for rendered drawings)."""

    @property
    def loadable(self) -> bool:
        """True when files of this format can be read back."""
        return self.load is not None

    def missing(self) -> list[str]:
        """The required packages (then ``binaries``) not installed here; empty when the format works here.

        >>> get_format("json").missing()
        []
        """
        out = [pkg for pkg in self.requires if not has_package(pkg)]
        return out + [b for b in self.binaries if shutil.which(b) is None]

    def check_available(self, action: str = "saving") -> None:
        """Raise :class:`~opgraph.errors.MissingDependencyError` (with what to install) if a package is missing.

        >>> get_format("cg").check_available()
        """
        for pkg in self.requires:
            if not has_package(pkg):
                raise MissingDependencyError(pkg, f"{action} {self.name} files")


def has_package(name: str) -> bool:
    """True when the Python package ``name`` can be imported here (found without importing it).

    >>> has_package("numpy"), has_package("no_such_package_xyz")
    (True, False)
    """
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing, or sys.modules[name] set to None
        return False


def missing_dependency(exc: ImportError, feature: str) -> MissingDependencyError | None:
    """``exc`` as a :class:`~opgraph.errors.MissingDependencyError` when it is an optional package missing.

    >>> str(missing_dependency(ModuleNotFoundError("x", name="networkx.readwrite"), "loading g.graphml"))[:60]
    'loading g.graphml needs the optional package networkx: pip i'
    """
    if isinstance(exc, MissingDependencyError):
        return exc
    cause: BaseException | None = exc
    while cause is not None:  # a library's own ImportError may wrap the ModuleNotFoundError ("from exc")
        root = (getattr(cause, "name", None) or "").partition(".")[0]
        if isinstance(cause, ModuleNotFoundError) and root in OPTIONAL_PACKAGES:
            return MissingDependencyError(root, feature)
        cause = cause.__cause__
    return None


_REGISTRY: dict[str, Format] = {}
DEFAULT_FORMAT = "cg"
"""The format of a path without an extension (the base name of a .cg file set)."""


def register(fmt: Format) -> Format:
    """Add (or replace) a format; its suffixes must be lower case and start with a dot."""
    for s in fmt.suffixes:
        if not s.startswith(".") or s != s.lower():
            raise ValueError(f"format {fmt.name}: suffix {s!r} must be lower case and start with '.'")
    _REGISTRY[fmt.name] = fmt
    return fmt


def unregister(name: str) -> None:
    """Forget the format called ``name`` (a user's, registered with :func:`register`).

    >>> _ = register(Format("doc_gone", (".docgone",), "", save=lambda g, p: None)); unregister("doc_gone")
    >>> "doc_gone" in [f.name for f in formats()]
    False
    """
    _REGISTRY.pop(name, None)


def formats() -> list[Format]:
    """Every registered format, in registration order.

    >>> [f.name for f in formats()][:4]
    ['cg', 'json', 'onnx', 'graphml']
    """
    return list(_REGISTRY.values())


def get_format(name: str) -> Format:
    """The format called ``name``; :class:`UnknownFormatError` listing the names otherwise.

    >>> get_format("tuple-dag").suffixes
    ('.tdag.pkl',)
    """
    try:
        return _REGISTRY[name.lower()]
    except KeyError:
        raise UnknownFormatError(f"unknown format {name!r}; known: {', '.join(_REGISTRY)}") from None


def known_suffixes() -> list[str]:
    """Every registered suffix, in registration order."""
    return [s for f in _REGISTRY.values() for s in f.suffixes]


def match_suffix(path: str | os.PathLike[str]) -> Format | None:
    """The format whose suffix is the longest one ``path`` ends with (case-insensitive), or None.

    >>> match_suffix("a/b.IDAG.pkl").name, match_suffix("a/b") is None
    ('index-dag', True)
    """
    base = os.path.basename(os.fspath(path)).lower()
    best: tuple[int, Format] | None = None
    for fmt in _REGISTRY.values():
        for s in fmt.suffixes:
            if base.endswith(s) and len(base) > len(s) and (best is None or len(s) > best[0]):
                best = (len(s), fmt)
    return None if best is None else best[1]


def format_for_path(path: str | os.PathLike[str], format: str | None = None) -> Format:
    """The format of ``path``: ``format`` if given, else by suffix; no extension means ``cg``.

    An unknown extension is an :class:`UnknownFormatError` listing the known suffixes.
    """
    if format is not None:
        return get_format(format)
    fmt = match_suffix(path)
    if fmt is not None:
        return fmt
    text = os.fspath(path)
    ext = os.path.splitext(os.path.basename(text))[1]
    if not ext:
        return _REGISTRY[DEFAULT_FORMAT]
    raise UnknownFormatError(f"{text}: unknown file extension {ext!r}; known: {', '.join(known_suffixes())} "
                             f"(or no extension for a .cg file set)")


def save(graph: Graph, path: str | os.PathLike[str], *, format: str | None = None, **options: Any) -> Format:
    """Save ``graph`` in the format of ``path`` (or ``format``); returns the format used.

    >>> import os, tempfile, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> b.output(b.op("exp", b.input(("float64", (2,)), name="x")))
    >>> d = tempfile.mkdtemp()
    >>> save(b.freeze(), os.path.join(d, "g.graphml")).name
    'graphml'
    >>> load(os.path.join(d, "g.graphml")) == b.freeze()
    True
    """
    fmt = format_for_path(path, format)
    check_options(fmt, path, options, options_taken(fmt.save, leading=2), "save")
    fmt.check_available("saving")
    try:
        with progress.task(f"saving {os.fspath(path)} ({fmt.name})"):
            fmt.save(graph, path, **options)
    except ImportError as exc:
        raise (missing_dependency(exc, f"saving {fmt.name} files") or exc) from None
    return fmt


def _kind_of(mode: int) -> str:
    """What a non-regular file is, in words.

    >>> import stat
    >>> _kind_of(stat.S_IFIFO)
    'a FIFO (named pipe)'
    """
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def check_regular_file(path: str | os.PathLike[str], what: str, *, allow_empty: bool = False) -> None:
    """Refuse a path that is not a non-empty regular file, before anything opens it (a FIFO would block).

    A missing path passes: the reader reports it in its own words; so does an empty file with
    ``allow_empty`` (the .cg reader names the record and byte offset). The error is a
    :class:`~opgraph.errors.FormatError`.

    >>> check_regular_file(os.devnull, "a graph file")
    Traceback (most recent call last):
      ...
    opgraph.errors.FormatError: /dev/null is a character device, not a graph file
    """
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{path} is {_kind_of(st.st_mode)}, not {what}")
    if st.st_size == 0 and not allow_empty:
        raise FormatError(f"{path} is empty (0 bytes), not {what}")


def check_graph_path(path: str | os.PathLike[str], format: str | None = None) -> None:
    """A clear error for a path that cannot be a graph file, naming the suffixes opgraph reads.

    A path without an extension is a .cg file set (``PATH.cg`` and its companions), so ``PATH`` itself may be
    anything as long as ``PATH.cg`` exists; every file of a set that exists must be a regular file.

    >>> check_graph_path(os.devnull)
    Traceback (most recent call last):
      ...
    opgraph.errors.FormatError: /dev/null is a character device, not a graph file (no extension means a .cg file ...
    """
    path = os.fspath(path)
    if (format is None and os.path.isdir(path) and match_suffix(path) is None
            and not os.path.exists(path.rstrip("/\\") + ".cg")):  # `opgraph info out`: say what is in out/
        raise FormatError(_directory_message(path))
    chosen = format_for_path(path, format)  # an unknown extension is its own error, listing the suffixes
    if format is None and not os.path.splitext(os.path.basename(path))[1]:
        cg = path + ".cg"
        if not os.path.exists(cg):
            if not os.path.exists(path):
                raise FileNotFoundError(2, f"No such file (nor a .cg file set {cg})", path)
            try:
                check_regular_file(path, "a graph file")
                problem = f"{path} is a file without an extension"
            except FormatError as exc:
                problem = str(exc)
            raise FormatError(f"{problem} (no extension means a .cg file set, and {cg} does not exist; "
                              f"{_readable_suffixes()})")
        path = cg
    if chosen.name == "cg":
        sets = (".cg", ".cgc", ".cgio", ".cgs")
        base = os.path.splitext(path)[0] if path.lower().endswith(sets) else path
        for suffix in sets:  # an empty file is load_cg's to report, in its "record 0 at byte offset 0" form
            check_regular_file(base + suffix, f"a {suffix} file", allow_empty=True)
        return
    try:
        check_regular_file(path, f"a {chosen.name} file")
    except FormatError as exc:
        raise FormatError(f"{exc} ({_readable_suffixes()})") from None


def _directory_message(path: str) -> str:
    """What to say about a directory given as a graph file: the graph files in it, if any.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = open(os.path.join(d, "g.json"), "w").close()
    >>> _directory_message(d).endswith("g.json")
    True
    """
    found: list[str] = []
    try:
        names = sorted(os.listdir(path))
    except OSError:
        names = []
    sets = (".cgc", ".cgio", ".cgs")  # a .cg set is listed once, by its .cg file
    for name in names:
        fmt = match_suffix(name)
        if fmt is not None and fmt.loadable and not name.lower().endswith(sets):
            found.append(os.path.join(path, name))
    if found:
        more = f" and {len(found) - 20} more" if len(found) > 20 else ""
        return f"{path} is a directory, not a graph file; graph files in it: {', '.join(found[:20])}{more}"
    return f"{path} is a directory, not a graph file, and holds none ({_readable_suffixes()})"


def _readable_suffixes() -> str:
    """The suffixes of the formats opgraph reads, for a message about a path that is not one of them."""
    readable = [s for f in formats() if f.loadable for s in f.suffixes]
    return f"graph files opgraph reads end in {', '.join(readable)}; see 'opgraph formats'"


def load(path: str | os.PathLike[str], *, format: str | None = None, allow_pickle: bool = False,
         **options: Any) -> Graph:
    """Load a graph from ``path`` in its format (or ``format``); pickles need ``allow_pickle=True``.

    >>> import os, tempfile, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> b.output(b.op("exp", b.input(("float64", (2,)), name="x")))
    >>> path = os.path.join(tempfile.mkdtemp(), "g.dag.pkl")
    >>> _ = save(b.freeze(), path)
    >>> load(path, allow_pickle=True) == b.freeze()
    True
    >>> load(path)
    Traceback (most recent call last):
      ...
    opgraph.io.formats.PickleRefusedError: ...g.dag.pkl: dag files are Python pickles, and loading a pickle can run ...
    """
    fmt = format_for_path(path, format)
    if fmt.load is None:
        raise NotLoadableError(f"{os.fspath(path)}: {fmt.name} files are drawings; opgraph writes them but cannot "
                               "read them back")
    check_load_options(fmt, path, options)  # a misspelt allow_pickle= is named as such
    if fmt.pickle and not allow_pickle:  # refuse before the file is even opened
        raise PickleRefusedError(os.fspath(path), fmt.name)
    fmt.check_available("loading")
    check_graph_path(path, format)
    try:
        with progress.task(f"loading {os.fspath(path)} ({fmt.name})"):
            return fmt.load(path, **options)
    except ImportError as exc:
        raise (missing_dependency(exc, f"loading {fmt.name} files") or exc) from None


def options_taken(fn: Callable[..., Any] | None, leading: int = 1) -> tuple[str, ...] | None:
    """The keyword arguments ``fn`` takes after its ``leading`` positional ones (None: any, as a function with
    ``**options`` takes).

    >>> options_taken(lambda path, *, mmap=True: None)
    ('mmap',)
    >>> options_taken(lambda graph, path, **options: None, leading=2) is None
    True
    """
    if fn is None:
        return ()
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a callable without a signature: let the call itself decide
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return tuple(p.name for p in named[leading:])


def load_options(fmt: Format) -> tuple[str, ...] | None:
    """The keyword arguments ``fmt``'s loader takes (None: any, as a loader with ``**options`` does).

    >>> load_options(get_format("onnx"))
    ('input_types', 'input_shapes', 'static_inputs', 'weights_as_inputs')
    >>> load_options(get_format("graphml"))
    ()
    """
    return options_taken(fmt.load)


def check_options(fmt: Format, path: str | os.PathLike[str], options: Mapping[str, Any],
                  takes: Sequence[str] | None, action: str = "load") -> None:
    """Refuse keyword arguments not in ``takes`` (None: any), naming each and the closest one taken.

    :func:`load` and :func:`save` call it before the file is opened, so that a typo is an
    :class:`UnknownOptionError` (a ``TypeError``), not a complaint about the file or the graph.

    >>> check_options(get_format("onnx"), "net.onnx", {"input_shape": {"x": (1, 3)}},
    ...               load_options(get_format("onnx")))
    Traceback (most recent call last):
      ...
    opgraph.io.formats.UnknownOptionError: opgraph.load() got an unexpected keyword argument 'input_shape' for ...
    >>> try:
    ...     check_options(get_format("cg"), "g.cg", {"index_bit": 16}, ("index_bits",), "save")
    ... except TypeError as exc:
    ...     print(str(exc).split("; ")[1])
    did you mean 'index_bits'? (cg files take index_bits
    """
    unknown = [k for k in options if takes is not None and k not in takes]
    if not unknown:
        return
    assert takes is not None
    common = ("format", "allow_pickle") if action == "load" else ("format",)
    word = unknown[0]
    listed = f"take {', '.join(takes)}" if takes else "take no options"
    more = f" (and {', '.join(repr(k) for k in unknown[1:])})" if len(unknown) > 1 else ""
    raise UnknownOptionError(f"opgraph.{action}() got an unexpected keyword argument {word!r}{more} for "
                             f"{os.fspath(path)}{did_you_mean(word, [*takes, *common])} "
                             f"({fmt.name} files {listed}; every format takes {', '.join(common)})")


def check_load_options(fmt: Format, path: str | os.PathLike[str], options: Mapping[str, Any]) -> None:
    """:func:`check_options` against what ``fmt``'s loader takes.

    >>> check_load_options(get_format("json"), "g.json", {"verify": False})
    """
    check_options(fmt, path, options, load_options(fmt), "load")


# ----------------------------------------------------------------------------- helpers
CONTROL_FLOW_FORMATS = (".cg", ".json", ".onnx")
"""The file formats that store subgraph bodies (control flow); the pickled dict DAG and Dask forms keep them too."""


def refuse_subgraphs(graph: Graph, what: str) -> None:
    """Raise :class:`~opgraph.errors.GraphError` naming the first op with a subgraph body, if ``graph`` has one.

    For converters that cannot express control flow (``what`` names them).

    >>> import opgraph
    >>> from opgraph.core.subgraph import Subgraph
    >>> sb = opgraph.GraphBuilder(); x = sb.input(("f8", ()), name="x"); sb.output(sb.exp(x))
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", ()), name="x")
    >>> b.output(b.op("call", x, body=Subgraph(sb.freeze(), name="f")))
    >>> refuse_subgraphs(b.freeze(), "GraphML")
    Traceback (most recent call last):
      ...
    opgraph.errors.GraphError: op 0 (call) has subgraph body 'f': GraphML does not support control flow (the .cg, ...
    """
    from opgraph.core.subgraph import Subgraph, bodies_in

    if not graph.subgraphs:
        return
    import numpy as np

    for aid, attrs in enumerate(graph.attrs):
        body: Subgraph | None = next((s for _, v in attrs for s in bodies_in(v)), None)
        hits = np.flatnonzero(graph.op_attr == aid) if body is not None else ()
        if len(hits):
            op = int(hits[0])
            raise GraphError(f"op {op} ({graph.kind_of(op)}) has subgraph body {body.label}: {what} does not support "
                             f"control flow (the {', '.join(CONTROL_FLOW_FORMATS[:-1])} and "
                             f"{CONTROL_FLOW_FORMATS[-1]} formats store it)")


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none), for one-line errors.

    >>> first_line(ValueError("bad shape" + chr(10) + "more detail")), first_line(KeyError())
    ('bad shape', 'KeyError')
    """
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _convert(name: str, path: str | os.PathLike[str], fn: Callable[[], Any]) -> Any:
    """Run a converter; what it rejects becomes an UnsupportedGraphError (before any file is opened)."""
    try:
        return fn()
    except ImportError:
        raise
    except (GraphError, TypeError, ValueError, NotImplementedError, KeyError, IndexError) as exc:
        raise UnsupportedGraphError(f"{os.fspath(path)}: the {name} format cannot hold this graph: "
                                    f"{first_line(exc)}") from exc


def _write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    from opgraph.core.atomic import atomic_files

    with atomic_files([path]) as (f,):
        f.write(data)


def _write_pickle(path: str | os.PathLike[str], obj: Any) -> None:
    # Pickle into memory first: an unpicklable object then fails before the file is created.
    _write_bytes(path, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _read_pickle(path: str | os.PathLike[str]) -> Any:
    with open(path, "rb") as f:
        return pickle.load(f)


def _bad_file(path: str | os.PathLike[str], message: str) -> FormatError:
    return FormatError(f"{os.fspath(path)}: {message}")


# ----------------------------------------------------------------------------- cg and JSON
def _save_cg(graph: Graph, path: str | os.PathLike[str], **options: Any) -> None:
    from opgraph.io.cg import save_cg

    check_options(get_format("cg"), path, options, options_taken(save_cg, leading=2), "save")
    save_cg(graph, path, **options)


def _load_cg(path: str | os.PathLike[str], *, mmap: bool = True) -> Graph:
    from opgraph.io.cg import load_cg

    return load_cg(path, mmap=mmap)


def _save_json(graph: Graph, path: str | os.PathLike[str], **options: Any) -> None:
    from opgraph.io.jsonfmt import save_json

    check_options(get_format("json"), path, options, options_taken(save_json, leading=2), "save")
    save_json(graph, path, **options)


def _load_json(path: str | os.PathLike[str], *, verify: bool = True) -> Graph:
    from opgraph.io.jsonfmt import load_json

    return load_json(path, verify=verify)


# ----------------------------------------------------------------------------- ONNX
def _save_onnx(graph: Graph, path: str | os.PathLike[str], **options: Any) -> None:
    from opgraph.io.onnx import to_onnx

    check_options(get_format("onnx"), path, options, options_taken(to_onnx), "save")
    model = _convert("onnx", path, lambda: to_onnx(graph, **options))
    _write_bytes(path, model.SerializeToString())


def _load_onnx(path: str | os.PathLike[str], *, input_types: Mapping[str, Any] | None = None,
               input_shapes: Mapping[str, Any] | None = None, static_inputs: Mapping[str, Any] | None = None,
               weights_as_inputs: bool = False) -> Any:
    # The keywords are from_onnx's, spelled out so that load() can check them before opening the file
    # (tests/test_io_load_errors.py checks the two lists agree).
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    from opgraph.io.onnx import OnnxArgumentError, from_onnx

    with open(path, "rb") as f:
        data = f.read()
    try:
        model = onnx.load_from_string(data)
    except Exception as exc:  # protobuf's DecodeError
        raise _bad_file(path, f"not a readable ONNX model: {first_line(exc)}") from exc
    try:  # onnx refuses external data files outside the model's directory (absolute, "..", symlinks out)
        load_external_data_for_model(model, os.path.dirname(os.path.abspath(os.fspath(path))))
    except Exception as exc:
        raise _bad_file(path, f"cannot read the model's external data: {first_line(exc)}") from exc
    try:
        return from_onnx(model, input_types=input_types, input_shapes=input_shapes,  # type: ignore[call-overload]
                         static_inputs=static_inputs, weights_as_inputs=weights_as_inputs)
    except OnnxArgumentError as exc:  # the caller's arguments, not the file, are wrong: stays a ValueError
        raise OnnxArgumentError(f"{os.fspath(path)}: {exc}") from None
    except GraphError as exc:
        raise _bad_file(path, first_line(exc)) from exc
    except Exception as exc:  # from_onnx turns its failures into OnnxImportError; this is a last resort
        raise _bad_file(path, f"cannot import: {type(exc).__name__}: {first_line(exc)}") from exc


# ----------------------------------------------------------------------------- GraphML (codec: opgraph.io.nx.graphml)
def _save_graphml(graph: Graph, path: str | os.PathLike[str]) -> None:
    import networkx as nx

    from opgraph.io.nx.graphml import to_graphml_graph

    H = _convert("graphml", path, lambda: to_graphml_graph(graph))
    buf = io.BytesIO()
    nx.write_graphml(H, buf)
    _write_bytes(path, buf.getvalue())


def _load_graphml(path: str | os.PathLike[str]) -> Graph:
    from opgraph.io.nx.graphml import from_graphml_graph, read_graphml

    try:
        H = read_graphml(path)
    except OSError:
        raise
    except FormatError as exc:
        raise _bad_file(path, str(exc)) from exc
    except Exception as exc:  # ElementTree's ParseError, networkx's errors on malformed keys
        raise _bad_file(path, f"not a readable GraphML file: {first_line(exc)}") from exc
    try:
        return from_graphml_graph(H)
    except FormatError as exc:
        raise _bad_file(path, str(exc)) from exc
    except Exception as exc:  # a problem the checks above miss must still be one error naming the file
        raise _bad_file(path, f"cannot load: {type(exc).__name__}: {first_line(exc)}") from exc


# ----------------------------------------------------------------------------- drawings
def _drawing_saver(fmt: str) -> Saver:
    def save_drawing(graph: Graph, path: str | os.PathLike[str], **options: Any) -> None:
        from opgraph.viz import render

        check_options(get_format(fmt), path, options,
                      tuple(k for k in options_taken(render, leading=2) or () if k != "format"), "save")
        # render makes the whole file in memory (running dot) before it writes it under a temporary name.
        render(graph, path, format=fmt, **options)

    return save_drawing


# ----------------------------------------------------------------------------- pickled Python objects
def _dag_formats() -> list[tuple[str, str, str, str]]:
    # (format, suffix, to_*, from_*) of opgraph.io.dag
    return [("dag", ".dag.pkl", "to_dag", "from_dag"), ("tuple-dag", ".tdag.pkl", "to_tuple_dag", "from_tuple_dag"),
            ("index-dag", ".idag.pkl", "to_index_dag", "from_index_dag"),
            ("unidag", ".unidag.pkl", "to_unidag", "from_unidag")]


def _dag_saver(name: str, to_name: str) -> Saver:
    def save_dag(graph: Graph, path: str | os.PathLike[str]) -> None:
        from opgraph.io import dag

        form = _convert(name, path, lambda: getattr(dag, to_name)(graph))
        _write_pickle(path, form)

    return save_dag


def _dag_loader(name: str, from_name: str) -> Loader:
    def load_dag(path: str | os.PathLike[str]) -> Graph:
        from opgraph.io import dag

        form = _read_pickle(path)
        if not isinstance(form, tuple) or len(form) != 4:
            raise _bad_file(path, f"expected a pickled DagForm (dag, inputs, outputs, types), got "
                                  f"{type(form).__name__}")
        try:
            return getattr(dag, from_name)(*form)
        except GraphError as exc:
            raise _bad_file(path, first_line(exc)) from exc

    return load_dag


def _save_dask(graph: Graph, path: str | os.PathLike[str], *, feeds: Mapping[str, Any] | None = None) -> None:
    from opgraph.io.dask import to_dask

    def convert() -> dict[str, Any]:
        form = to_dask(graph, feeds)
        types = {k: graph.type_of(v) for k, v in zip(form.inputs, graph.inputs.tolist(), strict=True)}
        return {"dsk": form.dsk, "keys": list(form.keys), "inputs": tuple(form.inputs), "types": types}

    _write_pickle(path, _convert("dask", path, convert))


class _InputTask:
    """Stands for a graph input while a Dask file is imported: ``from_dask`` maps it to ``builder.input(type)``.

    ``to_dask`` leaves unfed inputs out of the Dask graph, and ``from_dask``
    types an input by its data; this keeps the type the file recorded
    (dims of unknown size included) and the inputs' order.
    """

    def __init__(self, type_: Any) -> None:
        self.type = type_

    def __call__(self) -> Any:  # a task's function must be callable; running it is never meant
        raise RuntimeError("a graph input of an opgraph Dask file was not filled in")

    def translate(self, builder: Any) -> Any:
        return builder.input(self.type)


def _load_dask(path: str | os.PathLike[str]) -> Graph:
    from opgraph.core.types import as_type
    from opgraph.io.dask import from_dask

    obj = _read_pickle(path)
    if isinstance(obj, Mapping) and "dsk" in obj and "keys" in obj:
        dsk, keys = obj["dsk"], obj["keys"]
        inputs: tuple[Hashable, ...] = tuple(obj.get("inputs", ()))
        types = dict(obj.get("types") or {})
    elif isinstance(obj, tuple) and len(obj) == 3:  # a bare DaskForm (dsk, keys, inputs)
        dsk, keys, inputs = obj[0], obj[1], tuple(obj[2])
        types = {}
    else:
        raise _bad_file(path, f"expected a pickled dict with 'dsk' and 'keys' (or a DaskForm), got "
                              f"{type(obj).__name__}")
    dsk = dict(dsk)
    typed = [k for k in inputs if k in types]
    # Typed inputs come first, in order, as placeholder tasks, so they get the graph's value numbers;
    # inputs without a recorded type must be data in the file (from_dask types them by it).
    placeholders = {k: _InputTask(as_type(types[k])) for k in typed}
    for k in inputs:
        if k not in types and k not in dsk:
            raise _bad_file(path, f"input {k!r} has neither data in the Dask graph nor a recorded type")
    dsk = {**{k: (placeholders[k],) for k in typed}, **{k: v for k, v in dsk.items() if k not in placeholders}}
    try:
        return from_dask(dsk, keys, inputs=[k for k in inputs if k not in placeholders],
                         functions={p: p.translate for p in placeholders.values()})
    except (GraphError, KeyError) as exc:
        raise _bad_file(path, first_line(exc)) from exc


def _save_pytensor(graph: Graph, path: str | os.PathLike[str]) -> None:
    from opgraph.io.pytensor import to_pytensor

    _write_pickle(path, _convert("pytensor", path, lambda: to_pytensor(graph)))


def _load_pytensor(path: str | os.PathLike[str]) -> Graph:
    from pytensor.graph.fg import FunctionGraph

    from opgraph.io.pytensor import from_pytensor

    fg = _read_pickle(path)
    if not isinstance(fg, FunctionGraph):
        raise _bad_file(path, f"expected a pickled pytensor FunctionGraph, got {type(fg).__name__}")
    try:
        return from_pytensor(fg)
    except GraphError as exc:
        raise _bad_file(path, first_line(exc)) from exc


# ----------------------------------------------------------------------------- the table
def _register_builtin() -> None:
    register(Format("cg", (".cg", ".cgc", ".cgio", ".cgs"), "TensCalc .cg file set (4 files)", _save_cg, _load_cg))
    register(Format("json", (".json",), "the JSON form (opgraph.io.jsonfmt)", _save_json, _load_json))
    register(Format("onnx", (".onnx",), "ONNX model; no update edges", _save_onnx, _load_onnx, round_trip="numeric",
                    requires=("onnx",)))
    register(Format("graphml", (".graphml",), "networkx bipartite form (opgraph.io.nx)", _save_graphml,
                    _load_graphml, requires=("networkx",)))
    register(Format("dot", (".dot", ".gv"), "drawing: DOT text (opgraph.viz)", _drawing_saver("dot"),
                    round_trip="save only"))
    for fmt in ("svg", "png", "pdf"):
        register(Format(fmt, (f".{fmt}",), "drawing rendered by Graphviz's dot", _drawing_saver(fmt),
                        round_trip="save only", binaries=("dot",)))
    for name, suffix, to_name, from_name in _dag_formats():
        register(Format(name, (suffix,), f"{to_name}'s DagForm; no update edges",
                        _dag_saver(name, to_name), _dag_loader(name, from_name), pickle=True))
    register(Format("dask", (".dask.pkl",), "to_dask's Dask graph; no update edges", _save_dask, _load_dask,
                    pickle=True, requires=("dask",)))
    register(Format("pytensor", (".pytensor.pkl",), "to_pytensor's FunctionGraph; no update edges", _save_pytensor,
                    _load_pytensor, pickle=True, round_trip="exact (live ops)", requires=("pytensor",)))


_register_builtin()


__all__ = [
    "DEFAULT_FORMAT",
    "Format",
    "NotLoadableError",
    "PickleRefusedError",
    "UnknownFormatError",
    "UnknownOptionError",
    "UnsupportedGraphError",
    "check_graph_path",
    "check_load_options",
    "check_options",
    "check_regular_file",
    "first_line",
    "format_for_path",
    "formats",
    "get_format",
    "has_package",
    "known_suffixes",
    "load",
    "load_options",
    "match_suffix",
    "missing_dependency",
    "options_taken",
    "register",
    "save",
    "unregister",
]
