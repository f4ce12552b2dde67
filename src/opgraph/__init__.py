"""opgraph: computation graphs over tensors.

Build a graph three ways (an explicit builder, NumPy-like lazy arrays, or a
tracing decorator), check its types and shapes, and run it::

    >>> import numpy as np, opgraph
    >>> import opgraph.numpy as onp
    >>> x = onp.asarray(np.arange(4.0))
    >>> y = onp.sum(onp.exp(x) * 2.0)
    >>> round(float(y), 6)
    62.38575
    >>> @opgraph.function
    ... def f(a, b):
    ...     return onp.tanh(a @ b)
    >>> f(np.eye(2), np.ones((2, 2)))
    array([[0.76159416, 0.76159416],
           [0.76159416, 0.76159416]])

``import opgraph`` loads the core IR and little else: op families, the
NumPy-style namespace, passes, autodiff, the runtime, formats and drawing are
imported the first time they are used (``opgraph.optimize``,
``import opgraph.io``, a graph that holds a ``conv2d``, ...).
"""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING, Any

# The core IR is what every use needs first, and the layers above fill its registry and hooks from here (Python
# runs this module before any opgraph.* module, so they are filled whatever the user imports first).
from opgraph import ops as _ops  # noqa: F401  (announces the built-in op kinds; each family loads on first use)
from opgraph._version import __version__ as __version__
from opgraph.core import (
    VOID,
    Attr,
    Graph,
    GraphBuilder,
    Op,
    OpDef,
    Symbols,
    TensorType,
    Value,
    VoidType,
    all_ops,
    get_op,
    register_op,
)
from opgraph.core import hooks as _hooks
from opgraph.errors import (
    ArgumentError,
    ExecutionError,
    FeedError,
    FormatError,
    GraphError,
    MemoryLimitError,
    MissingDependencyError,
    OpBuildError,
    OpTypeError,
    OutOfMemoryError,
    UnknownKeyError,
    VerifyError,
)
from opgraph.frontend import lazy as _lazy

if TYPE_CHECKING:
    from opgraph import autodiff as autodiff
    from opgraph import backends as backends
    from opgraph import cli as cli
    from opgraph import frontend as frontend
    from opgraph import io as io
    from opgraph import memory as memory
    from opgraph import nn as nn
    from opgraph import numpy as numpy
    from opgraph import optim as optim
    from opgraph import passes as passes
    from opgraph import runtime as runtime
    from opgraph import viz as viz
    from opgraph.autodiff import grad, hessian, hvp, jacfwd, jacobian, jacrev, jvp, linearize, value_and_grad, vjp
    from opgraph.autodiff.batching import vmap
    from opgraph.frontend.control import call, cond, fori_loop, scan, subroutine, while_loop
    from opgraph.frontend.tensor_algebra import OpGraph, tensor_expr
    from opgraph.frontend.trace import function, trace
    from opgraph.io import load, save
    from opgraph.passes import optimize
    from opgraph.runtime.compiled import compile
    from opgraph.runtime.jit import jit
    from opgraph.viz import draw

__all__ = [
    "VOID", "ArgumentError", "Attr", "ExecutionError", "FeedError", "FormatError", "Graph", "GraphBuilder",
    "GraphError", "MemoryLimitError", "MissingDependencyError", "Op", "OpBuildError", "OpDef", "OpGraph",
    "OpTypeError", "OutOfMemoryError", "Symbols", "TensorType", "UnknownKeyError", "Value", "VerifyError", "VoidType",
    "all_ops", "call", "compile", "cond", "draw", "fori_loop", "function", "get_op", "grad", "hessian", "hvp",
    "jacfwd", "jacobian", "jacrev", "jit", "jvp", "linearize", "load", "optimize", "register_op", "save", "scan",
    "subroutine", "tensor_expr", "trace", "value_and_grad", "vjp", "while_loop",
]
__all__ += ["vmap"]

