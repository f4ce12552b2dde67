"""Compiled bodies: how the NumPy kernels of control-flow ops run a subgraph.

Each body is compiled once (a :class:`~opgraph.backends.numpy.CompiledGraph`
with its own planned arena, kept on the :class:`~opgraph.core.subgraph.Subgraph`)
and then called once per trip with positional arrays; every call returns
fresh arrays, so a loop's carry never aliases the arena. A body's memory is
its plan's arena, whatever the trip count.

    >>> import numpy as np, opgraph
    >>> from opgraph.core.subgraph import Subgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (2,)), name="x"); b.output(b.exp(x))
    >>> f = compile_body(Subgraph(b.freeze()))
    >>> f([np.zeros(2)])
    [array([1., 1.])]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from opgraph.core import hooks
from opgraph.core.subgraph import Subgraph


def compile_body(body: Subgraph) -> Callable[[Sequence[Any]], list[np.ndarray]]:
    """``body`` as a function of a list of arrays (its parameters in order) returning its results.

    Compiled on first use and kept on ``body`` (see the module doc).
    """

    def make() -> Callable[[Sequence[Any]], list[np.ndarray]]:
        from opgraph.backends.numpy import CompiledGraph

        return CompiledGraph(body.graph).positional()

    return body.cache(("numpy-body",), make)  # type: ignore[no-any-return]


hooks.BODY.set(compile_body)
