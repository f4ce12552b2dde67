"""Large graphs: Graph.from_arrays (the checked bulk constructor), verify() and the topological sort.

The sort has two paths that must give the same order: NumPy (level by level, plain Python on deep
parts) and, when numba is installed, a compiled walk (opgraph.core.accel). Tests run both by
switching the compiled one off or on for every size. Nothing here is timed; the scale tests check
behaviour that keeps the work per op constant (one type-rule call per distinct signature).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import networkx as nx
import numpy as np
import pytest

import opgraph
from opgraph import Graph, TensorType, VerifyError, get_op
from opgraph.core import accel
from opgraph.core.graph import INDEX

F64 = TensorType("float64", (3,))
ADD, MUL, SUB, EXP, SIN = (get_op(k).id for k in ("add", "multiply", "subtract", "exp", "sin"))


# ----------------------------------------------------------------------------- helpers
@pytest.fixture(params=["numpy", "compiled"])
def sort_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the NumPy sort, then with the compiled one (used for every graph size)."""
    if request.param == "numpy":
        monkeypatch.setattr(accel, "enabled", False)
    else:
        pytest.importorskip("numba")
        monkeypatch.setattr(accel, "enabled", True)
        monkeypatch.setattr(accel, "MIN_OPS", 0)
        monkeypatch.setattr(accel, "LOADED_MIN_OPS", 0)
    return str(request.param)


FIELDS = ("op_kind", "op_attr", "op_version", "in_ptr", "in_ids", "out_ptr", "out_ids", "value_type",
          "value_producer", "value_index", "types", "attrs", "constants", "inputs", "outputs", "updates")


def fields(g: Graph, *drop: str) -> dict[str, Any]:
    """Writable copies of a graph's arrays, as from_arrays keywords (without ``drop``)."""
    out = {k: getattr(g, k) for k in FIELDS if k not in drop}
    return {k: v.copy() if isinstance(v, np.ndarray) else list(v) for k, v in out.items()}


def mixed_graph(n_ops: int, seed: int) -> Graph:
    """A random DAG from the builder: binary, unary, const, multi-output (split) and variadic (concat) ops."""
    rng = np.random.default_rng(seed)
    b = opgraph.GraphBuilder()
    vals = [b.input(("float64", (4,)), name=f"in{i}") for i in range(3)]
    for _ in range(n_ops):
        a, c = (vals[int(i)] for i in rng.integers(0, len(vals), size=2))
        r = rng.random()
        if r < 0.45:
            vals.append(b.op(["add", "multiply", "subtract"][int(rng.integers(0, 3))], a, c))
        elif r < 0.65:
            vals.append(b.op(["exp", "sin", "negative"][int(rng.integers(0, 3))], a))
        elif r < 0.8:
            vals.append(b.multiply(a, float(rng.integers(1, 5))))  # a const op and a multiply
        elif r < 0.9:
            low, high = b.op("split", a, sections=2, axis=0)
            vals.append(b.op("concat", high, low, axis=0))
        else:
            vals.append(b.multiply(a, b.sum(a, axis=0, keepdims=True)))
    b.output(vals[-1])
    return b.freeze()


def shuffled(g: Graph, seed: int, *, values: bool = True) -> dict[str, Any]:
    """from_arrays keywords for ``g`` with its ops (and value ids) in a random order; derived arrays left out."""
    rng = np.random.default_rng(seed)
    n, m = g.num_ops, g.num_values
    op_perm = rng.permutation(n)  # new op j is old op op_perm[j]
    new_value = rng.permutation(m) if values else np.arange(m)  # old value v is new value new_value[v]
    ins = [new_value[g.op_inputs(int(o))] for o in op_perm]
    outs = [new_value[g.op_outputs(int(o))] for o in op_perm]
    value_type = np.empty(m, dtype=INDEX)
    value_type[new_value] = g.value_type
    return dict(op_kind=g.op_kind[op_perm], op_attr=g.op_attr[op_perm],
                in_ptr=np.concatenate([[0], np.cumsum([len(i) for i in ins])]), in_ids=np.concatenate(ins),
                out_ptr=np.concatenate([[0], np.cumsum([len(o) for o in outs])]), out_ids=np.concatenate(outs),
                value_type=value_type, types=g.types, attrs=g.attrs, constants=g.constants,
                inputs=new_value[g.inputs], outputs=new_value[g.outputs])


