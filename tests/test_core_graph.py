"""Core IR: builder, frozen columnar graph, derived indices, verify, equality, executor."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import opgraph
from opgraph.core.dtypes import DTYPE_CODES, as_dtype, promote
from opgraph.core.graph import Graph
from opgraph.core.registry import OpDef, get_op, register_op
from opgraph.core.types import TensorType, broadcast_shapes
from opgraph.runtime.executor import execute


def small_graph() -> tuple[Graph, dict[str, int]]:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    y = b.input(("float64", (3,)), name="y")
    s = b.add(x, y)
    p = b.multiply(s, 2.0)
    q = b.exp(x)  # not needed for p
    b.output(p, q)
    return b.freeze(), {"x": x.id, "y": y.id, "s": s.id, "p": p.id, "q": q.id}


def rebuild(g: Graph, **changes: object) -> Graph:
    """A copy of g's arrays with some replaced (to make broken graphs on purpose)."""
    fields = dict(op_kind=g.op_kind, op_attr=g.op_attr, op_version=g.op_version, in_ptr=g.in_ptr,
                  in_ids=g.in_ids, out_ptr=g.out_ptr, out_ids=g.out_ids, value_type=g.value_type,
                  value_producer=g.value_producer, value_index=g.value_index, types=g.types, attrs=g.attrs,
                  constants=g.constants, inputs=g.inputs, outputs=g.outputs, updates=g.updates, symbols=g.symbols)
    fields.update(changes)
    return Graph(**fields)  # type: ignore[arg-type]


def permute_ops(g: Graph, perm: np.ndarray) -> Graph:
    """The same graph with ops stored in the order ``perm`` (values keep their ids)."""
    in_lists = [g.op_inputs(int(o)) for o in perm]
    out_lists = [g.op_outputs(int(o)) for o in perm]
    new_index = np.empty(len(perm), dtype=np.int64)
    new_index[perm] = np.arange(len(perm))
    producer = np.where(g.value_producer >= 0, new_index[np.maximum(g.value_producer, 0)], -1)
    return rebuild(
        g, op_kind=g.op_kind[perm], op_attr=g.op_attr[perm], op_version=g.op_version[perm],
        in_ptr=np.concatenate([[0], np.cumsum([len(i) for i in in_lists])]),
        in_ids=np.concatenate(in_lists) if in_lists else [],
        out_ptr=np.concatenate([[0], np.cumsum([len(o) for o in out_lists])]),
        out_ids=np.concatenate(out_lists) if out_lists else [], value_producer=producer)


# ------------------------------------------------------------------ types
def test_promotion_matches_numpy_for_every_pair() -> None:
    names = list(DTYPE_CODES)
    for a, b in itertools.product(names, names):
        assert promote(as_dtype(a), as_dtype(b)) == np.result_type(a, b), (a, b)


def test_dtype_codes_are_stable() -> None:
    # These numbers are written into files and op versions: they must never change.
    assert DTYPE_CODES == {"bool": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint8": 6, "uint16": 7,
                           "uint32": 8, "uint64": 9, "float16": 10, "float32": 11, "float64": 12,
                           "complex64": 13, "complex128": 14}


def test_tensor_types() -> None:
    t = TensorType("float32", (2, None))
    assert t.rank == 2 and not t.is_static and t.size is None
    assert TensorType("f8", (2, 3)).nbytes == 48
    assert TensorType("int8", None).rank is None
    assert t.accepts(np.zeros((2, 7), np.float32)) and not t.accepts(np.zeros((3, 7), np.float32))
    assert not t.accepts(np.zeros((2, 7), np.float64))
    assert TensorType("f4", (2, -1)) == t  # -1 means unknown
    with pytest.raises(opgraph.OpTypeError):
        TensorType("datetime64", (1,))
    with pytest.raises(opgraph.OpTypeError):
        TensorType("f4", (2.5,))
    assert hash(TensorType("f4", (2,))) == hash(TensorType(np.float32, [2]))


def test_broadcast_shapes_against_numpy() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        shapes = [tuple(int(d) for d in rng.choice([1, 1, 2, 3], size=rng.integers(0, 4))) for _ in range(3)]
        try:
            want = np.broadcast_shapes(*shapes)
        except ValueError:
            with pytest.raises(opgraph.OpTypeError):
                broadcast_shapes(*shapes)
        else:
            assert broadcast_shapes(*shapes) == want


