"""Engines against NumPy at the edges: NaN, +-inf, +-0 and subnormal inputs.

For every engine installed (numpy's whole-graph compile, jax, torch, onnxruntime, dask) and every op of the
elementwise, reduction and contraction families whose type rule takes float inputs of shape (n,) or (n, n)
with its default attributes, one graph per (op, dtype) is compiled once per engine and run on all the edge
values packed in one array (each pair of them for a binary op, so an edge value meets every other on either
side). The reference is the plain executor (``Graph.run``: the reference kernels, NumPy). Per output element:
NaN where NumPy has NaN, +inf and -inf where NumPy has them, finite values within a tolerance by dtype.

Where an engine disagrees, its declared difference (:attr:`Backend.numerics`) must cover exactly that op
and explain exactly what happens: for ``"ftz"`` (subnormals flushed to zero), the engine's result equals
NumPy's on inputs whose subnormals are replaced by zeros of the same sign, with subnormal results flushed
too. An undeclared difference, or a declared one the engine does not behave as declared, fails.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph import backends
from opgraph.backends.base import OpInfo
from opgraph.core.registry import CONST, get_op
from opgraph.errors import GraphError

ENGINES = [n for n in ("numpy", "jax", "torch", "onnxruntime", "dask") if n in backends.available()]
DTYPES = ("float32", "float64")
FAMILIES = ("elementwise", "reduction", "contraction")
RTOL = {"float32": 2e-5, "float64": 1e-9}


def edge_values(dtype: str) -> np.ndarray:
    """NaN, +-inf, +-0, the smallest and mid-range subnormals of both signs, the largest subnormal, the smallest
    normal, ordinary values, 0.5 (a divisor whose quotient with the largest value overflows) and the largest."""
    fi = np.finfo(dtype)
    tiny_sub = fi.smallest_subnormal
    mid_sub = np.asarray(fi.smallest_normal, dtype) * np.asarray(2.0 ** -(fi.nmant // 2), dtype)
    max_sub = np.nextafter(np.asarray(fi.smallest_normal, dtype), np.asarray(0, dtype))
    vals = [np.nan, np.inf, -np.inf, 0.0, -0.0, tiny_sub, -tiny_sub, mid_sub, -mid_sub, max_sub,
            fi.smallest_normal, -fi.smallest_normal, 1.0, -1.0, 0.5, -2.5, 3.0, 1e30, -1e30, fi.max, -fi.max]
    return np.array(vals, dtype=dtype)


def is_subnormal(a: np.ndarray) -> np.ndarray:
    """True where ``a`` (a float array) is subnormal (not zero)."""
    return (a != 0) & (np.abs(a) < np.finfo(a.dtype).smallest_normal)


def flush(a: np.ndarray) -> np.ndarray:
    """``a`` with every subnormal replaced by a zero of its sign (what FTZ/DAZ does)."""
    if not isinstance(a, np.ndarray) or a.dtype.kind != "f":
        return a
    return np.where(is_subnormal(a), np.copysign(np.zeros_like(a), a), a)


def case_inputs(op: opgraph.OpDef, dtype: str) -> list[np.ndarray] | None:
    """The packed edge-value inputs of ``op`` (None: its type rule takes no float inputs of these shapes).

    Elementwise: every tuple of edge values, one per position (1-D). Others: (m, m) matrices whose first column
    (first input) or first row (second input) holds the edge values and the rest ordinary numbers, so row i of
    a reduction along the last axis, and entry (i, j) of a product, meets edge value i (and j) and no other.
    """
    e = edge_values(dtype)
    m = len(e)
    arity = op.arity if op.arity is not None else max(op.min_inputs, 1)
    if op.elementwise:
        grid = [g.ravel() for g in np.meshgrid(*([e] * arity), indexing="ij")]
        return [np.ascontiguousarray(g) for g in grid]
    rng = np.random.default_rng(0)
    first = rng.uniform(0.5, 2.0, (m, m)).astype(dtype)
    first[:, 0] = e
    if arity == 1:
        return [first]
    second = rng.uniform(0.5, 2.0, (m, m)).astype(dtype)
    second[0, :] = e
    return [first, second][:arity] if arity == 2 else None


def build(op: opgraph.OpDef, arrays: list[np.ndarray]) -> opgraph.Graph | None:
    """The one-op graph of ``op`` on inputs like ``arrays`` (reductions along the last axis), or None where the
    type rule refuses them or the op needs an attribute without a default."""
    attrs: dict[str, Any] = {"axis": -1} if "axis" in op.attrs and not op.elementwise else {}
    b = opgraph.GraphBuilder()
    xs = [b.input((str(a.dtype), a.shape), name=f"x{i}") for i, a in enumerate(arrays)]
    try:
        out = b.op(op.name, *xs, **attrs)
    except (GraphError, TypeError, ValueError):
        return None
    b.output(*(out if isinstance(out, tuple) else (out,)))
    return b.freeze()


@cache
def cases() -> list[tuple[str, str, opgraph.Graph, tuple[np.ndarray, ...]]]:
    """(op, dtype, graph, inputs) for every op of the families whose type rule takes the edge inputs."""
    out = []
    for op in opgraph.all_ops():
        if op.family not in FAMILIES:
            continue
        for dtype in DTYPES:
            arrays = case_inputs(op, dtype)
            graph = build(op, arrays) if arrays is not None else None
            if graph is not None:
                out.append((op.name, dtype, graph, tuple(arrays)))
    return out


def reference(graph: opgraph.Graph, arrays: tuple[np.ndarray, ...],
              prep: Callable[[np.ndarray], np.ndarray] = lambda a: a) -> list[np.ndarray]:
    """NumPy's results (the plain executor's reference kernels) on ``prep`` of the inputs, ``prep`` of them."""
    with np.errstate(all="ignore"):
        got = graph.run({f"x{i}": prep(a) for i, a in enumerate(arrays)})
    return [prep(np.asarray(r)) for r in got]


def mismatch(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """True where ``got`` disagrees with ``want``: NaN, +inf or -inf placement, or a finite value out of
    tolerance (subnormal results flushed to zero count: the absolute tolerance is below the mid-range
    subnormals); exact for integers and bools."""
    got = np.asarray(got)
    if got.shape != want.shape or got.dtype != want.dtype:
        return np.ones(want.shape, dtype=bool)
    if want.dtype.kind != "f":
        return np.asarray(got != want)
    fi = np.finfo(want.dtype)
    bad = (np.isnan(got) != np.isnan(want)) | ((got == np.inf) != (want == np.inf))
    bad |= (got == -np.inf) != (want == -np.inf)
    finite = np.isfinite(got) & np.isfinite(want)
    atol = float(fi.smallest_normal) * 2.0 ** -(fi.nmant // 2 + 2)
    with np.errstate(all="ignore"):
        close = np.abs(got.astype(np.float64) - want) <= atol + RTOL[want.dtype.name] * np.abs(want.astype(np.float64))
    return np.asarray(bad | (finite & ~close))


@cache
def program(engine: str, op: str, dtype: str) -> Any:
    graph = next(g for o, d, g, _ in cases() if (o, d) == (op, dtype))
    return opgraph.compile(graph, backend=engine)


def differences(engine: str, graph: opgraph.Graph) -> list[Any]:
    """The engine's declared numerics differences that concern the op of ``graph``."""
    be = backends.get(engine)
    return [d for op in range(graph.num_ops) if graph.op_kind[op] != CONST.id
            for d in be.numerics_for(OpInfo.of(graph, op))]


