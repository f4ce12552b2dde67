"""Malformed GraphML and ONNX files: each is one clear opgraph error naming the file, the node and the op.

Every bad file here is a valid file written by opgraph, then edited (the XML
text of a .graphml file, the ModelProto of an .onnx model), so the tests
follow the writers.
"""

from __future__ import annotations

import re
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import networkx as nx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opgraph
from opgraph import GraphBuilder
from opgraph.core.graph import Graph
from opgraph.errors import FormatError, GraphError
from opgraph.io.nx import from_networkx, to_networkx
from opgraph.io.onnx import OnnxImportError, from_onnx, to_onnx


# ----------------------------------------------------------------------------- GraphML
def _graph() -> Graph:
    b = GraphBuilder()
    x = b.input(("float64", (2, 3)), name="x")
    y = b.op("add", x, b.constant(np.ones((2, 3))))
    b.output(b.op("sum", b.op("multiply", y, y), axis=1, name="total"))
    return b.freeze()


@pytest.fixture
def graphml(tmp_path: Path) -> Callable[[Callable[[str], str]], Path]:
    """Write _graph() as GraphML, edit its text, and return the path of the edited file."""
    good = tmp_path / "good.graphml"
    opgraph.io.save(_graph(), good)
    text = good.read_text()

    def edit(change: Callable[[str], str]) -> Path:
        new = change(text)
        assert new != text, "the edit changed nothing"
        bad = tmp_path / "bad.graphml"
        bad.write_text(new)
        return bad

    return edit


def _sub(pattern: str, repl: str) -> Callable[[str], str]:
    """An edit replacing the first match of ``pattern``; ``{name}`` in it stands for the key id of attribute name."""
    def change(text: str) -> str:
        keys = {m.group(2): m.group(1) for m in re.finditer(r'<key id="(d\d+)" for="\w+" attr.name="(\w+)"', text)}
        pat = re.sub(r"\{(\w+)\}", lambda m: keys[m.group(1)], pattern)
        rep = re.sub(r"\{(\w+)\}", lambda m: keys[m.group(1)], repl)
        return re.sub(pat, rep, text, count=1, flags=re.S)
    return change


def _load_error(path: Path) -> str:
    with pytest.raises(FormatError) as err:
        opgraph.io.load(path)
    message = str(err.value)
    assert message.startswith(f"{path}: "), message  # names the file
    return message


def test_graphml_file_meta_that_is_not_an_object(graphml: Callable[..., Path]) -> None:
    bad = graphml(_sub(r'(<data key="{file_meta}">)\{\}', r"\1[1, 2]"))
    assert re.search(r"graph attribute 'file_meta': expected a JSON object, got \[1, 2\]", _load_error(bad))


def test_graphml_infinity_in_an_edge_index(graphml: Callable[..., Path]) -> None:
    # multiply reads its input twice: one edge v2 -> o2 with indices [0,1]
    bad = graphml(_sub(r'(<data key="{indices}">)\[0,1\]', r"\1[0,Infinity]"))
    assert re.search(r"edge v2 -> o2: attribute 'indices'\[1\]: expected an integer, got float inf", _load_error(bad))


def test_graphml_op_reading_its_own_output(graphml: Callable[..., Path]) -> None:
    bad = graphml(_sub(r'<edge source="v0" target="o1">', '<edge source="v3" target="o1">'))
    message = _load_error(bad)
    assert re.search(r"node o\d \((add|multiply)\) reads a value computed from its own output: .*node v3", message)


@pytest.mark.parametrize("node", ["o1", "v3"])
def test_graphml_bipartite_127(graphml: Callable[..., Path], node: str) -> None:
    bad = graphml(_sub(rf'(<node id="{node}">\s*<data key="{{bipartite}}">)[01]', r"\g<1>127"))
    message = _load_error(bad)
    assert re.search(rf"node {node}: attribute 'bipartite': 127 is out of range \[0, 2\)", message)
    assert "_NotReady" not in message


