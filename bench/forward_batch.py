"""One library on one of issue 37's workloads (bench/forward_workloads.py) in this process; one JSON line out.

    python bench/forward_batch.py --case hvp|ode|pergrad --lib opgraph|jax|casadi [--backend numpy|jax|torch]
                                  [--variant scan|unrolled] [--size N] [--repeat 7]

``--backend``: the engine of ``opgraph.jit`` (numpy, jax, torch; numba and c for the scalar code of the unrolled
loop). ``--lib``:

* ``hvp`` (``--size`` parameters, 10^4): opgraph ``jit(lambda x, v: opgraph.hvp(loss, (x,), (v,))[1],
  backend=...)``; JAX ``jax.jit(lambda x, v: jax.jvp(jax.grad(loss), (x,), (v,))[1])``; CasADi ``jtimes`` of the
  SX ``gradient`` in a ``casadi.Function``.
* ``ode`` (``--size`` RK4 steps, 100): opgraph ``jit(opgraph.jacfwd(simulate), backend=...)``; JAX
  ``jax.jit(jax.jacfwd(simulate))``; the loop is one ``scan`` (``opgraph.scan`` / ``jax.lax.scan``) or unrolled
  (``--variant``); CasADi ``jacobian`` of the unrolled SX trajectory (forward mode for its 3 inputs).
* ``pergrad`` (``--size`` examples, 256; MLP 64-128-10): opgraph
  ``jit(vmap(grad(loss), in_axes=(None, 0, 0)), backend=...)``; JAX ``jax.jit(jax.vmap(jax.grad(loss),
  in_axes=(None, 0, 0)))``; no CasADi row.

Float64 everywhere. Before timing, the result is checked against the workload's reference (SciPy's closed-form
Rosenbrock ``H v``; central differences of a NumPy RK4; the per-example chain rule in NumPy) to ``RTOL``; a
mismatch prints an ``error`` and exits 1. Printed: ``cold_s`` (the same path at a tiny size first: imports, the
engine's start-up), ``first_s`` (building the function and its first call at the real size: tracing,
differentiating, optimising, compiling), for opgraph the phases of that (``trace_s``, ``optimize_s``,
``compile_s``: ``jit.compile_times``) and the ops of the traced and optimised graphs, for JAX ``lower_s`` and
``xla_compile_s`` (measured on a second ``jax.jit`` of the same function), ``call_s`` (the median of ``--repeat``
samples, each a loop of calls of ~20 ms, after the first call) and the error. Threads: OMP/OPENBLAS/MKL 1
(bench/run.py), numba 1, XLA's CPU client one thread, torch one thread, CasADi is single-threaded. The c engine compiles
into a fresh cache folder (its programs are kept on disk; ``OPGRAPH_BENCH_FWD_KEEP_CACHE=1`` keeps the usual one).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # the numba engine's parallel loops, as every other library: one

import argparse
import atexit
import collections
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import forward_workloads as wl
from scale_common import per_call

RTOL = {"hvp": 1e-10, "ode": 1e-5, "pergrad": 1e-10}  # ode: against central differences
SIZES = {"hvp": 10_000, "ode": 100, "pergrad": 256}
TINY = {"hvp": 5, "ode": 3, "pergrad": 2}
MLP = (64, 128, 10)
MISSING = {"hvp": ("hvp",), "ode": ("jacfwd",), "pergrad": ("vmap", "grad")}


def inputs(case: str, size: int) -> tuple[Any, ...]:
    """The NumPy arguments of ``case`` at ``size``."""
    if case == "hvp":
        return wl.nls_inputs(size)
    if case == "ode":
        return (wl.PARAMS.copy(),)
    return wl.mlp_inputs(size, MLP)


def reference(case: str, size: int, args: tuple[Any, ...]) -> list[np.ndarray]:
    if case == "hvp":
        return [wl.nls_reference(*args)[1]]
    if case == "ode":
        return [wl.ode_reference(size)]
    return list(wl.pergrad_reference(*args))


def leaves(result: Any) -> list[np.ndarray]:
    """The result's arrays as NumPy float64, in order (tuples flattened)."""
    if isinstance(result, (tuple, list)):
        return [a for r in result for a in leaves(r)]
    if type(result).__module__.startswith("torch"):
        result = result.detach().cpu().numpy()
    return [np.asarray(result, dtype=np.float64)]


