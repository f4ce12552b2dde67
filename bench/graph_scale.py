"""Graph-scale benchmark (issue 13): build, verify, sort, compile, save and load one DAG of N ops.

One system and one size per process; it prints one JSON line::

    python bench/graph_scale.py --lib opgraph   --n 100000 --repeat 5
    python bench/graph_scale.py --lib bulk      --n 100000 --repeat 5
    python bench/graph_scale.py --lib rustworkx --n 100000 --repeat 5
    python bench/graph_scale.py --lib networkx  --n 100000 --repeat 5
    python bench/graph_scale.py --lib bulk --n 100000000 --repeat 1 --io   # the 10^8 run (~10+ GB)

The DAG (every system builds the same one): value 0 is the input ``x``
(float32, shape (8,)); op ``i`` (0 <= i < N) writes value ``i + 1`` as
``multiply`` (i even) or ``add`` (i odd) of value ``i`` (the previous one)
and value ``other[i]``, drawn uniformly from ``0 .. i`` (seed 0). The peers
(rustworkx, networkx) hold it as a directed graph of the N + 1 values with
the 2 N edges ``i -> i + 1`` and ``other[i] -> i + 1`` and no payloads
(structure only; opgraph also stores each op's kind, attributes, version and
each value's type).

Systems (``--lib``):

* ``opgraph``: ``opgraph.GraphBuilder`` op by op with the garbage collector
  enabled, as users run it, then ``freeze()`` (time, peak and retained RSS,
  and tracemalloc where ``--tracemalloc-max`` allows); ``Graph.verify()``;
  ``opgraph.compile`` of the same graph (forward) and of a gradient graph
  (``build_grad_ops`` of ``sum(y)`` for the chain ``y = multiply(sin(y), x)``,
  N // 7 steps, ~7 ops each); save and load as .cg and JSON (``opgraph.io``),
  each load in a fresh process.
* ``bulk``: the same DAG as NumPy arrays given to ``Graph.from_arrays`` (a
  checked constructor) where it exists, else ``Graph(...)`` then
  ``.verify()``; ``topological_order()`` of that graph (in order: the
  vectorised check) and of a copy with its ops stored in a random order
  (seed 1; Kahn's algorithm), up to ``--sort-max``; with ``--io`` also .cg
  save and load (the 10^8 run).
* ``rustworkx``: ``PyDiGraph`` from Python lists (``add_nodes_from`` +
  ``add_edges_from_no_data``) and node by node (``add_node``/``add_edge``),
  ``is_directed_acyclic_graph``, ``topological_sort`` of a graph whose nodes
  were added in a random order.
* ``networkx``: ``DiGraph.add_nodes_from`` + ``add_edges_from``,
  ``is_directed_acyclic_graph``, ``list(topological_sort(...))`` as above.

Times are medians over ``--repeat`` runs; a step stops repeating once its
runs took ``--budget`` seconds (each step records how many runs it had).
Memory: see scale_common (RSS deltas per step; a fresh process per load,
under an address-space limit of 90% of the memory available when it starts,
or OPGRAPH_BENCH_LOAD_LIMIT_GB).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_common import PEAK_METHOD, measure, peak_rss_bytes, release_memory, reset_peak, rss_bytes

SEED, SHUFFLE_SEED = 0, 1
CG_SUFFIXES = (".cg", ".cgc", ".cgio", ".cgs")


# ----------------------------------------------------------------------------- the DAG
def dag(n: int) -> np.ndarray:
    """``other[i]``: op i's second input, a value drawn uniformly from 0 .. i."""
    other = np.random.default_rng(SEED).random(n)
    other *= np.arange(1, n + 1, dtype=np.float64)
    out = other.astype(np.int32)
    del other
    np.minimum(out, np.arange(n, dtype=np.int32), out=out)  # u * (i + 1) may round up to i + 1
    return out


