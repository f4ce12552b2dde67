"""One variant of the control-flow benchmark in this process (issue 17); prints one JSON line.

    python bench/control_rnn.py --variant scan|unrolled|jax|numpy [--grad] [--repeat 20] [--steps 1000]

The workload is an Elman RNN, ``h_t = tanh(h_{t-1} @ W + x_t @ U + b)``, hidden 64,
input 32, batch 16, float32, ``loss = sum(h_T)`` (``--loss all``: the sum of
every ``h_t``); ``--grad`` also computes
``d loss / d W`` (the loss and the gradient are both results). The variants:

* ``scan``: one opgraph ``scan`` op whose body is the cell (W, U, b are its
  ``num_consts=3`` loop-invariant operands, h its carry, xs its scanned input);
  built with :class:`~opgraph.GraphBuilder` and
  :class:`~opgraph.core.subgraph.Subgraph`, or with ``opgraph.scan`` on lazy
  arrays (``--frontend``) where that front end exists.
* ``unrolled``: the same cell emitted ``steps`` times in one graph (plus a
  ``getitem`` per step for ``x_t``, which the scan does in its kernel).
* ``jax``: ``jax.lax.scan`` of the same cell under ``jax.jit`` (CPU, one thread).
* ``numpy``: a plain Python loop over NumPy (the floor; backward by hand).

Both opgraph variants run through ``opgraph.compile`` (numpy backend, no
``optimize``). Measured: the graph size (ops, bodies included; JAX: jaxpr
equations, scan body included), build (constructing the graph; JAX: tracing
and lowering), compile (``opgraph.compile``; JAX: ``lowered.compile()``) plus
the first call minus the steady one, the steady call (median of ``--repeat``),
the file size of ``opgraph.save`` as .json and .cg (or why it failed), and
peak RSS: ``total`` is the high-water mark from after the imports through
build, compile and every call minus the resident size after the imports;
``run`` the same over the steady calls only (bench/memory_run.py's method:
the kernel's peak is reset through /proc/self/clear_refs).
"""

from __future__ import annotations

import os

# One thread for XLA too, set before anything imports jax (bench/run.py sets the BLAS/OpenMP variables).
os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_run import maxrss_mb, reset_peak, rss_mb

HIDDEN, INPUT, BATCH, DTYPE = 64, 32, 16, "float32"
LOSS = "last"
"""``last``: loss = sum(h_T); ``all``: loss = the sum of every h_t (a loss at every step; set by ``--loss``)."""
NAMES = ("W", "U", "b", "h0", "xs")
VARIANTS = ("scan", "unrolled", "jax", "numpy")


