"""The register machine as C (``backend="c"``, ``opgraph codegen``): every opcode, both forms of a program
(straight-line and interpreter), random scalar DAGs, TensCalc's files, the CLI's files linked into a C program,
against the numba engine's interpreter (bit for bit), the NumPy engine and TensCalc's own values.

Each C compiler run costs 0.1-1 s, so cases share C files where they can and compiled libraries are cached
(in a temporary directory for this module).
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opgraph
import opgraph.io
import opgraph.io.cg
from opgraph import backends
from opgraph.backends.base import BackendError
from opgraph.core.registry import CONST, get_op
from opgraph.core.types import TensorType

C = backends.get("c")
_why = C.unavailable_reason()
if _why:
    pytest.skip(f"the c engine needs a C compiler: {_why}", allow_module_level=True)

from opgraph.backends import c as cmod  # noqa: E402
from opgraph.backends.c.codegen import UNROLL_MAX, Entry, generate_c, write_c  # noqa: E402
from opgraph.backends.numba import BACKEND as NUMBA  # noqa: E402
from opgraph.backends.numba.assemble import Machine  # noqa: E402
from opgraph.backends.numba.machine import (  # noqa: E402
    ARITY,
    BINARY,
    OP,
    TERNARY,
    UNARY,
    VARIADIC,
    Instructions,
)

TENSCALC = os.environ.get("OPGRAPH_TENSCALC_DATA", "/work/shared/tenscalc")


@pytest.fixture(autouse=True, scope="module")
def _cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    old = os.environ.get("OPGRAPH_CACHE_DIR")
    os.environ["OPGRAPH_CACHE_DIR"] = str(tmp_path_factory.mktemp("opgraph-cache"))
    yield
    if old is None:
        os.environ.pop("OPGRAPH_CACHE_DIR", None)
    else:
        os.environ["OPGRAPH_CACHE_DIR"] = old


def numba_run(prog: Instructions, regs: np.ndarray) -> np.ndarray:
    """The reference: the numba engine's interpreter (plain Python when numba is not installed)."""
    from opgraph.backends.numba import machine

    out = regs.copy()
    try:
        machine.execute(prog, out)
    except ImportError:
        p = prog.flagged()
        machine._run(p.code, p.dst, p.a, p.b, p.c, p.n, p.mask, p.args, p.coefs, out)
    return out


def c_run(prog: Instructions, regs: np.ndarray, straight_line_max: int) -> np.ndarray:
    m = Machine(prog, len(regs), np.zeros(0), [], [])
    src, _ = write_c("t", [Entry("t", m)], straight_line_max)
    lib = cmod.build(src, "t")
    out = regs.copy()
    assert lib.t_eval(ctypes.c_void_p(out.ctypes.data)) == 0
    return out


# ---------------------------------------------------------------- the instruction set, opcode by opcode
EDGE = np.array([0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.5, -3.75, 7.0, 1e-300, 1e300, np.inf, -np.inf, np.nan,
                 0.3, 0.9999, -1.5, 3.0])