def op_edges(g: Graph) -> Iterator[tuple[int, int]]:
    """(producer, consumer) op pairs."""
    src, dst = g.op_dependencies()
    return zip(src.tolist(), dst.tolist(), strict=True)


def assert_valid_order(g: Graph, order: np.ndarray) -> None:
    assert sorted(order.tolist()) == list(range(g.num_ops))
    position = np.empty(g.num_ops, dtype=np.int64)
    position[order] = np.arange(g.num_ops)
    for src, dst in op_edges(g):
        assert position[src] < position[dst], (src, dst)


def reference_order(g: Graph) -> list[int]:
    """networkx's Kahn generations (levels), each sorted by op index: the order both paths must give."""
    dag = nx.MultiDiGraph()
    dag.add_nodes_from(range(g.num_ops))
    dag.add_edges_from(op_edges(g))
    return [op for generation in nx.topological_generations(dag) for op in sorted(generation)]


def problems_of(**arrays: Any) -> list[str]:
    with pytest.raises(VerifyError) as info:
        Graph.from_arrays(**arrays)
    return info.value.problems


def small_arrays(**changes: Any) -> dict[str, Any]:
    """``v2 = add(v0, v1); v3 = exp(v2); v4 = sin(v3)`` as from_arrays keywords."""
    arrays = dict(op_kind=np.array([ADD, EXP, SIN]), in_ptr=np.array([0, 2, 3, 4]), in_ids=np.array([0, 1, 2, 3]),
                  out_ptr=np.array([0, 1, 2, 3]), out_ids=np.array([2, 3, 4]), value_type=np.zeros(5, np.int64),
                  types=[F64], outputs=[4])
    arrays.update(changes)
    return arrays


# ----------------------------------------------------------------------------- from_arrays
@pytest.mark.parametrize("seed", range(4))
def test_from_arrays_rebuilds_builder_graphs_and_derives_what_is_left_out(seed: int) -> None:
    g = mixed_graph(150, seed)
    full = Graph.from_arrays(**fields(g))
    assert full.equals(g)
    # Producers, value indices, versions and inputs left out: derived, and equal to what the builder made.
    minimal = Graph.from_arrays(**fields(g, "value_producer", "value_index", "op_version", "inputs"))
    assert minimal.equals(g)
    for name in ("value_producer", "value_index", "op_version", "inputs"):
        np.testing.assert_array_equal(getattr(minimal, name), getattr(g, name), err_msg=name)


def test_from_arrays_accepts_int64_arrays_mappings_and_type_specs() -> None:
    g = Graph.from_arrays(**small_arrays(types=[("float64", (3,))]))
    assert g.in_ids.dtype == np.int32 and g.in_ptr.dtype == np.int64 and g.types == (F64,)
    out = g.run({0: np.ones(3), 1: np.ones(3)})[0]
    np.testing.assert_allclose(out, np.sin(np.exp(2.0)) * np.ones(3))
    b = opgraph.GraphBuilder()
    b.output(b.sum(b.input(F64), axis=0))
    built = b.freeze()
    h = Graph.from_arrays(op_kind=built.op_kind, in_ptr=built.in_ptr, in_ids=built.in_ids, out_ptr=built.out_ptr,
                          out_ids=built.out_ids, value_type=built.value_type, types=built.types,
                          op_attr=[0], attrs=[{"axis": (0,), "keepdims": False}], outputs=built.outputs)
    assert h.equals(built)


def test_shuffled_arrays_give_an_unordered_graph_that_runs_the_same() -> None:
    g = mixed_graph(120, 7)
    h = Graph.from_arrays(**shuffled(g, 7))
    assert not h.is_topologically_ordered()
    feeds = [np.linspace(0.1, 0.4, 4) + i for i in range(3)]  # shuffled() keeps the order of the inputs
    (want,) = g.run({int(v): f for v, f in zip(g.inputs, feeds, strict=True)})
    (got,) = h.run({int(v): f for v, f in zip(h.inputs, feeds, strict=True)})
    np.testing.assert_allclose(got, want)


