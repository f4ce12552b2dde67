"""The static facts of one op (kind, attributes, input and output types) that rules look at.

Lowering rules, backend rule factories and capability limits all decide from
these facts alone, so they live at the bottom layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from opgraph.core.graph import Graph
from opgraph.core.types import ValueType


@dataclass(frozen=True)
class OpInfo:
    """The static facts of one op that a rule factory or a limit may look at.

    >>> from opgraph.core.types import TensorType
    >>> OpInfo("add", {}, (TensorType("f4", (2,)),) * 2, (TensorType("f4", (2,)),)).out_dtype
    dtype('float32')
    """

    kind: str
    attrs: Mapping[str, Any]
    in_types: tuple[ValueType, ...]
    out_types: tuple[ValueType, ...]
    op: int = -1
    version: int = 0

    @property
    def out_dtype(self) -> np.dtype:
        """The first output's dtype."""
        return self.out_types[0].dtype  # type: ignore[union-attr]

    @property
    def in_dtypes(self) -> tuple[np.dtype, ...]:
        """The inputs' dtypes."""
        return tuple(t.dtype for t in self.in_types)  # type: ignore[union-attr]

    @property
    def out_shape(self) -> tuple[int | None, ...] | None:
        """The first output's shape (None entries: dimensions known only at run time)."""
        return self.out_types[0].shape  # type: ignore[union-attr]

    @staticmethod
    def of(graph: Graph, op: int) -> OpInfo:
        """The facts of op ``op`` of ``graph``."""
        return OpInfo(graph.kind_of(op), graph.attrs_of(op),
                      tuple(graph.type_of(int(v)) for v in graph.op_inputs(op)),
                      tuple(graph.type_of(int(v)) for v in graph.op_outputs(op)),
                      op, int(graph.op_version[op]))
