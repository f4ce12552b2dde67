"""opgraph demo: train an MLP on scikit-learn's digits with ``opgraph.jit``.

1. Write the loss with ``opgraph.numpy`` and one training step as a plain
   function: ``opgraph.value_and_grad`` of the loss (reverse mode, ordinary
   graph ops), then momentum SGD through the optimiser's pure functions
   (``opt.update`` and ``opgraph.optim.apply_updates``, optax's API).
2. ``opgraph.jit`` traces that step once, optimises it, plans its memory and
   compiles it for the numpy engine; each mini-batch is one call with the
   parameters and optimiser state as pytrees in and out. Per-epoch loss and
   test accuracy are printed.
3. Train the same model in plain NumPy with a hand-written backward pass
   (same initialisation, same batches) and compare time, peak memory and
   the final parameters.
4. Check that the builder, lazy arrays and tracing give the same forward graph.
5. Build the same step as one graph with update edges (``training_step``),
   save it as a .cg file set and as JSON in ``out/`` and load both back.

Run with ``make demo``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import opgraph
import opgraph.io
import opgraph.nn as nn
import opgraph.numpy as onp
import opgraph.viz
from opgraph.optim import Momentum, TrainingStep, apply_updates, training_step

console = Console()
HIDDEN, CLASSES, BATCH, EPOCHS, LR, MU = 128, 10, 32, 15, 0.05, 0.9
PARAMS = ("w1", "b1", "w2", "b2")


def init_params(n_in: int, seed: int = 0) -> dict[str, np.ndarray]:
    """He-initialised weights, zero biases."""
    rng = np.random.default_rng(seed)
    return {"w1": rng.standard_normal((n_in, HIDDEN)) * np.sqrt(2.0 / n_in), "b1": np.zeros(HIDDEN),
            "w2": rng.standard_normal((HIDDEN, CLASSES)) * np.sqrt(2.0 / HIDDEN), "b2": np.zeros(CLASSES)}


def build_forward(b: opgraph.GraphBuilder, x: opgraph.Value, p: list[opgraph.Value]) -> opgraph.Value:
    """logits = relu(x @ w1 + b1) @ w2 + b2."""
    w1, b1, w2, b2 = p
    return b.add(b.matmul(b.relu(b.add(b.matmul(x, w1), b1)), w2), b2)


def build_step(n_in: int) -> TrainingStep:
    """The training-step graph: loss, gradients, momentum updates, update edges."""
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (BATCH, n_in)), name="x")
    y = b.input(("float64", (BATCH, CLASSES)), name="y")  # one-hot labels
    shapes = {"w1": (n_in, HIDDEN), "b1": (HIDDEN,), "w2": (HIDDEN, CLASSES), "b2": (CLASSES,)}
    p = [b.input(("float64", shapes[n]), name=n) for n in PARAMS]
    logits = build_forward(b, x, p)
    loss = b.negative(b.mean(b.sum(b.multiply(y, b.log_softmax(logits, axis=-1)), axis=1)))
    return training_step(b, loss, p, Momentum(lr=LR, mu=MU))


def build_predict(n_in: int, batch: int) -> opgraph.Graph:
    """Forward pass with parameters as inputs: class predictions."""
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (batch, n_in)), name="x")
    p = [b.input(("float64", s), name=n) for n, s in
         zip(PARAMS, [(n_in, HIDDEN), (HIDDEN,), (HIDDEN, CLASSES), (CLASSES,)], strict=True)]
    b.output(b.argmax(build_forward(b, x, p), axis=1))
    return b.freeze()


def batches(n: int, epoch: int) -> list[np.ndarray]:
    """The shuffled mini-batch indices of an epoch (the same for opgraph and NumPy)."""
    order = np.random.default_rng(1000 + epoch).permutation(n)
    return [order[i:i + BATCH] for i in range(0, n - BATCH + 1, BATCH)]


def loss_fn(params: dict[str, Any], x: Any, y: Any) -> Any:
    """Softmax cross-entropy of the MLP ``relu(x @ w1 + b1) @ w2 + b2`` on one-hot labels ``y``."""
    logits = nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]
    return -onp.mean(onp.sum(y * nn.log_softmax(logits, axis=-1), axis=1))


OPTIMIZER = Momentum(lr=LR, mu=MU)  # optax.sgd(LR, momentum=MU): v = MU v + g; p = p - LR v


@opgraph.jit
def train_step(params: dict[str, Any], opt_state: Any, x: Any, y: Any) -> tuple[Any, Any, Any]:
    """One step: loss and gradients, the optimiser's update, the new parameters (traced and compiled once)."""
    loss, grads = opgraph.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return loss, apply_updates(params, updates), opt_state


