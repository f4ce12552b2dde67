"""Symbolic dims on ONNX import: torch models exported with a dynamic batch import without input_shapes, keep
``?`` in their types, and run at any batch on every engine, matching torch."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
from onnx import TensorProto, helper  # noqa: E402

import opgraph  # noqa: E402
from opgraph.io.onnx import OnnxImportError, from_onnx  # noqa: E402

nn = torch.nn
ENGINES = ["numpy", "onnxruntime", "torch", "jax"]
#: the dynamo export imports to the same ops as the TorchScript one: it is run on fewer engines (time)
DYNAMO_ENGINES = ["numpy", "onnxruntime"]


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.c2 = nn.Conv2d(4, 8, 3)
        self.fc = nn.Linear(8 * 3 * 3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
        x = nn.functional.max_pool2d(torch.relu(self.c2(x)), 2)
        return self.fc(torch.flatten(x, 1))


class Block(nn.Module):
    """Pre-norm self-attention: layer norm, matmuls, softmax, and the reshapes that split and join the heads."""

    def __init__(self, d: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.ln, self.qkv, self.out = heads, nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (p.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for p in self.qkv(self.ln(x)).split(c, dim=-1))
        a = torch.softmax(q @ k.transpose(-2, -1) / (c // self.heads) ** 0.5, dim=-1)
        return x + self.out((a @ v).transpose(1, 2).reshape(b, t, c))


class ClsToken(nn.Module):
    """A learned token expanded to the batch (ViT's class token), then ``view(x.size(0), -1)``."""

    def __init__(self) -> None:
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1)
        return y.view(y.size(0), -1) * 2


def _randomise_bn(m: nn.Module) -> nn.Module:
    """Running statistics and affine parameters away from 0 and 1, so a wrong normalisation shows."""
    g = torch.Generator().manual_seed(1)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            with torch.no_grad():
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=g))
                mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
                mod.weight.copy_(torch.randn(mod.num_features, generator=g))
                mod.bias.copy_(torch.randn(mod.num_features, generator=g))
    return m.eval()


