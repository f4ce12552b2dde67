"""The register machine as C (issue 34, point 3): generate + compile seconds and run time against the numba engine.

    python bench/c_codegen.py --n 1e5 [--repeat 5] [--mode auto|interp|straight]
    python bench/c_codegen.py --tenscalc /work/shared/tenscalc/mpc_medium [--repeat 5]

A random scalar DAG of ``n`` ops (add/multiply/subtract/sin/cos and a scaling by 0.5, each reading the previous
value and an earlier one chosen at random; 64 float64 inputs, one output: bench/finegrained_graphs.py's, as the
fine-grained benchmark runs it). Printed (one JSON
line): ``generate_s`` (assembling the program and writing its C text), ``cc_s`` (the C compiler, ``cc -O2``, on
that text, into a shared library; no cache), both also as CPU seconds (``*_cpu_s``: what a busy machine does
not inflate), ``c_call_s`` and ``numba_call_s`` (per call: the median of ``--repeat`` interleaved samples of
about 50 ms of calls each, 1 thread) and the largest difference between the two engines' results (must be 0).
With ``--tenscalc DIR``: the scalarized file set there (every get gateway's outputs; input shapes from its
reference.json), compiled with ``backend="c"`` (generate + cc, no cache) and on the numba engine, timed alike.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from finegrained_graphs import dag_graph, dag_input, random_dag


def _medians(exes: dict[str, object], args: list[np.ndarray], repeat: int) -> dict[str, float]:
    """Per-call seconds of each executable: the median of ``repeat`` samples, each a loop of calls of about
    50 ms, the executables' samples interleaved (so a busy machine slows them alike)."""
    loops = {}
    for name, exe in exes.items():
        exe(args)  # type: ignore[operator]
        t = time.perf_counter()
        exe(args)  # type: ignore[operator]
        loops[name] = max(1, int(0.05 / max(time.perf_counter() - t, 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in exes}
    for _ in range(repeat):
        for name, exe in exes.items():
            t = time.perf_counter()
            for _ in range(loops[name]):
                exe(args)  # type: ignore[operator]
            samples[name].append((time.perf_counter() - t) / loops[name])
    return {name: statistics.median(v) for name, v in samples.items()}


def tenscalc(folder: str, repeat: int) -> dict[str, object]:
    """Time a TensCalc scalarized file set on the c and numba engines (see the module doc)."""
    import opgraph.io
    import opgraph.io.cg
    from opgraph.backends.c import BACKEND as C
    from opgraph.backends.numba import BACKEND as NUMBA

    g = opgraph.io.load(os.path.join(folder, "scalarized"))
    with open(os.path.join(folder, "reference.json")) as fh:
        steps = json.load(fh)["steps"]
    gws = opgraph.io.cg.gateways(g)
    sets = {gw.values[0]: gw.name for gw in gws if gw.kind == "set"}
    value = {st["gateway"]: np.array(st["value"], dtype=np.float64) for st in steps if st["op"] == "set"}
    gets = [v for gw in gws if gw.kind == "get" for v in gw.values]
    g = g.replace(outputs=np.asarray(gets, dtype=g.outputs.dtype))
    xs = [value[sets[v]] for v in g.inputs.tolist()]
    shapes = [x.shape for x in xs]
    os.environ["OPGRAPH_CACHE_DIR"] = tempfile.mkdtemp()  # no cached library: the compiler runs
    t = time.perf_counter()
    exe = C.compile_graph(g, input_shapes=shapes)
    c_compile = time.perf_counter() - t
    t = time.perf_counter()
    ref = NUMBA.compile_graph(g, input_shapes=shapes)
    numba_compile = time.perf_counter() - t
    got, want = exe(xs), ref(xs)
    n = len(exe.machine.program)  # type: ignore[attr-defined]
    return {"case": os.path.basename(folder), "instructions": n, "c_compile_s": c_compile,
            "numba_compile_s": numba_compile,
            **{f"{k}_call_s": v for k, v in _medians({"c": exe, "numba": ref}, xs, repeat).items()},
            "max_diff": max(float(np.max(np.abs(a - b), initial=0.0)) for a, b in zip(got, want, strict=True))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=float, default=1e4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mode", choices=("auto", "interp", "straight"), default="auto")
    ap.add_argument("--no-numba", action="store_true")
    ap.add_argument("--tenscalc", metavar="DIR")
    a = ap.parse_args()
    if a.tenscalc:
        print(json.dumps(tenscalc(a.tenscalc, a.repeat)))
        return
    from opgraph.backends.c import CFLAGS, CExecutable, compiler
    from opgraph.backends.c.codegen import STRAIGHT_LINE_MAX, Entry, write_c
    from opgraph.backends.numba import BACKEND as NUMBA
    from opgraph.backends.numba.assemble import assemble

    n = int(a.n)
    g = dag_graph(random_dag(n))
    limit = {"auto": STRAIGHT_LINE_MAX, "interp": -1, "straight": 1 << 62}[a.mode]
    t, cpu = time.perf_counter(), time.process_time()
    entry = Entry("bench", assemble(g, rules=NUMBA.rules))
    src, _ = write_c("bench", [entry], limit)
    gen, gen_cpu = time.perf_counter() - t, time.process_time() - cpu
    with tempfile.TemporaryDirectory() as tmp:
        c_path, so_path = os.path.join(tmp, "bench.c"), os.path.join(tmp, "bench.so")
        t = time.perf_counter()
        with open(c_path, "w") as fh:
            fh.write(src)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([*compiler(), *CFLAGS, "-o", so_path, c_path, "-lm"], check=True)  # type: ignore[misc]
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cc = time.perf_counter() - t
        cc_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        import ctypes

        exe = CExecutable(entry, ctypes.CDLL(so_path), src)
        xs = [dag_input()]
        got = exe(xs)
        out = {"n": n, "instructions": len(entry.machine.program), "mode": a.mode, "c_bytes": len(src),
               "generate_s": gen, "generate_cpu_s": gen_cpu, "cc_s": cc, "cc_cpu_s": cc_cpu}
        exes: dict[str, object] = {"c": exe}
        if not a.no_numba:
            ref = exes["numba"] = NUMBA.compile_graph(g)
            want = ref(xs)
            out["max_diff"] = float(np.max(np.abs(np.asarray(got[0]) - np.asarray(want[0]))))
        out.update({f"{k}_call_s": v for k, v in _medians(exes, xs, a.repeat).items()})
    print(json.dumps(out), file=sys.stdout)


if __name__ == "__main__":
    main()
