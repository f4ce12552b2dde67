"""The torch backend: a graph as one straight-line function of PyTorch calls, optionally ``torch.compile``-d.

Every op kind the backend claims has a *rule* in ``BACKEND.rules``, registered
with ``@BACKEND.rule(kind)`` in the module of this package named after the
op's family (``elementwise.py``, ``reduction.py``, ...): called once
per op at compile time with the op's static facts (:class:`OpInfo`), it
returns the function computing that op on ``torch.Tensor`` values with
NumPy's semantics and result dtype (inputs are first cast to the dtypes NumPy's
loop computes in, reductions are given NumPy's accumulator dtype, and so on).
:func:`~opgraph.backends.base.straight_line` turns the graph into one Python
function of those calls; with ``compile=True`` (or a ``mode``) it is wrapped
in ``torch.compile(fn, mode=mode, dynamic=False)``.

Where torch's result dtype would still differ from the declared one, the
first call of each input-shape signature runs a checking variant that casts
such results and records their ops; the function is then generated again
with casts on exactly those ops, so later calls do no checks.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("int8", (3,)), name="x")
    >>> b.output(b.op("sum", x), b.op("sqrt", x))  # NumPy's dtypes: int64 and float16
    >>> f = opgraph.compile(b.freeze(), backend="torch")
    >>> f(x=np.array([100, 100, 100], np.int8))
    [array(300), array([10., 10., 10.], dtype=float16)]

The backend on its own: an executable takes and returns ``torch.Tensor`` values.

    >>> from opgraph import backends
    >>> tb = backends.get("torch")
    >>> exe = tb.compile_graph(b.freeze())
    >>> [tb.to_numpy(y) for y in exe([tb.from_numpy(np.array([1, 4, 9], np.int8))])]
    [array(14), array([1., 2., 3.], dtype=float16)]
    >>> tb.supports("matmul"), tb.supports("Vplus")
    (True, False)

Control flow runs as Python: ``cond`` an ``if`` on the predicate, ``while_loop`` a ``while``, ``scan`` a
``for`` writing into preallocated stacked tensors, over each body's generated function (the same rule table,
:func:`~opgraph.backends.base.body_program`); under ``torch.compile`` these ops run eagerly between the
compiled pieces (see docs/backends.md for why not ``torch.cond`` and friends).

torch has little arithmetic on uint16, uint32 and uint64: rules compute
them in int64 (by value for uint16 and uint32; uint64 as its bits, which is
exact modulo 2**64, and ordered through keys with the sign bit flipped);
these NumPy-semantics shims are in :mod:`opgraph.backends.torch.dtypes`.

Not claimed (see ``BACKEND.limits``, registered beside the rules): the
TensCalc kinds; uint64 division, right shifts, powers and the other
elementwise kinds that are not exact on its bits; integer ``reciprocal`` (NumPy's value at 0 depends on the
platform); complex ``erf``, ``erfc`` and ``power``; ``eigh`` and ``svd``
(the signs of eigenvectors and singular vectors depend on the LAPACK build).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from opgraph.backends.arrays import check_feed, kind_of
from opgraph.backends.base import (
    Backend,
    BackendError,
    Executable,
    NumericsDifference,
    OpInfo,
    extreme,
    has_dtype,
    input_dtypes,
    straight_line,
)
from opgraph.backends.torch.dtypes import DTYPES, NP_TO_TORCH, Fn, fix, td
from opgraph.core.feeds import coerce_feed
from opgraph.core.graph import Graph
from opgraph.core.registry import get_op
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import ExecutionError


class _TorchExecutable(Executable):
    """One graph as a straight-line torch function (see :class:`TorchBackend`)."""

    def __init__(self, graph: Graph, device: torch.device, compile: bool, mode: str | None) -> None:
        self.graph = graph
        self._inputs = list(zip(graph.inputs.tolist(), input_dtypes(graph), strict=True))
        self.device = device
        self._compile = compile
        self._mode = mode
        self._rules: dict[int, Fn] = {}
        self._needs_fix: set[int] = set()
        self._lock = threading.Lock()
        self._seen: set[tuple[Any, ...]] = set()
        checking, consts, self.source = straight_line(graph, self._checked_rule, release=True)
        self._checking = checking
        with torch.inference_mode():
            self._consts = [from_numpy(c, device) for c in consts]
        self._fast = self._generate()

    def _rule(self, info: OpInfo) -> Fn:
        fn = self._rules.get(info.op)
        if fn is None:
            fn = BACKEND.rules[info.kind](info)
            if self._compile and get_op(info.kind).family == "control":
                # a data-dependent branch or trip count: dynamo would break the graph there or unroll the loop
                # (torch 2.13's scan does not compile on CPU); the op runs eagerly between compiled pieces
                fn = torch._dynamo.disable(fn)
            self._rules[info.op] = fn
        return fn

    def _checked_rule(self, info: OpInfo) -> Fn:
        """The op's rule, casting results whose dtype is not the declared one and recording the op."""
        fn = self._rule(info)
        wants = [td(t.dtype) for t in info.out_types]  # type: ignore[union-attr]
        op, needs = info.op, self._needs_fix

        def checked(*args: Any) -> Any:
            res = fn(*args)
            if len(wants) == 1:
                if res.dtype != wants[0]:
                    needs.add(op)
                    res = res.to(wants[0])
                return res
            out = []
            for r, w in zip(res, wants, strict=True):
                if r.dtype != w:
                    needs.add(op)
                    r = r.to(w)
                out.append(r)
            return tuple(out)

        return checked

    def _generate(self) -> Fn:
        fn, _consts, self.source = straight_line(self.graph, self._rule, fix=fix, fix_ops=frozenset(self._needs_fix),
                                                 release=True)
        if self._compile:
            fn = torch.compile(fn, mode=self._mode, dynamic=False)
        return fn  # type: ignore[no-any-return]

    def _check_inputs(self, xs: Sequence[torch.Tensor]) -> None:
        """Each input against its declared type (once per shape signature)."""
        inputs = self.graph.inputs.tolist()
        if len(xs) != len(inputs):
            raise ExecutionError(f"the graph takes {len(inputs)} input(s), got {len(xs)}")
        for v, x in zip(inputs, xs, strict=True):
            t = self.graph.type_of(v)
            dims = t.shape  # type: ignore[union-attr]
            ok = x.dtype == td(t.dtype) and (dims is None or (  # type: ignore[union-attr]
                x.ndim == len(dims) and all(d is None or d == n for d, n in zip(dims, x.shape, strict=True))))
            if not ok:
                raise ExecutionError(f"input {self.graph.value_label(v)} expects {t}, got a tensor of dtype "
                                     f"{x.dtype} and shape {tuple(x.shape)}")

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        # a tensor must match exactly (checked below); NumPy and Python feeds follow opgraph's feed rule
        xs = [(a if a.device == self.device else a.to(self.device)) if isinstance(a, torch.Tensor)
              else from_numpy(a if has_dtype(a, dt) else coerce_feed(self.graph, v, a), self.device)
              for a, (v, dt) in zip(args, self._inputs, strict=False)]
        key = tuple((tuple(x.shape), x.dtype) for x in xs)
        with torch.inference_mode():
            if key not in self._seen:
                self._check_inputs(xs)
                with self._lock:
                    known = len(self._needs_fix)
                    out = self._checking(self._consts, *xs)
                    if len(self._needs_fix) != known:
                        self._fast = self._generate()
                    self._seen.add(key)
                return list(out)
            return list(self._fast(self._consts, *xs))