@pytest.mark.parametrize(("edit", "expected"), [
    # what used to read only "('value', 44)", "'type'", "'kind'", "'bipartite'" or "5"
    (_sub(r'(<data key="{outputs}">)\["v4"\]', r'\1["v44"]'),
     r"graph attribute 'outputs'\[0\]: v44 is not a value node"),
    (_sub(r'(<node id="v4">\s*<data key="{bipartite}">0</data>)\s*<data key="{type}">[^<]*</data>', r"\1"),
     r"node v4 'total': missing attribute 'type'"),
    (_sub(r'<data key="{kind}">sum</data>', ""), r"node o3 'total': attribute 'kind' must name an op kind"),
    (_sub(r'target="v4"', 'target="v9"'), r"node v9: missing attribute 'bipartite'"),
    (_sub(r'(<data key="{symbols}">)\{"constants":\[\]', r'\1{"constants":[[5,"c"]]'),
     r"graph attribute 'symbols': constants\[0\]\[0\]: the file has no const op o5"),
    (_sub(r'(<data key="{symbols}">)\{[^<]*\}', r"\1[]"), r"graph attribute 'symbols': expected a JSON object"),
    (_sub(r'(<data key="{updates}">)\[\]', r'\1[["v4"]]'), r"graph attribute 'updates'\[0\]: expected a \[source, "),
    # wrong types, bad numbers, unknown names
    (_sub(r'(<edge source="v1" target="o1">\s*<data key="{index}">)1', r"\1one"),
     r"edge v1 -> o1: attribute 'index': 'one' is not an integer"),
    (_sub(r'(<data key="{indices}">)\[0,1\]', r"\1[0,-1]"),
     r"edge v2 -> o2: attribute 'indices'\[1\]: -1 is out of range"),
    (_sub(r'(<data key="{indices}">)\[0,1\]', r"\g<1>[0,1e400]"),
     r"edge v2 -> o2: attribute 'indices'\[1\]: expected an integer, got float inf"),
    (_sub(r'(<data key="{indices}">)\[0,1\]', r"\g<1>[0,99999999999999999999999]"), r"is out of range \[0, 2\*\*62\)"),
    (_sub(r'(<data key="{indices}">)\[0,1\]', r"\1[0,"), r"edge v2 -> o2: attribute 'indices': invalid JSON"),
    (_sub(r'"shape":\[2\]\}', '"shape":[-2]}'), r"node v4 'total': attribute 'type': shape\[0\]: invalid dimension -2"),
    (_sub(r'"shape":\[2\]\}', '"shape":[NaN]}'),
     r"node v4 'total': attribute 'type': shape\[0\]: invalid dimension nan"),
    (_sub(r'"shape":\[2\]\}', '"shape":[9223372036854775808]}'),
     r"node v4 'total': attribute 'type': shape\[0\]: invalid dimension 9223372036854775808"),
    (_sub(r'"dtype":"float64","shape":\[2\]\}', '"dtype":"float99","shape":[2]}'),
     r"node v4 'total': attribute 'type': dtype: unsupported dtype 'float99'"),
    (_sub(r'"shape":\[2\]\}', '"shape":[3]}'), r"node o3 'total' \(sum\): output node v4 'total' has type f64\[3\]"),
    (_sub(r'<data key="{kind}">sum</data>', '<data key="{kind}">sumx</data>'),
     r"node o3 'total' \(sumx\): unknown op kind 'sumx'"),
    (_sub(r'\{"axis":\[1\],"keepdims":false\}', '{"axis":[7],"keepdims":false}'),
     r"node o3 'total' \(sum\): sum\(f64\[2,3\]\): axis 7 is out of bounds"),
    (_sub(r'\{"axis":\[1\],"keepdims":false\}', "[1]"),
     r"node o3 'total' \(sum\): attribute 'attrs': expected a JSON object"),
    (_sub(r'"ndarray":\{"dtype":"float64"', '"ndarray":{"dtype":"float64x"'),
     r"node o0 \(const\): attribute 'attrs': attrs.value.ndarray.dtype: unsupported dtype"),
    (_sub(r'(<data key="{bipartite}">)0', r"\1zero"), r"node v0: attribute 'bipartite': 'zero' is not an integer"),
    (_sub(r'(<data key="{name}">)x<', r'\1x</data><data key="{name}">y<'), None),  # last one wins: not an error
    # ids: not canonical, too large, not ASCII digits
    (_sub(r'(<data key="{outputs}">)\["v4"\]', r'\1["v04"]'),
     r"graph attribute 'outputs'\[0\]: node id 'v04' is neither"),
    (_sub(r'id="v4"', 'id="v04"'), r"node id 'v04' is neither v<number> nor o<number>"),
    (_sub(r'id="v4"', 'id="v99999999999999999999999"'), r"node id 'v99999999999999999999999' is neither"),
    (_sub(r'id="v4"', 'id="v\u00b2"'), r"node id 'v\u00b2' is neither"),
    # structure: duplicated edges, edges between two values, two producers, inputs that are computed
    (_sub(r'(<edge source="o3" target="v4">)', r'<edge source="v3" target="o3"><data key="{index}">0</data>'
                                              r'<data key="{indices}">[0]</data></edge>\1'),
     r"edge v3 -> o3 appears 2 times"),
    (_sub(r'(<edge source="o3" target="v4">)', r'<edge source="v3" target="v4"><data key="{index}">0</data></edge>\1'),
     r"edge v3 -> v4 joins two values"),
    (_sub(r'(<edge source="o3" target="v4">)', r'<edge source="o2" target="v4"><data key="{index}">1</data></edge>\1'),
     r"node v4 'total' is computed by 2 ops: node o2 \(multiply\), node o3 'total' \(sum\)"),
    (_sub(r'(<data key="{inputs}">)\["v0"\]', r'\1["v0","v4"]'), r"node v4 'total' is listed as an input but node o3"),
    (_sub(r'(<data key="{inputs}">)\["v0"\]', r'\1["v0","v0"]'), r"node v0 'x' is listed twice as an input"),
    (_sub(r'(<data key="{inputs}">)\["v0"\]', r"\1[]"), r"value node v0 'x' has no producer and is not an input"),
    (_sub(r'<data key="{format}">opgraph-networkx/1</data>', ""), r"not an opgraph GraphML graph"),
])
def test_graphml_malformed_attribute_names_node_and_attribute(graphml: Callable[..., Path], edit: Callable[[str], str],
                                                               expected: str | None) -> None:
    bad = graphml(edit)
    if expected is None:
        assert opgraph.io.load(bad) == _graph()
        return
    message = _load_error(bad)
    assert re.search(expected, message), message


