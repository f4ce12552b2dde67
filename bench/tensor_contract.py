"""Tensor contractions (issue 20): opgraph's index-notation front end next to einsum peers; one JSON line.

    python bench/tensor_contract.py --lib L --case C [--repeat 7]

Libraries (``--lib``), each run in its own process by bench/table_tensor_algebra.py:

* ``numpy``: ``np.einsum(subscripts, *ops, optimize=True)``;
* ``opt_einsum``: ``opt_einsum.contract(subscripts, *ops)`` (its path is found in every call, as a user gets it);
* ``torch``: ``torch.einsum`` on ``torch.from_numpy`` tensors, ``torch.set_num_threads(1)``; only the einsum
  call is timed;
* ``opgraph-numpy``, ``opgraph-torch``, ``opgraph-auto``: the expression in index notation
  (``opgraph.tensor_expr``), ``.opgraph(result labels)``, ``.to_graph(data="inputs")`` (the arrays as inputs,
  fed by every call, as the other libraries are given them) and ``opgraph.compile(graph, backend=...)``
  (``"auto"`` with ``example_inputs=og.feeds()``: it times the installed backends and keeps the
  fastest). That one-off cost is reported once (``build_ms``, and its parts: the first build in the process, which
  includes opgraph's imports on first use) and, except for auto, for a second build (``build_warm_ms``); the timed
  calls are ``prog(og.feeds())``.

Cases (``--case``), float64, data from ``np.random.default_rng(0)``:

* ``cc``: the coupled-cluster ladder term, o = 20 occupied, v = 80 virtual: T2 (v, v, o, o) labelled a,b,i,j
  times V (v, v, v, v) labelled c,d,a,b, result c,d,i,j (``abij,cdab->cdij``);
* ``cc_perm``: the same operands, result i,j,c,d (``abij,cdab->ijcd``): the result needs a permutation;
* ``chain``: A (1000, 100) B (100, 1000) C (1000, 100) D (100, 1000), ``ij,jk,kl,lm->im``; left to right costs
  ~3e8 multiply-adds, the best order (A (B C)) D ~1.2e8.

One warm-up call, then ``--repeat`` calls timed with ``time.perf_counter``. The JSON has every time (ms), their
median, and the largest relative error of the result against ``np.einsum(optimize=True)`` computed once in
the same process (not timed): ``max |out - ref| / max |ref|``. One thread: bench/run.py sets the BLAS/OpenMP
variables to 1 (set them yourself when running this script alone), ``XLA_FLAGS`` is set here for jax (a candidate
of ``opgraph-auto``), ``torch.set_num_threads(1)`` wherever torch runs, and opgraph's onnxruntime backend takes
``OMP_NUM_THREADS``.
"""

from __future__ import annotations

import os

# One thread for XLA too (opgraph-auto times the jax backend), set before anything imports jax; bench/run.py sets
# the BLAS/OpenMP variables.
os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

LIBS = ("numpy", "opt_einsum", "torch", "opgraph-numpy", "opgraph-torch", "opgraph-auto")
CASES: dict[str, str] = {"cc": "abij,cdab->cdij", "cc_perm": "abij,cdab->ijcd", "chain": "ij,jk,kl,lm->im"}
OCC, VIRT = 20, 80
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS", "XLA_FLAGS")


def operands(case: str) -> list[np.ndarray]:
    """The case's operands, float64, from ``np.random.default_rng(0)``."""
    rng = np.random.default_rng(0)
    if case in ("cc", "cc_perm"):
        t2 = rng.standard_normal((VIRT, VIRT, OCC, OCC))
        v = rng.standard_normal((VIRT, VIRT, VIRT, VIRT))
        return [t2, v]
    if case == "chain":
        return [rng.standard_normal(s) for s in ((1000, 100), (100, 1000), (1000, 100), (100, 1000))]
    raise ValueError(f"unknown case {case!r}")


def labels(subscripts: str) -> tuple[list[str], str]:
    """The operands' labels and the result's, comma-separated as the index-notation front end takes them:
    ``"abij,cdab->cdij"`` -> ``(["a,b,i,j", "c,d,a,b"], "c,d,i,j")``."""
    lhs, rhs = subscripts.split("->")
    return [",".join(term) for term in lhs.split(",")], ",".join(rhs)


def versions(lib: str) -> dict[str, str]:
    """Versions of python, numpy and whatever ``lib`` uses."""
    out = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        import opt_einsum

        out["opt_einsum"] = opt_einsum.__version__
    except ImportError:
        pass
    if "torch" in lib or lib == "opgraph-auto":
        try:
            import torch

            out["torch"] = torch.__version__
        except ImportError:
            pass
    if lib.startswith("opgraph"):
        import opgraph

        out["opgraph"] = getattr(opgraph, "__version__", "?")
    return out


