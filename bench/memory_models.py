"""Benchmark models for the memory planner, each two ways: an opgraph graph and NumPy eager code.

Imported by ``bench/memory_run.py`` and the tests (``tests/test_memory*.py``).
Every model takes a ``scale`` so the tests can build small versions.

    >>> g, feeds, eager = build("chain", scale=0.001)
    >>> g.num_ops > 20
    True
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

import opgraph

Model = tuple[opgraph.Graph, dict[str, np.ndarray], Callable[[dict[str, np.ndarray]], list[np.ndarray]]]

F32 = np.float32


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def mlp(scale: float = 1.0) -> Model:
    """784-512-512-10 MLP forward pass with relu and a softmax, batch 128 (``scale`` shrinks batch and widths)."""
    rng = _rng()
    batch, hidden = max(2, int(128 * scale)), max(4, int(512 * scale))
    sizes = [784 if scale >= 1 else max(8, int(784 * scale)), hidden, hidden, 10]
    ws = [(rng.standard_normal((a, c)) / np.sqrt(a)).astype(F32) for a, c in itertools.pairwise(sizes)]
    bs = [rng.standard_normal(c).astype(F32) * 0.1 for c in sizes[1:]]
    b = opgraph.GraphBuilder()
    x = b.input((F32, (batch, sizes[0])), name="x")
    h = x
    for i, (w, bias) in enumerate(zip(ws, bs, strict=True)):
        h = b.add(b.matmul(h, b.const(w)), b.const(bias))
        if i < len(ws) - 1:
            h = b.relu(h)
    b.output(b.softmax(h, axis=-1))
    feeds = {"x": rng.standard_normal((batch, sizes[0])).astype(F32)}

    def eager(f: dict[str, np.ndarray]) -> list[np.ndarray]:
        h = f["x"]
        for i, (w, bias) in enumerate(zip(ws, bs, strict=True)):
            h = h @ w + bias
            if i < len(ws) - 1:
                h = np.maximum(h, 0)
        e = np.exp(h - h.max(axis=-1, keepdims=True))
        return [e / e.sum(axis=-1, keepdims=True)]

    return b.freeze(), feeds, eager


def _kernel(name: str) -> Callable[..., Any]:
    from opgraph.backends.numpy import BACKEND

    return BACKEND.kernel_for(name, 1)


def _conv_eager(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """conv2d with 'same' padding: eager code calls the same NumPy kernel the graph runs (as Owl's table does)."""
    p = w.shape[-1] // 2
    return _kernel("conv2d")(x, w, stride=(1, 1), padding=(p, p, p, p), dilation=(1, 1), groups=1)


def _bn(b: Any, h: Any, s: np.ndarray, t: np.ndarray) -> Any:
    return b.add(b.multiply(h, b.const(s)), b.const(t))


def resnet(scale: float = 1.0) -> Model:
    """ResNet-style CNN inference, 32x32x3 input, batch 32: a conv3x3 stem, then residual bottleneck blocks
    (conv1x1 -> conv3x3 -> conv1x1, each with batch-norm in inference form x*scale+shift, relu) at 64 channels."""
    rng = _rng()
    batch, side = max(1, int(32 * scale)), max(4, int(32 * min(1.0, scale * 4)))
    ch, mid, blocks = 64, 16, 4

    def bn(c: int) -> tuple[np.ndarray, np.ndarray]:
        scale = (1 + 0.1 * rng.standard_normal((c, 1, 1))).astype(F32)
        return scale, (0.1 * rng.standard_normal((c, 1, 1))).astype(F32)

    def w(o: int, c: int, k: int) -> np.ndarray:
        return (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(F32)

    stem, stem_bn = w(ch, 3, 3), bn(ch)
    params = [[(w(mid, ch, 1), *bn(mid)), (w(mid, mid, 3), *bn(mid)), (w(ch, mid, 1), *bn(ch))]
              for _ in range(blocks)]
    b = opgraph.GraphBuilder()
    x = b.input((F32, (batch, 3, side, side)), name="x")

    def conv(h: Any, k: np.ndarray) -> Any:
        return b.conv2d(h, b.const(k), padding=k.shape[-1] // 2)

    h = b.relu(_bn(b, conv(x, stem), *stem_bn))
    for blk in params:
        y = h
        for i, (k, s, t) in enumerate(blk):
            y = _bn(b, conv(y, k), s, t)
            if i < 2:
                y = b.relu(y)
        h = b.relu(b.add(y, h))
    b.output(b.mean(h, axis=(2, 3)))
    feeds = {"x": rng.standard_normal((batch, 3, side, side)).astype(F32)}

    def eager(f: dict[str, np.ndarray]) -> list[np.ndarray]:
        h = np.maximum(_conv_eager(f["x"], stem) * stem_bn[0] + stem_bn[1], 0)
        for blk in params:
            y = h
            for i, (k, s, t) in enumerate(blk):
                y = _conv_eager(y, k) * s + t
                if i < 2:
                    y = np.maximum(y, 0)
            h = np.maximum(y + h, 0)
        return [h.mean(axis=(2, 3))]

    return b.freeze(), feeds, eager


def inception(scale: float = 1.0) -> Model:
    """Inception-style block: 1x1, 1x1->3x3, 1x1->3x3->3x3 and pool->1x1 branches, concatenated; twice."""
    rng = _rng()
    batch, side, cin = max(1, int(32 * scale)), max(4, int(32 * min(1.0, scale * 4))), 32

    def w(o: int, c: int, k: int) -> np.ndarray:
        return (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(F32)

    specs = []
    c = cin
    for _ in range(2):
        specs.append({"b1": w(16, c, 1), "b2a": w(16, c, 1), "b2b": w(24, 16, 3), "b3a": w(8, c, 1),
                      "b3b": w(12, 8, 3), "b3c": w(12, 12, 3), "b4": w(12, c, 1)})
        c = 16 + 24 + 12 + 12
    b = opgraph.GraphBuilder()
    x = b.input((F32, (batch, cin, side, side)), name="x")

    def conv(h: Any, k: np.ndarray) -> Any:
        return b.relu(b.conv2d(h, b.const(k), padding=k.shape[-1] // 2))

    h = x
    for s in specs:
        p1 = conv(h, s["b1"])
        p2 = conv(conv(h, s["b2a"]), s["b2b"])
        p3 = conv(conv(conv(h, s["b3a"]), s["b3b"]), s["b3c"])
        p4 = conv(b.avg_pool2d(h, kernel_size=3, stride=1, padding=1), s["b4"])
        h = b.concat(p1, p2, p3, p4, axis=1)
    b.output(b.mean(h, axis=(2, 3)))
    feeds = {"x": rng.standard_normal((batch, cin, side, side)).astype(F32)}

    def econv(h: np.ndarray, k: np.ndarray) -> np.ndarray:
        return np.maximum(_conv_eager(h, k), 0)

    def pool(h: np.ndarray) -> np.ndarray:
        return _kernel("avg_pool2d")(h, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1, 1, 1),
                                     count_include_pad=True)

    def eager(f: dict[str, np.ndarray]) -> list[np.ndarray]:
        h = f["x"]
        for s in specs:
            p1 = econv(h, s["b1"])
            p2 = econv(econv(h, s["b2a"]), s["b2b"])
            p3 = econv(econv(econv(h, s["b3a"]), s["b3b"]), s["b3c"])
            p4 = econv(pool(h), s["b4"])
            h = np.concatenate([p1, p2, p3, p4], axis=1)
        return [h.mean(axis=(2, 3))]

    return b.freeze(), feeds, eager


def mlp_train(scale: float = 1.0) -> Model:
    """One SGD training step of the 784-512-512-10 MLP (batch 128): softmax cross-entropy, gradients by
    opgraph.autodiff, parameters carried by update edges; eager is the usual hand-written NumPy backprop."""
    from opgraph.autodiff import build_grad_ops

    rng = _rng()
    batch, hidden = max(2, int(128 * scale)), max(4, int(512 * scale))
    sizes = [784 if scale >= 1 else max(8, int(784 * scale)), hidden, hidden, 10]
    lr = 0.01
    init = {}
    for i, (a, c) in enumerate(itertools.pairwise(sizes)):
        init[f"W{i}"] = (rng.standard_normal((a, c)) / np.sqrt(a)).astype(F32)
        init[f"b{i}"] = np.zeros(c, F32)
    b = opgraph.GraphBuilder()
    x = b.input((F32, (batch, sizes[0])), name="x")
    y = b.input((F32, (batch, 10)), name="y")
    params = {k: b.input((F32, v.shape), name=k) for k, v in init.items()}
    h = x
    for i in range(3):
        h = b.add(b.matmul(h, params[f"W{i}"]), params[f"b{i}"])
        if i < 2:
            h = b.relu(h)
    loss = b.divide(b.negative(b.sum(b.multiply(y, b.log_softmax(h, axis=-1)))), float(batch))
    grads = build_grad_ops(b, loss, list(params.values()))
    for (_k, p), g in zip(params.items(), grads, strict=True):
        b.update(b.subtract(p, b.multiply(g, lr)), p)
    b.output(loss)
    labels = rng.integers(0, 10, batch)
    feeds = {"x": rng.standard_normal((batch, sizes[0])).astype(F32), "y": np.eye(10, dtype=F32)[labels], **init}
    state = {k: v.copy() for k, v in init.items()}

    def eager(f: dict[str, np.ndarray]) -> list[np.ndarray]:
        for k in init:  # a feed of the parameters restarts from them (as the graph's feed does)
            if k in f:
                state[k][...] = f[k]
        xs, ys = f["x"], f["y"]
        acts, pre = [xs], []
        h = xs
        for i in range(3):
            z = h @ state[f"W{i}"] + state[f"b{i}"]
            pre.append(z)
            h = np.maximum(z, 0) if i < 2 else z
            acts.append(h)
        z = h - h.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        loss = -(ys * logp).sum() / batch
        dz = (np.exp(logp) - ys) / batch
        for i in (2, 1, 0):
            dW, db = acts[i].T @ dz, dz.sum(axis=0)
            if i:
                dz = (dz @ state[f"W{i}"].T) * (pre[i - 1] > 0)
            state[f"W{i}"] -= lr * dW
            state[f"b{i}"] -= lr * db
        return [np.asarray(loss, dtype=F32)]

    return b.freeze(), feeds, eager


CHAIN = ["sin", "exp", "tanh", "square", "negative", "exp", "sqrt", "cos", "abs", "log1p",
         "sin", "square", "tanh", "exp", "negative", "exp", "sqrt", "cos", "abs", "log1p"]


def chain(scale: float = 1.0) -> Model:
    """A 20-op elementwise chain on 4M float32 values."""
    n = max(16, int(4 * 1024 * 1024 * scale))
    b = opgraph.GraphBuilder()
    x = b.input((F32, (n,)), name="x")
    h = x
    for name in CHAIN:
        h = b.op(name, h)
    b.output(h)
    feeds = {"x": _rng().standard_normal(n).astype(F32)}
    fns = {"negative": np.negative, "abs": np.abs, "asin": np.arcsin}

    def eager(f: dict[str, np.ndarray]) -> list[np.ndarray]:
        h = f["x"]
        for name in CHAIN:
            h = fns.get(name, getattr(np, name, None))(h)  # type: ignore[misc]
        return [h]

    return b.freeze(), feeds, eager


MODELS: dict[str, Callable[[float], Model]] = {"mlp": mlp, "mlp_train": mlp_train, "resnet": resnet,
                                               "inception": inception, "chain": chain}


def build(name: str, scale: float = 1.0) -> Model:
    """The graph, feeds and eager function of model ``name``."""
    return MODELS[name](scale)
