"""One ONNX model run by one library in this process; prints a JSON line.

    python bench/onnx_models.py --lib opgraph|opgraph-compiled|onnxruntime --model light_resnet50 [--repeat N]

The models are the "real" architectures ONNX's backend test suite ships in
light form (onnx/backend/test/data/light), fed the suite's own dummy input.
Reports the import (or session creation) time, the median run time over
``--repeat`` runs after one warm-up, the peak RSS and the largest difference from the suite's expected output.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

import numpy as np
import onnx


def light_model(name: str) -> Path:
    """The path of a light model in the installed onnx package."""
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"{name}.onnx"


def dummy_input(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The suite's deterministic dummy input (arange / n, float32) for every non-initializer input."""
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        feeds[vi.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


def max_error(name: str, out: np.ndarray) -> float:
    """The largest absolute difference from the output ONNX's suite ships for this model and input."""
    from onnx import numpy_helper

    ref = numpy_helper.to_array(onnx.load_tensor(str(light_model(name).with_name(f"{name}_output_0.pb"))))
    return float(np.max(np.abs(np.asarray(out, dtype=np.float64) - ref)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, choices=("opgraph", "opgraph-compiled", "onnxruntime"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    model = onnx.load(str(light_model(args.model)))
    feeds = dummy_input(model)
    t0 = time.perf_counter()
    if args.lib == "onnxruntime":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])

        def step() -> np.ndarray:
            return sess.run(None, feeds)[0]
    else:
        import opgraph
        from opgraph.io.onnx import from_onnx

        graph = from_onnx(model)
        if args.lib == "opgraph-compiled":
            fn = opgraph.compile(graph)

            def step() -> np.ndarray:
                return np.asarray(fn(feeds)[0])
        else:
            def step() -> np.ndarray:
                return graph.run(feeds)[0]
    prepare = time.perf_counter() - t0
    out = step()
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        out = step()
        times.append(time.perf_counter() - t)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"prepare": prepare, "run": statistics.median(times), "rss_mb": rss_mb,
                      "max_error": max_error(args.model, out), "shape": list(np.shape(out)),
                      "threads": os.environ.get("OMP_NUM_THREADS")}))


if __name__ == "__main__":
    main()
