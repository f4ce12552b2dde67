"""The C engine (``backend="c"``): the numba engine's register-machine program written as standalone C
(:mod:`opgraph.backends.c.codegen`), compiled by the system's C compiler and loaded with ctypes.

It claims what the numba engine claims, with the same rule table (the rules live in the numba engine's
family modules; this engine has none of its own) and needs a C compiler instead of numba: ``cc`` on
``PATH``, or the one ``$CC`` names. A compiled program is cached on disk, keyed by a hash of its C source, in
``$OPGRAPH_CACHE_DIR/c`` (default ``~/.cache/opgraph/c``): compiling the same graph again, in this process or
another, loads the library without running the compiler.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", ()), name="x")
    >>> b.output(b.op("add", b.op("sin", x), b.op("multiply", x, x)))
    >>> p = opgraph.compile(b.freeze(), backend="c")
    >>> bool(p(np.float64(2.0))[0] == np.sin(2.0) + 4.0)
    True
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opgraph.backends.base import BackendError, Executable
from opgraph.backends.c.codegen import STRAIGHT_LINE_MAX, Entry, interpreter_c, write_c
from opgraph.backends.numba import BACKEND as NUMBA
from opgraph.backends.numba import MachineExecutable, NumbaBackend
from opgraph.core.graph import Graph

CFLAGS = ("-std=c99", "-O2", "-ffp-contract=off", "-shared", "-fPIC")
"""How a program is compiled: C99, optimised, no fused multiply-add contraction (results stay those of the
numba engine and NumPy, operation by operation), as a shared library."""

_LIBS: dict[str, ctypes.CDLL] = {}
_LIBS_LOCK = threading.Lock()


def compiler() -> list[str] | None:
    """The C compiler's command (``$CC`` split as a shell would, or ``cc``), None when it is not on ``PATH``.

    >>> compiler() is None or isinstance(compiler()[0], str)
    True
    """
    cmd = shlex.split(os.environ.get("CC", "") or "cc")
    if not cmd or shutil.which(cmd[0]) is None:
        return None
    return cmd


def cache_dir() -> str:
    """Where compiled programs are kept: ``$OPGRAPH_CACHE_DIR/c``, else ``~/.cache/opgraph/c``.

    >>> cache_dir().endswith("c")
    True
    """
    root = os.environ.get("OPGRAPH_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "opgraph")
    return os.path.join(root, "c")


def build(source: str, name: str = "opgraph_program") -> ctypes.CDLL:
    """Compile ``source`` into a shared library in the cache (once per source text; concurrent builders of
    the same source are safe: each writes its own temporary file and renames it into place) and load it.

    Raises :class:`~opgraph.backends.base.BackendError` with the compiler's first error line and the path
    of the ``.c`` file when compiling fails.

    >>> lib = build("int doc_twice(int x) { return 2 * x; }\\n")
    >>> lib.doc_twice(21)
    42
    """
    key = hashlib.sha256(" ".join(CFLAGS).encode() + b"\0" + source.encode()).hexdigest()[:32]
    with _LIBS_LOCK:
        lib = _LIBS.get(key)
        if lib is not None:
            return lib
        cmd = compiler()
        if cmd is None:
            raise BackendError(BACKEND.unavailable_reason() or "no C compiler")
        where = cache_dir()
        c_path = os.path.join(where, f"{name}-{key}.c")
        so_path = os.path.join(where, f"{name}-{key}.so")
        if not os.path.exists(so_path):
            try:
                os.makedirs(where, exist_ok=True)
                _write_new(c_path, source)
                fd, tmp = tempfile.mkstemp(suffix=".so", prefix=f"{name}-{key}.", dir=where)
                os.close(fd)
            except OSError as e:
                raise BackendError(f"the c engine cannot write its cache {where} ($OPGRAPH_CACHE_DIR): "
                                   f"{e.strerror or e}") from e
            try:
                done = subprocess.run([*cmd, *CFLAGS, "-o", tmp, c_path, "-lm"], capture_output=True, text=True)
                if done.returncode != 0:
                    raise BackendError(f"the C compiler ({cmd[0]}) failed on {c_path}: {_first_error(done)}")
                os.replace(tmp, so_path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        lib = _LIBS[key] = ctypes.CDLL(so_path)
        return lib


def _write_new(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (another process may read it)."""
    fd, tmp = tempfile.mkstemp(suffix=".c.tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _first_error(done: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower():
            return ln
    return lines[0] if lines else f"exit status {done.returncode}"


class CExecutable(MachineExecutable):
    """A compiled program: ``exe(args) -> outputs`` on NumPy arrays, as the numba engine's executable (the same
    register file, feeds and results; the C program runs it, releasing the GIL). ``lib`` holds the program (its
    ``<prefix>_eval``), or with ``embed=False`` only the interpreter
    (:func:`~opgraph.backends.c.codegen.interpreter_c`), which gets the program's columns at each call.
    """

    def __init__(self, entry: Entry, lib: ctypes.CDLL, source: str, embed: bool = True) -> None:
        self._c_source = source
        self._lib, self._prefix, self._embed = lib, entry.prefix, embed
        super().__init__(entry.machine, entry.work_size)

    def _prepare(self) -> None:
        p = self.machine.program.plain()
        self._cols = ()
        if self._embed:
            self._eval = getattr(self._lib, f"{self._prefix}_eval")
            self._eval.argtypes = [ctypes.c_void_p]
        else:
            self._eval = self._lib.og_run
            self._eval.argtypes = [ctypes.c_long, *[ctypes.c_void_p] * 10]
            self._cols = (p.code.astype(np.uint8), p.dst, p.a, p.b, p.c, p.n, p.mask.astype(np.uint8),
                          p.args, p.coefs)
        self._eval.restype = ctypes.c_int
        self._head = (len(p), *[c.ctypes.data for c in self._cols]) if not self._embed else ()

    @property
    def source(self) -> str:
        """The C source of the program (``Program.code`` shows it)."""
        return self._c_source

    def _execute(self, regs: np.ndarray) -> None:
        rc = self._eval(*self._head, regs.ctypes.data)
        if rc != 0:
            raise BackendError(f"the compiled C program returned {rc} (it runs on little-endian machines)")


@dataclass
class CBackend(NumbaBackend):
    """The C engine (see the module doc): the numba engine's claims and rules, another compiler."""

    def compile_graph(self, graph: Graph, *, device: str | None = None, donate: Sequence[int] = (),
                      input_shapes: Sequence[tuple[int, ...] | None] | None = None,
                      straight_line_max: int = STRAIGHT_LINE_MAX, embed: bool = True,
                      **options: Any) -> Executable:
        """The graph as one C program, compiled (or found in the cache) and loaded.

        ``input_shapes``: shapes for inputs whose type has none; ``straight_line_max``: see
        :func:`~opgraph.backends.c.codegen.write_c`; ``embed=False``: no C file of the program's own, the
        program runs on the one compiled interpreter (:func:`~opgraph.backends.c.codegen.interpreter_c`),
        compiled once for every graph (no compiler run per graph; the interpreter's speed).

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (3,))); b.output(b.op("exp", x))
        >>> BACKEND.compile_graph(b.freeze())([np.zeros(3)])[0]
        array([1., 1., 1.])
        """
        if options:
            raise BackendError(f"the c engine takes no options {sorted(options)}")
        from opgraph.backends.numba.assemble import assemble

        entry = Entry("opgraph_program", assemble(graph, input_shapes, rules=self.rules))
        if not embed:
            source = interpreter_c()
            return CExecutable(entry, build(source, "og_interpreter"), source, embed=False)
        source, _ = write_c(entry.prefix, [entry], straight_line_max)
        return CExecutable(entry, build(source, entry.prefix), source)

    def unavailable_reason(self) -> str | None:
        """Why the engine cannot be used here (one line): no C compiler.

        >>> BACKEND.unavailable_reason() in (None, "no C compiler (cc) on PATH")
        True
        """
        if compiler() is None:
            cc = os.environ.get("CC") or "cc"
            return f"no C compiler ({cc}) on PATH"
        return None

    def rule_module(self, kind: str) -> str | None:
        """Where the rule of ``kind`` is registered: the numba engine's family module (this engine shares
        its table).

        >>> BACKEND.rule_module("add")
        'opgraph.backends.numba.elementwise'
        """
        return NUMBA.rule_module(kind)


BACKEND = CBackend("c", rules=NUMBA.rules, dtypes=NUMBA.dtypes, limits=NUMBA.limits, module="", extra="",
                   doc="the register machine as standalone C, compiled with the system's C compiler")