# ------------------------------------------------------------------ builder
def test_builder_columnar_layout() -> None:
    g, ids = small_graph()
    assert g.num_ops == 4  # add, const 2.0, multiply, exp
    assert [g.kind_of(i) for i in range(g.num_ops)] == ["add", "const", "multiply", "exp"]
    assert list(g.op_inputs(0)) == [ids["x"], ids["y"]]
    assert g.value_producer[ids["x"]] == -1 and g.value_producer[ids["s"]] == 0
    assert list(g.inputs) == [ids["x"], ids["y"]] and list(g.outputs) == [ids["p"], ids["q"]]
    assert g.in_ptr.dtype == np.int64 and g.in_ids.dtype == np.int32
    assert g.symbols.values[ids["x"]] == "x"
    g.verify()


def test_graph_is_immutable() -> None:
    g, _ = small_graph()
    with pytest.raises(ValueError):
        g.in_ids[0] = 5
    with pytest.raises(AttributeError):
        g.op_kind = np.zeros(3)  # type: ignore[misc]


def test_hash_consing_is_cse_while_building() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)))
    assert b.exp(x) == b.exp(x)
    assert b.constant([1.0, 2.0]) == b.constant(np.array([1.0, 2.0]))
    assert b.constant([1.0, 2.0]) != b.constant(np.array([1.0, 2.0], np.float32))
    assert b.sum(x, axis=0) == b.sum(x, axis=(0,))  # attributes are normalised before interning
    n = b.num_ops
    b2 = opgraph.GraphBuilder(hash_cons=False)
    x2 = b2.input(("float64", (3,)))
    assert b2.exp(x2) != b2.exp(x2)
    assert n == 4 and b2.num_ops == 2


def test_multi_output_op_and_names() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (6, 2)), name="x")
    parts = b.op("split", x, sections=3, axis=0)
    assert len(parts) == 3 and all(p.type == TensorType("float32", (2, 2)) for p in parts)
    g = b.freeze()
    assert g.op(0).outputs == [g.value(p.id) for p in parts]
    assert [int(v) for v in g.value_index[[p.id for p in parts]]] == [0, 1, 2]
    with pytest.raises(opgraph.GraphError, match="named 'x'"):
        b.input(("float32", ()), name="x")


def test_values_from_another_builder_are_rejected() -> None:
    b1, b2 = opgraph.GraphBuilder(), opgraph.GraphBuilder()
    x = b1.input(("float64", ()))
    with pytest.raises(opgraph.GraphError, match="another builder"):
        b2.exp(x)


def test_attribute_errors_name_the_op() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3)))
    with pytest.raises(opgraph.OpBuildError, match=r"sum\(f64\[2,3\]\): unknown attribute"):
        b.sum(x, axes=1)
    with pytest.raises(opgraph.OpBuildError, match=r"cast.*missing required attribute 'dtype'"):
        b.cast(x)
    with pytest.raises(opgraph.OpBuildError, match="takes 2 input"):
        b.add(x)


def test_update_edges_and_gateways() -> None:
    b = opgraph.GraphBuilder()
    s = b.input(("float64", ()), name="s")
    b.update(b.add(s, 1.0), s)
    with pytest.raises(opgraph.GraphError, match="not an input"):
        b.update(s, b.add(s, 2.0))
    with pytest.raises(opgraph.GraphError, match="changes type"):
        b.update(b.cast(s, dtype="float32"), s)
    g = b.freeze().verify()
    assert g.updates.shape == (1, 2)


def test_seed003_spelling() -> None:
    b = opgraph.GraphBuilder()
    x = b.build_placeholder(("float64", (2,)), "x")
    c = b.build_const(np.array([1.0, 2.0]), "c")
    y = b.build_op_add(x, c)
    assert b.run({x: np.array([10.0, 20.0])}, [y])[0].tolist() == [11.0, 22.0]


# ------------------------------------------------------------------ derived indices
def test_consumers_csr_matches_a_plain_scan() -> None:
    g, _ = small_graph()
    ptr, ops = g.consumers()
    for v in range(g.num_values):
        want = sorted(o for o in range(g.num_ops) for i in g.op_inputs(o) if i == v)
        assert sorted(ops[ptr[v]:ptr[v + 1]].tolist()) == want


