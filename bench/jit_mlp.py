"""One MLP training step (value_and_grad + Adam) for one library and engine in this process (issue 33).

    python bench/jit_mlp.py --lib opgraph|jax|numpy|optax --backend jax|numpy|torch --size big|small
                            [--steps 30] [--warmup 5] [--check 3 | --expect L1,L2,L3]

The workload: an MLP (``big``: 784-512-512-10, batch 128; ``small``: the demo's 64-128-10, batch 32), float32,
relu between the layers, softmax cross-entropy averaged over the batch, Adam (lr 1e-3, b1 0.9, b2 0.999,
eps 1e-8, bias correction as in optax). One step takes ``(params, opt_state, x, y)`` and returns
``(loss, params, opt_state)``; params are a dict ``{"w0", "b0", "w1", ...}``. The libraries:

* ``opgraph``: ``opgraph.jit(step, backend=..., donate_argnums=(0, 1))`` where ``step`` is
  ``opgraph.value_and_grad(loss)`` + ``opgraph.optim.Adam.update`` + ``opgraph.optim.apply_updates`` (params and
  optimiser state as pytrees in and out). On ``--backend jax`` the arrays are jax arrays (they stay jax arrays),
  on ``--backend torch`` torch tensors (torch one thread); there is no torch peer (only the compile-time table
  uses this row).
* ``jax`` (``--backend jax``): the same step with ``jax.jit(..., donate_argnums=(0, 1))``, ``jax.value_and_grad``
  and Adam written by hand in jax.numpy with optax's formulas.
* ``numpy`` (``--backend numpy``): the same step written by hand in NumPy (forward, backward, Adam).
* ``optax`` (``--check`` only): ``jax.value_and_grad`` + ``optax.adam``, the reference the hand-written Adams
  are checked against.

``--check K`` only runs K steps from the initial parameters and prints the K losses (bench/table_jit.py takes
optax's as the reference). ``--expect`` gives that reference: the first three steps' losses must agree with it
(rtol 1e-4) or the process prints why and times nothing. Otherwise the process prints one JSON line: ``first_s`` (the
first call: tracing, optimising and compiling included; measured after one step of a 3-4-2 MLP, whose first call,
``cold_s``, includes loading modules and starting the engine), ``step_s`` (median over ``--steps`` calls after
``--warmup`` more) and the losses of the first three steps. Threads: OMP/OPENBLAS/MKL 1 (bench/run.py), XLA's CPU
client one thread (set below before jax is imported). Every step is synchronised (``jax.block_until_ready`` on
the whole result) before the clock stops.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_common import data

SIZES = {"big": ((784, 512, 512, 10), 128), "small": ((64, 128, 10), 32), "tiny": ((3, 4, 2), 2)}
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8
RTOL = 1e-4  # on the first three losses against optax's

Step = Callable[[Any, Any, Any, Any], tuple[Any, Any, Any]]


def initial(size: str) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The float32 parameters (He-initialised, seed 0), inputs and one-hot labels of ``size``."""
    sizes, batch = SIZES[size]
    flat, x, y = data(0, sizes, batch)
    params = {f"{k}{i // 2}": p for i, (k, p) in enumerate(zip(("w", "b") * len(flat), flat, strict=False))}
    return params, x, y


