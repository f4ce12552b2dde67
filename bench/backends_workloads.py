"""One (workload, implementation) pair of the backends benchmark in this process; prints one JSON line.

    python bench/backends_workloads.py --workload mlp|cnn|chain --impl IMPL [--repeat N] [--warmup N]

IMPL is an opgraph backend (``opgraph-numpy``, ``opgraph-jax``, ``opgraph-torch``,
``opgraph-torch-compile``, ``opgraph-onnxruntime``, ``opgraph-auto``) or a peer run directly
(``numpy``, ``jax``, ``torch``, ``torch-compile``, ``onnxruntime``). The workloads:

* ``mlp``: one training step of the MLP 784-512-512-10, batch 128, float32, SGD (bench/training_common.py).
  opgraph runs the step graph built by :func:`opgraph.optim.training_step` (update edges carry the
  parameters); the peers run the hand-written equivalent (NumPy backward, ``jax.jit`` of a
  ``value_and_grad`` step, torch autograd + SGD). The ONNX Runtime peer has no path for update edges.
* ``cnn``: inference of a small ResNet-style CNN (conv 3->32, a residual block of two 3x3 convs, max pool,
  global mean, linear 10) on 64x3x32x32 float32; the weights are constants of the graph (closed over by
  the peers). There is no NumPy eager peer (opgraph's numpy backend is the NumPy column).
* ``chain``: 20 elementwise ops on 4M float32.

Every call is timed end to end from NumPy inputs to NumPy outputs (``np.asarray`` of the peers'
results), so each column pays its own conversions. The JSON has the median seconds over ``--repeat``
timed calls after ``--warmup`` calls, the first call's seconds (compilation), peak RSS in MiB, a
checksum of the result (for the table to compare implementations) and, for ``opgraph-auto``, the
backend chosen and every candidate's timing.
"""

from __future__ import annotations

import os

# One thread for XLA too, set before anything imports jax (bench/run.py sets the BLAS/OpenMP variables).
os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

import argparse
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_common import LR, data, numpy_step, opgraph_step

OPGRAPH = ("opgraph-numpy", "opgraph-jax", "opgraph-torch", "opgraph-torch-compile", "opgraph-onnxruntime",
           "opgraph-auto")
PEERS = ("numpy", "jax", "torch", "torch-compile", "onnxruntime")
WORKLOADS = ("mlp", "cnn", "chain")
AUTO_BUDGET = 8.0  # seconds opgraph's auto may spend timing the candidates (not part of the timed calls)

# ---------------------------------------------------------------- the elementwise chain
CHAIN_N = 4 * 1024 * 1024
# (kind, constant operand or None): 20 ops; values stay small (tanh/sin/cos bound them) so exp and log are tame.
CHAIN = (("sin", None), ("multiply", 1.5), ("add", 0.25), ("tanh", None), ("exp", None),
         ("multiply", 0.5), ("subtract", 0.75), ("cos", None), ("multiply", 2.0), ("add", 0.1),
         ("tanh", None), ("abs", None), ("add", 1.0), ("log", None), ("multiply", 3.0),
         ("sin", None), ("add", 0.5), ("tanh", None), ("exp", None), ("multiply", 0.25))


def chain_input() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(CHAIN_N).astype(np.float32)


# ---------------------------------------------------------------- the CNN
CNN_BATCH, CNN_WIDTH, CNN_CLASSES = 64, 32, 10


def cnn_data() -> tuple[dict[str, np.ndarray], np.ndarray]:
    """He-initialised float32 weights (OIHW, PyTorch's layout) and the input batch."""
    rng = np.random.default_rng(0)

    def he(*shape: int) -> np.ndarray:
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    c = CNN_WIDTH
    w = {"w1": he(c, 3, 3, 3), "b1": np.zeros(c, np.float32), "w2": he(c, c, 3, 3),
         "b2": np.zeros(c, np.float32), "w3": he(c, c, 3, 3), "b3": np.zeros(c, np.float32),
         "fc": (rng.standard_normal((c, CNN_CLASSES)) / np.sqrt(c)).astype(np.float32),
         "fcb": np.zeros(CNN_CLASSES, np.float32)}
    x = rng.standard_normal((CNN_BATCH, 3, 32, 32)).astype(np.float32)
    return w, x


