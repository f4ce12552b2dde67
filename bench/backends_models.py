"""Real architectures built in PyTorch, exported to ONNX, run by opgraph (``backend="auto"`` or the numpy
engine) or ONNX Runtime.

    python bench/backends_models.py --model MODEL --lib export|torch|opgraph-auto|opgraph-numpy|onnxruntime
        [--level N]

``--lib torch`` times PyTorch eager again in a process of its own (the same model: seed 0; the saved
inputs). ``--lib export`` builds the model with random weights (no downloads), exports it with
``torch.onnx.export(..., dynamo=False)`` at batch 1 with static shapes, and saves the ONNX file, the
inputs and PyTorch's output in a cache directory (``$OPGRAPH_BENCH_CACHE``, default a folder in the
system temp dir); it also times PyTorch eager on the same inputs. The others read that file:
``opgraph-auto`` imports it with ``opgraph.io.onnx.from_onnx`` and compiles it with ``backend="auto"``
(which times every installed backend on the inputs and keeps the fastest), ``opgraph-numpy`` compiles it
with ``backend="numpy"`` (after ``opgraph.optimize(graph, level=N)`` when ``--level`` is given; the JSON
then also has the optimisation seconds and the op counts), ``onnxruntime`` runs it in
a plain ``InferenceSession`` with one intra/inter-op thread. Each prints one JSON line: the median
seconds of ``--repeat`` calls after a warm-up, the preparation time (import + choice, or session
creation), peak RSS in MiB and the largest difference from PyTorch's output.

Models: ResNet-18 (torchvision's architecture, written out in plain torch: torchvision does not import
here), 224x224; with the ``transformers`` package, a small BERT (4 layers, hidden 256, 4 heads) and a
small GPT-2 (4 layers, 256, 4 heads) from configs with random weights, sequence 128; without it, a
hand-written transformer encoder block (``encoder``: 4 layers of the same size) stands in.
MobileNetV3-Small/Large and EfficientNet-B0 are torchvision's architectures written out in
bench/cnn_archs.py; ViT-B/16, ConvNeXt-T and Swin-T are ``transformers`` models (ViTModel,
ConvNextModel, SwinModel) from their default configs (which are those sizes) with random weights; all
224x224, batch 1.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

import argparse
import json
import resource
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

MODELS = ("resnet18", "bert", "gpt2", "encoder", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0",
          "vit_b16", "convnext_t", "swin_t")
TORCH_NATIVE = ("resnet18", "encoder", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0")
"""Models called with positional tensors (the others are transformers models, called with keywords)."""
IMAGE_MODELS = ("resnet18", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0", "vit_b16",
                "convnext_t", "swin_t")
SEQ, HIDDEN, LAYERS, HEADS, VOCAB = 128, 256, 4, 4, 8192
AUTO_BUDGET = 30.0  # seconds opgraph's auto may spend timing the candidates


def cache_dir() -> Path:
    path = Path(os.environ.get("OPGRAPH_BENCH_CACHE", Path(tempfile.gettempdir()) / "opgraph-bench-models"))
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------- models (PyTorch)
def resnet18() -> Any:
    """torchvision.models.resnet18 (BasicBlock, [2, 2, 2, 2], 1000 classes) with torchvision's initialisation."""
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class ResNet18(nn.Module):
        def __init__(self, num_classes: int = 1000) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            widths, cin, layers = (64, 128, 256, 512), 64, []
            for i, w in enumerate(widths):
                layers.append(nn.Sequential(BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)))
                cin = w
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)

        def forward(self, x: Any) -> Any:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return ResNet18()


