"""One library on one fine-grained workload and size, in this process (issue 34); prints one JSON line.

    python bench/finegrained.py --workload dag|mpc|rk4 --n N --lib opgraph|casadi|casadi_cc
        [--backend numba|c|numpy] [--grad] [--path graph|jit] [--repeat 5] [--cc-limit 60]

Workloads (bench/finegrained_graphs.py): ``dag``, the random scalar DAG of ``n`` ops (64 inputs, one output);
``mpc``, TensCalc's scalarized nonlinear MPC (/work/shared/tenscalc/mpc_medium, gateway ``get_JgH``; opgraph
only: CasADi cannot read .cg files); ``rk4``, ``n`` unrolled RK4 steps of two coupled pendulums (4 states, output
the final state; with ``--grad`` the gradient of its sum of squares).

Libraries:

* ``opgraph``: ``--path graph`` builds the graph from arrays (``dag``: ``Graph.from_arrays``; ``dag --grad``:
  the ops in a GraphBuilder plus ``build_grad_ops``; ``mpc``: ``opgraph.io.load``) and compiles it with
  ``opgraph.compile(graph, backend=B)``; ``--path jit`` traces a Python function over ``opgraph.numpy``:
  ``opgraph.compile(opgraph.function(f).graph(x), backend=B)``, or with ``--grad``
  ``opgraph.jit(opgraph.grad(f), backend=B)``. A backend that is not installed, or whose compile raises
  ``BackendError``, gives ``{"error": "n/a: <reason>"}``.
* ``casadi``: the same expression in CasADi SX, ``casadi.Function`` (its virtual machine), gradient by
  ``casadi.gradient``.
* ``casadi_cc``: that Function through ``casadi.CodeGenerator``, ``cc -O1 -shared``, loaded with
  ``casadi.external``; gcc is stopped after ``--cc-limit`` seconds (``{"error": "gcc > Ns"}``).

Every process checks its result before timing: against a plain-Python reference (``math``; ``dag`` to 1e-9
relative, ``rk4`` to 1e-9), against TensCalc's values (``mpc``, 1e-12 absolute, reference.json's tolerance), and
gradients against central finite differences of the reference on 4 coordinates (1e-5); the JSON line also carries
the result (``value``) so that bench/table_finegrained.py can check that opgraph and CasADi agree (1e-9).

Printed: ``ops`` (ops in the graph run, or CasADi's ``n_instructions``), ``build_s`` (making the graph or SX
expression), ``compile_s`` (compile and first call; for ``--path jit --grad``: tracing too, then ``build_s`` is
0), ``call_s`` (median over ``--repeat`` samples, each a loop of calls of ~20 ms), and RSS deltas (bytes; see
bench/scale_common.py): ``mem_compile_peak`` (peak during compile and first call, from before it),
``cold_s`` (the same on a 16-op DAG first: importing the engine, compiling its interpreter; not counted),
``mem_kept`` (held after compile and the timed calls, from before compile: what the program keeps while it runs)
and ``mem_call_peak`` (peak during the timed calls, from before them). Threads: OMP/OPENBLAS/MKL/NUMBA 1.
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"  # before NumPy and numba are imported: 1 thread for every library
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"
os.environ["NUMEXPR_NUM_THREADS"] = "1"
os.environ["NUMBA_NUM_THREADS"] = "1"

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import finegrained_graphs as fg
from scale_common import peak_rss_bytes, per_call, release_memory, reset_peak, rss_bytes

MPC = Path(os.environ.get("OPGRAPH_TENSCALC", "/work/shared/tenscalc")) / "mpc_medium"
VALUE_RTOL, MPC_ATOL, FD_STEP, FD_TOL = 1e-9, 1e-12, 1e-6, 1e-5
FD_COORDS = (0, 17, 40, 63)  # dag coordinates checked by finite differences (rk4: all 4)


class NotAvailable(Exception):
    """The case cannot run here; the message is the table cell."""


# ----------------------------------------------------------------------------- workloads
def workload(args: argparse.Namespace) -> dict[str, Any]:
    """The input, the reference result and, for the libraries, what they need to build the computation."""
    if args.workload == "dag":
        d = fg.random_dag(args.n, seed=args.seed)
        x = fg.dag_input(args.seed)
        return {"dag": d, "x": x, "ref": lambda z: np.array([fg.dag_reference(d, z)])}
    if args.workload == "rk4":
        return {"x": fg.rk4_input(), "ref": lambda z: fg.rk4_reference(args.n, z)}
    ref = json.loads((MPC / "reference.json").read_text())
    return {"steps": ref["steps"]}


def loss_of(values: np.ndarray, workload_name: str) -> float:
    """The scalar a gradient case differentiates: the DAG's output, or the final state's sum of squares (rk4)."""
    return float(values[0]) if workload_name == "dag" else float(np.sum(values * values))


def check(args: argparse.Namespace, w: dict[str, Any], got: np.ndarray) -> float:
    """The result's error against the independent reference; raises SystemExit (after printing) if too large."""
    if args.workload == "mpc":
        want = np.concatenate([np.ravel(np.array(o["value"], dtype=np.float64))
                               for o in next(s for s in w["steps"] if s["gateway"] == "get_JgH")["outputs"]])
        err = float(np.max(np.abs(got - want)))
        ok = err <= MPC_ATOL
    elif not args.grad:
        want = w["ref"](w["x"])
        err = float(np.max(np.abs(got - want)) / max(1e-300, float(np.max(np.abs(want)))))
        ok = err <= VALUE_RTOL
    else:
        coords = FD_COORDS if args.workload == "dag" else range(4)
        err, ok = 0.0, True
        for j in coords:
            e = np.zeros_like(w["x"])
            e[j] = FD_STEP
            fd = (loss_of(w["ref"](w["x"] + e), args.workload) - loss_of(w["ref"](w["x"] - e), args.workload)) \
                / (2 * FD_STEP)
            d = abs(float(got[j]) - fd)
            err = max(err, d / max(1.0, abs(fd)))
        ok = err <= FD_TOL
    if not ok:
        raise NotAvailable(f"WRONG: error {err:.2e} against the reference")
    return err


