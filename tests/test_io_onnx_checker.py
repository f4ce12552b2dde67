"""Every ONNX model opgraph writes passes ``onnx.checker.check_model(full_check=True)`` at the opset written and
loads in onnxruntime: the op suite's cases and every export rule at every opset ``to_onnx`` writes, and real
architectures (the light models in the onnx package) imported, optimised and written back; and
``to_onnx(..., nan_semantics=...)``: the NaN guards only where asked."""

from __future__ import annotations

import os
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import numpy_helper  # noqa: E402

import opcheck  # noqa: E402
import opgraph  # noqa: E402
from backend_suite import FAMILIES, claimed, compare  # noqa: E402
from opgraph import backends  # noqa: E402
from opgraph.core.types import TensorType  # noqa: E402
from opgraph.io.onnx import OnnxExportError, from_onnx, to_onnx  # noqa: E402
from opgraph.io.onnx.export import OPSETS  # noqa: E402
from test_io_onnx_export import CASES, _graph  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _ort_max_opset() -> int:
    """The newest opset the installed onnxruntime loads (found by loading a one-Relu model)."""
    best = OPSETS.start
    for opset in OPSETS:
        x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
        g = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
        m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", opset)])
        m.ir_version = 10
        try:
            ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:  # onnxruntime's errors have no public common type
            break
        best = opset
    return best


ORT_MAX = _ort_max_opset()
ORT_OPSETS = sorted({OPSETS.start, ORT_MAX})
"""The opsets the exported models are also run at in onnxruntime: 18 (the default) and the newest onnxruntime
loads (every opset is full-checked)."""


def _session(model: Any) -> Any:
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_opsets_are_the_onnx_packages_from_18() -> None:
    assert OPSETS.start == 18 and OPSETS.stop - 1 == onnx.defs.onnx_opset_version()
    g, _ = _graph("exp", ("float32", (2,)))
    for bad in (17, OPSETS.stop, "18"):
        with pytest.raises(OnnxExportError, match=f"opgraph writes ONNX opsets 18 to {OPSETS.stop - 1}, not"):
            to_onnx(g, opset=bad)  # type: ignore[arg-type]
    assert to_onnx(g, opset=OPSETS.stop - 1).opset_import[0].version == OPSETS.stop - 1


