"""The on-disk cache of ``backend="auto"``'s choices, so that a second process compiles only the chosen engine.

One small JSON file per choice, ``<key>.json`` under ``$OPGRAPH_CACHE_DIR/auto`` (else ``~/.cache/opgraph/auto``,
next to the c engine's ``c`` folder). The key (:func:`choice_key`) is a SHA-256 of everything the choice depends
on: the graph's content (:func:`graph_hash`: its ops, wiring, types, attributes and the shapes and dtypes of its
constants; the values of constants larger than :data:`SMALL_CONSTANT_BYTES` do not enter, since a choice does not
depend on the weights' values, and hashing hundreds of MB of weights would cost the time the cache saves), the
feeds' kinds, dtypes and shapes, the targets, the candidates and options, the versions of opgraph and of each
candidate engine's library, the machine (architecture, processor, CPU count and affinity, the thread-count
environment variables) and the cost model's constants.

Reads never fail the caller: a missing file is a miss; an unreadable or corrupted one is a miss with a
``RuntimeWarning`` naming it (the choice is then made again and the file rewritten). Writes are atomic (a
temporary file in the same folder renamed over the target), so a concurrent reader sees the old file or the new,
never half of one; a folder that cannot be written gives a warning. ``cache=False`` (a keyword of
``opgraph.compile(..., backend="auto")``) or ``OPGRAPH_AUTO_CACHE=0`` in the environment turns the cache off;
``cache="some/dir"`` puts it there.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); b.output(b.op("exp", x))
    >>> g = b.freeze()
    >>> graph_hash(g) == graph_hash(b.freeze()), len(graph_hash(g))
    (True, 32)
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.core.feeds import value_id
from opgraph.core.graph import Graph
from opgraph.core.registry import CONST, exact_key, get_op

FORMAT = 1
"""The cache files' format version (a file of another version is a miss)."""
SMALL_CONSTANT_BYTES = 4096
"""Constants up to this size enter :func:`graph_hash` by value (shapes, indices, scalars); larger ones by dtype
and shape only."""
ENV_SWITCH = "OPGRAPH_AUTO_CACHE"
"""``OPGRAPH_AUTO_CACHE=0`` (or false, no, off) turns the cache off."""

# the distribution whose version decides each engine's programs (an engine not listed: opgraph's version only)
_DISTS = {"numpy": ("numpy", "numba"), "torch": ("torch",), "onnxruntime": ("onnxruntime", "onnx"),
          "jax": ("jax", "jaxlib"), "numba": ("numba",), "dask": ("dask",)}