def test_graphml_other_writers_attribute_types_load(graphml: Callable[..., Path]) -> None:
    """Correct behaviour, not an error: positions typed as text or double, a bipartite from the key's default."""
    def change(text: str) -> str:
        text = re.sub(r'(attr.name="index" attr.type=)"long"', r'\1"string"', text)
        text = re.sub(r'(attr.name="bipartite" attr.type=)"long" />', r'\1"double"><default>0</default></key>', text)
        keys = {m.group(2): m.group(1) for m in re.finditer(r'<key id="(d\d+)" for="\w+" attr.name="(\w+)"', text)}
        return re.sub(rf'<data key="{keys["bipartite"]}">0</data>', "", text)  # values take the default

    assert opgraph.io.load(graphml(change)) == _graph()


def test_graphml_typed_data_that_does_not_convert(graphml: Callable[..., Path]) -> None:
    bad = graphml(_sub(r'(<node id="v3">\s*<data key="{bipartite}">)0', r"\1nought"))
    message = _load_error(bad)
    assert re.search(r"node v3: attribute 'bipartite': 'nought' is not an integer", message), message


def test_networkx_errors_name_the_node_and_op() -> None:
    G = to_networkx(_graph())
    G.add_edge(("value", 3), ("op", 1), index=2)  # add reads a value computed from its own output
    with pytest.raises(GraphError, match=r"node \('op', \d\) \((add|multiply)\) reads a value computed from its own"):
        from_networkx(G)
    G = to_networkx(_graph())
    G.nodes[("op", 2)]["bipartite"] = 127
    with pytest.raises(GraphError, match=r"node \('op', 2\) 'total'|node \('op', 2\): bipartite=127"):
        from_networkx(G)
    G = to_networkx(_graph())
    G.nodes[("op", 2)]["attrs"] = {"nope": 1}
    with pytest.raises(GraphError, match=r"node \('op', 2\) \(multiply\): multiply\(f64\[2,3\], f64\[2,3\]\)"):
        from_networkx(G)
    assert nx.is_directed_acyclic_graph(to_networkx(_graph()))


# ----------------------------------------------------------------------------- ONNX
def _model() -> onnx.ModelProto:
    """exp -> broadcast_to -> sum, written by opgraph: Exp, Expand (shape initializer) and ReduceSum nodes."""
    b = GraphBuilder()
    x = b.input(("float32", (2, 3)), name="x")
    b.output(b.op("sum", b.op("broadcast_to", b.op("exp", x), shape=(4, 2, 3)), axis=0))
    model = to_onnx(b.freeze())
    assert [n.op_type for n in model.graph.node] == ["Exp", "Expand", "ReduceSum"]
    for i, n in enumerate(model.graph.node):
        n.name = f"n{i}"
    return model


def _onnx_error(model: onnx.ModelProto | bytes, tmp_path: Path, expected: str) -> OnnxImportError:
    """from_onnx's error matches ``expected``; so does io.load's, which also names the file."""
    data = model if isinstance(model, bytes) else model.SerializeToString()
    with pytest.raises(OnnxImportError, match=expected) as err:
        from_onnx(data)
    path = tmp_path / "bad.onnx"
    path.write_bytes(data)
    with pytest.raises(FormatError, match=expected) as ferr:
        opgraph.io.load(path)
    assert str(ferr.value).startswith(f"{path}: ")
    return err.value


def test_onnx_good_model_imports() -> None:
    xv = np.arange(6, dtype=np.float32).reshape(2, 3) / 5
    (got,) = from_onnx(_model()).run({"x": xv})
    np.testing.assert_allclose(got, 4 * np.exp(xv), rtol=1e-6)


def test_onnx_corrupt_bytes(tmp_path: Path) -> None:
    data = bytearray(_model().SerializeToString())
    data[1:6] = b"\xff\xff\xff\xff\x0f"  # the graph field's length: past the end
    err = _onnx_error(bytes(data), tmp_path, r"not a readable ONNX model")
    assert err.__cause__ is not None  # protobuf's DecodeError, chained


@pytest.mark.parametrize(("op", "keep", "expected"), [
    ("Expand", 1, r"#1 Expand node 'n1': has 1 input, Expand \(opset 18\) takes at least 2"),
    ("Exp", 3, r"#0 Exp node 'n0': has 3 inputs, Exp \(opset 18\) takes at most 1"),
])
def test_onnx_node_with_wrong_number_of_inputs(tmp_path: Path, op: str, keep: int, expected: str) -> None:
    model = _model()
    node = next(n for n in model.graph.node if n.op_type == op)
    names = list(node.input)
    del node.input[:]
    node.input.extend((names * 3)[:keep])
    err = _onnx_error(model, tmp_path, expected)
    assert "missing 1 required positional argument" not in str(err)


