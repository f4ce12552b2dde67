"""Pass-scale benchmark: DCE, CSE and the rule pass on a graph of N ops built directly as arrays.

``python bench/passes_scale.py --n 1000000`` prints one JSON object: median
seconds per pass over ``--repeat`` runs, and what each pass changed.

The graph is a chain of N binary elementwise ops (multiply and add, f64[8])
on an input ``x`` and a weight ``w``, in which every 7th op duplicates the
one before it (CSE merges it), every 11th op is dead (DCE drops it) and
every 10th op multiplies by the constant 1 (the ``multiply_one`` rule).
``--lib torchfx`` times torch.fx's ``Graph.eliminate_dead_code`` on the same
chain (torch.fx has DCE but no CSE or rule engine in its core).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale_common
from scale_common import timed


def make_graph(n: int) -> Any:
    from opgraph.core.graph import Graph
    from opgraph.core.registry import get_op, resolve
    from opgraph.core.types import TensorType

    vec, sca = TensorType("float64", (8,)), TensorType("float64", ())
    version = resolve("add", [vec, vec], {}).version
    k = np.arange(1, n + 1, dtype=np.int64)
    mul, add = get_op("multiply").id, get_op("add").id
    dup = k % 7 == 0
    dead = (k % 11 == 0) & ~dup
    base = np.where(dup, k - 1, k)
    kind = np.where(base % 2 == 1, mul, add)
    out = k + 2                                      # value of op k; 0 x, 1 w, 2 the constant 1.0
    prev = np.where(k == 1, 0, out - 1)
    after_dead = np.zeros(n, dtype=bool)
    after_dead[1:] = dead[:-1]
    prev = np.where(after_dead, np.maximum(out - 2, 0), prev)
    prev = np.where(k == 2, np.where(dead[0], 0, prev), prev)
    second = np.where(base % 10 == 5, 2, 1)
    first = prev.copy()
    first[dup] = first[np.flatnonzero(dup) - 1]      # a duplicate reads what op k-1 reads
    second[dup] = second[np.flatnonzero(dup) - 1]
    in_ids = np.empty(2 * n + 0, dtype=np.int64)
    in_ids[0::2], in_ids[1::2] = first, second
    n_ops = n + 1
    op_kind = np.concatenate([[0], kind])
    op_attr = np.concatenate([[0], np.ones(n, np.int64)])
    op_version = np.concatenate([[0], np.full(n, version)])
    in_ptr = np.concatenate([[0, 0], 2 * k])
    out_ptr = np.arange(n_ops + 1)
    out_ids = np.concatenate([[2], out])
    n_values = n + 3
    value_type = np.zeros(n_values, np.int64)
    value_type[2] = 1
    value_producer = np.concatenate([[-1, -1, 0], k])
    return Graph(op_kind=op_kind, op_attr=op_attr, op_version=op_version, in_ptr=in_ptr, in_ids=in_ids,
                 out_ptr=out_ptr, out_ids=out_ids, value_type=value_type, value_producer=value_producer,
                 value_index=np.zeros(n_values, np.int64), types=[vec, sca], attrs=[(("index", 0),), ()],
                 constants=[np.array(1.0)], inputs=[0, 1], outputs=[n_values - 1])


def bench_opgraph(n: int) -> dict[str, Any]:
    from opgraph.passes import SIMPLIFY, cse, dce, optimize, rewrite

    out: dict[str, Any] = {}
    out["build"], g = timed(lambda: make_graph(n))
    g.verify()

    def fresh() -> Any:
        g._cache.clear()
        return g

    out["dce"], r = timed(lambda: dce(fresh()))
    out["dce_changed"] = r.total
    out["cse"], r = timed(lambda: cse(fresh()))
    out["cse_changed"] = r.total
    out["rules"], r = timed(lambda: rewrite(fresh(), SIMPLIFY, fold=True))
    out["rules_changed"] = r.total
    out["optimize"], rep = timed(lambda: optimize(fresh(), report="data"))
    out["ops_after"] = rep.ops_after
    out["ops"] = g.num_ops
    return out


def bench_torchfx(n: int) -> dict[str, Any]:
    import torch
    import torch.fx as fx

    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    v = x
    for i in range(1, n + 1):
        nxt = g.call_function(torch.mul if i % 2 else torch.add, (v, w))
        if i % 11:
            v = nxt
    g.output(v)
    out: dict[str, Any] = {"ops": n}
    out["dce"], _ = timed(g.eliminate_dead_code)
    return out


def main() -> None:
    scale_common.main({"opgraph": bench_opgraph, "torchfx": bench_torchfx})


if __name__ == "__main__":
    main()
