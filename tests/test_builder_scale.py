"""GraphBuilder at scale (issue 13): compact columns, the op methods' fast path, hash-consing chains.

Timing is not tested here (it depends on the machine); what the fast builder
must keep is: the graph it freezes, hash-consing's semantics (also when a
chain of candidates is long or spilled to a dict), the queries other layers
make on a builder, and its memory per op.
"""

from __future__ import annotations

import gc
import tracemalloc
import weakref
from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.core import builder as builder_mod
from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import INDEX, PTR, Graph, Value
from opgraph.core.registry import CONST, OpDef, get_op, register_op
from opgraph.core.types import TensorType

F8 = TensorType("float64", (8,))
KINDS = ("add", "multiply", "sin")


def random_dag(b: GraphBuilder, n: int, seed: int = 0, name: str | None = "x") -> tuple[np.ndarray, np.ndarray]:
    """Op i = add / multiply / sin of the previous value and (binary ones) a random earlier value.

    Returns the random operands and the kind index of each op. Values are made
    from ids (no list of Values), as a user holding only ids would.
    """
    rng = np.random.default_rng(seed)
    earlier = (rng.random(n) * np.arange(1, n + 1)).astype(np.int64).tolist()  # value id < i + 1
    kinds = np.arange(n) % 3
    v = b.input(F8, name=name)
    add, mul, sin = b.add, b.multiply, b.sin
    for i in range(n):
        k = i % 3
        if k == 0:
            v = add(v, Value(b, earlier[i]))
        elif k == 1:
            v = mul(v, Value(b, earlier[i]))
        else:
            v = sin(v)
    b.output(v)
    return np.array(earlier), kinds


def expected_dag(n: int, earlier: np.ndarray, kinds: np.ndarray) -> Graph:
    """The same DAG made directly as NumPy columns (the independent path)."""
    binary = kinds != 2
    arity = np.where(binary, 2, 1)
    in_ptr = np.concatenate([[0], np.cumsum(arity)]).astype(PTR)
    in_ids = np.empty(int(in_ptr[-1]), dtype=INDEX)
    in_ids[in_ptr[:-1]] = np.arange(n)  # the previous value: op i's output is value i + 1
    in_ids[in_ptr[:-1][binary] + 1] = earlier[binary]
    ops = [get_op(k) for k in KINDS]
    version = [op.version((F8,) * (1 if op.name == "sin" else 2), {}) for op in ops]
    return Graph(
        op_kind=np.array([op.id for op in ops])[kinds], op_attr=np.zeros(n, INDEX),
        op_version=np.array(version)[kinds], in_ptr=in_ptr, in_ids=in_ids,
        out_ptr=np.arange(n + 1), out_ids=np.arange(1, n + 1),
        value_type=np.zeros(n + 1, INDEX), value_producer=np.arange(-1, n), value_index=np.zeros(n + 1, INDEX),
        types=[F8], attrs=[()], constants=[], inputs=[0], outputs=[n],
    )


@pytest.mark.parametrize("hash_cons", [True, False])
def test_frozen_dag_equals_the_one_made_from_numpy_columns(hash_cons: bool) -> None:
    n = 3000
    b = GraphBuilder(hash_cons=hash_cons)
    earlier, kinds = random_dag(b, n)
    g = b.freeze()
    want = expected_dag(n, earlier, kinds)
    assert g.equals(want)
    for name in ("op_kind", "op_attr", "op_version", "in_ptr", "in_ids", "out_ptr", "out_ids", "value_type",
                 "value_producer", "value_index", "inputs", "outputs"):
        got, exp = getattr(g, name), getattr(want, name)
        assert got.dtype == exp.dtype and np.array_equal(got, exp), name
    g.verify()


