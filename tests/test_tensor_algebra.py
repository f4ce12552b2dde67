"""The tensor-algebra view (issue 20, seed 004): OpGraph's BGL-style API, conversion with the core graph, index
notation against ``np.einsum``, lowering to permute + GEMM, and the drawing.

Every example of seed 004 that is consistent is a test here (the ``test_seed_*`` tests); the reference values
come from NumPy and SciPy, never from opgraph.
"""

from __future__ import annotations

import glob
import os
import re
import string
from typing import Any

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings
from hypothesis import strategies as st

import opgraph
import opgraph.numpy as onp
from opgraph.backends.numpy import NumpyBackend
from opgraph.frontend.tensor_algebra import (
    Add,
    Cholesky,
    Divide,
    Edge,
    EigenSolve,
    Elementwise,
    Multiply,
    Operation,
    OpGraph,
    OpGraphError,
    Permute,
    Pow,
    Scale,
    Slice,
    Tensor,
    apply,
    cholesky,
    eigen_solve,
    power,
    slice_,
    tensor_expr,
)
from opgraph.passes.lower import lower

T = tensor_expr
RNG = np.random.default_rng(20)
DATA = os.path.join(os.path.dirname(__file__), "data")
TENSCALC_FILES = sorted(glob.glob(os.path.join(DATA, "fuzz_seeds", "tc_*.cg")) +
                        glob.glob(os.path.join(DATA, "tenscalc", "*", "*.cg")))  # copies of files TensCalc wrote


def spd(n: int, rng: np.random.Generator = RNG) -> np.ndarray:
    m = rng.standard_normal((n, n))
    return m @ m.T + n * np.eye(n)


# ------------------------------------------------------------------------------------------------ seed 004's API
def seed_add_graph(A: np.ndarray, B: np.ndarray) -> OpGraph:
    """The seed's ``OpGraph g`` for A + B = C, node by node and edge by edge."""
    g = OpGraph()
    assert g.add_node(Tensor(A, name="A")) == 0
    assert g.add_node(Tensor(B, name="B")) == 1
    assert g.add_node(Add()) == 2
    assert g.add_node(Tensor(name="C")) == 3
    g.add_edge(0, 2, "i,j")
    g.add_edge(1, 2, "i,j")
    g.add_edge(2, 3, "i,j")
    return g


def test_seed_bgl_queries() -> None:
    g = seed_add_graph(np.ones((2, 3)), np.ones((2, 3)))
    assert g.num_nodes() == 4 and g.num_edges() == 3
    assert [g.degree(u) for u in range(4)] == [1, 1, 3, 1]
    assert [g.in_degree(u) for u in range(4)] == [0, 0, 2, 1]
    assert [g.out_degree(u) for u in range(4)] == [1, 1, 1, 0]
    # The seed asserts Edge(0, 1, "i,j") here, but its graph has no edge 0 -> 1 (tensors A and B are never
    # joined: an OpGraph is bipartite); node 0's one edge goes to the Add, node 2. We follow the graph.
    assert g.edges(0) == [Edge(0, 2, "i,j")]
    assert Edge(0, 1, "i,j") not in g.edges()
    assert g.in_edges(0) == []
    assert g.out_edges(0) == [Edge(0, 2, "i,j")]
    assert g.adjacent_nodes(0) == [2]
    assert g.source(0, 2) == 0 and g.source(2, 0) == 0
    assert g.sink(0, 2) == 2 and g.sink(2, 0) == 2
    assert g.sources() == [0, 1] and g.sinks() == [3]
    assert g.edges() == [Edge(0, 2, "i,j"), Edge(1, 2, "i,j"), Edge(2, 3, "i,j")]
    assert [e.source for e in g.edges()] == [0, 1, 2] and [e.target for e in g.edges()] == [2, 2, 3]
    assert all(e.modes == "i,j" and e.labels == ("i", "j") for e in g.edges())
    assert g.in_edges(2) == [Edge(0, 2, "i,j"), Edge(1, 2, "i,j")] and g.out_edges(2) == [Edge(2, 3, "i,j")]
    assert [type(n) for n in g.nodes()] == [Tensor, Tensor, Add, Tensor]