def encoder() -> Any:
    """A hand-written post-norm transformer encoder (BERT's layer) in plain torch: LAYERS x (attention + MLP)."""
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
            self.proj = nn.Linear(HIDDEN, HIDDEN)
            self.ln1 = nn.LayerNorm(HIDDEN)
            self.fc1 = nn.Linear(HIDDEN, 4 * HIDDEN)
            self.fc2 = nn.Linear(4 * HIDDEN, HIDDEN)
            self.ln2 = nn.LayerNorm(HIDDEN)

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(x).reshape(b, s, 3, HEADS, HIDDEN // HEADS).permute(2, 0, 3, 1, 4)
            att = torch.softmax(q @ k.transpose(-1, -2) / (HIDDEN // HEADS) ** 0.5, dim=-1)
            x = self.ln1(x + self.proj((att @ v).transpose(1, 2).reshape(b, s, HIDDEN)))
            return self.ln2(x + self.fc2(torch.nn.functional.gelu(self.fc1(x))))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, HIDDEN)
            self.pos = nn.Parameter(torch.randn(1, SEQ, HIDDEN) * 0.02)
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))

        def forward(self, ids: Any) -> Any:
            x = self.embed(ids) + self.pos
            for layer in self.layers:
                x = layer(x)
            return x

    return Encoder()


def bert() -> Any:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     intermediate_size=4 * HIDDEN, max_position_embeddings=512, attn_implementation="eager")
    return BertModel(cfg, add_pooling_layer=False)


def gpt2() -> Any:
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(vocab_size=VOCAB, n_positions=512, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                     bos_token_id=0, eos_token_id=0, attn_implementation="eager", use_cache=False)
    return GPT2Model(cfg)


def vit_b16() -> Any:
    """ViT-B/16 at 224x224 (ViTConfig's defaults: 12 layers, hidden 768, 12 heads, patch 16)."""
    from transformers import ViTConfig, ViTModel

    return ViTModel(ViTConfig(attn_implementation="eager"), add_pooling_layer=False)


def convnext_t() -> Any:
    """ConvNeXt-T (ConvNextConfig's defaults: depths 3-3-9-3, widths 96-192-384-768)."""
    from transformers import ConvNextConfig, ConvNextModel

    return ConvNextModel(ConvNextConfig())


def swin_t() -> Any:
    """Swin-T at 224x224 (SwinConfig's defaults: embed 96, depths 2-2-6-2, heads 3-6-12-24, window 7)."""
    from transformers import SwinConfig, SwinModel

    return SwinModel(SwinConfig(attn_implementation="eager"), add_pooling_layer=False)


def factory(name: str) -> Callable[[], Any]:
    """The function building model ``name`` (random weights)."""
    if name in ("mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0"):
        import cnn_archs

        return getattr(cnn_archs, name)  # type: ignore[no-any-return]
    return {"resnet18": resnet18, "bert": bert, "gpt2": gpt2, "encoder": encoder, "vit_b16": vit_b16,
            "convnext_t": convnext_t, "swin_t": swin_t}[name]


def build(name: str) -> tuple[Any, dict[str, Any]]:
    """Model ``name`` (seed 0, eval mode) wrapped to return one tensor, and its inputs (torch tensors)."""
    import torch

    torch.manual_seed(0)
    model = factory(name)().eval()
    if name in TORCH_NATIVE and name in IMAGE_MODELS:
        inputs = {"x": torch.randn(1, 3, 224, 224)}
    elif name in IMAGE_MODELS:
        inputs = {"pixel_values": torch.randn(1, 3, 224, 224)}
    else:
        inputs = {"input_ids": torch.randint(0, VOCAB, (1, SEQ))}
        if name in ("bert", "gpt2"):
            inputs["attention_mask"] = torch.ones(1, SEQ, dtype=torch.int64)

    class Wrapped(torch.nn.Module):  # one tensor out (the last hidden state for the transformers models)
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            if name in TORCH_NATIVE:
                out = self.model(*args)
            else:
                out = self.model(**dict(zip(inputs, args, strict=True)))
            return out if isinstance(out, torch.Tensor) else out[0]

    return Wrapped().eval(), inputs


