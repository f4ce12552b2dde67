"""compile_elementwise: elementwise regions as one parallel numba loop, checked bit for bit against NumPy.

The reference is NumPy itself: every op of the graph applied with its ufunc (``np.where``, ``astype``) in the
test, never the code under test. Each distinct program costs a numba compilation (seconds), so the random
programs are few and each is large (several inputs and outputs, scalars, constants, every dtype path).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opgraph
from opgraph.errors import ArgumentError

pytest.importorskip("numba")

from opgraph.backends.numba import fused

N = 3 * fused.BLOCK + 17  # several blocks, a partial last one

UNARY = {"negative": np.negative, "abs": np.abs, "square": np.square, "sqrt": np.sqrt, "exp": np.exp,
         "log": np.log, "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "floor": np.floor,
         "reciprocal": np.reciprocal, "expm1": np.expm1, "atan": np.arctan, "round": np.rint}
BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
          "maximum": np.maximum, "minimum": np.minimum, "hypot": np.hypot, "atan2": np.arctan2,
          "power": np.power}
COMPARE = {"less": np.less, "greater_equal": np.greater_equal, "equal": np.equal, "not_equal": np.not_equal}
SPECIAL = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-40, -3e38, 88.7, -100.0, 1e5, 0.5]


def same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal dtype, shape and bits; a NaN equals a NaN whatever its payload."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if got.dtype.kind != "f":
        return bool((got == want).all())
    nan = np.isnan(want)
    u = f"u{got.dtype.itemsize}"
    return bool((np.isnan(got) == nan).all() and (got[~nan].view(u) == want[~nan].view(u)).all())


def data(rng: np.random.Generator, dtype: Any, shape: tuple[int, ...], special: float) -> np.ndarray:
    """Normal values of varied magnitude with a share ``special`` of NaN, infinities, signed zeros, subnormals."""
    n = int(np.prod(shape))
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-2, 3, n)
    pick = rng.random(n) < special
    x[pick] = rng.choice(SPECIAL, int(pick.sum()))
    return x.astype(dtype).reshape(shape)


# ---------------------------------------------------------------- random programs
@st.composite
def programs(draw: Any) -> tuple[list[tuple[Any, ...]], int]:
    """Steps over values 0 (x), 1 (y), 2 (scalar s), 3 (a scalar constant): (kind, refs...) or ("cast", ref)."""
    n = draw(st.integers(4, 12))
    steps: list[tuple[Any, ...]] = []
    for i in range(n):
        avail = 4 + i
        ref = st.integers(0, avail - 1)
        pick = draw(st.sampled_from(["unary", "binary", "binary", "where", "cast"]))
        if pick == "unary":
            steps.append((draw(st.sampled_from(sorted(UNARY))), draw(ref)))
        elif pick == "binary":
            steps.append((draw(st.sampled_from(sorted(BINARY))), draw(ref), draw(ref)))
        elif pick == "where":
            steps.append(("where", draw(st.sampled_from(sorted(COMPARE))), draw(ref), draw(ref), draw(ref),
                          draw(ref)))
        else:
            steps.append(("cast", draw(ref)))
    return steps, draw(st.integers(1, 3))


def build(steps: list[tuple[Any, ...]], n_out: int, dtype: Any, shape: tuple[int, ...],
          const: float) -> tuple[Any, list[Any]]:
    """The graph of ``steps`` and, per step, the same step as a NumPy call on the list of values so far."""
    other = np.float64 if np.dtype(dtype) == np.float32 else np.float32
    b = opgraph.GraphBuilder()
    vals = [b.input((dtype, shape), name="x"), b.input((dtype, shape), name="y"), b.input((dtype, ()), name="s"),
            b.constant(np.asarray(const, dtype))]
    fns: list[Any] = []
    for kind, *refs in steps:
        if kind == "cast":
            (r,) = refs
            to = np.dtype(other if b.type_of(vals[r]).dtype == np.dtype(dtype) else dtype)  # type: ignore[union-attr]
            vals.append(b.op("cast", vals[r], dtype=to.name))
            fns.append(lambda env, r=r, to=to: env[r].astype(to))
        elif kind == "where":
            cmp, c1, c2, t, f = refs
            vals.append(b.op("where", b.op(cmp, vals[c1], vals[c2]), vals[t], vals[f]))
            fns.append(lambda env, c=COMPARE[cmp], c1=c1, c2=c2, t=t, f=f: np.where(c(env[c1], env[c2]), env[t],
                                                                                     env[f]))
        else:
            vals.append(b.op(kind, *[vals[r] for r in refs]))
            fns.append(lambda env, u=(UNARY | BINARY)[kind], refs=tuple(refs): u(*[env[r] for r in refs]))
    for v in vals[-n_out:]:
        b.output(v)
    return b.freeze(), fns


def reference(fns: list[Any], n_out: int, feeds: list[np.ndarray], const: np.ndarray) -> list[np.ndarray]:
    env: list[np.ndarray] = [*feeds, const]
    with np.errstate(all="ignore"):
        for fn in fns:
            env.append(np.asarray(fn(env)))
    return env[-n_out:]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(prog=programs(), seed=st.integers(0, 2**31), const=st.sampled_from([0.5, -2.0, 3.0, np.inf]))
def test_random_programs_bit_identical(dtype: Any, prog: tuple[list[Any], int], seed: int, const: float) -> None:
    steps, n_out = prog
    g, fns = build(steps, n_out, dtype, (N,), const)
    assert fused.elementwise_region(g) is None
    rng = np.random.default_rng(seed)
    feeds = [data(rng, dtype, (N,), 0.1), data(rng, dtype, (N,), 0.1), data(rng, dtype, (), 0.0)]
    want = reference(fns, n_out, feeds, np.asarray(const, dtype))
    for threads in (1, 2):
        fn = fused.compile_elementwise(g, threads=threads)
        assert fn is not None
        got = fn(list(feeds))
        assert len(got) == n_out
        for k, (a, w) in enumerate(zip(got, want, strict=True)):
            w = np.broadcast_to(w, a.shape) if w.shape != a.shape else w
            assert same(a, w), (threads, k, steps)


# ---------------------------------------------------------------- fixed cases
def test_scalar_broadcast_and_specials_2d() -> None:
    """A 2-D region: scalars (input, constant, a scalar-only step) broadcast, NaN and infinities flow."""
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (37, 301)), name="x")
    s = b.input(("float32", ()), name="s")
    t = b.op("exp", b.op("multiply", s, b.constant(np.float32(0.5))))  # scalar-only: computed once
    y = b.op("add", b.op("sin", x), t)
    z = b.op("where", b.op("greater", x, s), y, b.op("tanh", x))
    b.output(z)
    b.output(t)
    b.output(x)
    g = b.freeze()
    rng = np.random.default_rng(1)
    xv = data(rng, np.float32, (37, 301), 0.2)
    sv = np.asarray(0.25, np.float32)
    with np.errstate(all="ignore"):
        tv = np.exp(sv * np.float32(0.5))
        want = np.where(xv > sv, np.sin(xv) + tv, np.tanh(xv))
    for threads in (1, 2):
        got = fused.compile_elementwise(g, threads=threads)([xv, sv])  # type: ignore[misc]
        assert same(got[0], want) and same(got[1], tv) and same(got[2], xv)
        assert got[2] is not xv  # an output is a fresh array, not the caller's input


def test_integer_bool_and_casts() -> None:
    """Integer arithmetic (NumPy's loops, wrapping), bool logic, casts between kinds."""
    b = opgraph.GraphBuilder()
    i = b.input(("int32", (5000,)), name="i")
    j = b.input(("int64", (5000,)), name="j")
    f = b.input(("float64", (5000,)), name="f")
    s = b.op("multiply", b.op("add", i, j), b.constant(np.int64(3)))  # int32 + int64: int64
    r = b.op("remainder", s, b.constant(np.int64(7)))
    m = b.op("logical_and", b.op("less", f, b.op("cast", i, dtype="float64")),
             b.op("not_equal", r, b.constant(np.int64(0))))
    out = b.op("where", m, b.op("cast", r, dtype="float32"), b.op("cast", f, dtype="float32"))
    b.output(out)
    b.output(b.op("cast", m, dtype="int8"))
    b.output(b.op("cast", f, dtype="bool"))
    g = b.freeze()
    assert fused.elementwise_region(g) is None
    rng = np.random.default_rng(2)
    iv = rng.integers(-2**31, 2**31, 5000, dtype=np.int64).astype(np.int32)
    jv = rng.integers(-2**62, 2**62, 5000, dtype=np.int64)
    fv = data(rng, np.float64, (5000,), 0.2)
    sv = (iv + jv) * np.int64(3)
    rv = np.remainder(sv, np.int64(7))
    mv = (fv < iv.astype(np.float64)) & (rv != 0)
    got = fused.compile_elementwise(g, threads=2)([iv, jv, fv])  # type: ignore[misc]
    assert same(got[0], np.where(mv, rv.astype(np.float32), fv.astype(np.float32)))
    assert same(got[1], mv.astype(np.int8))
    assert same(got[2], fv.astype(bool))


def test_fused_elementwise_op() -> None:
    """A fused_elementwise op (what optimize makes of a chain) is part of a region: its steps run inline."""
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (N,)), name="x")
    k = b.constant(np.float32(1.5))
    program = (("sin", -1), ("multiply", 0, -2), ("tanh", 1), ("exp", 2), ("subtract", 3, -2), ("log", 4))
    b.output(b.op("add", b.op("fused_elementwise", x, k, program=program), x))
    g = b.freeze()
    xv = data(np.random.default_rng(3), np.float32, (N,), 0.05)
    with np.errstate(all="ignore"):
        want = np.log(np.exp(np.tanh(np.sin(xv) * np.float32(1.5))) - np.float32(1.5)) + xv
    assert same(fused.compile_elementwise(g)([xv])[0], want)  # type: ignore[misc]


