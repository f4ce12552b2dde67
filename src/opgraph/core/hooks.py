"""Hooks: how the layers above ``core`` provide conveniences on core objects.

``core`` imports nothing from the layers above it (DESIGN.md, "Layers";
``make test`` checks it with import-linter), yet ``Graph.run`` runs a graph
(:mod:`opgraph.runtime`), ``GraphBuilder.build_grad_ops`` differentiates
(:mod:`opgraph.autodiff`) and ``Graph._repr_svg_`` draws (:mod:`opgraph.viz`).
Each of those layers fills its hook here when it is imported, and
``import opgraph`` (which Python runs before any ``opgraph.*`` module) imports
them all, so users always find the hooks filled. Core only calls what it was
given.

    >>> import opgraph
    >>> from opgraph.core import hooks
    >>> hooks.RUN.provider, hooks.RUN.is_set
    ('opgraph.runtime', True)
    >>> hooks.Hook("Thing.method", "opgraph.somewhere").get()
    Traceback (most recent call last):
    ...
    opgraph.core.hooks.HookNotSetError: Thing.method needs opgraph.somewhere, which has not been imported; ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import numpy as np

T = TypeVar("T")


class HookNotSetError(RuntimeError):
    """A hook was used before the layer that fills it was imported."""


class Hook(Generic[T]):
    """A slot in ``core`` for something (usually a function) that a layer above provides.

    ``what`` names the feature that uses the hook and ``provider`` the module
    that fills it; both go into the error raised when the hook is empty.

    >>> h = Hook("Demo.run", "opgraph.demo")
    >>> h.set(len)([1, 2]), h.get() is len, h.is_set
    (2, True, True)
    """

    def __init__(self, what: str, provider: str) -> None:
        self.what = what
        self.provider = provider
        self._value: T | None = None

    @property
    def is_set(self) -> bool:
        """True once the provider has filled the hook."""
        return self._value is not None

    def set(self, value: T) -> T:
        """Fill the hook and return ``value`` (so it can decorate). A later call replaces an earlier one."""
        self._value = value
        return value

    def get(self) -> T:
        """What the provider set; :class:`HookNotSetError` naming the module to import if nothing was."""
        if self._value is None:
            raise HookNotSetError(f"{self.what} needs {self.provider}, which has not been imported; "
                                  f"import opgraph (or {self.provider}) first")
        return self._value

    def get_or_none(self) -> T | None:
        """What the provider set, or None (for optional features such as notebook drawings)."""
        return self._value

    def __repr__(self) -> str:
        state = "set" if self.is_set else "empty"
        return f"<Hook {self.what} from {self.provider}: {state}>"


RUN: Hook[Callable[..., list[np.ndarray]]] = Hook("Graph.run", "opgraph.runtime")
"""``execute(graph, feeds, targets, *, backend)``: evaluates a graph (set by :mod:`opgraph.runtime.executor`)."""

BODY: Hook[Callable[[Any], Callable[[Any], list[np.ndarray]]]] = Hook("control-flow op kernels", "opgraph.runtime")
"""``compile_body(subgraph)``: the body as a function of a list of arrays returning a list of fresh arrays,
compiled once per body (set by :mod:`opgraph.runtime.bodies`; used by the kernels in :mod:`opgraph.ops.control`)."""
BODY_VJP: Hook[Callable[..., Any]] = Hook("gradients of control-flow ops", "opgraph.autodiff.control")
"""``vjp_body(subgraph, wrt, cts, given)``: the body ``(*params, *cotangents of results cts, *results given) ->
cotangents of params wrt``, built once per body (set by :mod:`opgraph.autodiff.control`; used by the grad rules
in :mod:`opgraph.ops.control`)."""
BODY_JVP: Hook[Callable[..., Any]] = Hook("tangents of control-flow ops", "opgraph.autodiff.control")
"""``jvp_body(subgraph, wrt)``: the body ``(*params, *tangents of params wrt) -> (*results, *tangents of the
floating results)``, built once per body (set by :mod:`opgraph.autodiff.control`; used by the tangent rules in
:mod:`opgraph.ops.control`)."""
BODY_BATCH: Hook[Callable[..., Any]] = Hook("batching of control-flow ops", "opgraph.autodiff.control")
"""``batch_body(subgraph, batched, size, unbatched=())``: the body with a leading batch axis of ``size`` on the
parameters flagged in ``batched`` and on every result but those listed in ``unbatched``, built once per body
(set by :mod:`opgraph.autodiff.control`; used by the batching rules in :mod:`opgraph.ops.control`)."""
GRAD: Hook[Callable[..., list[Any]]] = Hook("GraphBuilder.build_grad_ops", "opgraph.autodiff")
"""``build_grad_ops(builder, loss, values)``: appends gradient ops (set by :mod:`opgraph.autodiff.reverse`)."""

SVG: Hook[Callable[..., str | None]] = Hook("Graph._repr_svg_", "opgraph.viz")
"""``graph_repr_svg(graph)``: SVG text of a graph for notebooks, or None (set by :mod:`opgraph.viz`)."""