def test_seed_add_and_pow_graphs_run() -> None:
    A, B = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    (c,) = seed_add_graph(A, B).run()
    np.testing.assert_array_equal(c, A + B)

    g3 = OpGraph(3)  # room for three nodes
    assert g3.capacity == 3
    assert g3.add_node(Tensor(A)) == 0
    assert g3.add_node(Pow(2)) == 1
    assert g3.add_node(Tensor(name="C")) == 2
    g3.add_edge(0, 1, "i,j")
    g3.add_edge(1, 2, "i,j")
    assert [g3.degree(u) for u in range(3)] == [1, 2, 1]
    np.testing.assert_array_equal(g3.run()[0], A**2)


def test_seed_first_equations_share_a() -> None:
    """``aijk = a("i,j,k"); c("i,j,k") = aijk * b("i,j,k"); d("i,j,k") = aijk / b("i,j,k")``: a is one node used
    by two operations, and the graph has two results."""
    av, bv = RNG.standard_normal((2, 3, 4)), RNG.uniform(1, 2, (2, 3, 4))
    a, b = T(av, name="a"), T(bv, name="b")
    c, d = T(name="c"), T(name="d")
    aijk = a["i,j,k"]
    c["i,j,k"] = aijk * b["i,j,k"]
    d["i,j,k"] = aijk / b["i,j,k"]
    og = OpGraph.from_equations(c, d)
    tensors = [u for u, n in enumerate(og.nodes()) if isinstance(n, Tensor)]
    ops = [u for u, n in enumerate(og.nodes()) if isinstance(n, Operation)]
    assert len(ops) == 2 and {type(og[u]) for u in ops} == {Multiply, Divide}
    (a_node,) = [u for u in tensors if og[u].name == "a"]
    assert og.out_degree(a_node) == 2 and og.in_degree(a_node) == 0
    assert sorted(og.sinks()) == sorted(og.result_tensors()) and len(og.sinks()) == 2
    got_c, got_d = og.run()
    np.testing.assert_array_equal(got_c, av * bv)
    np.testing.assert_array_equal(got_d, av / bv)


def test_seed_second_equations_cholesky_eigen_slice_pow() -> None:
    """The seed's ``L = cholesky(Aij)``, ``(v, λ) = eigen_solve(Aij, B)``, ``a10_10 = slice(Aij, {0,0},
    {10,10})``, ``a2 = pow(Aij, 2)``: A is used by four operations, one of which returns two tensors."""
    n = 12
    Av, Bv = spd(n), spd(n)
    A, B = T(Av, name="A"), T(Bv, name="B")
    L, v, lam, a10_10, a2 = (T(name=k) for k in ("L", "v", "lam", "a10_10", "a2"))
    Aij = A["i,j"]
    L["i,j"] = cholesky(Aij)
    v["i,j"], lam["j"] = eigen_solve(Aij, B["i,j"])
    a10_10["i,j"] = slice_(Aij, (0, 0), (10, 10))
    a2["i,j"] = power(Aij, 2)
    og = OpGraph.from_equations(L, v, lam, a10_10, a2)
    (a_node,) = [u for u, node in enumerate(og.nodes()) if isinstance(node, Tensor) and node.name == "A"]
    assert og.out_degree(a_node) == 4
    (eig,) = [u for u, node in enumerate(og.nodes()) if isinstance(node, EigenSolve)]
    assert og.in_degree(eig) == 2 and og.out_degree(eig) == 2
    assert [e.modes for e in og.out_edges(eig)] == ["i,j", "j"]
    got_L, got_v, got_lam, got_slice, got_a2 = og.run()
    np.testing.assert_allclose(got_L, np.linalg.cholesky(Av), rtol=1e-12)
    np.testing.assert_allclose(got_lam, scipy.linalg.eigh(Av, Bv, eigvals_only=True), rtol=1e-10)
    # eigenvectors up to sign: check A v = λ B v and vᵀ B v = I (SciPy's normalisation)
    np.testing.assert_allclose(Av @ got_v, Bv @ got_v * got_lam, atol=1e-9)
    np.testing.assert_allclose(got_v.T @ Bv @ got_v, np.eye(n), atol=1e-10)
    np.testing.assert_array_equal(got_slice, Av[:10, :10])
    np.testing.assert_array_equal(got_a2, Av**2)