def numpy_step() -> tuple[Step, Callable[[dict[str, np.ndarray]], Any]]:
    """The step by hand in NumPy (forward, backward, Adam with optax's formulas) and its state's init."""

    def init(params: dict[str, np.ndarray]) -> Any:
        zeros = {k: np.zeros_like(v) for k, v in params.items()}
        return 0, zeros, {k: v.copy() for k, v in zeros.items()}

    def step(params: dict[str, np.ndarray], state: Any, x: np.ndarray, y: np.ndarray) -> tuple[Any, Any, Any]:
        n_layers = len(params) // 2
        acts, pres = [x], []
        h = x
        for i in range(n_layers):
            z = h @ params[f"w{i}"] + params[f"b{i}"]
            pres.append(z)
            h = np.maximum(z, 0) if i < n_layers - 1 else z
            acts.append(h)
        z = h - h.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        loss = -np.mean(np.sum(y * logp, axis=1))
        d = (np.exp(logp) - y) / np.float32(len(x))
        grads = {}
        for i in reversed(range(n_layers)):
            if i < n_layers - 1:
                d = d * (pres[i] > 0)
            grads[f"w{i}"], grads[f"b{i}"] = acts[i].T @ d, d.sum(axis=0)
            if i:
                d = d @ params[f"w{i}"].T
        count, mu, nu = state
        count += 1
        c1, c2 = np.float32(1 - B1**count), np.float32(1 - B2**count)
        # In place with one temporary per parameter, as a careful hand-written loop would (the caller donates its
        # arrays): lr m^ / (sqrt(v^) + eps) = (lr / c1) m / (sqrt(v) / sqrt(c2) + eps).
        step_size, root_c2 = np.float32(LR) / c1, np.sqrt(c2)
        for k, g in grads.items():
            m, v = mu[k], nu[k]
            m *= np.float32(B1)
            m += np.float32(1 - B1) * g
            v *= np.float32(B2)
            g *= g
            g *= np.float32(1 - B2)
            v += g
            d = np.sqrt(v, out=g)
            d /= root_c2
            d += np.float32(EPS)
            np.divide(m, d, out=d)
            d *= step_size
            params[k] -= d
        return loss, params, (count, mu, nu)

    return step, init


def _jax_loss(params: dict[str, Any], x: Any, y: Any) -> Any:
    import jax
    import jax.numpy as jnp

    n_layers = len(params) // 2
    h = x
    for i in range(n_layers):
        h = h @ params[f"w{i}"] + params[f"b{i}"]
        if i < n_layers - 1:
            h = jax.nn.relu(h)
    return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(h, axis=-1), axis=1))


def jax_step() -> tuple[Step, Callable[[dict[str, Any]], Any]]:
    """The step under ``jax.jit`` with Adam by hand in jax.numpy (optax's formulas, ``scale_by_adam``)."""
    import jax
    import jax.numpy as jnp

    def init(params: dict[str, Any]) -> Any:
        zeros = jax.tree.map(jnp.zeros_like, params)
        return jnp.zeros((), jnp.int32), zeros, jax.tree.map(jnp.zeros_like, params)

    def step(params: dict[str, Any], state: Any, x: Any, y: Any) -> tuple[Any, Any, Any]:
        loss, grads = jax.value_and_grad(_jax_loss)(params, x, y)
        count, mu, nu = state
        count = count + 1
        mu = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, mu, grads)
        nu = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * (g * g), nu, grads)
        c1 = 1 - B1 ** count.astype(jnp.float32)
        c2 = 1 - B2 ** count.astype(jnp.float32)
        params = jax.tree.map(lambda p, m, v: p - LR * (m / c1) / (jnp.sqrt(v / c2) + EPS), params, mu, nu)
        return loss, params, (count, mu, nu)

    return jax.jit(step, donate_argnums=(0, 1)), init


