"""Tests of the TensCalc kinds (ids 10001-30002) against formulas written from TensCalc's definitions.

Each kernel runs through a graph (GraphBuilder + executor, which checks
every result against the float64/unknown-rank type rule) and is compared
with an independent NumPy formula taken from TensCalc's documented meaning
(``lib/CGregistration.m``, the C TensCalc emits for scalar instructions,
``lib/@Tcalculus/*.m``). The end-to-end tests replay the set/get/copy steps
of ``/work/shared/tenscalc/*/reference.json`` (values computed by TensCalc
itself) on the files TensCalc wrote, once through a small test-only reader
(so the kernels are checked now) and once through ``opgraph.io.load``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import scipy.linalg

import opgraph
import opgraph.io
import opgraph.io.cg
from opgraph.core.registry import all_ops, get_op
from opgraph.core.types import TensorType
from opgraph.errors import ExecutionError
from opgraph.ops import tenscalc
from opgraph.runtime.executor import execute

DATA = os.environ.get("OPGRAPH_TENSCALC_DATA", "/work/shared/tenscalc")
CASES = sorted(d for d in os.listdir(DATA) if os.path.isfile(os.path.join(DATA, d, "reference.json"))) \
    if os.path.isdir(DATA) else []
F64 = TensorType("float64", None)

#: lib/CGregistration.m, function types (id, name).
REGISTERED = {
    10001: "Vzeros", 10002: "Vones", 10003: "Veye", 10004: "Vsubsref", 10005: "Vrepmat", 10006: "Vcat",
    10007: "Vreshape", 10008: "Vfull", 10009: "Vplus", 10010: "Vtprod", 10011: "Vtprod_matlab",
    10012: "Vnorm2", 10013: "Vnorminf", 10014: "Vmin", 10015: "Vmax", 10016: "Vall", 10017: "Vany",
    10018: "Vabs", 10019: "Vclp", 10020: "Vcompose", 10021: "Vlu", 10022: "Vchol", 10023: "Vmldivide_l1",
    10024: "Vmldivide_u", 10025: "Vmtimes", 10026: "Vctranspose", 10027: "Vtranspose", 10028: "Vrdivide",
    10029: "Vsum", 10030: "Vdiag",
    20001: "Ssum", 20002: "Ssumprod", 20003: "Sinv", 20004: "Sminus_inv_sqr", 20005: "Sdiv",
    20006: "Sminus_dot", 20007: "Sminus_dot_div", 20008: "Splus_minus_dot", 20009: "Splus_sqr",
    20010: "Splus_minus_dot_div", 20011: "Smin", 20012: "Smin0", 20013: "Smax", 20014: "Smax0",
    20015: "Smax_abs", 20016: "Sclp", 20017: "Sexp", 20018: "Slog", 20019: "Scos", 20020: "Sminus_cos",
    20021: "Ssin", 20022: "Sminus_sin", 20023: "Sabs", 20024: "Ssqrt", 20025: "SDsqrt", 20026: "SDDsqrt",
    20027: "Ssqr", 20028: "S2times", 20029: "S2", 20030: "Satan", 20031: "SDatan", 20032: "SDDatan",
    30001: "scalars2ftensor", 30002: "ftensor2scalars",
}
WITHOUT_KERNEL = {"Vtprod_matlab", "Vchol"}


@dataclass
class Const:
    """An argument to build as a constant (parameters are constants anyway)."""

    value: Any


def run(kind: str, *args: Any, nout: int = 1) -> Any:
    """Build ``kind(*args)`` with the builder and run it with the executor.

    Float arrays become float64 inputs of unknown rank (variables); integer
    and uint8 arrays, and :class:`Const`, become constants (parameters).
    Returns the output array, or a tuple of them when ``nout != 1``.
    """
    b = opgraph.GraphBuilder()
    ins, feeds = [], {}
    for a in args:
        if isinstance(a, Const):
            ins.append(b.constant(np.asarray(a.value)))
            continue
        a = np.asarray(a)
        if a.dtype.kind == "f":
            v = b.input(F64)
            feeds[v.id] = a.astype(np.float64)
            ins.append(v)
        else:
            ins.append(b.constant(a))
    outs = b.op(kind, *ins, nout=nout)
    outs = outs if isinstance(outs, tuple) else (outs,)
    got = execute(b.freeze(), feeds, [o.id for o in outs])
    for g in got:
        assert g.dtype == np.float64
    return got[0] if nout == 1 else tuple(got)


def i64(*v: Any) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def row(*v: Any) -> np.ndarray:
    """A MATLAB row parameter as saveVectorized writes it (20002 with size [1 n])."""
    return np.array([v], dtype=np.int64)


EMPTY = np.zeros((0, 0), np.int64)  # [] as written by the writers (20002 with size [0 0])


def s(x: float) -> np.ndarray:
    return np.array(x, dtype=np.float64)


def text(t: str) -> np.ndarray:
    return np.frombuffer(t.encode(), np.uint8).copy()


# ================================================================ registry
def test_registry_matches_cgregistration() -> None:
    got = {d.id: d.name for d in all_ops() if d.family == "tenscalc"}
    assert got == REGISTERED
    for id_, name in REGISTERED.items():
        d = get_op(id_)
        assert d.name == name and d.arity is None and set(d.attrs) == {"nout"} and d.attrs["nout"].default == 1
        assert d.infer((F64, F64), {"nout": 3}) == (F64, F64, F64)
        assert d.version((F64,), {"nout": 1}) == 0
        assert (d.kernel is not None) == (name not in WITHOUT_KERNEL)
    assert set(tenscalc.KERNELS) | WITHOUT_KERNEL == set(REGISTERED.values())
    assert set(tenscalc.NO_KERNEL) == WITHOUT_KERNEL


@pytest.mark.parametrize("kind", sorted(WITHOUT_KERNEL))
def test_kinds_without_kernel_raise_naming_the_op(kind: str) -> None:
    with pytest.raises(ExecutionError, match=kind):
        run(kind, np.eye(2))


def test_single_output_kinds_reject_other_nout() -> None:
    with pytest.raises(ExecutionError, match="nout=2"):
        run("Sexp", s(1.0), nout=2)


# ================================================================ scalar functions
POS = np.array([0.3, 1.0, 2.5, 7.0])
ANY = np.array([-2.0, -0.5, 0.0, 0.75, 3.0])

#: name -> (formula from CGregistration's description, domain)
UNARY: dict[str, tuple[Callable[[Any], Any], np.ndarray]] = {
    "Sinv": (lambda a: 1 / a, POS),
    "Sminus_inv_sqr": (lambda a: -1 / a**2, POS),
    "Sexp": (np.exp, ANY),
    "Slog": (np.log, POS),
    "Scos": (np.cos, ANY),
    "Sminus_cos": (lambda a: -np.cos(a), ANY),
    "Ssin": (np.sin, ANY),
    "Sminus_sin": (lambda a: -np.sin(a), ANY),
    "Sabs": (np.abs, ANY),
    "Ssqrt": (np.sqrt, POS),
    "SDsqrt": (lambda a: 0.5 / np.sqrt(a), POS),
    "SDDsqrt": (lambda a: -0.25 / np.sqrt(a) ** 3, POS),
    "Ssqr": (lambda a: a**2, ANY),
    "S2times": (lambda a: 2 * a, ANY),
    "S2": (lambda a: 2.0 + 0 * a, ANY),
    "Satan": (np.arctan, ANY),
    "SDatan": (lambda a: 1 / (1 + a**2), ANY),
    "SDDatan": (lambda a: -2 * a / (1 + a**2) ** 2, ANY),
}


@pytest.mark.parametrize("kind", sorted(UNARY))
def test_unary_scalar_kinds(kind: str) -> None:
    formula, xs = UNARY[kind]
    for x in xs:
        got = run(kind, s(x))
        assert got.shape == ()
        np.testing.assert_allclose(got, formula(x), rtol=1e-14, atol=0, err_msg=f"{kind}({x})")
    # A (1, 1) load constant (how .cgc stores a double scalar) is a scalar too.
    assert run(kind, Const(np.full((1, 1), xs[-1]))).shape == ()


def test_ssum_signs_and_order() -> None:
    a, b, c, d = 1.5, -2.0, 0.25, 8.0
    assert run("Ssum", i64(1, -1, 1, -1), s(a), s(b), s(c), s(d)) == a - b + c - d
    assert run("Ssum", row(-1, 1), s(a), s(b)) == -a + b
    # TensCalc's C: a parameter > 0 adds, anything else subtracts.
    assert run("Ssum", i64(1, 0), s(a), s(b)) == a - b
    # Left-to-right evaluation: (1e16 + 1) - 1e16 rounds to 0 in double.
    assert run("Ssum", i64(1, 1, -1), s(1e16), s(1.0), s(1e16)) == 0.0
    assert run("Ssum", i64(1, 1), Const(np.full((1, 1), 0.5)), s(2.0)).shape == ()
    with pytest.raises(ExecutionError):
        run("Ssum", i64(1), s(1.0), s(2.0))


def test_ssumprod() -> None:
    v = [1.5, -2.0, 3.0, 0.5, 4.0, -1.0]
    # parameters [m; # sums]: operands a1..am, b1..bm, ...
    assert run("Ssumprod", i64(2, 3), *map(s, v)) == v[0] * v[1] + v[2] * v[3] + v[4] * v[5]
    assert run("Ssumprod", i64(3, 2), *map(s, v)) == v[0] * v[1] * v[2] + v[3] * v[4] * v[5]
    assert run("Ssumprod", i64(1, 3), *map(s, v[:3])) == v[0] + v[1] + v[2]
    with pytest.raises(ExecutionError):
        run("Ssumprod", i64(2, 2), *map(s, v))


def test_dot_kinds() -> None:
    a0, b0, a1, b1, a2, b2 = 10.0, 4.0, 1.5, 2.0, -3.0, 0.5
    dot = a1 * b1 + a2 * b2
    assert run("Sminus_dot", s(a1), s(b1), s(a2), s(b2)) == -dot
    assert run("Sminus_dot_div", s(a0), s(a1), s(b1), s(a2), s(b2)) == -dot / a0
    assert run("Splus_minus_dot", s(a0), s(a1), s(b1), s(a2), s(b2)) == a0 - dot
    assert run("Splus_minus_dot_div", s(a0), s(b0), s(a1), s(b1), s(a2), s(b2)) == (a0 - dot) / b0
    assert run("Splus_sqr", s(a1), s(a2), s(b2)) == a1**2 + a2**2 + b2**2
    assert run("Sdiv", s(3.0), s(4.0)) == 0.75
    with pytest.raises(ExecutionError):
        run("Sminus_dot", s(1.0), s(2.0), s(3.0))


def test_min_max_kinds(rng: np.random.Generator) -> None:
    v = rng.uniform(-3, 3, 5)
    args = [s(x) for x in v]
    assert run("Smin", *args) == v.min()
    assert run("Smax", *args) == v.max()
    assert run("Smin0", *args) == min(0.0, v.min())
    assert run("Smax0", *args) == max(0.0, v.max())
    assert run("Smax_abs", *args) == np.abs(v).max()
    assert run("Smin0", s(2.0), s(3.0)) == 0.0 and run("Smax0", s(-2.0), s(-3.0)) == 0.0
    # C: m=a1; if (m>ai) m=ai -- a NaN first operand stays, a later NaN is skipped.
    assert np.isnan(run("Smin", s(np.nan), s(1.0)))
    assert run("Smin", s(1.0), s(np.nan)) == 1.0
    assert run("Smax", s(1.0), s(np.nan), s(2.0)) == 2.0


def test_sclp(rng: np.random.Generator) -> None:
    for _ in range(5):
        a, b = rng.uniform(0.1, 2, 4), rng.uniform(-2, 2, 4)
        neg = b < 0
        want = np.min(-a[neg] / b[neg]) if neg.any() else np.finfo(np.float64).max
        args = [s(x) for pair in zip(a, b, strict=True) for x in pair]
        assert run("Sclp", *args) == want
    # No negative b: C's DBL_MAX.
    assert run("Sclp", s(1.0), s(2.0)) == np.finfo(np.float64).max


def test_s2_ignores_its_operand() -> None:
    assert run("S2", s(np.nan)) == 2.0


# ================================================================ scalars <-> tensors
def colmajor_subscripts(shape: tuple[int, ...]) -> np.ndarray:
    """All 1-based subscripts of a tensor, [ndim x numel], in MATLAB's column-major order."""
    grids = np.meshgrid(*[np.arange(1, n + 1) for n in shape], indexing="ij")
    return np.stack([g.ravel(order="F") for g in grids]).astype(np.int64)