def test_eigen_solve_standard_and_permuted_vectors() -> None:
    Av = spd(5)
    v, lam = eigen_solve(T(Av)["i,j"])
    w, vecs = np.linalg.eigh(Av)
    np.testing.assert_allclose(lam.eval("j"), w, rtol=1e-12)
    got = v.eval("j,i")  # the output edge permutes: eigenvectors as rows
    np.testing.assert_allclose(np.abs(got), np.abs(vecs.T), rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------------ errors
def test_edges_must_join_a_tensor_and_an_operation() -> None:
    g = OpGraph()
    a, b, add = g.add_node(Tensor(np.ones(2))), g.add_node(Tensor(np.ones(2))), g.add_node(Add())
    with pytest.raises(OpGraphError, match=r"edge 0 -> 1: both ends are tensors.*bipartite"):
        g.add_edge(a, b, "i")
    with pytest.raises(OpGraphError, match=r"both ends are operations"):
        g.add_edge(add, g.add_node(Add()), "i")
    with pytest.raises(OpGraphError, match=r"modes 'i,j' name 2 axes, tensor 0 .* has rank 1"):
        g.add_edge(a, add, "i,j")
    with pytest.raises(OpGraphError, match=r"no node 9"):
        g.add_edge(a, 9, "i")
    with pytest.raises(OpGraphError, match=r"holds data"):
        g.add_edge(add, b, "i")
    out = g.add_node(Tensor())
    g.add_edge(add, out, "i")
    with pytest.raises(OpGraphError, match=r"already the result of operation 2; a tensor has one producer"):
        g.add_edge(g.add_node(Add()), out, "i")
    with pytest.raises(OpGraphError, match=r"add_node takes a Tensor or an Operation"):
        g.add_node(np.ones(2))  # type: ignore[arg-type]
    with pytest.raises(OpGraphError, match=r"empty label"):
        Edge(0, 1, "i,")


def test_label_errors_name_the_node() -> None:
    g = OpGraph()
    a, add, c = g.add_node(Tensor(np.ones((2, 3)))), g.add_node(Add()), g.add_node(Tensor())
    g.add_edge(a, add, "i,k")
    g.add_edge(add, c, "i,j")
    with pytest.raises(OpGraphError, match=r"operation node 1: \+: output mode\(s\) j appear in no input edge"):
        g.to_graph()
    g = OpGraph()
    a, b, add, c = (g.add_node(Tensor(np.ones((2, 3)))), g.add_node(Tensor(np.ones(2))), g.add_node(Add()),
                    g.add_node(Tensor()))
    g.add_edge(a, add, "i,k")
    g.add_edge(b, add, "i")
    g.add_edge(add, c, "i")
    with pytest.raises(OpGraphError, match=r"operation node 2: \+: input edge 'i,k' has mode\(s\) k not in the "
                                           r"output 'i'"):
        g.to_graph()
    e = T(np.ones((2, 3)))["i,k"] * T(np.ones((3, 4)))["k,j"]
    with pytest.raises(OpGraphError, match=r"output mode\(s\) x appear in no input edge"):
        e.opgraph("i,x")
    with pytest.raises(opgraph.OpBuildError, match=r"operation node 2 .*subscript 'k' has sizes \[3, 5\]"):
        (T(np.ones((2, 3)))["i,k"] * T(np.ones((5, 4)))["k,j"]).opgraph("i,j").to_graph()


def test_cycles_and_missing_data_are_reported() -> None:
    g = OpGraph()
    t0, op0, t1, op1 = g.add_node(Tensor()), g.add_node(Elementwise("exp")), g.add_node(Tensor()), g.add_node(
        Elementwise("exp"))
    g.add_edge(t1, op0, "i")
    g.add_edge(op0, t0, "i")
    g.add_edge(t0, op1, "i")
    g.add_edge(op1, t1, "i")
    with pytest.raises(OpGraphError, match=r"cycle through operation node\(s\) \[1, 3\]"):
        g.to_graph()
    h = OpGraph()
    x, e, y = h.add_node(Tensor(name="x")), h.add_node(Elementwise("exp")), h.add_node(Tensor())
    h.add_edge(x, e, "i")
    h.add_edge(e, y, "i")
    with pytest.raises(OpGraphError, match=r"tensor node 0 \(x\) has no value, no type and no producer"):
        h.to_graph()


def test_expression_errors() -> None:
    with pytest.raises(OpGraphError, match="label it first"):
        T(np.ones(2))["i"] * np.ones(2)  # type: ignore[operator]
    c = T(name="c")
    with pytest.raises(OpGraphError, match="no value, no type and is not assigned"):
        (c["i"] * T(np.ones(2))["i"]).opgraph()
    with pytest.raises(OpGraphError, match="holds data"):
        T(np.ones(2))["i"] = T(np.ones(2))["i"]
    with pytest.raises(OpGraphError, match="apply\\(\\) takes element-wise ops"):
        apply("matmul", T(np.ones(2))["i"])


# ------------------------------------------------------------------------------------------------ index notation
def test_issue_example_and_default_modes() -> None:
    A, B, C = RNG.standard_normal((3, 5)), RNG.standard_normal((5, 4)), RNG.standard_normal((3, 4))
    expr = T(A)["i,k"] * T(B)["k,j"] + T(C)["i,j"]
    np.testing.assert_allclose(expr.opgraph("i,j").run()[0], A @ B + C, rtol=1e-12)
    np.testing.assert_allclose(expr.opgraph("j,i").run()[0], (A @ B + C).T, rtol=1e-12)
    assert (T(A)["i,k"] * T(B)["k,j"]).free_labels() == ("i", "j")
    np.testing.assert_allclose(expr.eval(), A @ B + C, rtol=1e-12)


@pytest.mark.parametrize("subs", [
    "ij,jk->ik",        # contraction
    "ii->",             # trace
    "ij,ij->ij",        # element-wise product
    "i,j->ij",          # tensor (outer) product
    "ij,ij->",          # full contraction
    "ijk,ikl->jl",      # several shared labels
    "abij,cdab->ijcd",  # coupled-cluster ladder
    "ij,jk,kl,lm->mi",  # a chain, one einsum ordered by opt_einsum
    "ii,ij->j",         # trace inside a product
    "ij,j->ij",         # a broadcast-like product (j kept)
])
def test_general_multiplication_matches_einsum(subs: str) -> None:
    lhs, out = subs.split("->")
    size = {c: 2 + k for k, c in enumerate(sorted(set(lhs) - {","}))}
    arrays = [RNG.standard_normal(tuple(size[c] for c in term)) for term in lhs.split(",")]
    expr = None
    for term, arr in zip(lhs.split(","), arrays, strict=True):
        x = T(arr)[",".join(term)]
        expr = x if expr is None else expr * x
    og = expr.opgraph(",".join(out))
    (mult,) = [n for n in og.nodes() if isinstance(n, Operation)]
    assert isinstance(mult, Multiply)  # one operation node: the product is fused into one einsum
    np.testing.assert_allclose(og.run()[0], np.einsum(subs, *arrays), rtol=1e-11, atol=1e-12)


@st.composite
def products(draw: st.DrawFn) -> tuple[list[str], str]:
    labels = list("abcdefg")
    n_ops = draw(st.integers(1, 4))
    terms = [draw(st.lists(st.sampled_from(labels), min_size=0, max_size=4, unique=True)) for _ in range(n_ops)]
    used = list(dict.fromkeys(c for t in terms for c in t))
    out = draw(st.permutations(used)) if used else []
    keep = draw(st.integers(0, len(out)))
    return ["".join(t) for t in terms], "".join(out[:keep])


@settings(max_examples=60, deadline=None)
@given(products(), st.integers(0, 2**32 - 1))
def test_random_products_match_einsum(case: tuple[list[str], str], seed: int) -> None:
    terms, out = case
    rng = np.random.default_rng(seed)
    size = {c: int(rng.integers(1, 4)) for c in string.ascii_lowercase}
    arrays = [rng.standard_normal(tuple(size[c] for c in t)) for t in terms]
    expr = None
    for t, arr in zip(terms, arrays, strict=True):
        x = T(arr)[",".join(t)]
        expr = x if expr is None else expr * x
    got = expr.eval(",".join(out))
    np.testing.assert_allclose(got, np.einsum(",".join(terms) + "->" + out, *arrays), rtol=1e-10, atol=1e-10)


def test_sums_scalars_and_elementwise_align_by_labels() -> None:
    A, B, v = RNG.standard_normal((3, 4)), RNG.standard_normal((4, 3)), RNG.uniform(1, 2, 4)
    a, b, x = T(A)["i,j"], T(B)["j,i"], T(v)["j"]
    np.testing.assert_allclose((a + b).eval("i,j"), A + B.T)
    np.testing.assert_allclose((a - b).eval("j,i"), (A - B.T).T)
    np.testing.assert_allclose((2.0 * a + b * 3).eval("i,j"), 2 * A + 3 * B.T)
    np.testing.assert_allclose((-a).eval("i,j"), -A)
    np.testing.assert_allclose((a / x).eval("i,j"), A / v)  # x broadcast along i by its label
    np.testing.assert_array_equal((a / 3).eval("i,j"), A / 3)  # a division, rounded as NumPy's
    np.testing.assert_allclose((a**3).eval("i,j"), A**3)
    np.testing.assert_allclose(apply("exp", b).eval("i,j"), np.exp(B.T))
    np.testing.assert_allclose(apply("maximum", a, b).eval("i,j"), np.maximum(A, B.T))
    # a sum inside a product: (A + Bᵀ) contracted with v over j
    np.testing.assert_allclose(((a + b) * x).eval("i"), (A + B.T) @ v, rtol=1e-12)
    # a product inside a division, computed in the output's modes
    np.testing.assert_allclose(((a * x) / T(A)["i,j"]).eval("i,j"), np.broadcast_to(v, (3, 4)), rtol=1e-12)


def test_common_subexpression_is_one_node() -> None:
    A = RNG.standard_normal((4, 4))
    a = T(A, name="A")
    prod = a["i,k"] * a["k,j"]  # A used twice by one product: two edges from one tensor node
    c, d = T(name="c"), T(name="d")
    c["i,j"] = prod + a["i,j"]
    d["i,j"] = prod - a["j,i"]
    og = OpGraph.from_equations(c, d)
    assert sum(isinstance(n, Multiply) for n in og.nodes()) == 1
    (a_node,) = [u for u, n in enumerate(og.nodes()) if isinstance(n, Tensor) and n.name == "A"]
    assert og.out_degree(a_node) == 4 and len(og.adjacent_nodes(a_node)) == 3
    got_c, got_d = og.run()
    np.testing.assert_allclose(got_c, A @ A + A, rtol=1e-12)
    np.testing.assert_allclose(got_d, A @ A - A.T, rtol=1e-12)
    # two tensor_expr of one array are two nodes: the OpGraph takes what it is given (seed 004)
    og2 = (T(A)["i,j"] + T(A)["i,j"]).opgraph("i,j")
    assert sum(isinstance(n, Tensor) for n in og2.nodes()) == 3


def test_equations_chain_and_refuse_self_reference() -> None:
    A = RNG.standard_normal((3, 3))
    c, d = T(name="c"), T(name="d")
    c["i,j"] = T(A)["i,k"] * T(A)["k,j"]
    d["j,i"] = c["i,j"] * 2.0
    og = OpGraph.from_equations(d)
    np.testing.assert_allclose(og.run()[0], 2 * (A @ A).T, rtol=1e-12)
    e = T(name="e")
    e["i"] = e["i"] * 2.0
    with pytest.raises(OpGraphError, match="defined in terms of itself"):
        OpGraph.from_equations(e)


def test_placeholders_and_lazy_arrays_as_data() -> None:
    x = onp.placeholder((3, 4), name="x")
    w = onp.asarray(RNG.standard_normal((4, 2))) * 2.0  # a lazy value computed from a constant
    og = (T(x)["i,k"] * T(w)["k,j"]).opgraph("i,j")
    assert [og.to_graph().name_of(v) for v in og.to_graph().inputs.tolist()] == ["x"]
    xv = RNG.standard_normal((3, 4))
    np.testing.assert_allclose(og.run(x=xv)[0], xv @ w.eval(), rtol=1e-12)
    with pytest.raises(opgraph.ExecutionError, match="missing feed"):
        og.run()
    og2 = (T(type=("float32", (2,)), name="y")["i"] * 2.0).opgraph("i")
    assert og2.run(y=np.ones(2, np.float32))[0].dtype == np.float32


# ------------------------------------------------------------------------------------------------ conversion
def _graphs() -> list[opgraph.Graph]:
    gs = []
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3)), name="x")
    y = b.input(("float64", (3, 4)), name="y")
    z = b.input(("float64", (4,)), name="z")
    m = b.op("einsum", x, y, subscripts="ij,jk->ki")
    t = b.op("permute_dims", m, axes=(1, 0))
    s = b.op("add", t, z)  # broadcasting: z's label is the trailing one
    w, v = b.op("eigh", b.op("matmul", b.op("permute_dims", s), s))
    b.output(b.op("tanh", s), w, v, b.op("sum", s, axis=0))
    gs.append(b.freeze())
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (5,)), name="x")
    c = b.constant(np.arange(5, dtype=np.float32), name="c")
    b.output(b.op("where", b.op("greater", x, c), x, c), b.op("einsum", x, x, subscripts="i,i"))
    gs.append(b.freeze())
    b = opgraph.GraphBuilder()
    s0 = b.input(("float64", (3,)), name="s")
    s1 = b.op("multiply", s0, 0.5)
    b.update(s1, s0)
    b.output(s1)
    gs.append(b.freeze())
    return gs