def declared_class(decl: Any, op: str, graph: opgraph.Graph, arrays: tuple[np.ndarray, ...],
                   want: list[np.ndarray]) -> list[np.ndarray]:
    """Per output, where ``decl`` says the engine may differ: the positions whose operands are in its input class
    (elementwise ops), or (other ops) the outputs that depend on an input element in the class: those NumPy's
    result changes at when the class's elements are made NaN, or 0. FTZ also covers subnormal results."""
    if get_op(op).elementwise:
        mask = np.asarray(decl.where(list(arrays)))
        masks = [np.broadcast_to(mask, w.shape) for w in want]
    else:
        masks = [np.zeros(w.shape, dtype=bool) for w in want]
        for mark in (np.nan, 0.0):  # NaN reaches what sums and products of the class give; 0 what truth tests do
            tainted = tuple(np.where(decl.where([a]), np.asarray(mark, a.dtype), a) for a in arrays)
            masks = [m | mismatch(t, w) for m, t, w in zip(masks, reference(graph, tainted), want, strict=True)]
    if decl.tag == "ftz":
        masks = [m | (is_subnormal(w) if w.dtype.kind == "f" else False) for m, w in zip(masks, want, strict=True)]
    return masks


def describe(graph: opgraph.Graph, arrays: tuple[np.ndarray, ...], got: list[np.ndarray],
             want: list[np.ndarray], bad: list[np.ndarray]) -> str:
    lines = []
    for i, (g, w, m) in enumerate(zip(got, want, bad, strict=True)):
        for pos in list(zip(*np.nonzero(m), strict=True))[:6]:
            ins = [a[pos] if a.shape == m.shape else "..." for a in arrays]
            lines.append(f"output {i} at {tuple(int(p) for p in pos)}: inputs {ins}: got {np.asarray(g)[pos]!r}, "
                         f"NumPy {w[pos]!r}")
        lines.append(f"output {i}: {int(m.sum())} of {m.size} elements differ")
    return "\n".join(lines)


