"""``opgraph plan FILE``: the memory plan of a graph file and the planner statistics.

``opgraph plan --backend B FILE`` shows instead where each op runs on backend B
(after lowering and partitioning) and why. ``--backend auto`` first shows the
choice and why (per engine: timed, or left out and why; see
:mod:`opgraph.runtime.auto`), timed on the ``--set NAME=FILE.npy`` inputs and
seeded random ones for the others (:func:`example_feeds`), then the chosen
engine's placement.

Prints our plan (arena, output and state buffers), Owl's Algorithm 1 on the
same schedule, the lower bound (largest total of live bytes at any step) and
the no-reuse total; ``--json`` prints the statistics as one JSON object.

    >>> import argparse
    >>> parser = argparse.ArgumentParser(); sub = parser.add_subparsers()
    >>> add_parser(sub, argparse.ArgumentParser(add_help=False))
    >>> parser.parse_args(["plan", "g.json", "--schedule", "dfs"]).schedule
    'dfs'
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def _mb(n: int) -> str:
    return f"{n / 2**20:,.3f}"


def _cmd_plan(args: argparse.Namespace) -> int:
    from opgraph.cli.main import load_graph, print_table, read_feeds
    from opgraph.memory import plan_memory

    graph = load_graph(args.file)
    if args.backend is not None:
        # the runtime module, not the opgraph façade: cli sits below the façade in the layers (pyproject.toml)
        from opgraph.runtime.compiled import compile

        if args.backend == "auto":
            feeds, made = example_feeds(graph, read_feeds(graph, args.set))
            compiled = compile(graph, backend="auto", device=args.device, example_inputs=feeds, budget=args.budget)
            if made:
                print(f"timed on seeded random inputs for {', '.join(made)} (--set NAME=FILE.npy gives your own)")
        else:
            compiled = compile(graph, backend=args.backend, device=args.device)
        print(compiled.explain())
        return 0
    plan = plan_memory(graph, schedule=args.schedule)
    s = plan.stats()
    if args.json:
        print(json.dumps(s))
        return 0
    bound = max(s["lower_bound_bytes"], 1)
    rows: list[list[Any]] = [
        ["ours (planned: arena + output + state buffers)", s["planned_bytes"], _mb(s["planned_bytes"]),
         f"{s['planned_bytes'] / bound:.3f}"],
        ["  arena", s["arena_bytes"], _mb(s["arena_bytes"]), ""],
        ["  output buffers", s["output_bytes"], _mb(s["output_bytes"]), ""],
        ["  state buffers (update sources)", s["state_bytes"], _mb(s["state_bytes"]), ""],
        [f"Owl's Algorithm 1 ({s['owl_blocks']} blocks)", s["owl_bytes"], _mb(s["owl_bytes"]),
         f"{s['owl_bytes'] / bound:.3f}"],
        ["lower bound (peak live bytes)", s["lower_bound_bytes"], _mb(s["lower_bound_bytes"]), "1.000"],
        ["no reuse (sum of all values)", s["no_reuse_bytes"], _mb(s["no_reuse_bytes"]),
         f"{s['no_reuse_bytes'] / bound:.3f}"],
    ]
    print_table(f"memory plan of {args.file}: schedule {s['schedule']}, packing {s['packing']}",
                ["", "bytes", "MiB", "/ bound"], rows)
    print(f"{s['ops']} ops scheduled, {s['planned_values']} values planned ({s['groups']} storage groups, "
          f"{s['inplace']} in place), {s['dynamic_values']} of dynamic shape allocated at run time")
    return 0


def example_feeds(graph: Any, given: dict[int, Any]) -> tuple[dict[int, Any], list[str]]:
    """``given`` plus seeded random arrays for the other inputs (``auto`` times the engines on them), and the
    labels of those made up. Floats are standard normal, integers in [0, 4) (safe as small indices), booleans
    random; an input of dynamic shape must be given.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float32", (2,)), name="x"); b.output(x)
    >>> feeds, made = example_feeds(b.freeze(), {})
    >>> feeds[0].dtype, feeds[0].shape, made
    (dtype('float32'), (2,), ['%x'])
    """
    import numpy as np

    from opgraph.cli.main import UsageError
    from opgraph.core.types import TensorType

    rng = np.random.default_rng(0)
    feeds, made = dict(given), []
    for v in graph.inputs.tolist():
        if v in feeds:
            continue
        t = graph.type_of(v)
        label = graph.value_label(v)
        if not isinstance(t, TensorType) or not t.is_static:
            raise UsageError(f"--backend auto times the engines on example inputs, and input {label} has type {t}: "
                             f"give it with --set {label.lstrip('%')}=FILE.npy")
        kind = t.dtype.kind
        if kind == "b":
            arr = rng.random(t.shape) < 0.5
        elif kind in "iu":
            arr = rng.integers(0, 4, size=t.shape)
        elif kind == "c":
            arr = rng.standard_normal(t.shape) + 1j * rng.standard_normal(t.shape)
        else:
            arr = rng.standard_normal(t.shape)
        feeds[v] = np.asarray(arr).astype(t.dtype)
        made.append(label)
    return feeds, made


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    """Add the ``plan`` subcommand."""
    p = subparsers.add_parser("plan", parents=[common], help="memory plan and planner statistics")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--schedule", choices=("best", "dfs", "greedy"), default="best",
                   help="evaluation order: Owl's post-order DFS, the memory-aware greedy, or the better (default)")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.add_argument("--backend", default=None,
                   help="instead of the memory plan, show where each op runs on this backend and why "
                        "(jax, torch, onnxruntime, numpy; auto: the choice, why, then the chosen engine's)")
    p.add_argument("--device", default=None, help="with --backend: the device (cpu, cuda)")
    p.add_argument("--set", action="append", metavar="NAME=FILE.npy",
                   help="with --backend auto: an example input to time on (repeatable; others are seeded random)")
    p.add_argument("--budget", type=float, default=2.0, metavar="SECONDS",
                   help="with --backend auto: seconds to spend, after the first engine's compile, compiling and "
                        "timing the others that can win (default 5)")
    p.set_defaults(func=_cmd_plan)