@pytest.mark.parametrize("k", range(3))
def test_from_graph_to_graph_is_lossless(k: int) -> None:
    g = _graphs()[k]
    og = OpGraph.from_graph(g)
    back = og.to_graph()
    assert back.equals(g, check_names=True)
    assert OpGraph.from_graph(back).edges() == og.edges()
    feeds = {g.name_of(v): RNG.standard_normal(g.type_of(v).shape).astype(g.type_of(v).dtype)
             for v in g.inputs.tolist()}
    for a, b in zip(back.run(feeds), g.run(feeds), strict=True):
        np.testing.assert_array_equal(a, b)


def _canonical(g: opgraph.Graph) -> tuple[Any, ...]:
    """The graph up to value numbering: each op (in a topological order: the graph's own if it has one) with its
    kind, version, attributes, constant, output types, and where each input comes from (the k-th graph input, or
    output j of the i-th op)."""
    order = list(range(g.num_ops)) if g.is_topologically_ordered() else g.topological_order().tolist()
    where = {v: ("input", k) for k, v in enumerate(g.inputs.tolist())}
    for i, op in enumerate(order):
        for j, v in enumerate(g.op_outputs(op).tolist()):
            where[v] = ("op", i, j)
    ops = []
    for op in order:
        attrs = {k: v for k, v in g.attrs_of(op).items() if not (g.kind_of(op) == "const" and k == "index")}
        const = g.constant_of(op).tobytes() if g.kind_of(op) == "const" else None
        ops.append((g.kind_of(op), int(g.op_version[op]), repr(attrs), const,
                    [where[v] for v in g.op_inputs(op).tolist()], [repr(g.type_of(v)) for v in g.op_outputs(op)]))
    names = sorted((str(where[v]), n) for v, n in g.symbols.values.items())
    return (tuple(map(str, ops)), tuple(str(where[v]) for v in g.outputs.tolist()),
            tuple(str((where[int(s)], where[int(d)])) for s, d in g.updates.reshape(-1, 2)), tuple(names),
            tuple(repr(g.type_of(v)) for v in g.inputs.tolist()))


