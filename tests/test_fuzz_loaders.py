"""Fuzzing the file loaders: mutated .cg sets, JSON, ONNX and GraphML files either load or raise a GraphError.

The mutators and the check are those of ``tools/fuzz.py`` (``make fuzz`` runs
them for longer): byte flips, truncations, insertions, deletions, splices,
integer fields at .cg record boundaries and the .cg metadata JSON, JSON values
replaced by random JSON, huge numbers, NaN or wrong types, GraphML data values,
ids and key types, and ONNX models changed through the onnx API. Hypothesis
draws the seed file and every choice of the mutators (derandomized, so CI sees
the same files). Each load runs under a SIGALRM guard and a tracemalloc bound:
a hang or a large allocation fails like an exception that is not a GraphError.
Seeds are saved by opgraph at test time, plus TensCalc's files copied into
``tests/data/fuzz_seeds``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import random
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import opgraph.io

ROOT = Path(__file__).resolve().parent.parent


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("opgraph_fuzz_tool", ROOT / "tools" / "fuzz.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


fuzz = _load_tool()

EXAMPLES = {"cg": 3000, "json": 4000, "onnx": 2500, "graphml": 2000}
"""Mutated files per format: the file takes about 25 s at -n 2 on an idle 2-core machine, a minute on a busy one."""
FUZZ = dict(deadline=10_000, derandomize=True, database=None, print_blob=False,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                   HealthCheck.function_scoped_fixture])


@functools.cache
def seeds() -> dict[str, list[Any]]:
    return fuzz.make_seeds()


def assert_loads_or_graph_error(m: Any, tmp: str) -> list[Any]:
    outs = fuzz.check(m, tmp)
    bad = [o for o in outs if o.kind == "failure"]
    assert not bad, (f"{m.fmt} file from seed {m.seed!r} made by\n  " + "\n  ".join(m.how)
                     + f"\nfailed: {bad[0].label}\n{bad[0].detail}")
    return outs


def fuzz_format(fmt: str, rnd: random.Random, pick: int, tmp_path: Path) -> None:
    pool = seeds()[fmt]
    m = fuzz.mutate(rnd, pool[pick % len(pool)], pool)
    d = tmp_path / f"m{time.perf_counter_ns()}"
    d.mkdir()
    for o in assert_loads_or_graph_error(m, str(d)):
        event(o.label)  # shown by --hypothesis-show-statistics


# ----------------------------------------------------------------------------- the seeds and the check itself
def test_seeds_are_valid_files_of_every_format(tmp_path: Path) -> None:
    """Every seed loads, and the opgraph-written ones load back equal to the graph they were saved from."""
    pool = seeds()
    assert {f: len(s) for f, s in pool.items()} == {"cg": 5, "json": 3, "onnx": 3, "graphml": 3}
    assert {s.name for s in pool["cg"]} >= {"tc_linalg_vectorized", "tc_nonlinear_scalarized"}
    graphs = dict(fuzz._seed_graphs())
    for fmt, ss in pool.items():
        for s in ss:
            d = tmp_path / f"{fmt}_{s.name}"
            d.mkdir()
            path = fuzz.write_files(fuzz.Mutant(fmt, s.name, s.files), str(d))
            g = opgraph.io.load(path)
            if s.name in graphs and fmt != "onnx":
                assert g == graphs[s.name]
            elif s.name == "mix":  # the hand-made ONNX model computes what NumPy does
                x = np.arange(6, dtype=np.float32)
                gemm = np.concatenate([x.reshape(2, 3) @ np.ones((3, 4), np.float32) * 0.5] * 2, axis=1)
                soft = np.exp(gemm) / np.exp(gemm).sum(axis=1, keepdims=True)
                mean, out = g.run({"x": x})
                np.testing.assert_allclose(mean, gemm[[1, 0]].mean(), rtol=1e-6)
                np.testing.assert_allclose(out, soft.T.astype(np.float64), rtol=1e-6)


def test_mutants_differ_from_their_seeds() -> None:
    """The mutators change the files (nearly always)."""
    pool = seeds()
    for fmt in fuzz.FORMATS:
        by_name = {s.name: s.files for s in pool[fmt]}
        mutants = [fuzz.random_mutant(fmt, i, pool) for i in range(60)]
        changed = sum(m.files != by_name[m.seed] for m in mutants)
        assert changed >= 50, (fmt, changed)


def test_check_flags_other_exceptions_hangs_and_large_allocations(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """The oracle: a GraphError passes; a KeyError, a hang or a 100 MB allocation is a failure."""
    from opgraph.errors import FormatError

    m = fuzz.Mutant("json", "x", {".json": b"{}"})

    def raising(exc: BaseException) -> Any:
        def load(path: Any) -> None:
            raise exc
        return load

    monkeypatch.setattr(opgraph.io, "load", raising(FormatError("bad")))
    assert [(o.kind, o.label) for o in fuzz.check(m, str(tmp_path))] == [("graph_error", "FormatError")]
    monkeypatch.setattr(opgraph.io, "load", raising(KeyError("k")))
    (out,) = fuzz.check(m, str(tmp_path))
    assert out.kind == "failure" and out.label.startswith("KeyError @ ")

    def hang(path: Any) -> None:
        try:  # a loader that swallows Exception must not swallow the guard
            time.sleep(5)
        except Exception:
            pass

    monkeypatch.setattr(opgraph.io, "load", hang)
    t0 = time.perf_counter()
    (out,) = fuzz.check(m, str(tmp_path), timeout=0.2)
    assert (out.kind, out.label) == ("failure", "hang") and time.perf_counter() - t0 < 2
    monkeypatch.setattr(opgraph.io, "load", lambda path: np.ones(12_500_000).sum())
    (out,) = fuzz.check(m, str(tmp_path))
    assert (out.kind, out.label) == ("failure", "memory")


# ----------------------------------------------------------------------------- files the fuzzing found
def _empty_constant_model(dims: list[int], node: Any) -> bytes:
    """A Constant of no elements (one dimension 0, another huge) fed to ``node`` (input "k", output "y")."""
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", TensorProto.FLOAT,
                                                                                             dims, [])), node],
                          "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


@pytest.mark.parametrize("dims, op, attrs", [
    ([0, 1 << 33], "ReduceMax", {"axes": [0], "keepdims": 0}),  # the reduced shape (2**33,) is not empty
    ([1 << 40, 0], "Softmax", {"axis": -1}),  # folding reduces over the empty axis into (2**40, 1)
])
def test_onnx_ops_on_empty_constants_allocate_little(dims: list[int], op: str, attrs: dict[str, Any],
                                                     tmp_path: Path) -> None:
    """A few hundred bytes of model must not make the importer allocate gigabytes (found by tools/fuzz.py)."""
    from onnx import helper

    data = _empty_constant_model(dims, helper.make_node(op, ["k"], ["y"], **attrs))
    assert_loads_or_graph_error(fuzz.Mutant("onnx", f"empty {op}", {".onnx": data}, [f"{op} of {dims}"]),
                                str(tmp_path))


# ----------------------------------------------------------------------------- the fuzzing
@settings(max_examples=EXAMPLES["cg"], **FUZZ)
@given(rnd=st.randoms(use_true_random=False), pick=st.integers(0, 1 << 16))
def test_fuzz_cg(rnd: random.Random, pick: int, tmp_path: Path) -> None:
    fuzz_format("cg", rnd, pick, tmp_path)


@settings(max_examples=EXAMPLES["json"], **FUZZ)
@given(rnd=st.randoms(use_true_random=False), pick=st.integers(0, 1 << 16))
def test_fuzz_json(rnd: random.Random, pick: int, tmp_path: Path) -> None:
    fuzz_format("json", rnd, pick, tmp_path)


@settings(max_examples=EXAMPLES["onnx"], **FUZZ)
@given(rnd=st.randoms(use_true_random=False), pick=st.integers(0, 1 << 16))
def test_fuzz_onnx(rnd: random.Random, pick: int, tmp_path: Path) -> None:
    """Through opgraph.io.load(path) and from_onnx(bytes)."""
    fuzz_format("onnx", rnd, pick, tmp_path)


@settings(max_examples=EXAMPLES["graphml"], **FUZZ)
@given(rnd=st.randoms(use_true_random=False), pick=st.integers(0, 1 << 16))
def test_fuzz_graphml(rnd: random.Random, pick: int, tmp_path: Path) -> None:
    fuzz_format("graphml", rnd, pick, tmp_path)


# ----------------------------------------------------------------------------- control flow: subgraph records
def _control_graph() -> Any:
    """Nested bodies, one shared at two depths: a scan over a body with a cond whose branch calls 'square'."""
    from opgraph import GraphBuilder
    from opgraph.core.subgraph import Subgraph

    def body(name: str, n_in: int, fn: Any) -> Subgraph:
        sb = GraphBuilder()
        xs = [sb.input(("float64", (3,)), name=f"p{i}") for i in range(n_in)]
        sb.output(*fn(sb, *xs))
        return Subgraph(sb.freeze(), name=name)

    sq = body("square", 1, lambda sb, x: (sb.multiply(x, x),))
    neg = body("neg", 1, lambda sb, x: (sb.negative(sb.op("call", x, body=sq)),))
    step = body("step", 2, lambda sb, h, x: (lambda r: (r, sb.sum(r)))(
        sb.op("cond", sb.op("greater", sb.sum(x), 0.0), sb.add(h, x), then_body=sq, else_body=neg)))
    b = GraphBuilder()
    h, xs = b.input(("float64", (3,)), name="h"), b.input(("float64", (4, 3)), name="xs")
    carry, ys = b.op("scan", h, xs, body=step, num_carry=1, name="loop")
    b.output(b.op("call", carry, body=sq), ys)
    return b.freeze()


@functools.cache
def control_seeds() -> dict[str, Any]:
    """The control-flow graph as a .cg set (subgraph records, type 9002) and as JSON (version 2), with the byte
    ranges of its subgraph records (.cgc) and of its "subgraphs" array (JSON)."""
    import struct
    import tempfile

    from opgraph.io.cg import SUBGRAPH_RECORD

    g = _control_graph()
    with tempfile.TemporaryDirectory() as tmp:
        opgraph.io.save(g, os.path.join(tmp, "c.cg"))
        opgraph.io.save(g, os.path.join(tmp, "c.json"))
        cg = {s: Path(tmp, "c" + s).read_bytes() for s in fuzz.CG_SUFFIXES}
        js = Path(tmp, "c.json").read_bytes()
    cgc, w = cg[".cgc"], cg[".cgc"][0] // 8
    spans, pos = [], 1
    while pos < len(cgc):
        t, n = struct.unpack(f"<2{'hiq'[w // 4]}", cgc[pos:pos + 2 * w])
        if t == SUBGRAPH_RECORD:
            spans.append((pos, pos + 2 * w + n))
        pos += 2 * w + n
    assert len(spans) == 3  # square, neg, step: each once
    return {"graph": g, "cg": fuzz.Seed("cg", "control", cg), "json": fuzz.Seed("json", "control", {".json": js}),
            "cg_spans": spans, "json_span": (js.index(b'"subgraphs"'), js.index(b'  "inputs"'))}


def _flip_inside(rnd: random.Random, data: bytes, lo: int, hi: int) -> tuple[bytes, str]:
    out = bytearray(data)
    if rnd.random() < 0.25:
        cut = rnd.randrange(lo, hi)
        return bytes(out[:cut]), f"truncated at {cut} (inside a subgraph record)"
    at = sorted(rnd.randrange(lo, hi) for _ in range(rnd.randint(1, 4)))
    for a in at:
        out[a] = rnd.randrange(256) if rnd.random() < 0.5 else out[a] ^ (1 << rnd.randrange(8))
    return bytes(out), f"bytes {at} changed (inside a subgraph record)"


def test_control_seeds_load_back_equal(tmp_path: Path) -> None:
    c = control_seeds()
    for fmt in ("cg", "json"):
        path = fuzz.write_files(fuzz.Mutant(fmt, "control", c[fmt].files), str(tmp_path))
        assert opgraph.io.load(path).equals(c["graph"])


@settings(max_examples=800, **FUZZ)
@given(rnd=st.randoms(use_true_random=False), fmt=st.sampled_from(["cg", "json"]))
def test_fuzz_subgraph_records(rnd: random.Random, fmt: str, tmp_path: Path) -> None:
    """Mutants of a file with nested, shared bodies: half with the tool's mutators, half changed only inside the
    subgraph records (.cgc records of type 9002, the JSON "subgraphs" array). Each loads or is a GraphError."""
    c = control_seeds()
    seed = c[fmt]
    if rnd.random() < 0.5:
        m = fuzz.mutate(rnd, seed, [seed, *seeds()[fmt]])
    else:
        files = dict(seed.files)
        if fmt == "cg":
            lo, hi = rnd.choice(c["cg_spans"])
            files[".cgc"], how = _flip_inside(rnd, files[".cgc"], lo, hi)
        else:
            files[".json"], how = _flip_inside(rnd, files[".json"], *c["json_span"])
        m = fuzz.Mutant(fmt, "control", files, [how])
    d = tmp_path / f"m{time.perf_counter_ns()}"
    d.mkdir()
    for o in assert_loads_or_graph_error(m, str(d)):
        event(o.label)


def test_fuzz_tool_runs_and_counts(tmp_path: Path) -> None:
    """``tools/fuzz.py`` (the random engine) counts every file it tries and exits 0 when nothing failed."""
    code = fuzz.main(["20", "--formats", "cg", "--engine", "random", "--out", str(tmp_path)])
    progress = (tmp_path / "progress.cg.json").read_text()
    assert '"tried": 20' in progress
    assert code == (1 if os.path.isdir(tmp_path / "failures") else 0)