def test_onnx_range_with_two_inputs(tmp_path: Path) -> None:
    model = _model()
    model.graph.initializer.extend([numpy_helper.from_array(np.array(0, np.int64), "a"),
                                    numpy_helper.from_array(np.array(4, np.int64), "b")])
    model.graph.node.insert(0, helper.make_node("Range", ["a", "b"], ["r"], name="range"))
    _onnx_error(model, tmp_path, r"#0 Range node 'range': has 2 inputs, Range \(opset 18\) takes at least 3")


def test_onnx_node_with_too_many_outputs_or_a_missing_required_input(tmp_path: Path) -> None:
    model = _model()
    model.graph.node[0].output.append("extra")
    _onnx_error(model, tmp_path, r"#0 Exp node 'n0': has 2 outputs, Exp \(opset 18\) takes at most 1")
    model = _model()
    model.graph.node[1].input[0] = ""
    _onnx_error(model, tmp_path, r"#1 Expand node 'n1': input 0 \(input\) of Expand \(opset 18\) is required")


def test_onnx_op_type_that_is_not_utf8(tmp_path: Path) -> None:
    data = _model().SerializeToString().replace(b'"\x03Exp', b'"\x03E\xffp', 1)
    _onnx_error(data, tmp_path, r"#0 b'E\\xffp' node 'n0': op_type b'E\\xffp' is not valid UTF-8")


def test_onnx_expand_to_an_incompatible_constant_shape(tmp_path: Path) -> None:
    model = _model()
    shape = next(t for t in model.graph.initializer if t.name == model.graph.node[1].input[1])
    shape.CopyFrom(numpy_helper.from_array(np.array([4, 5], np.int64), shape.name))
    _onnx_error(model, tmp_path, r"#1 Expand node 'n1': cannot expand a value of shape \(2, 3\) to shape \(4, 5\)")


def test_onnx_attribute_of_the_wrong_type(tmp_path: Path) -> None:
    model = _model()
    model.graph.node[2].attribute.append(helper.make_attribute("keepdims", "yes"))
    _onnx_error(model, tmp_path, r"#2 ReduceSum node 'n2': attribute 'keepdims' of ReduceSum \(opset 18\) must be INT, "
                                 r"got STRING")


def test_onnx_node_inside_a_subgraph_names_its_parent(tmp_path: Path) -> None:
    model = _model()
    bad = helper.make_node("Expand", ["x"], ["y"], name="inner")
    branch = helper.make_graph([bad], "then", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), "cond"))
    model.graph.node.append(helper.make_node("If", ["cond"], ["z"], name="if", then_branch=branch, else_branch=branch))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    _onnx_error(model, tmp_path, r"#3 If node 'if' > #0 Expand node 'inner': has 1 input")


@pytest.mark.parametrize(("dims", "expected"), [
    ([4, 5], r"initializer '\w+': dims \[4, 5\] \(20 elements\) do not match its data \(24 bytes of raw_data"),
    ([2**20, 2**20], r"dims \[1048576, 1048576\] \(1099511627776 elements\) do not match its data"),
    ([-3, 2], r"initializer '\w+': negative dimension in dims \[-3, 2\]"),
    ([0, 2**40, 2**40], r"initializer '\w+': dims \[0, 1099511627776, 1099511627776\] \(rank 3\) are too large"),
])
def test_onnx_initializer_dims_that_do_not_match_its_data(tmp_path: Path, dims: list[int], expected: str) -> None:
    model = _model()
    model.graph.initializer[0].dims[:] = dims
    _onnx_error(model, tmp_path, expected)


def test_onnx_huge_declared_sizes_allocate_nothing(tmp_path: Path) -> None:
    """A sparse initializer declaring a 4 GiB dense form is refused; a ConstantOfShape that large stays an op."""
    model = _model()
    values = numpy_helper.from_array(np.ones(2, np.float32), "sp")
    indices = numpy_helper.from_array(np.array([0, 5], np.int64), "sp_i")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [2**15, 2**15]))
    tracemalloc.start()
    try:
        _onnx_error(model, tmp_path, r"sparse initializer 'sp': its dense form \[32768, 32768\] would take 4294967296")
        big = _model()
        big.graph.initializer.append(numpy_helper.from_array(np.array([2**15, 2**15], np.int64), "big_shape"))
        big.graph.node.append(helper.make_node("ConstantOfShape", ["big_shape"], ["big"], name="cos"))
        big.graph.output.append(helper.make_tensor_value_info("big", TensorProto.FLOAT, None))
        g = from_onnx(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak
    assert str(g.type_of(g.outputs[-1])) == "f32[32768,32768]"


def test_onnx_sparse_initializer_index_out_of_range(tmp_path: Path) -> None:
    model = _model()
    values = numpy_helper.from_array(np.ones(2, np.float32), "sp")
    indices = numpy_helper.from_array(np.array([0, 6], np.int64), "sp_i")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [2, 3]))
    _onnx_error(model, tmp_path, r"sparse initializer 'sp': an index is out of range for dims \[2, 3\]")


