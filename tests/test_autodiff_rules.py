"""Every gradient rule against central finite differences (float64, small random inputs).

One parametrised test over the whole op table: an op with a rule must have a case here (or be in
ZERO, the zero-gradient ops), an op without a rule must be in NO_RULE with the reason.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.autodiff import build_grad_ops
from opgraph.autodiff.helpers import no_grad

S = (2, 3)


def pos(*shape: int) -> tuple[str, tuple[int, ...]]:
    return ("pos", shape)


def unit(*shape: int) -> tuple[str, tuple[int, ...]]:
    return ("unit", shape)


def gt1(*shape: int) -> tuple[str, tuple[int, ...]]:
    return ("gt1", shape)


def const(a: Any) -> tuple[str, Any]:
    return ("const", np.asarray(a))


def sym(b: Any, a: Any) -> Any:  # symmetrise a square matrix input inside the graph
    return b.multiply(b.add(a, b.permute_dims(a)), 0.5)


def spd(b: Any, a: Any) -> Any:  # a @ a.T + n I: symmetric positive definite
    n = a.type.shape[-1]
    return b.add(b.matmul(a, b.permute_dims(a)), np.eye(n) * n)


def C(*args: Any, pre: Any = None, **attrs: Any) -> dict[str, Any]:
    return {"args": args, "attrs": attrs, "pre": pre}


UNARY_DOMAIN = {
    "log": pos, "log1p": pos, "log2": pos, "log10": pos, "sqrt": pos, "reciprocal": pos, "asin": unit,
    "acos": unit, "atanh": unit, "acosh": gt1, "cbrt": pos,
}
CASES: dict[str, list[dict[str, Any]]] = {}
for _n in ("negative", "positive", "abs", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "square",
           "reciprocal", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
           "atanh", "sigmoid", "erf", "erfc", "exp2", "cbrt", "conj", "real", "imag"):
    dom = UNARY_DOMAIN.get(_n)
    CASES[_n] = [C(dom(*S) if dom else S)]
for _n in ("add", "subtract", "multiply", "maximum", "minimum", "fmax", "fmin", "atan2", "hypot", "logaddexp"):
    CASES[_n] = [C(S, S), C((2, 1), (3,))]
CASES["gelu"] = [C(S), C(S, approximate="tanh")]
CASES["silu"] = [C(S)]
CASES["hard_swish"] = [C(S)]
CASES["hard_sigmoid"] = [C(S), C(S, alpha=0.3, beta=0.4)]
CASES["layer_norm"] = [C((2, 3, 4)), C((2, 3, 4), (4,), (4,)), C((2, 3, 4), (3, 4), (1, 4), axis=1, epsilon=1e-3)]
CASES["divide"] = [C(S, pos(*S)), C((3,), pos(2, 1))]
CASES["power"] = [C(pos(*S), S), C(pos(2, 3), const(2.0))]
CASES["copysign"] = [C(S, const(np.array([1.0, -1.0, 2.0])))]
CASES["remainder"] = [C(pos(*S), const(np.array([0.7, 0.9, 1.3])))]
CASES["where"] = [C(const(np.array([True, False, True])), S, (2, 1))]
CASES["cast"] = [C(S, dtype="float32"), C(S, dtype="float64")]
CASES["clip"] = [C(S, const(-0.5), const(0.5)), C((3,), (3,), const(5.0))]
CASES["fmod"] = [C(S, const(np.array([0.7, -0.9, 1.3])))]
CASES.update({
    "gather_elements": [C((3, 4), const(np.array([[0, -1], [2, 2], [1, 0]])), axis=1),
                        C((3, 2), const(np.array([[2, 0], [-1, 2]])))],
    "scatter_elements": [C((2, 3), const(np.array([[1, -1, 0, 1], [2, 2, 0, -3]])), (2, 4), axis=1),
                         C((2, 3), const(np.array([[1, -1, 0, 1], [2, 2, 0, -3]])), (2, 4), axis=1, reduction="add")],
    "gather_nd": [C((3, 4), const(np.array([[0, 1], [2, -1], [0, 1]]))), C((3, 4), const(np.array([[1], [1]])))],
    "scatter_nd": [C((3, 4), const(np.array([[0, 1], [2, -1], [0, 1]])), (3,)),
                   C((3, 4), const(np.array([[2], [2]])), (2, 4), reduction="add")],
    "topk": [C(S, k=2), C((3, 4), k=2, axis=0, largest=False)],
    "sort": [C(S), C((3, 4), axis=0, descending=True)],
    "one_hot": [C(const(np.array([[0, 5, -1], [2, 1, 1]])), (2,), depth=3)],
    "trilu": [C((3, 4), k=1), C((2, 3, 3), upper=False)],
    "reverse_sequence": [C((4, 3, 2), const(np.array([4, 0, 2]))),
                         C((3, 4), const(np.array([1, 4, 3])), batch_axis=0, time_axis=1)],
})
CASES.update({
    "sum": [C(S), C(S, axis=1), C((2, 3, 2), axis=(0, 2), keepdims=True)],
    "mean": [C(S), C(S, axis=0, keepdims=True)],
    "prod": [C(pos(*S)), C(pos(*S), axis=1)],
    "max": [C(S), C(S, axis=1)], "min": [C(S), C(S, axis=0, keepdims=True)],
    "var": [C(S), C(S, axis=1, correction=1.0)], "std": [C(S), C(S, axis=0)],
    "logsumexp": [C(S), C(S, axis=1, keepdims=True)],
    "cumsum": [C(S), C(S, axis=1)], "cumprod": [C(pos(*S)), C(pos(*S), axis=0)],
    "matmul": [C((2, 3), (3, 2)), C((3,), (3, 2)), C((2, 3), (3,)), C((3,), (3,)), C((2, 2, 3), (3, 2)),
               C((1, 2, 3), (2, 3, 2))],
    "einsum": [C((2, 3), (3, 2), subscripts="ij,jk->ik"), C((2, 3), subscripts="ij->"),
               C((2, 3), (3,), subscripts="ij,k->ik"), C((2, 2, 3), (3, 2), subscripts="...ij,jk->...ik")],
    "tensordot": [C((2, 3, 2), (3, 2), axes=2), C((2, 3), (2, 3), axes=((0, 1), (0, 1)))],
    "vecdot": [C((2, 3), (3,)), C((3, 2), (3, 2), axis=0)],
    "outer": [C((3,), (2, 2))],
    "reshape": [C(S, shape=(3, 2)), C(S, shape=(-1,))],
    "permute_dims": [C((2, 3, 2), axes=(2, 0, 1)), C(S)],
    "broadcast_to": [C((3,), shape=(2, 3)), C((2, 1), shape=(2, 3))],
    "expand_dims": [C(S, axis=(0, 2))], "squeeze": [C((2, 1, 3))],
    "concat": [C(S, (1, 3)), C(S, (2, 2), axis=1), C(S, (3,), axis=None)],
    "stack": [C(S, S, axis=1), C(S)],
    "split": [C((6,), sections=3), C((2, 5), sections=(1, 3), axis=1)],
    "getitem": [C((4, 5), index=(slice(1, 3), 2)), C((5, 3), index=(slice(None, None, -2), None)),
                C((6, 3), index=(Ellipsis, slice(0, 3, 2))), C((4, 5), index=(1, slice(4, 0, -3)))],
    "take": [C((5,), const(np.array([0, 4, 4, -1]))), C((2, 4), const(np.array([[1, 0], [3, 3]])), axis=1)],
    "slice": [C((4, 5), const([3, 0]), const([-5, 5]), const([-2, 2])), C((6,), const([-100]), const([4]), axes=(0,))],
    "slice_update": [C((4, 5), (2, 1), const([3, 0]), const([-5, 5]), const([-2, 3]))],
    "arange": [C(pos(), const(4.0), pos())],
    "alloc": [C((3,), const(np.array([2, 3]))), C((2, 1), const(np.array([3, 2, 4])))],
    "reshape_to": [C((2, 3), const(np.array([3, -1])))],
    "assert_all": [C(S, const(True), const(np.array([1, 2])))],
    "pad": [C(S, pad_width=((1, 0), (2, 1)))],
    "flip": [C(S, axis=1), C(S)], "roll": [C(S, shift=1, axis=1), C(S, shift=2)],
    "tile": [C((2, 2), reps=(2, 1, 3))], "repeat": [C(S, repeats=2, axis=0), C(S, repeats=3)],
    "moveaxis": [C((2, 3, 2), source=(0,), destination=(2,))], "copy": [C(S)],
    "relu": [C(S)], "softmax": [C(S), C(S, axis=0)], "log_softmax": [C(S), C(S, axis=0)],
    "conv2d": [C((2, 2, 5, 5), (3, 2, 3, 3)), C((1, 2, 6, 5), (2, 2, 2, 3), stride=2, padding=1),
               C((1, 2, 6, 6), (2, 2, 3, 3), padding=(1, 0, 2, 1), dilation=2),
               C((1, 4, 5, 5), (4, 2, 3, 3), groups=2)],
    "max_pool2d": [C((1, 2, 4, 4), kernel_size=2), C((1, 1, 5, 5), kernel_size=3, stride=2, padding=1)],
    "avg_pool2d": [C((1, 2, 4, 4), kernel_size=2), C((1, 1, 5, 5), kernel_size=3, stride=2, padding=1),
                   C((1, 1, 5, 5), kernel_size=3, stride=2, padding=1, count_include_pad=False)],
    "eigh": [C((3, 3), pre=sym)], "eigvalsh": [C((3, 3), pre=sym)],
    "qr": [C((4, 3)), C((3, 3))], "svd": [C((4, 3)), C((3, 4))], "svdvals": [C((4, 3))],
    "cholesky": [C((3, 3), pre=spd), C((3, 3), pre=spd, upper=True)],
    "solve": [C(spd_in := (3, 3), (3, 2)), C((3, 3), (3,))],
    "inv": [C((3, 3), pre=spd)], "det": [C((3, 3))], "slogdet": [C((3, 3))],
    "pinv": [C((4, 3)), C((3, 4))],
    "conv": [C((2, 2, 5), (3, 2, 2), stride=(2,), padding=((1, 0),)),
             C((1, 4, 5, 4), (4, 2, 2, 3), stride=(2, 1), padding=((1, 2), (0, 1)), dilation=(1, 2), groups=2)],
    "conv_transpose": [C((1, 2, 3, 3), (2, 2, 2, 3), stride=(2, 2), padding=((1, 0), (0, 1)), output_padding=(1, 0))],
    "max_pool": [C((1, 2, 5, 5), kernel_size=(2, 2), stride=(2, 2), padding=((1, 0), (0, 1)), ceil_mode=True)],
    "avg_pool": [C((1, 2, 5, 5), kernel_size=(3, 2), stride=(2, 2), padding=((1, 1), (0, 1)), ceil_mode=True)],
    "lp_pool": [C((1, 2, 4, 4), p=3.0, kernel_size=(2, 2), stride=(2, 1))],
    "lrn": [C((1, 4, 2, 2), size=3, alpha=0.3, beta=0.7, bias=1.5)],
})
del spd_in


def to_complex(b: Any, a: Any) -> Any:  # complex input from the real one (the check perturbs its real part)
    return b.cast(a, dtype="complex128")


CASES.update({
    "fft": [C((3, 4), pre=to_complex), C((3, 4), pre=to_complex, axis=0, n=5, inverse=True, norm="ortho")],
    "rfft": [C((3, 4)), C((3, 5), axis=0, n=4, norm="forward"), C((2, 5), n=8)],
    "irfft": [C((3, 4), pre=to_complex), C((4, 3), pre=to_complex, axis=0, n=5, norm="ortho")],
})

ZERO = {name for name, op in ((o.name, o) for o in opgraph.all_ops()) if op.grad is no_grad}

NO_RULE: dict[str, str] = {
    "const": "constants have no inputs",
    "resize": "no gradient rule yet (interpolation weights per mode)",
    "grid_sample": "no gradient rule yet",
    "bitcast": "reinterpreting bits is not differentiable (the new dtype's values are no smooth function of x)",
    "eig": "no gradient rule yet (eigenvectors of a general matrix are defined up to a complex phase)",
}
# Whole families without rules, and why.
NO_RULE_FAMILIES: dict[str, str] = {
    "tenscalc": "TensCalc's function kinds are read and run, not differentiated (issue 6: no rules needed)",
    "fused": "fused ops are made by the optimiser after differentiation; differentiate the unfused graph",
    "user": "ops registered by users and tests (e.g. doctests) are not built-in",
    "control": "rules with bodies are checked in tests/test_control_autodiff.py (finite differences and jax.grad)",
}


def _relevant_ops() -> list[opgraph.OpDef]:
    return [o for o in opgraph.all_ops() if o.family not in NO_RULE_FAMILIES]


def test_every_op_is_accounted_for() -> None:
    for op in _relevant_ops():
        if op.grad is None:
            assert op.name in NO_RULE, f"op {op.name!r} has no gradient rule and no reason in NO_RULE"
        else:
            assert op.name in CASES or op.name in ZERO, f"op {op.name!r} has a gradient rule but no test case"
            assert op.name not in NO_RULE
    assert set(CASES) <= {o.name for o in _relevant_ops() if o.grad is not None}


def _make(b: opgraph.GraphBuilder, spec: Any, rng: np.random.Generator) -> tuple[Any, Any]:
    """Return (value, array fed or None for constants)."""
    if isinstance(spec, tuple) and spec and isinstance(spec[0], str):
        kind, arg = spec
        if kind == "const":
            return b.constant(arg), None
        lo, hi = {"pos": (0.5, 2.0), "unit": (-0.8, 0.8), "gt1": (1.5, 3.0)}[kind]
        arr = rng.uniform(lo, hi, arg)
    else:
        arr = rng.standard_normal(spec)
    return b.input(("float64", arr.shape)), arr


def _check(name: str, case: dict[str, Any], rng: np.random.Generator) -> None:
    b = opgraph.GraphBuilder()
    made = [_make(b, s, rng) for s in case["args"]]
    ins = [v for v, a in made]
    wrt = [(v, a) for v, a in made if a is not None]
    args = [case["pre"](b, v) if case["pre"] and a is not None else v for v, a in made]
    out = b.op(name, *args, **case["attrs"])
    outs = out if isinstance(out, tuple) else (out,)
    loss = None
    for o in outs:
        if o.dtype.kind not in "fc" or o.shape is None:  # complex outputs: the cast below keeps the real part
            continue
        shape = o.shape if None not in o.shape else b.run({v: a for v, a in wrt}, [o])[0].shape  # run-time dims
        w = b.constant(rng.standard_normal(shape))
        term = b.sum(b.multiply(b.cast(o, dtype="float64"), w))
        loss = term if loss is None else b.add(loss, term)
    assert loss is not None
    grads = build_grad_ops(b, loss, [v for v, _ in wrt])
    feeds = {v: a for v, a in wrt}
    got = b.run(feeds, grads)
    graph = b.freeze()

    f32 = case["attrs"].get("dtype") == "float32"
    tol, eps = (1e-3, 1e-3) if f32 else (1e-6, 1e-6)
    for k, (v, a) in enumerate(wrt):
        fd = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            for sgn in (1, -1):
                a2 = a.copy()
                a2[i] += sgn * eps
                f2 = {**feeds, v: a2}
                val = graph.run({kk.id: vv for kk, vv in f2.items()}, [loss.id])[0]
                fd[i] += sgn * float(val) / (2 * eps)
        assert got[k].shape == a.shape, (name, got[k].shape, a.shape)
        np.testing.assert_allclose(got[k], fd, rtol=tol * 100, atol=tol * 10,
                                   err_msg=f"{name} {case['attrs']} input {k}")
    del ins


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_matches_finite_differences(name: str) -> None:
    rng = np.random.default_rng(sum(map(ord, name)))
    for case in CASES[name]:
        _check(name, case, rng)


@pytest.mark.parametrize("name", sorted(n for n in ZERO if n in {"sign", "floor", "ceil", "trunc", "round",
                                                                     "floor_divide", "nextafter", "imag"}))
def test_zero_gradient_ops(name: str) -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)))
    args = (x,) if opgraph.get_op(name).arity == 1 else (x, b.constant(np.full(3, 0.7)))
    y = b.op(name, *args)
    loss = b.sum(b.add(b.cast(y, dtype="float64"), b.multiply(x, 0.0)))
    (g,) = build_grad_ops(b, loss, [x])
    np.testing.assert_array_equal(b.run({x: np.array([0.3, -1.2, 2.5])}, [g])[0], np.zeros(3))
