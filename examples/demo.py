"""opgraph demo: train an MLP on scikit-learn's digits with a training-step graph.

1. Build the training step once: forward pass, softmax cross-entropy loss,
   gradients by opgraph's reverse-mode autodiff (ordinary graph ops),
   momentum-SGD updates and update edges (parameters and optimiser state
   carried from call to call).
2. Call it per mini-batch; print per-epoch loss and test accuracy.
3. Train the same model in plain NumPy with a hand-written backward pass
   (same initialisation, same batches) and compare time, peak memory and
   the final parameters.
4. Check that the builder, lazy arrays and tracing give the same forward graph.
5. Save the step graph as a .cg file set and as JSON in ``out/`` and load both back.

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
from opgraph.optim import Momentum, StepRunner, TrainingStep, training_step

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


class CompiledRunner:
    """The step graph on the compiled runtime, which applies update edges natively."""

    def __init__(self, step: TrainingStep, params: dict[str, np.ndarray]) -> None:
        from opgraph.runtime.compiled import compile

        self.fn = compile(opgraph.optimize(step.graph))  # a step runs many times: optimised once (level 2)
        self.first: dict[str, np.ndarray] | None = {**step.state, **params}

    def __call__(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self.first is not None:  # the first call feeds the parameters and optimiser state
            feeds, self.first = {**self.first, **feeds}, None
        return self.fn(feeds)

    def value(self, name: str) -> np.ndarray:
        return self.fn.state(name)


def train_opgraph(step: TrainingStep, params: dict[str, np.ndarray], xs: np.ndarray, ys: np.ndarray,
                  epochs: int, on_epoch: Callable[[int, float, dict[str, np.ndarray]], None] | None = None,
                  max_steps: int | None = None, runner: Callable[..., Any] = StepRunner) -> dict[str, np.ndarray]:
    run = runner(step, params)
    onehot = np.eye(CLASSES)[ys]
    steps = 0
    for epoch in range(epochs):
        losses = []
        for idx in batches(len(xs), epoch):
            (loss,) = run({"x": xs[idx], "y": onehot[idx]})  # one training step
            losses.append(float(loss))
            steps += 1
            if max_steps is not None and steps >= max_steps:
                return {n: run.value(n) for n in PARAMS}
        if on_epoch is not None:
            on_epoch(epoch, float(np.mean(losses)), {n: run.value(n) for n in PARAMS})
    return {n: run.value(n) for n in PARAMS}


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

    t0 = time.perf_counter()
    step = build_step(n_in)
    t_build = time.perf_counter() - t0
    predict = build_predict(n_in, len(x_test))
    g = step.graph
    g.verify()
    kinds = Counter(g.kind_of(i) for i in range(g.num_ops))
    console.print(f"training-step graph: {g.num_ops} ops ({', '.join(f'{k} {c}' for k, c in sorted(kinds.items()))}), "
                  f"{len(g.updates)} update edges, built in {t_build * 1e3:.1f} ms")

    def accuracy(p: dict[str, np.ndarray]) -> float:
        (pred,) = predict.run({"x": x_test, **p})
        return float(np.mean(pred == y_test))

    history: list[tuple[int, float, float]] = []
    with Progress(TextColumn("[bold]epoch {task.completed}/{task.total}"), BarColumn(),
                  TextColumn("{task.description}"), TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("", total=EPOCHS)

        def on_epoch(epoch: int, loss: float, p: dict[str, np.ndarray]) -> None:
            acc = accuracy(p)
            history.append((epoch, loss, acc))
            progress.console.print(f"epoch {epoch + 1:2d}  loss {loss:.4f}  test accuracy {acc:.2%}")
            progress.update(task, advance=1, description=f"loss {loss:.4f} acc {acc:.2%}")

        t0 = time.perf_counter()
        trained = train_opgraph(step, params, x_train, y_train, EPOCHS, on_epoch)
        t_og = time.perf_counter() - t0
    t0 = time.perf_counter()
    train_opgraph(step, params, x_train, y_train, EPOCHS)  # timed again without the per-epoch evaluation
    t_og = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        built = CompiledRunner(step, params)  # optimise and compile once; the steps are timed apart
        t_build = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled = train_opgraph(step, params, x_train, y_train, EPOCHS, runner=lambda _s, _p: built)
        t_cp: float | None = time.perf_counter() - t0
        diff_cp = max(float(np.max(np.abs(compiled[k] - trained[k]))) for k in PARAMS)
    except (ImportError, AttributeError):  # the compiled runtime is optional here
        t_cp = None

    t0 = time.perf_counter()
    reference = train_numpy(params, x_train, y_train, EPOCHS)
    t_np = time.perf_counter() - t0
    n_steps = EPOCHS * len(batches(len(x_train), 0))
    mem_og = peak_memory(lambda: train_opgraph(step, params, x_train, y_train, 1, max_steps=20))
    if t_cp is not None:
        built = CompiledRunner(step, params)  # the memory of 20 steps: the program (arena, state) and its calls
        mem_cp: float | None = peak_memory(lambda: train_opgraph(step, params, x_train, y_train, 1, max_steps=20,
                                                                 runner=lambda _s, _p: built))
    else:
        mem_cp = None
    mem_np = peak_memory(lambda: train_numpy(params, x_train, y_train, 1, max_steps=20))
    diff = max(float(np.max(np.abs(trained[k] - reference[k]))) for k in PARAMS)
    acc_og, acc_np = accuracy(trained), accuracy(reference)

    table = Table(title=f"{EPOCHS} epochs, {n_steps} steps of batch {BATCH} (MLP {n_in}-{HIDDEN}-{CLASSES}, "
                        f"momentum SGD)")
    for col in ("", "opgraph step graph, executor", "opgraph, compiled", "NumPy (hand-written backward)"):
        table.add_column(col, justify="right" if col else "left")

    def cp(text: str) -> str:
        return text if t_cp is not None else "-"

    table.add_row("test accuracy", f"{acc_og:.2%}", cp(f"{accuracy(compiled):.2%}" if t_cp else ""), f"{acc_np:.2%}")
    table.add_row("training time", f"{t_og:.2f} s ({t_og / t_np:.1f}x)",
                  cp(f"{t_cp:.2f} s ({(t_cp or 1) / t_np:.1f}x)"), f"{t_np:.2f} s")
    table.add_row("time per step", f"{t_og / n_steps * 1e3:.2f} ms", cp(f"{(t_cp or 0) / n_steps * 1e3:.2f} ms"),
                  f"{t_np / n_steps * 1e3:.2f} ms")
    table.add_row("optimise + compile (once)", "", cp(f"{t_build * 1e3:.0f} ms" if t_cp else ""), "")
    table.add_row("peak traced memory (20 steps)", f"{mem_og:.2f} MiB", cp(f"{mem_cp or 0:.2f} MiB"),
                  f"{mem_np:.2f} MiB")
    table.add_row("max |parameter difference| vs NumPy", f"{diff:.1e}",
                  cp(f"{diff_cp + diff:.1e}" if t_cp else ""), "")
    console.print(table)
    if diff > 1e-8:
        raise SystemExit("opgraph and NumPy training disagree")
    if acc_og < 0.95:
        raise SystemExit(f"test accuracy {acc_og:.2%} is below 95%")
    console.print("[green]opgraph's autodiff training matches the hand-written NumPy training.[/green]")

    check_front_ends(trained, x_test)

    out_dir = Path(__file__).resolve().parent.parent / "out"
    out_dir.mkdir(exist_ok=True)
    opgraph.io.save(g, out_dir / "mlp_step.cg")
    opgraph.io.save(g, out_dir / "mlp_step.json")
    if opgraph.io.load(out_dir / "mlp_step") != g or opgraph.io.load(out_dir / "mlp_step.json") != g:
        raise SystemExit("the saved step graph did not load back equal")
    sizes = ", ".join(f"{p.name} {p.stat().st_size:,} B" for p in sorted(out_dir.glob("mlp_step.*")))
    console.print(f"saved and reloaded the training-step graph: {sizes} "
                  f"(try: {opgraph_command()} info {os.path.relpath(out_dir / 'mlp_step.cg')})")
    try:
        picture = opgraph.viz.render(g, out_dir / "mlp_step.svg", plan=True)
        console.print(f"drew the training-step graph, values coloured by memory block: {picture}")
    except opgraph.viz.GraphvizNotFoundError as exc:
        console.print(f"no picture of the graph: {exc}")


if __name__ == "__main__":
    main()