def train_opgraph(params: dict[str, np.ndarray], xs: np.ndarray, ys: np.ndarray, epochs: int,
                  on_epoch: Callable[[int, float, dict[str, np.ndarray]], None] | None = None,
                  max_steps: int | None = None) -> dict[str, np.ndarray]:
    """Train with the jitted step: the parameters and optimiser state are pytrees passed in and returned."""
    opt_state = OPTIMIZER.init(params)
    onehot = np.eye(CLASSES)[ys]
    steps = 0
    for epoch in range(epochs):
        losses = []
        for idx in batches(len(xs), epoch):
            loss, params, opt_state = train_step(params, opt_state, xs[idx], onehot[idx])
            losses.append(float(loss))
            steps += 1
            if max_steps is not None and steps >= max_steps:
                return params
        if on_epoch is not None:
            on_epoch(epoch, float(np.mean(losses)), params)
    return params


def numpy_step(p: dict[str, np.ndarray], vel: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> None:
    """One training step in plain NumPy with a hand-written backward pass; updates ``p`` and ``vel``."""
    pre = x @ p["w1"] + p["b1"]
    h = np.maximum(pre, 0.0)
    logits = h @ p["w2"] + p["b2"]
    z = logits - logits.max(axis=1, keepdims=True)
    prob = np.exp(z)
    prob /= prob.sum(axis=1, keepdims=True)
    dlogits = (prob - y) / len(x)
    grads = {"w2": h.T @ dlogits, "b2": dlogits.sum(axis=0)}
    dh = (dlogits @ p["w2"].T) * (pre > 0)
    grads["w1"], grads["b1"] = x.T @ dh, dh.sum(axis=0)
    for k in p:
        vel[k] = MU * vel[k] + grads[k]
        p[k] = p[k] - LR * vel[k]


def train_numpy(params: dict[str, np.ndarray], xs: np.ndarray, ys: np.ndarray, epochs: int,
                max_steps: int | None = None) -> dict[str, np.ndarray]:
    """The same training in plain NumPy with a hand-written backward pass."""
    p = {k: v.copy() for k, v in params.items()}
    vel = {k: np.zeros_like(v) for k, v in p.items()}
    onehot = np.eye(CLASSES)[ys]
    steps = 0
    for epoch in range(epochs):
        for idx in batches(len(xs), epoch):
            numpy_step(p, vel, xs[idx], onehot[idx])
            steps += 1
            if max_steps is not None and steps >= max_steps:
                return p
    return p


def peak_memory(fn: Callable[[], Any]) -> float:
    """Peak traced memory (MiB) while running ``fn``."""
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def check_front_ends(params: dict[str, np.ndarray], x_test: np.ndarray) -> None:
    """The forward pass built with the builder, lazy arrays and tracing gives one graph."""
    w1, b1, w2, b2 = (params[n] for n in PARAMS)
    n = len(x_test)
    b = opgraph.GraphBuilder()
    x = b.placeholder("float64", (n, w1.shape[0]), name="x")
    b.output(b.softmax(b.add(b.matmul(b.relu(b.add(b.matmul(x, b.const(w1)), b.const(b1))), b.const(w2)),
                             b.const(b2)), axis=-1))
    g_builder = b.freeze()
    xl = onp.placeholder((n, w1.shape[0]), "float64", name="x")
    probs = nn.softmax(nn.relu(xl @ onp.asarray(w1) + onp.asarray(b1)) @ onp.asarray(w2) + onp.asarray(b2), axis=-1)
    g_lazy = onp.to_graph([probs], inputs=[xl])

    @opgraph.function
    def mlp(x):  # type: ignore[no-untyped-def]
        return nn.softmax(nn.relu(x @ onp.asarray(w1) + onp.asarray(b1)) @ onp.asarray(w2) + onp.asarray(b2),
                          axis=-1)

    same = g_builder == g_lazy == mlp.graph(x_test)
    console.print(f"builder, lazy arrays and tracing give the same forward graph: [bold]{same}[/bold]")
    if not same:
        raise SystemExit("the three front ends disagree")


def opgraph_command() -> str:
    """How to call the ``opgraph`` command from the working directory: ``opgraph`` when the running Python's venv
    is active (its bin directory is on PATH), else the path of the venv's script, e.g. ``.venv/bin/opgraph``.

    >>> opgraph_command().endswith("opgraph")
    True
    """
    script = Path(sys.executable).parent / "opgraph"
    if not script.exists():
        return "opgraph"
    on_path = shutil.which("opgraph")
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return "opgraph"
    rel = os.path.relpath(script)
    return rel if not rel.startswith("..") else str(script)


def main() -> None:
    console.rule("[bold]opgraph demo: training an MLP on scikit-learn's digits")
    digits = load_digits()
    x_all, y_all = digits.data / 16.0, digits.target
    x_train, x_test, y_train, y_test = train_test_split(x_all, y_all, test_size=0.25, random_state=0,
                                                        stratify=y_all)
    n_in = x_train.shape[1]
    params = init_params(n_in)

    predict = build_predict(n_in, len(x_test))

    def accuracy(p: dict[str, np.ndarray]) -> float:
        (pred,) = predict.run({"x": x_test, **p})
        return float(np.mean(pred == y_test))

    onehot = np.eye(CLASSES)[y_train]
    t0 = time.perf_counter()
    train_step(params, OPTIMIZER.init(params), x_train[:BATCH], onehot[:BATCH])  # trace, optimise, compile
    t_compile = time.perf_counter() - t0
    g = train_step.graph(params, OPTIMIZER.init(params), x_train[:BATCH], onehot[:BATCH])
    kinds = Counter(g.kind_of(i) for i in range(g.num_ops))
    console.print(f"traced training step: {g.num_ops} ops ({', '.join(f'{k} {c}' for k, c in sorted(kinds.items()))}); "
                  f"opgraph.jit traced, optimised and compiled it in {t_compile * 1e3:.0f} ms")
    console.print(train_step.explain(params, OPTIMIZER.init(params), x_train[:BATCH], onehot[:BATCH]),
                  markup=False, highlight=False)

    history: list[tuple[int, float, float]] = []
    with Progress(TextColumn("[bold]epoch {task.completed}/{task.total}"), BarColumn(),
                  TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("", total=EPOCHS)

        def on_epoch(epoch: int, loss: float, p: dict[str, np.ndarray]) -> None:
            acc = accuracy(p)
            history.append((epoch, loss, acc))
            progress.console.print(f"epoch {epoch + 1:2d}  loss {loss:.4f}  test accuracy {acc:.2%}")
            progress.update(task, advance=1, description=f"loss {loss:.4f} acc {acc:.2%}")

        trained = train_opgraph(params, x_train, y_train, EPOCHS, on_epoch)
    t0 = time.perf_counter()
    train_opgraph(params, x_train, y_train, EPOCHS)  # timed again without the per-epoch evaluation
    t_og = time.perf_counter() - t0

    t0 = time.perf_counter()
    reference = train_numpy(params, x_train, y_train, EPOCHS)
    t_np = time.perf_counter() - t0
    n_steps = EPOCHS * len(batches(len(x_train), 0))
    mem_og = peak_memory(lambda: train_opgraph(params, x_train, y_train, 1, max_steps=20))
    mem_np = peak_memory(lambda: train_numpy(params, x_train, y_train, 1, max_steps=20))
    diff = max(float(np.max(np.abs(trained[k] - reference[k]))) for k in PARAMS)
    acc_og, acc_np = accuracy(trained), accuracy(reference)

    table = Table(title=f"{EPOCHS} epochs, {n_steps} steps of batch {BATCH} (MLP {n_in}-{HIDDEN}-{CLASSES}, "
                        f"momentum SGD)")
    for col in ("", "opgraph.jit (numpy engine)", "NumPy (hand-written backward)"):
        table.add_column(col, justify="right" if col else "left")
    table.add_row("test accuracy", f"{acc_og:.2%}", f"{acc_np:.2%}")
    table.add_row("training time", f"{t_og:.2f} s ({t_og / t_np:.2f}x)", f"{t_np:.2f} s")
    table.add_row("time per step", f"{t_og / n_steps * 1e3:.3f} ms", f"{t_np / n_steps * 1e3:.3f} ms")
    table.add_row("trace + optimise + compile (once)", f"{t_compile * 1e3:.0f} ms", "")
    table.add_row("peak traced memory (20 steps)", f"{mem_og:.2f} MiB", f"{mem_np:.2f} MiB")
    table.add_row("max |parameter difference| vs NumPy", f"{diff:.1e}", "")
    console.print(table)
    if diff > 1e-8:
        raise SystemExit("opgraph and NumPy training disagree")
    if acc_og < 0.95:
        raise SystemExit(f"test accuracy {acc_og:.2%} is below 95%")
    console.print("[green]opgraph.jit training matches the hand-written NumPy training.[/green]")

    check_front_ends(trained, x_test)

    g = build_step(n_in).graph  # the same step as one graph whose update edges carry parameters and state
    g.verify()
    out_dir = Path(__file__).resolve().parent.parent / "out"
    out_dir.mkdir(exist_ok=True)
    opgraph.io.save(g, out_dir / "mlp_step.cg")
    opgraph.io.save(g, out_dir / "mlp_step.json")
    if opgraph.io.load(out_dir / "mlp_step") != g or opgraph.io.load(out_dir / "mlp_step.json") != g:
        raise SystemExit("the saved step graph did not load back equal")
    sizes = ", ".join(f"{p.name} {p.stat().st_size:,} B" for p in sorted(out_dir.glob("mlp_step.*")))
    console.print(f"saved and reloaded the training-step graph ({g.num_ops} ops, {len(g.updates)} update edges): "
                  f"{sizes} "
                  f"(try: {opgraph_command()} info {os.path.relpath(out_dir / 'mlp_step.cg')})")
    try:
        picture = opgraph.viz.render(g, out_dir / "mlp_step.svg", plan=True)
        console.print(f"drew the training-step graph, values coloured by memory block: {picture}")
    except opgraph.viz.GraphvizNotFoundError as exc:
        console.print(f"no picture of the graph: {exc}")


if __name__ == "__main__":
    main()
