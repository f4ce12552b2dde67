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

The ``tv_*`` models are torchvision's own constructors (``torchvision.models.<name>(weights=None)``: random
weights, seed 0, no downloads; batch-norm statistics calibrated on random images as in bench/cnn_archs.py):
tv_resnet18, tv_shufflenet_v2_x1_0, tv_regnet_y_400mf, tv_efficientnet_b0, tv_swin_t, tv_squeezenet1_1,
tv_convnext_tiny, tv_mobilenet_v3_small, tv_vit_b_16, tv_densenet121. The torchvision wheel on the registry
is built for a newer (CUDA) torch; it is installed with ``--no-deps`` and its ``_meta_registrations`` module
(fake-tensor kernels for its custom ops, which these models do not use) is replaced by an empty module before
anything imports torchvision (:func:`stub_torchvision_meta`).

Options of the architectures table (bench/table_backends_models.py): ``--dynamo`` exports with
``torch.onnx.export(dynamo=True)`` (falling back to ``dynamo=False`` where the dynamo exporter fails; the
JSON says which one wrote the file) to ``<model>.dynamo.onnx``; ``--reuse`` keeps an export already in the cache
(the same torch and model code write the same file); ``--threads N`` sets torch's thread count and
ONNX Runtime's intra/inter-op threads (the caller sets the BLAS/OpenMP variables to the same N); ``--blocks B``
times B blocks of consecutive calls after two warm-up calls, as many calls per block as fill about
``--block-seconds`` (at least one), and reports every block's median (``blocks``) and their median (``run``).
With ``--dynamo``, ``opgraph-auto`` is the user's path: ``opgraph.load`` + ``opgraph.optimize(level=2)`` +
``opgraph.compile(graph, backend="auto")`` (default budget) + the first call, timed together (``first_call``);
it then exports the optimised graph with ``opgraph.io.onnx.to_onnx`` and reports whether
``onnx.checker.check_model(full_check=True)`` accepts it (``export_check``).
"""

from __future__ import annotations

import os

if os.environ.get("OMP_NUM_THREADS", "1") == "1":  # one thread for XLA as for every other library
    os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

import argparse
import contextlib
import json
import resource
import statistics
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

TORCHVISION = ("tv_resnet18", "tv_shufflenet_v2_x1_0", "tv_regnet_y_400mf", "tv_efficientnet_b0", "tv_swin_t",
               "tv_squeezenet1_1", "tv_convnext_tiny", "tv_mobilenet_v3_small", "tv_vit_b_16", "tv_densenet121")
"""torchvision's constructors, named ``tv_`` + torchvision's function name."""
MODELS = ("resnet18", "bert", "gpt2", "encoder", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0",
          "vit_b16", "convnext_t", "swin_t", *TORCHVISION)
TORCH_NATIVE = ("resnet18", "encoder", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0", *TORCHVISION)
"""Models called with positional tensors (the others are transformers models, called with keywords)."""
IMAGE_MODELS = ("resnet18", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0", "vit_b16",
                "convnext_t", "swin_t", *TORCHVISION)
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


def stub_torchvision_meta() -> None:
    """Replace ``torchvision._meta_registrations`` by an empty module before torchvision is first imported.

    The registry's torchvision wheel is a CUDA build for a newer torch: its meta registrations (fake-tensor
    kernels of torchvision's own ops such as ``nms``, which no classification model calls) fail against the CPU
    torch here, and nothing else in the models needs them. Done in every process: transformers and
    ``torch.onnx.export(dynamo=True)`` import torchvision too where it is installed.
    """
    if "torchvision" not in sys.modules:
        sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))


def torchvision_models() -> Any:
    """``torchvision.models`` (after :func:`stub_torchvision_meta`)."""
    stub_torchvision_meta()
    import torchvision.models

    return torchvision.models


def torchvision_model(name: str) -> Any:
    """torchvision's ``name`` (without the ``tv_`` prefix) with random weights, batch norms calibrated."""
    import cnn_archs
    from torch import nn

    model = getattr(torchvision_models(), name)(weights=None)
    if name.startswith("vit_"):  # torchvision zeroes the classifier head: every output would be 0, any error hidden
        nn.init.normal_(model.heads.head.weight, std=0.02)
    if any(isinstance(m, nn.BatchNorm2d) for m in model.modules()):
        cnn_archs.calibrate_batch_norm(model)
    return model.eval()


