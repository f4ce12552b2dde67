"""``make bench``: run every benchmark, each library in its own process, and print the tables.

Thread counts for BLAS/OpenMP are set to 1 for every process (the Makefile
exports them; this script sets them again for the children). ``python bench/run.py NAME``
runs one group; docs/benchmarks.md lists them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
THREADS = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")}


def run(script: str, *args: str) -> dict | None:
    env = {**os.environ, **THREADS}
    proc = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        Console(stderr=True).print(f"[red]{script} {' '.join(args)} failed:[/red]\n{proc.stderr[-2000:]}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def have(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


# ----------------------------------------------------------------------------- graph_scale (issue 13)
_GS_SYSTEMS = ("opgraph", "bulk", "rustworkx", "networkx")


def _gs_sizes() -> list[int]:
    text = os.environ.get("OPGRAPH_BENCH_SIZES") or os.environ.get("OPGRAPH_BENCH_N") or "1e4,1e5,1e6,1e7"
    return [int(float(s)) for s in text.replace(" ", "").split(",") if s]


def _gs_num(x: float | None) -> str:
    """Three significant digits, thousands separated."""
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _gs_ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _gs_pow(n: int) -> str:
    k = len(str(n)) - 1
    return f"10^{k}" if n == 10**k else f"{n:,}"


def _gs_get(r: dict | None, *keys: str) -> float | None:
    for k in keys:
        if not isinstance(r, dict) or k not in r:
            return None
        r = r[k]
    return r  # type: ignore[return-value]


def _gs_markdown(title: str, columns: list[str], rows: list[list[str]], notes: list[str]) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(columns) + " |",
             "|" + "|".join(":---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines + [""] + [f"- {note}" for note in notes] + [""])


def emit_table(console: Console, title: str, columns: list[str], rows: list[list[str]], notes: list[str]) -> str:
    """Print a table (first column left, the rest right) and its notes; return them as markdown."""
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for note in notes:
        console.print(f"  {note}", style="dim", markup=False, highlight=False)
    return _gs_markdown(title, columns, rows, notes)


def graph_scale(console: Console) -> None:
    """Issue 13: opgraph (builder and bulk arrays), rustworkx and networkx on the same DAG of N ops, each system
    and size in its own process (bench/graph_scale.py); one table per metric group, also written to
    bench/results/graph_scale.md (and the raw JSON lines to graph_scale.json)."""
    sizes = _gs_sizes()
    repeat = int(os.environ.get("OPGRAPH_BENCH_REPEAT", "5"))
    repeat_large = int(os.environ.get("OPGRAPH_BENCH_REPEAT_LARGE", "3"))
    nx_max = int(float(os.environ.get("OPGRAPH_BENCH_NX_MAX", "1e6")))
    json_max = int(float(os.environ.get("OPGRAPH_BENCH_JSON_MAX", "1e7")))
    huge = os.environ.get("OPGRAPH_BENCH_HUGE", "") not in ("", "0")
    huge_n = int(float(os.environ.get("OPGRAPH_BENCH_HUGE_N", "1e8")))
    extra = ["--budget", os.environ["OPGRAPH_BENCH_BUDGET"]] if os.environ.get("OPGRAPH_BENCH_BUDGET") else []
    if os.environ.get("OPGRAPH_BENCH_SKIP"):  # e.g. compile,io_json
        extra += ["--skip", os.environ["OPGRAPH_BENCH_SKIP"]]
    progress = Console(stderr=True)
    peers = {"rustworkx": have("rustworkx"), "networkx": have("networkx")}
    results: dict[int, dict[str, dict | None]] = {}
    failed: list[str] = []
    for n in sizes:
        reps = repeat if n < 10**7 else min(repeat, repeat_large)
        results[n] = {}
        for lib in _GS_SYSTEMS:
            if lib in peers and (not peers[lib] or (lib == "networkx" and n > nx_max)):
                results[n][lib] = None
                continue
            progress.print(f"[dim]graph_scale: {lib} N={n:,} ...[/dim]")
            args = ["--lib", lib, "--n", str(n), "--repeat", str(reps), "--json-max", str(json_max), *extra]
            results[n][lib] = run("graph_scale.py", *args)
            if results[n][lib] is None:
                failed.append(f"{lib} at N={n:,}")
    huge_r = None
    if huge:
        progress.print(f"[dim]graph_scale: bulk N={huge_n:,} with .cg save/load ...[/dim]")
        huge_r = run("graph_scale.py", "--lib", "bulk", "--n", str(huge_n), "--repeat", "1", "--io", *extra)
        if huge_r is None:
            failed.append(f"bulk with .cg at N={huge_n:,}")

    big = [n for n in sizes if n >= 10**7]
    runs_text = f"medians of {repeat} runs" + (f", {min(repeat, repeat_large)} at N >= 10^7" if big else "")
    fewer: list[str] = []
    for n, by_lib in results.items():
        want = repeat if n < 10**7 else min(repeat, repeat_large)
        for lib, r in by_lib.items():
            for step, d in ((r or {}).get("steps") or {}).items():
                for name, sub in ((step, d), (f"{step} save", d.get("save")), (f"{step} load", d.get("load"))):
                    if isinstance(sub, dict) and "runs" in sub and sub["runs"] < want:
                        fewer.append(f"{lib} {name} at {_gs_pow(n)}: {sub['runs']}")
    first = next((r for by_lib in results.values() for r in by_lib.values() if r), None) or huge_r or {}
    versions = {lib: next((r["version"] for by in results.values() if (r := by.get(lib))), None)
                for lib in ("opgraph", "rustworkx", "networkx")}
    constructor = next((r["constructor"] for by in results.values() if (r := by.get("bulk"))), None)
    header = (f"python {first.get('python', '?')}, numpy {first.get('numpy', '?')}, "
              + ", ".join(f"{k} {v}" for k, v in versions.items() if v)
              + f"; {os.cpu_count()} cores; BLAS/OpenMP threads 1; {runs_text} (each step stops repeating "
              f"once its runs took the budget, {os.environ.get('OPGRAPH_BENCH_BUDGET', '60')} s)")
    tables: list[tuple[str, list[str], list[list[str]], list[str]]] = []

    def per_op(n: int, r: dict | None, *keys: str, scale: float = 1e6) -> float | None:
        v = _gs_get(r, "steps", *keys)
        return v * scale / n if v is not None else None

    # 1. build
    rows = []
    for n, by in results.items():
        og, bk, rx, nx = (by.get(k) for k in _GS_SYSTEMS)
        b, fz, bu = per_op(n, og, "build", "s"), per_op(n, og, "build", "freeze_s"), per_op(n, bk, "build", "s")
        rl, rlist, nl = per_op(n, rx, "build_loop", "s"), per_op(n, rx, "build", "s"), per_op(n, nx, "build", "s")
        rows.append([_gs_pow(n), _gs_num(b), _gs_num(fz), _gs_num(bu), _gs_num(rl), _gs_num(rlist), _gs_num(nl),
                     _gs_ratio(b, rl), _gs_ratio(bu, rlist)])
    tables.append((f"Build: µs per op ({runs_text})",
                   ["N", "opgraph builder", "+ freeze", "opgraph bulk", "rustworkx node by node",
                    "rustworkx from lists", "networkx from lists", "builder / rx node by node",
                    "bulk / rx from lists"], rows,
                   ["opgraph builder: GraphBuilder.op per op (type inference, hash-consing), gc enabled; "
                    "freeze: Graph from the builder's lists. opgraph bulk: the DAG as NumPy arrays through "
                    f"{constructor or 'the checked constructor'} (includes verification).",
                    "rustworkx node by node: PyDiGraph.add_node + 2 add_edge per op; from lists: add_nodes_from + "
                    "add_edges_from_no_data on prepared Python lists (making the lists is not timed). networkx: "
                    f"DiGraph.add_nodes_from + add_edges_from, only up to {_gs_pow(nx_max)} (it is slow).",
                    "Peers store structure only (no payloads); opgraph also stores kind, attributes, version and "
                    "types. Ratios below 1 mean opgraph is faster."]))
    # 2. memory (RSS)
    rows = []
    for n, by in results.items():
        og, bk, rx, nx = (by.get(k) for k in _GS_SYSTEMS)
        gb = per_op(n, og, "build", "retained_graph", scale=1)
        rxr = per_op(n, rx, "build", "retained", scale=1)
        rows.append([_gs_pow(n), _gs_num(per_op(n, og, "build", "peak", scale=1)),
                     _gs_num(per_op(n, og, "build", "retained_builder", scale=1)), _gs_num(gb),
                     _gs_num(per_op(n, og, "build", "graph_nbytes", scale=1)),
                     _gs_num(per_op(n, bk, "build", "peak", scale=1)), _gs_num(per_op(n, rx, "build", "peak", scale=1)),
                     _gs_num(rxr), _gs_num(per_op(n, nx, "build", "peak", scale=1)),
                     _gs_num(per_op(n, nx, "build", "retained", scale=1)),
                     _gs_ratio(per_op(n, og, "build", "graph_nbytes", scale=1), rxr)])
    tables.append(("Build memory: bytes per op (RSS)",
                   ["N", "builder peak", "builder + graph kept", "graph kept", "Graph.nbytes", "bulk peak",
                    "rx peak", "rx kept", "nx peak", "nx kept", "Graph.nbytes / rx kept"], rows,
                   ["peak: RSS high-water mark during the step minus the RSS before it (the kernel's mark is reset "
                    "before each step through /proc/self/clear_refs; freed heap memory is handed back first with "
                    "malloc_trim). kept: RSS after the step minus before, with the result alive.",
                    "builder peak includes the Value handles the loop keeps (a user needs them to refer back); "
                    "builder + graph kept: handles dropped, builder and frozen Graph alive; graph kept: builder "
                    "dropped. Graph.nbytes: the Graph's structure arrays, exactly.",
                    "bulk peak: the constructor's temporaries (its arrays are shared with the input, not copied).",
                    "RSS moves in pages and its counters lag by ~256 KB: below 10^5 ops these are noise; see the "
                    "tracemalloc table."]))
    # 2b. tracemalloc detail
    rows = []
    for n, by in results.items():
        og = by.get("opgraph")
        tm = _gs_get(og, "steps", "build", "tracemalloc")
        if not tm:
            continue
        rows.append([_gs_pow(n), _gs_num(tm["peak"] / n), _gs_num(tm["retained_builder"] / n),
                     _gs_num(tm["retained_graph"] / n), _gs_num(per_op(n, og, "build", "graph_nbytes", scale=1))])
    if rows:
        tables.append(("opgraph builder memory: bytes per op (tracemalloc, one extra build)",
                       ["N", "peak", "builder + graph kept", "graph kept", "Graph.nbytes"], rows,
                       ["tracemalloc counts Python objects and NumPy buffers exactly (not the interpreter's own "
                        "free lists); run only up to --tracemalloc-max (10^6) since it slows the build."]))
    # 3. sort
    rows = []
    for n, by in results.items():
        og, bk, rx, nx = (by.get(k) for k in _GS_SYSTEMS)
        s, r = per_op(n, bk, "sort", "s"), per_op(n, rx, "sort", "s")
        rows.append([_gs_pow(n), _gs_num(s), _gs_num(per_op(n, bk, "sort_ordered", "s")), _gs_num(r),
                     _gs_num(per_op(n, nx, "sort", "s")), _gs_ratio(s, r),
                     _gs_num(per_op(n, bk, "sort", "peak", scale=1)), _gs_num(per_op(n, rx, "sort", "peak", scale=1))])
    tables.append((f"Topological sort: µs per op ({runs_text})",
                   ["N", "opgraph shuffled", "opgraph in order", "rustworkx", "networkx", "opgraph / rx",
                    "opgraph peak B/op", "rx peak B/op"], rows,
                   ["shuffled: Graph.topological_order on the DAG with its ops stored in a random order (Kahn's "
                    "algorithm); in order: the same call on the graph as built (a vectorised check). rustworkx "
                    "topological_sort and list(networkx.topological_sort) on a graph whose nodes were added in a "
                    "random order; every result is checked."]))
    # 4. verify
    rows = []
    for n, by in results.items():
        og, bk, rx, nx = (by.get(k) for k in _GS_SYSTEMS)
        v = per_op(n, og, "verify", "s") or per_op(n, bk, "verify", "s")
        r = per_op(n, rx, "verify", "s")
        rows.append([_gs_pow(n), _gs_num(v), _gs_num(r), _gs_num(per_op(n, nx, "verify", "s")), _gs_ratio(v, r)])
    tables.append((f"Verify: µs per op ({runs_text})",
                   ["N", "opgraph Graph.verify", "rustworkx is_dag", "networkx is_dag", "opgraph / rx"], rows,
                   ["Graph.verify checks every invariant (CSR pointers, dangling ids, producers, gateways, "
                    "tables, cycles, each distinct op signature's types); the peers' is_directed_acyclic_graph "
                    "checks for cycles only."]))
    # 5. compile
    rows = []
    for n, by in results.items():
        og = by.get("opgraph")
        for label, key, build in (("forward", "compile_forward", ("build", "s")),
                                  ("gradient", "compile_grad", ("grad_build", "s"))):
            c = _gs_get(og, "steps", key)
            if not c:
                continue
            ops = c["ops"]
            planned, lower = c.get("planned_bytes"), c.get("lower_bound_bytes")
            rows.append([_gs_pow(n), label, f"{ops:,}", _gs_num(_gs_get(og, "steps", *build)), _gs_num(c["s"]),
                         _gs_num(c["s"] * 1e6 / ops), _gs_num(c["peak"] / ops),
                         _gs_num(planned / 1024 if planned is not None else None),
                         _gs_num(lower / 1024 if lower is not None else None), _gs_ratio(planned, lower)])
    tables.append((f"opgraph.compile (numpy backend): seconds and planned memory ({runs_text})",
                   ["N", "graph", "ops", "build s", "compile s", "compile µs/op", "compile peak B/op", "planned KB",
                    "lower bound KB", "planned / lower bound"], rows,
                   ["forward: the benchmark DAG (built by GraphBuilder, 'build s' as in the build table). gradient: "
                    "y = multiply(sin(y), x) for N // 7 steps, loss = sum(y), GraphBuilder.build_grad_ops(loss, [x]) "
                    "('build s' is the forward chain plus build_grad_ops).",
                    "planned: compiled.plan.stats()['planned_bytes'] (arena + outputs + state); lower bound: the "
                    "largest total of live bytes at any step of the schedule."]))
    # 6. save / load
    rows = []
    for n, by in results.items():
        og = by.get("opgraph")
        for fmt, key in ((".cg", "io_cg"), ("JSON", "io_json")):
            io = _gs_get(og, "steps", key)
            if not io:
                continue
            size, sv, ld = io["file_bytes"], io["save"], io["load"]
            if "error" in ld:
                failed.append(f"{fmt} load at N={n:,}: {ld['error']}")
                ld = {}
            lp, ls = ld.get("peak"), ld.get("s")
            rows.append([_gs_pow(n), fmt, _gs_num(size / n), _gs_num(sv["s"]), _gs_num(sv["s"] * 1e6 / n),
                         _gs_num(sv["peak"] / n), _gs_num(ls) if ld else "failed",
                         _gs_num(ls * 1e6 / n if ld else None), _gs_num(lp / n if ld else None),
                         _gs_ratio(lp, size)])
    tables.append((f"opgraph save / load (opgraph.io.save, opgraph.io.load; {runs_text})",
                   ["N", "format", "file B/op", "save s", "save µs/op", "save peak B/op", "load s", "load µs/op",
                    "load peak B/op", "load peak / file"], rows,
                   [".cg: the four files (.cg, .cgc, .cgio, .cgs); load maps them and verifies the graph. JSON: "
                    f"one file, loaded with verification; up to N = {_gs_pow(json_max)} (OPGRAPH_BENCH_JSON_MAX).",
                    "load runs in a fresh process: its peak is the first load's RSS high-water mark minus the RSS "
                    "after imports and a tiny warm-up load of the same format. save peak: in the building process."]))
    # 7. the 10^8 bulk run
    if huge:
        rows = []
        steps = _gs_get(huge_r, "steps") or {}
        hn = huge_n
        for label, key in (("arrays (NumPy, not part of the API)", ("arrays",)), ("construct (checked)", ("build",)),
                           ("verify again", ("verify",)), ("topological order (in order)", ("sort_ordered",)),
                           ("save .cg", ("io_cg", "save")), ("load .cg (fresh process)", ("io_cg", "load"))):
            d = _gs_get(steps, *key)
            if not isinstance(d, dict) or "error" in d:
                rows.append([label, "failed" if huge_r is None else "-", "-", "-", "-"])
                continue
            rows.append([label, _gs_num(d["s"]), _gs_num(d["s"] * 1e6 / hn),
                         _gs_num(d["peak"] / hn) if "peak" in d else "-", str(d.get("runs", 1))])
        size = _gs_get(steps, "io_cg", "file_bytes")
        tables.append((f"opgraph bulk path at N = {_gs_pow(hn)}",
                       ["step", "s", "µs/op", "peak B/op", "runs"], rows,
                       [f".cg file set: {size / 2**20:,.1f} MiB, {size / hn:.1f} B/op" if size else ".cg: -",
                        f"Graph.nbytes: {_gs_num(per_op(hn, huge_r, 'build', 'graph_nbytes', scale=1))} B/op; "
                        f"constructor: {(huge_r or {}).get('constructor', '-')}; one run per step; the files are "
                        "deleted afterwards."]))
    footer = ("Fewer runs than asked (the step's budget was reached): " + "; ".join(fewer) + ". ") if fewer else ""
    footer += f"FAILED (details on stderr): {'; '.join(failed)}." if failed else ""

    console.print(header)
    md = [f"## Graph scale ({time.strftime('%Y-%m-%d')})", "", header, "",
          "Command: `" + " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                                  if k.startswith("OPGRAPH_BENCH_")) + " python bench/run.py graph_scale`", ""]
    for title, columns, rows, notes in tables:
        md.append(emit_table(console, title, columns, rows, notes))
    if footer:
        console.print(footer, markup=False, highlight=False)
        md.append(footer + "\n")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "graph_scale.md").write_text("\n".join(md))
    raw = [r for by in results.values() for r in by.values() if r] + ([huge_r] if huge_r else [])
    (out / "graph_scale.json").write_text("\n".join(json.dumps(r) for r in raw) + "\n")
    console.print(f"written: {out / 'graph_scale.md'}, {out / 'graph_scale.json'}")


def io_scale(console: Console) -> None:
    sizes = [10**5, 10**6, 10**7]
    rows = [(n, run("io_scale.py", "--n", str(n), "--repeat", "3" if n < 10**7 else "1")) for n in sizes]
    table = Table(title=".cg files: save_cg / load_cg of a chain of N binary elementwise ops "
                        "(medians, 1 thread; each N in its own process)")
    for col in ("N", "file MB", "bytes/function", "save s", "save MB/s", "load s", "of which verify s",
                "load MB/s", "save peak RSS MB", "load peak RSS MB"):
        table.add_column(col, justify="right")
    for n, r in rows:
        if r is None:
            table.add_row(f"{n:,}", *["failed"] + ["-"] * 9)
            continue
        table.add_row(f"{n:,}", f"{r['file_mb']:.1f}", f"{r['bytes_per_function']:.1f}", f"{r['save']:.3f}",
                      f"{r['save_mb_s']:.0f}", f"{r['load']:.3f}", f"{r['verify']:.3f}", f"{r['load_mb_s']:.0f}",
                      f"{r['save_peak_rss_mb']:.0f}", f"{r['load_peak_rss_mb']:.0f}")
    console.print(table)
    console.print("load includes Graph.verify() (every loaded graph is verified); save's peak RSS includes "
                  "building the graph, load runs in a fresh process.")


def elementwise_chain(console: Console) -> None:
    """Issue 34: the 20-op float32 chain over 4M elements at 1 and 2 threads, each implementation in its own process."""
    impls = ["numba", "numba-fast", "torch-compile", "jax", "numpy-inplace"]
    available = {"torch-compile": have("torch"), "jax": have("jax"), "numba": have("numba"),
                 "numba-fast": have("numba")}
    table = Table(title="20-op elementwise chain over 4M float32 (bench/elementwise_chain.py): median ms of 7 calls, "
                        "each implementation in its own process pinned to the threads")
    for col in ("threads", *impls, "numba / torch.compile", "numba-fast / torch.compile"):
        table.add_column(col, justify="right")
    for threads in (1, 2):
        res = {i: run("elementwise_chain.py", "--impl", i, "--threads", str(threads)) if available.get(i, True)
               else None for i in impls}
        ms = {i: (r["median"] * 1e3 if r else None) for i, r in res.items()}
        torch_ms = ms["torch-compile"]
        table.add_row(str(threads), *[f"{ms[i]:.1f}" + ("" if res[i] and res[i]["identical"] else "*")
                                      if ms[i] is not None else "-" for i in impls],
                      *[f"{ms[i] / torch_ms:.2f}x" if ms[i] and torch_ms else "-" for i in ("numba", "numba-fast")])
    console.print(table)
    console.print("* not bit-identical to NumPy's result (numba is; numba-fast is fast_math=True, a few ulp).")


def main() -> None:
    console = Console(width=140)
    console.print(f"python {sys.version.split()[0]}, threads: " + ", ".join(f"{k}=1" for k in THREADS))
    only = sys.argv[1:]  # e.g. `python bench/run.py io_scale`
    tables = {"graph_scale": graph_scale, "io_scale": io_scale, "elementwise_chain": elementwise_chain}
    # More benchmarks live in bench/table_<name>.py, each with `table(console, run)`.
    for path in sorted(HERE.glob("table_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        tables[path.stem[len("table_"):]] = lambda c, m=module: m.table(c, run)
    for name, fn in tables.items():
        if not only or name in only:
            fn(console)


if __name__ == "__main__":
    main()