def optax_step() -> tuple[Step, Callable[[dict[str, Any]], Any]]:
    """``jax.value_and_grad`` + ``optax.adam`` (eager): the reference trajectory for the hand-written Adams."""
    import jax
    import optax

    opt = optax.adam(LR, b1=B1, b2=B2, eps=EPS)

    def step(params: dict[str, Any], state: Any, x: Any, y: Any) -> tuple[Any, Any, Any]:
        loss, grads = jax.value_and_grad(_jax_loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return loss, optax.apply_updates(params, updates), state

    return step, opt.init


def opgraph_step(backend: str) -> tuple[Step, Callable[[dict[str, Any]], Any]]:
    """``opgraph.jit`` of value_and_grad + ``Adam.update`` + ``apply_updates`` on ``backend``."""
    import opgraph
    import opgraph.numpy as onp
    from opgraph.frontend import nn

    opt = opgraph.optim.Adam(lr=LR)  # its defaults are optax's (b1, b2, eps); the trajectory check holds it to them

    def loss_fn(params: dict[str, Any], x: Any, y: Any) -> Any:
        n_layers = len(params) // 2
        h = x
        for i in range(n_layers):
            h = h @ params[f"w{i}"] + params[f"b{i}"]
            if i < n_layers - 1:
                h = nn.relu(h)
        return -onp.mean(onp.sum(y * nn.log_softmax(h, axis=-1), axis=1))

    def step(params: dict[str, Any], state: Any, x: Any, y: Any) -> tuple[Any, Any, Any]:
        loss, grads = opgraph.value_and_grad(loss_fn)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return loss, opgraph.optim.apply_updates(params, updates), state

    return opgraph.jit(step, backend=backend, donate_argnums=(0, 1)), opt.init


def missing(lib: str) -> str | None:
    """Why ``lib`` cannot run here (the opgraph API of issue 33 not merged yet), or None."""
    if lib != "opgraph":
        return None
    import opgraph
    import opgraph.optim

    gaps = [name for name, ok in (("opgraph.jit", hasattr(opgraph, "jit")),
                                  ("opgraph.optim.Adam.init/update", hasattr(opgraph.optim.Adam, "update")),
                                  ("opgraph.optim.apply_updates", hasattr(opgraph.optim, "apply_updates")))
            if not ok]
    return "missing: " + ", ".join(gaps) if gaps else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", choices=("opgraph", "jax", "numpy", "optax"), required=True)
    ap.add_argument("--backend", choices=("jax", "numpy", "torch"), default="numpy")
    ap.add_argument("--size", choices=tuple(SIZES), default="small")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--check", type=int, default=0, help="only run this many steps and print their losses")
    ap.add_argument("--expect", default="", help="the reference's first losses, comma-separated")
    args = ap.parse_args()
    base = {"lib": args.lib, "backend": args.backend, "size": args.size}
    if why := missing(args.lib):
        print(json.dumps({**base, "error": why}))
        return
    on_jax = args.backend == "jax" or args.lib in ("jax", "optax")
    if on_jax:
        import jax

        to_device: Callable[[Any], Any] = jax.device_put
        sync: Callable[[Any], Any] = jax.block_until_ready
        base["version"] = jax.__version__
    elif args.backend == "torch":
        import torch

        torch.set_num_threads(1)
        to_device, sync = torch.from_numpy, lambda t: t  # CPU torch results are ready when returned
        base["version"] = torch.__version__
    else:
        to_device = sync = lambda t: t  # NumPy results are ready when returned
    make = {"opgraph": lambda: opgraph_step(args.backend), "jax": jax_step, "numpy": numpy_step,
            "optax": optax_step}[args.lib]
    step, init = make()

    def start(size: str) -> tuple[Any, Any, Any, Any]:
        params, x, y = initial(size)
        params = {k: to_device(v) for k, v in params.items()}
        return params, init(params), to_device(x), to_device(y)

    # A tiny MLP first: loading modules and starting the engine is then not counted as compiling this step.
    if not args.check:
        t0 = time.perf_counter()
        sync(step(*start("tiny")))
        base["cold_s"] = time.perf_counter() - t0
    params, state, x, y = start(args.size)
    t0 = time.perf_counter()
    loss, params, state = sync(step(params, state, x, y))
    first = time.perf_counter() - t0
    losses = [float(loss)]
    for _ in range(max(args.check, 3) - 1):
        loss, params, state = sync(step(params, state, x, y))
        losses.append(float(loss))
    if args.check:
        print(json.dumps({**base, "losses": losses[: args.check]}))
        return
    if args.expect:
        ref = [float(v) for v in args.expect.split(",")]
        base["loss_diff"] = diff = max(abs(a - b) / abs(b) for a, b in zip(losses, ref, strict=False))
        if not diff <= RTOL:  # a benchmark that compares different computations is worthless: time nothing
            print(json.dumps({**base, "losses": losses[:3], "error": f"losses differ from optax's ({diff:.1e})"}))
            return
    for _ in range(args.warmup):
        loss, params, state = sync(step(params, state, x, y))
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss, params, state = sync(step(params, state, x, y))
        times.append(time.perf_counter() - t0)
    print(json.dumps({**base, "first_s": first, "step_s": statistics.median(times), "steps": args.steps,
                      "losses": losses[:3], "last_loss": float(loss)}))


if __name__ == "__main__":
    main()