def test_fast_math_within_ulps_and_exact_on_out_of_range_blocks() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (N,)), name="x")
    y = b.op("tanh", b.op("exp", b.op("multiply", b.op("sin", x), b.constant(np.float32(2.0)))))
    b.output(y)
    b.output(b.op("log", b.op("abs", x)))
    g = b.freeze()
    xv = data(np.random.default_rng(4), np.float32, (N,), 0.0)
    xv[fused.BLOCK + 5] = np.nan  # the second block: NumPy's kernels, exactly
    with np.errstate(all="ignore"):
        wants = [np.tanh(np.exp(np.sin(xv) * np.float32(2.0))), np.log(np.abs(xv))]
    gots = fused.compile_elementwise(g, fast_math=True, threads=2)([xv])  # type: ignore[misc]
    blk = slice(fused.BLOCK, 2 * fused.BLOCK)
    for got, want, bound in zip(gots, wants, (16, fused.APPROX_ULP["log"]), strict=True):
        assert same(got[blk], want[blk])
        ok = np.isfinite(want)
        assert (np.isfinite(got) == ok).all()
        ia = got[ok].view(np.int32).astype(np.int64)
        ib = want[ok].view(np.int32).astype(np.int64)
        assert 0 < np.abs(ia - ib).max() <= bound  # approximated (not NumPy's), within a few ulp per step