def _opcode_program() -> tuple[Instructions, np.ndarray]:
    """Every elementwise opcode over EDGE x EDGE (runs, with every mask), and every variadic opcode (short and
    past the unrolling limit), in one program."""
    k = len(EDGE)
    x = np.repeat(EDGE, k)  # all pairs
    y = np.tile(EDGE, k)
    z = np.roll(x, 5)
    n = len(x)
    regs = [x, y, z]
    base = 0
    slots = []
    for _ in regs:
        slots.append(base)
        base += n
    rows: list[tuple[int, ...]] = []
    dst = base
    for _, (code, _) in sorted(UNARY.items()):
        rows.append((code, dst, slots[0], 0, 0, n, 1))
        dst += n
    for _, (code, _) in sorted(BINARY.items()):
        rows.append((code, dst, slots[0], slots[1], 0, n, 3))
        dst += n
        rows.append((code, dst, slots[0], slots[1] + 7, 0, n, 1))  # y broadcast: a clear mask bit
        dst += n
    for _, (code, _) in sorted(TERNARY.items()):
        rows.append((code, dst, slots[0], slots[1], slots[2], n, 7))
        dst += n
        rows.append((code, dst + 0, slots[0] + 3, slots[1] + 4, slots[2] + 5, 1, 0))  # a single element
        dst += 1
    # variadic opcodes on finite operands, a short and a long operand list each
    rng = np.random.default_rng(3)
    finite = np.flatnonzero(np.isfinite(x) & (np.abs(x) < 1e10) & (np.abs(y) < 1e10) & np.isfinite(y))
    args: list[int] = []
    coefs: list[float] = []
    for name, (code, _) in sorted(VARIADIC.items()):
        for count in (3, UNROLL_MAX + 5):
            ops = rng.choice(finite, size=3 * count, replace=True).tolist()
            start = len(args)
            b = c = 0
            n_ = count
            if name == "SUMPROD":
                b = 3
                args += ops[:3 * count]
            elif name == "SSUM":
                c = len(coefs)
                coefs += rng.choice([-1.0, 1.0], size=count).tolist()
                args += ops[:count]
            elif name in ("NEGDOT", "CLP"):
                args += ops[:2 * count]
            elif name in ("RSUBDOT", "NEGDOTDIV"):
                args += ops[:2 * count + 1]
            elif name == "RSUBDOTDIV":
                args += ops[:2 * count + 2]
            else:
                args += ops[:count]
            rows.append((code, dst, start, b, c, n_, 0))
            dst += n_ if name == "GATHER" else 1
    prog = Instructions.of(rows, args, coefs)
    regs_all = np.zeros(dst)
    regs_all[:3 * n] = np.concatenate(regs)
    return prog, regs_all


@pytest.mark.parametrize("straight_line_max", [10**9, -1], ids=["straight-line", "interpreter"])
def test_every_opcode_matches_the_numba_interpreter(straight_line_max: int) -> None:
    with np.errstate(all="ignore"):
        prog, regs = _opcode_program()
        want = numba_run(prog, regs)
    got = c_run(prog, regs, straight_line_max)
    codes = set(prog.code.tolist())
    assert codes == {c for c, _ in (*UNARY.values(), *BINARY.values(), *TERNARY.values(), *VARIADIC.values())}
    # the C file's cbrt is C's (NumPy's too); the numba engine refines a power by one Newton step: within 2 ulp
    cbrt = prog.code == OP["CBRT"]
    d, n, a = int(prog.dst[cbrt][0]), int(prog.n[cbrt][0]), int(prog.a[cbrt][0])
    np.testing.assert_array_equal(got[d:d + n], np.cbrt(regs[a:a + n]))
    np.testing.assert_array_max_ulp(want[d:d + n][np.isfinite(got[d:d + n])],
                                    got[d:d + n][np.isfinite(got[d:d + n])], maxulp=2)
    want[d:d + n] = got[d:d + n]
    # libm and numba's math may differ in the last bits of transcendental functions; everything else is exact
    close = np.isclose(got, want, rtol=1e-14, atol=0, equal_nan=True)
    assert close.all(), f"{np.count_nonzero(~close)} slots differ, first at {np.flatnonzero(~close)[:5]}"
    exact = np.array_equal(got, want, equal_nan=True)
    same_bits = np.count_nonzero(got.view(np.int64) == want.view(np.int64)) / len(got)
    assert exact or same_bits > 0.999


def test_every_elementwise_opcode_has_a_c_expression_of_its_operands() -> None:
    import re

    for table in (UNARY, BINARY, TERNARY):
        for name, (code, expr) in table.items():
            used = set(re.findall(r"\b([xyz])\b", expr))
            assert used <= set("xyz"[:ARITY[code]]), name
            assert OP[name] == code


