"""The engines graphs run on: numpy (default), jax, torch, onnxruntime, dask, numba (fine-grained graphs), c (the
numba engine's program as C, compiled by the system's C compiler).

Each backend is one module of this package holding a :class:`Backend`
(capability set, rule table, compiler; see :mod:`opgraph.backends.base`).
Modules are imported on first use, so ``import opgraph`` imports none of the
optional engines.

    >>> from opgraph import backends
    >>> backends.names()
    ('numpy', 'jax', 'torch', 'onnxruntime', 'dask', 'numba', 'c')
    >>> backends.get("numpy").supports("matmul")
    True
    >>> backends.get("tensorflow")
    Traceback (most recent call last):
    ...
    opgraph.backends.base.BackendError: unknown backend 'tensorflow'; known: numpy, jax, ...installed here: ...
"""

from __future__ import annotations

import importlib
import importlib.util

from opgraph.backends.base import Backend, BackendError, Executable, OpInfo, unsupported_ops
from opgraph.core.feeds import did_you_mean
from opgraph.errors import MissingDependencyError

_MODULES = {
    "numpy": "opgraph.backends.numpy",
    "jax": "opgraph.backends.jax",
    "torch": "opgraph.backends.torch",
    "onnxruntime": "opgraph.backends.onnxruntime",
    "dask": "opgraph.backends.dask",
    "numba": "opgraph.backends.numba",
    "c": "opgraph.backends.c",
}
_BUILT_IN = frozenset(_MODULES)
_PACKAGES = {"numpy": "", "jax": "jax", "torch": "torch", "onnxruntime": "onnxruntime", "dask": "dask",
             "numba": "numba", "c": ""}  # c needs a C compiler, not a package: see its unavailable_reason()
_LOADED: dict[str, Backend] = {}

__all__ = ["Backend", "BackendError", "BackendNotInstalledError", "Executable", "OpInfo", "available", "get",
           "names", "register", "unregister", "unsupported_ops"]


class BackendNotInstalledError(MissingDependencyError, BackendError):
    """A known backend whose engine is not installed: the message says which extra installs it.

    Also an ``ImportError`` (``name`` is the package) and a ``ValueError``, as every :class:`BackendError`
    (``MissingDependencyError`` first, so ``ImportError``'s constructor takes ``name=``).

    >>> e = BackendNotInstalledError("jax", "backend 'jax'")
    >>> isinstance(e, ImportError) and isinstance(e, ValueError) and isinstance(e, BackendError), e.name
    (True, 'jax')
    """


def names() -> tuple[str, ...]:
    """Every known backend name, installed or not (``"auto"`` is a choice of :func:`opgraph.compile`, not one)."""
    return tuple(_MODULES)


def register(backend: Backend, module: str | None = None) -> Backend:
    """Add a backend (a user's own, or replace a built-in) under ``backend.name``.

    >>> from opgraph.backends.base import Backend
    >>> register(Backend("doc_echo")).name in names()
    True
    >>> unregister("doc_echo")
    """
    _MODULES[backend.name] = module or type(backend).__module__
    _LOADED[backend.name] = backend
    return backend


def unregister(name: str) -> None:
    """Forget a backend added with :func:`register` (a built-in one is loaded again on next use).

    >>> from opgraph.backends.base import Backend
    >>> _ = register(Backend("doc_gone")); unregister("doc_gone"); "doc_gone" in names()
    False
    """
    _LOADED.pop(name, None)
    if name not in _BUILT_IN:
        _MODULES.pop(name, None)


def get(name: str) -> Backend:
    """The backend called ``name``; raises :class:`BackendError` (one line) if unknown or not installed.

    >>> get("numpy").name
    'numpy'
    """
    found = _LOADED.get(name)
    if found is not None:
        return found
    if name not in _MODULES:
        raise BackendError(f"unknown backend {name!r}; known: {', '.join(_MODULES)}, auto "
                           f"(installed here: {', '.join(available())}, auto){suggest(name)}")
    pkg = _PACKAGES.get(name, "")
    if pkg and not _installed(pkg):
        raise BackendNotInstalledError(pkg, f"backend {name!r}")
    module = importlib.import_module(_MODULES[name])
    _LOADED[name] = module.BACKEND
    return module.BACKEND


_ALIASES = {"pytorch": "torch", "ort": "onnxruntime", "onnx": "onnxruntime", "onnx-runtime": "onnxruntime",
            "onnx_runtime": "onnxruntime", "np": "numpy", "jaxlib": "jax", "xla": "jax", "distributed": "dask"}
"""Names users write for an engine (its package's or its library's) -> opgraph's backend name."""


def suggest(name: object) -> str:
    """The ``"; did you mean ...?"`` tail of an unknown backend name's message: the backend spelled in another
    case, the engine a common alias names (``pytorch``, ``ort``, ``np``), else the close names (difflib).

    >>> suggest("pytorch"), suggest("JAX"), suggest("ORT"), suggest("nmupy"), suggest("tensorflow")
    ("; did you mean 'torch'?", "; did you mean 'jax'?", "; did you mean 'onnxruntime'?", "; did you mean 'numpy'?", '')
    """
    if not isinstance(name, str):
        return ""
    known = [*_MODULES, "auto"]
    low = name.strip().lower()
    same = [k for k in known if k.lower() == low] or [a for a in (_ALIASES.get(low),) if a in known]
    return f"; did you mean {same[0]!r}?" if same else did_you_mean(low, known)


def available() -> tuple[str, ...]:
    """The backends whose engine is installed here.

    >>> "numpy" in available()
    True
    """
    out = []
    for n in _MODULES:
        pkg = _PACKAGES.get(n, "")
        if n in _LOADED or not pkg or _installed(pkg):
            out.append(n)
    return tuple(out)


def _installed(pkg: str) -> bool:
    try:
        return importlib.util.find_spec(pkg) is not None
    except (ImportError, ValueError):  # sys.modules[pkg] is None (blocked), or a broken parent package
        return False