def test_hash_consing_returns_earlier_ops_in_a_big_dag() -> None:
    n = 3000
    b = GraphBuilder()
    earlier, kinds = random_dag(b, n)
    before = b.num_ops
    for i in range(0, n, 7):  # rebuild some ops exactly: each returns the value it made
        prev = Value(b, i)
        got = b.sin(prev) if kinds[i] == 2 else getattr(b, KINDS[kinds[i]])(prev, Value(b, int(earlier[i])))
        assert got == Value(b, i + 1)
        # The general path (b.op) finds the same op.
        args = (prev,) if kinds[i] == 2 else (prev, Value(b, int(earlier[i])))
        assert b.op(KINDS[kinds[i]], *args) == Value(b, i + 1)
    assert b.num_ops == before
    # Same inputs in the other order, or another kind: new ops.
    assert b.add(Value(b, 7), Value(b, 1)) != b.add(Value(b, 1), Value(b, 7))
    assert b.multiply(Value(b, 1), Value(b, 7)) != b.add(Value(b, 1), Value(b, 7))
    assert b.num_ops == before + 3


class Mixed:
    """A graph with every shape of op record, and the expected columns kept in plain Python lists."""

    def __init__(self, b: GraphBuilder) -> None:
        self.b = b
        self.kind: list[int] = []
        self.attrs: list[dict[str, Any]] = []
        self.ins: list[list[int]] = []
        self.outs: list[list[int]] = []
        self.producer: dict[int, int] = {}
        self.index: dict[int, int] = {}
        self.types: dict[int, TensorType] = {}
        self.inputs: list[int] = []

    def note(self, kind: str, inputs: list[Any], out: Any, **attrs: Any) -> Any:
        """Record what the op just built must look like (the op is new)."""
        outs = list(out) if isinstance(out, tuple) else [out]
        op = len(self.kind)
        self.kind.append(get_op(kind).id)
        self.attrs.append(attrs)
        self.ins.append([v.id for v in inputs])
        self.outs.append([v.id for v in outs])
        for j, v in enumerate(outs):
            self.producer[v.id], self.index[v.id] = op, j
            self.types[v.id] = v.type
        return out

    def input(self, t: TensorType) -> Value:
        v = self.b.input(t)
        self.inputs.append(v.id)
        self.types[v.id] = t
        return v


@pytest.fixture(scope="module")
def sink_and_source() -> tuple[OpDef, OpDef]:
    """A user op with no outputs and one with no inputs."""
    sink = register_op(OpDef(name="test_scale_sink", id=59101, arity=1, infer=lambda t, a: ()), replace=True)
    source = register_op(OpDef(name="test_scale_source", id=59102, arity=0,
                               infer=lambda t, a: (TensorType("float32", (2,)),)), replace=True)
    return sink, source


def build_mixed(b: GraphBuilder, rounds: int = 40) -> Mixed:
    m = Mixed(b)
    f6 = TensorType("float32", (6,))
    x = m.input(f6)
    for r in range(rounds):
        y = m.input(f6)  # inputs between ops move the numbering of outputs
        c = m.note("const", [], b.constant(np.full(6, r, np.float32)))
        s = m.note("add", [x, y], b.add(x, y))
        t = m.note("sin", [s], b.sin(s))
        parts = m.note("split", [t], b.split(t, sections=3), sections=3)  # several outputs
        m.note("test_scale_sink", [parts[0]], b.op("test_scale_sink", parts[0]))  # no outputs
        ins = [parts[1], parts[2], parts[0], parts[1]]  # more than two inputs
        w = m.note("concat", ins, b.concat(*ins, axis=0), axis=0)
        m.note("sum", [w], b.sum(w, axis=0), axis=0)  # attributes
        if r % 5 == 0:
            m.note("test_scale_source", [], b.op("test_scale_source"))  # no inputs
        x = m.note("multiply", [s, c], b.multiply(s, c))
    return m