# ---------------------------------------------------------------- whole graphs
def scalar_dag(n_ops: int, n_in: int = 16, seed: int = 0) -> opgraph.Graph:
    """Scalar add/multiply/subtract/sin/cos and scalings by 0.5, each reading the previous value and an
    earlier one at random (bench/c_codegen.py's generator)."""
    rng = np.random.default_rng(seed)
    kinds = np.array([get_op(k).id for k in ("add", "multiply", "subtract", "sin", "cos", "multiply")])
    pick = rng.integers(0, len(kinds), n_ops)
    c = n_in
    first = n_in + 1
    res = first + np.arange(n_ops)
    prev = res - 1
    prev[0] = 0
    earlier = (rng.random(n_ops) * res).astype(np.int64)
    earlier[earlier == c] = 0
    scale = pick == 5
    arity = np.where((pick < 3) | scale, 2, 1)
    in_ptr = np.zeros(n_ops + 2, np.int64)
    in_ptr[2:] = np.cumsum(arity)
    in_ids = np.empty(in_ptr[-1], np.int64)
    s = in_ptr[1:-1]
    in_ids[s] = prev
    second = np.where(scale, c, earlier)
    in_ids[s[arity == 2] + 1] = second[arity == 2]
    op_attr = np.zeros(n_ops + 1, np.int32)
    op_attr[0] = 1
    outs = sorted({first + n_ops - 1, first + n_ops // 2, first + n_ops // 3})
    return opgraph.Graph.from_arrays(
        op_kind=np.concatenate([[CONST.id], kinds[pick]]).astype(np.int32), in_ptr=in_ptr, in_ids=in_ids,
        out_ptr=np.arange(n_ops + 2), out_ids=np.concatenate([[c], res]),
        value_type=np.zeros(first + n_ops, np.int32), types=[TensorType("float64", ())], op_attr=op_attr,
        attrs=[(), (("index", 0),)], constants=[np.array(0.5)], inputs=np.arange(n_in), outputs=outs)


@pytest.mark.parametrize("n_ops,straight_line_max", [(300, 2000), (5000, 2000), (300, -1)],
                         ids=["straight-line", "interpreter", "small-interpreted"])
def test_random_scalar_dags_match_numpy_and_numba(n_ops: int, straight_line_max: int) -> None:
    g = scalar_dag(n_ops, seed=n_ops + straight_line_max % 7)
    xs = [np.array(v) for v in np.random.default_rng(1).uniform(-2, 2, 16)]
    exe = C.compile_graph(g, straight_line_max=straight_line_max)
    assert ("opgraph_program_exec(r)" in exe.source) == (straight_line_max < n_ops)
    got = exe(xs)
    want = opgraph.compile(g, backend="numpy")(*xs)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        assert a.dtype == b.dtype and a.shape == b.shape
    ref = NUMBA.compile_graph(g)(xs)
    assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))  # the same operations, in order


UNARY_KINDS = ("sin", "cos", "tanh", "exp", "abs", "negative", "square", "sqrt", "log1p", "atan", "floor")
BINARY_KINDS = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "atan2", "hypot", "power")


@st.composite
def mixed_dags(draw: st.DrawFn) -> tuple[opgraph.Graph, list[np.ndarray]]:
    """A random scalar DAG of mixed kinds (comparisons and ``where`` too), each op on earlier values."""
    n_in = draw(st.integers(1, 4))
    b = opgraph.GraphBuilder()
    vals = [b.input(("float64", ()), name=f"x{i}") for i in range(n_in)]
    for _ in range(draw(st.integers(1, 40))):
        pick = draw(st.sampled_from(("unary", "binary", "where", "const")))
        a, c = (vals[draw(st.integers(0, len(vals) - 1))] for _ in range(2))
        if pick == "unary":
            vals.append(b.op(draw(st.sampled_from(UNARY_KINDS)), a))
        elif pick == "binary":
            vals.append(b.op(draw(st.sampled_from(BINARY_KINDS)), a, c))
        elif pick == "where":
            vals.append(b.op("where", b.op(draw(st.sampled_from(("less", "greater_equal", "equal"))), a, c), a, c))
        else:
            vals.append(b.op("multiply", a, draw(st.floats(-3, 3))))
    k = draw(st.integers(1, min(3, len(vals))))
    b.output(*vals[-k:])
    xs = [np.array(draw(st.floats(-4, 4))) for _ in range(n_in)]
    return b.freeze(), xs