@pytest.mark.parametrize("path", TENSCALC_FILES, ids=os.path.basename)
def test_tenscalc_files_round_trip(path: str) -> None:
    """Graphs TensCalc wrote (unknown ranks, TensCalc's own op kinds, its value numbering and op order) come back
    the same, up to the numbering of values and ops (the builder numbers values in creation order, and ops come in
    a topological order)."""
    g = opgraph.load(path)
    og = OpGraph.from_graph(g)
    for e in og.edges():  # a tensor of unknown rank has one label, "...", on a positional operation's edge
        t = og[e.source] if isinstance(og[e.source], Tensor) else og[e.target]
        assert (e.modes == "...") == (t.type is None or t.type.rank is None)
        assert e.modes != "..." or type(og[e.target if t is og[e.source] else e.source]) is Operation
    assert any(e.modes == "..." for e in og.edges())
    assert _canonical(og.to_graph()) == _canonical(g)


def test_from_graph_reads_modes_and_permutations() -> None:
    g = _graphs()[0]
    og = OpGraph.from_graph(g)
    kinds = [type(n).__name__ if type(n) is not Operation else n.kind for n in og.nodes()
             if isinstance(n, Operation)]
    assert kinds == ["Multiply", "Permute", "Add", "Permute", "matmul", "eigh", "Elementwise", "sum"]
    mult = next(u for u, n in enumerate(og.nodes()) if isinstance(n, Multiply))
    assert [e.modes for e in og.in_edges(mult)] == ["i,j", "j,k"] and og.out_edges(mult)[0].modes == "k,i"
    perm = next(u for u, n in enumerate(og.nodes()) if isinstance(n, Permute))
    assert og.in_edges(perm)[0].modes == "i,j" and og.out_edges(perm)[0].modes == "j,i"
    add = next(u for u, n in enumerate(og.nodes()) if isinstance(n, Add))
    assert [e.modes for e in og.in_edges(add)] == ["i,j", "j"]
    assert og.result_tensors() == og.outputs and len(og.outputs) == 4  # the graph's outputs, in order


