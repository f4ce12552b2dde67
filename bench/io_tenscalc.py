"""Loading TensCalc's file sets: time per function (.cg record) of ``opgraph.io.load``.

Each load runs in a fresh process (imports warmed up in that process first,
then one timed load), ``--repeat`` processes per set; prints one JSON line
per set (median seconds, microseconds per function, functions), then one
with all of them.

    python bench/io_tenscalc.py                       # the shared sets (mpc_medium, scalarized and vectorized)
    python bench/io_tenscalc.py --tile 4 --tmp DIR    # also mpc_medium scalarized tiled 4 times (a larger set)
    python bench/io_tenscalc.py PATH ...              # any .cg file sets

The tiled set is TensCalc's own records repeated with shifted variable,
constant and function indices (the gateways and io names of the first copy
only; the other copies' set variables become unset inputs): the same mix of
records at ``k`` times the size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "tenscalc"
if not SHARED.is_dir():
    SHARED = Path("/work/shared/tenscalc")
SUFFIXES = (".cg", ".cgc", ".cgio", ".cgs")


def child(path: str) -> None:
    """Load ``path`` once untimed (imports, registries), then once timed; print seconds and functions."""
    import opgraph

    opgraph.io.load(str(SHARED / "linalg" / "scalarized"))
    t = time.perf_counter()
    g = opgraph.io.load(path)
    dt = time.perf_counter() - t
    copies = g.file_meta.get("cg_scalar_copies")  # (records in the .cg file, ...) when copies added ops
    n_records = copies[0] if copies else g.num_ops
    print(json.dumps({"seconds": dt, "functions": int(n_records)}))


def tile(src: str, k: int, dst: str) -> None:
    """Write ``src`` (a TensCalc file set without opgraph metadata) repeated ``k`` times as ``dst``."""
    import opgraph

    g = opgraph.io.load(src)
    if g.file_meta.get("cg_opgraph_metadata") or len(g.updates):
        raise SystemExit("tile: only TensCalc sets without copies")
    raw = {s: Path(src + s).read_bytes() for s in SUFFIXES}
    if len({raw[s][0] for s in SUFFIXES}) != 1:
        raise SystemExit("tile: mixed integer widths")
    w = raw[".cg"][0] // 8
    dt = np.dtype(f"<i{w}")
    n_ops, n_vals, n_const = g.num_ops, g.num_values, len(g.constants)
    kind = g.op_kind.astype(np.int64)
    is_const = kind == 0
    const_ref = np.zeros(n_ops, np.int64)
    for op in np.flatnonzero(is_const).tolist():
        const_ref[op] = dict(g.attrs[int(g.op_attr[op])])["index"]
    n_in, n_out = np.diff(g.in_ptr), np.diff(g.out_ptr)
    rec_len = np.where(is_const, 3, 3 + n_in + n_out)
    start = np.concatenate([[0], np.cumsum(rec_len)[:-1]])
    cg = np.empty(int(rec_len.sum()), np.int64)
    cg[start] = kind
    cg[start + 1] = np.where(is_const, const_ref, n_in)
    cg[start + 2] = np.where(is_const, 0, n_out)
    is_id = np.ones(len(cg), bool)
    is_id[start] = is_id[start + 1] = False
    is_id[start[~is_const] + 2] = False
    is_id[start[is_const] + 2] = True
    ids_at = np.flatnonzero(is_id)
    cg[ids_at] = 0
    # the ids in record order: a constant's output; else inputs then outputs
    pos_in = np.repeat(start + 3, n_in) + (np.arange(int(n_in.sum())) - np.repeat(g.in_ptr[:-1], n_in))
    pos_out = np.where(is_const, start + 2, start + 3 + n_in)
    pos_out = np.repeat(pos_out, n_out) + (np.arange(int(n_out.sum())) - np.repeat(g.out_ptr[:-1], n_out))
    cg[pos_in], cg[pos_out] = g.in_ids, g.out_ids
    const_pos = start[is_const] + 1
    parts = []
    for c in range(k):
        part = cg.copy()
        part[ids_at] += c * n_vals
        part[const_pos] += c * n_const
        parts.append(part.astype(dt))
    cgs_recs, pos = [], 1
    data = raw[".cgs"]
    fmt = {2: "<4h", 4: "<4i", 8: "<4q"}[w]
    while pos < len(data):
        t, i, nl, dl = struct.unpack_from(fmt, data, pos)
        cgs_recs.append((t, i, data[pos + 4 * w:pos + 4 * w + nl + dl], nl, dl))
        pos += 4 * w + nl + dl
    shift = {1: n_const, 2: n_ops, 3: n_vals, 4: 0}
    cgs = bytearray(data[:1])
    for c in range(k):
        for t, i, text, nl, dl in cgs_recs:
            if t == 4 and c:
                continue
            cgs += struct.pack(fmt, t, i + c * shift[t], nl, dl) + text
    out = {".cg": raw[".cg"][:1] + b"".join(p.tobytes() for p in parts),
           ".cgc": raw[".cgc"][:1] + raw[".cgc"][1:] * k, ".cgio": raw[".cgio"], ".cgs": bytes(cgs)}
    for s, b in out.items():
        Path(dst + s).write_bytes(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tile", type=int, default=0, help="also load mpc_medium/scalarized tiled this many times")
    ap.add_argument("--tmp", default=None, help="folder for the tiled set (default: a temporary one)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    paths = args.paths or [str(SHARED / "mpc_medium" / v) for v in ("scalarized", "vectorized")]
    tmp = args.tmp or tempfile.mkdtemp()
    if args.tile:
        dst = os.path.join(tmp, f"mpc_medium_x{args.tile}")
        tile(str(SHARED / "mpc_medium" / "scalarized"), args.tile, dst)
        paths.append(dst)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    rows = []
    for p in paths:
        runs = []
        for _ in range(args.repeat):
            out = subprocess.run([sys.executable, __file__, "--child", p], env=env, check=True,
                                 capture_output=True, text=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
        sec = statistics.median(r["seconds"] for r in runs)
        n = runs[0]["functions"]
        rows.append({"set": p, "functions": n, "median_s": round(sec, 4),
                     "us_per_function": round(sec / max(n, 1) * 1e6, 2),
                     "runs_s": [round(r["seconds"], 4) for r in runs]})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"sets": rows}))  # the last line: all of them (bench/table_io_tenscalc.py)


if __name__ == "__main__":
    main()
