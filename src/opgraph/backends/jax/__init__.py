"""The jax backend: a graph as one ``jax.jit`` function of ``jax.numpy``/``lax`` calls (XLA).

Each op kind has a rule, registered on :data:`BACKEND` in this package's module named after the op's
family (``elementwise``, ``reduction``, ``control``, ...), making the ``jax.numpy`` call for one op from its
static facts; :func:`~opgraph.backends.base.straight_line` writes the graph as one Python function of
those calls, and ``jax.jit`` compiles it whole, so XLA fuses across ops. Results keep NumPy's dtypes: each
op's result is cast to its declared dtype where JAX's promotion differs
(at trace time, so it costs nothing per call). Constants are passed to the
jitted function as arguments, placed on the device once. Update-edge state
passed back in is donated, so XLA may write the new state over the old.

Control flow lowers to ``lax``: ``call`` inlines its body, ``cond`` is ``lax.cond``, ``while_loop``
``lax.while_loop`` (``max_trip`` adds a trip counter to the carry) and ``scan`` ``lax.scan``; each body is
translated by this same rule table (see :func:`~opgraph.backends.base.body_program`). Not claimed: a
``while_loop`` with stacked per-trip results (their length is known only at run time; jit results have static
shapes), a loop whose body changes a carry's type, a ``cond`` whose branches return different types.

Importing this package turns on ``jax_enable_x64`` (opgraph's float64 and
int64 must stay 64-bit), as PyTensor's JAX backend does.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> b.output(b.op("tanh", b.op("multiply", x, 2.0)))
    >>> f = opgraph.compile(b.freeze(), backend="jax")
    >>> f(x=np.array([0.0, 0.5, 1.0]))[0].round(4)
    array([0.    , 0.7616, 0.964 ])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from opgraph.backends.arrays import kind_of
from opgraph.backends.base import (
    Backend,
    BackendError,
    Executable,
    NumericsDifference,
    conform_args,
    input_dtypes,
    near_subnormal,
    straight_line,
)
from opgraph.core.graph import Graph
from opgraph.core.types import TensorType, ValueType

jax.config.update("jax_enable_x64", True)

DTYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                    "float32", "float64", "complex64", "complex128"})


def fix_result(result: Any, t: Any) -> Any:
    """At trace time: make the result the declared type (NumPy's dtype; a broadcast where JAX kept a scalar).

    >>> import jax.numpy as jnp
    >>> fix_result(jnp.float32(1), TensorType("float64", (2,)))
    Array([1., 1.], dtype=float64)
    """
    r = jnp.asarray(result)
    if isinstance(t, TensorType):
        if r.dtype != t.dtype:
            r = r.astype(t.dtype)
        if t.is_static and r.shape != t.shape:
            r = r.reshape(t.shape) if r.size == t.size else jnp.broadcast_to(r, t.shape)
    return r


def with_literal_splats(fn: Callable[..., Any], consts: list[np.ndarray]) -> tuple[Callable[..., Any], list[Any]]:
    """``fn(consts, *inputs)`` with its one-valued constants (scalars, and arrays of one repeated value) written
    into the program as literals; returns the new function, which takes the other constants, and those.

    XLA folds a literal (``2 * x``, the seed of a gradient broadcast to a vector) into the ops that read it;
    a constant passed at run time is a buffer it must read, and the fold is lost (an ``hvp`` ran 1.9x slower).

    >>> f, live = with_literal_splats(lambda c, x: c[0] * x + c[1], [np.full(3, 2.0), np.arange(3.0)])
    >>> [a.tolist() for a in live], f(live, np.ones(3)).tolist()
    ([[0.0, 1.0, 2.0]], [2.0, 3.0, 4.0])
    """
    splats: dict[int, tuple[tuple[int, ...], Any, np.dtype]] = {}
    for i, c in enumerate(consts):
        first = c.reshape(-1)[:1]
        if c.size and c.dtype != object and bool((c == first).all()):  # nan never equals itself: kept a buffer
            splats[i] = (c.shape, first[0], c.dtype)
    if not splats:
        return fn, consts
    live_at = [i for i in range(len(consts)) if i not in splats]

    def program(live: Sequence[Any], *inputs: Any) -> Any:
        full: list[Any] = [None] * len(consts)
        for k, i in enumerate(live_at):
            full[i] = live[k]
        for i, (dims, value, dtype) in splats.items():
            full[i] = jnp.full(dims, value, dtype=dtype)
        return fn(full, *inputs)

    return program, [consts[i] for i in live_at]


class _JaxExecutable(Executable):
    def __init__(self, fn: Callable[..., Any], consts: list[Any], device: Any, graph: Graph) -> None:
        self.fn = fn
        self.consts = consts
        self.device = device
        self.graph = graph
        self.dtypes = input_dtypes(graph)

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        # jit would trace a wrong dtype as it is (or its fixes wrap it): feeds follow opgraph's rule instead
        return list(self.fn(self.consts, *conform_args(self.graph, self.dtypes, args)))


class JaxBackend(Backend):
    """XLA through ``jax.jit`` (see the module doc)."""

    lowers_bodies = True

    def _device(self, device: str | None) -> Any:
        name = self.check_device(device)
        kind, _, index = name.partition(":")
        platform = "gpu" if kind in ("cuda", "gpu") else kind
        try:
            devs = jax.devices(platform)
        except RuntimeError:
            raise BackendError(f"jax reports no {kind} device here (jax.devices({platform!r}) failed)") from None
        return devs[int(index) if index else 0]

    def check_device(self, device: str | None) -> str:
        name = super().check_device(device)
        if name.split(":")[0] in ("cuda", "gpu"):
            try:
                jax.devices("gpu")
            except RuntimeError:
                raise BackendError("jax reports no GPU device here; install jax[cuda] on a machine with one, "
                                   "or use device='cpu'") from None
        return name

    def compile_graph(self, graph: Graph, *, device: str | None = None, donate: Sequence[int] = (),
                      **options: Any) -> Executable:
        """One ``jax.jit`` function for ``graph``; ``donate``d inputs may be overwritten by XLA."""
        if options:
            raise TypeError(f"the jax backend takes no option(s) {sorted(options)}")
        dev = self._device(device)
        fn, consts, _src = straight_line(graph, lambda info: self.rules[info.kind](info), fix=fix_result)
        fn, live = with_literal_splats(fn, consts)
        jitted = jax.jit(fn, donate_argnums=tuple(1 + i for i in donate))
        return _JaxExecutable(jitted, [jax.device_put(c, dev) for c in live], dev, graph)

    def from_numpy(self, array: np.ndarray, device: str | None = None) -> Any:
        return jax.device_put(array, self._device(device))

    def to_numpy(self, array: Any) -> np.ndarray:
        # a read-only view of the JAX buffer; the runtime copies what it hands to users or keeps as state
        return np.asarray(array)

    def adopt_feed(self, data: Any, t: ValueType, label: str) -> Any | None:
        """A jax array of the input's exact dtype and an accepted shape, taken as it is (no NumPy round trip);
        other arrays follow the NumPy feed rule (None).

        >>> x = jnp.ones(2, dtype=jnp.float64)
        >>> BACKEND.adopt_feed(x, TensorType("float64", (2,)), "%x") is x
        True
        """
        if not isinstance(data, jax.Array) or not isinstance(t, TensorType):
            return None
        if data.dtype != t.dtype or not t.accepts(data):
            return None
        return data

    def owns(self, device: str | None) -> Callable[[Any, np.dtype, tuple[int, ...]], bool] | None:
        """jax arrays of the dtype and shape, on ``device`` (checked only where jax has several devices).

        >>> import numpy as np
        >>> BACKEND.owns("cpu")(jnp.ones(2, dtype=jnp.float32), np.dtype("float32"), (2,))
        True
        """
        dev = self._device(device)
        array_type = type(jnp.zeros(()))
        if len(jax.devices()) == 1:
            return lambda a, dt, dims: type(a) is array_type and a.dtype == dt and a.shape == dims
        where = {dev}
        return lambda a, dt, dims: (type(a) is array_type and a.dtype == dt and a.shape == dims
                                     and a.devices() == where)

    def as_own(self, array: Any, device: str | None = None) -> Any:
        """A NumPy, jax or torch array as a jax array on ``device`` (None: where a jax array is, else jax's
        default device); torch tensors cross by DLPack.

        >>> import numpy as np
        >>> BACKEND.as_own(np.arange(3.0))
        Array([0., 1., 2.], dtype=float64)
        """
        if isinstance(array, jax.Array):
            out = array
        elif kind_of(array) == "torch":
            try:
                out = jax.dlpack.from_dlpack(array.detach().resolve_conj().resolve_neg().contiguous())
            except (RuntimeError, TypeError, ValueError, BufferError):  # a dtype or layout DLPack refuses
                out = jnp.asarray(array.detach().cpu().numpy())
        else:
            return jax.device_put(np.asarray(array), self._device(device) if device is not None else None)
        if device is not None and self._device(device) not in out.devices():
            out = jax.device_put(out, self._device(device))
        return out


FTZ = NumericsDifference(
    "ftz", "subnormal operands and results (and operands just above them, whose intermediates underflow)",
    "flushed to zero (XLA's CPU runtime sets FTZ/DAZ around every call; no XLA or JAX setting keeps subnormals: "
    "--xla_cpu_ftz=false drops only the compiler's attribute), so x * 5e-324 is 0, inf * 5e-324 NaN, log(-5e-324) "
    "-inf, 5e-324 > 0 False, and values whose intermediates underflow (prod, cumprod, asin, atan2) change",
    where=near_subnormal, exempt=frozenset({
        "shape", "negative", "positive", "abs", "copysign", "signbit", "isnan", "isinf", "isfinite", "real", "imag",
        "conj", "where"}))
"""XLA on CPU flushes subnormals to zero (openxla/xla#22858; jax-ml/jax#16200: working as intended)."""

BACKEND = JaxBackend("jax", dtypes=DTYPES, module="jax", extra="jax", devices=("cpu", "cuda", "gpu"),
                     doc="XLA through jax.jit (CPU build here; GPU with jax[cuda])", numerics=(FTZ,))

# The family modules register their rules on BACKEND as they are imported, so they come after it.
from opgraph.backends.jax import (  # noqa: E402,F401
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
