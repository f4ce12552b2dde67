"""The numpy backend: every op's NumPy kernel, run by the arena runtime (:mod:`.arena`).

The engine runs every op kind: its own fast kernel where its rule table has
one (:meth:`NumpyBackend.kernel_for`), else the op's reference kernel
(``OpDef.kernel``). :meth:`NumpyBackend.compile_graph` compiles a graph into a
:class:`~opgraph.backends.numpy.arena.CompiledGraph`: its memory planned into
one preallocated arena, its schedule a flat program that the code generator
(:mod:`.codegen`) writes as one straight-line Python function.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> b.output(b.op("exp", b.op("multiply", x, 2.0)))
    >>> exe = BACKEND.compile_graph(b.freeze())
    >>> exe([np.zeros(3)])
    [array([1., 1., 1.])]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.backends.base import Backend, Executable, OpInfo
from opgraph.backends.numpy.arena import (
    BATCH_SLICED,
    CODEGEN_LIMIT,
    WORKSPACE_LIMIT,
    CompiledGraph,
    EvalContext,
    Step,
)
from opgraph.backends.numpy.buffers import aligned_empty
from opgraph.backends.numpy.codegen import SMALL_OUTPUT_BIN, Codegen
from opgraph.core.graph import Graph
from opgraph.core.registry import OpDef, all_ops, get_op
from opgraph.memory.plan import MemoryPlan

__all__ = ["BACKEND", "BATCH_SLICED", "CODEGEN_LIMIT", "SMALL_OUTPUT_BIN", "WORKSPACE_LIMIT", "Codegen",
           "CompiledGraph", "EvalContext", "NumpyBackend", "Step", "aligned_empty"]


class _ArenaExecutable(Executable):
    """A :class:`CompiledGraph` called positionally, as the runtime calls every backend's executables."""

    def __init__(self, compiled: CompiledGraph) -> None:
        self.compiled = compiled
        self._inputs = compiled.graph.inputs.tolist()

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        return self.compiled(dict(zip(self._inputs, args, strict=True)))


class NumpyBackend(Backend):
    """The default backend: every op's NumPy kernel, run by the arena runtime (:class:`CompiledGraph`).

    Its rule table holds the engine's own fast kernels (numba loops, blocked and threaded NumPy), each
    registered with ``@BACKEND.rule(kind)`` in the package's module named after the op's family; a kind
    without one runs its reference kernel (``OpDef.kernel``), so every op kind runs, user ops included.
    """

    def kernel_for(self, kind: str | int | OpDef, version: int) -> Callable[..., Any]:
        """The kernel this engine runs for ``kind`` at ``version``: its fast kernel, else the op's reference kernel.

        >>> BACKEND.kernel_for("add", 12) is get_op("add").kernel_for(12)
        True
        """
        d = get_op(kind)
        fast = self.rules.get(d.name)
        return fast if fast is not None else d.kernel_for(version)

    @staticmethod
    def has_kernel(kind: str) -> bool:
        """True when op ``kind`` has a NumPy kernel (any version); the registry is asked, so user ops count too.

        >>> NumpyBackend.has_kernel("add"), NumpyBackend.has_kernel("no_such_kind")
        (True, False)
        """
        try:
            d = get_op(kind)
        except KeyError:
            return False
        return d.kernel is not None or bool(d.kernels) or d.name in BACKEND.rules

    def kinds(self) -> frozenset[str]:
        return frozenset(d.name for d in all_ops() if self.has_kernel(d.name))

    def why_not(self, info: OpInfo) -> str | None:
        return None if self.has_kernel(info.kind) else f"op {info.kind!r} has no numpy kernel"

    def supports(self, kind: str, in_types: Sequence[Any] | None = None, out_types: Sequence[Any] | None = None,
                 attrs: Mapping[str, Any] | None = None) -> bool:
        return self.has_kernel(kind)

    def compile_graph(self, graph: Graph, *, device: str | None = None, donate: Sequence[int] = (),
                      schedule: str | np.ndarray = "best", plan: MemoryPlan | None = None,
                      memory_limit: Any = "auto", **options: Any) -> Executable:
        """The arena runtime on ``graph`` (``schedule``/``plan``/``memory_limit`` as for :class:`CompiledGraph`)."""
        self.check_device(device)
        if options:
            raise TypeError(f"the numpy backend takes no option(s) {sorted(options)}")
        return _ArenaExecutable(CompiledGraph(graph, schedule=schedule, plan=plan, memory_limit=memory_limit))


BACKEND = NumpyBackend(
    "numpy", doc="NumPy kernels in one planned memory arena (the default; always available)")

# The family modules register the engine's fast kernels on BACKEND when imported, so they come after it.
from opgraph.backends.numpy import elementwise, fused, nn, reduction  # noqa: E402,F401
