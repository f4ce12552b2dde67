"""Fused ops (opgraph.ops.fused): fma, matmul_t, sgd_momentum_update, adagrad_update, adam_update.

References are written here independently, as the plain NumPy expressions the ops replace.
"""

from __future__ import annotations

import numpy as np
import pytest

import opgraph.passes  # noqa: F401  (registers the fused family until opgraph.ops imports it)
from opcheck import check_op, out_type, rand
from opgraph.backends.numpy import BACKEND
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


# ---------------------------------------------------------------- update kernels: both paths, results in operands
def _refs(kind: str, xs: list[np.ndarray], sq: bool = False) -> tuple[np.ndarray, ...]:
    """The unfused NumPy expressions (same operations, same order) the update kernels replace."""
    f = xs[0].dtype.type
    if kind == "sgd_momentum_update":
        p, v, g = xs
        v2 = np.multiply(0.9, v) + g
        return p - np.multiply(0.05, v2), v2
    if kind == "adagrad_update":
        p, a, g = xs
        a2 = a + g * g
        return p - (f(0.05) * g) / (np.sqrt(a2) + f(1e-7)), a2
    p, m, v, g = xs[:4]
    bc1, bc2 = f(0.271), f(0.003)
    m2 = f(0.9) * m + f(0.1) * g
    v2 = f(0.999) * v + ((g * g) * f(0.001) if sq else (f(0.001) * g) * g)
    return p - (f(0.01) * (m2 / bc1)) / (np.sqrt(v2 / bc2) + f(1e-8)), m2, v2


_KW = {"sgd_momentum_update": {"lr": 0.05, "mu": 0.9}, "adagrad_update": {"lr": 0.05, "eps": 1e-7},
       "adam_update_t": {"lr": 0.01, "b1": 0.9, "c1": 0.1, "b2": 0.999, "c2": 0.001, "eps": 1e-8}}


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", list(_KW))
@pytest.mark.parametrize("n", [7, 3 * (1 << 14) + 5])  # one block; several blocks and a partial one
def test_update_kernels_alias_and_paths(monkeypatch: pytest.MonkeyPatch, compiled: bool, dtype: str, kind: str,
                                        n: int) -> None:
    """Every result in every operand's memory (and fresh), compiled loop and NumPy path: bit-identical to the
    unfused expressions; a result partly overlapping an operand is computed aside."""
    from opgraph.core import accel

    monkeypatch.setattr(accel, "enabled", compiled)
    rng = np.random.default_rng(n)
    base = [(rng.random(n) + 0.5).astype(dtype) for _ in range(4 if kind.startswith("adam") else 3)]
    extra = [np.asarray(0.271, dtype), np.asarray(0.003, dtype)] if kind.startswith("adam") else []
    kw = dict(_KW[kind], square_first=True) if kind.startswith("adam") else _KW[kind]
    want = _refs(kind, base, sq=True)
    kernel = BACKEND.kernel_for(kind, 0)
    n_out = len(want)
    for k in range(len(base) + 1):      # output 0 in operand k's memory (k == len: fresh)
        for j in range(len(base) + 1):  # output 1 in operand j's memory
            if k == j < len(base):
                continue
            xs = [b.copy() for b in base]
            outs = [xs[k] if k < len(xs) else np.empty(n, dtype), xs[j] if j < len(xs) else np.empty(n, dtype)]
            outs += [np.empty(n, dtype) for _ in range(n_out - 2)]
            got = kernel(*xs, *extra, out=tuple(outs), **kw)
            for w, o, r in zip(want, outs, got, strict=True):
                assert r is o
                np.testing.assert_array_equal(o, w)
    # results overlapping an operand shifted by one element, and a non-contiguous result
    buf = np.concatenate([base[-1], base[-1][:1]])
    xs = [*[b.copy() for b in base[:-1]], buf[:-1]]
    outs = [buf[1:], *[np.empty(n, dtype) for _ in range(n_out - 1)]]
    kernel(*xs, *extra, out=tuple(outs), **kw)
    for w, o in zip(want, outs, strict=True):
        np.testing.assert_array_equal(o, w)
    wide = np.empty(2 * n, dtype)
    outs = [wide[::2], *[np.empty(n, dtype) for _ in range(n_out - 1)]]
    kernel(*[b.copy() for b in base], *extra, out=tuple(outs), **kw)
    np.testing.assert_array_equal(wide[::2], want[0])


def _onnx_adagrad() -> object:
    """ONNX's (and PyTorch's) Adagrad, ``p - lr g / (sqrt(acc) + eps)``: the form the ``adagrad`` rule fuses
    (``opgraph.optim.Adagrad`` is optax's, eps inside the root, which no rule fuses)."""
    import opgraph.optim as optim

    class OnnxAdagrad(optim.Optimizer):
        def apply(self, b, param, grad, state):  # type: ignore[no-untyped-def]
            acc, set_acc = state("acc")
            acc_new = b.add(acc, b.multiply(grad, grad))
            set_acc(acc_new)
            return b.subtract(param, b.divide(b.multiply(grad, 0.01), b.add(b.sqrt(acc_new), 1e-10)))

    return OnnxAdagrad()


@pytest.mark.parametrize("opt", ["Momentum", "Adagrad", "Adam"])
def test_fused_training_step_in_place_matches_unfused(monkeypatch: pytest.MonkeyPatch, opt: str) -> None:
    """The compiled NumPy engine gives the fused updates the gradient's buffer (inplace); the results equal the
    unfused step's exactly, step after step."""
    import opgraph
    import opgraph.ops.fused as fused
    import opgraph.optim as optim
    from opgraph.memory.plan import plan_memory
    from opgraph.passes import optimize

    monkeypatch.setattr(fused, "UPDATE_MIN", {k: (0, 0) for k in fused.UPDATE_MIN})  # fused with or without numba

    b = opgraph.GraphBuilder()
    x = b.input(("float64", (16, 96)), name="x")
    w = b.input(("float64", (96, 64)), name="w")
    loss = b.sum(b.square(b.matmul(x, w)))
    step = optim.training_step(b, loss, [w], _onnx_adagrad() if opt == "Adagrad" else getattr(optim, opt)(lr=0.01))
    g = step.graph
    o = optimize(g, level=2)
    fused_ops = [op for op in range(o.num_ops) if o.kind_of(op).endswith("_update") or o.kind_of(op).endswith("_t")]
    assert fused_ops
    plan = plan_memory(o)
    assert plan.stats()["inplace"] >= 1 and plan.total_bytes <= plan_memory(g).total_bytes
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((16, 96)) * 0.1, "w": rng.standard_normal((96, 64)), **step.state}
    fa, fb = opgraph.compile(g), opgraph.compile(o)
    for _ in range(3):
        np.testing.assert_array_equal(fb(dict(feeds))[0], fa(dict(feeds))[0])
        feeds = {"x": feeds["x"]}