@pytest.mark.parametrize("engine", ENGINES)
def test_edge_values_match_numpy_or_the_declared_difference(engine: str) -> None:
    failures = []
    checked = differing = 0
    for op, dtype, graph, arrays in cases():
        feeds = {f"x{i}": a for i, a in enumerate(arrays)}
        want = reference(graph, arrays)
        with np.errstate(all="ignore"):
            got = program(engine, op, dtype)(feeds)
        bad = [mismatch(g, w) for g, w in zip(got, want, strict=True)]
        checked += 1
        if not any(m.any() for m in bad):
            continue
        differing += 1
        declared = differences(engine, graph)
        allowed = [np.zeros(w.shape, dtype=bool) for w in want]
        for decl in declared:
            allowed = [a | m for a, m in zip(allowed, declared_class(decl, op, graph, arrays, want), strict=True)]
        outside = [b & ~a for b, a in zip(bad, allowed, strict=True)]
        if any(m.any() for m in outside):
            what = "no declared difference covers it" if not declared else \
                f"outside the input class of {[d.note() for d in declared]}"
            failures.append(f"{op} {dtype}: differs from NumPy, {what}:\n{describe(graph, arrays, got, want, outside)}")
    assert checked >= 150
    assert differing or not backends.get(engine).numerics, f"{engine} declares differences the suite never meets"
    assert not failures, f"{engine}: {len(failures)} of {checked} graphs differ:\n" + "\n".join(failures)


def test_flush_to_zero_is_what_jax_does_on_cpu() -> None:
    """jax's declared ftz is XLA's flush to zero: on the ops whose NumPy kernels have no intermediate to underflow,
    its result is exactly NumPy's on the operands with subnormals flushed, results flushed too."""
    if "jax" not in ENGINES:
        pytest.skip("jax is not installed")  # the other engines' tests still run
    seen = 0
    for op, dtype, graph, arrays in cases():
        if op not in ("multiply", "divide", "add", "log", "sqrt", "less", "fmod", "matmul", "maximum"):
            continue
        with np.errstate(all="ignore"):
            got = program("jax", op, dtype)({f"x{i}": a for i, a in enumerate(arrays)})
        want = reference(graph, arrays)
        flushed = reference(graph, arrays, flush)
        assert any(mismatch(g, w).any() for g, w in zip(got, want, strict=True)), f"{op} {dtype}: no difference"
        for g, f in zip(got, flushed, strict=True):
            assert not mismatch(flush(np.asarray(g)), f).any(), f"{op} {dtype}: not NumPy's flushed result"
        seen += 1
    assert seen == 18


def test_the_suite_covers_the_families() -> None:
    names = {o for o, _d, _g, _a in cases()}
    for must in ("multiply", "divide", "fmod", "remainder", "log", "sqrt", "sum", "matmul", "atan2", "less"):
        assert must in names
    assert not any(itertools.chain.from_iterable(is_subnormal(edge_values(d)[:5]) for d in DTYPES))
    assert all(is_subnormal(edge_values(d)).sum() == 5 for d in DTYPES)


# ---------------------------------------------------------------- where the declarations show
def _graph(dtype: str, kind: str) -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input((dtype, (4,)), name="x")
    b.output(b.op(kind, x, x))
    return b.freeze()


def _subnormal_feeds() -> dict[str, np.ndarray]:
    return {"x": np.array([5e-324, -5e-324, 1e-310, 2.0])}


needs_jax = pytest.mark.skipif("jax" not in ENGINES, reason="jax is not installed (its declaration is checked there)")


