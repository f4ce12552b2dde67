"""The onnxruntime backend: a graph written as one ONNX model and run by an ONNX Runtime session.

The rule table is the ONNX exporter's (:data:`opgraph.io.onnx.export.EXPORT`):
adding an op to ONNX export adds it to this backend. ONNX Runtime's CPU
kernels do not cover every dtype of every op (many have float32 and float64
kernels only, some float32 alone; where a kind has no float16 kernel, ONNX
Runtime computes float16 in float32), so the capability set is narrower than the
exporter's: each kind's limit, registered with ``@BACKEND.limit(kind, ...)``,
says which dtypes it computes in (:func:`computes_in`), and for some kinds the
attribute and shape cases ONNX Runtime refuses or computes differently from
NumPy, each with its reason. (The backend is small enough to stay one module.)

    >>> import numpy as np, opgraph
    >>> from opgraph.backends import get
    >>> ort = get("onnxruntime")
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (3,)), name="x")
    >>> b.output(b.op("exp", b.op("multiply", x, 2.0)))
    >>> exe = ort.compile_graph(b.freeze(), threads=1)
    >>> exe([np.zeros(3, dtype=np.float32)])
    [array([1., 1., 1.], dtype=float32)]
    >>> ort.supports("acos", [("float64", (3,))])  # ONNX Runtime's Acos has a float32 kernel only
    False

Values follow NumPy, NaN included (the exporter makes max and min reductions,
argmax, argmin and max pools propagate NaN; topk is not claimed for floats, as
ONNX Runtime's TopK does not order NaN as the largest), with one exception:
integer division or remainder by zero raises in ONNX Runtime (NumPy gives 0).
The graph is exported with ``to_onnx(graph, nan_semantics="numpy")``, keeping
those guards, whatever the graph was imported from: every engine computes
opgraph's (NumPy's) values.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import numpy as np

from opgraph.backends.base import (
    Backend,
    BackendError,
    Executable,
    NumericsDifference,
    OpInfo,
    conform_args,
    extreme,
    input_dtypes,
)
from opgraph.core.graph import Graph
from opgraph.ops.nn import pad4

# The rule table and the compiler are io.onnx.export's. The exporter (and with it onnx, about 0.3 s to import)
# and onnxruntime are imported inside functions, on the first capability query or compile, so that the backends
# registry importing this module stays cheap. (Layering: backends were first placed below io, which made the
# import inside functions a requirement; pyproject's import-linter layers now put io below backends.)


class _ExportRules(Mapping[str, Any]):
    """A live view of the ONNX exporter's rule table (imported on first use)."""

    def _rules(self) -> Mapping[str, Any]:
        from opgraph.io.onnx.export import EXPORT  # lazy (see the note at the top)

        return EXPORT.rules

    def __getitem__(self, kind: str) -> Any:
        return self._rules()[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rules())

    def __len__(self) -> int:
        return len(self._rules())

    def __contains__(self, kind: object) -> bool:
        return kind in self._rules()


# ---------------------------------------------------------------- capability
F32 = frozenset({"float16", "float32"})
"""What a kind with a float32 kernel only runs (ONNX Runtime computes float16 in float32)."""
FLOATS = F32 | {"float64"}
SIGNED = frozenset({"int8", "int16", "int32", "int64"})
INTS = SIGNED | {"uint8", "uint16", "uint32", "uint64"}
NUMERIC = FLOATS | INTS
ALL = NUMERIC | {"bool"}
I32_64 = frozenset({"int32", "int64"})
BYTES = frozenset({"int8", "uint8"})

DTYPES = ALL
"""The dtypes the backend runs: all but complex ones (every input and output of a claimed op has one)."""


#: kinds computing in their first input's dtype, and comparisons, computing in their inputs' common dtype
_BY_INPUT = frozenset({"argmax", "argmin", "isnan", "isinf", "isfinite", "topk"})
_BY_COMMON = frozenset({"less", "less_equal", "greater", "greater_equal", "equal", "not_equal"})


