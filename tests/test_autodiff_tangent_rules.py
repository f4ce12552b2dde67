"""Every op kind's tangent (forward-mode) rule: against central finite differences and against its reverse rule.

The cases are tests/test_autodiff_rules.py's (every kind with a gradient rule). For each, on float64 random
inputs, random tangents ``v`` and random cotangents ``w``: the tangent ``J v`` (build_jvp_ops, and the lazy
``opgraph.jvp``) matches central differences of the op along ``v``, and ``<J v, w> = <v, J^T w>`` with
``J^T w`` from build_vjp_ops (so a tangent rule and its gradient rule describe one derivative). One builder
graph per case. Complex outputs are checked through their real and imaginary parts (both real ops).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.autodiff import build_vjp_ops
from opgraph.autodiff.forward import build_jvp_ops
from opgraph.frontend.lazy import apply, constant
from test_autodiff_rules import CASES, NO_RULE_FAMILIES, ZERO, _make


def _real_parts(b: Any, outs: Any) -> list[Any]:
    """The op's floating outputs as real values (a complex one as its real and imaginary parts)."""
    reals = []
    for o in outs:
        if o.dtype.kind == "c":
            reals += [b.cast(o, dtype="float64"), b.cast(b.multiply(o, b.constant(np.complex128(-1j))),
                                                              dtype="float64")]
        elif o.dtype.kind == "f":
            reals.append(o)
    return reals


class _Lazy:
    """An emitter of lazy ops with the builder's method names (for the cases' ``pre`` functions)."""

    def __getattr__(self, kind: str) -> Any:
        return lambda *a, **k: apply(kind, *a, **k)

    @staticmethod
    def constant(value: Any) -> Any:
        return constant(value)


def _check(name: str, case: dict[str, Any], rng: np.random.Generator) -> None:
    b = opgraph.GraphBuilder()
    made = [_make(b, s, rng) for s in case["args"]]
    wrt = [v for v, a in made if a is not None]
    xs = [a for v, a in made if a is not None]
    pre = case["pre"]
    args = [pre(b, v) if pre and a is not None else v for v, a in made]
    out = b.op(name, *args, **case["attrs"])
    reals = _real_parts(b, out if isinstance(out, tuple) else (out,))
    assert reals
    feeds = dict(zip(wrt, xs, strict=True))
    shapes = [r.shape if None not in r.shape else None for r in reals]
    if None in shapes:  # run-time dims
        shapes = [a.shape for a in b.run(feeds, reals)]
    vs = [rng.standard_normal(x.shape) for x in xs]
    ws = [rng.standard_normal(s) for s in shapes]
    jv = build_jvp_ops(b, reals, wrt, [b.constant(v) for v in vs])
    jtw = build_vjp_ops(b, reals, wrt, [b.constant(w) for w in ws])
    got = b.run(feeds, [*jv, *jtw])
    jv_got, jtw_got = got[:len(reals)], got[len(reals):]
    graph = b.freeze()

    f32 = case["attrs"].get("dtype") == "float32"
    tol, eps = (1e-3, 1e-3) if f32 else (1e-6, 1e-6)

    def at(step: float) -> list[np.ndarray]:
        f = {v.id: x + step * d for v, x, d in zip(wrt, xs, vs, strict=True)}
        return graph.run(f, [r.id for r in reals])

    fd = [(p - m) / (2 * eps) for p, m in zip(at(eps), at(-eps), strict=True)]
    what = f"{name} {case['attrs']}"
    for j, (t, d) in enumerate(zip(jv_got, fd, strict=True)):
        assert t.shape == d.shape, (what, j, t.shape, d.shape)
        np.testing.assert_allclose(t, d, rtol=tol * 100, atol=tol * 10, err_msg=f"{what}: tangent of output {j}")
    lhs = sum(float(np.vdot(t, w)) for t, w in zip(jv_got, ws, strict=True))
    rhs = sum(float(np.vdot(v, g)) for v, g in zip(vs, jtw_got, strict=True))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-5 if f32 else 1e-10, atol=1e-5 if f32 else 1e-10,
                               err_msg=f"{what}: <J v, w> != <v, J^T w>")

    _check_lazy(name, case, [a is not None for _, a in made], xs, vs, jv_got)