def random_dag(n_ops: int, seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    b = opgraph.GraphBuilder(hash_cons=False)
    vals = [b.input(("float64", (2,)), name=f"in{i}") for i in range(3)]
    kinds = ["add", "multiply", "maximum", "subtract"]
    for _ in range(n_ops):
        a, c = rng.integers(0, len(vals), size=2)
        k = kinds[int(rng.integers(0, len(kinds)))]
        vals.append(b.op(k, vals[int(a)], vals[int(c)]) if rng.random() < 0.8 else b.exp(vals[int(a)]))
    b.output(vals[-1], vals[-5])
    return b.freeze()


@pytest.mark.parametrize("seed", range(5))
def test_topological_order_of_shuffled_graphs(seed: int) -> None:
    g = random_dag(60, seed)
    perm = np.random.default_rng(seed).permutation(g.num_ops)
    shuffled = permute_ops(g, perm).verify()
    assert not shuffled.is_topologically_ordered()
    order = shuffled.topological_order()
    position = np.empty(g.num_ops, dtype=np.int64)
    position[order] = np.arange(g.num_ops)
    for op in range(g.num_ops):
        for v in shuffled.op_inputs(op):
            p = shuffled.value_producer[v]
            assert p < 0 or position[p] < position[op]
    feeds = {f"in{i}": np.array([0.5 + i, -1.0 * i]) for i in range(3)}
    for a, b_ in zip(g.run(feeds), shuffled.run(feeds), strict=True):
        np.testing.assert_array_equal(a, b_)


@pytest.mark.parametrize("seed", range(5))
def test_needed_ops_matches_a_plain_backward_walk(seed: int) -> None:
    g = random_dag(80, seed)
    target = int(g.outputs[1])
    want = set()
    stack = [target]
    while stack:
        p = int(g.value_producer[stack.pop()])
        if p >= 0 and p not in want:
            want.add(p)
            stack.extend(int(v) for v in g.op_inputs(p))
    assert set(np.flatnonzero(g.needed_ops([target])).tolist()) == want


def test_descendants() -> None:
    g, ids = small_graph()
    d = g.descendants([ids["y"]])
    assert set(np.flatnonzero(d).tolist()) == {ids["y"], ids["s"], ids["p"]}


# ------------------------------------------------------------------ verify
def test_verify_reports_dangling_ids() -> None:
    g, _ = small_graph()
    bad = g.in_ids.copy()
    bad[1] = 99
    with pytest.raises(opgraph.VerifyError, match=r"op 0 \(add\): input refers to value 99"):
        rebuild(g, in_ids=bad).verify()


def test_verify_reports_value_produced_twice() -> None:
    g, ids = small_graph()
    outs = g.out_ids.copy()
    outs[3] = ids["s"]  # exp now claims to produce add's output
    with pytest.raises(opgraph.VerifyError) as info:
        rebuild(g, out_ids=outs).verify()
    text = str(info.value)
    assert "produced more than once: by op 0 (add) and op 3 (exp)" in text


def test_verify_reports_cycles_naming_ops() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2,)))
    a = b.exp(x)
    c = b.sin(a)
    g = b.freeze()
    ins = g.in_ids.copy()
    ins[0] = c.id  # exp(x) becomes exp(sin(exp(...)))
    broken = rebuild(g, in_ids=ins)
    with pytest.raises(opgraph.VerifyError) as info:
        broken.verify()
    text = str(info.value)
    assert "cycle" in text and "op 0 (exp)" in text and "op 1 (sin)" in text


def test_verify_reports_type_rule_violations_and_versions() -> None:
    g, ids = small_graph()
    types = list(g.types)
    vt = g.value_type.copy()
    types.append(TensorType("float32", (3,)))
    vt[ids["s"]] = len(types) - 1
    with pytest.raises(opgraph.VerifyError, match=r"op 0 \(add\): outputs have types \(f32\[3\],\), "
                                                  r"the type rule gives \(f64\[3\],\)"):
        rebuild(g, types=types, value_type=vt).verify()
    ver = g.op_version.copy()
    ver[0] = 3
    with pytest.raises(opgraph.VerifyError, match=r"op 0 \(add\): version 3, the inputs select 12"):
        rebuild(g, op_version=ver).verify()