# ---------------------------------------------------------------- every export rule at every opset
@pytest.mark.parametrize(("kind", "types", "attrs"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_rule_passes_the_checker_at_every_opset(kind: str, types: tuple[Any, ...],
                                                      attrs: dict[str, Any]) -> None:
    g, feeds = _graph(kind, *types, **attrs)
    feeds = {k: (np.zeros_like(v) if v.dtype.kind in "iu" and kind in ("take", "gather_elements", "gather_nd",
                                                                       "scatter_elements", "scatter_nd") else v)
             for k, v in feeds.items()}  # in-range indices: zeros are valid for every case's data
    if kind == "acosh":
        feeds = {k: v + 1 for k, v in feeds.items()}
    want = g.run(feeds)
    for opset in OPSETS:
        model = to_onnx(g, opset=opset)
        assert model.opset_import[0].version == opset
        onnx.checker.check_model(model, full_check=True)
        if opset in ORT_OPSETS:
            compare(_session(model).run(None, feeds), want, f"{kind} at opset {opset}")


# ---------------------------------------------------------------- the op suite's cases at every opset
PER_KIND = 1
"""How many of the op suite's cases of each kind and input dtypes are exported and checked (the first ones seen):
ONNX's type constraints are per dtype."""
SAMPLE = int(os.environ.get("OPGRAPH_ONNX_CHECK_SAMPLE", "3"))
"""Every SAMPLE-th parametrised case of each family test is run here (at least one); OPGRAPH_ONNX_CHECK_SAMPLE=1
runs them all (about three times as long)."""
checked: Counter[tuple[str, tuple[str, ...]]] = Counter()
refused: dict[str, str] = {}
_plain_run_op = opcheck.run_op


def _check_case(kind: str, *arrays: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """``opcheck.run_op`` for the family tests re-run here: the one-op graph of the case is written at every
    opset, full-checked, and where the onnxruntime engine claims it, run in onnxruntime against NumPy."""
    want = _plain_run_op(kind, *arrays, **attrs)
    key = (kind, tuple(np.asarray(a).dtype.name for a in arrays))
    if checked[key] >= PER_KIND:
        return want
    b = opgraph.GraphBuilder()
    ins = [b.input(TensorType.of(a), name=f"x{i}") for i, a in enumerate(arrays)]
    outs = b.op(kind, *ins, **attrs)
    b.output(*(outs if isinstance(outs, tuple) else (outs,)))
    g = b.freeze()
    runs = claimed(backends.get("onnxruntime"), g) is None and all(a.size for a in arrays)
    feeds = {f"x{i}": np.array(a, order="C") for i, a in enumerate(arrays)}
    for opset in OPSETS:
        try:
            model = to_onnx(g, opset=opset)
        except OnnxExportError as exc:  # an op ONNX cannot express: refused, never written wrong
            refused.setdefault(kind, str(exc))
            checked[key] += 1
            return want
        onnx.checker.check_model(model, full_check=True)
        if runs and opset in ORT_OPSETS:
            compare(_session(model).run(None, feeds), want, f"{kind} at opset {opset}")
    checked[key] += 1
    return want


@pytest.fixture(autouse=True)
def _checking_run_op(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    monkeypatch.setattr(opcheck, "run_op", _check_case)
    for fam in FAMILIES:
        mod = importlib.import_module(f"test_ops_{fam}")
        if hasattr(mod, "run_op"):
            monkeypatch.setattr(mod, "run_op", _check_case)


def test_the_op_suite_cases_really_are_checked() -> None:
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    before = checked["exp", ("float32",)]
    opcheck.check_op("exp", [x], np.exp, rtol=1e-6)
    assert checked["exp", ("float32",)] == max(before, PER_KIND)
    with pytest.raises(OnnxExportError, match=r"op 0 \(exp\) computes on complex numbers \(complex64\)"):
        to_onnx(_graph("exp", ("complex64", (2,)))[0])


def _family_tests() -> dict[str, Any]:
    """The family tests that build one-op graphs, each with every SAMPLE-th of its parametrised cases (as
    backend_suite.make_module does)."""
    import importlib

    out = {}
    for fam in FAMILIES:
        mod = importlib.import_module(f"test_ops_{fam}")
        for attr in dir(mod):
            obj = getattr(mod, attr)
            if attr.startswith("test_") and callable(obj) and getattr(obj, "__module__", "") == mod.__name__:
                pick = zlib.crc32(obj.__qualname__.encode()) % SAMPLE  # not always the same cases
                fn = opcheck.graph_test_copy(obj, lambda i, pick=pick: i % SAMPLE == pick)
                if fn is not None:
                    out[f"{attr}__{fam}"] = fn
    return out


globals().update(_family_tests())


# ---------------------------------------------------------------- real architectures
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ["light_densenet121", "light_inception_v1", "light_resnet50", "light_shufflenet", "light_squeezenet"]
"""The light models small enough for a test: vgg19, zfnet512 and alexnet hold fully connected weights of 40-400
MB once their ConstantOfShape weights are constants; inception_v2 has the ops of inception_v1 and resnet50
(batch norm) and doubles the time (it passes too: the tests were run with it)."""


def _dummy_input(model: Any) -> dict[str, np.ndarray]:
    """The input ONNX's suite computes the expected output from (arange / n, float32)."""
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name not in inits:
            shape = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
            n = int(np.prod(shape))
            feeds[vi.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


def _random_weights(model: Any, rng: np.random.Generator) -> Any:
    """``model`` with each ConstantOfShape weight (the light models' weights are constant-filled, which makes
    every output the same number) replaced by random values: normal / sqrt(fan-in) for kernels, 0.5 to 1.5 for
    per-channel vectors (batch-norm variances stay positive)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    keep = []
    for node in m.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = tuple(int(d) for d in inits[node.input[0]])
            if len(shape) >= 2:
                w = rng.standard_normal(shape) / np.sqrt(max(int(np.prod(shape[1:])), 1))
            else:
                w = rng.uniform(0.5, 1.5, shape)
            m.graph.initializer.append(numpy_helper.from_array(w.astype(np.float32), node.output[0]))
        else:
            keep.append(node)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    return m


@pytest.mark.parametrize("name", MODELS)
def test_real_architectures_pass_the_checker_and_match_onnxruntime(name: str, tmp_path: Path) -> None:
    original = onnx.load(str(LIGHT / f"{name}.onnx"))
    feeds = _dummy_input(original)
    expected = numpy_helper.to_array(onnx.load_tensor(str(LIGHT / f"{name}_output_0.pb")))
    randomised = _random_weights(original, np.random.default_rng(0))
    want = _session(randomised).run(None, feeds)[0]
    assert np.ptp(want) > 1e-4  # random weights: the outputs differ, unlike the constant-filled model's
    onnx.save(randomised, str(tmp_path / "random.onnx"))
    runs = [(LIGHT / f"{name}.onnx", expected, ORT_MAX, "onnx"),  # the suite's expected output
            (tmp_path / "random.onnx", want, OPSETS.start, "numpy")]  # the randomised model in onnxruntime
    for path, reference, opset, nan in runs:
        g = opgraph.optimize(opgraph.load(str(path)), level=2)
        out = to_onnx(g, opset=opset, nan_semantics=nan)
        onnx.checker.check_model(out, full_check=True)
        got = _session(out).run(None, feeds)[0]
        np.testing.assert_allclose(got, reference.reshape(got.shape), rtol=1e-4,
                                   atol=1e-5 * float(np.max(np.abs(reference))), err_msg=f"{name}, opset {opset}")


def test_densenet_average_pools_write_dilations_only_where_the_opset_has_them() -> None:
    g = from_onnx(str(LIGHT / "light_densenet121.onnx"))
    assert any(g.kind_of(op) == "avg_pool" and g.attrs_of(op).get("dilation") == (1, 1) for op in range(g.num_ops))
    for opset in (18, 19):
        pools = [n for n in to_onnx(g, opset=opset).graph.node if n.op_type == "AveragePool"]
        assert pools and all(("dilations" in {a.name for a in n.attribute}) == (opset >= 19) for n in pools)


def test_an_attribute_the_opset_lacks_with_a_value_other_than_its_default_is_refused() -> None:
    g, feeds = _graph("avg_pool", ("float32", (1, 2, 7, 7)), kernel_size=(2, 2), dilation=(2, 2))
    with pytest.raises(OnnxExportError, match=r"op 0 \(avg_pool\): ONNX's AveragePool has no attribute 'dilations' "
                                              r"at opset 18 \(it has since opset 19: to_onnx\(\.\.\., opset=19\)"):
        to_onnx(g)
    model = to_onnx(g, opset=19)
    onnx.checker.check_model(model, full_check=True)
    compare(_session(model).run(None, feeds), g.run(feeds), "avg_pool with dilations at opset 19")
    # the onnxruntime engine (opset 18) does not claim it, and says why
    from opgraph.backends.base import OpInfo

    assert "dilations" in (backends.get("onnxruntime").why_not(OpInfo.of(g, 0)) or "")


# ---------------------------------------------------------------- nan_semantics
def _pool_graph() -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (1, 2, 6, 6)), name="x")
    p = b.op("max_pool", x, kernel_size=(2, 2), stride=(2, 2))
    b.output(b.name(p, "pool"), b.name(b.op("max", x, axis=(2, 3)), "mx"),
             b.name(b.op("min", x, axis=(3,)), "mn"), b.name(b.op("argmax", x, axis=3), "am"))
    return b.freeze()


def _ops(model: Any) -> set[str]:
    return {n.op_type for n in model.graph.node}


def test_onnx_nan_semantics_writes_no_guards_and_matches_on_finite_inputs() -> None:
    g = _pool_graph()
    plain = to_onnx(g, nan_semantics="onnx")
    onnx.checker.check_model(plain, full_check=True)
    assert not _ops(plain) & {"If", "IsNaN", "Where"}
    assert _ops(to_onnx(g)) >= {"If", "IsNaN", "Where"}  # the default for a built graph: NumPy's
    x = np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)
    compare(_session(plain).run(None, {"x": x}), g.run({"x": x}), "nan_semantics='onnx'")
    with pytest.raises(ValueError, match="nan_semantics must be 'numpy' or 'onnx', got 'ieee'"):
        to_onnx(g, nan_semantics="ieee")


def test_numpy_nan_semantics_gives_numpys_result_on_nan_inputs() -> None:
    g = _pool_graph()
    model = to_onnx(g, nan_semantics="numpy")
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(1).standard_normal((1, 2, 6, 6)).astype(np.float32)
    x[0, 0, 1, 2] = x[0, 1, 5, 0] = np.nan
    want = [np.max(x.reshape(1, 2, 3, 2, 3, 2), axis=(3, 5)), np.max(x, axis=(2, 3)), np.min(x, axis=3),
            np.argmax(x, axis=3)]
    compare(_session(model).run(None, {"x": x}), want, "nan_semantics='numpy' on NaN inputs")
    compare(g.run({"x": x}), want, "opgraph's own run")


def test_an_imported_model_written_back_with_onnxs_semantics_has_no_guards(tmp_path: Path) -> None:
    """Re-exporting an imported model: ``nan_semantics="onnx"`` (``--onnx-nan-semantics onnx``) writes its max
    pools as plain MaxPool nodes again; the default keeps NumPy's NaN propagation with an ``If`` per max pool."""
    from opgraph.cli.main import main

    src = LIGHT / "light_inception_v1.onnx"
    g = opgraph.optimize(from_onnx(str(src)), level=2)
    pools = sum(n.op_type == "MaxPool" for n in onnx.load(str(src)).graph.node)
    assert _ops(to_onnx(g)) >= {"If", "IsNaN"}
    plain = to_onnx(g, nan_semantics="onnx")
    assert "If" not in _ops(plain) and sum(n.op_type == "MaxPool" for n in plain.graph.node) == pools
    assert main(["convert", str(src), str(tmp_path / "out.onnx"), "--onnx-nan-semantics", "onnx"]) == 0
    written = onnx.load(str(tmp_path / "out.onnx"))
    onnx.checker.check_model(written, full_check=True)
    assert not _ops(written) & {"If", "IsNaN"} and sum(n.op_type == "MaxPool" for n in written.graph.node) == pools
    feeds = _dummy_input(onnx.load(str(src)))
    np.testing.assert_allclose(_session(written).run(None, feeds)[0], _session(onnx.load(str(src))).run(None, feeds)[0],
                               rtol=1e-5, atol=1e-7)
