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

from typing import Any

import numpy as np

from opgraph.core.registry import Attr, OpDef, attr_any, attr_bool, attr_float, register_op
from opgraph.core.types import TensorType, ValueType, broadcast_shapes
from opgraph.errors import OpTypeError
from opgraph.ops._common import tensor, ufunc_dtypes
from opgraph.ops.contraction import matmul_shape

FAMILY = "fused"


# ---------------------------------------------------------------- fma 1000
def _fma_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, b, c = (tensor(t) for t in in_types)
    (m,) = ufunc_dtypes(np.multiply, [a.dtype, b.dtype])
    (dt,) = ufunc_dtypes(np.add, [m, c.dtype])
    return (TensorType(dt, broadcast_shapes(broadcast_shapes(a.shape, b.shape), c.shape)),)


def _fma_kernel(a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    prod = np.multiply(a, b)
    if out is None:
        if prod.shape == np.broadcast_shapes(prod.shape, np.shape(c)) and prod.dtype == np.result_type(prod, c):
            return np.add(prod, c, out=prod)  # reuse the product's buffer
        return np.add(prod, c)
    return np.add(prod, c, out=out)


register_op(OpDef(
    name="fma", id=1000, arity=3, infer=_fma_infer, kernels={"numpy": _fma_kernel},
    elementwise=True, inplace=(2,), family=FAMILY,
    doc="fma(a, b, c) = a * b + c with broadcasting, without keeping a * b (two roundings, as unfused)",
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
    name="matmul_t", id=1001, arity=2, infer=_matmul_t_infer, kernels={"numpy": _matmul_t_kernel},
    attrs={"transpose_a": Attr(attr_bool, False, "use a with its last two axes swapped"),
           "transpose_b": Attr(attr_bool, False, "use b with its last two axes swapped")},
    family=FAMILY,
    doc="matmul_t(a, b, transpose_a, transpose_b): matmul of a and b, each optionally with its last two axes "
        "swapped (a transpose absorbed into the product; BLAS reads the transposed operand in place)",
))


# ---------------------------------------------------------------- optimiser updates 1010-1012
def _same_float_types(in_types: tuple[ValueType, ...], n_out: int) -> tuple[TensorType, ...]:
    ts = [tensor(t) for t in in_types]
    first = ts[0]
    if first.dtype.kind not in "fc":
        raise OpTypeError(f"optimiser updates need float tensors, got {first.dtype}")
    for t in ts[1:]:
        if t != first:
            raise OpTypeError(f"all operands must have the same type, got {first} and {t}")
    return (first,) * n_out


def _scalar(x: float, dtype: np.dtype) -> np.ndarray:
    return np.asarray(x, dtype=dtype)


def _momentum_kernel(p: np.ndarray, v: np.ndarray, g: np.ndarray, out: Any = None, *,
                     lr: float, mu: float) -> tuple[np.ndarray, np.ndarray]:
    dt = p.dtype
    v2 = np.add(np.multiply(_scalar(mu, dt), v), g, out=None if out is None else out[1])
    p2 = np.subtract(p, np.multiply(_scalar(lr, dt), v2), out=None if out is None else out[0])
    return p2, v2


register_op(OpDef(
    name="sgd_momentum_update", id=1010, arity=3, infer=lambda ts, a: _same_float_types(ts, 2),
    attrs={"lr": Attr(attr_float, doc="learning rate"), "mu": Attr(attr_float, doc="momentum")},
    kernels={"numpy": _momentum_kernel}, family=FAMILY,
    doc="sgd_momentum_update(p, v, g; lr, mu) -> (p - lr * v', v') with v' = mu * v + g",
))


def _adagrad_kernel(p: np.ndarray, acc: np.ndarray, g: np.ndarray, out: Any = None, *,
                    lr: float, eps: float) -> tuple[np.ndarray, np.ndarray]:
    dt = p.dtype
    acc2 = np.add(acc, np.multiply(g, g), out=None if out is None else out[1])
    den = np.sqrt(acc2)
    np.add(den, _scalar(eps, dt), out=den)
    step = np.multiply(_scalar(lr, dt), g)
    np.divide(step, den, out=step)
    p2 = np.subtract(p, step, out=None if out is None else out[0])
    return p2, acc2


register_op(OpDef(
    name="adagrad_update", id=1011, arity=3, infer=lambda ts, a: _same_float_types(ts, 2),
    attrs={"lr": Attr(attr_float, doc="learning rate"), "eps": Attr(attr_float, doc="added to the root")},
    kernels={"numpy": _adagrad_kernel}, family=FAMILY,
    doc="adagrad_update(p, acc, g; lr, eps) -> (p - lr * g / (sqrt(acc') + eps), acc') with acc' = acc + g * g",
))


def _adam_core(p: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, bc1: Any, bc2: Any, out: Any,
               lr: float, b1: float, c1: float, b2: float, c2: float, eps: float,
               square_first: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dt = p.dtype
    o = (None, None, None) if out is None else out
    m2 = np.multiply(_scalar(b1, dt), m, out=o[1])
    tmp = np.multiply(_scalar(c1, dt), g)
    np.add(m2, tmp, out=m2)
    v2 = np.multiply(_scalar(b2, dt), v, out=o[2])
    if square_first:  # v' = b2 * v + (g * g) * c2
        np.multiply(g, g, out=tmp)
        np.multiply(tmp, _scalar(c2, dt), out=tmp)
    else:             # v' = b2 * v + (c2 * g) * g
        np.multiply(_scalar(c2, dt), g, out=tmp)
        np.multiply(tmp, g, out=tmp)
    np.add(v2, tmp, out=v2)
    den = np.divide(v2, bc2)
    np.sqrt(den, out=den)
    np.add(den, _scalar(eps, dt), out=den)
    np.divide(m2, bc1, out=tmp)
    np.multiply(_scalar(lr, dt), tmp, out=tmp)
    np.divide(tmp, den, out=tmp)
    p2 = np.subtract(p, tmp, out=o[0])
    return p2, m2, v2


def _adam_kernel(p: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, out: Any = None, *,
                 lr: float, b1: float, c1: float, b2: float, c2: float, bc1: float, bc2: float,
                 eps: float, square_first: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dt = p.dtype
    return _adam_core(p, m, v, g, _scalar(bc1, dt), _scalar(bc2, dt), out, lr, b1, c1, b2, c2, eps, square_first)


def _adam_t_kernel(p: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, bc1: np.ndarray, bc2: np.ndarray,
                   out: Any = None, *, lr: float, b1: float, c1: float, b2: float, c2: float,
                   eps: float, square_first: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _adam_core(p, m, v, g, bc1, bc2, out, lr, b1, c1, b2, c2, eps, square_first)


_F = attr_float
_ADAM_ATTRS = {
    "lr": Attr(_F, doc="learning rate"), "b1": Attr(_F, doc="beta1"), "c1": Attr(_F, doc="the constant 1 - beta1"),
    "b2": Attr(_F, doc="beta2"), "c2": Attr(_F, doc="the constant 1 - beta2"), "eps": Attr(_F, doc="added to the root"),
    "square_first": Attr(attr_bool, False, "v' adds (g * g) * c2 rather than (c2 * g) * g"),
}
register_op(OpDef(
    name="adam_update", id=1012, arity=4, infer=lambda ts, a: _same_float_types(ts, 3),
    attrs={**_ADAM_ATTRS, "bc1": Attr(_F, doc="bias correction 1 - beta1^t"),
           "bc2": Attr(_F, doc="bias correction 1 - beta2^t")},
    kernels={"numpy": _adam_kernel}, family=FAMILY,
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
    kernels={"numpy": _adam_t_kernel}, family=FAMILY,
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
    return d.elementwise and not d.attrs and d.name not in ("fused_elementwise", "where", "clip", "real", "imag")


def _step_types(program: tuple[tuple[Any, ...], ...], in_types: tuple[ValueType, ...]) -> list[TensorType]:
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
    return (_step_types(attrs["program"], tuple(tensor(t) for t in in_types))[-1],)


_PLANS: dict[Any, list[tuple[Any, tuple[int, ...], int]]] = {}


def _plan(program: tuple[tuple[Any, ...], ...], xs: tuple[np.ndarray, ...]) -> list[tuple[Any, tuple[int, ...], int]]:
    """Per step: kernel, refs, and the earlier step whose buffer it may overwrite (-1: a new one)."""
    key = (program, tuple((x.dtype.str, x.shape) for x in xs))
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    from opgraph.core.registry import get_op

    types = _step_types(program, tuple(TensorType.of(x) for x in xs))
    last_use = {}
    for i, (_, *refs) in enumerate(program):
        for r in refs:
            if r >= 0:
                last_use[r] = i
    plan = []
    for i, (kind, *refs) in enumerate(program):
        reuse = -1
        for r in refs:  # an intermediate used for the last time here, of this step's exact type, is scratch
            if r >= 0 and last_use[r] == i and types[r] == types[i] and refs.count(r) == 1:
                reuse = r
                break
        plan.append((get_op(kind).kernel_for("numpy", 0), tuple(refs), reuse))
    if len(_PLANS) > 1024:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def _fused_kernel(*xs: np.ndarray, out: np.ndarray | None = None, program: tuple[tuple[Any, ...], ...]) -> Any:
    xs = tuple(np.asarray(x) for x in xs)
    plan = _plan(program, xs)
    vals: list[Any] = []
    n = len(plan)
    for i, (fn, refs, reuse) in enumerate(plan):
        args = [xs[-r - 1] if r < 0 else vals[r] for r in refs]
        if i == n - 1 and out is not None:
            target = out
        elif reuse >= 0 and isinstance(vals[reuse], np.ndarray) and vals[reuse].flags.writeable:
            target = vals[reuse]
        else:
            target = None
        vals.append(np.asarray(fn(*args, out=target)))
    return vals[-1]


register_op(OpDef(
    name="fused_elementwise", id=1002, arity=None, min_inputs=1, infer=_fused_infer,
    attrs={"program": Attr(_program, doc="steps (kind, refs...): ref -k-1 is operand k, ref j >= 0 is step j; "
                                         "the last step is the result")},
    kernels={"numpy": _fused_kernel}, elementwise=True, family=FAMILY,
    doc="fused_elementwise(*xs, program): a chain of elementwise ops run as one kernel; each step calls the same "
        "NumPy kernel as the unfused op, writing into the buffer of an intermediate it consumes last",
))