def test_onnx_external_data_stays_inside_the_model_directory(tmp_path: Path) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.array([4, 2, 3], np.int64).tobytes())
    model = _model()
    shape = next(t for t in model.graph.initializer if t.name == model.graph.node[1].input[1])
    shape.ClearField("raw_data")
    shape.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../secret.bin"), ("offset", "0"), ("length", "24")):
        entry = shape.external_data.add()
        entry.key, entry.value = key, value
    # Without a path there is no model directory: the reference is an error naming the tensor and the file.
    with pytest.raises(OnnxImportError, match=r"initializer '\w+': its data is in the external file '../secret.bin'"):
        from_onnx(model)
    sub = tmp_path / "model"
    sub.mkdir()
    (sub / "m.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(FormatError, match=r"m\.onnx: cannot read the model's external data: .*secret\.bin"):
        opgraph.io.load(sub / "m.onnx")
    # The same data inside the directory is read.
    (sub / "inside.bin").write_bytes(secret.read_bytes())
    shape.external_data[0].value = "inside.bin"
    (sub / "m.onnx").write_bytes(model.SerializeToString())
    xv = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(opgraph.io.load(sub / "m.onnx").run({"x": xv})[0], 4 * np.exp(xv), rtol=1e-6)


@pytest.mark.parametrize(("dim", "expected"), [
    (-2, r"graph input 'x': invalid dimension -2"),
    (2**62, r"graph input 'x': shape \[2,4611686018427387904\] has 9223372036854775808 elements, more than 2\*\*63-1"),
])
def test_onnx_bad_input_dims(tmp_path: Path, dim: int, expected: str) -> None:
    model = _model()
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = dim
    _onnx_error(model, tmp_path, expected)


def test_onnx_unknown_domain(tmp_path: Path) -> None:
    model = _model()
    model.graph.node[0].domain = "com.example"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    _onnx_error(model, tmp_path, r"#0 Exp node 'n0': opgraph has no translation for ONNX op com\.example\.Exp")


def _with_node(op: str, inputs: dict[str, np.ndarray], **attrs: object) -> onnx.ModelProto:
    """_model() with one more node, ``op`` on x and constant inputs, as an extra graph output."""
    model = _model()
    model.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in inputs.items())
    model.graph.node.append(helper.make_node(op, ["x", *inputs], ["extra"], name="extra", **attrs))
    model.graph.output.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT, None))
    return model


@pytest.mark.parametrize(("model", "expected"), [
    # reported by the fuzz test (tools/fuzz.py): each was a Python exception from inside a translator
    (lambda: _with_node("Slice", {"st": np.array([0]), "en": np.array([1, 2])}),
     r"#3 Slice node 'extra': starts, ends, axes and steps have different lengths \(1, 2, 1, 1\)"),
    (lambda: _with_node("Slice", {"st": np.array([0]), "en": np.array([1]), "ax": np.array([0]),
                                  "sp": np.array([0])}), r"#3 Slice node 'extra': a step is 0"),
    (lambda: _with_node("Reshape", {"shape": np.array([3, 2], np.complex64)}),
     r"#3 Reshape node 'extra': shape must be integers, it is complex64"),
    (lambda: _with_node("Reshape", {"shape": np.array([2, 3, 0])}),
     r"#3 Reshape node 'extra': shape \(2, 3, 0\): a 0 \(copy the input's dimension\) past the input's rank 2"),
    (lambda: _with_node("Concat", {"s": np.float32(1.0)}, axis=0),
     r"#3 Concat node 'extra': inputs must have one rank of at least 1, they have shapes \[\(2, 3\), \(\)\]"),
    (lambda: _with_node("Pad", {"pads": np.array([1, 1, 1])}),
     r"#3 Pad node 'extra': pads \(1, 1, 1\) must have 2 entries per padded axis \(2 axes\)"),
    # no ONNX schema at opset 18 (Swish is from opset 24): the translator's own signature is checked
    (lambda: _with_node("Swish", {"s": np.float32(1.0)}),
     r"#3 Swish node 'extra': has 2 inputs, which opgraph's translation of Swish does not take"),
    (lambda: _with_node("Col2Im", {"image": np.array([np.nan, 1.0]), "block": np.array([1.0, 1.0])}),
     r"#3 Col2Im node 'extra': .*must be integers"),
])
def test_onnx_translator_input_checks(tmp_path: Path, model: Callable[[], onnx.ModelProto], expected: str) -> None:
    _onnx_error(model(), tmp_path, expected)


def test_onnx_opset_version_beyond_a_c_int(tmp_path: Path) -> None:
    model = _model()
    model.opset_import[0].version = 1 << 40
    _onnx_error(model, tmp_path, r"opset_import: version 1099511627776 of domain 'ai.onnx' is not a valid opset")


