"""What ``import opgraph`` costs next to ``import numpy``: wall time and peak RSS, each in a fresh process.

    python bench/import_cost.py [--repeat 7] [--no-bytecode-cache] [--clock wall|cpu]

Each repetition starts one interpreter that imports NumPy and one that imports opgraph (interleaved, so
a busy machine slows both alike) and reads, inside the child, the time the import statement took and
the process's peak RSS after it (``resource.getrusage``; interpreter start-up is in both RSS figures and
in neither time). The time is wall-clock (``--clock cpu``: the process's CPU time, steadier on a busy
machine). Prints one JSON line with the medians::

    {"numpy_ms": ..., "opgraph_ms": ..., "numpy_rss_mb": ..., "opgraph_rss_mb": ...}

``opgraph_ms`` and ``opgraph_rss_mb`` include NumPy (opgraph imports it), so the cost of opgraph itself
is the difference. By default the children compile to a bytecode cache in a temporary directory (warmed
by one untimed run of each), which is what an installed package gives; ``--no-bytecode-cache`` sets
``PYTHONDONTWRITEBYTECODE`` and no cache directory, so a source checkout without ``__pycache__`` folders
compiles opgraph in every child (NumPy still loads its installed bytecode): the worst case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = """
import resource, sys, time
t0 = time.{clock}()
import {module}
t1 = time.{clock}()
rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
print((t1 - t0) * 1e3, rss_mb)
"""


def measure(module: str, env: dict[str, str], clock: str = "wall") -> tuple[float, float]:
    """Import ``module`` in a fresh interpreter: (milliseconds the import took, peak RSS in MiB).

    >>> ms, mb = measure("json", dict(os.environ))
    >>> ms > 0 and mb > 1
    True
    """
    src = Path(__file__).resolve().parents[1] / "src"
    env = {**env, "PYTHONPATH": os.pathsep.join([str(src), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    code = _CHILD.format(module=module, clock="perf_counter" if clock == "wall" else "process_time")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                         timeout=300).stdout
    ms, mb = out.split()
    return float(ms), float(mb)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the comparison and print (and return) the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="fresh processes per library (median taken)")
    parser.add_argument("--no-bytecode-cache", action="store_true", help="compile opgraph in every child")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="what the times measure")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="opgraph-import-cost-") as cache:
        if args.no_bytecode_cache:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
            env.pop("PYTHONPYCACHEPREFIX", None)
        else:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = cache
            measure("numpy", env, args.clock)
            measure("opgraph", env, args.clock)
        runs: dict[str, list[tuple[float, float]]] = {"numpy": [], "opgraph": []}
        for _ in range(args.repeat):
            for module, got in runs.items():
                got.append(measure(module, env, args.clock))
    result = {
        "numpy_ms": statistics.median(ms for ms, _ in runs["numpy"]),
        "opgraph_ms": statistics.median(ms for ms, _ in runs["opgraph"]),
        "numpy_rss_mb": statistics.median(mb for _, mb in runs["numpy"]),
        "opgraph_rss_mb": statistics.median(mb for _, mb in runs["opgraph"]),
    }
    result = {k: round(v, 2) for k, v in result.items()}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
