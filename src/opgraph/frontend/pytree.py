"""Pytrees: nested dicts, tuples, lists, namedtuples and ``None`` whose leaves are arrays, as JAX has them.

A thin opgraph layer over `optree <https://github.com/metaopt/optree>`_: trees
are flattened into a list of leaves and a hashable tree definition (a
``PyTreeSpec``, part of the trace cache keys), and the path of each leaf is
written two ways: :func:`keystrs` for messages (``params['w']``, JAX's
spelling) and :func:`input_name` for graph inputs (``params.w``).

NumPy arrays, lazy arrays and Python scalars are leaves; ``None`` is an empty
subtree. Dicts flatten in sorted key order (insertion order when the keys do
not sort) and unflatten in the order they were given, as in JAX. Custom
containers register with optree under the namespace :data:`NAMESPACE`
(``optree.register_pytree_node(cls, flatten, unflatten, namespace="opgraph")``).

    >>> import numpy as np
    >>> from opgraph.frontend import pytree
    >>> leaves, spec = pytree.flatten({"w": np.ones(2), "b": (1.0, None)})
    >>> leaves
    [1.0, array([1., 1.])]
    >>> pytree.unflatten(spec, [2.0, np.zeros(2)])
    {'w': array([0., 0.]), 'b': (2.0, None)}
    >>> pytree.keystrs("params", {"w": 0, "b": [1, 2]})
    ["params['b'][0]", "params['b'][1]", "params['w']"]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import optree

NAMESPACE = "opgraph"
"""optree's registry namespace for containers registered for opgraph (the built-in ones need none)."""

PyTreeSpec = optree.PyTreeSpec

__all__ = ["NAMESPACE", "PyTreeSpec", "flatten", "input_name", "keystrs", "paths", "unflatten"]


def flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> tuple[list[Any], PyTreeSpec]:
    """The leaves of ``tree`` and its tree definition (hashable; compare with ``==``).

    >>> leaves, spec = flatten([1, (2, 3)])
    >>> leaves, spec.num_leaves
    ([1, 2, 3], 3)
    """
    return optree.tree_flatten(tree, is_leaf, none_is_leaf=False, namespace=NAMESPACE)


def unflatten(spec: PyTreeSpec, leaves: Sequence[Any]) -> Any:
    """The tree of definition ``spec`` holding ``leaves`` (any objects, trees too).

    >>> _, spec = flatten({"a": 1, "b": 2})
    >>> unflatten(spec, ["x", "y"])
    {'a': 'x', 'b': 'y'}
    """
    return optree.tree_unflatten(spec, list(leaves))


def paths(tree: Any) -> list[tuple[Any, ...]]:
    """The path of each leaf, in :func:`flatten` order: one entry per level (dict key, index or field name).

    >>> import collections
    >>> Point = collections.namedtuple("Point", "x y")
    >>> paths({"p": Point(1, 2), "n": None})
    [('p', 'x'), ('p', 'y')]
    """
    return [tuple(_entry(e) for e in acc) for acc in optree.tree_accessors(tree, none_is_leaf=False,
                                                                           namespace=NAMESPACE)]


def _entry(e: Any) -> Any:
    # namedtuple fields and dataclass fields read better by name than by position
    for attr in ("field", "name"):
        if isinstance(getattr(e, attr, None), str):
            return getattr(e, attr)
    return e.entry


def keystrs(root: str, tree: Any) -> list[str]:
    """Each leaf's path as Python would spell it, for messages (JAX's ``keystr`` with a root name).

    String keys are quoted; namedtuple fields are attributes.

    >>> import collections
    >>> Point = collections.namedtuple("Point", "x y")
    >>> keystrs("p", {"a": Point(1, 2), "b": [3]})
    ["p['a'].x", "p['a'].y", "p['b'][0]"]
    """
    out = []
    for acc in optree.tree_accessors(tree, none_is_leaf=False, namespace=NAMESPACE):
        text = root
        for e in acc:
            field = getattr(e, "field", None)
            text += f".{field}" if isinstance(field, str) else f"[{e.entry!r}]"
        out.append(text)
    return out


def input_name(root: str, path: Sequence[Any]) -> str:
    """A leaf's path as a graph input name: the parts joined by dots (``params.w``, ``xs.0``).

    >>> input_name("params", ("layers", 0, "w"))
    'params.layers.0.w'
    >>> input_name("x", ())
    'x'
    """
    return ".".join([root, *(str(k) for k in path)])
