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
from opgraph.runtime.compiled import compile
from opgraph.viz import draw

__version__ = "0.1.0"

__all__ = [
    "VOID", "Attr", "ExecutionError", "FormatError", "Graph", "GraphBuilder", "GraphError", "Op",
    "OpBuildError", "OpDef", "OpTypeError", "Symbols", "TensorType", "Value", "VerifyError",
    "VoidType", "all_ops", "compile", "draw", "function", "get_op", "grad", "optimize", "register_op", "trace",
    "value_and_grad", "vjp",
]