def rnn_data(steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The weights (scaled so tanh stays away from saturation), h0 and the inputs, float32."""
    rng = np.random.default_rng(seed)
    return {"W": (rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)).astype(DTYPE),
            "U": (rng.standard_normal((INPUT, HIDDEN)) / np.sqrt(INPUT)).astype(DTYPE),
            "b": (0.1 * rng.standard_normal(HIDDEN)).astype(DTYPE),
            "h0": np.zeros((BATCH, HIDDEN), DTYPE),
            "xs": rng.standard_normal((steps, BATCH, INPUT)).astype(DTYPE)}


# ---------------------------------------------------------------- opgraph
def _cell(b: Any, w: Any, u: Any, bias: Any, h: Any, x: Any) -> Any:
    return b.tanh(b.add(b.add(b.matmul(h, w), b.matmul(x, u)), bias))


def _inputs(b: Any, data: dict[str, np.ndarray]) -> list[Any]:
    return [b.input((DTYPE, data[n].shape), name=n) for n in NAMES]


def _finish(b: Any, loss: Any, w: Any, grad: bool) -> Any:
    b.output(loss)
    if grad:
        (gw,) = b.build_grad_ops(loss, [w])
        b.output(gw)
    return b.freeze()


def build_scan(data: dict[str, np.ndarray], grad: bool) -> Any:
    """One ``scan`` op over the cell body, built by hand."""
    import opgraph
    from opgraph.core.subgraph import Subgraph

    sb = opgraph.GraphBuilder()
    w, u, bias, h = (sb.input((DTYPE, data[n].shape), name=n) for n in NAMES[:4])
    x = sb.input((DTYPE, data["xs"].shape[1:]), name="x")
    h2 = _cell(sb, w, u, bias, h, x)
    sb.output(h2, h2) if LOSS == "all" else sb.output(h2)
    body = Subgraph(sb.freeze(), name="cell")
    b = opgraph.GraphBuilder()
    ins = _inputs(b, data)
    if LOSS == "all":
        _, hs = b.op("scan", *ins, body=body, num_consts=3, num_carry=1)
        return _finish(b, b.sum(hs), ins[0], grad)
    (h_last,) = [b.op("scan", *ins, body=body, num_consts=3, num_carry=1)]
    return _finish(b, b.sum(h_last), ins[0], grad)


def build_scan_frontend(data: dict[str, np.ndarray], grad: bool) -> Any:
    """The same scan written with ``opgraph.scan`` (jax.lax.scan's signature) and traced by ``opgraph.trace``."""
    import opgraph
    import opgraph.numpy as onp

    def loss(W: Any, U: Any, b: Any, h0: Any, xs: Any) -> Any:  # the graph inputs are named after these
        def step(h: Any, x: Any) -> tuple[Any, Any]:
            h = onp.tanh(h @ W + x @ U + b)
            return h, (h if LOSS == "all" else None)

        h_last, hs = opgraph.scan(step, h0, xs)  # type: ignore[attr-defined]
        return onp.sum(hs) if LOSS == "all" else onp.sum(h_last)

    fn = opgraph.value_and_grad(loss) if grad else loss
    return opgraph.trace(fn, *(data[n] for n in NAMES))


def build_unrolled(data: dict[str, np.ndarray], grad: bool) -> Any:
    """The cell emitted once per step."""
    import opgraph

    b = opgraph.GraphBuilder()
    w, u, bias, h, xs = _inputs(b, data)
    total = None
    for t in range(data["xs"].shape[0]):
        h = _cell(b, w, u, bias, h, b.op("getitem", xs, index=(t,)))
        if LOSS == "all":
            total = b.sum(h) if total is None else b.add(total, b.sum(h))
    return _finish(b, total if LOSS == "all" else b.sum(h), w, grad)


def count_ops(graph: Any) -> tuple[int, int]:
    """(ops of the graph, ops of every body it holds, nested bodies included, each distinct body once)."""
    from opgraph.core.subgraph import subgraphs_of

    return int(graph.num_ops), sum(int(s.graph.num_ops) for s in subgraphs_of(graph, recursive=True))


def file_sizes(graph: Any) -> dict[str, int | str]:
    """Bytes of ``opgraph.save`` to .json and .cg (all four .cg files), or the error's first line."""
    import opgraph

    out: dict[str, int | str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for ext in (".json", ".cg"):
            path = os.path.join(tmp, "rnn" + ext)
            try:
                opgraph.save(graph, path)
            except Exception as e:  # the table says why a format could not store the graph
                out[ext] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                continue
            stem = path[: -len(ext)]
            out[ext] = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp)
                           if os.path.join(tmp, f).startswith(stem + "."))
            for f in os.listdir(tmp):
                os.remove(os.path.join(tmp, f))
    return out


def opgraph_variant(variant: str, data: dict[str, np.ndarray], grad: bool,
                    frontend: bool, optimize: bool = False) -> tuple[Callable[[], list[Any]], dict[str, Any]]:
    """Build and compile (after ``opgraph.optimize``, its default level, counted as compile time, with ``optimize``);
    return the call and the facts measured on the way."""
    import opgraph

    build = build_unrolled if variant == "unrolled" else build_scan_frontend if frontend else build_scan
    t0 = time.perf_counter()
    graph = build(data, grad)
    facts: dict[str, Any] = {"build_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    if optimize:
        graph = opgraph.optimize(graph)
    compiled = opgraph.compile(graph)
    facts["compile_s"] = time.perf_counter() - t0
    facts["ops"], facts["body_ops"] = count_ops(graph)
    facts["files"] = file_sizes(graph)
    return lambda: compiled(data), facts


# ---------------------------------------------------------------- JAX
def _jaxpr_eqns(jaxpr: Any) -> int:
    """Equations of a jaxpr, those of its sub-jaxprs (the scan body) included."""
    import jax.extend

    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            n += _jaxpr_eqns(sub)
    return n


def jax_variant(data: dict[str, np.ndarray], grad: bool) -> tuple[Callable[[], list[Any]], dict[str, Any]]:
    """``jax.lax.scan`` under ``jax.jit``, traced and lowered (build), compiled ahead of time (compile)."""
    import jax
    import jax.numpy as jnp

    def loss(w: Any, u: Any, bias: Any, h0: Any, xs: Any) -> Any:
        def step(h: Any, x: Any) -> tuple[Any, Any]:
            h = jnp.tanh(h @ w + x @ u + bias)
            return h, (h if LOSS == "all" else None)

        h_last, hs = jax.lax.scan(step, h0, xs)
        return jnp.sum(hs) if LOSS == "all" else jnp.sum(h_last)

    fn = jax.value_and_grad(loss) if grad else loss
    args = [jnp.asarray(data[n]) for n in NAMES]
    t0 = time.perf_counter()
    lowered = jax.jit(fn).lower(*args)
    facts: dict[str, Any] = {"build_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    compiled = lowered.compile()
    facts["compile_s"] = time.perf_counter() - t0
    facts["ops"] = _jaxpr_eqns(jax.make_jaxpr(fn)(*args).jaxpr)
    facts["version"] = jax.__version__

    def call() -> list[Any]:
        out = compiled(*args)
        return [np.asarray(o) for o in jax.tree_util.tree_leaves(out)]  # to NumPy: each column pays its conversion

    return call, facts


# ---------------------------------------------------------------- NumPy
def numpy_variant(data: dict[str, np.ndarray], grad: bool) -> tuple[Callable[[], list[Any]], dict[str, Any]]:
    """A Python loop; with ``grad`` it keeps every h and runs the backward loop by hand."""
    w, u, bias, h0, xs = (data[n] for n in NAMES)

    def forward() -> list[Any]:
        h, total = h0, np.float32(0)
        for x in xs:
            h = np.tanh(h @ w + x @ u + bias)
            total += h.sum()
        return [total if LOSS == "all" else h.sum()]

    def forward_backward() -> list[Any]:
        hs = [h0]
        for x in xs:
            hs.append(np.tanh(hs[-1] @ w + x @ u + bias))
        gh, gw = np.ones_like(h0), np.zeros_like(w)
        for t in range(len(xs), 0, -1):
            gz = gh * (1 - hs[t] * hs[t])
            gw += hs[t - 1].T @ gz
            gh = gz @ w.T
            if LOSS == "all":
                gh += 1  # the loss's own term at step t - 1
        loss = sum(h.sum() for h in hs[1:]) if LOSS == "all" else hs[-1].sum()
        return [loss, gw]

    return (forward_backward if grad else forward), {"build_s": 0.0, "compile_s": 0.0}


# ---------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=VARIANTS, required=True)
    ap.add_argument("--grad", action="store_true", help="loss and d loss / d W (default: the loss only)")
    ap.add_argument("--frontend", action="store_true", help="scan: build with opgraph.scan instead of the builder")
    ap.add_argument("--optimize", action="store_true", help="opgraph.optimize (level 2, the default) before compiling")
    ap.add_argument("--loss", choices=("last", "all"), default="last",
                    help="last: sum(h_T); all: the sum of every h_t")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    global LOSS
    LOSS = args.loss
    data = rnn_data(args.steps)
    if args.variant == "jax":
        import jax  # noqa: F401 - imported before the baseline, like opgraph below
    elif args.variant != "numpy":
        import opgraph
        import opgraph.autodiff
        import opgraph.numpy
        import opgraph.runtime.compiled  # noqa: F401 - their import cost stays out of the measurements
    gc.collect()
    base = rss_mb()
    out: dict[str, Any] = {"variant": args.variant, "grad": args.grad, "frontend": args.frontend,
                           "steps": args.steps, "dtype": DTYPE, "peak_reset": reset_peak(), "import_rss_mb": base}
    try:
        if args.variant == "jax":
            call, facts = jax_variant(data, args.grad)
        elif args.variant == "numpy":
            call, facts = numpy_variant(data, args.grad)
        else:
            call, facts = opgraph_variant(args.variant, data, args.grad, args.frontend, args.optimize)
    except Exception as e:  # e.g. no gradient rule for scan yet: the table shows why
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        print(json.dumps(out))
        return
    out.update(facts)
    t0 = time.perf_counter()
    res = call()
    first = time.perf_counter() - t0
    gc.collect()
    run_base = rss_mb()
    total_peak = maxrss_mb()
    reset_peak()
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        res = call()
        times.append(time.perf_counter() - t0)
    out["run_s"] = statistics.median(times)
    out["first_call_s"] = first
    out["compile_s"] = out["compile_s"] + max(first - out["run_s"], 0.0)
    out["total_peak_mb"] = max(total_peak, maxrss_mb()) - base
    # RSS moves in pages and its counters lag (~0.25 MB): a loop that allocates nothing new reads slightly below 0.
    out["run_peak_mb"] = max(maxrss_mb() - run_base, 0.0)
    out["loss"] = float(res[0])
    if args.grad:
        out["grad_checksum"] = float(np.sum(np.abs(res[1])))
    out["numpy"] = np.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
