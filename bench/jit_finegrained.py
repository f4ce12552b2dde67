"""The gradient of a fine-grained scalar function (thousands of 0-d ops) for one library in this process (issue 33).

    python bench/jit_finegrained.py --lib jit|grad|casadi [--backend numpy|jax|torch] --n N [--repeat 7]

``f(x) = sum_{i < n-2} sin(x[i]) * x[i+1] + x[i]**2 / (1 + x[i+2]**2)`` of a float64 vector of ``n`` scalars,
written term by term from 0-d ops (about 8 forward ops per term: n = 250 gives ~2*10^3 ops, n = 2,500 ~2*10^4),
as a TensCalc- or CasADi-style model is. The libraries:

* ``jit``: ``opgraph.jit(opgraph.grad(f), backend=...)`` (NumPy, jax or torch arrays in, per the backend);
* ``grad``: the un-jitted ``opgraph.grad(f)`` (traced once, run by the reference interpreter at every call);
* ``casadi``: the same expression on ``casadi.SX.sym("x", n)``,
  ``casadi.Function("g", [x], [casadi.gradient(f, x)])``, called with a NumPy array.

Before timing, the gradient is checked against central finite differences of a vectorised NumPy ``f``
(step 1e-5; max |g - fd| <= 1e-5 max(1, max |fd|)); a mismatch exits with an error. Printed (one JSON line):
``first_s`` (building the function and its first call: tracing, optimising, compiling; CasADi: the SX expression,
``gradient`` and ``Function``; measured after the same on 5 scalars, whose time, ``cold_s``, includes loading
modules and starting the engine), ``call_s`` (the per-call time: the median over ``--repeat`` samples, 5 where
they take over 5 s, each a loop of calls that takes ~20 ms), the finite-difference error and, for ``grad``, the
sizes of the forward and gradient graphs. Threads: OMP/OPENBLAS/MKL 1 (bench/run.py), XLA one thread, torch one thread.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

FD_STEP, FD_TOL = 1e-5, 1e-5


def f_numpy(x: np.ndarray) -> np.ndarray:
    """``f`` vectorised over the last axis (the finite-difference reference)."""
    a, b, c = x[..., :-2], x[..., 1:-1], x[..., 2:]
    return np.sum(np.sin(a) * b + a * a / (1.0 + c * c), axis=-1)


def finite_difference(x: np.ndarray) -> np.ndarray:
    """Central differences of :func:`f_numpy` at ``x``, one coordinate per row."""
    step = FD_STEP * np.eye(len(x))
    return (f_numpy(x + step) - f_numpy(x - step)) / (2 * FD_STEP)


def term_by_term(n: int, sin: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``f`` as a loop over scalar terms, for any array type whose items are 0-d (``sin`` from its library)."""

    def f(x: Any) -> Any:
        total = 0.0
        for i in range(n - 2):
            a, b, c = x[i], x[i + 1], x[i + 2]
            total = total + sin(a) * b + a * a / (1.0 + c * c)
        return total

    return f


def _as_numpy(r: Any) -> np.ndarray:
    if type(r).__module__.startswith("torch"):
        return r.detach().cpu().numpy()
    return np.asarray(r, dtype=np.float64).reshape(-1)


def per_call(call: Callable[[], Any], repeat: int, sample_s: float = 0.02, budget_s: float = 5.0) -> float:
    """Median seconds per call over ``repeat`` samples, each a loop of calls that takes about ``sample_s``; after
    5 samples it stops once the samples took ``budget_s`` (the un-jitted gradient takes seconds per call)."""
    t0 = time.perf_counter()
    call()
    once = time.perf_counter() - t0
    loops = max(1, int(sample_s / max(once, 1e-9)))
    samples: list[float] = []
    while len(samples) < repeat and (len(samples) < 5 or sum(samples) * loops < budget_s):
        t0 = time.perf_counter()
        for _ in range(loops):
            call()
        samples.append((time.perf_counter() - t0) / loops)
    return statistics.median(samples)


def setup(lib: str, backend: str, n: int) -> tuple[Callable[[], Any], dict[str, Any]]:
    """Build ``lib``'s gradient function of ``f`` at the input and return a no-argument call and facts about it."""
    x = np.random.default_rng(0).uniform(-1.0, 1.0, n)
    facts: dict[str, Any] = {}
    if lib == "casadi":
        import casadi

        xs = casadi.SX.sym("x", n)
        g = casadi.Function("g", [xs], [casadi.gradient(term_by_term(n, casadi.sin)(xs), xs)])
        facts["version"] = casadi.__version__
        return lambda: g(x), facts
    import opgraph
    import opgraph.numpy as onp

    f = term_by_term(n, onp.sin)
    if lib == "grad":
        gf = opgraph.grad(f)
        facts["forward_ops"] = opgraph.function(f).graph(x).num_ops
        facts["grad_ops"] = gf.graph(x).num_ops
        return lambda: gf(x), facts
    arg: Any = x
    sync: Callable[[Any], Any] = np.asarray  # NumPy results are ready when returned (no copy)
    if backend == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)  # x stays float64, as on the other engines
        arg, sync, facts["version"] = jax.device_put(x), jax.block_until_ready, jax.__version__
    elif backend == "torch":
        import torch

        torch.set_num_threads(1)
        arg, sync, facts["version"] = torch.from_numpy(x), lambda r: r, torch.__version__
    jf = opgraph.jit(opgraph.grad(f), backend=backend)
    return lambda: sync(jf(arg)), facts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", choices=("jit", "grad", "casadi"), required=True)
    ap.add_argument("--backend", choices=("numpy", "jax", "torch"), default="numpy")
    ap.add_argument("--n", type=int, default=250)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    base = {"lib": args.lib, "backend": args.backend, "n": args.n}
    if args.lib == "jit":
        import opgraph

        if not hasattr(opgraph, "jit"):
            print(json.dumps({**base, "error": "missing: opgraph.jit"}))
            return
    # The same path on 5 scalars first: loading modules and starting the engine are then not counted as compiling.
    t0 = time.perf_counter()
    setup(args.lib, args.backend, 5)[0]()
    base["cold_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    call, facts = setup(args.lib, args.backend, args.n)
    grad = call()
    first = time.perf_counter() - t0
    x = np.random.default_rng(0).uniform(-1.0, 1.0, args.n)
    fd = finite_difference(x)
    err = float(np.max(np.abs(_as_numpy(grad) - fd)))
    if not err <= FD_TOL * max(1.0, float(np.max(np.abs(fd)))):
        print(json.dumps({**base, **facts, "error": f"gradient differs from finite differences by {err:.2e}"}))
        raise SystemExit(1)
    print(json.dumps({**base, **facts, "first_s": first, "call_s": per_call(call, args.repeat), "fd_error": err}))


if __name__ == "__main__":
    main()