def test_opgraph_to_graph_to_opgraph_keeps_edges() -> None:
    t2, V = RNG.standard_normal((4, 4, 2, 2)), RNG.standard_normal((4, 4, 4, 4))
    og = (T(t2, name="T2")["a,b,i,j"] * T(V, name="V")["c,d,a,b"]).opgraph("i,j,c,d")
    g = og.to_graph()
    assert [g.kind_of(o) for o in range(g.num_ops)] == ["const", "const", "einsum"]
    back = OpGraph.from_graph(g)
    assert back.edges() == og.edges()
    np.testing.assert_allclose(back.run()[0], np.einsum("abij,cdab->ijcd", t2, V), rtol=1e-12)


# ------------------------------------------------------------------------------------------------ lowering
class NoEinsum(NumpyBackend):
    """A backend without einsum or tensordot (its basic ops: seed 004's BasicOps without contractions)."""

    def why_not(self, info: opgraph.backends.OpInfo) -> str | None:
        if info.kind in ("einsum", "tensordot"):
            return "no einsum here"
        return super().why_not(info)


@pytest.fixture
def no_einsum() -> str:
    backend = opgraph.backends.register(NoEinsum("no_einsum", doc="test: numpy without einsum"))
    yield backend.name
    from opgraph import backends

    backends._MODULES.pop("no_einsum", None)
    backends._LOADED.pop("no_einsum", None)