def compute_dtype(info: OpInfo) -> str:
    """The dtype an op's ONNX nodes compute in: the result's (indexing ops: their data's, one_hot: its values'),
    the first input's for a few kinds, and the inputs' common dtype for comparisons.

    >>> from opgraph.core.types import TensorType as T
    >>> compute_dtype(OpInfo("less", {}, (T("int8", (2,)), T("float32", (2,))), (T("bool", (2,)),)))
    'float32'
    """
    if info.kind in _BY_INPUT:
        return info.in_dtypes[0].name
    if info.kind in _BY_COMMON:
        return np.result_type(*info.in_dtypes).name
    return info.out_dtype.name


# ---------------------------------------------------------------- running
class _Session(Executable):
    """One ONNX Runtime session called positionally; outputs are NumPy arrays.

    Calls use ``session.run`` with NumPy feeds, which is safe to call from several threads at once. IOBinding was
    measured and is not faster here (2 inputs of float32[16], 4 ops, 2 outputs, one thread: ``run`` about 6.5 us
    a call; a fresh IOBinding with ``bind_cpu_input``/``bind_output``/``copy_outputs_to_cpu`` about 11 us; one
    binding reused across calls 6-9 us, but it is not thread-safe; ``get_outputs()`` as OrtValues then ``.numpy()``
    about 19 us; at float32[100000] ``run`` about 85 us against 135-150 us, as the binding copies its outputs).
    """

    def __init__(self, session: Any, graph: Graph) -> None:
        self.session = session
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        types = [graph.type_of(v) for v in graph.inputs.tolist()]
        #: each input's static shape (None where a dimension is dynamic)
        self.shapes = [t.shape if t.shape is not None and None not in t.shape else None for t in types]
        self.graph = graph
        self.dtypes = input_dtypes(graph)

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        feeds = {}
        args = conform_args(self.graph, self.dtypes, args)  # ONNX Runtime's own refusal would name no opgraph input
        for n, a, shape in zip(self.input_names, args, self.shapes, strict=True):
            a = np.asarray(a, order="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
            if shape is not None and a.shape != shape and a.size == math.prod(shape):
                a = a.reshape(shape)  # a 0-d value that np.ascontiguousarray made 1-d
            feeds[n] = a
        return self.session.run(self.output_names, feeds)


class _NoOutputs(Executable):
    """A graph without outputs (ONNX Runtime refuses such a model): nothing to compute."""

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        return []


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime: the graph exported to ONNX (opset 18) and run as one inference session."""

    def unavailable_reason(self) -> str | None:
        """Why the backend cannot be used here: it needs onnx (the exporter) as well as onnxruntime."""
        import importlib.util

        reason = super().unavailable_reason()
        if reason is None and importlib.util.find_spec("onnx") is None:
            return f"backend {self.name!r} needs the 'onnx' package: pip install \"opgraph[{self.extra}]\""
        return reason

    def check_device(self, device: str | None) -> str:
        dev = super().check_device(device)
        if dev.split(":")[0] == "cuda":
            import onnxruntime

            if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
                raise BackendError(f"backend {self.name!r} has no CUDA here: this onnxruntime has no "
                                   "CUDAExecutionProvider (pip install onnxruntime-gpu)")
        return dev

    def compile_graph(self, graph: Graph, *, device: str | None = None, donate: Sequence[int] = (),
                      threads: int | None = None, **options: Any) -> Executable:
        """One ONNX Runtime session computing ``graph`` (no update edges: the runtime carries state).

        ``threads`` sets the session's intra- and inter-op thread counts;
        by default they are ``OMP_NUM_THREADS`` when that is set (so that
        benchmarks run with ``OMP_NUM_THREADS=1`` compare backends on equal
        terms), else ONNX Runtime's own default (one per core). ``donate`` is
        accepted and ignored: a session's outputs are always fresh arrays.
        """
        if options:
            raise TypeError(f"the onnxruntime backend takes no option(s) {sorted(options)}")
        dev = self.check_device(device)
        if not len(graph.outputs):
            return _NoOutputs()
        import onnxruntime

        from opgraph.io.onnx.export import to_onnx  # lazy (see the note at the top)

        model = to_onnx(graph, nan_semantics="numpy")  # opgraph's values, NaN included, as every engine's
        so = onnxruntime.SessionOptions()
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3  # errors reach the caller as exceptions; no warnings on stderr
        if threads is None and os.environ.get("OMP_NUM_THREADS", "").strip().isdigit():
            threads = int(os.environ["OMP_NUM_THREADS"])
        if threads:
            so.intra_op_num_threads = int(threads)
            so.inter_op_num_threads = int(threads)
        providers: list[Any] = ["CPUExecutionProvider"]
        if dev.startswith("cuda"):
            index = int(dev.split(":")[1]) if ":" in dev else 0
            providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
        # MatMulScaleFusion folds a scalar factor into FusedMatMul's alpha, a float32 attribute: a float64 graph
        # (an SGD step's lr=0.1) would lose precision (about 1e-8 relative), so it is off when float64 is present
        disabled = ["MatMulScaleFusion"] if any(
            getattr(graph.type_of(v), "dtype", None) == np.float64 for v in range(graph.num_values)) else []
        session = onnxruntime.InferenceSession(model.SerializeToString(), so, providers=providers,
                                               disabled_optimizers=disabled)
        return _Session(session, graph)


BACKEND = OnnxRuntimeBackend(
    "onnxruntime", rules=cast("dict[str, Any]", _ExportRules()), dtypes=DTYPES,
    module="onnxruntime", extra="onnxruntime", devices=("cpu", "cuda"),
    doc="ONNX Runtime: the graph exported to ONNX and run as one session (CPU; CUDA with onnxruntime-gpu)",
    numerics=(
        NumericsDifference(
            "decomposed", "NaN, infinite or zero operands, tiny ones (squares underflow) and huge ones (>= 2**nmant)",
            "the exported form floor(a / b) gives other NaN/inf placement and values there "
            "(inf // 5e-324 inf and 2.2e-308 // -1e30 -0 where NumPy gives NaN and -1)",
            where=extreme, kinds=frozenset({"floor_divide"})),
        NumericsDifference(
            "cancellation", "nonzero operands of magnitude below 1",
            "computed as exp(x) - 1 and log(1 + x): the absolute error is about eps, the relative error large where "
            "the result is small (expm1(1e-310) = 0)",
            where=lambda xs: (np.abs(xs[0]) < 1) & (xs[0] != 0), kinds=frozenset({"expm1", "log1p"})),
        NumericsDifference(
            "cancellation", "operands above 1",
            "computed as 1 - erf(x): relative error up to 1e-3 in float32 where erfc(x) is small (erfc(3))",
            where=lambda xs: xs[0] > 1, kinds=frozenset({"erfc"})),
    ))


# ---------------------------------------------------------------- limits: the dtypes each kind computes in, and more
def computes_in(info: OpInfo, dtypes: frozenset[str]) -> str | None:
    """Why ONNX Runtime's CPU kernels cannot run ``info``'s op: they do not compute in its :func:`compute_dtype`
    (None when ``dtypes`` has it).

    >>> from opgraph.core.types import TensorType as T
    >>> computes_in(OpInfo("acos", {}, (T("float64", (3,)),), (T("float64", (3,)),)), F32)
    "ONNX Runtime's CPU kernels for acos do not compute in float64"
    """
    dt = compute_dtype(info)
    return None if dt in dtypes else f"ONNX Runtime's CPU kernels for {info.kind} do not compute in {dt}"


@BACKEND.limit("positive", "copy", "floor", "ceil", "round", "trunc", "logical_not", "logical_and", "logical_or",
               "logical_xor", "any", "all", "cast", "equal", "not_equal",
               "reshape", "expand_dims", "squeeze", "permute_dims", "moveaxis", "broadcast_to", "concat", "stack",
               "getitem", "flip", "tile", "gather_elements", "gather_nd")
def _any_dtype(info: OpInfo) -> str | None:
    return computes_in(info, ALL)


@BACKEND.limit("abs", "sign", "square", "add", "subtract", "multiply", "fma", "floor_divide", "remainder", "fmod",
               "less", "less_equal", "greater", "greater_equal")
def _numeric(info: OpInfo) -> str | None:
    return computes_in(info, NUMERIC)


@BACKEND.limit("negative")
def _negative(info: OpInfo) -> str | None:
    return computes_in(info, FLOATS | SIGNED)  # Neg: no unsigned kernels


@BACKEND.limit("bitwise_invert", "bitwise_and", "bitwise_or", "bitwise_xor")
def _bitwise(info: OpInfo) -> str | None:
    return computes_in(info, INTS)  # no bool kernels


@BACKEND.limit("isnan", "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "reciprocal", "expm1", "log1p",
               "log2", "log10", "exp2", "hypot", "logaddexp", "divide", "var", "std", "softmax", "log_softmax")
def _floats(info: OpInfo) -> str | None:
    return computes_in(info, FLOATS)


@BACKEND.limit("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc", "det",
               "conv", "conv_transpose")
def _float32(info: OpInfo) -> str | None:
    return computes_in(info, F32)


@BACKEND.limit("relu")
def _relu(info: OpInfo) -> str | None:
    return computes_in(info, FLOATS | {"int8", "int32"})


@BACKEND.limit("power", "sum", "prod", "mean", "logsumexp", "cumsum", "outer")
def _floats_int32_64(info: OpInfo) -> str | None:
    return computes_in(info, FLOATS | I32_64)


@BACKEND.limit("maximum", "minimum", "clip")
def _min_max(info: OpInfo) -> str | None:
    return computes_in(info, FLOATS | BYTES | I32_64 | {"uint32", "uint64"})


@BACKEND.limit("matmul")
def _matmul(info: OpInfo) -> str | None:
    return computes_in(info, FLOATS | I32_64 | {"uint32", "uint64"})


@BACKEND.limit("where")
def _where(info: OpInfo) -> str | None:
    return computes_in(info, FLOATS | BYTES | I32_64 | {"uint32"})


@BACKEND.limit("max", "min")
def _max_min(info: OpInfo) -> str | None:
    return computes_in(info, FLOATS | BYTES | I32_64 | {"bool"})  # bools via int32


@BACKEND.limit("argmax", "argmin")
def _arg_max_min(info: OpInfo) -> str | None:
    return computes_in(info, FLOATS | BYTES | I32_64)


@BACKEND.limit("topk")
def _topk(info: OpInfo) -> str | None:
    return computes_in(info, SIGNED | {"uint8"})  # not floats: ONNX Runtime's TopK does not order NaN as the largest


@BACKEND.limit("trilu")
def _trilu(info: OpInfo) -> str | None:
    return computes_in(info, frozenset({"bool", "float32", "float64", "int32", "int64"}))


@BACKEND.limit("isinf", "isfinite")
def _isinf(info: OpInfo) -> str | None:
    return computes_in(info, FLOATS - {"float16"})  # IsInf: float32 and float64 kernels


# The kinds below also have attribute and shape cases ONNX Runtime refuses or computes differently from NumPy.
def _rank(t: Any) -> int:
    return len(t.shape) if t.shape is not None else -1


@BACKEND.limit("einsum")
def _einsum_limit(info: OpInfo) -> str | None:
    if why := computes_in(info, FLOATS | I32_64):
        return why
    subs = str(info.attrs["subscripts"]).replace(" ", "")
    ins = subs.split("->")[0].split(",")
    if any(c.isupper() for c in subs):
        return "ONNX Runtime's Einsum rejects upper-case subscripts"
    if any(not s for s in ins):
        return "ONNX Runtime's Einsum needs a subscript for every operand (no 0-d operands)"
    if "..." in subs:
        parts = {t.shape[:_rank(t) - len(s.replace("...", ""))] for s, t in zip(ins, info.in_types, strict=True)
                 if "..." in s and t.shape is not None}
        if len(parts) > 1:
            return "ONNX Runtime's Einsum does not broadcast the dimensions '...' stands for"
    return None


@BACKEND.limit("conv2d", "avg_pool2d", "avg_pool", "lp_pool")
def _pools(info: OpInfo) -> str | None:
    return computes_in(info, F32) or _pool_shapes(info)


@BACKEND.limit("max_pool", "max_pool2d")
def _max_pools(info: OpInfo) -> str | None:
    return computes_in(info, FLOATS | BYTES) or _pool_shapes(info)


def _pool_shapes(info: OpInfo) -> str | None:
    """Pools: batched input, padding smaller than the kernel, no dilation for average pools (opset 18, which
    the exporter writes without AveragePool's ``dilations`` when they are all 1 and refuses otherwise)."""
    kind, a = info.kind, info.attrs
    x = info.in_types[0]
    if kind.endswith("2d"):
        if _rank(x) != 4:
            return "ONNX Runtime's pools and convolutions need a batch axis (a 4-d input)"
        if kind == "conv2d":
            return None
        top, bottom, left, right = pad4(a["padding"])
        pads = [(top, bottom), (left, right)]
    else:
        pads = list(a.get("padding") or ())
    kernel = a.get("kernel_size") or ()
    for (lo, hi), k in zip(pads, kernel, strict=False):
        if max(lo, hi) >= k:
            return "ONNX Runtime's pools need padding smaller than the kernel"
    if kind == "avg_pool" and any(d != 1 for d in (a.get("dilation") or ())):
        return "ONNX's AveragePool has no dilations before opset 19 (the exporter writes opset 18)"
    return None


@BACKEND.limit("pad")
def _pad_limit(info: OpInfo) -> str | None:
    if why := computes_in(info, ALL - {"int16", "uint16"}):
        return why
    mode = info.attrs.get("mode", "constant")
    shape = info.in_types[0].shape
    if mode == "symmetric":
        return "ONNX's Pad has no 'symmetric' mode"
    if not shape:
        return "ONNX Runtime's Pad does not pad a 0-d value"
    if mode == "reflect":
        width = np.broadcast_to(np.asarray(info.attrs["pad_width"], dtype=np.int64).reshape(-1, 2), (len(shape), 2))
        for n, (lo, hi) in zip(shape, width.tolist(), strict=True):
            if (lo or hi) and (n is None or max(lo, hi) > n - 1):
                return "ONNX Runtime's Pad reflects once: each pad must be shorter than its axis"
    return None


@BACKEND.limit("split")
def _split_limit(info: OpInfo) -> str | None:
    if why := computes_in(info, ALL):
        return why
    shape = info.in_types[0].shape
    axis = int(info.attrs.get("axis", 0)) % max(len(shape or (0,)), 1)
    sizes = [t.shape[axis] for t in info.out_types]  # type: ignore[union-attr]
    if shape is None or None in sizes or sum(sizes) != shape[axis]:
        return "ONNX's Split needs pieces that partition the axis (sections out of order overlap)"
    return None


@BACKEND.limit("take")
def _take_limit(info: OpInfo) -> str | None:
    if why := computes_in(info, ALL):
        return why
    shape = info.in_types[0].shape
    if not shape:
        return "ONNX's Gather needs data of rank >= 1"
    axis = info.attrs.get("axis")
    if 0 in shape and (axis is None or shape[int(axis) % len(shape)] == 0):
        return "ONNX Runtime's Gather checks indices against an empty axis"
    return None


@BACKEND.limit("one_hot")
def _one_hot_limit(info: OpInfo) -> str | None:
    if why := computes_in(info, frozenset({"float32", "int64"})):  # OneHot's CPU kernels with int64 indices and depth
        return why
    if _rank(info.in_types[0]) < 1:
        return "ONNX's OneHot needs indices of rank >= 1"
    if int(info.attrs["depth"]) < 1:
        return "ONNX Runtime's OneHot needs depth >= 1"
    return None


@BACKEND.limit("scatter_elements", "scatter_nd")
def _scatter_limit(info: OpInfo) -> str | None:
    if why := computes_in(info, ALL):
        return why
    if info.in_dtypes[0] == np.bool_ and info.attrs.get("reduction", "none") not in ("none", None):
        return "ONNX Runtime's scatters reduce no bools"
    return None


@BACKEND.limit("lrn")
def _lrn_limit(info: OpInfo) -> str | None:
    if why := computes_in(info, F32):
        return why
    if int(info.attrs["size"]) % 2 == 0:
        return "ONNX Runtime's LRN needs an odd size"
    if _rank(info.in_types[0]) != 4:
        return "ONNX Runtime's LRN needs a 4-d input"
    return None


@BACKEND.limit("tensordot")
def _tensordot_limit(info: OpInfo) -> str | None:
    if why := computes_in(info, FLOATS | I32_64):
        return why
    if any(_rank(t) == 0 for t in info.in_types):
        return "ONNX Runtime's Einsum needs a subscript for every operand (no 0-d operands)"
    return None