@settings(max_examples=60, deadline=None)
@given(mixed_dags())
def test_random_mixed_dags_match_numpy(case: tuple[opgraph.Graph, list[np.ndarray]]) -> None:
    """On the one compiled interpreter (``embed=False``: no compiler run per example)."""
    g, xs = case
    with np.errstate(all="ignore"):
        want = opgraph.compile(g, backend="numpy")(*xs)
        got = C.compile_graph(g, embed=False)(xs)
    for a, w in zip(got, want, strict=True):
        assert a.dtype == w.dtype and a.shape == w.shape
        np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-300, equal_nan=True)


def test_small_tensors_bools_and_shape_ops_match_numpy() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3, 4)), name="x")
    v = b.input(("float64", (4,)), name="v")
    y = b.op("add", b.op("multiply", x, v), 1.0)
    t = b.op("permute_dims", y, axes=(1, 0))
    mask = b.op("greater", y, 0.5)
    b.output(t, b.op("where", mask, y, b.op("negative", y)), mask, b.op("sum", y, axis=1), b.op("max", y))
    g = b.freeze()
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((3, 4)), "v": rng.standard_normal(4)}
    got = opgraph.compile(g, backend="c")(**feeds)
    want = opgraph.compile(g)(**feeds)
    for a, w in zip(got, want, strict=True):
        assert a.dtype == w.dtype and a.shape == w.shape
        np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-12)
    assert "on c:" in opgraph.compile(g, backend="c").explain()


def test_concurrent_calls_of_one_executable_each_get_their_own_register_file() -> None:
    from concurrent.futures import ThreadPoolExecutor

    g = scalar_dag(3000, seed=5)
    exe = C.compile_graph(g, embed=False)
    feeds = [[np.array(v) for v in np.random.default_rng(k).uniform(-1, 1, 16)] for k in range(8)]
    want = [exe(xs) for xs in feeds]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(exe, feeds * 4))
    for k, outs in enumerate(got):
        assert all(np.array_equal(a, b) for a, b in zip(outs, want[k % len(feeds)], strict=True))


def test_the_c_engine_shares_the_numba_engines_rules_and_claims() -> None:
    assert C.rules is NUMBA.rules and C.limits is NUMBA.limits and C.dtypes == NUMBA.dtypes
    for kind in ("add", "sin", "Ssumprod", "scalars2ftensor"):
        if kind in C.rules:
            assert C.rule_module(kind) == NUMBA.rule_module(kind) == f"opgraph.backends.numba.{get_op(kind).family}"
    g = scalar_dag(50)
    assert C.claims(g) and NUMBA.claims(g)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 2)))
    b.output(b.op("matmul", x, x))
    assert C.claims(b.freeze()) == NUMBA.claims(b.freeze())


# ---------------------------------------------------------------- compiling: cache, errors, no compiler
def test_a_compiled_program_is_cached_by_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    g = scalar_dag(40, seed=11)
    xs = [np.array(float(i)) for i in range(16)]
    first = C.compile_graph(g)(xs)
    so = sorted(Path(cmod.cache_dir()).glob("*.so"))
    assert so
    monkeypatch.setattr(cmod, "_LIBS", {})  # a fresh process: the library comes from the disk cache

    def no_compiler(*a: Any, **k: Any) -> Any:
        raise AssertionError("the compiler ran again")

    monkeypatch.setattr(cmod.subprocess, "run", no_compiler)
    again = C.compile_graph(g)(xs)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert sorted(Path(cmod.cache_dir()).glob("*.so")) == so


def test_compiler_errors_name_the_c_file_and_the_first_error() -> None:
    with pytest.raises(BackendError) as info:
        cmod.build("int broken(void) { return undeclared_name; }\n", "broken")
    msg = str(info.value)
    assert "undeclared_name" in msg and ".c" in msg and "\n" not in msg
    path = msg.split(" failed on ")[1].split(": ")[0]
    assert os.path.exists(path) and "undeclared_name" in Path(path).read_text()


def test_a_cache_that_cannot_be_written_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(blocker))
    with pytest.raises(BackendError, match=f"cannot write its cache {blocker}/c"):
        cmod.build("int doc_unwritable(void) { return 1; }\n", "unwritable")