def test_backend_without_einsum_runs_ttgt(no_einsum: str) -> None:
    arrays = [RNG.standard_normal(s) for s in ((30, 4), (4, 40), (40, 5), (5, 20))]
    expr = T(arrays[0])["i,j"] * T(arrays[1])["j,k"] * T(arrays[2])["k,l"] * T(arrays[3])["l,m"]
    og = expr.opgraph("m,i")
    g, weights = og.to_graph(data="inputs")
    low = lower(g, lambda info: info.kind not in ("einsum", "tensordot"))
    assert low.counts == {"lower.einsum_pairwise": 1, "lower.einsum_ttgt": 3}
    kinds = {low.graph.kind_of(o) for o in range(low.graph.num_ops)}
    assert kinds <= {"matmul", "permute_dims", "reshape"}
    # opt_einsum's order: (B C) first, 4x40x5 multiplications, not the 30x4x40 of (A B)
    first = next(o for o in range(low.graph.num_ops) if low.graph.kind_of(o) == "matmul")
    assert {low.graph.type_of(v).shape for v in low.graph.op_inputs(first).tolist()} <= {(4, 40), (40, 5), (5, 40),
                                                                                           (40, 4)}
    prog = opgraph.compile(g, backend=no_einsum, partition=False)
    ref = np.einsum("ij,jk,kl,lm->mi", *arrays)
    np.testing.assert_allclose(prog(weights)[0], ref, rtol=1e-10)


@pytest.mark.parametrize("out,kinds", [
    ("c,d,i,j", ["reshape", "reshape", "matmul", "reshape"]),
    ("i,j,c,d", ["reshape", "permute_dims", "reshape", "permute_dims", "matmul", "reshape"]),
    ("d,c,j,i", ["reshape", "reshape", "matmul", "reshape", "permute_dims"]),
])
def test_ttgt_reads_blocked_operands_without_copies(out: str, kinds: list[str]) -> None:
    """The coupled-cluster ladder ``T2[a,b,i,j] V[c,d,a,b]``: both operands become matrices by a reshape (and a
    2-D transpose, a view the GEMM reads as it is); V, the large operand, is never permuted. Only an output order
    that is neither (c,d | i,j) nor (i,j | c,d) costs a permutation, of the result."""
    t2, V = RNG.standard_normal((5, 5, 2, 2)), RNG.standard_normal((5, 5, 5, 5))
    og = (T(t2)["a,b,i,j"] * T(V)["c,d,a,b"]).opgraph(out)
    low = lower(og.to_graph(data="inputs").graph, lambda info: info.kind != "einsum").graph
    assert [low.kind_of(o) for o in range(low.num_ops)] == kinds
    for o in range(low.num_ops):
        if low.kind_of(o) == "permute_dims" and o != low.num_ops - 1:
            assert len(low.type_of(int(low.op_inputs(o)[0])).shape) == 2  # a 2-D transpose: a view
    np.testing.assert_allclose(low.run(og.feeds())[0], np.einsum("abij,cdab->" + out.replace(",", ""), t2, V),
                               rtol=1e-12)