def factory(name: str) -> Callable[[], Any]:
    """The function building model ``name`` (random weights)."""
    if name in TORCHVISION:
        return lambda: torchvision_model(name[len("tv_"):])
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


def stem(name: str, dynamo: bool) -> str:
    """The cache file name of model ``name`` without its suffix (``.onnx``, ``.npz``)."""
    return f"{name}.dynamo" if dynamo else name


def export(name: str, repeat: int, dynamo: bool = False) -> dict[str, Any]:
    """Build ``name``, export it and its inputs and output to the cache; time PyTorch eager on the same inputs.

    ``dynamo``: ``torch.onnx.export(dynamo=True)`` at the exporter's own opset, falling back to the TorchScript
    exporter (``dynamo=False``, opset 18) where it raises; ``exporter`` in the result says which wrote the file.
    """
    import torch

    wrapped, inputs = build(name)
    model = wrapped.model
    args = tuple(inputs.values())
    with torch.inference_mode():
        ref = wrapped(*args)
    path = cache_dir() / f"{stem(name, dynamo)}.onnx"
    for old in (path, path.with_name(path.name + ".data")):  # a stale weights file would be read with a new model
        old.unlink(missing_ok=True)
    t0 = time.perf_counter()
    exporter = "torchscript"
    with warnings.catch_warnings():  # the TorchScript exporter is deprecated
        warnings.simplefilter("ignore")
        if dynamo:
            try:
                with contextlib.redirect_stdout(sys.stderr):  # its progress lines would hide the JSON line
                    torch.onnx.export(wrapped, args, str(path), input_names=list(inputs), output_names=["out"],
                                      dynamo=True)
                exporter = "dynamo"
            except Exception as e:  # any failure of the new exporter: the old one is the fallback
                exporter = f"torchscript (dynamo failed: {type(e).__name__}: {str(e).splitlines()[0][:200]})"
        if exporter.startswith("torchscript"):
            torch.onnx.export(wrapped, args, str(path), input_names=list(inputs), output_names=["out"],
                              opset_version=18, dynamo=False)
    export_s = time.perf_counter() - t0
    np.savez(cache_dir() / f"{stem(name, dynamo)}.npz", **{k: v.numpy() for k, v in inputs.items()},
             __ref__=ref.numpy())

    def call() -> Any:
        with torch.inference_mode():
            return wrapped(*args).numpy()

    median, _ = timed(call, repeat)
    data = path.with_name(path.name + ".data")  # the dynamo exporter writes the weights beside the model
    size = path.stat().st_size + (data.stat().st_size if data.exists() else 0)
    return {"export": export_s, "torch": median, "onnx_mb": size / 2**20, "exporter": exporter,
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


def timed_blocks(call: Callable[[], Any], blocks: int, block_seconds: float) -> tuple[list[float], int, Any]:
    """The median seconds of each of ``blocks`` blocks of consecutive calls after one more warm-up call, the
    calls per block (as many as fill about ``block_seconds``, from the warm-up call's time; at least one) and the
    last result. Small models get hundreds of calls per block: one call's time moves with the machine's load."""
    t = time.perf_counter()
    out = call()
    per_block = max(1, min(1000, int(block_seconds / max(time.perf_counter() - t, 1e-6))))
    medians = []
    for _ in range(blocks):
        times = []
        for _ in range(per_block):
            t = time.perf_counter()
            out = call()
            times.append(time.perf_counter() - t)
        medians.append(statistics.median(times))
    return medians, per_block, out


def export_check(graph: Any) -> str:
    """``"ok"`` when opgraph's ONNX export of ``graph`` passes ``onnx.checker.check_model(full_check=True)``,
    else the first line of what failed (the export or the check)."""
    import onnx

    from opgraph.io.onnx import to_onnx

    try:
        model = to_onnx(graph)
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # the table reports any failure, whichever library raised it
        return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return "ok"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=MODELS)
    ap.add_argument("--lib", required=True,
                    choices=("export", "torch", "opgraph-auto", "opgraph-numpy", "onnxruntime"))
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--level", type=int, default=None, help="opgraph-numpy: opgraph.optimize at this level first")
    ap.add_argument("--dynamo", action="store_true", help="the dynamo exporter's file (see the module docstring)")
    ap.add_argument("--threads", type=int, default=1, help="torch's and ONNX Runtime's threads")
    ap.add_argument("--blocks", type=int, default=0, help="time this many blocks of calls (0: --repeat calls)")
    ap.add_argument("--block-seconds", type=float, default=0.2)
    ap.add_argument("--reuse", action="store_true", help="export: keep the cached export of an earlier run")
    args = ap.parse_args()
    if args.repeat < 5:
        ap.error("--repeat must be at least 5")
    if 0 < args.blocks < 5:
        ap.error("--blocks must be at least 5 (or 0)")
    stub_torchvision_meta()
    if args.lib not in ("onnxruntime", "opgraph-numpy"):  # the numpy engine's process does not load torch
        try:
            import torch
        except ImportError:
            if args.lib == "export":
                raise
        else:
            torch.set_num_threads(args.threads)
            torch.set_num_interop_threads(1)
    name = stem(args.model, args.dynamo)
    result: dict[str, Any] = {"threads": args.threads}

    def measure(call: Callable[[], Any]) -> Any:
        if args.blocks:
            medians, per_block, out = timed_blocks(call, args.blocks, args.block_seconds)
            result.update(run=statistics.median(medians), blocks=medians, calls_per_block=per_block)
        else:
            result["run"], out = timed(call, args.repeat)
        return out

    if args.lib == "export":
        record = cache_dir() / f"{name}.json"
        files = [cache_dir() / f"{name}.onnx", cache_dir() / f"{name}.npz", record]
        if args.reuse and all(f.exists() for f in files):  # an earlier export of the same model
            result.update(json.loads(record.read_text()), reused=True)
        else:
            result.update(export(args.model, args.repeat, args.dynamo))
            record.write_text(json.dumps(result))
    elif args.lib == "torch":  # eager again, in a process of its own (after an export)
        wrapped, _ = build(args.model)
        saved = np.load(cache_dir() / f"{name}.npz")
        tensors = tuple(torch.from_numpy(saved[k]) for k in saved.files if k != "__ref__")

        def eager() -> Any:
            with torch.inference_mode():
                return wrapped(*tensors).numpy()

        out = measure(eager)
        result["max_error"] = float(np.max(np.abs(out.astype(np.float64) - saved["__ref__"])))
    else:
        path = cache_dir() / f"{name}.onnx"
        saved = np.load(cache_dir() / f"{name}.npz")
        feeds = {k: saved[k] for k in saved.files if k != "__ref__"}
        t0 = time.perf_counter()
        if args.lib == "onnxruntime":
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = opts.inter_op_num_threads = args.threads
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

            def call() -> Any:
                return sess.run(None, feeds)[0]
        elif args.lib == "opgraph-auto" and args.dynamo:  # the user's path, timed up to the first result
            import opgraph  # the package's own import is not counted (torch is already loaded in this process)

            t0 = time.perf_counter()
            graph = opgraph.load(str(path))
            result["import"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            graph = opgraph.optimize(graph, level=2 if args.level is None else args.level)
            result["optimize"] = time.perf_counter() - t1
            t1 = time.perf_counter()
            fn = opgraph.compile(graph, backend="auto")
            first = fn(feeds)[0]
            result["first_call"] = time.perf_counter() - t0
            result["choose"] = time.perf_counter() - t1
            choice = fn.choice
            result.update(choice=choice.backend, timings=choice.timings, failures=choice.failures,
                          report=choice.report(), status=choice.status(), first_error=float(np.max(np.abs(
                              np.asarray(first, np.float64) - saved["__ref__"]))))

            def call() -> Any:
                return fn(feeds)[0]
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
        out = measure(call)
        ref = saved["__ref__"]
        result.update(max_error=float(np.max(np.abs(np.asarray(out, np.float64) - ref))),
                      ref_scale=float(np.max(np.abs(ref))))
        if args.lib == "opgraph-auto" and args.dynamo:
            t1 = time.perf_counter()
            result["export_check"] = export_check(graph)
            result["export_check_s"] = time.perf_counter() - t1
    result["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


if __name__ == "__main__":
    main()