def error(case: str, got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The largest |got - want| relative to max |want|, over the arrays (reshaped to the reference's shape)."""
    if len(got) != len(want):
        raise ValueError(f"{case}: {len(got)} arrays, expected {len(want)}")
    return max(float(np.max(np.abs(g.reshape(w.shape) - w))) / max(1.0, float(np.max(np.abs(w))))
               for g, w in zip(got, want, strict=True))


def setup_casadi(case: str, size: int, args: tuple[Any, ...]) -> tuple[Callable[[], Any], dict[str, Any]]:
    import casadi

    facts: dict[str, Any] = {"version": casadi.__version__}
    if case == "hvp":
        f = wl.nls_casadi(size)
        x, v = args
        facts["ops"] = f.n_instructions()
        return lambda: f(x, v), facts
    if case == "ode":
        f = wl.ode_casadi(size)
        facts["ops"] = f.n_instructions()
        return lambda: f(args[0]), facts
    raise SystemExit(f"no CasADi version of {case}")


def jax_function(case: str, size: int) -> Callable[..., Any]:
    import jax
    import jax.numpy as jnp

    if case == "hvp":
        loss = wl.nls_loss(jnp)
        return lambda x, v: jax.jvp(jax.grad(loss), (x,), (v,))[1]
    if case == "ode":
        return jax.jacfwd(wl.ode_simulate(jnp, size, jax.lax.scan if VARIANT == "scan" else None))
    return jax.vmap(jax.grad(wl.mlp_loss(jnp)), in_axes=(None, 0, 0))


def setup_jax(case: str, size: int, args: tuple[Any, ...]) -> tuple[Callable[[], Any], dict[str, Any]]:
    import jax

    jax.config.update("jax_enable_x64", True)
    dev = jax.device_put(args)
    jf = jax.jit(jax_function(case, size))
    return lambda: jax.block_until_ready(jf(*dev)), {"version": jax.__version__}


def jax_phases(case: str, size: int, args: tuple[Any, ...]) -> dict[str, Any]:
    """Tracing + lowering and XLA's compilation, timed apart on a fresh ``jax.jit`` of the same function."""
    import jax

    t0 = time.perf_counter()
    lowered = jax.jit(jax_function(case, size)).lower(*args)
    t1 = time.perf_counter()
    lowered.compile()
    t2 = time.perf_counter()
    eqns = len(jax.make_jaxpr(jax_function(case, size))(*args).eqns)
    return {"lower_s": t1 - t0, "xla_compile_s": t2 - t1, "ops": eqns}


def opgraph_function(case: str, size: int) -> Callable[..., Any]:
    import opgraph
    import opgraph.numpy as onp

    if case == "hvp":
        loss = wl.nls_loss(onp)
        return lambda x, v: opgraph.hvp(loss, (x,), (v,))[1]
    if case == "ode":
        return opgraph.jacfwd(wl.ode_simulate(onp, size, opgraph.scan if VARIANT == "scan" else None))
    return opgraph.vmap(opgraph.grad(wl.mlp_loss(onp)), in_axes=(None, 0, 0))


def setup_opgraph(case: str, size: int, args: tuple[Any, ...],
                  backend: str) -> tuple[Callable[[], Any], dict[str, Any]]:
    import opgraph

    facts: dict[str, Any] = {}
    sync: Callable[[Any], Any] = lambda r: r  # noqa: E731 (NumPy and torch results are ready when returned)
    if backend == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)
        args, sync, facts["version"] = jax.device_put(args), jax.block_until_ready, jax.__version__
    elif backend == "torch":
        import torch

        torch.set_num_threads(1)
        args, facts["version"] = _map(torch.from_numpy, args), torch.__version__
    jf = opgraph.jit(opgraph_function(case, size), backend=backend)
    facts["jitted"] = jf
    facts["args"] = args
    return lambda: sync(jf(*args)), facts


def _map(fn: Callable[[Any], Any], tree: Any) -> Any:
    return type(tree)(_map(fn, t) for t in tree) if isinstance(tree, (tuple, list)) else fn(tree)


def opgraph_profile(jf: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """The jitted function's compile phases, its graphs' op counts and the traced graph's ops by kind."""
    (phases,) = jf.compile_times.values()
    text = jf.explain(*args)
    m = re.search(r"\((\d+) ops\), optimize level \d+ [\d.]+ s \((\d+) ops\)", text)
    kinds = collections.Counter(op.kind for op in jf.graph(*args).ops())
    out: dict[str, Any] = {f"{k}_s": v for k, v in phases.items()}
    if m:
        out["ops"], out["optimized_ops"] = int(m.group(1)), int(m.group(2))
    out["kinds"] = dict(kinds.most_common(12))
    return out


def setup(lib: str, case: str, size: int, backend: str) -> tuple[Callable[[], Any], dict[str, Any]]:
    args = inputs(case, size)
    if lib == "casadi":
        return setup_casadi(case, size, args)
    if lib == "jax":
        return setup_jax(case, size, args)
    return setup_opgraph(case, size, args, backend)


VARIANT = "scan"


def main() -> None:
    global VARIANT
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=tuple(SIZES), required=True)
    ap.add_argument("--lib", choices=("opgraph", "jax", "casadi"), required=True)
    ap.add_argument("--backend", choices=("numpy", "jax", "torch", "numba", "c"), default="numpy")
    ap.add_argument("--variant", choices=("scan", "unrolled"), default="scan")
    ap.add_argument("--size", type=int)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    VARIANT = a.variant
    if a.backend == "c" and not os.environ.get("OPGRAPH_BENCH_FWD_KEEP_CACHE"):
        # the c engine keeps compiled programs on disk: a fresh folder, so that the first call compiles
        cache = tempfile.TemporaryDirectory(prefix="opgraph-bench-")
        atexit.register(cache.cleanup)
        os.environ["OPGRAPH_CACHE_DIR"] = cache.name
    size = a.size or SIZES[a.case]
    base: dict[str, Any] = {"case": a.case, "lib": a.lib, "backend": a.backend, "variant": a.variant, "size": size}
    if a.lib == "opgraph":
        import opgraph

        missing = [name for name in MISSING[a.case] if not hasattr(opgraph, name)]
        if missing:
            print(json.dumps({**base, "error": "missing: " + ", ".join(f"opgraph.{m}" for m in missing)}))
            return
    try:
        t0 = time.perf_counter()
        setup(a.lib, a.case, TINY[a.case], a.backend)[0]()
        base["cold_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        call, facts = setup(a.lib, a.case, size, a.backend)
        result = call()
        base["first_s"] = time.perf_counter() - t0
    except Exception as exc:  # a transform or engine that cannot run this yet: the table says why
        print(json.dumps({**base, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}))
        raise SystemExit(1) from exc
    jf, args = facts.pop("jitted", None), facts.pop("args", None)
    err = error(a.case, leaves(result), reference(a.case, size, inputs(a.case, size)))
    if not err <= RTOL[a.case]:
        print(json.dumps({**base, **facts, "error": f"differs from the reference by {err:.1e}"}))
        raise SystemExit(1)
    if jf is not None:
        facts.update(opgraph_profile(jf, args))
    elif a.lib == "jax":
        facts.update(jax_phases(a.case, size, inputs(a.case, size)))
    print(json.dumps({**base, **facts, "call_s": per_call(call, a.repeat), "error_rel": err}))


if __name__ == "__main__":
    main()