def export(model: nn.Module, sample: torch.Tensor, dynamic: dict[int, str], dynamo: bool, path: str) -> str:
    """``model`` as ONNX with the dims in ``dynamic`` left symbolic, by the TorchScript or the dynamo exporter;
    constant folding is off, so batch norm reaches the importer as BatchNormalization."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            pytest.importorskip("onnxscript")
            shapes = {"x": {axis: torch.export.Dim(name) for axis, name in dynamic.items()}}
            torch.onnx.export(model, (sample,), path, input_names=["x"], output_names=["y"], dynamo=True,
                              dynamic_shapes=shapes, optimize=False, verbose=False)
        else:
            torch.onnx.export(model, (sample,), path, input_names=["x"], output_names=["y"], dynamo=False,
                              dynamic_axes={"x": dynamic, "y": {0: dynamic[0]}}, do_constant_folding=False)
    return path


def check_batches(graph: opgraph.Graph, model: nn.Module, make: object, engines: list[str]) -> None:
    """Batches 1, 3 and 8 on NumPy, 1 and 8 on the other engines (each compiles one variant per batch)."""
    for engine in engines:
        program = opgraph.compile(graph, backend=engine)
        for n in (1, 3, 8) if engine == "numpy" else (1, 8):
            x = make(n)  # type: ignore[operator]
            with torch.no_grad():
                want = model(x).numpy()
            got = np.asarray(program(x.numpy())[0])
            assert got.shape == want.shape, (engine, n)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{engine}, batch {n}")


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_cnn_with_dynamic_batch(tmp_path: object, dynamo: bool) -> None:
    torch.manual_seed(0)
    model = _randomise_bn(SmallCNN())
    path = export(model, torch.randn(2, 1, 16, 16), {0: "N"}, dynamo, f"{tmp_path}/cnn.onnx")
    proto = onnx.load(path)
    assert "BatchNormalization" in {n.op_type for n in proto.graph.node}
    g = opgraph.load(path)
    (x,) = g.inputs.tolist()
    assert g.type_of(x).shape == (None, 1, 16, 16)
    assert g.type_of(g.outputs[0]).shape == (None, 10)
    # every engine takes the graph whole: no run-time shape op is left for a dynamic batch alone
    assert not {"shape", "reshape_to", "alloc"} & {g.kind_of(op) for op in range(g.num_ops)}
    check_batches(g, model, lambda n: torch.randn(n, 1, 16, 16), DYNAMO_ENGINES if dynamo else ENGINES)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_attention_block_with_dynamic_batch(tmp_path: object, dynamo: bool) -> None:
    torch.manual_seed(0)
    model = Block().eval()
    path = export(model, torch.randn(2, 5, 16), {0: "N"}, dynamo, f"{tmp_path}/block.onnx")
    g = opgraph.load(path)
    assert g.type_of(g.inputs[0]).shape == (None, 5, 16)
    kinds = {g.kind_of(op) for op in range(g.num_ops)}
    # torch's Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains resolve to static reshapes with one -1
    assert "reshape" in kinds and not {"shape", "reshape_to"} & kinds
    check_batches(g, model, lambda n: torch.randn(n, 5, 16), DYNAMO_ENGINES if dynamo else ENGINES)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_batch_and_sequence_both_dynamic(tmp_path: object, dynamo: bool) -> None:
    """Splitting the heads of a [N, T, C] with N and T both open needs the run's sizes: ``reshape_to``, which the
    NumPy engine runs (another engine runs the rest of the graph around it)."""
    torch.manual_seed(0)
    model = Block().eval()
    path = export(model, torch.randn(2, 5, 16), {0: "N", 1: "T"}, dynamo, f"{tmp_path}/block.onnx")
    g = opgraph.load(path)
    assert g.type_of(g.inputs[0]).shape == (None, None, 16)
    check_batches(g, model, lambda n: torch.randn(n, n + 2, 16), ["numpy", "onnxruntime"])


def test_token_expanded_to_the_batch(tmp_path: object) -> None:
    torch.manual_seed(0)
    model = ClsToken().eval()
    path = export(model, torch.randn(2, 5, 16), {0: "N"}, False, f"{tmp_path}/cls.onnx")
    g = opgraph.load(path)
    assert g.type_of(g.outputs[0]).shape == (None, 96)
    check_batches(g, model, lambda n: torch.randn(n, 5, 16), ["numpy", "onnxruntime"])


def _conv_model(auto_pad: str) -> onnx.ModelProto:
    w = helper.make_tensor("w", TensorProto.FLOAT, (2, 1, 3, 3), np.linspace(-1, 1, 18, dtype=np.float32))
    node = helper.make_node("Conv", ["x", "w"], ["y"], auto_pad=auto_pad, name="conv")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "H", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_input_shapes_none_keeps_a_dim_symbolic() -> None:
    model = _conv_model("NOTSET")
    g = from_onnx(model)
    assert g.type_of(g.inputs[0]).shape == (None, 1, None, 8)
    g = from_onnx(model, input_shapes={"x": (None, 1, 6, 8)})
    assert g.type_of(g.inputs[0]).shape == (None, 1, 6, 8)
    assert g.type_of(g.outputs[0]).shape == (None, 2, 4, 6)
    x = np.random.default_rng(0).standard_normal((5, 1, 6, 8)).astype(np.float32)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(
        np.linspace(-1, 1, 18, dtype=np.float32).reshape(2, 1, 3, 3))).numpy()
    np.testing.assert_allclose(g.run(x=x)[0], want, rtol=1e-5, atol=1e-6)


def test_a_rule_that_needs_a_size_says_which_dim_and_why() -> None:
    with pytest.raises(OnnxImportError) as info:
        from_onnx(_conv_model("SAME_UPPER"))
    text = str(info.value)
    assert "dim 2 (H)" in text and "dim 2 of input 'x'" in text and "auto_pad SAME" in text
    assert "dim 0" not in text  # the batch may stay symbolic
    g = from_onnx(_conv_model("SAME_UPPER"), input_shapes={"x": (None, 1, 6, 8)})
    assert g.type_of(g.outputs[0]).shape == (None, 2, 6, 8)


def test_a_size_compared_with_one_is_not_taken_for_a_constant() -> None:
    """``Where(Shape(x)[0] == 1, ...)`` differs at batch 1: the probe sizes (all large) must not decide it."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Equal", ["s", "one"], ["is_one"]),
             helper.make_node("Where", ["is_one", "two", "s"], ["t"]),
             helper.make_node("Expand", ["x", "t"], ["y"])]
    one = helper.make_tensor("one", TensorProto.INT64, (1,), [1])
    two = helper.make_tensor("two", TensorProto.INT64, (1,), [2])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [one, two])
    g = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    for n, want in ((1, 2), (4, 4)):
        assert g.run(x=np.ones(n, np.float32))[0].shape == (want,)