# ----------------------------------------------------------------------------- fuzz findings (tools/fuzz.py)
def _const_model(dims: list[int], node: onnx.NodeProto) -> bytes:
    empty = helper.make_tensor("k", TensorProto.FLOAT, dims, [])
    g = helper.make_graph([helper.make_node("Constant", [], ["k"], value=empty), node], "g", [],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def test_onnx_empty_constants_with_a_huge_dim_allocate_nothing_large() -> None:
    """An empty constant has no data, so its dims pass the data check; what is folded from it must stay small."""
    reduce_max = _const_model([0, 1 << 33], helper.make_node("ReduceMax", ["k"], ["y"], keepdims=0, axes=[0]))
    softmax = _const_model([1 << 40, 0], helper.make_node("Softmax", ["k"], ["y"], axis=-1))
    tracemalloc.start()
    try:
        with pytest.raises(OnnxImportError, match=r"#1 ReduceMax node 'y': its result \[8589934592\], a reduction "
                                                  r"over nothing, would take 34359738368 bytes"):
            from_onnx(reduce_max)
        g = from_onnx(softmax)  # not folded: the softmax of an empty tensor is left to run time
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20
    assert [g.kind_of(op) for op in range(g.num_ops)].count("softmax") == 1


def test_json_const_index_beyond_int64_is_a_verify_problem(tmp_path: Path) -> None:
    import json

    b = GraphBuilder()
    b.output(b.op("add", b.input(("float32", (3,)), name="x"), b.constant(np.arange(3, dtype=np.float32))))
    path = tmp_path / "g.json"
    opgraph.io.save(b.freeze(), path)
    for bad in (2**64, 2**63):  # the JSON reader checks the type; the range is left to verify()
        doc = json.loads(path.read_text())
        const = next(op for op in doc["ops"] if "index" in op.get("attrs", {}))
        const["attrs"]["index"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(doc))
        with pytest.raises(FormatError, match=rf"(?s)bad\.json: ops\[\d\]: graph fails verification: .*constant index "
                                              rf"{re.escape(repr(bad))} not in the constants table"):
            opgraph.io.load(tmp_path / "bad.json")


# ----------------------------------------------------------------------------- fuzz findings: translator checks
def _one_node(op: str, inputs: list[tuple[int, ...] | np.ndarray | None], opset: int = 24,
              **attrs: object) -> onnx.ModelProto:
    """One ``op`` node named 'y': a tuple input is a float32 graph input of that shape, an array an initializer."""
    names, graph_inputs, inits = [], [], []
    for i, a in enumerate(inputs):
        names.append("" if a is None else f"in{i}")
        if isinstance(a, tuple):
            graph_inputs.append(helper.make_tensor_value_info(f"in{i}", TensorProto.FLOAT, a))
        elif a is not None:
            inits.append(numpy_helper.from_array(np.asarray(a), f"in{i}"))
    node = helper.make_node(op, names, ["y"], name="y", **attrs)
    g = helper.make_graph([node], "g", graph_inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


_F = np.float32


@pytest.mark.parametrize(("model", "expected"), [
    # each of these was a Python exception escaping a translator (tools/fuzz.py), wrapped by the importer
    (lambda: _one_node("Gather", [(3, 2), np.array([0, 3])]),
     r"#0 Gather node 'y': indices \(input 1\) hold 3, out of range \[-3, 2\] for axis 0 of the data "
     r"\(input 0, shape \(3, 2\)\)"),
    (lambda: _one_node("Gather", [(3, 2), np.array([[1, -3]])], axis=1),
     r"#0 Gather node 'y': indices \(input 1\) hold -3, out of range \[-2, 1\] for axis 1"),
    (lambda: _one_node("Gather", [np.zeros(0, _F), np.array([1])]),
     r"#0 Gather node 'y': indices \(input 1\) hold 1, but there is nothing to take from axis 0 of the data "
     r"\(input 0, shape \(0,\)\)"),
    (lambda: _one_node("ReduceMax", [np.array(1.0, _F), np.array([0])]),
     r"#0 ReduceMax node 'y': axes \[0\] are out of range for input 0, a scalar \(rank 0\)"),
    (lambda: _one_node("ReduceSum", [(2, 3), np.array([np.nan], _F)]),
     r"#0 ReduceSum node 'y': axes \(input 1\) must be integers, it is float32 \[nan\]"),
    (lambda: _one_node("ArgMax", [np.zeros((0, 3), _F)], axis=0),
     r"#0 ArgMax node 'y': axis 0 of input 0 \(shape \(0, 3\)\) is empty: there is no index to return"),
    (lambda: _one_node("DepthToSpace", [(2, 4)], blocksize=2),
     r"#0 DepthToSpace node 'y': input 0 must be 4-D \(N, C, H, W\), it has shape \(2, 4\)"),
    (lambda: _one_node("DepthToSpace", [(1, 4, 2, 2)], blocksize=0),
     r"#0 DepthToSpace node 'y': attribute blocksize must be a positive integer, got 0"),
    (lambda: _one_node("DepthToSpace", [(1, 6, 2, 2)], blocksize=2),
     r"#0 DepthToSpace node 'y': input 0 has 6 channels, not a multiple of blocksize \* blocksize \(4\)"),
    (lambda: _one_node("SpaceToDepth", [(3,)], blocksize=2),
     r"#0 SpaceToDepth node 'y': input 0 must be 4-D \(N, C, H, W\), it has shape \(3,\)"),
    (lambda: _one_node("SpaceToDepth", [(1, 3, 3, 4)], blocksize=2),
     r"#0 SpaceToDepth node 'y': input 0's height and width \(3, 4\) must be multiples of blocksize \(2\)"),
    (lambda: _one_node("OneHot", [np.array([0, 1]), np.array([np.nan], _F), np.array([0, 1], _F)]),
     r"#0 OneHot node 'y': depth \(input 1\) must be a finite number, it is float32 \[nan\]"),
    (lambda: _one_node("OneHot", [np.array([0, 1]), np.array([], np.int64), np.array([0, 1], _F)]),
     r"#0 OneHot node 'y': depth \(input 1\) must hold one value, it has 0"),
    (lambda: _one_node("OneHot", [np.array([0, 1]), np.array([0]), np.array([0, 1], _F)]),
     r"#0 OneHot node 'y': depth \(input 1\) is 0, it must be at least 1"),
    (lambda: _one_node("OneHot", [np.array([0, 1]), np.array([2]), np.array([0, 1, 2], _F)]),
     r"#0 OneHot node 'y': values \(input 2\) must hold 2 values \[off, on\], it has shape \(3,\)"),
    (lambda: _one_node("RNN", [(2, 3), np.zeros((1, 4, 3), _F), np.zeros((1, 4, 4), _F)], hidden_size=4),
     r"#0 RNN node 'y': input 0 \(X\) must be 3-D, it has shape \(2, 3\)"),
    (lambda: _one_node("GRU", [(5, 2, 3), np.zeros((1, 12, 3), _F), np.zeros((1, 4, 4), _F)], hidden_size=4),
     r"#0 GRU node 'y': input 2 \(R\) has shape \(1, 4, 4\), not \(num_directions, 3 \* hidden_size, "
     r"hidden_size\) = \(1, 12, 4\)"),
    (lambda: _one_node("CausalConvWithState", [(2, 3), np.zeros((3, 1, 2), _F)]),
     r"#0 CausalConvWithState node 'y': input 0 \(input\) must be 3-D, it has shape \(2, 3\)"),
    (lambda: _one_node("CausalConvWithState", [(1, 3, 4), np.zeros((3, 1, 0), _F)]),
     r"#0 CausalConvWithState node 'y': input 1 \(weight\) has kernel size 0"),
    (lambda: _one_node("Attention", [(1, 2, 4), (1, 2, 4), (1, 2, 4)], q_num_heads=0, kv_num_heads=0),
     r"#0 Attention node 'y': attributes q_num_heads \(0\) and kv_num_heads \(0\) must be positive"),
    (lambda: _one_node("Attention", [(1, 2, 4), (2, 4), (1, 2, 4)], q_num_heads=2, kv_num_heads=2),
     r"#0 Attention node 'y': input 1 \(K\) must be 3-D \(batch, sequence, heads \* head_size\), it has shape "
     r"\(2, 4\)"),
    (lambda: _one_node("Attention", [(1, 2, 2, 3), (2, 2, 3), (1, 2, 2, 3)]),
     r"#0 Attention node 'y': input 1 \(K\) must be 4-D \(batch, heads, sequence, head_size\) like Q"),
    (lambda: _one_node("Attention", [(1, 2, 2, 0), (1, 2, 2, 0), (1, 2, 2, 0)]),
     r"#0 Attention node 'y': input 0 \(Q\) has head size 0, so the default scale 1 / sqrt\(head_size\) is "
     r"undefined"),
    (lambda: _one_node("Attention", [(1, 2, 2, 3), (1, 0, 2, 3), (1, 0, 2, 3)]),
     r"#0 Attention node 'y': input 1 \(K\) has 0 heads"),
    (lambda: _one_node("Attention", [(1, 2, 2, 3), (1, 2, 2, 3), (1, 2, 2, 3), np.array(0.0, _F)]),
     r"#0 Attention node 'y': input 3 \(attn_mask\) must have at least 1 axis, it is a scalar"),
])
def test_onnx_translator_shape_and_attribute_checks(tmp_path: Path, model: Callable[[], onnx.ModelProto],
                                                    expected: str) -> None:
    err = _onnx_error(model(), tmp_path, expected)
    assert err.__cause__ is None  # a check of the translator's own, not a wrapped Python exception


def test_onnx_gather_in_range_constant_indices_on_data_input() -> None:
    """The range check lets every index ONNX allows through, negative ones counting from the end."""
    idx = np.array([[-2, 1], [0, -1]])
    g = from_onnx(_one_node("Gather", [(3, 2), idx], axis=1).SerializeToString())
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(g.run({"in0": x})[0], np.take(x, idx, axis=1))


def test_onnx_one_hot_non_integer_depth_is_truncated() -> None:
    """ONNX casts a float depth to int64 (2.7 -> 2)."""
    g = from_onnx(_one_node("OneHot", [np.array([0, 1, 3]), np.array([2.7], _F), np.array([-1, 5], _F)])
                  .SerializeToString())
    np.testing.assert_array_equal(g.run({})[0], np.where(np.arange(2) == np.array([[0], [1], [3]]), 5, -1))


def test_onnx_translator_exception_is_wrapped_with_its_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The importer's catch-all, shown with a translator that fails (Gather's out-of-range index is now checked)."""
    from opgraph.io.onnx._core import TRANSLATORS

    def broken(node: object, x: object) -> object:
        return [][1]

    monkeypatch.setitem(TRANSLATORS, ("test.opgraph", "Broken"), broken)
    node = helper.make_node("Broken", ["x"], ["y"], name="b", domain="test.opgraph")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2,))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("test.opgraph", 1)])
    err = _onnx_error(model, tmp_path, r"#0 Broken node 'b': IndexError: list index out of range")
    assert isinstance(err.__cause__, IndexError)


@pytest.mark.parametrize(("model", "expected"), [
    # the same missing check as Gather's: constant indices out of range failed in a kernel while folding
    (lambda: _one_node("GatherElements", [(2, 2), np.array([[0, 2]])]),
     r"#0 GatherElements node 'y': indices \(input 1\) hold 2, out of range \[-2, 1\] for axis 0 of the data "
     r"\(input 0, shape \(2, 2\)\)"),
    (lambda: _one_node("ScatterElements", [(2, 3), np.array([[0, -4]]), np.zeros((1, 2), _F)], axis=1),
     r"#0 ScatterElements node 'y': indices \(input 1\) hold -4, out of range \[-3, 2\] for axis 1"),
    (lambda: _one_node("GatherND", [(2, 3), np.array([[1, 3]])]),
     r"#0 GatherND node 'y': indices \(input 1\) hold 3, out of range \[-3, 2\] for axis 1"),
    (lambda: _one_node("GatherND", [(2, 3, 4), np.array([[1], [4]])], batch_dims=1),
     r"#0 GatherND node 'y': indices \(input 1\) hold 4, out of range \[-3, 2\] for axis 1"),
    (lambda: _one_node("ScatterND", [(2, 2), np.array([[2, 0]]), np.zeros(1, _F)]),
     r"#0 ScatterND node 'y': indices \(input 1\) hold 2, out of range \[-2, 1\] for axis 0"),
    (lambda: _one_node("SoftmaxCrossEntropyLoss", [(2, 3), np.array([0, 5])]),
     r"#0 SoftmaxCrossEntropyLoss node 'y': labels \(input 1\) hold 5, out of range for the 3 classes of scores"),
    # NegativeLogLikelihoodLoss is imported through ONNX's function body: its GatherElements reports it
    (lambda: _one_node("NegativeLogLikelihoodLoss", [(2, 3), np.array([0, 5])]),
     r"#0 NegativeLogLikelihoodLoss node 'y' > #\d+ GatherElements node '\w+': indices \(input 1\) hold 5, "
     r"out of range \[-3, 2\] for axis 1"),
])
def test_onnx_constant_indices_out_of_range(tmp_path: Path, model: Callable[[], onnx.ModelProto],
                                            expected: str) -> None:
    err = _onnx_error(model(), tmp_path, expected)
    assert err.__cause__ is None


def test_onnx_gather_nd_and_scatter_elements_in_range_negative_indices() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    nd = np.array([[-1, 0], [2, -4]])
    g = from_onnx(_one_node("GatherND", [(3, 4), nd]).SerializeToString())
    np.testing.assert_array_equal(g.run({"in0": x})[0], x[tuple(nd.T)])
    idx, upd = np.array([[-1, 0]]), np.array([[10, 20]], _F)
    g = from_onnx(_one_node("ScatterElements", [(3, 4), idx, upd], axis=1).SerializeToString())
    want = x.copy()
    for (i, j), k in np.ndenumerate(idx):  # ONNX's definition: out[i][idx[i][j]] = updates[i][j]
        want[i, k % 4] = upd[i, j]
    np.testing.assert_array_equal(g.run({"in0": x})[0], want)


@pytest.mark.parametrize(("inputs", "rule", "expected"), [
    ([(2, 4), (1, 2, 4), (1, 2, 4)], "linear",
     r"#0 LinearAttention node 'y': input 0 \(query\) must be 3-D \(batch, sequence, heads \* head_size\), it has "
     r"shape \(2, 4\)"),
    ([(1, 2, 4), (1, 2, 4), (1, 2, 4), None, np.float32(1)], "gated",
     r"#0 LinearAttention node 'y': input 4 \(decay\) must be 3-D \(batch, sequence, \.\.\.\), it has shape \(\)"),
])
def test_onnx_linear_attention_input_ranks(tmp_path: Path, inputs: list[tuple[int, ...] | np.ndarray | None],
                                           rule: str, expected: str) -> None:
    model = _one_node("LinearAttention", inputs, q_num_heads=1, kv_num_heads=1, update_rule=rule)
    assert _onnx_error(model, tmp_path, expected).__cause__ is None


def test_onnx_sequence_where_a_tensor_is_needed() -> None:
    """A sequence fed to an op that needs a tensor: one error naming the node (it was an AttributeError)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, (3,))
    nodes = [helper.make_node("SequenceConstruct", ["x"], ["seq"]), helper.make_node("Div", ["seq", "x"], ["y"])]
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(OnnxImportError, match=r"#1 Div node 'y': needs a tensor input, got "):
        from_onnx(model.SerializeToString())