def peer(lib: str, subscripts: str, ops: list[np.ndarray], info: dict[str, Any]) -> tuple[Callable[[], Any],
                                                                                          Callable[[Any], np.ndarray]]:
    """``(call, to_numpy)`` for a peer library: ``call()`` is what is timed."""
    if lib == "numpy":
        return lambda: np.einsum(subscripts, *ops, optimize=True), np.asarray
    if lib == "opt_einsum":
        import opt_einsum

        return lambda: opt_einsum.contract(subscripts, *ops), np.asarray
    if lib == "torch":
        import torch

        torch.set_num_threads(1)
        info["torch_threads"] = torch.get_num_threads()
        oe = getattr(torch.backends, "opt_einsum", None)
        if oe is not None:  # torch.einsum orders contractions with opt_einsum when it is installed
            info["torch_opt_einsum"] = {"available": oe.is_available(), "enabled": bool(oe.enabled),
                                        "strategy": oe.strategy}
        tensors = [torch.from_numpy(a) for a in ops]
        return lambda: torch.einsum(subscripts, *tensors), lambda t: t.numpy()
    raise ValueError(f"unknown library {lib!r}")


def opgraph_program(lib: str, subscripts: str, ops: list[np.ndarray], info: dict[str, Any]) -> tuple[
        Callable[[], Any], Callable[[Any], np.ndarray]]:
    """Build the expression, the OpGraph, its Graph and the compiled program (timed once, into ``info``);
    ``call()`` is ``prog(og.feeds())``."""
    import opgraph

    backend = lib.split("-", 1)[1]
    if backend != "numpy":
        try:
            import torch

            torch.set_num_threads(1)  # opgraph-torch, and the torch candidate of opgraph-auto
            info["torch_threads"] = torch.get_num_threads()
        except ImportError:
            pass
    in_labels, out_labels = labels(subscripts)

    def build() -> tuple[Any, Any, Any, dict[str, float]]:
        """Expression, OpGraph, Graph, compiled program, and the ms each step took."""
        T = opgraph.tensor_expr
        t0 = time.perf_counter()
        expr = T(ops[0])[in_labels[0]]
        for a, lab in zip(ops[1:], in_labels[1:], strict=True):
            expr = expr * T(a)[lab]
        t1 = time.perf_counter()
        og = expr.opgraph(out_labels)
        t2 = time.perf_counter()
        g = og.to_graph(data="inputs").graph  # the arrays stay inputs: each call feeds them
        t3 = time.perf_counter()
        if backend == "auto":
            prog = opgraph.compile(g, backend="auto", example_inputs=og.feeds())
        else:
            prog = opgraph.compile(g, backend=backend)
        t4 = time.perf_counter()
        return og, g, prog, {"expression": (t1 - t0) * 1e3, "opgraph": (t2 - t1) * 1e3,
                             "to_graph": (t3 - t2) * 1e3, "compile": (t4 - t3) * 1e3}

    og, g, prog, parts = build()  # the first in this process: it includes opgraph's imports on first use
    info["build_ms"] = sum(parts.values())
    info["build_parts_ms"] = parts
    if backend != "auto":  # again, warm (auto would time every backend again: its cost is that timing)
        og, g, prog, parts = build()
        info["build_warm_ms"] = sum(parts.values())
        info["build_warm_parts_ms"] = parts
    info["graph_ops"] = _op_kinds(g)
    choice = getattr(prog, "choice", None) if backend == "auto" else None
    if choice is not None:
        info["backend"] = choice.backend
        info["auto_timings_ms"] = {k: (v * 1e3 if v is not None else None) for k, v in choice.timings.items()}
        info["auto_failures"] = dict(choice.failures)
    else:
        info["backend"] = backend
    try:
        info["explain"] = prog.explain()
    except Exception as exc:  # explain() is a report, not part of the benchmark
        info["explain"] = f"explain() failed: {type(exc).__name__}: {exc}"
    t = time.perf_counter()
    feeds = og.feeds()
    info["feeds_ms"] = (time.perf_counter() - t) * 1e3
    info["feeds"] = {str(k): [list(np.shape(v)), str(getattr(v, "dtype", "?"))] for k, v in feeds.items()}
    return lambda: prog(og.feeds())[0], np.asarray


def _op_kinds(g: Any) -> list[str]:
    """The graph's ops, in order, as ``kind`` or ``kind(subscripts)`` (for the report)."""
    out = []
    for i in range(g.num_ops):
        kind, attrs = g.kind_of(i), g.attrs_of(i)
        out.append(f"{kind}({attrs['subscripts']})" if "subscripts" in attrs else kind)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", choices=LIBS, required=True)
    ap.add_argument("--case", choices=tuple(CASES), required=True)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    subscripts = CASES[args.case]
    ops = operands(args.case)
    info: dict[str, Any] = {"lib": args.lib, "case": args.case, "subscripts": subscripts,
                            "shapes": [list(a.shape) for a in ops], "dtype": str(ops[0].dtype),
                            "repeat": args.repeat, "versions": versions(args.lib),
                            "threads_env": {k: os.environ.get(k) for k in THREAD_VARS},
                            "executable": sys.executable}
    if args.lib.startswith("opgraph"):
        call, to_numpy = opgraph_program(args.lib, subscripts, ops, info)
    else:
        call, to_numpy = peer(args.lib, subscripts, ops, info)
    out = to_numpy(call())  # warm-up, and the result checked
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e3)
    ref = np.einsum(subscripts, *ops, optimize=True)
    out = np.asarray(out)
    if out.shape != ref.shape:
        info["max_rel_err"] = None
        info["error"] = f"result shape {out.shape} != np.einsum's {ref.shape}"
    else:
        info["max_rel_err"] = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
    info["out_dtype"] = str(out.dtype)
    info["times_ms"] = times
    info["median_ms"] = statistics.median(times)
    info["min_ms"] = min(times)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
