"""Fused ops (opgraph.ops.fused): fma, matmul_t, sgd_momentum_update, adagrad_update, adam_update.

References are written here independently, as the plain NumPy expressions the ops replace.
"""

from __future__ import annotations

import numpy as np
import pytest

import opgraph.passes  # noqa: F401  (registers the fused family until opgraph.ops imports it)
from opcheck import check_op, out_type, rand
from opgraph.core.registry import get_op
from opgraph.core.types import TensorType
from opgraph.errors import OpBuildError


def test_family_and_ids() -> None:
    for name, id_ in (("fma", 1000), ("matmul_t", 1001), ("sgd_momentum_update", 1010),
                      ("adagrad_update", 1011), ("adam_update", 1012), ("fused_elementwise", 1002),
                      ("adam_update_t", 1013)):
        d = get_op(name)
        assert d.id == id_ and d.family == "fused" and 1000 <= d.id < 1100


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_fma(rng: np.random.Generator, dtype: str) -> None:
    a, b, c = rand(rng, (2, 3), dtype), rand(rng, (3,), dtype), rand(rng, (2, 1), dtype)
    check_op("fma", [a, b, c], lambda a, b, c: a * b + c, rtol=0)


def test_fma_mixed_dtypes(rng: np.random.Generator) -> None:
    a, b, c = rand(rng, (4,), "int8"), rand(rng, (4,), "float32"), rand(rng, (), "float64")
    check_op("fma", [a, b, c], lambda a, b, c: a * b + c, rtol=0)
    assert out_type("fma", TensorType("int8", (4,)), TensorType("int8", (4,)), TensorType("int8", ())) == \
        TensorType("int8", (4,))


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_t(rng: np.random.Generator, ta: bool, tb: bool) -> None:
    a = rand(rng, (2, 4, 3) if ta else (2, 3, 4))
    b = rand(rng, (5, 4) if tb else (4, 5))

    def ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a.transpose(0, 2, 1) if ta else a) @ (b.T if tb else b)

    check_op("matmul_t", [a, b], ref, rtol=1e-12, transpose_a=ta, transpose_b=tb)


