"""opgraph demo: an MLP classifier for scikit-learn's digits, as one graph built three ways.

1. Train a small MLP with scikit-learn (the reference implementation).
2. Build its forward pass as an opgraph graph with the explicit builder,
   with lazy arrays, and with ``@opgraph.function`` tracing; check the
   three graphs are structurally identical.
3. Run the graph on the held-out test split, compare with scikit-learn's
   own predictions, and print graph statistics.
4. Save the graph as a .cg file set and as JSON in ``out/`` and load both back.

Run with ``make demo``.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

import opgraph
import opgraph.io
import opgraph.nn as nn
import opgraph.numpy as onp

console = Console()


def forward_builder(params: list[np.ndarray], batch: int) -> opgraph.Graph:
    """The forward pass with the explicit builder (seed 003's API)."""
    w1, b1, w2, b2 = params
    b = opgraph.GraphBuilder()
    x = b.placeholder("float64", (batch, w1.shape[0]), name="x")
    h = b.relu(b.add(b.matmul(x, b.const(w1)), b.const(b1)))
    logits = b.add(b.matmul(h, b.const(w2)), b.const(b2))
    b.output(b.softmax(logits, axis=-1))
    return b.freeze()


def forward_lazy(params: list[np.ndarray], batch: int) -> opgraph.Graph:
    """The same forward pass with NumPy-style lazy arrays."""
    w1, b1, w2, b2 = params
    x = onp.placeholder((batch, w1.shape[0]), "float64", name="x")
    probs = nn.softmax(nn.relu(x @ onp.asarray(w1) + onp.asarray(b1)) @ onp.asarray(w2) + onp.asarray(b2), axis=-1)
    return onp.to_graph([probs], inputs=[x])


def make_traced(params: list[np.ndarray]) -> opgraph.frontend.trace.TracedFunction:
    """The same forward pass as a traced function."""
    w1, b1, w2, b2 = params

    @opgraph.function
    def mlp(x):  # type: ignore[no-untyped-def]
        return nn.softmax(nn.relu(x @ onp.asarray(w1) + onp.asarray(b1)) @ onp.asarray(w2) + onp.asarray(b2),
                          axis=-1)

    return mlp


def main() -> None:
    console.rule("[bold]opgraph demo: MLP on scikit-learn's digits")
    digits = load_digits()
    x = digits.data / 16.0
    y = digits.target
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    t0 = time.perf_counter()
    clf = MLPClassifier(hidden_layer_sizes=(64,), max_iter=400, random_state=0).fit(x_train, y_train)
    console.print(f"trained scikit-learn MLP 64-64-10 on {len(x_train)} images in {time.perf_counter() - t0:.1f} s")
    params = [clf.coefs_[0], clf.intercepts_[0], clf.coefs_[1], clf.intercepts_[1]]

    batch = len(x_test)
    t0 = time.perf_counter()
    g_builder = forward_builder(params, batch)
    t_build = time.perf_counter() - t0
    g_lazy = forward_lazy(params, batch)
    mlp = make_traced(params)
    g_traced = mlp.graph(x_test)
    same = g_builder == g_lazy == g_traced
    console.print(f"builder, lazy arrays and tracing give the same graph: [bold]{same}[/bold]")
    if not same:
        raise SystemExit("the three front ends disagree")
    g_builder.verify()

    console.print()
    console.print(str(g_builder), markup=False, highlight=False)
    stats = Table(title="graph statistics")
    stats.add_column("what")
    stats.add_column("value", justify="right")
    kinds = Counter(g_builder.kind_of(i) for i in range(g_builder.num_ops))
    stats.add_row("ops", str(g_builder.num_ops))
    stats.add_row("values", str(g_builder.num_values))
    stats.add_row("ops by kind", ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    stats.add_row("constants (parameters)", f"{sum(c.size for c in g_builder.constants)} numbers")
    stats.add_row("structure bytes", f"{g_builder.nbytes} ({g_builder.nbytes / g_builder.num_ops:.0f} per op)")
    stats.add_row("build time", f"{t_build * 1e3:.2f} ms")
    console.print(stats)

    t0 = time.perf_counter()
    (probs,) = g_builder.run({"x": x_test})
    t_run = time.perf_counter() - t0
    t0 = time.perf_counter()
    traced_probs = mlp(x_test)
    t_traced = time.perf_counter() - t0
    ref = clf.predict_proba(x_test)
    acc = float(np.mean(probs.argmax(axis=1) == y_test))
    results = Table(title=f"results on the {batch} held-out test images")
    results.add_column("what")
    results.add_column("value", justify="right")
    results.add_row("test accuracy (opgraph)", f"{acc:.2%}")
    results.add_row("test accuracy (scikit-learn)", f"{clf.score(x_test, y_test):.2%}")
    results.add_row("max |opgraph - scikit-learn| probability", f"{np.max(np.abs(probs - ref)):.2e}")
    results.add_row("max |traced - builder|", f"{np.max(np.abs(traced_probs - probs)):.2e}")
    results.add_row("run time (graph.run)", f"{t_run * 1e3:.2f} ms")
    results.add_row("run time (traced call)", f"{t_traced * 1e3:.2f} ms")
    console.print(results)
    if not np.allclose(probs, ref, atol=1e-10):
        raise SystemExit("opgraph disagrees with scikit-learn")
    console.print("[green]opgraph reproduces scikit-learn's predictions.[/green]")

    out_dir = Path(__file__).resolve().parent.parent / "out"
    out_dir.mkdir(exist_ok=True)
    opgraph.io.save(g_builder, out_dir / "mlp.cg")
    opgraph.io.save(g_builder, out_dir / "mlp.json")
    loaded = opgraph.io.load(out_dir / "mlp")
    if loaded != g_builder or opgraph.io.load(out_dir / "mlp.json") != g_builder:
        raise SystemExit("the saved graph did not load back equal")
    sizes = ", ".join(f"{p.name} {p.stat().st_size:,} B" for p in sorted(out_dir.glob("mlp.*")))
    console.print(f"saved and reloaded the graph: {sizes} (try: opgraph info out/mlp.cg)")


if __name__ == "__main__":
    main()