def from_numpy(a: np.ndarray, device: Any) -> torch.Tensor:
    """``a`` as a torch tensor on ``device`` (None: where torch puts it), sharing its memory where it can.

    >>> from_numpy(np.arange(3, dtype=np.int16)[::-1], "cpu")
    tensor([2, 1, 0], dtype=torch.int16)
    """
    a = np.asarray(a)
    if not (a.flags.writeable and a.dtype.isnative and a.flags.c_contiguous):
        a = np.array(a, dtype=a.dtype.newbyteorder("=") if not a.dtype.isnative else a.dtype, order="C", copy=True)
    t = torch.from_numpy(a)
    return t if device is None or torch.device(device) == t.device else t.to(device)


class TorchBackend(Backend):
    """PyTorch: the graph as one straight-line function of torch calls (see the module doc)."""

    lowers_bodies = True

    def check_device(self, device: str | None) -> str:
        dev = super().check_device(device)
        if dev.split(":")[0] == "cuda" and not torch.cuda.is_available():
            raise BackendError(f"backend {self.name!r} cannot run on {dev!r}: torch reports no CUDA device")
        return dev

    def compile_graph(self, graph: Graph, *, device: str | None = None, donate: Sequence[int] = (),
                      compile: bool = False, mode: str | None = None, threads: int | None = None,
                      **options: Any) -> Executable:
        """``graph`` as one torch function on ``device``; ``compile=True`` (or a ``mode``) wraps it in
        ``torch.compile(fn, mode=mode, dynamic=False)``; ``threads`` sets torch's (global) thread count.

        ``donate`` is accepted and ignored: every rule computes new tensors.
        """
        if options:
            raise TypeError(f"the torch backend takes no option(s) {sorted(options)}")
        dev = torch.device(self.check_device(device))
        if threads is not None:
            torch.set_num_threads(int(threads))
        return _TorchExecutable(graph, dev, compile or mode is not None, mode)

    def owns(self, device: str | None) -> Callable[[Any, np.dtype, tuple[int, ...]], bool] | None:
        """torch tensors of the dtype and shape on ``device`` that do not require grad.

        >>> import numpy as np
        >>> BACKEND.owns("cpu")(torch.ones(2), np.dtype("float32"), (2,))
        True
        """
        dev = torch.device(self.check_device(device))
        to_torch = NP_TO_TORCH.get
        return lambda a, dt, dims: (type(a) is torch.Tensor and a.dtype == to_torch(dt) and a.shape == dims
                                     and a.device == dev and not a.requires_grad)

    def from_numpy(self, array: np.ndarray, device: str | None = None) -> Any:
        return from_numpy(array, self.check_device(device))

    def to_numpy(self, array: Any) -> np.ndarray:
        if not isinstance(array, torch.Tensor):
            return np.asarray(array)
        return array.detach().cpu().resolve_conj().resolve_neg().numpy()  # type: ignore[no-any-return]

    def adopt_feed(self, data: Any, t: ValueType, label: str) -> Any | None:
        """A torch tensor of the input's exact dtype and an accepted shape, taken as it is (on its device: the
        executable moves it to the program's); other tensors follow the NumPy feed rule (None), and a tensor
        that requires grad is refused (:func:`~opgraph.backends.arrays.check_feed`).

        >>> import opgraph
        >>> x = torch.ones(2, dtype=torch.float64)
        >>> BACKEND.adopt_feed(x, TensorType("float64", (2,)), "%x") is x
        True
        """
        if not isinstance(data, torch.Tensor) or not isinstance(t, TensorType):
            return None
        check_feed(data, label)
        dims = t.shape
        if data.dtype != td(t.dtype) or (dims is not None and (data.ndim != len(dims) or any(
                d is not None and d != n for d, n in zip(dims, data.shape, strict=True)))):
            return None
        return data

    def as_own(self, array: Any, device: str | None = None) -> Any:
        """A NumPy, jax or torch array as a torch tensor on ``device`` (None: the CPU, or the tensor's own):
        NumPy memory is shared (copied first where NumPy marks it read-only), jax arrays cross by DLPack.

        >>> a = np.arange(3.0); t = BACKEND.as_own(a); t.data_ptr() == a.ctypes.data
        True
        """
        if isinstance(array, torch.Tensor):
            out = array
        elif isinstance(array, np.ndarray) or kind_of(array) != "jax":
            a = np.asarray(array)
            out = from_numpy(a if a.flags.writeable else np.array(a, copy=True), None)
        else:
            try:
                out = torch.from_dlpack(array)
            except (RuntimeError, TypeError, BufferError):  # a layout DLPack does not carry: through NumPy
                out = from_numpy(np.array(array, copy=True), None)
        if device is not None and torch.device(device) != out.device:
            out = out.to(device)
        return out


