"""One implementation of the 20-op elementwise chain over 4M float32 at a thread count, in this process.

    python bench/elementwise_chain.py --impl IMPL --threads N [--repeat R] [--warmup W] [--n ELEMENTS]

IMPL is ``numba`` (``opgraph.backends.numba.fused.compile_elementwise``: one generated parallel loop,
bit-identical to NumPy), ``numba-fast`` (the same with ``fast_math=True``), ``torch-compile``
(``torch.compile``, inductor), ``jax`` (``jax.jit``) or ``numpy-inplace`` (NumPy, every op into one buffer
with ``out=``; one thread whatever N). The chain is bench/backends_workloads.py's (the one of
bench/numpy_levels.py). The process is pinned to N CPUs (``sched_setaffinity``) and each library told N
threads, so every implementation gets the same cores.

Prints one JSON line: ``median`` and ``min`` (seconds over ``--repeat`` >= 5 calls after ``--warmup``),
``cpu_median`` (the median CPU seconds of the process per call, all its threads: on a shared machine the
1-thread figure that other processes disturb least),
``first_call`` (seconds: compilation included), ``check`` (the result summed in float64) and ``identical``
(whether the result equals NumPy's to the bit, NaN for NaN).

    >>> main(["--impl", "numpy-inplace", "--threads", "1", "--repeat", "5", "--warmup", "0", "--n", "4096"])
    ... # doctest: +ELLIPSIS
    {"impl": "numpy-inplace", "threads": 1, "median": ...}
"""

from __future__ import annotations

import os
import sys

IMPLS = ("numba", "numba-fast", "torch-compile", "jax", "numpy-inplace")


def _pin(threads: int) -> None:
    """Pin this process to ``threads`` CPUs and tell every library, before any of them is imported."""
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))[:threads]
        os.sched_setaffinity(0, cpus)
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    os.environ["NUMBA_NUM_THREADS"] = str(threads)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=1"
                               ).strip()


def _build(impl: str, x: object, threads: int) -> object:
    import numpy as np

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import backends_workloads as bw

    if impl == "numpy-inplace":
        steps = [(bw.CHAIN_UFUNCS[kind], None if k is None else np.float32(k)) for kind, k in bw.CHAIN]

        def in_place() -> np.ndarray:
            buf = np.empty_like(x)
            h = x
            for f, k in steps:
                h = f(h, out=buf) if k is None else f(h, k, out=buf)
            return h

        return in_place
    if impl.startswith("numba"):
        import opgraph

        graph, _ = bw.chain_graph(x)  # type: ignore[arg-type]
        # the engine as a user reaches it: opgraph.compile(..., backend="numba") runs the region as one loop
        prog = opgraph.compile(graph, backend="numba", threads=threads, fast_math=impl == "numba-fast")
        assert "1 region(s)" in prog.explain(), prog.explain()
        return lambda: prog(x)[0]
    if impl == "torch-compile":
        import torch

        torch.set_num_threads(threads)
        fns = {"sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "exp": torch.exp, "abs": torch.abs,
               "log": torch.log, "add": torch.add, "subtract": torch.sub, "multiply": torch.mul}

        def f(h: object) -> object:
            for kind, k in bw.CHAIN:
                h = fns[kind](h) if k is None else fns[kind](h, k)
            return h

        cf = torch.compile(f)
        xt = torch.from_numpy(x)  # type: ignore[arg-type]
        return lambda: cf(xt).numpy()
    import jax
    import jax.numpy as jnp

    jfns = {"sin": jnp.sin, "cos": jnp.cos, "tanh": jnp.tanh, "exp": jnp.exp, "abs": jnp.abs, "log": jnp.log,
            "add": jnp.add, "subtract": jnp.subtract, "multiply": jnp.multiply}

    @jax.jit
    def jf(h: object) -> object:
        for kind, k in bw.CHAIN:
            h = jfns[kind](h) if k is None else jfns[kind](h, jnp.float32(k))
        return h

    xj = jax.device_put(x)
    return lambda: np.asarray(jf(xj))


def main(argv: list[str] | None = None) -> None:
    """Measure one implementation and print its JSON line."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", required=True, choices=IMPLS)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--n", type=int, default=None, help="chain length in elements (tests)")
    args = ap.parse_args(argv)
    if args.repeat < 5:
        ap.error("--repeat must be at least 5")
    if "numpy" not in sys.modules:  # pinning works only before the libraries start their thread pools
        _pin(args.threads)
    import json
    import statistics
    import time

    import numpy as np

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import backends_workloads as bw

    x = np.ascontiguousarray(bw.chain_input()[:args.n])
    t0 = time.perf_counter()
    call = _build(args.impl, x, args.threads)
    out = call()  # type: ignore[operator]
    first_call = time.perf_counter() - t0
    ref = x
    for kind, k in bw.CHAIN:
        ref = bw.CHAIN_UFUNCS[kind](ref) if k is None else bw.CHAIN_UFUNCS[kind](ref, np.float32(k))
    out = np.asarray(out)
    nan = np.isnan(ref)
    identical = bool(out.dtype == ref.dtype and (np.isnan(out) == nan).all()
                     and (out[~nan].view(np.int32) == ref[~nan].view(np.int32)).all())
    for _ in range(args.warmup):
        call()  # type: ignore[operator]
    times, cpu = [], []
    for _ in range(args.repeat):
        t, c = time.perf_counter(), time.process_time()
        call()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    print(json.dumps({"impl": args.impl, "threads": args.threads, "median": statistics.median(times),
                      "min": min(times), "cpu_median": statistics.median(cpu), "first_call": first_call,
                      "check": float(np.sum(out, dtype=np.float64)),
                      "identical": identical, "n": int(x.size), "repeat": args.repeat}))


if __name__ == "__main__":
    main()