def test_mixed_graph_columns_and_queries(sink_and_source: tuple[OpDef, OpDef]) -> None:
    b = GraphBuilder(hash_cons=False)
    m = build_mixed(b)
    g = b.freeze()
    g.verify()
    # The frozen graph, against columns made from the Python lists.
    n_vals = b.num_values
    producer = np.full(n_vals, -1)
    index = np.zeros(n_vals, dtype=np.int64)
    for v, p in m.producer.items():
        producer[v], index[v] = p, m.index[v]
    assert g.op_kind.tolist() == m.kind
    assert g.in_ptr.tolist() == np.concatenate([[0], np.cumsum([len(i) for i in m.ins])]).tolist()
    assert g.in_ids.tolist() == [v for i in m.ins for v in i]
    assert g.out_ptr.tolist() == np.concatenate([[0], np.cumsum([len(o) for o in m.outs])]).tolist()
    assert g.out_ids.tolist() == [v for o in m.outs for v in o]
    assert g.value_producer.tolist() == producer.tolist()
    assert g.value_index.tolist() == index.tolist()
    assert g.inputs.tolist() == m.inputs
    assert [g.type_of(v) for v in range(n_vals)] == [m.types[v] for v in range(n_vals)]
    # The builder's own queries, and the columns io.dask / io.onnx / autodiff read from it.
    for op in range(b.num_ops):
        assert b.op_inputs(op) == m.ins[op]
        assert b.op_outputs(op) == m.outs[op]
        assert b.kind_of(op) == get_op(m.kind[op]).name
        assert b._op_kind[op] == m.kind[op] and b._op_attr[op] == g.op_attr[op]
        assert b.op_version[op] == b._op_version[op] == g.op_version[op]
        assert b.attrs_of(op) == dict(g.attrs[g.op_attr[op]])
        if m.kind[op] != CONST.id:
            assert g.attrs[g.op_attr[op]] == get_op(m.kind[op]).normalise_attrs(m.attrs[op])
    for v in range(n_vals):
        assert b._value_producer[v] == producer[v]
        assert b._value_index[v] == index[v]
        assert (b.producer_of(v) is None) == (producer[v] < 0)
        assert b.type_of(v) == m.types[v]
    assert list(b._value_producer) == producer.tolist() and len(b._op_kind) == b.num_ops
    assert b._value_producer[-1] == producer[-1]
    consts = [op for op in range(b.num_ops) if m.kind[op] == CONST.id]
    assert [b._constants[b._const_ops_index(m.outs[op][0])][0] for op in consts] == list(range(len(consts)))
    with pytest.raises(IndexError):
        b._value_producer[n_vals]


def test_mixed_graph_hash_consing(sink_and_source: tuple[OpDef, OpDef]) -> None:
    b = GraphBuilder()
    x = b.input(TensorType("float32", (6,)))
    y = b.input(TensorType("float32", (6,)))
    parts = b.split(b.add(x, y), sections=3)
    assert b.split(b.add(x, y), sections=3) == parts  # several outputs: the same tuple
    w = b.concat(parts[1], parts[2], parts[0], axis=0)
    assert b.concat(parts[1], parts[2], parts[0], axis=0) == w  # wide row
    assert b.concat(parts[1], parts[2], parts[1], axis=0) != w
    assert b.sum(w, axis=0) == b.op("sum", w, axis=(0,))  # attributes normalised
    assert b.sum(w, axis=0) != b.sum(w, axis=0, keepdims=True)
    n = b.num_ops
    assert b.op("test_scale_sink", x) == () and b.op("test_scale_sink", x) == () and b.num_ops == n + 1
    assert b.op("test_scale_source") == b.op("test_scale_source")  # no inputs
    assert b.num_ops == n + 2
    named = b.exp(x, name="e")
    assert b.exp(x, name="other") == named and b.name_of(named.id) == "e"  # as before: the first op wins
    c1, c2 = b.constant(np.arange(3.0)), b.constant(np.arange(3.0))
    assert c1 == c2 and b.constant(np.arange(3.0, dtype=np.float32)) != c1