def test_matmul_t_errors() -> None:
    with pytest.raises(OpBuildError):
        out_type("matmul_t", TensorType("float64", (3,)), TensorType("float64", (3, 2)), transpose_a=True)
    with pytest.raises(OpBuildError):
        out_type("matmul_t", TensorType("float64", (3, 2)), TensorType("float64", (3, 2)), transpose_a=False)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_sgd_momentum_update(rng: np.random.Generator, dtype: str) -> None:
    p, v, g = (rand(rng, (3, 2), dtype) for _ in range(3))
    lr, mu = 0.01, 0.9

    def ref(p: np.ndarray, v: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        v2 = np.asarray(mu, dtype) * v + g
        return p - np.asarray(lr, dtype) * v2, v2

    check_op("sgd_momentum_update", [p, v, g], ref, rtol=0, lr=lr, mu=mu)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_adagrad_update(rng: np.random.Generator, dtype: str) -> None:
    p, g = rand(rng, (5,), dtype), rand(rng, (5,), dtype)
    acc = rand(rng, (5,), dtype, 0.0, 2.0)
    lr, eps = 0.1, 1e-7

    def ref(p: np.ndarray, acc: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        acc2 = acc + g * g
        return p - np.asarray(lr, dtype) * g / (np.sqrt(acc2) + np.asarray(eps, dtype)), acc2

    check_op("adagrad_update", [p, acc, g], ref, rtol=0, lr=lr, eps=eps)


def test_adam_update(rng: np.random.Generator) -> None:
    p, m, g = (rand(rng, (2, 3)) for _ in range(3))
    v = rand(rng, (2, 3), low=0.0, high=1.0)
    b1, b2, lr, eps, t = 0.9, 0.999, 1e-3, 1e-8, 5
    attrs = dict(lr=lr, b1=b1, c1=1 - b1, b2=b2, c2=1 - b2, bc1=1 - b1 ** t, bc2=1 - b2 ** t, eps=eps)

    def ref(p: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, ...]:
        m2 = b1 * m + (1 - b1) * g
        v2 = b2 * v + (1 - b2) * g * g
        return p - lr * (m2 / (1 - b1 ** t)) / (np.sqrt(v2 / (1 - b2 ** t)) + eps), m2, v2

    check_op("adam_update", [p, m, v, g], ref, rtol=0, **attrs)


def test_update_type_rules() -> None:
    f = TensorType("float32", (3,))
    with pytest.raises(OpBuildError):
        out_type("adagrad_update", f, f, TensorType("float64", (3,)), lr=0.1, eps=1e-8)
    with pytest.raises(OpBuildError):
        out_type("sgd_momentum_update", *(TensorType("int32", (3,)),) * 3, lr=0.1, mu=0.9)
    assert out_type("sgd_momentum_update", f, f, f, lr=0.1, mu=0.9) == (f, f)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
def test_fused_elementwise(rng: np.random.Generator, dtype: str) -> None:
    x, w, c = rand(rng, (3, 4), dtype), rand(rng, (3, 4), dtype), rand(rng, (4,), dtype)
    prog = (("multiply", -1, -2), ("add", 0, -3), ("square", 1), ("maximum", 2, -1), ("negative", 3))
    check_op("fused_elementwise", [x, w, c], lambda x, w, c: -np.maximum(np.square(x * w + c), x), rtol=0,
             program=prog)


def test_fused_elementwise_mixed_types_and_scratch(rng: np.random.Generator) -> None:
    x, y = rand(rng, (5,), "int8"), rand(rng, (5,), "float32")
    prog = (("add", -1, -1), ("sqrt", 0), ("multiply", 1, -2), ("sin", 2), ("exp", 3))
    check_op("fused_elementwise", [x, y], lambda x, y: np.exp(np.sin(np.sqrt(x + x) * y)), rtol=0, program=prog)


def test_fused_elementwise_type_rule() -> None:
    f = TensorType("float64", (3,))
    assert out_type("fused_elementwise", f, TensorType("int8", (2, 1)), program=(("add", -1, -2),)) == \
        TensorType("float64", (2, 3))
    for bad in ((("sum", -1),), (("add", -1, -3),), (("add", -1, 1),), ()):
        with pytest.raises(OpBuildError):
            out_type("fused_elementwise", f, f, program=bad)


@pytest.mark.parametrize("square_first", [False, True])
def test_adam_update_t(rng: np.random.Generator, square_first: bool) -> None:
    p, m, g = (rand(rng, (4,), "float32") for _ in range(3))
    v = rand(rng, (4,), "float32", 0.0, 1.0)
    bc1, bc2 = np.array(0.271, np.float32), np.array(0.003, np.float32)
    b1, b2, lr, eps = 0.9, 0.999, 1e-3, 1e-8
    f = np.float32

    def ref(p: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, bc1: np.ndarray,
            bc2: np.ndarray) -> tuple[np.ndarray, ...]:
        m2 = f(b1) * m + f(1 - b1) * g
        v2 = f(b2) * v + ((g * g) * f(1 - b2) if square_first else (f(1 - b2) * g) * g)
        return p - f(lr) * (m2 / bc1) / (np.sqrt(v2 / bc2) + f(eps)), m2, v2

    check_op("adam_update_t", [p, m, v, g, bc1, bc2], ref, rtol=0, lr=lr, b1=b1, c1=1 - b1, b2=b2, c2=1 - b2,
             eps=eps, square_first=square_first)
    with pytest.raises(OpBuildError):
        out_type("adam_update_t", *(TensorType("float32", (4,)),) * 5, TensorType("float32", ()), lr=lr, b1=b1,
                 c1=0.1, b2=b2, c2=0.001, eps=eps)