def test_not_regions_say_why() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (4, 3)), name="x")
    b.output(b.op("add", x, b.input(("float32", (3,)), name="row")))
    assert "only size-1 values broadcast" in fused.elementwise_region(b.freeze())  # type: ignore[operator]
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (8,)), name="x")
    b.output(b.op("cast", x, dtype="int32"))
    reason = fused.elementwise_region(b.freeze())
    assert reason is not None and "cast from float64 to int32" in reason
    assert fused.compile_elementwise(b.freeze()) is None
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (8,)), name="x")
    b.output(b.op("sum", x))
    assert "sum" in fused.elementwise_region(b.freeze())  # type: ignore[operator]


def test_arguments_checked() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (8,)), name="x")
    b.output(b.op("negative", x))
    fn = fused.compile_elementwise(b.freeze())
    assert fn is not None
    with pytest.raises(ArgumentError, match="input x must be"):
        fn([np.zeros(8, np.float32)])
    with pytest.raises(ArgumentError, match="takes 1 inputs"):
        fn([])
    assert same(fn([np.arange(8.0)])[0], -np.arange(8.0))


def test_ufunc_loop_is_numpys() -> None:
    """The loop taken from the ufunc object gives the ufunc's results (and None where it has no such loop)."""
    x = data(np.random.default_rng(5), np.float32, (1000,), 0.1)
    for uf in (np.exp, np.tanh, np.sin, np.log):
        fn, dat = fused.ufunc_loop(uf, [np.dtype(np.float32)] * 2)  # type: ignore[misc]
        o = np.empty_like(x)
        ptrs = np.array([x.ctypes.data, o.ctypes.data])
        fn(ptrs.ctypes.data, np.array([x.size]).ctypes.data, np.array([4, 4]).ctypes.data, dat)
        with np.errstate(all="ignore"):
            assert same(o, uf(x))
    assert fused.ufunc_loop(np.sin, [np.dtype(np.float32), np.dtype(np.float64)]) is None