def test_verify_reports_every_problem_at_once() -> None:
    g, ids = small_graph()
    ver = g.op_version.copy()
    ver[0] = 3
    ver[3] = 4
    with pytest.raises(opgraph.VerifyError) as info:
        rebuild(g, op_version=ver, inputs=[ids["x"]]).verify()
    problems = info.value.problems
    assert any("has no producer and is not an input" in p for p in problems)


def test_verify_reports_unknown_kinds_and_bad_constants() -> None:
    g, _ = small_graph()
    kinds = g.op_kind.copy()
    kinds[3] = 9999
    with pytest.raises(opgraph.VerifyError, match="op 3: unknown op kind id 9999"):
        rebuild(g, op_kind=kinds).verify()
    with pytest.raises(opgraph.VerifyError, match=r"op 1 \(const\): output type f64\[\] does not match"):
        rebuild(g, constants=[np.zeros(3)]).verify()


# ------------------------------------------------------------------ equality and printing
def test_structural_equality() -> None:
    g1, _ = small_graph()
    g2, _ = small_graph()
    assert g1 == g2 and g1 is not g2
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    y = b.input(("float64", (3,)), name="y")
    p = b.multiply(b.add(x, y), 3.0)  # another constant
    q = b.exp(x)
    b.output(p, q)
    assert b.freeze() != g1


def test_equality_ignores_table_order() -> None:
    g, _ = small_graph()
    perm = np.arange(len(g.types))[::-1]
    inverse = np.argsort(perm)
    reordered = rebuild(g, types=[g.types[i] for i in perm], value_type=inverse[g.value_type])
    assert reordered == g
    assert reordered.verify() is reordered


def test_names_count_only_when_asked() -> None:
    b1, b2 = opgraph.GraphBuilder(), opgraph.GraphBuilder()
    b1.output(b1.exp(b1.input(("float64", ()), name="a")))
    b2.output(b2.exp(b2.input(("float64", ()), name="b")))
    assert b1.freeze() == b2.freeze()
    assert not b1.freeze().equals(b2.freeze(), check_names=True)


def test_dump_is_readable() -> None:
    g, _ = small_graph()
    text = str(g)
    assert text.splitlines() == [
        "graph(%x: f64[3], %y: f64[3]) {",
        "  %2: f64[3] = add(%x, %y)",
        "  %3: f64[] = const 2.0",
        "  %4: f64[3] = multiply(%2, %3)",
        "  %5: f64[3] = exp(%x)",
        "  return %4, %5",
        "}",
    ]
    assert "4 ops" in repr(g)


# ------------------------------------------------------------------ running
def test_run_evaluates_only_the_needed_subgraph() -> None:
    g, ids = small_graph()
    calls: list[str] = []
    x, y = np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.5, 0.5])
    (p,) = execute(g, {"x": x, "y": y}, [ids["p"]], on_kernel=lambda op: calls.append(g.kind_of(op)))
    np.testing.assert_allclose(p, (x + y) * 2.0)
    assert calls == ["add", "multiply"]  # exp was not needed
    calls.clear()
    (q,) = execute(g, {"x": x}, [ids["q"]], on_kernel=lambda op: calls.append(g.kind_of(op)))
    np.testing.assert_allclose(q, np.exp(x))
    assert calls == ["exp"]  # y is not needed, so it need not be fed


def test_run_errors_are_clear() -> None:
    g, ids = small_graph()
    with pytest.raises(opgraph.ExecutionError, match=r"missing feed\(s\) for input\(s\) %y: f64\[3\]"):
        g.run({"x": np.ones(3)})
    with pytest.raises(opgraph.ExecutionError, match=r"input %x expects f64\[3\], got shape \(4,\)"):
        g.run({"x": np.ones(4), "y": np.ones(3)})
    with pytest.raises(opgraph.ExecutionError, match=r"expects f64.*dtype complex128"):
        g.run({"x": np.ones(3, complex), "y": np.ones(3)})
    with pytest.raises(opgraph.ExecutionError, match="computed by the graph"):
        g.run({ids["s"]: np.ones(3), "x": np.ones(3), "y": np.ones(3)})


