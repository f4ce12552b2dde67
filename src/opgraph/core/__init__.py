"""Core IR: types, the op registry, the columnar Graph and the GraphBuilder."""

from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Graph, Op, Symbols, Value
from opgraph.core.registry import Attr, OpDef, all_ops, get_op, register_op
from opgraph.core.types import VOID, TensorType, VoidType

__all__ = ["VOID", "Attr", "Graph", "GraphBuilder", "Op", "OpDef", "Symbols", "TensorType", "Value",
           "VoidType", "all_ops", "get_op", "register_op"]
