"""Feeds: how a key names an input and how a fed array is checked against the input's type.

Every runtime and backend accepts feeds the same way, so these live at the bottom layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opgraph.core.graph import Graph, Value
from opgraph.core.types import TensorType
from opgraph.errors import ExecutionError


def value_id(graph: Graph, key: Any) -> int:
    """The value id a feed or target key names: an id, a name or a :class:`Value`.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", ()), name="x")
    >>> value_id(b.freeze(), "x"), value_id(b.freeze(), x)
    (0, 0)
    """
    if isinstance(key, Value):
        return key.id
    if isinstance(key, str):
        return graph.find_value(key)
    return int(key)


def coerce_feed(graph: Graph, v: int, data: Any) -> np.ndarray:
    """Check a fed array against input ``v``'s type; cast only where NumPy would do so safely."""
    t = graph.type_of(v)
    assert isinstance(t, TensorType)
    arr = np.asarray(data)
    if arr.dtype != t.dtype:
        if isinstance(data, np.ndarray) and not np.can_cast(arr.dtype, t.dtype, "same_kind"):
            raise ExecutionError(f"input {graph.value_label(v)} expects {t}, got an array of dtype {arr.dtype}")
        arr = arr.astype(t.dtype)
    if not t.accepts(arr):
        raise ExecutionError(f"input {graph.value_label(v)} expects {t}, got shape {arr.shape}")
    return arr