def _check_lazy(name: str, case: dict[str, Any], fed: list[bool], xs: list[np.ndarray], vs: list[np.ndarray],
                want: list[np.ndarray]) -> None:
    """The lazy-array level: ``opgraph.jvp`` of the same op gives the builder's tangents."""
    emit, pre = _Lazy(), case["pre"]

    def f(*ins: Any) -> Any:
        it = iter(ins)
        vals = []
        for spec, is_fed in zip(case["args"], fed, strict=True):
            if not is_fed:  # a constant argument: the case's array
                vals.append(spec[1])
            else:
                x = next(it)
                vals.append(pre(emit, x) if pre else x)
        o = apply(name, *vals, **case["attrs"])
        return tuple(_real_parts(emit, o if isinstance(o, tuple) else (o,)))

    _, got = opgraph.jvp(f, tuple(xs), tuple(vs))
    for j, (t, ref) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(np.asarray(t), ref, rtol=1e-10, atol=1e-12,
                                   err_msg=f"{name} {case['attrs']}: lazy jvp of output {j}")


@pytest.mark.filterwarnings("ignore:Casting complex values to real")  # the real part of complex outputs
@pytest.mark.parametrize("name", sorted(CASES))
def test_tangent_rule(name: str) -> None:
    rng = np.random.default_rng(sum(map(ord, name)) + 37)
    for case in CASES[name]:
        _check(name, case, rng)


@pytest.mark.parametrize("name", ["sign", "floor", "round", "floor_divide", "imag"])
def test_zero_tangent_ops(name: str) -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)))
    args = (x,) if opgraph.get_op(name).arity == 1 else (x, b.constant(np.full(3, 0.7)))
    y = b.cast(b.op(name, *args), dtype="float64")
    (t,) = build_jvp_ops(b, [y], [x], [np.array([1.0, -2.0, 3.0])])
    np.testing.assert_array_equal(b.run({x: np.array([0.3, -1.2, 2.5])}, [t])[0], np.zeros(3))


@pytest.mark.parametrize("part", ["real", "imag"])
def test_parts_of_a_complex_value(part: str) -> None:
    # the real and imaginary parts of (1 + 2j) x: tangents t and 2 t, and cotangents 1 and 2 in reverse mode
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)))
    z = b.multiply(b.cast(x, dtype="complex128"), b.constant(np.complex128(1 + 2j)))
    t = np.array([1.0, -2.0, 0.5])
    (got,) = b.run({x: np.zeros(3)}, build_jvp_ops(b, [b.op(part, z)], [x], [t]))
    np.testing.assert_allclose(got, getattr(np, part)((1 + 2j) * t))
    (g,) = build_vjp_ops(b, [b.sum(b.op(part, z))], [x])
    np.testing.assert_allclose(b.run({x: np.zeros(3)}, [g])[0], np.full(3, getattr(np, part)(1 + 2j)))


# Families whose tangents are checked elsewhere, and why.
ELSEWHERE = {**NO_RULE_FAMILIES,
             "control": "tangent rules with bodies (cond, scan, while_loop, ...) are checked with the control tests"}


def test_every_differentiable_kind_is_covered() -> None:
    for op in opgraph.all_ops():
        if op.family in ELSEWHERE or (op.grad is None and op.jvp is None):
            continue
        assert op.name in CASES or op.name in ZERO, f"op {op.name!r} can be differentiated but has no tangent case"


def _tangent_op_count(name: str, case: dict[str, Any]) -> int:
    """Ops (constants aside) of the tangent of the case's op, counting only those the tangent reads."""
    rng = np.random.default_rng(0)
    b = opgraph.GraphBuilder()
    made = [_make(b, s, rng) for s in case["args"]]
    wrt = [v for v, a in made if a is not None]
    pre = case["pre"]
    args = [pre(b, v) if pre and a is not None else v for v, a in made]
    out = b.op(name, *args, **case["attrs"])
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.dtype.kind in "fc"]
    first = b.num_ops
    tans = build_jvp_ops(b, outs, wrt, [b.constant(np.ones(v.shape)) for v in wrt])
    seen: set[int] = set()
    stack = [t.id for t in tans]
    while stack:
        op = b.producer_of(stack.pop())
        if op is None or op.id < first or op.id in seen:
            continue
        seen.add(op.id)
        stack.extend(b.op_inputs(op.id))
    return sum(1 for o in seen if b.kind_of(o) != "const")


# Kinds whose gradient rule cannot be transposed (it reads the stand-in's run-time shape, or drops a complex
# input's cotangent): their direct rule has nothing to be compared with.
UNTRANSPOSABLE = {"alloc", "arange", "reshape_to", "slice_update", "rfft"}


@pytest.mark.parametrize("name", sorted(n for n in CASES if opgraph.get_op(n).jvp is not None
                                        and n not in UNTRANSPOSABLE))
def test_direct_rule_costs_no_more_than_the_transposed_one(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    direct = [_tangent_op_count(name, case) for case in CASES[name]]
    monkeypatch.setattr(opgraph.get_op(name), "jvp", None)
    transposed = [_tangent_op_count(name, case) for case in CASES[name]]
    assert all(d <= t for d, t in zip(direct, transposed, strict=True)), (name, direct, transposed)