@needs_jax
def test_jax_declares_ftz_and_explain_names_it() -> None:
    be = backends.get("jax")
    assert [d.tag for d in be.numerics] == ["ftz"]
    g = _graph("float64", "multiply")
    assert be.differs_from_numpy(g) == {"ftz": [0]}
    assert be.differs_from_numpy(g, "cuda:0") == {}  # XLA on GPU keeps subnormals
    assert be.differs_from_numpy(_graph("int64", "multiply")) == {}
    text = opgraph.compile(g, backend="jax").explain()
    assert "numerics: jax differs from NumPy on 1 op(s) here (multiply): ftz (cpu): subnormal" in text
    assert "numerics" not in opgraph.compile(_graph("int64", "multiply"), backend="jax").explain()
    if "torch" in ENGINES:
        assert "numerics" not in opgraph.compile(g, backend="torch").explain()


@needs_jax
def test_auto_leaves_out_an_engine_that_changes_this_graphs_results() -> None:
    g, feeds = _graph("float64", "multiply"), _subnormal_feeds()
    f = opgraph.compile(g, backend="auto", example_inputs=feeds, budget=0.2, candidates=("numpy", "jax"))
    assert f.choice.backend == "numpy" and "jax" not in f.choice.timings
    assert "jax left out (1 op(s) (multiply) would change: ftz (cpu)" in f.explain()
    assert "allow_numerics=('ftz',)" in f.explain()
    np.testing.assert_array_equal(f(feeds)[0], g.run(feeds)[0])  # subnormal products kept, as NumPy gives them
    with pytest.raises(backends.BackendError, match=r"jax: 1 op.*ftz"):
        opgraph.compile(g, backend="auto", example_inputs=feeds, budget=0.2, candidates=("jax",))


@needs_jax
def test_auto_times_the_engine_when_the_difference_is_allowed() -> None:
    g, feeds = _graph("float64", "multiply"), _subnormal_feeds()
    f = opgraph.compile(g, backend="auto", example_inputs=feeds, budget=0.2, candidates=("numpy", "jax"),
                        allow_numerics=("ftz",))
    assert f.choice.timings["jax"] is not None and not f.choice.excluded
    only = opgraph.compile(g, backend="auto", budget=0.2, candidates=("jax",), allow_numerics=True)
    got = only(feeds)[0]  # chosen on the first call
    assert only.choice.backend == "jax" and "numerics: jax differs from NumPy" in only.explain()
    np.testing.assert_array_equal(got, flush(g.run(feeds)[0]))  # what was allowed: subnormals flushed


@needs_jax
def test_auto_keeps_every_engine_for_a_graph_without_such_ops() -> None:
    g = _graph("int64", "multiply")
    f = opgraph.compile(g, backend="auto", example_inputs={"x": np.arange(4)}, budget=0.2,
                        candidates=("numpy", "jax"))
    assert not f.choice.excluded and f.choice.timings["jax"] is not None


@pytest.mark.skipif("torch" not in ENGINES, reason="torch is not installed")
@pytest.mark.parametrize("kind", ["fmod", "remainder"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_fmod_and_remainder_are_numpys_bit_for_bit(kind: str, dtype: str) -> None:
    """Signs of zero included, over 64 elements (torch's vectorised kernel), quotients that overflow included."""
    e = edge_values(dtype)
    fi = np.finfo(dtype)
    rng = np.random.default_rng(1)
    span = rng.integers(fi.minexp - fi.nmant, fi.maxexp, (2, 4096))
    wide = np.ldexp(rng.uniform(0.5, 1.0, span.shape), span) * rng.choice([-1.0, 1.0], span.shape)
    a = np.concatenate([np.repeat(e, len(e)), wide[0]]).astype(dtype)
    b = np.concatenate([np.tile(e, len(e)), wide[1]]).astype(dtype)
    bld = opgraph.GraphBuilder()
    bld.output(bld.op(kind, bld.input((dtype, a.shape), name="a"), bld.input((dtype, b.shape), name="b")))
    got = opgraph.compile(bld.freeze(), backend="torch")(a=a, b=b)[0]
    with np.errstate(all="ignore"):
        want = getattr(np, kind)(a, b)
    assert want[(a == fi.max) & (b == 0.5)][0] == 0  # the quotient overflows: torch's kernel gave NaN
    same = (got.view(f"u{fi.bits // 8}") == want.view(f"u{fi.bits // 8}")) | (np.isnan(got) & np.isnan(want))
    assert same.all(), list(zip(a[~same][:5], b[~same][:5], got[~same][:5], want[~same][:5], strict=True))