def test_long_chains_spill_to_a_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ops sharing their youngest input form one chain; past _CHAIN_MAX it moves to a dict."""
    for chain_max in (builder_mod._CHAIN_MAX, 0):
        monkeypatch.setattr(builder_mod, "_CHAIN_MAX", chain_max)
        b = GraphBuilder()
        cs = [b.constant(np.full(4, k, np.float64)) for k in range(60)]  # made before x ...
        x = b.input(("float64", (4,)))  # ... so x is every op's youngest input
        made = {}
        for k, c in enumerate(cs):
            made["mul", k] = b.multiply(x, c)
            made["sub", k] = b.subtract(c, x)
            made["sum", k % 2] = b.sum(x, axis=0, keepdims=bool(k % 2))
            made["neg"] = b.negative(x)
        n = b.num_ops
        assert n == 60 + 2 * 60 + 2 + 1
        assert b._cse_head is not None and b._cse_head[x.id] == builder_mod._SPILLED
        for k, c in enumerate(cs):  # every one is found again, none is confused with another
            assert b.multiply(x, c) == made["mul", k]
            assert b.subtract(c, x) == made["sub", k]
            assert b.op("multiply", x, c) == made["mul", k]
        assert b.sum(x, axis=0, keepdims=True) == made["sum", 1] and b.negative(x) == made["neg"]
        assert b.num_ops == n
        assert b.multiply(c, x) not in made.values()  # new after the spill: recorded in the dict
        assert b.multiply(c, x) == b.multiply(c, x) and b.num_ops == n + 1
        assert b.freeze().equals(_replay(b))


def _replay(b: GraphBuilder) -> Graph:
    """The builder's graph built again op by op without hash-consing (an independent path)."""
    g = b.freeze()
    r = GraphBuilder(hash_cons=False)
    vals: dict[int, Value] = {}
    pending = g.inputs.tolist()[::-1]
    for op in range(g.num_ops + 1):
        while pending and pending[-1] == r.num_values:  # inputs where they were made
            v = pending.pop()
            vals[v] = r.input(g.type_of(v))
        if op == g.num_ops:
            break
        if g.kind_of(op) == "const":
            out: Any = r.constant(g.constants[g.attrs_of(op)["index"]])
        else:
            out = r.op(g.kind_of(op), *(vals[v] for v in g.op_inputs(op).tolist()), **g.attrs_of(op))
        for v, o in zip(g.op_outputs(op).tolist(), out if isinstance(out, tuple) else (out,), strict=True):
            vals[v] = o
    return r.freeze()


def test_chain_candidates_with_equal_signature_are_told_apart() -> None:
    """The chain is the builder's hash bucket: a candidate with the same signature and youngest input but
    another older input (the analogue of a hash collision) must not be taken for the op looked up."""
    b = GraphBuilder()
    olds = [b.input(("float64", ())) for _ in range(5)]
    x = b.input(("float64", ()))
    ys = [b.add(o, x) for o in olds]
    assert len(set(ys)) == 5
    assert [b.add(o, x) for o in reversed(olds)] == ys[::-1]
    assert b.add(x, olds[0]) not in ys


def test_hash_cons_can_be_switched() -> None:
    b = GraphBuilder()
    x = b.input(("float64", (2,)))
    e = b.exp(x)
    b.hash_cons = False
    assert b.exp(x) != e
    s = b.sin(x)
    b.hash_cons = True
    assert b.exp(x) == e  # found from before
    assert b.sin(x) != s  # built while off: not recorded (as before)
    assert b.constant(1.0) == b.constant(1.0)


def test_freeze_is_cached_until_the_builder_changes() -> None:
    b = GraphBuilder()
    x = b.input(("float64", (2,)))
    g = b.freeze()
    assert b.freeze() is g
    b.exp(x)  # the fast path
    g2 = b.freeze()
    assert g2 is not g and g2.num_ops == 1 and b.freeze() is g2
    b.exp(x)  # found: nothing changed
    assert b.freeze() is g2
    b.name(x, "x")
    assert b.freeze() is not g2 and b.freeze().symbols.values == {0: "x"}


def test_op_methods_take_numbers_foreign_values_and_unregistered_kinds() -> None:
    b = GraphBuilder()
    x = b.input(("float32", (3,)))
    assert b.add(x, 1.0).type == TensorType("float32", (3,))  # a weak scalar constant
    assert b.add(2, x) == b.add(2, x)
    with pytest.raises(opgraph.GraphError, match="another builder"):
        b.add(x, GraphBuilder().input(("float32", (3,))))
    with pytest.raises(opgraph.GraphError, match="another builder"):
        b.sin(GraphBuilder().input(("float32", (3,))))
    with pytest.raises(opgraph.OpBuildError):
        b.add(x, b.input(("float32", (4,))))
    with pytest.raises(AttributeError):
        b.no_such_op_kind  # noqa: B018
    assert b.build_op_exp(x) == b.exp(x) == b.op("exp", x) == b.op(get_op("exp").id, x)
    private = OpDef(name="test_scale_private", id=59103, arity=1, infer=lambda t, a: t)  # not registered
    p = b.op(private, x)
    assert p.type == x.type and b.op(private, x) == p and b.num_ops == 6


