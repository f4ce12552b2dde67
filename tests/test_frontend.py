"""Lazy arrays and tracing: same graphs as the builder, same results as NumPy, errors at the user's line."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import opgraph
import opgraph.nn as nn
import opgraph.numpy as onp
from opgraph.frontend.lazy import TracingError

RNG = np.random.default_rng(3)
W1, B1 = RNG.normal(size=(8, 16)), RNG.normal(size=16)
W2, B2 = RNG.normal(size=(16, 4)), RNG.normal(size=4)


def mlp_numpy(x: np.ndarray) -> np.ndarray:
    h = np.maximum(x @ W1 + B1, 0.0)
    z = h @ W2 + B2
    z = z - z.max(axis=-1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)


def mlp_builder(batch: int) -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.placeholder("float64", (batch, 8), name="x")
    h = b.relu(b.add(b.matmul(x, b.const(W1)), b.const(B1)))
    b.output(b.softmax(b.add(b.matmul(h, b.const(W2)), b.const(B2)), axis=-1))
    return b.freeze()


def mlp_lazy(x):  # type: ignore[no-untyped-def]
    h = nn.relu(x @ onp.asarray(W1) + onp.asarray(B1))
    return nn.softmax(h @ onp.asarray(W2) + onp.asarray(B2), axis=-1)


def test_three_front_ends_build_the_same_graph_and_result() -> None:
    x = RNG.normal(size=(5, 8))
    g_builder = mlp_builder(5)
    xp = onp.placeholder((5, 8), "float64", name="x")
    g_lazy = onp.to_graph([mlp_lazy(xp)], inputs=[xp])
    traced = opgraph.function(mlp_lazy)
    g_traced = traced.graph(x)
    assert g_builder == g_lazy == g_traced
    assert g_builder.equals(g_traced, check_names=True)
    want = mlp_numpy(x)
    np.testing.assert_allclose(g_builder.run({"x": x})[0], want, rtol=1e-12)
    np.testing.assert_allclose(traced(x), want, rtol=1e-12)
    np.testing.assert_allclose(mlp_lazy(onp.asarray(x)).eval(), want, rtol=1e-12)


def test_lazy_arrays_know_types_before_evaluating() -> None:
    calls: list[int] = []
    a = onp.asarray(np.arange(12.0).reshape(3, 4))
    b = (a.T @ a).sum(axis=0, keepdims=True)
    assert b.shape == (1, 4) and b.dtype == np.float64 and b.ndim == 2
    assert b._node.value is None and not calls  # nothing ran yet
    np.testing.assert_allclose(np.asarray(b), (np.arange(12.0).reshape(3, 4).T @ np.arange(12.0).reshape(3, 4))
                               .sum(axis=0, keepdims=True))


def test_conversions_evaluate() -> None:
    x = onp.asarray(np.array([1.5, -2.0]))
    assert float(x[0]) == 1.5 and int(x[1] * 2) == -4 and bool(x[0] > 0)
    assert complex(x[0]) == 1.5 + 0j
    assert np.asarray(x * 2, dtype=np.float32).dtype == np.float32
    assert [float(v) for v in x] == [1.5, -2.0]
    assert len(x) == 2
    idx = onp.asarray(np.int64(1))
    assert [10, 20, 30][idx] == 20  # __index__
    with pytest.raises(TypeError, match="size-1"):
        float(x)


def test_evaluated_values_are_cached() -> None:
    x = onp.asarray(np.ones(3))
    y = onp.exp(x)
    first = y.eval()
    assert y.eval() is first
    z = y + 1.0  # builds on y's cached value: y is not computed again
    np.testing.assert_allclose(z.eval(), np.e + 1.0)


def test_operators_match_numpy() -> None:
    a_np = RNG.integers(1, 5, size=(3, 4)).astype(np.int32)
    b_np = RNG.uniform(1, 2, size=(4,)).astype(np.float32)
    a, b = onp.asarray(a_np), onp.asarray(b_np)
    cases = {
        "add": (a + b, a_np + b_np), "radd": (2 + a, 2 + a_np), "sub": (a - b, a_np - b_np),
        "rsub": (1.5 - b, 1.5 - b_np), "mul": (a * 3, a_np * 3), "div": (a / b, a_np / b_np),
        "rdiv": (1 / b, 1 / b_np), "floordiv": (a // 2, a_np // 2), "mod": (a % 3, a_np % 3),
        "pow": (b ** 2, b_np ** 2), "rpow": (2.0 ** b, 2.0 ** b_np), "neg": (-a, -a_np), "abs": (abs(-a), abs(-a_np)),
        "lt": (a < 3, a_np < 3), "ge": (a >= b, a_np >= b_np), "eq": (a == 2, a_np == 2), "ne": (a != 2, a_np != 2),
        "and": (a & 1, a_np & 1), "or": (a | 8, a_np | 8), "xor": (a ^ 3, a_np ^ 3), "invert": (~a, ~a_np),
        "lshift": (a << 1, a_np << 1), "rshift": (a >> 1, a_np >> 1), "matmul": (b @ a.T, b_np @ a_np.T),
        "getitem": (a[1:, ::-2], a_np[1:, ::-2]), "take": (a[np.array([2, 0])], a_np[np.array([2, 0])]),
        "newaxis": (b[None, :, None], b_np[None, :, None]), "T": (a.T, a_np.T), "mT": (a.mT, a_np.T),
        "reshape": (a.reshape(2, 6), a_np.reshape(2, 6)), "astype": (a.astype("float16"), a_np.astype("float16")),
        "mean": (a.mean(axis=0), a_np.mean(axis=0)), "max": (a.max(), a_np.max()), "argmin": (a.argmin(1),
                                                                                             a_np.argmin(1)),
        "flatten": (a.flatten(), a_np.flatten()),
    }
    for name, (got, want) in cases.items():
        got_np = np.asarray(got)
        assert got_np.dtype == want.dtype, name
        np.testing.assert_allclose(got_np, want, rtol=1e-6, err_msg=name)


def test_numpy_arrays_on_the_left_defer_to_lazy_arrays() -> None:
    a = onp.asarray(np.ones(3))
    out = np.ones(3) + a
    assert isinstance(out, onp.LazyArray)


def test_namespace_functions() -> None:
    x_np = RNG.normal(size=(2, 3, 4))
    x = onp.asarray(x_np)
    np.testing.assert_allclose(onp.concat([x, x], axis=1).eval(), np.concatenate([x_np, x_np], axis=1))
    np.testing.assert_allclose(onp.stack([x, x], axis=-1).eval(), np.stack([x_np, x_np], axis=-1))
    parts = onp.split(x, 3, axis=1)
    for p, q in zip(parts, np.split(x_np, 3, axis=1), strict=True):
        np.testing.assert_allclose(p.eval(), q)
    np.testing.assert_allclose(onp.einsum("abc,cd->abd", x, onp.ones((4, 2))).eval(),
                               np.einsum("abc,cd->abd", x_np, np.ones((4, 2))))
    np.testing.assert_allclose(onp.permute_dims(x, (2, 0, 1)).eval(), x_np.transpose(2, 0, 1))
    np.testing.assert_allclose(onp.where(x > 0, x, 0.0).eval(), np.where(x_np > 0, x_np, 0.0))
    np.testing.assert_allclose(onp.clip(x, -0.5, 0.5).eval(), np.clip(x_np, -0.5, 0.5))
    np.testing.assert_allclose(onp.var(x, axis=2, correction=1).eval(), np.var(x_np, axis=2, ddof=1))
    np.testing.assert_allclose(onp.pad(x, 1).eval(), np.pad(x_np, 1))
    np.testing.assert_allclose(onp.cumulative_sum(x, axis=1).eval(), np.cumsum(x_np, axis=1))
    np.testing.assert_allclose(onp.tril(x[0]).eval(), np.tril(x_np[0]))
    w, v = onp.linalg.eigh(onp.asarray(np.diag([3.0, 1.0, 2.0])))
    np.testing.assert_allclose(w.eval(), [1.0, 2.0, 3.0])
    np.testing.assert_allclose(np.abs(v.eval()), np.eye(3)[:, [1, 2, 0]])
    q, r = onp.linalg.qr(x[0].T)
    np.testing.assert_allclose((q @ r).eval(), x_np[0].T, atol=1e-12)


def test_array_api_compat_code_runs_on_lazy_arrays() -> None:
    array_api_compat = pytest.importorskip("array_api_compat")

    def standardise(x):  # type: ignore[no-untyped-def]
        xp = array_api_compat.array_namespace(x)
        return (x - xp.mean(x, axis=0)) / xp.std(x, axis=0)

    data = RNG.normal(size=(10, 3))
    out = standardise(onp.asarray(data))
    assert isinstance(out, onp.LazyArray)
    np.testing.assert_allclose(np.asarray(out), (data - data.mean(0)) / data.std(0))


def test_build_errors_point_at_the_users_line() -> None:
    a, b = onp.ones((2, 3)), onp.ones((4,))
    line = inspect.currentframe().f_lineno + 2  # type: ignore[union-attr]
    with pytest.raises(opgraph.OpBuildError) as info:
        a + b
    msg = str(info.value)
    assert msg.startswith("add(f64[2,3], f64[4]): shapes (2, 3) and (4,) do not broadcast")
    assert f"{__file__}:{line}" in msg


def test_traced_errors_point_at_the_users_line() -> None:
    def bad(x):  # type: ignore[no-untyped-def]
        return x @ onp.ones((5, 2))  # the line the error must name

    line = inspect.getsourcelines(bad)[1] + 1
    with pytest.raises(opgraph.OpBuildError) as info:
        opgraph.function(bad)(np.ones((2, 3)))
    assert "matmul(f64[2,3], f64[5,2])" in str(info.value)
    assert f"{__file__}:{line}" in str(info.value)


def test_value_dependent_control_flow_is_a_clear_tracing_error() -> None:
    @opgraph.function
    def relu_if(x):  # type: ignore[no-untyped-def]
        if onp.sum(x) > 0:
            return x
        return -x

    with pytest.raises(TracingError, match="inside a traced function"):
        relu_if(np.ones(3))


def test_trace_cache_per_signature_and_static_arguments() -> None:
    traces: list[int] = []

    @opgraph.function
    def scale(x, factor):  # type: ignore[no-untyped-def]
        traces.append(1)
        return x * factor

    np.testing.assert_allclose(scale(np.ones(3), 2.0), 2.0 * np.ones(3))
    np.testing.assert_allclose(scale(np.full(3, 4.0), 2.0), 8.0 * np.ones(3))
    assert len(traces) == 1  # same signature: no new trace
    scale(np.ones(3), 3.0)  # a static argument changed
    scale(np.ones(4), 3.0)  # a shape changed
    scale(np.ones(4, np.float32), 3.0)  # a dtype changed
    assert len(traces) == 4 and scale.cache_size == 4
    assert scale(np.ones(4, np.float32), 3.0).dtype == np.float32


def test_traced_functions_return_structures() -> None:
    @opgraph.function
    def stats(x):  # type: ignore[no-untyped-def]
        return {"mean": onp.mean(x), "max": onp.max(x)}

    out = stats(np.array([1.0, 5.0]))
    assert set(out) == {"mean", "max"} and float(out["max"]) == 5.0

    @opgraph.function
    def pair(x):  # type: ignore[no-untyped-def]
        return x + 1, x - 1

    a, b = pair(np.zeros(2))
    np.testing.assert_allclose(a, 1.0)
    np.testing.assert_allclose(b, -1.0)


def test_placeholders_without_values_cannot_be_evaluated() -> None:
    x = onp.placeholder((3,), name="x")
    with pytest.raises(TracingError, match="placeholder x"):
        (x + 1).eval()


def test_unknown_dims_through_lazy_arrays() -> None:
    x = onp.placeholder((None, 3), "float32", name="x")
    y = onp.sum(x * 2, axis=1)
    assert y.shape == (None,)
    g = onp.to_graph([y], inputs=[x])
    np.testing.assert_allclose(g.run({"x": np.ones((5, 3), np.float32)})[0], np.full(5, 6.0, np.float32))


def test_weak_python_scalars_follow_numpy2() -> None:
    x = onp.asarray(np.ones(2, np.float32))
    assert (x * 2.5).dtype == np.float32  # as np.ones(2, float32) * 2.5
    i = onp.asarray(np.ones(2, np.int8))
    assert (i + 1).dtype == np.int8 and (i + 1.5).dtype == np.float64