def test_without_a_compiler_the_engine_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-anywhere")
    assert C.unavailable_reason() == "no C compiler (no-such-compiler-anywhere) on PATH"
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PATH", "")
    assert C.unavailable_reason() == "no C compiler (cc) on PATH"
    b = opgraph.GraphBuilder()
    b.output(b.op("exp", b.input(("float64", ()))))
    with pytest.raises(BackendError, match=r"^no C compiler \(cc\) on PATH$"):
        opgraph.compile(b.freeze(), backend="c")


def test_names_that_are_no_c_identifiers_are_refused() -> None:
    g = scalar_dag(5)
    with pytest.raises(BackendError, match="'my-prog' is not a C identifier"):
        generate_c(g, name="my-prog")
    with pytest.raises(BackendError, match="'get y'"):
        generate_c(g, targets={"get y": [int(g.outputs[0])]})
    with pytest.raises(BackendError, match="asks for no entry point"):
        generate_c(g, targets={})


# ---------------------------------------------------------------- TensCalc's files through compiled C
def _tenscalc_cases() -> list[str]:
    if not os.path.isdir(TENSCALC):
        return []
    return sorted(d for d in os.listdir(TENSCALC) if os.path.isfile(os.path.join(TENSCALC, d, "reference.json")))


@pytest.mark.parametrize("case", _tenscalc_cases())
def test_tenscalc_scalarized_files_reproduce_reference_through_c(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import test_ops_tenscalc as tc
    from opgraph.runtime.executor import execute

    graph = opgraph.io.load(os.path.join(TENSCALC, case, "scalarized"))
    gateways = {gw.name: ({"set": 1, "get": 2, "copy": 3}[gw.kind], list(gw.values), list(gw.destinations))
                for gw in opgraph.io.cg.gateways(graph)}
    monkeypatch.setattr(tc, "execute", functools.partial(execute, backend="c"))
    report = tc.replay(graph, gateways, tc._reference(case)["steps"])
    assert report and all(diff <= 1e-12 for _, _, diff in report)
    assert any(p.suffix == ".so" for p in Path(cmod.cache_dir()).iterdir())


# ---------------------------------------------------------------- the CLI's files, linked into a C program
MAIN_C = r"""
#include <stdio.h>
#include "prog.h"
int main(void) {
    double x[6] = {0.5, -1.0, 2.0, 0.25, 3.0, -0.75}, s[1] = {1.5};
    double y[6], t[1], y2[6], t2[1], work[prog_WORK_SIZE];
    const double *ins[2] = {x, s};
    double *outs[2] = {y, t}, *outs2[2] = {y2, t2};
    int i;
    if (prog_n_inputs != 2 || prog_input_sizes[0] != 6 || prog_n_outputs != 2 || prog_output_sizes[0] != 6)
        return 3;
    if (prog_run(ins, outs)) return 1;
    if (prog_run(ins, outs)) return 1;  /* a second call: the static register file is reused */
    prog_init_ws(work);
    if (prog_run_ws(ins, outs2, work)) return 2;
    for (i = 0; i < 6; i++) printf("%.17g %.17g\n", y[i], y2[i]);
    printf("%.17g %.17g\n", t[0], t2[0]);
    return 0;
}
"""


@pytest.mark.parametrize("straight_line_max", ["2000", "0"])
def test_cli_codegen_writes_c_that_links_and_prints_numpys_numbers(tmp_path: Path, straight_line_max: str) -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3)), name="x")
    s = b.input(("float64", ()), name="s")
    y = b.op("tanh", b.op("add", b.op("multiply", x, s), b.op("exp", x)))
    b.output(y, b.op("sum", b.op("sqrt", b.op("square", y))))
    g = b.freeze()
    opgraph.io.save(g, str(tmp_path / "g.json"))
    from opgraph.cli.main import main

    assert main(["codegen", str(tmp_path / "g.json"), "-o", str(tmp_path / "prog.c"),
                 "--straight-line-max", straight_line_max]) == 0
    (tmp_path / "main.c").write_text(MAIN_C)
    cc = cmod.compiler()
    assert cc is not None
    subprocess.run([*cc, "-std=c99", "-Wall", "-Werror=implicit-function-declaration", "-c", "prog.c"],
                   cwd=tmp_path, check=True)
    subprocess.run([*cc, "-std=c99", "-O2", "-o", "prog", "main.c", "prog.c", "-lm"], cwd=tmp_path, check=True)
    done = subprocess.run([str(tmp_path / "prog")], capture_output=True, text=True, check=True)
    rows = np.array([[float(v) for v in ln.split()] for ln in done.stdout.splitlines()])
    xv = np.array([[0.5, -1.0, 2.0], [0.25, 3.0, -0.75]])
    want_y = np.tanh(xv * 1.5 + np.exp(xv))
    np.testing.assert_allclose(rows[:6, 0], want_y.ravel(), rtol=1e-15)
    np.testing.assert_allclose(rows[6, 0], np.sum(np.sqrt(want_y**2)), rtol=1e-14)
    np.testing.assert_array_equal(rows[:, 0], rows[:, 1])  # prog_run and prog_run_ws agree