# ----------------------------------------------------------------------------- opgraph
def opgraph_case(args: argparse.Namespace, w: dict[str, Any], out: dict[str, Any]) -> Callable[[], Any]:
    import opgraph
    from opgraph.backends import BackendError

    out["version"] = opgraph.__version__
    if args.backend not in opgraph.backends.available():
        raise NotAvailable(f"n/a: backend {args.backend!r} is not in opgraph.backends.available() here")
    # The same paths on a 16-op DAG first: importing the engine and compiling its interpreter (numba's, once per
    # machine) are then not counted as compiling this graph (``cold_s``).
    t0 = time.perf_counter()
    tiny = fg.random_dag(16, seed=1)
    try:
        opgraph.compile(fg.dag_graph(tiny), backend=args.backend)(fg.dag_input())
        if args.path == "jit":
            opgraph.jit(opgraph.grad(fg.dag_traced(tiny)), backend=args.backend)(fg.dag_input())
    except BackendError as exc:
        raise NotAvailable("n/a: " + (str(exc).splitlines() or [""])[0][:200]) from None
    out["cold_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if args.workload == "mpc":
        from opgraph.io import cg

        g = opgraph.io.load(MPC / "scalarized")
        gws = {gw.name: gw for gw in cg.gateways(g)}
        feeds: dict[int, np.ndarray] = {}  # each set's first value (set_u is set again after the first gets)
        for s in w["steps"]:
            if s["op"] == "set":
                feeds.setdefault(gws[s["gateway"]].values[0], np.array(s["value"], dtype=np.float64))
        g = g.replace(outputs=np.array(gws["get_JgH"].values, dtype=np.int32),
                      updates=np.zeros((0, 2), dtype=np.int32))
        args_: tuple[Any, ...] = (feeds,)
    elif args.path == "graph":
        g = fg.dag_grad_graph(w["dag"]) if args.grad else fg.dag_graph(w["dag"])
        args_ = (w["x"],)
    else:
        g = None
        args_ = (w["x"],)
    out["build_s"] = time.perf_counter() - t0
    if g is not None:  # the ops the outputs need, constants left out (TensCalc's "compute ops")
        needed = g.needed_ops(g.outputs.tolist())
        out["ops"] = int(np.count_nonzero(g.op_kind[needed] != opgraph.get_op("const").id))
    f = traced(args, w) if g is None else None
    release_memory()
    base = rss_bytes()
    reset_peak()
    t0 = time.perf_counter()
    try:
        if g is not None:
            prog = opgraph.compile(g, backend=args.backend)
        elif args.grad:
            prog = opgraph.jit(opgraph.grad(f), backend=args.backend)
        else:
            t1 = time.perf_counter()
            g = opgraph.function(f).graph(w["x"])
            out["build_s"] = time.perf_counter() - t1
            out["ops"] = g.num_ops
            prog = opgraph.compile(g, backend=args.backend)
        first = prog(*args_)
    except BackendError as exc:
        raise NotAvailable("n/a: " + (str(exc).splitlines() or [""])[0][:200]) from None
    out["compile_s"] = time.perf_counter() - t0 - (out["build_s"] if g is not None and args.path == "jit"
                                                   and not args.grad else 0.0)
    out["mem_compile_peak"] = max(0, peak_rss_bytes() - base)
    if args.path == "jit" and args.grad:
        out["build_s"] = 0.0
        out["ops"] = opgraph.grad(f).graph(w["x"]).num_ops if args.count_ops else None
    got = result_array(first)
    out["error_vs_reference"] = check(args, w, got)
    out["value"] = got.tolist() if got.size <= 64 else None

    def call() -> Any:
        return prog(*args_)

    out["_base"] = base
    return call


def traced(args: argparse.Namespace, w: dict[str, Any]) -> Callable[[Any], Any]:
    """The workload as a Python function of ``x`` over ``opgraph.numpy``."""
    import opgraph.numpy as onp

    if args.workload == "dag":
        f = fg.dag_traced(w["dag"])
        return f
    step = fg.rk4(args.n, onp.sin)
    if args.grad:
        def loss(x: Any) -> Any:
            s = step(x)
            return s[0] * s[0] + s[1] * s[1] + s[2] * s[2] + s[3] * s[3]
        return loss
    return lambda x: onp.stack(list(step(x)))


def result_array(r: Any) -> np.ndarray:
    """A program's result(s) as one flat float64 array (dict results in the get gateway's order)."""
    if isinstance(r, (list, tuple)):
        return np.concatenate([np.ravel(np.asarray(a, dtype=np.float64)) for a in r])
    return np.ravel(np.asarray(r, dtype=np.float64))


# ----------------------------------------------------------------------------- CasADi
def casadi_case(args: argparse.Namespace, w: dict[str, Any], out: dict[str, Any]) -> Callable[[], Any]:
    import casadi

    out["version"] = casadi.__version__
    if args.workload == "mpc":
        raise NotAvailable("n/a: CasADi cannot read TensCalc .cg files")
    t0 = time.perf_counter()
    if args.workload == "dag":
        xs, y = fg.dag_casadi(w["dag"])
    else:
        xs = casadi.SX.sym("x", 4)
        s = fg.rk4(args.n, casadi.sin)(xs)
        y = casadi.vertcat(*s)
        if args.grad:
            y = casadi.sumsqr(y)
    if args.grad:
        y = casadi.gradient(y, xs)
    fun = casadi.Function("f", [xs], [y])
    out["build_s"] = time.perf_counter() - t0
    out["ops"] = int(fun.n_instructions())
    x = w["x"]
    release_memory()
    base = rss_bytes()
    reset_peak()
    t0 = time.perf_counter()
    if args.lib == "casadi_cc":
        fun = compiled_casadi(fun, args.cc_limit, out)
    first = fun(x)
    out["compile_s"] = time.perf_counter() - t0
    out["mem_compile_peak"] = max(0, peak_rss_bytes() - base)
    got = np.ravel(np.array(first, dtype=np.float64))
    out["error_vs_reference"] = check(args, w, got)
    out["value"] = got.tolist()
    out["_base"] = base
    return lambda: fun(x)


def compiled_casadi(fun: Any, limit: float, out: dict[str, Any]) -> Any:
    """``fun`` as C (``CodeGenerator``), compiled by ``cc -O1 -shared`` within ``limit`` seconds, loaded back."""
    import casadi

    tmp = Path(tempfile.mkdtemp(prefix="fg_casadi_"))
    t0 = time.perf_counter()
    gen = casadi.CodeGenerator("fgen.c")
    gen.add(fun)
    gen.generate(str(tmp) + "/")
    out["codegen_s"] = time.perf_counter() - t0
    out["c_bytes"] = (tmp / "fgen.c").stat().st_size
    t0 = time.perf_counter()
    try:
        # its own process group: on timeout the compiler proper (cc1, a child of cc) is stopped too
        proc = subprocess.Popen(["cc", "-O1", "-shared", "-fPIC", "-o", str(tmp / "fgen.so"), str(tmp / "fgen.c")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise NotAvailable(f"gcc > {limit:.0f} s") from None
        if proc.returncode:
            raise NotAvailable(f"n/a: cc failed: {err.decode(errors='replace').strip()[-150:]}")
        out["cc_s"] = time.perf_counter() - t0
        return casadi.external("f", str(tmp / "fgen.so"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the library stays loaded


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=("dag", "mpc", "rk4"), required=True)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--lib", choices=("opgraph", "casadi", "casadi_cc"), required=True)
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--grad", action="store_true")
    ap.add_argument("--path", choices=("graph", "jit"), default="graph")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cc-limit", type=float, default=60.0)
    ap.add_argument("--count-ops", action=argparse.BooleanOptionalAction, default=True,
                    help="jit --grad: trace the gradient once more to count its ops")
    args = ap.parse_args()
    if args.backend == "c" and not os.environ.get("OPGRAPH_BENCH_FG_KEEP_CACHE"):
        # a fresh cache directory, so that compiling is measured, not a cache hit of an earlier run
        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="fg_cache_")
    if args.workload == "rk4":
        args.path = "jit"
    out: dict[str, Any] = {k: getattr(args, k) for k in ("workload", "n", "lib", "backend", "grad", "path")}
    if args.lib != "opgraph":
        out["backend"] = "-"
    try:
        w = workload(args)
        call = (opgraph_case if args.lib == "opgraph" else casadi_case)(args, w, out)
        base = out.pop("_base")
        release_memory()
        before = rss_bytes()
        reset_peak()
        out["call_s"] = per_call(call, args.repeat)
        out["mem_call_peak"] = max(0, peak_rss_bytes() - before)
        out["mem_kept"] = rss_bytes() - base
    except NotAvailable as exc:
        out.pop("_base", None)
        out["error"] = str(exc)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
