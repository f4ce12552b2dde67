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
"""

# Some modules fill registries and hooks of the layers below them when they are imported (DESIGN.md, "Layers"):
# opgraph.ops the op registry, opgraph.runtime.executor Graph.run, opgraph.autodiff GraphBuilder.build_grad_ops,
# opgraph.viz Graph._repr_svg_, opgraph.numpy the Array API namespace of lazy arrays. Python runs this module
# before any opgraph.* module, so importing them all here makes those work whatever the user imports.
from opgraph import numpy, ops  # noqa: F401
from opgraph._version import __version__ as __version__
from opgraph.autodiff import grad, value_and_grad, vjp
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
from opgraph.errors import (
    ExecutionError,
    FormatError,
    GraphError,
    OpBuildError,
    OpTypeError,
    VerifyError,
)
from opgraph.frontend.trace import function, trace
from opgraph.passes import optimize
from opgraph.runtime import executor as _executor  # noqa: F401
from opgraph.runtime.compiled import compile
from opgraph.viz import draw

__all__ = [
    "VOID", "Attr", "ExecutionError", "FormatError", "Graph", "GraphBuilder", "GraphError", "Op",
    "OpBuildError", "OpDef", "OpTypeError", "Symbols", "TensorType", "Value", "VerifyError",
    "VoidType", "all_ops", "compile", "draw", "function", "get_op", "grad", "optimize", "register_op", "trace",
    "value_and_grad", "vjp",
]