def test_cli_codegen_of_a_cg_file_set_has_one_entry_per_get_gateway(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    case = os.path.join(TENSCALC, "linalg")
    if not os.path.isdir(case):
        pytest.skip(f"TensCalc's files are not here ({TENSCALC})")
    ref = json.loads(Path(case, "reference.json").read_text())
    sets = {step["gateway"]: step for step in ref["steps"] if step["op"] == "set"}  # shapes (each set has one)
    from opgraph.cli.main import main

    shapes = [f"--input-shape={gw}=" + ",".join(str(d) for d in step["shape"]) for gw, step in sets.items()]
    assert main(["codegen", os.path.join(case, "scalarized"), "-o", str(tmp_path / "tc.c"), *shapes]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith(f"wrote {tmp_path / 'tc.c'}") and out[1].startswith("wrote ")
    header = (tmp_path / "tc.h").read_text()
    graph = opgraph.io.load(os.path.join(case, "scalarized"))
    gets = [gw.name for gw in opgraph.io.cg.gateways(graph) if gw.kind == "get"]
    assert gets and all(f"int tc_{name}_run(const double *const *inputs" in header for name in gets)
    # the file compiles on its own, and each entry computes TensCalc's values (through ctypes)
    lib = cmod.build((tmp_path / "tc.c").read_text(), "tc")
    position = {int(v): i for i, v in enumerate(graph.inputs.tolist())}
    set_input = {gw.name: position[gw.values[0]] for gw in opgraph.io.cg.gateways(graph) if gw.kind == "set"}
    inputs: list[np.ndarray | None] = [None] * len(position)
    checked = 0
    for step in ref["steps"]:
        if step["op"] == "set":
            inputs[set_input[step["gateway"]]] = np.ascontiguousarray(np.array(step["value"], dtype=np.float64))
            continue
        assert step["op"] == "get" and all(a is not None for a in inputs)
        in_ptrs = (ctypes.c_void_p * len(inputs))(*[a.ctypes.data for a in inputs])  # type: ignore[union-attr]
        outs = [np.zeros(int(np.prod(o["shape"]))) for o in step["outputs"]]
        out_ptrs = (ctypes.c_void_p * len(outs))(*[a.ctypes.data for a in outs])
        assert getattr(lib, f"tc_{step['gateway']}_run")(in_ptrs, out_ptrs) == 0
        for got, want in zip(outs, step["outputs"], strict=True):
            np.testing.assert_allclose(got, np.ravel(want["value"]), rtol=0, atol=1e-12)
            checked += 1
    assert checked


def test_cli_codegen_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from opgraph.cli.main import main

    assert main(["codegen", str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.c")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.json" in err
    b = opgraph.GraphBuilder()
    b.output(b.op("exp", b.input(("float64", (2,)), name="x")))
    opgraph.io.save(b.freeze(), str(tmp_path / "g.json"))
    assert main(["codegen", str(tmp_path / "g.json"), "-o", str(tmp_path / "x.c"), "--targets", "bad"]) == 2
    assert main(["codegen", str(tmp_path / "g.json"), "-o", str(tmp_path / "x.c"), "--name", "no-c"]) == 1
    err = capsys.readouterr().err
    assert "--targets expects ENTRY=V1,V2" in err and "'no-c' is not a C identifier" in err
    assert not (tmp_path / "x.c").exists() and not (tmp_path / "x.h").exists()
