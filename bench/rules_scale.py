"""Rule-pass cost on a deep graph: ``optimize(level=2)`` of a sin/multiply chain with its gradient.

``python bench/rules_scale.py --ops 100000`` builds ``x -> h = sin(h) * c`` (``(ops - 5) // 7`` steps, f64[8]),
``loss = sum(h)`` and ``d loss / d x`` with the public API (``GraphBuilder``, ``opgraph.grad``), runs
``opgraph.optimize(graph, level=2)`` once (after a warm-up on a 12-op graph) and prints one JSON object: ops
before and after, seconds to build and to optimise. Every multiply of the gradient has a multiply operand, so a
rule that scans below each candidate (the GELU matcher did, 32 ops deep) shows here as time per op;
bench/table_rules.py runs it per size, each run in its own process, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def make_graph(ops: int):  # type: ignore[no-untyped-def]
    """The chain with its gradient: 7 ops a step plus 5 (input, sum, seed, broadcast, the gradient's last op)."""
    import opgraph

    b = opgraph.GraphBuilder()
    x = b.input(("float64", (8,)), name="x")
    h = x
    for _ in range(max((ops - 5) // 7, 1)):
        h = b.multiply(b.op("sin", h), b.constant(np.float64(1.0001)))
    loss = b.op("sum", h)
    (gx,) = opgraph.grad(loss, [x])
    b.output(loss, gx)
    return b.freeze()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops", type=int, default=100_000, help="about this many ops (a multiple of 7, plus 5)")
    args = ap.parse_args()
    import opgraph

    opgraph.optimize(make_graph(12), level=2)  # imports and first-call set-up, not timed
    t0 = time.perf_counter()
    g = make_graph(args.ops)
    t1 = time.perf_counter()
    out = opgraph.optimize(g, level=2)
    t2 = time.perf_counter()
    print(json.dumps({"ops": g.num_ops, "ops_after": out.num_ops, "build": t1 - t0, "optimize": t2 - t1}))


if __name__ == "__main__":
    main()
