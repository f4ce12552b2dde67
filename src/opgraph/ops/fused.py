"""Fused ops made by the optimiser (``opgraph.passes``): ids 1000-1099.

Each fused op computes exactly what the ops it replaces compute, in the same
order of floating-point operations, so a fused graph gives bit-identical
results to the unfused one (``fma`` rounds twice, like ``a * b + c``; it
saves the intermediate array, not a rounding).

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> a, x, c = (b.input(("float64", (3,))) for _ in range(3))
    >>> y = b.op("fma", a, x, c)
    >>> b.run({a: np.ones(3), x: np.arange(3.0), c: np.full(3, 2.0)}, [y])[0]
    array([2., 3., 4.])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.core import accel
from opgraph.core.registry import Attr, Emit, OpDef, attr_any, attr_bool, attr_float, mark_traits, register_op
from opgraph.core.types import TensorType, ValueType, broadcast_shapes
from opgraph.errors import OpTypeError
from opgraph.ops._common import const_like, tensor, ufunc_dtypes
from opgraph.ops.contraction import matmul_shape

FAMILY = "fused"


# ---------------------------------------------------------------- decompositions
# Each op's parts in more basic ops, registered with the op below (OpDef.decompose): lowering
# (opgraph.passes.lower) rewrites an op a backend lacks with them, and the ONNX exporter writes an op without an
# ONNX operator through them.
def _fma_parts(e: Emit, ins: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    a, b, c = ins
    return e.op("add", e.op("multiply", a, b), c)


def _matmul_t_parts(e: Emit, ins: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    a, b = ins

    def swap(v: Any) -> Any:
        rank = len(tensor(e.type_of(v)).shape)  # type: ignore[arg-type]
        return e.op("permute_dims", v, axes=(*range(rank - 2), rank - 1, rank - 2))

    return e.op("matmul", swap(a) if attrs["transpose_a"] else a, swap(b) if attrs["transpose_b"] else b)


def _fused_parts(e: Emit, ins: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    vals: list[Any] = []
    for kind, *refs in attrs["program"]:
        vals.append(e.op(kind, *[ins[-r - 1] if r < 0 else vals[r] for r in refs]))
    return vals[-1]


def _momentum_parts(e: Emit, ins: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    p, v, g = ins
    v2 = e.op("add", e.op("multiply", const_like(e, attrs["mu"], p), v), g)
    p2 = e.op("subtract", p, e.op("multiply", const_like(e, attrs["lr"], p), v2))
    return p2, v2


def _adagrad_parts(e: Emit, ins: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    p, acc, g = ins
    acc2 = e.op("add", acc, e.op("multiply", g, g))
    den = e.op("add", e.op("sqrt", acc2), const_like(e, attrs["eps"], p))
    p2 = e.op("subtract", p, e.op("divide", e.op("multiply", const_like(e, attrs["lr"], p), g), den))
    return p2, acc2


def _adam_parts(e: Emit, p: Any, m: Any, v: Any, g: Any, bc1: Any, bc2: Any, attrs: Mapping[str, Any]) -> Any:
    def sc(name: str) -> Any:
        return const_like(e, attrs[name], p)

    m2 = e.op("add", e.op("multiply", sc("b1"), m), e.op("multiply", sc("c1"), g))
    if attrs["square_first"]:
        sq = e.op("multiply", e.op("multiply", g, g), sc("c2"))
    else:
        sq = e.op("multiply", e.op("multiply", sc("c2"), g), g)
    v2 = e.op("add", e.op("multiply", sc("b2"), v), sq)
    den = e.op("add", e.op("sqrt", e.op("divide", v2, bc2)), sc("eps"))
    step = e.op("divide", e.op("multiply", sc("lr"), e.op("divide", m2, bc1)), den)
    return e.op("subtract", p, step), m2, v2


def _adam_update_parts(e: Emit, ins: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    p, m, v, g = ins
    return _adam_parts(e, p, m, v, g, const_like(e, attrs["bc1"], p), const_like(e, attrs["bc2"], p), attrs)


def _adam_update_t_parts(e: Emit, ins: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
    return _adam_parts(e, *ins, attrs)


# ---------------------------------------------------------------- fma 1000
def _fma_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, b, c = (tensor(t) for t in in_types)
    (m,) = ufunc_dtypes(np.multiply, [a.dtype, b.dtype])
    (dt,) = ufunc_dtypes(np.add, [m, c.dtype])
    return (TensorType(dt, broadcast_shapes(broadcast_shapes(a.shape, b.shape), c.shape)),)


def _fma_kernel(a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return np.add(np.multiply(a, b), c, out=out)  # type: ignore[no-any-return]


register_op(OpDef(
    name="fma", id=1000, arity=3, infer=_fma_infer, kernel=_fma_kernel,
    elementwise=True, inplace=(0, 1, 2), family=FAMILY,
    decompose=_fma_parts,
    doc="fma(a, b, c) = a * b + c with broadcasting, the product written into the result's buffer (two "
        "roundings, as unfused)",
))


# ---------------------------------------------------------------- matmul_t 1001
def _swap_last(shape: Any) -> Any:
    if shape is None:
        return None
    if len(shape) < 2:
        raise OpTypeError("a transposed matmul operand must have rank >= 2")
    return (*shape[:-2], shape[-1], shape[-2])


def _matmul_t_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, b = (tensor(t) for t in in_types)
    sa = _swap_last(a.shape) if attrs["transpose_a"] else a.shape
    sb = _swap_last(b.shape) if attrs["transpose_b"] else b.shape
    (dt,) = ufunc_dtypes(np.matmul, [a.dtype, b.dtype])
    return (TensorType(dt, matmul_shape(sa, sb)),)


def _matmul_t_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, *,
                     transpose_a: bool, transpose_b: bool) -> np.ndarray:
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    return np.asarray(np.matmul(a, b, out=out))


register_op(OpDef(
    name="matmul_t", id=1001, arity=2, infer=_matmul_t_infer, kernel=_matmul_t_kernel,
    attrs={"transpose_a": Attr(attr_bool, False, "use a with its last two axes swapped"),
           "transpose_b": Attr(attr_bool, False, "use b with its last two axes swapped")},
    family=FAMILY,
    decompose=_matmul_t_parts,
    doc="matmul_t(a, b, transpose_a, transpose_b): matmul of a and b, each optionally with its last two axes "
        "swapped (a transpose absorbed into the product; BLAS reads the transposed operand in place)",
))


# ---------------------------------------------------------------- optimiser updates 1010-1013
def _same_float_types(in_types: tuple[ValueType, ...], n_out: int) -> tuple[TensorType, ...]:
    ts = [tensor(t) for t in in_types]
    first = ts[0]
    if first.dtype.kind not in "fc":
        raise OpTypeError(f"optimiser updates need float tensors, got {first.dtype}")
    for t in ts[1:]:
        if t != first:
            raise OpTypeError(f"all operands must have the same type, got {first} and {t}")
    return (first,) * n_out


# The reference kernels compute each update as the unfused ops do (the same operations in the same order, the
# scalars in the arrays' dtype where the unfused graph has them so), into fresh arrays copied into ``out``, so a
# result may take over any operand's memory. The NumPy engine's kernels (opgraph.backends.numpy.fused) make one
# pass without allocating: a compiled loop with numba, else NumPy block by block.
_nb_usable: bool | None = None  # None: not looked for yet; False: missing, or the engine found it unusable


def update_numba_usable() -> bool:
    """True when the update kernels run compiled: numba is installed and ``opgraph.core.accel`` is enabled.

    Finding numba does not import it (the first update kernel call does, once: about 0.3 s, plus compiling or
    loading the cached loops). The optimiser fuses smaller updates when this holds (see
    :func:`update_fusion_pays`).

    >>> isinstance(update_numba_usable(), bool)
    True
    """
    global _nb_usable
    if not accel.enabled:
        return False
    if _nb_usable is None:
        import importlib.util

        _nb_usable = importlib.util.find_spec("numba") is not None
    return _nb_usable


def update_numba_failed() -> None:
    """Record that numba, though installed, cannot compile the update loops (it failed to import, or runs
    with ``NUMBA_DISABLE_JIT``): :func:`update_numba_usable` is False from now on. The engine that loads the
    loops calls it.

    >>> import opgraph.ops.fused as fused
    >>> saved = fused._nb_usable
    >>> update_numba_failed(); update_numba_usable()
    False
    >>> fused._nb_usable = saved   # the module's flag (a doctest's globals are a copy of the module's)
    """
    global _nb_usable
    _nb_usable = False


UPDATE_MIN = {"sgd_momentum_update": (0, 1 << 16), "adagrad_update": (0, 1 << 16),
              "adam_update": (0, 1 << 16), "adam_update_t": (0, 1 << 16)}
"""Per update kind, the parameter size (elements) from which the fused kernel is no slower than the unfused ops on
the NumPy engine: (with numba, without). The compiled loop is one call (about 0.7 us on small arrays, against
0.3-0.4 us per unfused NumPy call: 4 for momentum, 7 for Adagrad, 14 for Adam), and one pass over memory. The
NumPy path makes the unfused ops' calls plus its own (2-2.7x their time on arrays of 10-8192 elements) and gains
only where its cache-sized blocks save memory traffic."""


def update_fusion_pays(kind: str, size: int | None) -> bool:
    """True when fusing an update of ``kind`` on a parameter of ``size`` elements does not make the NumPy engine
    slower (:data:`UPDATE_MIN`, with or without numba: :func:`update_numba_usable`).

    >>> update_fusion_pays("adam_update", 1 << 24)
    True
    """
    with_nb, without = UPDATE_MIN[kind]
    return size is not None and size >= (with_nb if update_numba_usable() else without)


def _results(out: Any, *res: np.ndarray) -> tuple[np.ndarray, ...]:
    if out is None:
        return tuple(np.asarray(r) for r in res)  # NumPy gives scalars for 0-d operands
    for o, r in zip(out, res, strict=True):
        np.copyto(o, r)
    return tuple(out)


def _momentum_kernel(p: np.ndarray, v: np.ndarray, g: np.ndarray, out: Any = None, *,
                     lr: float, mu: float) -> tuple[np.ndarray, np.ndarray]:
    v2 = np.add(np.multiply(mu, v), g)
    return _results(out, np.subtract(p, np.multiply(lr, v2)), v2)  # type: ignore[return-value]


register_op(OpDef(
    name="sgd_momentum_update", id=1010, arity=3, infer=lambda ts, a: _same_float_types(ts, 2),
    attrs={"lr": Attr(attr_float, doc="learning rate"), "mu": Attr(attr_float, doc="momentum")},
    kernel=_momentum_kernel, inplace=(0, 1, 2), family=FAMILY,
    decompose=_momentum_parts,
    doc="sgd_momentum_update(p, v, g; lr, mu) -> (p - lr * v', v') with v' = mu * v + g",
))


def _adagrad_kernel(p: np.ndarray, acc: np.ndarray, g: np.ndarray, out: Any = None, *,
                    lr: float, eps: float) -> tuple[np.ndarray, np.ndarray]:
    klr, keps = np.array((lr, eps), p.dtype)  # the scalars in the arrays' dtype, as the unfused graph has them
    a2 = np.add(acc, np.multiply(g, g))
    step = np.divide(np.multiply(klr, g), np.add(np.sqrt(a2), keps))
    return _results(out, np.subtract(p, step), a2)  # type: ignore[return-value]


register_op(OpDef(
    name="adagrad_update", id=1011, arity=3, infer=lambda ts, a: _same_float_types(ts, 2),
    attrs={"lr": Attr(attr_float, doc="learning rate"), "eps": Attr(attr_float, doc="added to the root")},
    kernel=_adagrad_kernel, inplace=(0, 1, 2), family=FAMILY,
    decompose=_adagrad_parts,
    doc="adagrad_update(p, acc, g; lr, eps) -> (p - lr * g / (sqrt(acc') + eps), acc') with acc' = acc + g * g",
))


def _adam_core(p: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, bc1: np.ndarray, bc2: np.ndarray,
               out: Any, lr: float, b1: float, c1: float, b2: float, c2: float, eps: float,
               square_first: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    klr, kb1, kc1, kb2, kc2, keps = np.array((lr, b1, c1, b2, c2, eps), p.dtype)
    bc1, bc2 = bc1.reshape(()), bc2.reshape(())
    m2 = np.add(np.multiply(kb1, m), np.multiply(kc1, g))
    sq = np.multiply(np.multiply(g, g), kc2) if square_first else np.multiply(np.multiply(kc2, g), g)
    v2 = np.add(np.multiply(kb2, v), sq)
    den = np.add(np.sqrt(np.divide(v2, bc2)), keps)
    step = np.divide(np.multiply(klr, np.divide(m2, bc1)), den)
    return _results(out, np.subtract(p, step), m2, v2)  # type: ignore[return-value]


def _adam_kernel(p: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, out: Any = None, *,
                 lr: float, b1: float, c1: float, b2: float, c2: float, bc1: float, bc2: float,
                 eps: float, square_first: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bc = np.array((bc1, bc2), p.dtype)
    return _adam_core(p, m, v, g, bc[0:1], bc[1:2], out, lr, b1, c1, b2, c2, eps, square_first)


def _adam_t_kernel(p: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, bc1: np.ndarray, bc2: np.ndarray,
                   out: Any = None, *, lr: float, b1: float, c1: float, b2: float, c2: float,
                   eps: float, square_first: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _adam_core(p, m, v, g, np.asarray(bc1), np.asarray(bc2), out, lr, b1, c1, b2, c2, eps, square_first)


_F = attr_float
_ADAM_ATTRS = {
    "lr": Attr(_F, doc="learning rate"), "b1": Attr(_F, doc="beta1"), "c1": Attr(_F, doc="the constant 1 - beta1"),
    "b2": Attr(_F, doc="beta2"), "c2": Attr(_F, doc="the constant 1 - beta2"), "eps": Attr(_F, doc="added to the root"),
    "square_first": Attr(attr_bool, False, "v' adds (g * g) * c2 rather than (c2 * g) * g"),
}
# inplace=(3, 0, 1, 2): a result may take over the gradient's buffer, or p', m', v' those of p, m, v (the kernels read
# every operand's element or block before writing the results'; opgraph.jit's donated arguments on numpy)
# before writing the results'), so the fused step plans no more memory than the unfused ops
register_op(OpDef(
    name="adam_update", id=1012, arity=4, infer=lambda ts, a: _same_float_types(ts, 3),
    attrs={**_ADAM_ATTRS, "bc1": Attr(_F, doc="bias correction 1 - beta1^t"),
           "bc2": Attr(_F, doc="bias correction 1 - beta2^t")},
    kernel=_adam_kernel, inplace=(3, 0, 1, 2), family=FAMILY,
    decompose=_adam_update_parts,
    doc="adam_update(p, m, v, g; lr, b1, c1, b2, c2, bc1, bc2, eps, square_first) -> (p', m', v') with "
        "m' = b1 * m + c1 * g, v' = b2 * v + c2 * g * g, p' = p - lr * (m' / bc1) / (sqrt(v' / bc2) + eps)",
))


def _adam_t_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    outs = _same_float_types(in_types[:4], 3)
    for t in in_types[4:]:
        t = tensor(t)
        if t.dtype != outs[0].dtype or t.shape != ():
            raise OpTypeError(f"bias corrections must be scalars of dtype {outs[0].dtype}, got {t}")
    return outs


register_op(OpDef(
    name="adam_update_t", id=1013, arity=6, infer=_adam_t_infer, attrs=dict(_ADAM_ATTRS),
    kernel=_adam_t_kernel, inplace=(3, 0, 1, 2), family=FAMILY,
    decompose=_adam_update_t_parts,
    doc="adam_update_t(p, m, v, g, bc1, bc2; lr, b1, c1, b2, c2, eps, square_first): adam_update with the bias "
        "corrections 1 - beta^t as scalar inputs (a step count t that lives in the graph)",
))


# ---------------------------------------------------------------- fused_elementwise 1002
def _program(v: Any) -> tuple[tuple[Any, ...], ...]:
    steps = attr_any(v)
    if not isinstance(steps, tuple) or not steps:
        raise OpTypeError("program must be a non-empty sequence of steps (kind, arg, ...)")
    for i, step in enumerate(steps):
        if not (isinstance(step, tuple) and step and isinstance(step[0], str)
                and all(isinstance(a, int) and not isinstance(a, bool) and a < i for a in step[1:])):
            raise OpTypeError(f"step {i} {step!r} must be (kind, refs...): ref -k-1 is operand k, "
                              f"ref j >= 0 an earlier step")
    return steps  # type: ignore[no-any-return]


def fusable(kind: str) -> bool:
    """True for the op kinds a ``fused_elementwise`` program may use: elementwise, one output, no attributes.

    >>> fusable("add"), fusable("cast"), fusable("sum")
    (True, False, False)
    """
    from opgraph.core.registry import get_op

    try:
        d = get_op(kind)
    except KeyError:
        return False
    return d.elementwise and not d.attrs and "no_fuse" not in d.traits


def step_types(program: tuple[tuple[Any, ...], ...], in_types: tuple[ValueType, ...]) -> list[TensorType]:
    """The type of each step of a ``fused_elementwise`` program on operands of ``in_types`` (a step refers to
    operand ``k`` as ``-k - 1`` and to an earlier step by its index); raises OpTypeError naming a bad step.

    >>> [str(t) for t in step_types((("exp", -1), ("add", 0, -2)), (TensorType("f4", (2,)), TensorType("f8", ())))]
    ['f32[2]', 'f64[2]']
    """
    from opgraph.core.registry import resolve

    out: list[TensorType] = []
    for i, (kind, *refs) in enumerate(program):
        if not fusable(kind):
            raise OpTypeError(f"step {i}: {kind!r} cannot be fused (not an attribute-free elementwise op)")
        args = []
        for r in refs:
            if r < 0 and -r - 1 >= len(in_types):
                raise OpTypeError(f"step {i} refers to operand {-r - 1}, but there are {len(in_types)}")
            args.append(in_types[-r - 1] if r < 0 else out[r])
        try:
            res = resolve(kind, args, {})
        except Exception as exc:
            raise OpTypeError(f"step {i} ({kind}): {exc}") from None
        out.append(res.out_types[0])  # type: ignore[arg-type]
    return out


def _fused_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    return (step_types(attrs["program"], tuple(tensor(t) for t in in_types))[-1],)


_INPLACE_POSITIONS = tuple(range(8))


def overlap(out: np.ndarray, xs: tuple[np.ndarray, ...]) -> int:
    """0: ``out`` shares no memory with an operand; 1: only as the very same elements; 2: otherwise.

    ``out`` taking over an operand's buffer (the planner's in-place choice) is safe: each block of
    the operand is read before the same block of ``out`` is written.

    >>> x = np.zeros(4)
    >>> overlap(np.zeros(4), (x,)), overlap(x, (x,)), overlap(x[1:], (x[:3],))
    (0, 1, 2)
    """
    ptr = out.__array_interface__["data"][0]
    found = 0
    for x in xs:
        if x.ndim and np.may_share_memory(out, x):
            if not (x.shape == out.shape and x.strides == out.strides and x.__array_interface__["data"][0] == ptr):
                return 2
            found = 1
    return found


def _fused_kernel(*xs: np.ndarray, out: np.ndarray | None = None, program: tuple[tuple[Any, ...], ...],
                  approx: bool = False) -> Any:
    # The reference: each step's reference kernel over whole arrays, in order (approx allows no more than this).
    from opgraph.core.registry import get_op

    ops = [np.asarray(x) for x in xs]
    vals: list[np.ndarray] = []
    for kind, *refs in program:
        vals.append(np.asarray(get_op(kind).kernel_for(0)(*[ops[-r - 1] if r < 0 else vals[r] for r in refs])))
    if out is None:
        return vals[-1]
    np.copyto(out, vals[-1], casting="unsafe")
    return out


register_op(OpDef(
    name="fused_elementwise", id=1002, arity=None, min_inputs=1, infer=_fused_infer,
    attrs={"program": Attr(_program, doc="steps (kind, refs...): ref -k-1 is operand k, ref j >= 0 is step j; "
                                         "the last step is the result"),
           "approx": Attr(attr_bool, False, "results may differ from the unfused ops' by a few ulp (set by "
                                            "optimize(..., fast_math=True)): float32 programs then run compiled")},
    kernel=_fused_kernel, elementwise=True, inplace=_INPLACE_POSITIONS, family=FAMILY,
    decompose=_fused_parts,
    doc="fused_elementwise(*xs, program, approx): a chain of elementwise ops run as one kernel; each step calls the "
        "same NumPy kernel as the unfused op (bit-identical results); large results are computed block by block in "
        "cache-sized scratch buffers, small ones whole, each step writing into the buffer of an intermediate it "
        "consumes last. With approx=True and numba installed, a large float32 program of the kinds in "
        "opgraph.backends.numpy.fused._NB_EXPR runs as one compiled loop instead: exp, log, sin, cos, tanh by "
        "polynomial approximations within APPROX_ULP (3-5 ulp) of NumPy's per step, the other kinds rounded "
        "exactly as NumPy",
))


# ---------------------------------------------------------------- traits (see OpDef)
mark_traits("promotes", "fma")