def test_light_model_with_its_batch_made_symbolic() -> None:
    """DenseNet-121 from the onnx package, its batch dim renamed N: it imports with ``?`` and agrees with
    onnxruntime on the same model at batch 2."""
    ort = pytest.importorskip("onnxruntime")
    from pathlib import Path

    model = onnx.load(Path(onnx.__file__).parent / "backend/test/data/light/light_densenet121.onnx")
    inits = {t.name for t in model.graph.initializer}
    (inp,) = [vi for vi in model.graph.input if vi.name not in inits]
    for vi in (inp, *model.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"  # replaces the dim_value: one field of a oneof
    g = from_onnx(model)
    assert g.type_of(g.inputs[0]).shape == (None, 3, 224, 224)
    x = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {inp.name: x})[0]
    np.testing.assert_allclose(opgraph.compile(g)(x)[0], want, rtol=1e-4, atol=1e-5)


def test_recipe_from_pytorch(tmp_path: object) -> None:
    """docs/from-pytorch.md end to end: torch's default (dynamo) export with a dynamic batch -> opgraph.load ->
    opgraph.optimize -> compile -> save as .cg and JSON -> load -> the same results as torch at any batch."""
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = _randomise_bn(SmallCNN())
    path = f"{tmp_path}/net.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 1, 16, 16),), path, dynamo=True, input_names=["x"],
                          output_names=["y"], dynamic_shapes={"x": {0: torch.export.Dim("batch")}}, verbose=False)
    g = opgraph.optimize(opgraph.load(path))
    assert g.type_of(g.inputs[0]).shape == (None, 1, 16, 16)
    opgraph.save(g, f"{tmp_path}/net.cg")
    opgraph.save(g, f"{tmp_path}/net.json")
    for saved in (opgraph.load(f"{tmp_path}/net.cg"), opgraph.load(f"{tmp_path}/net.json")):
        assert saved == g
    check_batches(opgraph.load(f"{tmp_path}/net.json"), model, lambda n: torch.randn(n, 1, 16, 16),
                  ["numpy", "onnxruntime"])


def _model(nodes: list, inputs: list, inits: list, opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_a_size_lost_by_a_run_time_reshape_is_still_known() -> None:
    """[N, T, 12] -> [N, T, 3, 4] needs ``reshape_to`` (two run-time sizes), whose type forgets the 3; an
    equal Split along that axis still knows it from the symbols."""
    i64 = TensorProto.INT64
    nodes = [helper.make_node("Shape", ["x"], ["s"], end=2),
             helper.make_node("Concat", ["s", "heads"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"]),
             helper.make_node("Split", ["r"], ["a", "b", "c"], axis=2, num_outputs=3),
             helper.make_node("Sub", ["a", "c"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 12])],
               [helper.make_tensor("heads", i64, (2,), [3, 4])])
    g = from_onnx(m)
    for n, t in ((1, 2), (3, 5)):
        x = np.random.default_rng(n).standard_normal((n, t, 12)).astype(np.float32)
        r = x.reshape(n, t, 3, 4)
        np.testing.assert_array_equal(g.run(x=x)[0], r[:, :, :1] - r[:, :, 2:])


def test_range_over_the_batch() -> None:
    i64 = TensorProto.INT64
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=0, end=1),
             helper.make_node("Squeeze", ["s", "zero1"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["rf", "x"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
               [helper.make_tensor("zero1", i64, (1,), [0]), helper.make_tensor("zero", i64, (), [0]),
                helper.make_tensor("one", i64, (), [1])])
    g = from_onnx(m)
    assert g.type_of(g.inputs[0]).shape == (None,)
    for n in (1, 4):
        x = np.arange(1, n + 1, dtype=np.float32)
        np.testing.assert_array_equal(g.run(x=x)[0], np.arange(n) * x)