# Each bad input: the error, and the words that must be in it (naming the op by index and kind).
BAD = {
    "dangling input id": (dict(in_ids=np.array([0, 1, 9, 3])),
                          r"op 1 \(exp\): input refers to value 9, which does not exist"),
    "negative output id": (dict(out_ids=np.array([2, -1, 4])), r"op 1 \(exp\): output refers to value -1"),
    "id too large for int32": (dict(in_ids=np.array([0, 2**32 + 1, 2, 3])),
                               r"op 0 \(add\): in_ids\[1\] is 4294967297, outside the int32 range"),
    "pointer decreases": (dict(in_ptr=np.array([0, 2, 1, 4])),
                          r"in_ptr is not a valid CSR pointer .*: it decreases at op 1 \(exp\)"),
    "pointer too short": (dict(out_ptr=np.array([0, 1, 2])),
                          r"out_ptr is not a valid CSR pointer .*: it has 3 entries, not 4"),
    "pointer not from 0": (dict(in_ptr=np.array([1, 2, 3, 4])), r"in_ptr\[0\] is 1, not 0"),
    "pointer end": (dict(in_ptr=np.array([0, 2, 3, 3])), r"it ends at 3, but in_ids has 4 entries"),
    "cycle": (dict(in_ids=np.array([0, 1, 4, 3])),
              r"graph has a cycle through op 1 \(exp\) -> op 2 \(sin\) -> op 1 \(exp\)"),
    "type mismatch": (dict(value_type=np.array([0, 0, 0, 0, 1]), types=[F64, TensorType("float32", (3,))]),
                      r"op 2 \(sin\): outputs have types \(f32\[3\],\), the type rule gives \(f64\[3\],\)"),
    "type rule rejects": (dict(value_type=np.array([0, 1, 0, 0, 0]), types=[F64, TensorType("float64", (4,))]),
                          r"op 0 \(add\): type rule rejects inputs"),
    "wrong version": (dict(op_version=np.array([12, 3, 12])), r"op 1 \(exp\): version 3, the inputs select 12"),
    "unknown kind": (dict(op_kind=np.array([ADD, 9999, SIN])), r"op 1: unknown op kind id 9999"),
    "produced twice": (dict(out_ids=np.array([2, 3, 3]), outputs=[3]),
                       r"value 3 is produced more than once: by op 1 \(exp\) and op 2 \(sin\)"),
    "not integers": (dict(in_ids=np.array([0.0, 1.0, 2.0, 3.0])), r"in_ids must hold integers, not float64"),
    "bad type spec": (dict(types=["float64"]), r"types\[0\]: cannot make a type"),
    "attribute table": (dict(op_attr=np.array([0, 5, 0])), r"op 1 \(exp\): op_attr 5 is not in its table"),
    "not an input": (dict(inputs=[0]), r"value 1 has no producer and is not an input"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_from_arrays_names_the_op_for_each_bad_input(case: str) -> None:
    changes, pattern = BAD[case]
    problems = problems_of(**small_arrays(**changes))
    assert re.search(pattern, problems[0]), problems
    # Only that problem (a value made twice also makes its reader depend on itself: a cycle).
    assert len(problems) == (2 if case == "produced twice" else 1), problems


def test_from_arrays_requires_normalised_attributes() -> None:
    b = opgraph.GraphBuilder()
    b.output(b.sum(b.input(F64), axis=0))
    g = b.freeze()
    problems = problems_of(**{**fields(g), "attrs": [(("axis", 0),)]})
    assert problems == ["op 0 (sum): attributes (('axis', 0),) are not normalised; expected "
                        "(('axis', (0,)), ('keepdims', False)) (as sum's normalise_attrs gives them)"]


def test_from_arrays_checks_constants() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(F64)
    b.output(b.multiply(x, 2.0))
    g = b.freeze()
    assert Graph.from_arrays(**fields(g)).equals(g)
    problems = problems_of(**{**fields(g), "constants": [np.zeros(3)]})
    assert problems == ["op 0 (const): output type f64[] does not match constant 0 (f64[3])"]


def test_from_arrays_reports_every_problem_at_once() -> None:
    problems = problems_of(**small_arrays(op_version=np.array([3, 12, 4]), value_type=np.array([0, 0, 0, 0, 1]),
                                          types=[F64, TensorType("float32", (3,))]))
    assert sorted(problems) == ["op 0 (add): version 3, the inputs select 12",
                                "op 2 (sin): outputs have types (f32[3],), the type rule gives (f64[3],)"]


# ----------------------------------------------------------------------------- topological sort
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("values", [False, True])
def test_sort_of_shuffled_graphs_is_the_level_order(sort_path: str, seed: int, values: bool) -> None:
    g = mixed_graph(300, seed)
    h = Graph.from_arrays(**shuffled(g, seed, values=values))
    assert not h.is_topologically_ordered()
    order = h.topological_order()
    assert_valid_order(h, order)
    assert order.tolist() == reference_order(h)


def deep_and_wide(n_wide: int, n_deep: int, seed: int) -> Graph:
    """Wide levels, then a long chain, then wide again: NumPy rounds, the plain-Python tail, both."""
    b = opgraph.GraphBuilder()
    x = b.input(F64)
    wide = [b.sin(b.multiply(x, b.input(F64))) for _ in range(n_wide)]
    v = wide[0]
    for i in range(n_deep):
        v = b.add(v, wide[i % n_wide]) if i % 3 else b.exp(v)
    outs = [b.multiply(v, w) for w in wide]
    b.output(*outs)
    g = b.freeze()
    return Graph.from_arrays(**shuffled(g, seed))


def test_sort_of_deep_and_wide_graphs(sort_path: str) -> None:
    h = deep_and_wide(100, 2000, 0)
    order = h.topological_order()
    assert_valid_order(h, order)
    assert order.tolist() == reference_order(h)


def test_sort_of_graphs_with_wide_fan_in(sort_path: str) -> None:
    # Ops with more than 4 inputs: the compiled walk reads them through the CSR pointers.
    rng = np.random.default_rng(3)
    b = opgraph.GraphBuilder()
    vals = [b.input(("float64", (1,))) for _ in range(3)]
    for _ in range(400):
        picks = [vals[int(k)] for k in rng.integers(0, len(vals), size=6)]
        total = b.sum(b.op("concat", *picks, axis=0), axis=0, keepdims=True) if rng.random() < 0.3 else None
        vals.append(total if total is not None else b.exp(picks[0]))
    b.output(vals[-1])
    h = Graph.from_arrays(**shuffled(b.freeze(), 4))
    order = h.topological_order()
    assert_valid_order(h, order)
    assert order.tolist() == reference_order(h)


def test_both_sort_paths_give_the_same_order(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("numba")
    arrays = shuffled(deep_and_wide(80, 700, 3), 5)
    monkeypatch.setattr(accel, "enabled", False)
    numpy_order = Graph.from_arrays(**arrays).topological_order()
    monkeypatch.setattr(accel, "enabled", True)
    monkeypatch.setattr(accel, "MIN_OPS", 0)
    monkeypatch.setattr(accel, "LOADED_MIN_OPS", 0)
    compiled_order = Graph.from_arrays(**arrays).topological_order()
    np.testing.assert_array_equal(numpy_order, compiled_order)


def test_sort_falls_back_to_numpy_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` now raises ImportError
    monkeypatch.setattr(accel, "_topo", None)
    monkeypatch.setattr(accel, "MIN_OPS", 0)
    assert accel.topo_kernel(10**6) is None
    h = deep_and_wide(70, 300, 1)
    assert h.topological_order().tolist() == reference_order(h)


def cyclic_arrays(n_chain: int, seed: int) -> tuple[dict[str, Any], list[int]]:
    """A shuffled graph: a chain, a 4-op cycle fed by it, ops after the cycle; and the cycle's ops in flow order."""
    kinds, ins = [], []
    for i in range(n_chain):  # op i: v(i+1) = exp(v(i))
        kinds.append(EXP)
        ins.append([i])
    first = n_chain
    for j in range(4):  # cycle ops: c_j = add(v_prev, c_{j-1}), c_0 uses the last cycle value
        kinds.append(ADD)
        ins.append([n_chain, 1 + first + (j - 1) % 4])
    for j in range(5):  # consumers of the cycle (not on it)
        kinds.append(SIN)
        ins.append([1 + first + j % 4])
    n = len(kinds)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n)
    where = np.empty(n, dtype=np.int64)
    where[perm] = np.arange(n)
    arrays = dict(op_kind=np.array(kinds)[perm], in_ptr=np.concatenate([[0], np.cumsum([len(ins[o]) for o in perm])]),
                  in_ids=np.concatenate([ins[o] for o in perm]), out_ptr=np.arange(n + 1),
                  out_ids=1 + perm, value_type=np.zeros(n + 1, np.int64), types=[F64])
    return arrays, [int(where[first + j]) for j in range(4)]


@pytest.mark.parametrize("seed", range(3))
def test_cycles_are_reported_naming_the_ops_on_the_cycle(sort_path: str, seed: int) -> None:
    arrays, cycle = cyclic_arrays(300, seed)
    start = cycle.index(min(cycle))
    flow = cycle[start:] + cycle[:start]
    expect = " -> ".join(f"op {op} (add)" for op in [*flow, flow[0]])
    assert problems_of(**arrays) == [f"graph has a cycle through {expect}"]
    with pytest.raises(opgraph.GraphError) as info:  # the unchecked graph's sort says the same
        _graph_for(arrays).topological_order()
    assert str(info.value) == f"graph has a cycle through {expect}"


def _graph_for(arrays: dict[str, Any]) -> Graph:
    """The unchecked Graph(...) of cyclic_arrays (producers derived from the one-output-per-op layout)."""
    n, m = len(arrays["op_kind"]), len(arrays["value_type"])
    producer = np.full(m, -1)
    producer[arrays["out_ids"]] = np.arange(n)
    return Graph(op_attr=np.zeros(n), op_version=np.full(n, 12), value_producer=producer, value_index=np.zeros(m),
                 attrs=[()], constants=[], inputs=[0], **arrays)


def test_a_long_cycle_is_named_in_part(sort_path: str) -> None:
    n = 50  # op i: v(i+1) = exp(v(i)), and op 0 reads the last value: one cycle through every op
    arrays = dict(op_kind=np.full(n, EXP), in_ptr=np.arange(n + 1), in_ids=np.r_[n, 1:n],
                  out_ptr=np.arange(n + 1), out_ids=np.arange(1, n + 1), value_type=np.zeros(n + 1, np.int64),
                  types=[F64], inputs=[0])
    (problem,) = problems_of(**arrays)
    assert problem.startswith("graph has a cycle through op 0 (exp) -> op 1 (exp) -> ")
    assert problem.endswith("-> ... (50 ops on the cycle) -> op 0 (exp)")


# ----------------------------------------------------------------------------- verify at scale
def random_dag_arrays(n: int, seed: int) -> dict[str, Any]:
    """n binary ops (add, multiply, subtract): op i uses value i + 2 (the previous op's) and a random earlier one."""
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    ins = np.empty((n, 2), dtype=np.int64)
    ins[:, 0] = i + 1
    ins[:, 1] = (rng.random(n) * (i + 2)).astype(np.int64)
    return dict(op_kind=np.array([ADD, MUL, SUB])[rng.integers(0, 3, n)], in_ptr=np.arange(0, 2 * n + 1, 2),
                in_ids=ins.reshape(-1), out_ptr=np.arange(n + 1), out_ids=i + 2,
                value_type=np.r_[1, 0, np.zeros(n, np.int64)], types=[F64, TensorType("float64", ())])


def test_type_rules_run_once_per_signature_however_large(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    for kind in ("add", "multiply", "subtract"):
        opdef = get_op(kind)
        monkeypatch.setattr(opdef, "infer", lambda t, a, infer=opdef.infer: calls.append(t) or infer(t, a))
    for n in (1_000, 300_000):
        calls.clear()
        g = Graph.from_arrays(**random_dag_arrays(n, 0))
        assert g.num_ops == n and g.is_topologically_ordered()
        assert 1 <= len(calls) <= 3 * 4  # kinds x input type pairs, not ops
        calls.clear()
        g.verify()
        assert 1 <= len(calls) <= 3 * 4


def test_a_bad_op_deep_in_a_large_graph_is_named() -> None:
    arrays = random_dag_arrays(300_000, 1)
    arrays["op_version"] = np.full(300_000, 12)
    arrays["op_version"][271_828] = 11
    kind = get_op(int(arrays["op_kind"][271_828])).name
    assert problems_of(**arrays) == [f"op 271828 ({kind}): version 11, the inputs select 12"]
    arrays = random_dag_arrays(300_000, 2)
    arrays["in_ids"][2 * 123_456 + 1] = 300_002 + 5
    kind = get_op(int(arrays["op_kind"][123_456])).name
    assert problems_of(**arrays) == [f"op 123456 ({kind}): input refers to value 300007, which does not exist "
                                     f"(graph has 300002 values)"]


def test_shuffled_chain_at_scale(sort_path: str) -> None:
    n = 200_000 if sort_path == "compiled" else 50_000
    rng = np.random.default_rng(0)
    perm = rng.permutation(n)  # stored op j is chain step perm[j]: v(k+1) = exp(v(k))
    arrays = dict(op_kind=np.full(n, EXP), in_ptr=np.arange(n + 1), in_ids=perm, out_ptr=np.arange(n + 1),
                  out_ids=perm + 1, value_type=np.zeros(n + 1, np.int64), types=[F64])
    g = Graph.from_arrays(**arrays)
    np.testing.assert_array_equal(perm[g.topological_order()], np.arange(n))


def test_signatures_that_do_not_pack_into_one_key() -> None:
    # concat of 30 inputs of 5 types: 5**30 combinations do not fit an int64 key, so rows are compared.
    # Ops of 12 different input counts also take the sorted grouping path.
    b = opgraph.GraphBuilder()
    xs = [b.input(("float64", (i + 1,))) for i in range(5)]
    b.output(b.op("concat", *[xs[i % 5] for i in range(30)], axis=0))
    for k in range(1, 13):
        b.output(b.op("concat", *xs[:1] * k, axis=0))
    g = b.freeze()
    assert Graph.from_arrays(**fields(g)).equals(g)
    version = g.op_version.copy()
    version[0] = 4
    version[7] = 5
    assert sorted(problems_of(**{**fields(g), "op_version": version})) == [
        "op 0 (concat): version 4, the inputs select 12", "op 7 (concat): version 5, the inputs select 12"]


def test_many_signatures_in_one_chunk() -> None:
    b = opgraph.GraphBuilder()
    for i in range(40):
        b.output(b.exp(b.input(("float64", (i + 1,)))))
    g = b.freeze()
    value_type = g.value_type.copy()
    value_type[g.out_ids[33]] = value_type[g.out_ids[2]]
    (problem,) = problems_of(**{**fields(g), "value_type": value_type})
    assert problem == "op 33 (exp): outputs have types (f64[3],), the type rule gives (f64[34],)"


def test_kernel_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accel, "enabled", False)
    assert accel.topo_kernel(10**8) is None
    monkeypatch.setattr(accel, "enabled", True)
    monkeypatch.setattr(accel, "_topo", None)
    assert accel.topo_kernel(accel.MIN_OPS - 1) is None and accel._topo is None  # numba not even imported


def test_compiled_sort_is_not_run_on_broken_arrays(sort_path: str) -> None:
    # A producer id out of range must give a report, not an out-of-bounds read in compiled code.
    g = Graph(op_kind=[SIN, EXP], op_attr=[0, 0], op_version=[12, 12], in_ptr=[0, 1, 2], in_ids=[2, 0],
              out_ptr=[0, 1, 2], out_ids=[1, 2], value_type=[0, 0, 0], value_producer=[-1, 0, 77],
              value_index=[0, 0, 0], types=[F64], attrs=[()], constants=[], inputs=[0])
    with pytest.raises(VerifyError) as info:
        g.verify()
    assert info.value.problems[0] == "op 1 (exp): output 0 is value 2, whose producer is recorded as op 77"


def test_environment_switch() -> None:
    code = "from opgraph.core import accel; print(accel.enabled)"
    for value, expect in (("0", "False"), ("off", "False"), ("1", "True")):
        env = {**os.environ, "OPGRAPH_NUMBA": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expect