def test_ftensor2scalars_is_column_major(rng: np.random.Generator) -> None:
    a = rng.normal(size=(3, 4))
    got = run("ftensor2scalars", a, nout=12)
    # MATLAB's a(:): entry k is a(i, j) with k = i + 3*j (0-based).
    assert [float(g) for g in got] == [a[k % 3, k // 3] for k in range(12)]
    assert all(g.shape == () for g in got)
    assert run("ftensor2scalars", s(2.5)) == 2.5
    with pytest.raises(ExecutionError):
        run("ftensor2scalars", a, nout=5)


def test_scalars2ftensor_full_and_round_trip(rng: np.random.Generator) -> None:
    a = rng.normal(size=(2, 3, 2))
    subs = colmajor_subscripts(a.shape)
    vals = [s(a[tuple(c - 1)]) for c in subs.T]
    np.testing.assert_array_equal(run("scalars2ftensor", subs, *vals), a)
    # A vector: [1 x n] subscripts, any order.
    v = rng.normal(size=4)
    perm = np.array([3, 1, 4, 2])
    np.testing.assert_array_equal(run("scalars2ftensor", perm[None, :], *[s(v[i - 1]) for i in perm]), v)


def test_scalars2ftensor_sparse_and_scalar() -> None:
    # Entries not listed are zero; the size is the largest subscript per dimension.
    got = run("scalars2ftensor", np.array([[1, 3], [2, 1]]), s(5.0), s(7.0))
    np.testing.assert_array_equal(got, [[0, 5], [0, 0], [7, 0]])
    # nnz == 1 is written as a 20001 vector of the ndim subscripts.
    np.testing.assert_array_equal(run("scalars2ftensor", i64(2, 3), s(4.0)), [[0, 0, 0], [0, 0, 4]])
    # A scalar: empty 20001 subscripts.
    got = run("scalars2ftensor", np.zeros(0, np.int64), s(4.0))
    assert got.shape == () and got == 4.0
    # A structurally zero scalar: (0, 0) subscripts and no values.
    assert run("scalars2ftensor", EMPTY).shape == ()
    # The full size can be given to the kernel (not stored in the files).
    k = tenscalc.KERNELS["scalars2ftensor"]
    np.testing.assert_array_equal(k(np.array([[2]]), s(1.0), shape=(3,)), [0, 1, 0])
    with pytest.raises(ValueError):
        k(np.array([[4]]), s(1.0), shape=(3,))
    with pytest.raises(ExecutionError):
        run("scalars2ftensor", np.array([[1, 2]]), s(1.0))


# ================================================================ tensor functions
def test_zeros_ones_eye() -> None:
    assert run("Vzeros", row(2, 3)).shape == (2, 3) and not run("Vzeros", row(2, 3)).any()
    assert run("Vzeros", EMPTY).shape == ()
    np.testing.assert_array_equal(run("Vones", i64(3)), np.ones(3))
    np.testing.assert_array_equal(run("Veye", row(3, 3)), np.eye(3))
    e = run("Veye", row(2, 3, 2, 3))
    idx = np.indices(e.shape)
    np.testing.assert_array_equal(e, (idx[0] == idx[2]) & (idx[1] == idx[3]))
    with pytest.raises(ExecutionError):
        run("Veye", row(2, 3))


def test_subsref(rng: np.random.Generator) -> None:
    a = rng.normal(size=(4, 3, 2))
    i, j, k = [4.0, 1.0, 1.0], [2.0, 3.0], [2.0]
    got = run("Vsubsref", Const(np.array([i])), Const(np.array([j])), Const(np.array([k])), a)
    want = np.array([[[a[int(p) - 1, int(q) - 1, int(r) - 1] for r in k] for q in j] for p in i])
    np.testing.assert_array_equal(got, want)
    colon = text(":")
    np.testing.assert_array_equal(run("Vsubsref", colon, Const(np.array([[1.0]])), colon, a), a[:, :1, :])
    # y(2:3) of a vector; the index constant is a MATLAB row.
    np.testing.assert_array_equal(run("Vsubsref", Const(np.array([[2.0, 3.0]])), a[:, 0, 0]), a[1:3, 0, 0])
    # A [3] vector stored as a (3, 1) constant, indexed with one subscript.
    np.testing.assert_array_equal(run("Vsubsref", Const(np.array([[3.0]])), Const(np.ones((3, 1)))), [1.0])
    with pytest.raises(ExecutionError):
        run("Vsubsref", Const(np.array([[5.0]])), a[:, 0, 0])


def test_repmat_reshape_cat(rng: np.random.Generator) -> None:
    m = rng.normal(size=(2, 3))
    np.testing.assert_array_equal(run("Vrepmat", row(2, 3), m), np.block([[m] * 3] * 2))
    v = np.array([1.0, 2.0])
    np.testing.assert_array_equal(run("Vrepmat", row(1, 3), v), [[1, 1, 1], [2, 2, 2]])  # vector as a column
    np.testing.assert_array_equal(run("Vrepmat", i64(2), v), [1, 2, 1, 2])

    flat = np.arange(6.0)
    got = run("Vreshape", row(2, 3), flat)
    assert all(got[r, c] == flat[r + 2 * c] for r in range(2) for c in range(3))  # column-major
    np.testing.assert_array_equal(run("Vreshape", i64(6), got), flat)
    assert run("Vreshape", EMPTY, np.array([[3.0]])).shape == ()

    a, b = rng.normal(size=(2, 3)), rng.normal(size=(4, 3))
    np.testing.assert_array_equal(run("Vcat", i64(1), a, b), np.vstack([a, b]))
    np.testing.assert_array_equal(run("Vcat", i64(2), a, a), np.hstack([a, a]))
    np.testing.assert_array_equal(run("Vcat", i64(3), a, a), np.stack([a, a], axis=2))
    np.testing.assert_array_equal(run("Vcat", i64(1), v, np.array([3.0])), [1, 2, 3])
    # Vectors [n] side by side become an [n 2] matrix (Tcalculus/cat adds the singleton).
    np.testing.assert_array_equal(run("Vcat", i64(2), v, v), [[1, 1], [2, 2]])
    # A [2] vector next to a [2] constant stored as (2, 1): still a vector.
    assert run("Vcat", i64(1), v, Const(np.ones((2, 1)))).shape == (4,)


def test_plus_full_abs(rng: np.random.Generator) -> None:
    a, b, c = (rng.normal(size=(3, 2)) for _ in range(3))
    np.testing.assert_array_equal(run("Vplus", row(1, -1, 1), a, b, c), a - b + c)
    np.testing.assert_array_equal(run("Vplus", row(-1, -1), a, b), -a - b)
    # y = b + c + A*x in case linalg: variables are [3], the constant c is stored (3, 1).
    x, cc = rng.normal(size=3), rng.normal(size=(3, 1))
    got = run("Vplus", row(1, 1), x, Const(cc))
    assert got.shape == (3,)
    np.testing.assert_array_equal(got, x + cc[:, 0])
    with pytest.raises(ExecutionError):
        run("Vplus", row(1, 1), x, rng.normal(size=4))
    np.testing.assert_array_equal(run("Vfull", a), a)
    np.testing.assert_array_equal(run("Vabs", a), np.abs(a))


def test_tprod(rng: np.random.Generator) -> None:
    A, B = rng.normal(size=(3, 2)), rng.normal(size=(2, 4))
    x, y, z = rng.normal(size=2), rng.normal(size=3), rng.normal(size=3)
    # Tcalculus/mtimes: A*B = tprod(A,[1,-1],B,[-1,2]), A*x = tprod(A,[1,-1],x,[-1]).
    np.testing.assert_allclose(run("Vtprod", row(3, 4), i64(2), A, row(1, -1), B, row(-1, 2)), A @ B, rtol=1e-14)
    np.testing.assert_allclose(run("Vtprod", i64(3), i64(2), A, row(1, -1), x, i64(-1)), A @ x, rtol=1e-14)
    # A'*y, y.*z (no sums), sum(y.*y) (scalar), outer product, 3 factors.
    np.testing.assert_allclose(run("Vtprod", i64(2), i64(3), y, i64(-1), A, row(-1, 1)), A.T @ y, rtol=1e-14)
    np.testing.assert_array_equal(run("Vtprod", i64(3), EMPTY, y, i64(1), z, i64(1)), y * z)
    got = run("Vtprod", EMPTY, i64(3), y, i64(-1), y, i64(-1))
    assert got.shape == ()
    np.testing.assert_allclose(got, sum(v * v for v in y), rtol=1e-14)
    np.testing.assert_array_equal(run("Vtprod", row(3, 2), EMPTY, y, i64(1), x, i64(2)), np.outer(y, x))
    w = run("Vtprod", i64(3), i64(2), y, i64(1), A, row(1, -1), x, i64(-1))
    np.testing.assert_allclose(w, y * (A @ x), rtol=1e-14)
    # Repeated indices: diag(M) = tprod(M,[1,1]); trace = tprod(M,[-1,-1]); sum over dim 2.
    M = rng.normal(size=(3, 3))
    np.testing.assert_array_equal(run("Vtprod", i64(3), EMPTY, M, row(1, 1)), np.diag(M))
    np.testing.assert_allclose(run("Vtprod", EMPTY, i64(3), M, row(-1, -1)), np.trace(M), rtol=1e-14)
    np.testing.assert_allclose(run("Vtprod", i64(3), i64(3), M, row(1, -1)), M.sum(axis=1), rtol=1e-14)
    # A constant [3] vector stored (3, 1), with one index.
    np.testing.assert_allclose(run("Vtprod", i64(2), i64(3), Const(y[:, None]), i64(-1), A, row(-1, 1)),
                               A.T @ y, rtol=1e-14)
    with pytest.raises(ExecutionError):
        run("Vtprod", i64(3), i64(3), A, row(1, -1), x, i64(-1))  # sum size 3 but A has 2 columns


def test_norms_and_reductions(rng: np.random.Generator) -> None:
    a = rng.normal(size=(3, 4, 2))
    np.testing.assert_allclose(run("Vnorm2", a), np.sum(a**2), rtol=1e-14)
    assert run("Vnorminf", a) == np.max(np.abs(a))
    np.testing.assert_allclose(run("Vsum", i64(2), a), a.sum(axis=1), rtol=1e-14)
    np.testing.assert_allclose(run("Vsum", row(1, 3), a), a.sum(axis=(0, 2)), rtol=1e-14)
    assert run("Vsum", row(1, 2, 3), a).shape == ()
    np.testing.assert_array_equal(run("Vmin", i64(1), a), a.min(axis=0))
    np.testing.assert_array_equal(run("Vmax", row(2, 3), a), a.max(axis=(1, 2)))
    # MATLAB's min/max skip NaN.
    np.testing.assert_array_equal(run("Vmin", i64(1), np.array([[np.nan, 2.0], [1.0, np.nan]])), [1.0, 2.0])
    m = np.array([[1.0, 0.0, np.nan], [2.0, 0.0, 0.0]])
    np.testing.assert_array_equal(run("Vall", i64(1), m), [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(run("Vany", i64(1), m), [1.0, 0.0, 1.0])
    np.testing.assert_array_equal(run("Vall", i64(2), m), [0.0, 0.0])
    # A dimension beyond the tensor's is a singleton (MATLAB).
    np.testing.assert_array_equal(run("Vsum", i64(3), m), m)


def test_clp_rdivide_diag_transpose(rng: np.random.Generator) -> None:
    a, b = rng.uniform(0.1, 2, 6), rng.normal(size=6)
    neg = b < 0
    assert run("Vclp", a, b) == np.min(-a[neg] / b[neg])
    assert run("Vclp", a, np.abs(b)) == np.inf  # lib/clp.m
    m, n = rng.normal(size=(2, 3)), rng.uniform(1, 2, (2, 3))
    np.testing.assert_array_equal(run("Vrdivide", m, n), m / n)
    np.testing.assert_array_equal(run("Vrdivide", m, s(2.0)), m / 2)
    np.testing.assert_array_equal(run("Vrdivide", s(2.0), n), 2 / n)
    np.testing.assert_array_equal(run("Vrdivide", m, Const(np.full((1, 1), 4.0))), m / 4)
    v = rng.normal(size=3)
    np.testing.assert_array_equal(run("Vdiag", v), np.diag(v))
    np.testing.assert_array_equal(run("Vdiag", Const(v[:, None])), np.diag(v))
    with pytest.raises(ExecutionError):
        run("Vdiag", m)
    for kind in ("Vtranspose", "Vctranspose"):
        np.testing.assert_array_equal(run(kind, m), m.T)
        np.testing.assert_array_equal(run(kind, v), v)  # Tcalculus: no effect on vectors


def test_mtimes(rng: np.random.Generator) -> None:
    A, B, x, y = rng.normal(size=(3, 2)), rng.normal(size=(2, 4)), rng.normal(size=2), rng.normal(size=3)
    np.testing.assert_allclose(run("Vmtimes", A, B), A @ B, rtol=1e-14)
    np.testing.assert_allclose(run("Vmtimes", A, x), A @ x, rtol=1e-14)  # [3]
    np.testing.assert_allclose(run("Vmtimes", y, A), A.T @ y, rtol=1e-14)  # x'*A: [2]
    assert run("Vmtimes", x, x).shape == ()
    np.testing.assert_array_equal(run("Vmtimes", s(2.0), A), 2 * A)
    np.testing.assert_array_equal(run("Vmtimes", A, Const(np.full((1, 1), 3.0))), 3 * A)


def test_lu_and_solves(rng: np.random.Generator) -> None:
    n = 5
    A = rng.normal(size=(n, n)) + 2 * n * np.eye(n)
    lu = run("Vlu", A)
    L, U = np.tril(lu, -1) + np.eye(n), np.triu(lu)
    np.testing.assert_allclose(L @ U, A, rtol=1e-13, atol=1e-13)
    for b in (rng.normal(size=n), rng.normal(size=(n, 2))):
        y = run("Vmldivide_l1", lu, b)
        np.testing.assert_allclose(y, scipy.linalg.solve_triangular(L, b, lower=True, unit_diagonal=True),
                                   rtol=1e-12, atol=1e-12)
        xs = run("Vmldivide_u", lu, y)
        np.testing.assert_allclose(xs, scipy.linalg.solve_triangular(U, y), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(xs, np.linalg.solve(A, b), rtol=1e-12, atol=1e-12)
        assert xs.shape == b.shape
    with pytest.raises(ExecutionError):
        run("Vlu", rng.normal(size=(2, 3)))


# ---------------------------------------------------------------- compose
#: Each function string TensCalc's generators recognise, with its meaning written out here.
COMPOSE: dict[str, Callable[[np.ndarray], Any]] = {
    "@(x__)log(x__)": np.log,
    "@(x__)1./x__": lambda x: 1 / x,
    "@(x__)-1./x__.^2": lambda x: -1 / x**2,
    "@(x__)2./x__.^3": lambda x: 2 / x**3,
    "@(x__)exp(x__)": np.exp,
    "@(x__)sin(x__)": np.sin,
    "@(x__)-sin(x__)": lambda x: -np.sin(x),
    "@(x__)cos(x__)": np.cos,
    "@(x__)-cos(x__)": lambda x: -np.cos(x),
    "@(x__)round(x__)": lambda x: np.floor(x + 0.5),  # x > 0 here
    "@(x__)ceil(x__)": np.ceil,
    "@(x__)floor(x__)": np.floor,
    "@(x__)abs(x__)": np.abs,
    "@(x__)sign(x__)": np.sign,
    "@(x__)sqrt(x__)": np.sqrt,
    "@(x__).5./sqrt(x__)": lambda x: 0.5 / np.sqrt(x),
    "@(x__)-.25./x__.^1.5": lambda x: -0.25 / x**1.5,
    "@(x__)x__.^2": lambda x: x * x,
    "@(x__)2*x__": lambda x: 2 * x,
    "@(x__)2*ones(size(x__))": lambda x: 2 + 0 * x,
    "@(x__)x__.^3": lambda x: x * x * x,
    "@(x__)3*x__.^2": lambda x: 3 * x * x,
    "@(x__)6*x__": lambda x: 6 * x,
    "@(x__)atan(x__)": np.arctan,
    "@(x__)1./(1+x__.^2)": lambda x: 1 / (1 + x * x),
    "@(x__)-2*x__./(1+x__.^2).^2": lambda x: -2 * x / (1 + x * x) ** 2,
    "@(x__)log(1+x__)/log(2)": lambda x: np.log(1 + x) / np.log(2),
    "@(x__)1./(1+x__)/log(2)": lambda x: 1 / (1 + x) / np.log(2),
    "@(x__)-1./(1+x__).^2": lambda x: -1 / (1 + x) ** 2,
    "@(x__)log(1+exp(x__))": lambda x: np.log1p(np.exp(x)),
    "@(x__)1./(1+exp(-x__))": lambda x: 1 / (1 + np.exp(-x)),
    "@(x__)1./(2+exp(-x__)+exp(x__))": lambda x: 1 / (2 + np.exp(-x) + np.exp(x)),
    "@(x__)relu(x__)": lambda x: np.maximum(x, 0),
    "@(x__)heaviside(x__)": lambda x: (x > 0) * 1.0,  # x != 0 here
    "@(x__)zeros(size(x__))": lambda x: 0 * x,
}


def test_compose_covers_tenscalc_strings() -> None:
    assert set(COMPOSE) == set(tenscalc.TENSCALC_COMPOSE_STRINGS)


@pytest.mark.parametrize("fun", sorted(COMPOSE))
def test_compose_tenscalc_strings(fun: str) -> None:
    x = np.array([[0.3, 1.7], [2.2, 0.9], [4.0, 0.05]])
    got = run("Vcompose", text(fun), x)
    assert got.shape == x.shape
    np.testing.assert_allclose(got, COMPOSE[fun](x), rtol=1e-14, atol=1e-300, err_msg=fun)


def test_compose_matlab_semantics() -> None:
    x = np.array([-2.5, -0.5, 0.0, 0.5, 2.5, np.nan])
    c = tenscalc.compose_apply
    np.testing.assert_array_equal(c("@(x)round(x)", x), [-3, -1, 0, 1, 3, np.nan])  # halves away from 0
    np.testing.assert_array_equal(c("@(x)sign(x)", x), [-1, -1, 0, 1, 1, np.nan])
    np.testing.assert_array_equal(c("@(x)heaviside(x)", x), [0, 0, 0.5, 1, 1, np.nan])
    np.testing.assert_array_equal(c("@(x)relu(x)", x), [0, 0, 0, 0.5, 2.5, 0])  # max(NaN,0) is 0
    np.testing.assert_array_equal(c("@(x)-x.^2", x[:5]), -(x[:5] ** 2))  # power binds tighter than minus
    np.testing.assert_array_equal(c("@(x)2^-1*x", x[:5]), 0.5 * x[:5])
    np.testing.assert_array_equal(c("@(x)2.^2.^3", x[:1]), [64.0])  # MATLAB's ^ is left-associative
    np.testing.assert_array_equal(c("@(x__) exp (x__)", x[:5]), np.exp(x[:5]))  # Octave's func2str spacing
    np.testing.assert_array_equal(c("exp", x[:5]), np.exp(x[:5]))  # func2str(@exp)
    np.testing.assert_array_equal(c("@(x__)1e-1*x__ - 3", x[:5]), 0.1 * x[:5] - 3)
    assert np.isnan(c("@(x)sqrt(x)", np.array([-1.0]))).all()
    assert c("@(x)x.^2", np.array(3.0)).shape == ()


@pytest.mark.parametrize("fun", [
    "@(x)eval(x)", "@(x)y", "@(x)exp(x", "@(x)x;exp(x)", "@(x)[x]", "@(x)x'", "@(x)__import__('os')",
    "@(x)exp(x)(1)", "system", "lambda x: x", "@(x)ones(x)", "@(x)", "@(x)x.^", "@(x)2**x", "",
])
def test_compose_rejects_anything_else(fun: str) -> None:
    with pytest.raises(ValueError):
        tenscalc.parse_compose(fun)
    with pytest.raises(ExecutionError, match="Vcompose"):
        run("Vcompose", text(fun), np.ones(2))


# ---------------------------------------------------------------- the kernel contract
OUT_CASES: list[tuple[str, tuple[Any, ...], int]] = [
    ("Ssum", (i64(1, -1), s(1.0), s(2.0)), 1),
    ("Sexp", (s(1.0),), 1),
    ("Vplus", (row(1, 1), np.ones((2, 3)), np.ones((2, 3))), 1),
    ("Vtprod", (row(2, 2), i64(3), np.ones((2, 3)), row(1, -1), np.ones((3, 2)), row(-1, 2)), 1),
    ("Vcompose", (text("@(x__)exp(x__)"), np.ones(3)), 1),
    ("ftensor2scalars", (np.arange(3.0),), 3),
]


@pytest.mark.parametrize("kind,args,nout", OUT_CASES, ids=[c[0] for c in OUT_CASES])
def test_kernels_write_into_out(kind: str, args: tuple[Any, ...], nout: int) -> None:
    k = get_op(kind).kernel_for(0)
    want = k(*args, nout=nout)
    wants = want if nout != 1 else (want,)
    bufs = tuple(np.empty_like(w) for w in wants)
    got = k(*args, out=bufs if nout != 1 else bufs[0], nout=nout)
    got = got if nout != 1 else (got,)
    for g, buf, w in zip(got, bufs, wants, strict=True):
        assert g is buf and buf.dtype == np.float64
        np.testing.assert_array_equal(buf, w)


# ================================================================ end to end on files TensCalc wrote
def replay(graph: Any, gateways: dict[str, tuple[int, list[int], list[int]]], steps: list[dict[str, Any]],
           ) -> list[tuple[str, str, float]]:
    """Replay reference steps on ``graph``; gateway vars are value ids. Returns (gateway, output, max diff)."""
    state: dict[int, np.ndarray] = {}
    report = []
    for step in steps:
        kind, vs, dests = gateways[step["gateway"]]
        if step["op"] == "set":
            assert kind == 1 and len(vs) == 1
            value = np.array(step["value"], dtype=np.float64)
            assert value.shape == tuple(step["shape"])
            np.testing.assert_array_equal(value.ravel(order="F"), step["value_colmajor"])
            state[vs[0]] = value
        elif step["op"] == "get":
            assert kind == 2 and len(vs) == len(step["outputs"])
            got = execute(graph, state, vs)
            for g, want in zip(got, step["outputs"], strict=True):
                w = np.array(want["value"], dtype=np.float64)
                assert g.shape == tuple(want["shape"]), f"{step['gateway']}/{want['name']}: shape {g.shape}"
                diff = float(np.max(np.abs(g - w), initial=0.0))
                report.append((step["gateway"], want["name"], diff))
                assert diff <= 1e-12, f"{step['gateway']}/{want['name']}: {g} != {w}"
        elif step["op"] == "copy":
            assert kind == 3
            got = execute(graph, state, vs)
            for d, g in zip(dests, got, strict=True):
                state[d] = g
        else:
            raise AssertionError(step["op"])
    return report


def test_replay_applies_copies() -> None:
    # No reference case has a copy gateway; check the replay logic on a small graph: x <- x + 1.
    b = opgraph.GraphBuilder()
    x = b.input(F64, name="x")
    y = b.op("Vplus", b.constant(row(1, 1)), x, b.constant(np.ones((2, 1))), nout=1)
    gateways = {"set_x": (1, [x.id], []), "get_y": (2, [y.id], []), "copy_y_x": (3, [y.id], [x.id])}
    steps = [{"op": "set", "gateway": "set_x", "shape": [2], "value": [1.0, 2.0], "value_colmajor": [1.0, 2.0]},
             {"op": "get", "gateway": "get_y", "outputs": [{"name": "y", "shape": [2], "value": [2.0, 3.0]}]},
             {"op": "copy", "gateway": "copy_y_x"},
             {"op": "get", "gateway": "get_y", "outputs": [{"name": "y", "shape": [2], "value": [3.0, 4.0]}]}]
    assert [r[2] for r in replay(b.freeze(), gateways, steps)] == [0.0, 0.0]


def _reference(case: str) -> dict[str, Any]:
    with open(os.path.join(DATA, case, "reference.json")) as fh:
        return json.load(fh)


VARIANTS = [(c, v) for c in CASES for v in ("scalarized", "vectorized")]


@pytest.mark.parametrize("case,variant", VARIANTS, ids=[f"{c}-{v}" for c, v in VARIANTS])
def test_tenscalc_files_reproduce_reference(case: str, variant: str) -> None:
    graph = opgraph.io.load(os.path.join(DATA, case, variant))
    gateways = {gw.name: ({"set": 1, "get": 2, "copy": 3}[gw.kind], list(gw.values), list(gw.destinations))
                for gw in opgraph.io.cg.gateways(graph)}
    report = replay(graph, gateways, _reference(case)["steps"])
    assert report, "no get step checked"
    if variant == "scalarized":
        assert {"scalars2ftensor", "ftensor2scalars"} <= {graph.kind_of(op) for op in range(graph.num_ops)}
