"""A ResNet-style CNN with batch norm in inference form: opgraph's ONNX export against torch's, both in onnxruntime.

    python bench/cnn_batchnorm.py [--json] [--calls 25] [--blocks 8] [--batch 2] [--channels 8] [--size 64]

The network: a 3x3 stem conv (3 -> C channels), batch norm, relu, then four basic residual blocks (conv, batch norm,
relu, conv, batch norm, + the block's input, relu): 9 convs, 9 batch norms, 4 residual adds, on a (batch, 3, size,
size) float32 image. opgraph's is written with ``opgraph.numpy`` and ``opgraph.nn.conv2d``, the batch norm as
``(y - mean) / sqrt(var + eps) * gamma + beta``, optimised with ``optimize(level=2)`` and exported with
``opgraph.io.onnx.to_onnx``; torch's is ``nn.Conv2d(bias=False)`` + ``nn.BatchNorm2d`` in eval mode with the same
weights and statistics, exported with ``torch.onnx.export`` (the dynamo exporter, opset 18). Each model runs in
onnxruntime (all graph optimisations, 1 intra-op and 1 inter-op thread) in its own process; the parent alternates
blocks of ``--calls`` timed calls between the two processes (after a warm-up of the same size), ``--blocks`` times
each, and reports each library's median over all its calls, and the median over the pairs of neighbouring blocks of
their medians' ratio (steadier on a loaded machine). The outputs of both models are compared (they compute
the same network). Node counts are the exported models' (and, after "ort", what onnxruntime runs after its own
fusions). ``--json``: one JSON line per library.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

THREADS = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")}
EPS = 1e-5
N_BLOCKS = 4


def weights(channels: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Per conv: its weight and its batch norm's mean, var, gamma, beta (float32; statistics of scale 1)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(1 + 2 * N_BLOCKS):
        cin = 3 if i == 0 else channels
        w = rng.standard_normal((channels, cin, 3, 3)) * np.sqrt(2.0 / (cin * 9))
        out.append({"w": w.astype(np.float32),
                    "mean": (0.1 * rng.standard_normal(channels)).astype(np.float32),
                    "var": (0.5 + rng.random(channels)).astype(np.float32),
                    "gamma": (0.5 + 0.5 * rng.random(channels)).astype(np.float32),
                    "beta": (0.1 * rng.standard_normal(channels)).astype(np.float32)})
    return out


def opgraph_model(args: argparse.Namespace) -> bytes:
    import opgraph.nn as nn
    import opgraph.numpy as onp
    from opgraph.frontend.lazy import placeholder
    from opgraph.io.onnx import to_onnx
    from opgraph.passes import optimize

    params = weights(args.channels)

    def conv_bn(h: Any, p: dict[str, np.ndarray]) -> Any:
        y = nn.conv2d(h, onp.asarray(p["w"]), padding=(1, 1))
        mean, var, gamma, beta = (p[k].reshape(1, -1, 1, 1) for k in ("mean", "var", "gamma", "beta"))
        return (y - mean) / onp.sqrt(var + np.float32(EPS)) * gamma + beta

    x = placeholder((args.batch, 3, args.size, args.size), np.float32, name="x")
    h = nn.relu(conv_bn(x, params[0]))
    for b in range(N_BLOCKS):
        r = nn.relu(conv_bn(h, params[1 + 2 * b]))
        h = nn.relu(conv_bn(r, params[2 + 2 * b]) + h)
    graph = optimize(h.graph, level=2)
    return to_onnx(graph).SerializeToString()  # type: ignore[no-any-return]


def torch_model(args: argparse.Namespace) -> bytes:
    import torch
    from torch import nn

    params = weights(args.channels)

    def conv_bn(p: dict[str, np.ndarray]) -> nn.Sequential:
        conv = nn.Conv2d(p["w"].shape[1], args.channels, 3, padding=1, bias=False)
        bn = nn.BatchNorm2d(args.channels, eps=EPS)
        with torch.no_grad():
            conv.weight.copy_(torch.from_numpy(p["w"]))
            bn.running_mean.copy_(torch.from_numpy(p["mean"]))
            bn.running_var.copy_(torch.from_numpy(p["var"]))
            bn.weight.copy_(torch.from_numpy(p["gamma"]))
            bn.bias.copy_(torch.from_numpy(p["beta"]))
        return nn.Sequential(conv, bn)

    class Block(nn.Module):
        def __init__(self, a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
            super().__init__()
            self.one, self.two = conv_bn(a), conv_bn(b)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.two(torch.relu(self.one(x))) + x)

    model = nn.Sequential(conv_bn(params[0]), nn.ReLU(),
                          *(Block(params[1 + 2 * b], params[2 + 2 * b]) for b in range(N_BLOCKS))).eval()
    x = torch.zeros(args.batch, 3, args.size, args.size)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cnn.onnx"
        torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["y"], dynamo=True,
                          opset_version=18, external_data=False, verbose=False)
        return path.read_bytes()


def child(args: argparse.Namespace) -> None:
    """Build one library's model, then answer the parent: a line "run" times ``--calls`` calls."""
    import warnings

    warnings.simplefilter("ignore")  # the exporters' deprecation notices would mix with the answers on stderr
    import onnx
    import onnxruntime as ort

    data = opgraph_model(args) if args.lib == "opgraph" else torch_model(args)
    model = onnx.load_from_string(data)
    nodes = Counter(n.op_type for n in model.graph.node)

    def options() -> Any:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3  # not the warning that the saved optimised model is machine-specific
        return so

    with tempfile.TemporaryDirectory() as d:
        so = options()
        so.optimized_model_filepath = str(Path(d) / "opt.onnx")
        ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        ort_nodes = Counter(n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node)
    sess = ort.InferenceSession(data, options(), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    x = np.random.default_rng(1).standard_normal((args.batch, 3, args.size, args.size)).astype(np.float32)
    feeds = {name: x}
    out = sess.run(None, feeds)[0]
    print(json.dumps({"nodes": dict(sorted(nodes.items())), "ort_nodes": dict(sorted(ort_nodes.items())),
                      "out": out.ravel().tolist()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        times = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            times.append(time.perf_counter() - t0)
        print(json.dumps(times), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON line per library")
    ap.add_argument("--calls", type=int, default=25, help="timed calls per block (at least 20)")
    ap.add_argument("--blocks", type=int, default=8, help="blocks per library, interleaved")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--channels", type=int, default=8)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--lib", choices=("opgraph", "torch"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.calls < 20:
        ap.error("--calls must be at least 20")
    if args.lib:
        child(args)
        return
    libs = ("opgraph", "torch")
    env = {**os.environ, **THREADS}
    cmd = [sys.executable, __file__, "--calls", str(args.calls), "--batch", str(args.batch), "--channels",
           str(args.channels), "--size", str(args.size)]
    procs = {lib: subprocess.Popen([*cmd, "--lib", lib], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   env=env) for lib in libs}
    info = {}
    for lib, p in procs.items():
        line = p.stdout.readline()  # type: ignore[union-attr]
        if not line:
            p.wait()
            sys.exit(f"{lib}: the child process failed (exit {p.returncode})")
        info[lib] = json.loads(line)
    a, b = (np.asarray(info[lib].pop("out"), dtype=np.float32) for lib in libs)
    max_err = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
    if max_err > 1e-4:
        sys.exit(f"the two models disagree: max relative difference {max_err:.2e}")
    times: dict[str, list[float]] = {lib: [] for lib in libs}
    block_ms: dict[str, list[float]] = {lib: [] for lib in libs}
    for block in range(args.blocks + 1):  # block 0 warms up
        for lib in libs if block % 2 else libs[::-1]:
            p = procs[lib]
            p.stdin.write("run\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
            t = json.loads(p.stdout.readline())  # type: ignore[union-attr]
            if block:
                times[lib] += t
                block_ms[lib].append(1e3 * statistics.median(t))
    for p in procs.values():
        p.stdin.close()  # type: ignore[union-attr]
        p.wait()
    ms = {lib: 1e3 * statistics.median(times[lib]) for lib in libs}
    # the median of the blocks' ratios: each pair of neighbouring blocks saw the same load on the machine
    ratio = statistics.median(a / b for a, b in zip(block_ms["opgraph"], block_ms["torch"], strict=True))
    rows = []
    for lib in libs:
        rows.append({"library": lib, "median_ms": round(ms[lib], 4), "calls": len(times[lib]),
                     "ratio_to_torch_export": round(ms[lib] / ms["torch"], 3),
                     "block_ratio_to_torch_export": round(ratio, 3) if lib == "opgraph" else 1.0,
                     "nodes": info[lib]["nodes"],
                     "ort_nodes": info[lib]["ort_nodes"], "max_rel_diff": max_err,
                     "shape": [args.batch, 3, args.size, args.size], "channels": args.channels})
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"ResNet-style CNN, 9 conv + batch norm, input {args.batch}x3x{args.size}x{args.size}, {args.channels} "
          f"channels; onnxruntime, 1 thread; median of {len(times['torch'])} calls per model")
    print(f"{'export':<10}{'ms':>10}{'ratio':>8}  nodes (exported; onnxruntime runs)")
    for r in rows:
        nodes = ", ".join(f"{n} {k}" for k, n in r["nodes"].items())
        ort_nodes = ", ".join(f"{n} {k}" for k, n in r["ort_nodes"].items())
        print(f"{r['library']:<10}{r['median_ms']:>10.3f}{r['ratio_to_torch_export']:>8.2f}  {nodes}; {ort_nodes}")
    print(f"opgraph / torch: {ms['opgraph'] / ms['torch']:.2f}x (medians of all calls), {ratio:.2f}x (median of the "
          f"{args.blocks} paired blocks' ratios); outputs agree to {max_err:.1e} (relative)")


if __name__ == "__main__":
    main()
