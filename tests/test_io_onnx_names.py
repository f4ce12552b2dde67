"""Names through ONNX import and export, and weights as inputs (issue 35 item 5).

References: the ONNX model's own initializers and node names (onnx), onnxruntime's outputs, and a torch model with
torch autograd for the gradients and the SGD step.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import opgraph
from opgraph.core.subgraph import Subgraph
from opgraph.io.onnx import GraphAndWeights, OnnxExportError, from_onnx, to_onnx

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.c1(x)).flatten(1))


@pytest.fixture(scope="module")
def cnn() -> tuple[torch.nn.Module, bytes]:
    torch.manual_seed(0)
    net = Net()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(2, 1, 8, 8),), buf, input_names=["x"], output_names=["y"],
                          dynamo=False)
    return net, buf.getvalue()


def _simple_model() -> onnx.ModelProto:
    """x @ W + b, Relu: one opgraph op per node, every node and initializer named."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "layer.W"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "layer.b")]
    nodes = [helper.make_node("MatMul", ["x", "layer.W"], ["h0"], name="/layer/MatMul"),
             helper.make_node("Add", ["h0", "layer.b"], ["h1"], name="/layer/Add"),
             helper.make_node("Relu", ["h1"], ["y"], name="/act/Relu")]
    g = helper.make_graph(nodes, "simple", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 4))], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)  # onnxruntime reads 10


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _const_by_name(g: opgraph.Graph, name: str) -> np.ndarray:
    (op,) = [int(g.value_producer[v]) for v, n in g.symbols.values.items() if n == name]
    return g.constant_of(op)