@st.composite
def pairs(draw: st.DrawFn) -> tuple[str, str, str]:
    labels = list("abcdef")
    la = draw(st.lists(st.sampled_from(labels), min_size=0, max_size=4, unique=True))
    lb = draw(st.lists(st.sampled_from(labels), min_size=0, max_size=4, unique=True))
    used = list(dict.fromkeys(la + lb))
    out = draw(st.permutations(used))
    keep = draw(st.integers(0, len(out)))
    return "".join(la), "".join(lb), "".join(out[:keep])


@settings(max_examples=80, deadline=None)
@given(pairs(), st.integers(0, 2**32 - 1))
def test_ttgt_matches_einsum_on_random_label_layouts(case: tuple[str, str, str], seed: int) -> None:
    la, lb, lo = case
    rng = np.random.default_rng(seed)
    size = {c: int(rng.integers(1, 4)) for c in "abcdef"}
    a, b = rng.standard_normal(tuple(size[c] for c in la)), rng.standard_normal(tuple(size[c] for c in lb))
    g = (T(a)[",".join(la)] * T(b)[",".join(lb)]).opgraph(",".join(lo)).to_graph(data="inputs").graph
    low = lower(g, lambda info: info.kind != "einsum").graph
    assert "einsum" not in {low.kind_of(o) for o in range(low.num_ops)}
    got = low.run({"t0": a, "t1": b})[0]
    np.testing.assert_allclose(got, np.einsum(f"{la},{lb}->{lo}", a, b), rtol=1e-10, atol=1e-12)


def test_engines_run_the_fused_einsum() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    arrays = [RNG.standard_normal(s) for s in ((6, 3), (3, 7), (7, 2))]
    og = (T(arrays[0])["i,j"] * T(arrays[1])["j,k"] * T(arrays[2])["k,l"]).opgraph("l,i")
    ref = np.einsum("ij,jk,kl->li", *arrays)
    for backend in ("numpy", "torch", "jax", "onnxruntime", "dask"):
        np.testing.assert_allclose(og.run(backend=backend)[0], ref, rtol=1e-10, err_msg=backend)
    prog = opgraph.compile(og.to_graph(), backend="torch")
    assert "einsum" in prog.explain() and "numpy" not in re.sub(r"numpy \d", "", prog.explain().split("\n", 1)[-1])


# ------------------------------------------------------------------------------------------------ drawing
def test_drawing_in_the_seed_notation(tmp_path: object) -> None:
    A = T(np.ones((2, 2)), name="A")
    og = (A["j,i"] + T(np.ones((2, 2)), name="B")["i,j"]).opgraph("i,j")
    dot = opgraph.viz.to_dot(og)
    assert re.search(r'n0 \[shape="square", label="A\\nf64\[2,2\]"', dot)
    assert re.search(r'n2 \[shape="circle", label="\+"', dot)
    assert 'n0 -> n2 [label="j,i  ⟲ (1,0)", penwidth="2", color="#d62728"' in dot  # the permutation, on its edge
    assert 'n1 -> n2 [label="i,j", penwidth="2"]' in dot
    assert 'n2 -> n3 [label="i,j", penwidth="2"]' in dot
    g3 = OpGraph()
    x, p, y = g3.add_node(Tensor(np.ones((2, 3, 4)))), g3.add_node(Permute()), g3.add_node(Tensor())
    g3.add_edge(x, p, "i,j,k")
    g3.add_edge(p, y, "k,i,j")
    assert 'n1 -> n2 [label="k,i,j  ⟲ (2,0,1)", penwidth="3"' in opgraph.viz.to_dot(g3)
    import os

    path = opgraph.viz.render(og, os.path.join(str(tmp_path), "og.svg"))
    text = open(path).read()
    assert "<svg" in text and "j,i" in text and "⟲" in text
    svg = og._repr_svg_()
    assert svg is not None and "<svg" in svg


def test_node_reprs_and_str() -> None:
    og = (T(np.ones((2, 3)), name="A")["i,k"] * T(np.ones((3, 2)), name="B")["k,j"] * 0.5).opgraph("i,j")
    text = str(og)
    assert "= *(0[i,k], 1[k,j])" in text and "×0.5" in text  # noqa: RUF001
    assert repr(Multiply()) == "Multiply()" and repr(Scale(2)) == "Scale(2)" and repr(Slice((0,), (1,))) == (
        "Slice((0,), (1,))")
    assert repr(Operation("sum", axis=0)) == "Operation('sum', axis=0)" and repr(Cholesky()) == "Cholesky()"
    with pytest.raises(KeyError):
        Operation("no_such_op")