def test_op_and_the_op_methods_find_each_others_ops() -> None:
    """b.op(kind, ...) and b.<kind>(...) share one fast path and one hash-consing table, and hand over to
    the general path (numbers, attributes, names) with the same results."""
    b = GraphBuilder()
    x = b.input(("float64", (3,)))
    y = b.input(("float64", (3,)))
    e, s = b.op("exp", x), b.op("add", x, y)
    assert b.exp(x) == e and b.add(x, y) == s and b.op("add", y, x) != s
    assert b.op("negative", s) == b.negative(s) and b.num_ops == 4
    assert b.op("add", x, 1.0) == b.add(x, 1.0) and b.num_ops == 6  # a constant, then the add
    assert b.op("sum", s, axis=0) == b.sum(s, axis=0) and b.num_ops == 7
    named = b.op("exp", y, name="ey")
    assert named.name == "ey" and b.exp(y) == named and b.num_ops == 8
    g = b.freeze()
    assert [g.kind_of(o) for o in range(g.num_ops)] == ["exp", "add", "add", "negative", "const", "add", "sum",
                                                        "exp"]
    ref = np.arange(3.0), np.array([2.0, -1.0, 0.5])
    out = g.run({x.id: ref[0], y.id: ref[1]}, targets=[e.id, s.id, named.id])
    np.testing.assert_allclose(out[0], np.exp(ref[0]))
    np.testing.assert_allclose(out[1], ref[0] + ref[1])
    np.testing.assert_allclose(out[2], np.exp(ref[1]))


def test_value_handles_are_plain_values_and_the_builder_makes_no_cycle() -> None:
    assert Value.__slots__ == ("id", "owner")  # builder._handle fills exactly these
    b = GraphBuilder()
    x = b.input(("float64", ()))
    y = b.exp(x)
    assert type(y) is Value and y == Value(b, 1) and y.owner is b and y.id == 1
    gc.disable()
    try:
        ref = weakref.ref(b)
        del b, x, y
        assert ref() is None  # freed by reference counting: op methods live on the class
    finally:
        gc.enable()


def test_builder_columns_are_not_python_objects_per_op() -> None:
    """The garbage collector has nothing per op to traverse (it did: lists and the CSE dict)."""
    b = GraphBuilder()
    random_dag(b, 500)
    gc.collect()
    tracked = len(gc.get_objects())
    random_dag(b, 20_000, seed=1, name=None)
    gc.collect()
    assert len(gc.get_objects()) - tracked < 200


def test_memory_per_op_at_1e5_ops() -> None:
    n = 100_000
    rng = np.random.default_rng(0)
    earlier = (rng.random(n) * np.arange(1, n + 1)).astype(np.int64).tolist()
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        b = GraphBuilder()
        v = b.input(F8)
        add, mul, sin = b.add, b.multiply, b.sin
        for i in range(0, n - 2, 3):
            v = add(v, Value(b, earlier[i]))
            v = mul(v, Value(b, earlier[i + 1]))
            v = sin(v)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert b.num_ops >= n - 2
    assert (held - start) / b.num_ops <= 100
    assert (peak - start) / b.num_ops <= 100
    assert b.freeze().num_ops == b.num_ops


def test_names_are_unique_and_a_rename_frees_the_old_name() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2,)), name="x")
    y = b.exp(x)
    b.name(y, "y")
    with pytest.raises(opgraph.errors.GraphError, match="'y' exists already"):
        b.name(b.sin(x), "y")
    b.name(y, "z")  # y is renamed: "y" is free again
    w = b.name(b.cos(x), "y")
    g = b.freeze()
    assert g.find_value("z") == y.id and g.find_value("y") == w.id and g.find_value("x") == x.id