def export(name: str, repeat: int) -> dict[str, Any]:
    """Build ``name``, export it and its inputs and output to the cache; time PyTorch eager on the same inputs."""
    import torch

    wrapped, inputs = build(name)
    model = wrapped.model
    args = tuple(inputs.values())
    with torch.inference_mode():
        ref = wrapped(*args)
    path = cache_dir() / f"{name}.onnx"
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # the TorchScript exporter is deprecated (the dynamo one needs onnxscript)
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, args, str(path), input_names=list(inputs), output_names=["out"],
                          opset_version=18, dynamo=False)
    export_s = time.perf_counter() - t0
    np.savez(cache_dir() / f"{name}.npz", **{k: v.numpy() for k, v in inputs.items()}, __ref__=ref.numpy())

    def call() -> Any:
        with torch.inference_mode():
            return wrapped(*args).numpy()

    median, _ = timed(call, repeat)
    return {"export": export_s, "torch": median, "onnx_mb": path.stat().st_size / 2**20,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6}


def timed(call: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median seconds of ``repeat`` calls after one warm-up call, and the last result."""
    out = call()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=MODELS)
    ap.add_argument("--lib", required=True,
                    choices=("export", "torch", "opgraph-auto", "opgraph-numpy", "onnxruntime"))
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--level", type=int, default=None, help="opgraph-numpy: opgraph.optimize at this level first")
    args = ap.parse_args()
    if args.repeat < 5:
        ap.error("--repeat must be at least 5")
    if args.lib not in ("onnxruntime", "opgraph-numpy"):  # the numpy engine's process does not load torch
        try:
            import torch
        except ImportError:
            if args.lib == "export":
                raise
        else:
            torch.set_num_threads(1)
            torch.set_num_interop_threads(1)
    if args.lib == "export":
        result = export(args.model, args.repeat)
    elif args.lib == "torch":  # eager again, in a process of its own (after an export)
        wrapped, _ = build(args.model)
        saved = np.load(cache_dir() / f"{args.model}.npz")
        tensors = tuple(torch.from_numpy(saved[k]) for k in saved.files if k != "__ref__")

        def eager() -> Any:
            with torch.inference_mode():
                return wrapped(*tensors).numpy()

        median, out = timed(eager, args.repeat)
        result = {"run": median, "max_error": float(np.max(np.abs(out.astype(np.float64) - saved["__ref__"])))}
    else:
        path = cache_dir() / f"{args.model}.onnx"
        saved = np.load(cache_dir() / f"{args.model}.npz")
        feeds = {k: saved[k] for k in saved.files if k != "__ref__"}
        t0 = time.perf_counter()
        result = {}
        if args.lib == "onnxruntime":
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = opts.inter_op_num_threads = 1
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

            def call() -> Any:
                return sess.run(None, feeds)[0]
        else:
            import opgraph
            from opgraph.io.onnx import from_onnx

            graph = from_onnx(str(path))
            result["import"] = time.perf_counter() - t0
            if args.lib == "opgraph-numpy":
                result["ops"] = graph.num_ops
                if args.level is not None:
                    t1 = time.perf_counter()
                    graph = opgraph.optimize(graph, level=args.level)
                    result.update(optimize=time.perf_counter() - t1, ops_optimized=graph.num_ops)
                t1 = time.perf_counter()
                fn = opgraph.compile(graph, backend="numpy")
                result["compile"] = time.perf_counter() - t1
            else:
                fn = opgraph.compile(graph, backend="auto", example_inputs=feeds, budget=AUTO_BUDGET)
                result.update(choice=fn.choice.backend, timings=fn.choice.timings, failures=fn.choice.failures)

            def call() -> Any:
                return fn(feeds)[0]
        result["prepare"] = time.perf_counter() - t0
        median, out = timed(call, args.repeat)
        ref = saved["__ref__"]
        result.update(run=median, max_error=float(np.max(np.abs(np.asarray(out, np.float64) - ref))),
                      ref_scale=float(np.max(np.abs(ref))))
    result["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


if __name__ == "__main__":
    main()