def cache_dir() -> str:
    """Where choices are kept: ``$OPGRAPH_CACHE_DIR/auto``, else ``~/.cache/opgraph/auto``.

    >>> cache_dir().endswith("auto")
    True
    """
    root = os.environ.get("OPGRAPH_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "opgraph")
    return os.path.join(root, "auto")


def directory(cache: Any) -> str | None:
    """The folder to use for ``cache=`` (True or None: :func:`cache_dir` unless ``$OPGRAPH_AUTO_CACHE`` is off; a
    path: that folder; False: None, no cache).

    >>> directory(False) is None, directory("/tmp/x")
    (True, '/tmp/x')
    """
    if cache is False:
        return None
    if cache is not None and cache is not True:
        return os.fspath(cache)
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    return cache_dir()


def graph_hash(graph: Graph) -> str:
    """A content hash of ``graph`` (hex, 32 characters): equal for graphs that compute the same way (op kinds by
    name, wiring, types, attributes, small constants by value, large ones by dtype and shape); value names aside.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); b.output(b.op("sin", x))
    >>> c = opgraph.GraphBuilder(); y = c.input(("f8", (2,)), name="y"); c.output(c.op("cos", y))
    >>> graph_hash(b.freeze()) != graph_hash(c.freeze())
    True
    """
    import hashlib  # not at import time: it loads OpenSSL (tests/test_import_light.py)

    h = hashlib.blake2b(digest_size=16)
    kinds = np.asarray(graph.op_kind, dtype=np.int64)
    uniq = np.unique(kinds).tolist()
    h.update(repr([get_op(int(k)).name for k in uniq]).encode())
    h.update(np.searchsorted(np.asarray(uniq, dtype=np.int64), kinds).astype(np.int64).tobytes())
    for name in ("op_version", "in_ptr", "in_ids", "out_ptr", "out_ids", "inputs", "outputs", "updates"):
        h.update(name.encode())
        h.update(np.ascontiguousarray(getattr(graph, name), dtype=np.int64).tobytes())
    h.update(repr([repr(t) for t in graph.types]).encode())
    h.update(np.ascontiguousarray(graph.value_type, dtype=np.int64).tobytes())
    keys: list[Any] = []
    for a in graph.attrs:
        try:
            keys.append(exact_key(a))
        except TypeError:
            keys.append(repr(a))
    for op in np.flatnonzero(graph.op_kind == CONST.id).tolist():
        aid = int(graph.op_attr[op])
        c = graph.constants[dict(graph.attrs[aid])["index"]]
        keys[aid] = ("const", c.dtype.str, c.shape, c.tobytes() if c.nbytes <= SMALL_CONSTANT_BYTES else None)
    h.update(repr(keys).encode())
    h.update(np.ascontiguousarray(graph.op_attr, dtype=np.int64).tobytes())
    return h.hexdigest()


def engine_versions(names: Sequence[str]) -> dict[str, str]:
    """opgraph's version and, per engine in ``names``, its libraries' versions (``"-"`` where not installed).

    >>> "opgraph" in engine_versions(["numpy"]) and "numpy" in engine_versions(["numpy"])
    True
    """
    from importlib.metadata import PackageNotFoundError, version

    from opgraph._version import __version__

    out = {"opgraph": __version__}
    for n in names:
        for dist in _DISTS.get(n, ()):
            try:
                out[dist] = version(dist)
            except PackageNotFoundError:
                out[dist] = "-"
    return out


def machine() -> dict[str, Any]:
    """What the timings depend on besides the graph: architecture, processor, CPUs usable, thread settings.

    >>> machine()["cpus"] >= 1
    True
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    threads = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                              "XLA_FLAGS") if os.environ.get(k)}
    return {"arch": platform.machine(), "processor": platform.processor(), "system": platform.system(),
            "cpus": os.cpu_count() or 1, "usable": usable, "threads": threads}


def _feed_signature(graph: Graph, feeds: Mapping[Any, Any]) -> list[Any]:
    sig = []
    for k, x in feeds.items():
        kind = type(x).__module__.split(".")[0] + "." + type(x).__name__
        sig.append((value_id(graph, k), kind, str(getattr(x, "dtype", "")), list(np.shape(x))))
    return sorted(sig, key=lambda s: s[0])


def choice_key(graph: Graph, feeds: Mapping[Any, Any], names: Sequence[str], **context: Any) -> str:
    """The cache key of a choice among ``names`` for ``graph`` on ``feeds`` (``context``: the targets, device,
    options, cost constants... anything else the choice depends on, by its ``repr``).

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (None,)), name="x"); b.output(b.op("exp", x))
    >>> g = b.freeze()
    >>> choice_key(g, {"x": np.zeros(2)}, ["numpy"]) != choice_key(g, {"x": np.zeros(3)}, ["numpy"])
    True
    """
    import hashlib

    parts = {"format": FORMAT, "graph": graph_hash(graph), "feeds": _feed_signature(graph, feeds),
             "names": list(names), "versions": engine_versions(names), "machine": machine(),
             "context": {k: repr(v) for k, v in sorted(context.items())}}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()[:40]


def path_of(folder: str, key: str) -> str:
    """The file a choice of ``key`` is kept in.

    >>> path_of("/c", "k")
    '/c/k.json'
    """
    return os.path.join(folder, f"{key}.json")


def read(folder: str, key: str) -> dict[str, Any] | None:
    """The record stored under ``key`` in ``folder``, or None: a miss, or a file that cannot be read or is not a
    record of this format (then with a ``RuntimeWarning`` naming the file; it is rewritten by the next choice).

    >>> read("/nonexistent/opgraph-cache", "k") is None
    True
    """
    path = path_of(folder, key)
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        warnings.warn(f"auto: ignoring the choice cache file {path} (it cannot be read: {type(exc).__name__}: "
                      f"{exc}); choosing again", RuntimeWarning, stacklevel=3)
        return None
    if (not isinstance(rec, dict) or rec.get("format") != FORMAT or rec.get("key") != key
            or not isinstance(rec.get("backend"), str)):
        warnings.warn(f"auto: ignoring the choice cache file {path} (not a choice record of format {FORMAT}); "
                      "choosing again", RuntimeWarning, stacklevel=3)
        return None
    return rec


def write(folder: str, key: str, record: Mapping[str, Any]) -> str | None:
    """Store ``record`` under ``key`` in ``folder`` atomically; the file's path, or None (with a
    ``RuntimeWarning``) where the folder cannot be written: the cache is an optimisation, never an error.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = write(d, "k", {"backend": "numpy"})
    ...     read(d, "k")["backend"]
    'numpy'
    """
    path = path_of(folder, key)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".tmp", prefix=f"{key}.", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({**record, "format": FORMAT, "key": key}, f, default=repr)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        warnings.warn(f"auto: cannot write the choice cache {path} ($OPGRAPH_CACHE_DIR; OPGRAPH_AUTO_CACHE=0 turns "
                      f"it off): {exc.strerror or exc}", RuntimeWarning, stacklevel=3)
        return None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    return path