def peer_edges(other: np.ndarray, value_perm: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Edges of the value graph (``i -> i + 1``, ``other[i] -> i + 1``), as node ids after ``value_perm``."""
    n = len(other)
    dst = np.repeat(np.arange(1, n + 1, dtype=np.int64), 2)
    src = np.empty(2 * n, dtype=np.int64)
    src[0::2] = np.arange(n)
    src[1::2] = other
    if value_perm is not None:  # node k holds value value_perm[k]: map value v to node inv[v]
        inv = np.empty_like(value_perm)
        inv[value_perm] = np.arange(len(value_perm))
        src, dst = inv[src], inv[dst]
    return src, dst


def graph_arrays(other: np.ndarray, op_perm: np.ndarray | None = None) -> dict[str, Any]:
    """The opgraph Graph of the DAG as constructor arguments, in the library's own dtypes (no copies).

    With ``op_perm``, position ``j`` holds op ``op_perm[j]`` (the values keep their ids).
    """
    from opgraph.core.registry import get_op, resolve
    from opgraph.core.types import TensorType

    n = len(other)
    t = TensorType("float32", (8,))
    mul, add = get_op("multiply").id, get_op("add").id
    version = resolve("add", [t, t], {}).version
    assert version == resolve("multiply", [t, t], {}).version
    kind = np.full(n, mul, dtype=np.int32)
    kind[1::2] = add
    in_ids = np.empty(2 * n, dtype=np.int32)
    in_ids[0::2] = np.arange(n, dtype=np.int32)
    in_ids[1::2] = other
    out_ids = np.arange(1, n + 1, dtype=np.int32)
    producer = np.empty(n + 1, dtype=np.int32)
    producer[0] = -1
    producer[1:] = np.arange(n, dtype=np.int32)
    if op_perm is not None:
        kind = kind[op_perm]
        in_ids = in_ids.reshape(n, 2)[op_perm].reshape(-1)
        out_ids = out_ids[op_perm]
        producer[1 + op_perm] = np.arange(n, dtype=np.int32)
    return {"op_kind": kind, "op_attr": np.zeros(n, np.int32), "op_version": np.full(n, version, np.int32),
            "in_ptr": np.arange(0, 2 * n + 1, 2, dtype=np.int64), "in_ids": in_ids,
            "out_ptr": np.arange(n + 1, dtype=np.int64), "out_ids": out_ids,
            "value_type": np.zeros(n + 1, np.int32), "value_producer": producer,
            "value_index": np.zeros(n + 1, np.int32), "types": [t], "attrs": [()], "constants": [],
            "inputs": [0], "outputs": [n]}


def bulk_constructor() -> str:
    from opgraph.core.graph import Graph

    return "Graph.from_arrays" if hasattr(Graph, "from_arrays") else "Graph() + verify()"


def bulk_graph(arrays: dict[str, Any]) -> Any:
    """The checked bulk path: ``Graph.from_arrays`` where the library has it, else ``Graph(...).verify()``."""
    from opgraph.core.graph import Graph

    if hasattr(Graph, "from_arrays"):
        return Graph.from_arrays(**arrays)
    return Graph(**arrays).verify()


def check_order(order: np.ndarray, n: int, src: np.ndarray, dst: np.ndarray) -> None:
    """Raise unless ``order`` is a permutation of 0 .. n-1 with every ``src`` before its ``dst``."""
    order = np.asarray(order, dtype=np.int64)
    pos = np.full(n, -1, dtype=np.int64)
    pos[order] = np.arange(len(order))
    if len(order) != n or np.any(pos < 0) or np.any(pos[src] >= pos[dst]):
        raise SystemExit("topological sort returned an invalid order")


def op_edges(g: Any) -> tuple[np.ndarray, np.ndarray]:
    """Op-to-op dependencies of an opgraph Graph, for check_order."""
    src = g.value_producer[g.in_ids].astype(np.int64)
    dst = np.repeat(np.arange(g.num_ops), np.diff(g.in_ptr))
    keep = src >= 0
    return src[keep], dst[keep]


# ----------------------------------------------------------------------------- opgraph: builder
def build_with_builder(other: np.ndarray) -> tuple[Any, list[Any]]:
    """The DAG op by op; returns the builder and the Value handles (a user keeps them to refer back)."""
    import opgraph

    b = opgraph.GraphBuilder()
    x = b.input(("float32", (8,)), name="x")
    handles = [x]
    append, op = handles.append, b.op
    v = x
    for i, o in enumerate(other.tolist()):
        v = op("add" if i & 1 else "multiply", v, handles[o])
        append(v)
    b.output(v)
    return b, handles


def build_grad(steps: int) -> Any:
    """Builder holding ``y = multiply(sin(y), x)`` ``steps`` times, ``loss = sum(y)`` and d loss / d x."""
    import opgraph

    b = opgraph.GraphBuilder()
    x = b.input(("float32", (8,)), name="x")
    y = x
    for _ in range(steps):
        y = b.multiply(b.sin(y), x)
    loss = b.sum(y)
    (gx,) = b.build_grad_ops(loss, [x])
    b.output(loss, gx)
    return b


def builder_step(other: np.ndarray, repeat: int, budget: float) -> tuple[dict[str, Any], Any]:
    """Build + freeze ``repeat`` times (fewer past ``budget``); per run: times, peak RSS, RSS kept by the
    builder and graph (handles dropped), by the graph alone (builder dropped). Returns the last graph."""
    n = len(other)
    rows: dict[str, list[float]] = {k: [] for k in ("build", "freeze", "peak", "kept_builder", "kept_graph")}
    exact = True
    g = None
    for _ in range(max(1, repeat)):
        g = None
        release_memory()
        base = rss_bytes()
        exact = reset_peak() and exact
        t0 = time.perf_counter()
        b, handles = build_with_builder(other)
        t1 = time.perf_counter()
        g = b.freeze()
        t2 = time.perf_counter()
        rows["peak"].append(max(0, peak_rss_bytes() - base))
        del handles
        release_memory()
        rows["kept_builder"].append(rss_bytes() - base)
        del b
        release_memory()
        rows["kept_graph"].append(rss_bytes() - base)
        rows["build"].append(t1 - t0)
        rows["freeze"].append(t2 - t1)
        if sum(rows["build"]) + sum(rows["freeze"]) >= budget:
            break
    med = {k: statistics.median(v) for k, v in rows.items()}
    assert g is not None and g.num_ops == n
    out = {"s": med["build"], "freeze_s": med["freeze"], "runs": len(rows["build"]), "times": rows["build"],
           "peak": int(med["peak"]), "retained_builder": int(med["kept_builder"]),
           "retained_graph": int(med["kept_graph"]), "graph_nbytes": g.nbytes, "exact_peak": exact}
    return out, g


def builder_tracemalloc(other: np.ndarray) -> dict[str, int]:
    """One build under tracemalloc: Python-heap peak, and what builder + graph and the graph alone keep."""
    gc.collect()
    tracemalloc.start()
    b, handles = build_with_builder(other)
    g = b.freeze()
    peak = tracemalloc.get_traced_memory()[1]
    del handles
    gc.collect()
    kept_builder = tracemalloc.get_traced_memory()[0]
    del b
    gc.collect()
    kept_graph = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert g.num_ops == len(other)
    return {"peak": peak, "retained_builder": kept_builder, "retained_graph": kept_graph}


def compile_stats(compiled: Any) -> dict[str, Any]:
    plan = getattr(compiled, "plan", None)
    if plan is None or not hasattr(plan, "stats"):
        return {"compiled": type(compiled).__name__}
    s = plan.stats()
    return {"compiled": type(compiled).__name__, "planned_bytes": s.get("planned_bytes"),
            "lower_bound_bytes": s.get("lower_bound_bytes"), "no_reuse_bytes": s.get("no_reuse_bytes")}


def compile_step(g: Any, repeat: int, budget: float) -> dict[str, Any]:
    import opgraph

    def once() -> Any:
        g._cache.clear()  # compile from a fresh graph every run
        return opgraph.compile(g)

    m, compiled = measure(once, repeat, budget)
    return {**m.as_dict(), "ops": g.num_ops, **compile_stats(compiled)}


# ----------------------------------------------------------------------------- save / load
def file_size(path: str) -> int:
    if path.endswith(".cg"):
        base = path[: -len(".cg")]
        return sum(os.path.getsize(base + s) for s in CG_SUFFIXES)
    return os.path.getsize(path)


def tiny_graph() -> Any:
    return bulk_graph(graph_arrays(dag(4)))


def save_load_step(g: Any, fmt: str, tmp: str, repeat: int, budget: float) -> dict[str, Any]:
    """Save ``g`` as ``fmt`` ('.cg' or '.json') in-process; load it in a fresh process."""
    import opgraph.io as oio

    path = os.path.join(tmp, "graph" + fmt)
    warm = os.path.join(tmp, "tiny" + fmt)
    oio.save(tiny_graph(), warm)
    save, _ = measure(lambda: oio.save(g, path), repeat, budget)
    size = file_size(path)
    load = load_in_child(path, warm, repeat, budget)
    if "error" not in load and load["ops"] != g.num_ops:
        raise SystemExit(f"{path}: loaded {load['ops']} ops, saved {g.num_ops}")
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    return {"save": save.as_dict(), "load": load, "file_bytes": size}


def memory_limit() -> int | None:
    """Address-space limit for a loading process: OPGRAPH_BENCH_LOAD_LIMIT_GB (0: none), else 90% of the
    memory available now, so that a load that needs too much fails with MemoryError instead of waking the
    kernel's OOM killer on a shared machine."""
    text = os.environ.get("OPGRAPH_BENCH_LOAD_LIMIT_GB")
    if text is not None:
        return int(float(text) * 2**30) or None
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(0.9 * int(fields["MemAvailable"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        return None


def load_in_child(path: str, warm: str, repeat: int, budget: float) -> dict[str, Any]:
    limit = memory_limit()

    def cap() -> None:
        import resource

        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.run([sys.executable, __file__, "--load", path, "--warm", warm, "--repeat", str(repeat),
                           "--budget", str(budget)], capture_output=True, text=True, preexec_fn=cap)
    if proc.returncode != 0:
        print(f"loading {path} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return {"error": (proc.stderr.strip().splitlines() or ["killed"])[-1][-300:], "ops": None}
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def load_only(path: str, warm: str, repeat: int, budget: float) -> dict[str, Any]:
    """Child process: the first load's peak RSS over the baseline after imports (and a tiny warm-up load,
    which imports what loading imports lazily); the median time over ``repeat`` loads."""
    import opgraph.io as oio

    oio.load(warm)
    m, g = measure(lambda: oio.load(path), repeat, budget)
    # The peak is the first load's, in a heap nothing else has used yet (later loads reuse freed memory).
    return {**m.as_dict(), "peak": m.peaks[0], "ops": g.num_ops}


# ----------------------------------------------------------------------------- systems
def bench_opgraph(n: int, args: argparse.Namespace) -> dict[str, Any]:
    import opgraph

    other = dag(n)
    steps: dict[str, Any] = {}
    steps["build"], g = builder_step(other, args.repeat, args.budget)
    if n <= args.tracemalloc_max and "tracemalloc" not in args.skip:
        steps["build"]["tracemalloc"] = builder_tracemalloc(other)
    if n <= 100_000:  # the builder and the bulk path make the same graph
        if not g.equals(bulk_graph(graph_arrays(other))):
            raise SystemExit("the builder's graph differs from the bulk arrays' graph")

    def verify() -> Any:
        g._cache.clear()
        return g.verify()

    steps["verify"] = measure(verify, args.repeat, args.budget)[0].as_dict()
    if "compile" not in args.skip:
        steps["compile_forward"] = compile_step(g, args.repeat, args.budget)
    if "grad" not in args.skip:
        gsteps = max(1, n // 7)
        m, gb = measure(lambda: build_grad(gsteps), args.repeat, args.budget)
        gg = gb.freeze()
        del gb
        steps["grad_build"] = {**m.as_dict(), "ops": gg.num_ops, "chain_steps": gsteps}
        if "compile" not in args.skip:
            steps["compile_grad"] = compile_step(gg, args.repeat, args.budget)
        del gg
    tmp = tempfile.mkdtemp(prefix="opgraph-bench-", dir=args.tmp)
    try:
        if "io_cg" not in args.skip:
            steps["io_cg"] = save_load_step(g, ".cg", tmp, args.repeat, args.budget)
        if n <= args.json_max and "io_json" not in args.skip:
            steps["io_json"] = save_load_step(g, ".json", tmp, args.repeat, args.budget)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"version": opgraph.__version__, "ops": g.num_ops, "steps": steps}


def bench_bulk(n: int, args: argparse.Namespace) -> dict[str, Any]:
    import opgraph
    from opgraph.core.graph import Graph

    t0 = time.perf_counter()
    other = dag(n)
    arrays = graph_arrays(other)
    del other
    steps: dict[str, Any] = {"arrays": {"s": time.perf_counter() - t0}}
    m, g = measure(lambda: bulk_graph(arrays), args.repeat, args.budget)
    steps["build"] = {**m.as_dict(), "graph_nbytes": g.nbytes}

    def verify() -> Any:
        g._cache.clear()
        return g.verify()

    steps["verify"] = measure(verify, args.repeat, args.budget)[0].as_dict()

    def sort_in_order() -> Any:
        g._cache.clear()
        return g.topological_order()

    m, order = measure(sort_in_order, args.repeat, args.budget)
    steps["sort_ordered"] = m.as_dict()
    if n <= 10**7:
        check_order(order, n, *op_edges(g))
    del order
    if n <= args.sort_max and "sort" not in args.skip:
        perm = np.random.default_rng(SHUFFLE_SEED).permutation(n).astype(np.int32)
        shuffled = Graph(**graph_arrays(arrays["in_ids"][1::2], perm))

        def sort_shuffled() -> Any:
            shuffled._cache.clear()
            return shuffled.topological_order()

        m, order = measure(sort_shuffled, args.repeat, args.budget)
        steps["sort"] = m.as_dict()
        check_order(order, n, *op_edges(shuffled))
        del order, shuffled, perm
    if args.io:
        tmp = tempfile.mkdtemp(prefix="opgraph-bench-", dir=args.tmp)
        try:
            import opgraph.io as oio

            path = os.path.join(tmp, "graph.cg")
            warm = os.path.join(tmp, "tiny.cg")
            oio.save(tiny_graph(), warm)
            m, _ = measure(lambda: oio.save(g, path), args.repeat, args.budget)
            steps["io_cg"] = {"save": m.as_dict(), "file_bytes": file_size(path)}
            ops = g.num_ops
            del g, arrays  # the loading process gets the memory
            gc.collect()
            steps["io_cg"]["load"] = load_in_child(path, warm, args.repeat, args.budget)
            if steps["io_cg"]["load"]["ops"] not in (ops, None):
                raise SystemExit("the loaded graph has a different number of ops")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"version": opgraph.__version__, "constructor": bulk_constructor(), "ops": n, "steps": steps}


def rx_from_lists(payloads: list[None], edges: list[tuple[int, int]]) -> Any:
    import rustworkx as rx

    G = rx.PyDiGraph()
    G.add_nodes_from(payloads)
    G.add_edges_from_no_data(edges)
    return G


def rx_node_by_node(other: list[int]) -> Any:
    import rustworkx as rx

    G = rx.PyDiGraph()
    add_node, add_edge = G.add_node, G.add_edge
    add_node(None)
    for i, o in enumerate(other):
        j = add_node(None)
        add_edge(i, j, None)
        add_edge(o, j, None)
    return G


def nx_from_lists(nodes: range, edges: list[tuple[int, int]]) -> Any:
    import networkx as nx

    G = nx.DiGraph()
    G.add_nodes_from(nodes)
    G.add_edges_from(edges)
    return G


def bench_rustworkx(n: int, args: argparse.Namespace) -> dict[str, Any]:
    import rustworkx as rx

    other = dag(n)
    src, dst = peer_edges(other)
    edges = list(zip(src.tolist(), dst.tolist(), strict=True))
    payloads = [None] * (n + 1)
    steps: dict[str, Any] = {}
    m, G = measure(partial(rx_from_lists, payloads, edges), args.repeat, args.budget)
    steps["build"] = m.as_dict()
    assert G.num_nodes() == n + 1 and G.num_edges() == 2 * n
    steps["verify"] = measure(partial(rx.is_directed_acyclic_graph, G), args.repeat, args.budget)[0].as_dict()
    del G, edges
    if "build_loop" not in args.skip:
        steps["build_loop"] = measure(partial(rx_node_by_node, other.tolist()), args.repeat,
                                      args.budget)[0].as_dict()
    perm = np.random.default_rng(SHUFFLE_SEED).permutation(n + 1)
    src, dst = peer_edges(other, perm)
    S = rx_from_lists(payloads, list(zip(src.tolist(), dst.tolist(), strict=True)))
    m, order = measure(partial(rx.topological_sort, S), args.repeat, args.budget)
    steps["sort"] = m.as_dict()
    check_order(np.asarray(order), n + 1, src, dst)
    return {"version": rx.__version__, "ops": n, "steps": steps}


def bench_networkx(n: int, args: argparse.Namespace) -> dict[str, Any]:
    import networkx as nx

    other = dag(n)
    src, dst = peer_edges(other)
    edges = list(zip(src.tolist(), dst.tolist(), strict=True))
    steps: dict[str, Any] = {}
    m, G = measure(partial(nx_from_lists, range(n + 1), edges), args.repeat, args.budget)
    steps["build"] = m.as_dict()
    steps["verify"] = measure(partial(nx.is_directed_acyclic_graph, G), args.repeat, args.budget)[0].as_dict()
    del G, edges
    perm = np.random.default_rng(SHUFFLE_SEED).permutation(n + 1)
    src, dst = peer_edges(other, perm)
    S = nx_from_lists(range(n + 1), list(zip(src.tolist(), dst.tolist(), strict=True)))
    m, order = measure(lambda: list(nx.topological_sort(S)), args.repeat, args.budget)
    steps["sort"] = m.as_dict()
    check_order(np.asarray(order), n + 1, src, dst)
    return {"version": nx.__version__, "ops": n, "steps": steps}


BENCHES = {"opgraph": bench_opgraph, "bulk": bench_bulk, "rustworkx": bench_rustworkx, "networkx": bench_networkx}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", choices=sorted(BENCHES), default="opgraph")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5, help="runs per step (median); default 5")
    ap.add_argument("--budget", type=float, default=float(os.environ.get("OPGRAPH_BENCH_BUDGET", "60")),
                    help="stop repeating a step once its runs took this many seconds (default 60)")
    ap.add_argument("--io", action="store_true", help="bulk: also save and load the graph as .cg")
    ap.add_argument("--json-max", type=int, default=10_000_000,
                    help="opgraph: largest N saved and loaded as JSON (default 10^7)")
    ap.add_argument("--sort-max", type=int, default=10_000_000,
                    help="bulk: largest N for the sort of the shuffled copy")
    ap.add_argument("--tracemalloc-max", type=int, default=1_000_000,
                    help="opgraph: largest N for the extra build under tracemalloc")
    ap.add_argument("--skip", type=lambda text: set(filter(None, text.split(","))), default=set(),
                    help="steps to leave out, comma-separated: tracemalloc, compile, grad, io_cg, io_json, sort, "
                         "build_loop")
    ap.add_argument("--tmp", default=os.environ.get("OPGRAPH_BENCH_TMP"),
                    help="folder for the saved files (default: the system's temporary folder)")
    ap.add_argument("--load", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--warm", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load:
        print(json.dumps(load_only(args.load, args.warm, args.repeat, args.budget)))
        return
    t0 = time.perf_counter()
    out = BENCHES[args.lib](args.n, args)
    print(json.dumps({"lib": args.lib, "n": args.n, "repeat": args.repeat, "peak_method": PEAK_METHOD,
                      "python": sys.version.split()[0], "numpy": np.__version__,
                      "wall_s": time.perf_counter() - t0, **out}))


if __name__ == "__main__":
    main()