def test_names_in_dump_and_symbols(cnn: tuple[torch.nn.Module, bytes]) -> None:
    net, data = cnn
    model = onnx.load_from_string(data)
    g = from_onnx(model)
    text = str(g)
    for init in model.graph.initializer:  # each weight the graph uses is named, directly or as re-laid out
        assert f"%{init.name}: " in text or f"%{init.name}/" in text
    for node in model.graph.node:  # the op computing each node's output carries the node's name
        assert node.name in g.symbols.ops.values()
        assert f"# {node.name}\n" in text
    np.testing.assert_array_equal(_const_by_name(g, "c1.weight"), net.c1.weight.detach().numpy())
    np.testing.assert_array_equal(_const_by_name(g, "fc.weight/permute_dims"), net.fc.weight.detach().numpy().T)
    # an intermediate ONNX tensor is a named value, and computes what torch computes there
    x = np.random.default_rng(1).standard_normal((2, 1, 8, 8)).astype(np.float32)
    (relu,) = g.run({"x": x}, targets=["/Relu_output_0"])
    np.testing.assert_allclose(relu, torch.relu(net.c1(torch.from_numpy(x))).detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("suffix", [".json", ".cg"])
def test_names_survive_files(cnn: tuple[torch.nn.Module, bytes], tmp_path: object, suffix: str) -> None:
    g = from_onnx(cnn[1])
    path = f"{tmp_path}/model{suffix}"
    opgraph.save(g, path)
    back = opgraph.load(path)
    assert back.symbols.values == g.symbols.values and back.symbols.ops == g.symbols.ops
    assert back.symbols.constants == g.symbols.constants
    assert str(back) == str(g)


def test_export_round_trip_keeps_names() -> None:
    model = _simple_model()
    out = to_onnx(from_onnx(model))
    onnx.checker.check_model(out, full_check=True)
    assert [n.name for n in out.graph.node] == [n.name for n in model.graph.node]
    assert [(n.op_type, list(n.input), list(n.output)) for n in out.graph.node] == \
        [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]
    assert sorted(t.name for t in out.graph.initializer) == sorted(t.name for t in model.graph.initializer)
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(_ort(out, {"x": x})[0], _ort(model, {"x": x})[0], rtol=1e-6)


def test_torch_export_round_trip(cnn: tuple[torch.nn.Module, bytes]) -> None:
    model = onnx.load_from_string(cnn[1])
    out = to_onnx(from_onnx(model))
    onnx.checker.check_model(out, full_check=True)
    names = [n.name for n in out.graph.node]
    assert len(set(names)) == len(names)
    assert {n.name for n in model.graph.node} <= set(names)  # Conv's bias and Gemm's transpose: "/c1/Conv/..."
    assert {"c1.weight", "fc.bias"} <= {t.name for t in out.graph.initializer}
    x = np.random.default_rng(3).standard_normal((2, 1, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_ort(out, {"x": x})[0], _ort(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_export_makes_names_unique() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (2,)), name="_c1")  # the exporter's own spelling of a fresh name
    w = b.constant(np.ones(2, np.float32), name="w")
    s = b.op("add", x, w)
    y = b.op("multiply", s, 2.0)
    for v in (s, y):  # two ops of one name
        b.name_op(b.producer_of(v.id).id, "op")
    b.output(b.name(b.op("exp", b.name(y, "w_2")), "y"))
    out = to_onnx(b.freeze())
    onnx.checker.check_model(out, full_check=True)
    tensors = [i.name for i in out.graph.input] + [t.name for t in out.graph.initializer] + \
        [o for n in out.graph.node for o in n.output]
    assert len(set(tensors)) == len(tensors) and {"_c1", "w", "w_2", "y"} <= set(tensors)
    names = [n.name for n in out.graph.node if n.name]
    assert len(set(names)) == len(names) and {"op", "op_2"} <= set(names)
    feeds = {"_c1": np.arange(2, dtype=np.float32)}
    np.testing.assert_allclose(_ort(out, feeds)[0], np.exp((feeds["_c1"] + 1) * 2), rtol=1e-6)


def test_names_survive_optimize(cnn: tuple[torch.nn.Module, bytes]) -> None:
    graph, _ = from_onnx(cnn[1], weights_as_inputs=True)
    opt = opgraph.optimize(graph, level=2)
    assert opt.num_ops < graph.num_ops  # something was rewritten (the transpose went into the matmul)
    kept = set(opt.symbols.ops.values())
    assert {"/c1/Conv", "/Relu", "/fc/Gemm", "/fc/Gemm/matmul"} <= kept
    assert {"x", "c1.weight", "fc.weight", "/Relu_output_0", "y"} <= set(opt.symbols.values.values())


def test_weights_as_inputs_grad_and_sgd(cnn: tuple[torch.nn.Module, bytes], tmp_path: object) -> None:
    net, data = cnn
    path = f"{tmp_path}/cnn.onnx"
    with open(path, "wb") as f:
        f.write(data)
    loaded = opgraph.load(path, weights_as_inputs=True)
    assert isinstance(loaded, GraphAndWeights)
    graph, weights = loaded
    assert list(weights) == ["c1.weight", "c1.bias", "fc.weight", "fc.bias"]
    assert [graph.name_of(v) for v in graph.inputs] == ["x", *weights]
    state = net.state_dict()
    for name, value in weights.items():
        np.testing.assert_array_equal(value, state[name].numpy())

    # loss = mean((model(x) - t)^2); its gradient for every weight input, by opgraph.grad and by torch autograd
    b = opgraph.GraphBuilder()
    args = {graph.name_of(v): b.input(graph.type_of(v), name=graph.name_of(v)) for v in graph.inputs}
    y = b.op("call", *args.values(), body=Subgraph(graph))
    t = b.input(("float32", (2, 3)), name="t")
    loss = b.mean(b.square(b.subtract(y, t)))
    b.output(loss, *opgraph.grad(loss, [args[n] for n in weights]))
    rng = np.random.default_rng(4)
    x, target = rng.standard_normal((2, 1, 8, 8)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    value, *grads = b.freeze().run({**weights, "x": x, "t": target})

    ref = Net()
    ref.load_state_dict(state)
    ref_loss = torch.mean((ref(torch.from_numpy(x)) - torch.from_numpy(target)) ** 2)
    ref_loss.backward()
    np.testing.assert_allclose(value, ref_loss.item(), rtol=1e-5)
    params = dict(ref.named_parameters())
    for (name, _), g in zip(weights.items(), grads, strict=True):
        np.testing.assert_allclose(g, params[name].grad.numpy(), rtol=1e-4, atol=1e-6)

    # one SGD step on each side; opgraph's weights go back into a state_dict by name
    lr = 0.1
    stepped = {name: w - lr * g for (name, w), g in zip(weights.items(), grads, strict=True)}
    torch.optim.SGD(ref.parameters(), lr=lr).step()
    back = Net()
    back.load_state_dict({name: torch.from_numpy(a) for name, a in stepped.items()})
    for name, p in ref.state_dict().items():
        np.testing.assert_allclose(back.state_dict()[name].numpy(), p.numpy(), rtol=1e-5, atol=1e-7)

    # and back into ONNX: the weights as initializers of their own names
    out = to_onnx(graph, weights=stepped)
    onnx.checker.check_model(out, full_check=True)
    assert [i.name for i in out.graph.input] == ["x"]
    assert set(stepped) <= {t.name for t in out.graph.initializer}
    np.testing.assert_allclose(_ort(out, {"x": x})[0], ref(torch.from_numpy(x)).detach().numpy(), rtol=1e-5,
                               atol=1e-6)


def test_weights_as_inputs_keeps_integer_and_needed_initializers_constant() -> None:
    rows = numpy_helper.from_array(np.array([3, 0, 1], np.int64), "rows")
    scale = numpy_helper.from_array(np.array([2.0], np.float32), "scale")
    scales = numpy_helper.from_array(np.array([2.0, 1.0], np.float32), "scales")  # Resize needs its value
    nodes = [helper.make_node("Gather", ["x", "rows"], ["r"], name="/Gather"),
             helper.make_node("Mul", ["r", "scale"], ["m"], name="/Mul"),
             helper.make_node("Resize", ["m", "", "scales"], ["y"], name="/Resize", mode="nearest")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 2))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (6, 2))], [rows, scale, scales])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    graph, weights = from_onnx(model, weights_as_inputs=True)
    assert list(weights) == ["scale"] and [graph.name_of(v) for v in graph.inputs] == ["x", "scale"]
    np.testing.assert_array_equal(_const_by_name(graph, "rows"), [3, 0, 1])
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_array_equal(graph.run({**weights, "x": x})[0], _ort(model, {"x": x})[0])


def test_to_onnx_weights_are_checked() -> None:
    graph, weights = from_onnx(_simple_model(), weights_as_inputs=True)
    with pytest.raises(OnnxExportError, match="names no input"):
        to_onnx(graph, weights={"nope": np.zeros(1)})
    with pytest.raises(OnnxExportError, match=r"weights\['layer.W'\] is float64\[3, 4\]"):
        to_onnx(graph, weights={**weights, "layer.W": np.zeros((3, 4))})