# Public names that live in layers imported on first use: name -> module that defines it.
_LAZY_NAMES = {
    "call": "opgraph.frontend.control",
    "compile": "opgraph.runtime.compiled",
    "cond": "opgraph.frontend.control",
    "draw": "opgraph.viz",
    "fori_loop": "opgraph.frontend.control",
    "function": "opgraph.frontend.trace",
    "grad": "opgraph.autodiff",
    "hessian": "opgraph.autodiff",
    "hvp": "opgraph.autodiff",
    "jacfwd": "opgraph.autodiff",
    "jacrev": "opgraph.autodiff",
    "jvp": "opgraph.autodiff",
    "linearize": "opgraph.autodiff",
    "jacobian": "opgraph.autodiff",
    "jit": "opgraph.runtime.jit",
    "load": "opgraph.io",
    "OpGraph": "opgraph.frontend.tensor_algebra",
    "optimize": "opgraph.passes",
    "save": "opgraph.io",
    "scan": "opgraph.frontend.control",
    "subroutine": "opgraph.frontend.control",
    "tensor_expr": "opgraph.frontend.tensor_algebra",
    "trace": "opgraph.frontend.trace",
    "value_and_grad": "opgraph.autodiff",
    "vjp": "opgraph.autodiff",
    "vmap": "opgraph.autodiff",
    "while_loop": "opgraph.frontend.control",
}
_SUBMODULES = frozenset({"autodiff", "backends", "cli", "core", "errors", "frontend", "io", "memory", "nn", "numpy",
                         "ops", "optim", "passes", "runtime", "viz"})


def __getattr__(name: str) -> Any:
    """PEP 562: import the layer behind a public name or submodule the first time it is used."""
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups are ordinary attribute lookups
    return value


def __dir__() -> list[str]:
    # The public names and submodules, loaded or not (not the helpers this module imports for itself).
    return sorted(set(__all__) | _SUBMODULES | {n for n in globals() if n.startswith("__")})


def _fill_on_first_use(hook: _hooks.Hook[Any], module: str, attr: str) -> None:
    """Fill ``hook`` with a stand-in that imports ``module`` (which fills the hook with ``attr``) and calls it."""
    if hook.is_set:
        return

    def first_use(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), attr)(*args, **kwargs)

    hook.set(first_use)


_fill_on_first_use(_hooks.RUN, "opgraph.runtime.executor", "execute")
_fill_on_first_use(_hooks.GRAD, "opgraph.autodiff.reverse", "build_grad_ops")
_fill_on_first_use(_hooks.BODY, "opgraph.runtime.bodies", "compile_body")
_fill_on_first_use(_hooks.BODY_VJP, "opgraph.autodiff.control", "vjp_body")
_fill_on_first_use(_hooks.BODY_JVP, "opgraph.autodiff.control", "jvp_body")
_fill_on_first_use(_hooks.SVG, "opgraph.viz", "graph_repr_svg")
_fill_on_first_use(_hooks.BODY_BATCH, "opgraph.autodiff.control", "batch_body")


class _ModuleOnFirstUse(types.ModuleType):
    """Stands for a module not imported yet: the first attribute read imports it (through the import system, so
    threads wait for one another) and reads the attribute there."""

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self.__name__), attr)

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(self.__name__))


# LazyArray's NumPy dispatch (np.tanh(x), np.sum(x)) needs the whole namespace: the first call imports the module
# that attaches it (opgraph.numpy imports it too).
_fill_on_first_use(_lazy.ARRAY_METHODS, "opgraph.frontend.array_methods", "attach")

# LazyArray.__array_namespace__ returns opgraph.numpy, which wraps every op kind (so it imports every family). Until
# that module is imported (it then puts itself in the hook), the hook holds a stand-in that imports it when used.
if not _lazy.ARRAY_NAMESPACE.is_set:
    _lazy.ARRAY_NAMESPACE.set(_ModuleOnFirstUse(f"{__name__}.numpy"))