# ---------------------------------------------------------------- opgraph graphs
def mlp_graph() -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The training-step graph of bench/training_opgraph.py; returns (graph, initial params, data feeds)."""
    params, x, y = data()
    step, init = opgraph_step(params, x, y)
    return step.graph, init, {"x": x, "y": y}


def cnn_graph() -> tuple[Any, dict[str, np.ndarray]]:
    import opgraph

    w, x = cnn_data()
    b = opgraph.GraphBuilder()
    xv = b.input(("float32", x.shape), name="x")
    c = {k: b.constant(v, name=k) for k, v in w.items()}

    def bias(v: Any, name: str) -> Any:
        return b.add(v, b.reshape(c[name], shape=(1, CNN_WIDTH, 1, 1)))

    h1 = b.relu(bias(b.conv2d(xv, c["w1"], padding=1), "b1"))
    h2 = b.relu(bias(b.conv2d(h1, c["w2"], padding=1), "b2"))
    h3 = bias(b.conv2d(h2, c["w3"], padding=1), "b3")
    h = b.max_pool2d(b.relu(b.add(h3, h1)), kernel_size=2)
    logits = b.add(b.matmul(b.mean(h, axis=(2, 3)), c["fc"]), c["fcb"])
    b.output(logits)
    return b.freeze(), {"x": x}


CHAIN_UFUNCS = {"sin": np.sin, "cos": np.cos, "tanh": np.tanh, "exp": np.exp, "abs": np.abs, "log": np.log,
                "add": np.add, "subtract": np.subtract, "multiply": np.multiply}
"""The NumPy function of each op kind in CHAIN."""


def chain_graph(x: np.ndarray | None = None) -> tuple[Any, dict[str, np.ndarray]]:
    """The chain as an opgraph graph over ``x`` (default :func:`chain_input`), and its feeds."""
    import opgraph

    x = chain_input() if x is None else x
    b = opgraph.GraphBuilder()
    h = b.input((x.dtype, x.shape), name="x")
    for kind, k in CHAIN:
        h = b.op(kind, h) if k is None else b.op(kind, h, b.constant(np.float32(k)))
    b.output(h)
    return b.freeze(), {"x": x}


def opgraph_call(workload: str, impl: str) -> tuple[Callable[[], Any], dict[str, Any]]:
    """The call to time for an opgraph backend, and extra facts for the JSON (auto's choice)."""
    import opgraph

    backend = impl[len("opgraph-"):]
    options: dict[str, Any] = {}
    if backend == "torch-compile":
        backend, options = "torch", {"compile": True}
    elif backend == "onnxruntime":
        options = {"threads": 1}
    if workload == "mlp":
        graph, init, feeds = mlp_graph()
        first = {**feeds, **init}  # the first call feeds the update destinations (the initial parameters)
    else:
        graph, feeds = cnn_graph() if workload == "cnn" else chain_graph()
        first = feeds
    extra: dict[str, Any] = {}
    if backend == "auto":
        fn = opgraph.compile(graph, backend="auto", example_inputs=first, budget=AUTO_BUDGET)
        extra["choice"] = fn.choice.backend
        extra["timings"] = fn.choice.timings
        extra["failures"] = fn.choice.failures
    else:
        fn = opgraph.compile(graph, backend=backend, **options)
    state = {"first": True}

    def call() -> Any:
        if state["first"]:
            state["first"] = False
            return fn(dict(first))[0]
        return fn(dict(feeds))[0]

    return call, extra


# ---------------------------------------------------------------- peers: the MLP training step
def numpy_mlp() -> Callable[[], Any]:
    """bench/training_numpy.py's hand-written step."""
    return numpy_step(*data())


def jax_mlp() -> Callable[[], Any]:
    import jax
    import jax.numpy as jnp

    params, x, y = data()

    def loss_fn(p: list[Any], x: Any, y: Any) -> Any:
        h = x
        for i in range(len(p) // 2):
            h = h @ p[2 * i] + p[2 * i + 1]
            if i < len(p) // 2 - 1:
                h = jax.nn.relu(h)
        return -jnp.mean(jnp.sum(y * jax.nn.log_softmax(h, axis=-1), axis=1))

    def step(p: list[Any], x: Any, y: Any) -> tuple[Any, list[Any]]:
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        return loss, [a - LR * b for a, b in zip(p, g, strict=True)]

    step = jax.jit(step, donate_argnums=0)
    state = {"p": [jnp.asarray(a) for a in params]}

    def call() -> float:
        loss, state["p"] = step(state["p"], x, y)
        return float(loss)

    return call


def torch_mlp(compiled: bool) -> Callable[[], Any]:
    import torch

    params, x, y = data()
    p = [torch.tensor(a, requires_grad=True) for a in params]

    def loss_fn(tx: Any, ty: Any) -> Any:
        h = tx
        for i in range(len(p) // 2):
            h = h @ p[2 * i] + p[2 * i + 1]
            if i < len(p) // 2 - 1:
                h = torch.relu(h)
        return -(ty * torch.log_softmax(h, dim=-1)).sum(dim=1).mean()

    def sgd() -> None:
        with torch.no_grad():
            torch._foreach_add_(p, [q.grad for q in p], alpha=-LR)
        for q in p:
            q.grad = None

    fwd = torch.compile(loss_fn) if compiled else loss_fn
    update = torch.compile(sgd) if compiled else sgd

    def call() -> float:
        loss = fwd(torch.from_numpy(x), torch.from_numpy(y))
        loss.backward()
        update()
        return float(loss.detach())

    return call


# ---------------------------------------------------------------- peers: the CNN
def jax_cnn() -> Callable[[], Any]:
    import jax
    import jax.numpy as jnp
    from jax import lax

    w, x = cnn_data()
    wj = {k: jnp.asarray(v) for k, v in w.items()}
    dn = ("NCHW", "OIHW", "NCHW")

    def conv(h: Any, k: str, b: str) -> Any:
        out = lax.conv_general_dilated(h, wj[k], (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn)
        return out + wj[b][None, :, None, None]

    @jax.jit
    def f(x: Any) -> Any:
        h1 = jax.nn.relu(conv(x, "w1", "b1"))
        h2 = jax.nn.relu(conv(h1, "w2", "b2"))
        h = jax.nn.relu(conv(h2, "w3", "b3") + h1)
        h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        return jnp.mean(h, axis=(2, 3)) @ wj["fc"] + wj["fcb"]

    return lambda: np.asarray(f(x))


def torch_cnn(compiled: bool) -> Callable[[], Any]:
    import torch
    import torch.nn.functional as F

    w, x = cnn_data()
    wt = {k: torch.from_numpy(v) for k, v in w.items()}

    def f(x: Any) -> Any:
        h1 = torch.relu(F.conv2d(x, wt["w1"], wt["b1"], padding=1))
        h2 = torch.relu(F.conv2d(h1, wt["w2"], wt["b2"], padding=1))
        h = torch.relu(F.conv2d(h2, wt["w3"], wt["b3"], padding=1) + h1)
        h = F.max_pool2d(h, 2)
        return h.mean(dim=(2, 3)) @ wt["fc"] + wt["fcb"]

    fn = torch.compile(f) if compiled else f

    def call() -> np.ndarray:
        with torch.inference_mode():
            return fn(torch.from_numpy(x)).numpy()

    return call


# ---------------------------------------------------------------- peers: the chain
def numpy_chain(x: np.ndarray | None = None) -> Callable[[], Any]:
    """NumPy eager over the chain: a fresh array per op (on ``x``, default :func:`chain_input`)."""
    x = chain_input() if x is None else x
    steps = [(CHAIN_UFUNCS[kind], None if k is None else np.float32(k)) for kind, k in CHAIN]

    def call() -> np.ndarray:
        h = x
        for f, k in steps:
            h = f(h) if k is None else f(h, k)
        return h

    return call


def jax_chain() -> Callable[[], Any]:
    import jax
    import jax.numpy as jnp

    x = chain_input()
    fns = {"sin": jnp.sin, "cos": jnp.cos, "tanh": jnp.tanh, "exp": jnp.exp, "abs": jnp.abs, "log": jnp.log,
           "add": jnp.add, "subtract": jnp.subtract, "multiply": jnp.multiply}

    @jax.jit
    def f(h: Any) -> Any:
        for kind, k in CHAIN:
            h = fns[kind](h) if k is None else fns[kind](h, jnp.float32(k))
        return h

    return lambda: np.asarray(f(x))


def torch_chain(compiled: bool) -> Callable[[], Any]:
    import torch

    x = chain_input()
    fns = {"sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "exp": torch.exp, "abs": torch.abs,
           "log": torch.log, "add": torch.add, "subtract": torch.sub, "multiply": torch.mul}

    def f(h: Any) -> Any:
        for kind, k in CHAIN:
            h = fns[kind](h) if k is None else fns[kind](h, k)
        return h

    fn = torch.compile(f) if compiled else f
    return lambda: fn(torch.from_numpy(x)).numpy()


def onnxruntime_call(workload: str) -> Callable[[], Any]:
    """The opgraph graph exported with opgraph.io.onnx.to_onnx and run by a plain InferenceSession."""
    import onnxruntime as ort

    from opgraph.io.onnx import to_onnx

    if workload == "mlp":
        raise SystemExit("the ONNX Runtime peer cannot run a graph with update edges")
    graph, feeds = cnn_graph() if workload == "cnn" else chain_graph()
    model = to_onnx(graph).SerializeToString()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feeds)[0]


def peer_call(workload: str, impl: str) -> Callable[[], Any]:
    if impl == "onnxruntime":
        return onnxruntime_call(workload)
    if impl.startswith("torch"):
        compiled = impl == "torch-compile"
        return {"mlp": torch_mlp, "cnn": torch_cnn, "chain": torch_chain}[workload](compiled)
    if workload == "cnn" and impl == "numpy":
        raise SystemExit("no NumPy eager CNN: opgraph's numpy backend is the NumPy implementation")
    return {("numpy", "mlp"): numpy_mlp, ("numpy", "chain"): numpy_chain, ("jax", "mlp"): jax_mlp,
            ("jax", "cnn"): jax_cnn, ("jax", "chain"): jax_chain}[impl, workload]()


def checksum(out: Any) -> float:
    """The result summed in float64: the table compares it between implementations."""
    return float(np.sum(np.asarray(out, dtype=np.float64)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True, choices=WORKLOADS)
    ap.add_argument("--impl", required=True, choices=OPGRAPH + PEERS)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    if args.repeat < 5:
        ap.error("--repeat must be at least 5")
    if "torch" in args.impl or args.impl == "opgraph-auto":
        try:
            import torch
        except ImportError:
            if "torch" in args.impl:
                raise
        else:
            torch.set_num_threads(1)
            torch.set_num_interop_threads(1)
    t0 = time.perf_counter()
    extra: dict[str, Any] = {}
    if args.impl.startswith("opgraph-"):
        call, extra = opgraph_call(args.workload, args.impl)
    else:
        call = peer_call(args.workload, args.impl)
    first_out = call()  # compilation (JIT, torch.compile, session creation) happens here or above
    prepare = time.perf_counter() - t0
    for _ in range(args.warmup):
        call()
    times, out = [], first_out
    for _ in range(args.repeat):
        t = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # the MLP's first output is the loss before the first update (the same for every implementation);
    # the others' outputs do not change between calls
    scale = max(checksum(np.abs(first_out)), checksum(np.abs(out)))
    print(json.dumps({"median": statistics.median(times), "min": min(times), "prepare": prepare, "rss_mb": rss_mb,
                      "check": checksum(first_out), "last": checksum(out), "scale": scale, "repeat": args.repeat,
                      **extra}))


if __name__ == "__main__":
    main()