def test_executor_checks_kernels_against_type_rules() -> None:
    bad = register_op(OpDef(name="test_bad_kernel", id=59001, arity=1, infer=lambda t, a: t,
                            kernel=lambda x, out=None: x.astype(np.float32)), replace=True)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2,)))
    b.output(b.op(bad, x))
    with pytest.raises(opgraph.ExecutionError, match=r"test_bad_kernel.*produced f32\[2\] where the type rule"):
        b.freeze().run({x.id: np.ones(2)})


def test_user_defined_op_end_to_end() -> None:
    def infer(in_types, attrs):
        (t,) = in_types
        return (t,)

    def kernel(x, out=None, *, alpha):
        return np.multiply(np.where(x > 0, x, alpha * x), 1, out=out)

    leaky = register_op(OpDef(name="test_leaky", id=59002, arity=1, infer=infer, kernel=kernel,
                              attrs={"alpha": opgraph.Attr(float, 0.01)}, elementwise=True), replace=True)
    assert get_op(59002) is leaky
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)))
    y = b.op("test_leaky", x, alpha=0.5)
    out = b.run({x: np.array([-2.0, 0.0, 2.0])}, [y])[0]
    np.testing.assert_allclose(out, [-1.0, 0.0, 2.0])
    with pytest.raises(ValueError, match="clashes"):
        register_op(OpDef(name="test_leaky2", id=59002, arity=1, infer=infer))


def test_bytes_per_op_of_an_elementwise_chain() -> None:
    b = opgraph.GraphBuilder()
    v = b.input(("float32", (8,)))
    for i in range(5000):
        v = b.op("add" if i % 2 else "multiply", v, v)
    g = b.freeze().verify()
    assert g.nbytes / g.num_ops < 100


def test_attributes_equal_in_python_but_not_in_meaning_stay_apart() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)))
    assert b.op("getitem", x, index=1) is not None
    with pytest.raises(opgraph.OpBuildError, match="getitem"):
        b.op("getitem", x, index=True)  # a bool index is rejected even after an int one was memoised
    p0 = b.op("pad", x, pad_width=1, constant_value=0.0)
    p1 = b.op("pad", x, pad_width=1, constant_value=-0.0)
    assert p0 != p1
    (out,) = b.run({x: np.ones(3)}, [p1])
    assert np.signbit(out[0])


def test_wide_graphs_use_the_vectorised_walks() -> None:
    # 300 independent branches: frontiers are wide, so the NumPy path of the walks runs.
    b = opgraph.GraphBuilder(hash_cons=False)
    xs = [b.input(("float64", ()), name=f"x{i}") for i in range(300)]
    level = [b.exp(x) for x in xs]
    while len(level) > 1:
        level = [b.add(level[i], level[i + 1]) if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    b.output(level[0])
    g = b.freeze()
    rev = permute_ops(g, np.arange(g.num_ops)[::-1])
    assert not rev.is_topologically_ordered()
    feeds = {f"x{i}": np.float64(i) / 300 for i in range(300)}
    np.testing.assert_allclose(rev.run(feeds)[0], np.exp(np.arange(300) / 300).sum())
    assert g.needed_ops([int(g.outputs[0])]).all()
    assert g.descendants([int(g.inputs[0])]).sum() == 1 + 1 + 9  # x0, exp(x0), then one add per tree level


def test_equality_compares_attributes_exactly() -> None:
    def build(value: float) -> Graph:
        b = opgraph.GraphBuilder()
        x = b.input(("float64", (2,)))
        b.output(b.op("pad", x, pad_width=1, constant_value=value))
        return b.freeze()

    assert build(float("nan")) == build(np.nan)  # NaN attributes equal each other
    assert build(0.0) != build(-0.0)
    assert build(1.0) == build(1.0)


def test_graph_pickles_and_the_copy_runs_in_another_process() -> None:
    import json
    import pickle
    import subprocess
    import sys

    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    s = b.input(("float64", ()), name="s")
    b.update(b.add(s, 1.0), s)
    b.output(b.multiply(b.exp(x), 2.0))
    g = b.freeze()
    data = pickle.dumps(g)
    assert pickle.loads(data).equals(g, check_names=True)
    code = ("import pickle, sys, numpy as np; g = pickle.loads(sys.stdin.buffer.read()); "
            "print(g.run({'x': np.array([0.0, 1.0, 2.0]), 's': np.float64(0)})[0].tolist())")
    out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, check=True).stdout
    assert np.allclose(json.loads(out), 2 * np.exp([0.0, 1.0, 2.0]))