BACKEND = TorchBackend(
    "torch", dtypes=DTYPES, module="torch", extra="torch", devices=("cpu", "cuda"),
    doc="PyTorch: one straight-line function of torch calls per graph, optionally torch.compile-d (CPU or CUDA)",
    numerics=(NumericsDifference(
        "acc64", "float32 running products that leave the float32 range",
        "torch accumulates float32 cumprod in float64 on CPU, so a product that overflows (or underflows) on the way "
        "and comes back is finite (or nonzero) where NumPy's float32 steps give inf (or 0)",
        where=extreme, kinds=frozenset({"cumprod"}), dtypes=frozenset({"float32"})),))

# The family modules register their rules and limits on BACKEND, so they are imported once it exists.
from opgraph.backends.torch import (  # noqa: E402,F401
    contraction,
    control,
    elementwise,
    fused,
    indexing,
    linalg,
    nn,
    reduction,
    shape,
    signal,
)
from opgraph.backends.torch.elementwise import uint64_limit  # noqa: E402

# Every kind refuses what int64 cannot compute exactly for uint64 (a kind with a limit of its own checks that
# first); only kinds computed by a NumPy loop can fail it, but registering it for all keeps docs/backends.md's
# "some dtypes/attrs" note on every torch kind, as it has always been.
BACKEND.limit(*(kind for kind in BACKEND.rules if kind not in BACKEND.limits))(uint64_limit)
