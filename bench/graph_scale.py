"""Graph-scale benchmark: build, freeze, verify and sort a chain of N elementwise ops.

Run one library per process: ``python bench/graph_scale.py --lib opgraph --n 1000000``.
Prints one JSON object: median seconds per step over ``--repeat`` runs and bytes per op.
``--lib torchfx`` builds the same chain as a torch.fx Graph (the peer), where
PyTorch is installed.
"""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale_common
from scale_common import timed


def bench_opgraph(n: int) -> dict[str, float]:
    import opgraph
    from opgraph.core.graph import Graph

    def build() -> opgraph.GraphBuilder:
        b = opgraph.GraphBuilder()
        v = b.input(("float32", (8,)), name="x")
        w = b.input(("float32", (8,)), name="w")
        for i in range(n):
            v = b.op("add" if i % 2 else "multiply", v, w)
        b.output(v)
        return b

    out: dict[str, float] = {}
    out["build"], b = timed(build)
    out["freeze"], g = timed(b.freeze)
    out["verify"], _ = timed(g.verify)
    g._cache.clear()
    out["toposort"], _ = timed(g.topological_order)
    # A copy whose ops are stored in reverse, so the sort cannot take the fast path.
    rev = np.arange(g.num_ops)[::-1]
    in_lists = np.diff(g.in_ptr)[rev]
    starts = g.in_ptr[:-1][rev]
    idx = np.repeat(starts, in_lists) + (np.arange(in_lists.sum()) - np.repeat(np.cumsum(in_lists) - in_lists,
                                                                                in_lists))
    new_index = np.empty(g.num_ops, dtype=np.int64)
    new_index[rev] = np.arange(g.num_ops)
    shuffled = Graph(op_kind=g.op_kind[rev], op_attr=g.op_attr[rev], op_version=g.op_version[rev],
                     in_ptr=np.concatenate([[0], np.cumsum(in_lists)]), in_ids=g.in_ids[idx],
                     out_ptr=np.arange(g.num_ops + 1), out_ids=g.out_ids[rev],
                     value_type=g.value_type, value_producer=np.where(g.value_producer >= 0,
                                                                      new_index[np.maximum(g.value_producer, 0)], -1),
                     value_index=g.value_index, types=g.types, attrs=g.attrs, constants=g.constants,
                     inputs=g.inputs, outputs=g.outputs)
    out["toposort_unordered"], _ = timed(shuffled.topological_order)
    out["bytes_per_op"] = g.nbytes / g.num_ops
    out["ops"] = g.num_ops
    return out


def bench_torchfx(n: int) -> dict[str, float]:
    import torch
    import torch.fx as fx

    def build() -> fx.Graph:
        g = fx.Graph()
        v = g.placeholder("x")
        w = g.placeholder("w")
        for i in range(n):
            v = g.call_function(torch.add if i % 2 else torch.mul, (v, w))
        g.output(v)
        return g

    out: dict[str, float] = {}
    tracemalloc.start()
    out["build"], g = timed(build)
    out["bytes_per_op"] = tracemalloc.get_traced_memory()[0] / n
    tracemalloc.stop()
    out["verify"], _ = timed(g.lint)
    out["ops"] = n
    return out


def main() -> None:
    scale_common.main({"opgraph": bench_opgraph, "torchfx": bench_torchfx})


if __name__ == "__main__":
    main()
