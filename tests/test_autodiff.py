"""Autodiff API: builder, lazy arrays, function transforms, VJPs, higher order, errors, PyTorch models."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import opgraph
import opgraph.nn as onn
import opgraph.numpy as onp
from opgraph.autodiff import NoGradientError, build_grad_ops, build_vjp_ops, grad, lazy_vjp, value_and_grad, vjp


def fd_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:  # type: ignore[no-untyped-def]
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (float(f(xp)) - float(f(xm))) / (2 * eps)
    return g


def test_builder_grad_is_ordinary_ops_and_saves(tmp_path) -> None:  # type: ignore[no-untyped-def]
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    w = b.input(("float64", (3,)), name="w")
    loss = b.sum(b.multiply(b.tanh(b.multiply(x, w)), x))
    gx, gw = build_grad_ops(b, loss, [x, w])
    b.output(loss, gx, gw)
    g = b.freeze()
    g.verify()
    from opgraph.io import load, save

    save(g, tmp_path / "g.json")
    assert load(tmp_path / "g.json") == g
    xv, wv = np.array([0.1, -0.4, 2.0]), np.array([1.0, 0.5, -0.3])
    _, gxv, gwv = g.run({"x": xv, "w": wv})
    np.testing.assert_allclose(gxv, fd_grad(lambda a: np.sum(np.tanh(a * wv) * a), xv), rtol=1e-6)
    np.testing.assert_allclose(gwv, fd_grad(lambda a: np.sum(np.tanh(xv * a) * xv), wv), rtol=1e-6)


def test_broadcasting_is_undone() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3)))
    r = b.input(("float64", (1, 3)))
    c = b.input(("float64", ()))
    loss = b.sum(b.multiply(b.add(x, r), c))
    gx, gr, gc = build_grad_ops(b, loss, [x, r, c])
    assert (gx.type.shape, gr.type.shape, gc.type.shape) == ((2, 3), (1, 3), ())
    xv = np.arange(6.0).reshape(2, 3)
    out = b.run({x: xv, r: np.ones((1, 3)), c: 2.0}, [gx, gr, gc])
    np.testing.assert_allclose(out[1], np.full((1, 3), 4.0))
    assert float(out[2]) == pytest.approx(np.sum(xv + 1))


def test_unused_and_integer_inputs() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)))
    unused = b.input(("float32", (2,)))
    k = b.input(("int64", (3,)))
    loss = b.sum(b.multiply(x, b.cast(k, dtype="float64")))
    gx, gu = build_grad_ops(b, loss, [x, unused])
    out = b.run({x: np.ones(3), k: np.array([1, 2, 3]), unused: np.ones(2, np.float32)}, [gx, gu])
    np.testing.assert_array_equal(out[0], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(out[1], np.zeros(2, np.float32))
    with pytest.raises(opgraph.GraphError, match="only floating"):
        build_grad_ops(b, loss, [k])


def test_comparisons_give_zero_not_error() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)))
    loss = b.sum(b.where(b.greater(x, 0.0), x, b.multiply(x, 0.1)))
    g = build_grad_ops(b, loss, x)
    np.testing.assert_allclose(b.run({x: np.array([-1.0, 2.0, 3.0])}, [g])[0], [0.1, 1.0, 1.0])


def test_missing_rule_names_the_op() -> None:
    from opgraph.core.registry import OpDef, register_op

    register_op(OpDef(name="test_nograd_op", id=59001, arity=1, infer=lambda t, a: t,
                      kernel=lambda x, out=None: x), replace=True)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)))
    loss = b.sum(b.op("test_nograd_op", x))
    with pytest.raises(NoGradientError, match="test_nograd_op"):
        build_grad_ops(b, loss, [x])


def test_non_scalar_needs_cotangent_and_vjp() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2,)))
    y = b.multiply(x, x)
    with pytest.raises(opgraph.GraphError, match="cotangent"):
        build_grad_ops(b, y, [x])
    ct = b.input(("float64", (2,)))
    (g,) = build_vjp_ops(b, [y], [x], [ct])
    np.testing.assert_allclose(b.run({x: np.array([1.0, 3.0]), ct: np.array([2.0, 1.0])}, [g])[0], [4.0, 6.0])
    (g2,) = vjp([y], [x], [ct])
    assert g2 == g  # hash-consing: the same ops


def test_multi_output_unused_outputs_get_none() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (6,)))
    p, q, r = b.split(x, sections=3)
    loss = b.sum(b.square(q))
    g = build_grad_ops(b, loss, x)
    xv = np.arange(6.0)
    np.testing.assert_allclose(b.run({x: xv}, [g])[0], [0, 0, 4, 6, 0, 0])
    del p, r


def test_lazy_grad_and_function_transforms() -> None:
    x = onp.asarray(np.array([0.5, -1.0, 2.0]))
    loss = onp.sum(onp.exp(x) * x)
    g = grad(loss, x)
    np.testing.assert_allclose(g.eval(), np.exp(x.eval()) * (1 + x.eval()))
    gs = grad(loss, [x])
    np.testing.assert_allclose(gs[0].eval(), g.eval())

    def f(w, v):  # type: ignore[no-untyped-def]
        return onp.sum(onp.tanh(v @ w) ** 2)

    w0, v0 = np.random.default_rng(0).standard_normal((2, 3, 2))[0], np.ones((4, 3))
    gw = grad(f)(w0, v0)
    np.testing.assert_allclose(gw, fd_grad(lambda a: np.sum(np.tanh(v0 @ a) ** 2), w0), rtol=1e-6)
    val, (gw2, gv2) = value_and_grad(f, argnums=(0, 1))(w0, v0)
    np.testing.assert_allclose(gw2, gw)
    assert float(val) == pytest.approx(np.sum(np.tanh(v0 @ w0) ** 2))
    assert gv2.shape == v0.shape
    gf = grad(f)
    gf(w0, v0)
    assert gf._traced.cache_size == 1  # traced once per signature
    assert isinstance(gf.graph(w0, v0), opgraph.Graph)


def test_jax_style_vjp() -> None:
    y, pull = vjp(lambda a: onp.sin(a) * 2.0, np.array([0.0, 1.0]))
    np.testing.assert_allclose(y, 2 * np.sin([0.0, 1.0]))
    (ct,) = pull(np.array([1.0, 2.0]))
    np.testing.assert_allclose(ct, 2 * np.cos([0.0, 1.0]) * [1.0, 2.0])
    (g,) = lazy_vjp([onp.asarray(np.ones(2)) * 3.0], [onp.asarray(np.ones(2))], [np.ones(2)])
    np.testing.assert_array_equal(g.eval(), np.zeros(2))  # not connected: zeros


# ---------------------------------------------------------------- higher order
def test_grad_of_grad_scalar_functions() -> None:
    for f, d2, x0 in [
        (lambda x: onp.sin(x) * x, lambda x: 2 * np.cos(x) - x * np.sin(x), 0.7),
        (lambda x: onp.exp(x * x), lambda x: (2 + 4 * x * x) * np.exp(x * x), 0.3),
        (lambda x: onn.sigmoid(x) if hasattr(onn, "sigmoid") else onp.tanh(x),
         None, 0.2),
        (lambda x: onp.log(x) / x, lambda x: (2 * np.log(x) - 3) / x ** 3, 1.5),
    ]:
        h = grad(grad(f))
        g1 = grad(f)
        fd = (float(g1(np.array(x0 + 1e-5))) - float(g1(np.array(x0 - 1e-5)))) / 2e-5
        assert float(h(np.array(x0))) == pytest.approx(fd, rel=1e-5, abs=1e-7)
        if d2 is not None:
            assert float(h(np.array(x0))) == pytest.approx(d2(x0), rel=1e-8)


def test_hessian_vector_product_builder() -> None:
    # loss = sum(softmax(A x) * c) + sum(relu(x)**3); HVP = d/dx <grad(x), v>, checked against FD of the gradient.
    rng = np.random.default_rng(3)
    a, c = rng.standard_normal((4, 3)), rng.standard_normal(4)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    v = b.input(("float64", (3,)), name="v")
    loss = b.add(b.sum(b.multiply(b.softmax(b.matmul(b.const(a), x)), b.const(c))),
                 b.sum(b.power(b.tanh(x), 3.0)))
    (gx,) = build_grad_ops(b, loss, [x])
    (hv,) = build_grad_ops(b, b.sum(b.multiply(gx, v)), [x])
    x0, v0 = rng.standard_normal(3), rng.standard_normal(3)
    got = b.run({x: x0, v: v0}, [hv])[0]
    eps = 1e-6
    gp = b.run({x: x0 + eps * v0}, [gx])[0]
    gm = b.run({x: x0 - eps * v0}, [gx])[0]
    np.testing.assert_allclose(got, (gp - gm) / (2 * eps), rtol=1e-5, atol=1e-8)


def test_third_derivative_lazy() -> None:
    f = lambda x: onp.sum(x ** 4)  # noqa: E731
    g3 = grad(lambda x: onp.sum(grad(lambda y: onp.sum(grad(f)(y)))(x)))
    np.testing.assert_allclose(g3(np.array([1.0, 2.0])), 24 * np.array([1.0, 2.0]))


# ---------------------------------------------------------------- against PyTorch
# PyTorch is installed by `make test` (the local CPU wheel); without it only these model checks skip.
torch_or_skip = pytest.mark.skipif(__import__("importlib").util.find_spec("torch") is None,
                                   reason="PyTorch is not installed")


@torch_or_skip
def test_mlp_matches_pytorch() -> None:
    import torch

    rng = np.random.default_rng(0)
    xs, ys = rng.standard_normal((8, 5)), rng.integers(0, 3, 8)
    w1, b1, w2, b2 = rng.standard_normal((5, 7)), rng.standard_normal(7), rng.standard_normal((7, 3)), \
        rng.standard_normal(3)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", xs.shape), name="x")
    y = b.input(("float64", (8, 3)), name="y")
    p = [b.input(("float64", a.shape), name=n) for n, a in zip(("w1", "b1", "w2", "b2"), (w1, b1, w2, b2),
                                                                 strict=True)]
    h = b.tanh(b.add(b.matmul(x, p[0]), p[1]))
    logits = b.add(b.matmul(b.relu(h), p[2]), p[3])
    loss = b.negative(b.mean(b.sum(b.multiply(y, b.log_softmax(logits)), axis=1)))
    grads = build_grad_ops(b, loss, p)
    feeds = {x: xs, y: np.eye(3)[ys], **dict(zip(p, (w1, b1, w2, b2), strict=True))}
    ours = b.run(feeds, [loss, *grads])
    tp = [torch.tensor(a, requires_grad=True) for a in (w1, b1, w2, b2)]
    tl = torch.nn.functional.cross_entropy(torch.relu(torch.tanh(torch.tensor(xs) @ tp[0] + tp[1])) @ tp[2] + tp[3],
                                           torch.tensor(ys))
    tl.backward()
    assert float(ours[0]) == pytest.approx(tl.item(), rel=1e-12)
    for g, t in zip(ours[1:], tp, strict=True):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)


@torch_or_skip
def test_conv_net_matches_pytorch() -> None:
    import torch

    F = torch.nn.functional
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((2, 3, 9, 9))
    wc1, wc2 = rng.standard_normal((4, 3, 3, 3)) * 0.3, rng.standard_normal((6, 2, 3, 3)) * 0.3
    wf = rng.standard_normal((6 * 2 * 2, 5)) * 0.3
    b = opgraph.GraphBuilder()
    x = b.input(("float64", xs.shape))
    p = [b.input(("float64", a.shape)) for a in (wc1, wc2, wf)]
    h = b.relu(b.conv2d(x, p[0], padding=1))                         # (2, 4, 9, 9)
    h = b.max_pool2d(h, kernel_size=2)                               # (2, 4, 4, 4)
    h = b.relu(b.conv2d(h, p[1], stride=2, padding=1, groups=2))     # (2, 6, 2, 2)
    h = b.avg_pool2d(h, kernel_size=3, stride=1, padding=1)          # (2, 6, 2, 2)
    out = b.matmul(b.reshape(h, shape=(2, -1)), p[2])
    loss = b.sum(b.square(out))
    grads = build_grad_ops(b, loss, [x, *p])
    ours = b.run({x: xs, **dict(zip(p, (wc1, wc2, wf), strict=True))}, [loss, *grads])
    tx, *tp = [torch.tensor(a, requires_grad=True) for a in (xs, wc1, wc2, wf)]
    th = F.relu(F.conv2d(tx, tp[0], padding=1))
    th = F.max_pool2d(th, 2)
    th = F.relu(F.conv2d(th, tp[1], stride=2, padding=1, groups=2))
    th = F.avg_pool2d(th, 3, stride=1, padding=1)
    tl = ((th.reshape(2, -1) @ tp[2]) ** 2).sum()
    tl.backward()
    assert float(ours[0]) == pytest.approx(tl.item(), rel=1e-12)
    for g, t in zip(ours[1:], [tx, *tp], strict=True):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-9, atol=1e-10)



def test_driver_fixes_shape_and_dtype_of_rule_results() -> None:
    # A user rule that returns the cotangent unreduced and in another dtype: the driver sums and casts.
    from opgraph.core.registry import OpDef, register_op

    def rule(b, ins, outs, cots, attrs):  # type: ignore[no-untyped-def]
        return [b.cast(b.multiply(cots[0], 2.0), dtype="float64")]

    register_op(OpDef(name="test_double_bcast", id=59002, arity=1,
                      infer=lambda ts, a: (opgraph.TensorType(ts[0].dtype, (2, *ts[0].shape)),),
                      kernel=lambda x, out=None: np.broadcast_to(2 * x, (2, *x.shape)).copy(),
                      grad=rule), replace=True)
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (3,)))
    g = build_grad_ops(b, b.sum(b.op("test_double_bcast", x)), x)
    assert g.type == x.type
    np.testing.assert_array_equal(b.run({x: np.ones(3, np.float32)}, [g])[0], np.full(3, 4.0, np.float32))


def test_element_reads_accumulate_into_one_stack_not_a_pad_per_read() -> None:
    # a scalar model reads every x[i] (some twice): the gradient is one stack of x's size, not one pad of x's size
    # per read added up (quadratic in x's size)

    n = 40

    def f(x: Any) -> Any:
        acc = x[0] * x[n - 1]
        for i in range(1, n):
            acc = onp.sin(acc) * x[i] + 0.5 * x[i - 1]
        return acc

    x = np.linspace(0.1, 1.0, n)
    graph = opgraph.function(opgraph.grad(f)).graph(x)
    kinds = [graph.kind_of(op) for op in range(graph.num_ops)]
    assert kinds.count("stack") == 1 and "pad" not in kinds
    h = 1e-6
    fd = np.array([(float(opgraph.jit(f)(x + h * e)) - float(opgraph.jit(f)(x - h * e))) / (2 * h)
                   for e in np.eye(n)])
    np.testing.assert_allclose(opgraph.jit(opgraph.grad(f))(x), fd, rtol=1e-6, atol=1e-9)
    # a 2-D array read element by element, and an element never read (its gradient is zero)
    m = np.arange(6.0).reshape(2, 3)
    got = opgraph.jit(opgraph.grad(lambda a: a[0, 1] * a[1, 2] + a[-1, 0] ** 2))(m)
    np.testing.assert_array_equal(got, [[0.0, 5.0, 0.0], [6.0, 0.0, 1.0]])
