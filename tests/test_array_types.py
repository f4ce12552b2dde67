"""Array types in and out of compiled programs (issue 33, point 2): results in the callers' kind (result="auto")
or a forced one, per engine and feed kind, equal to NumPy's; mixed kinds give NumPy; zero-copy where promised;
torch tensors that require grad refused; compile times reported by every engine (point 6)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import opgraph
from opgraph.backends.arrays import kind_of
from opgraph.backends.base import BackendError
from opgraph.errors import FeedError

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

ENGINES = ["numpy"] + [e for e in ("jax", "torch", "onnxruntime", "dask") if importlib.util.find_spec(e)]
X = np.array([[0.5, -1.0, 2.0], [0.0, 3.0, -0.25]])
W = np.array([1.5, -2.0, 0.5])
WANT = np.tanh(X) * W + 1.0

MAKE = {"numpy": lambda a: a.copy(), "torch": torch.from_numpy, "jax": jnp.asarray, "python": lambda a: a.tolist()}


def _graph() -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3)), name="x")
    w = b.input(("float64", (3,)), name="w")
    b.output(b.op("add", b.op("multiply", b.op("tanh", x), w), 1.0))
    return b.freeze()


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def programs(engine: str) -> dict[str, opgraph.Program]:
    return {r: opgraph.compile(_graph(), backend=engine, result=r) for r in ("auto", "numpy", "jax", "torch")}


@pytest.mark.parametrize("feed_kind", ["numpy", "torch", "jax", "python"])
@pytest.mark.parametrize("result", ["auto", "numpy", "jax", "torch"])
def test_result_kind_per_engine_feed_kind_and_result(programs, feed_kind: str, result: str) -> None:
    got = programs[result](MAKE[feed_kind](X), MAKE[feed_kind](W))[0]
    want_kind = result if result != "auto" else ("numpy" if feed_kind == "python" else feed_kind)
    assert kind_of(got) == want_kind
    np.testing.assert_allclose(np.asarray(got), WANT, rtol=1e-14)


def test_mixed_kinds_give_numpy(programs) -> None:
    for x, w in ((torch.from_numpy(X.copy()), jnp.asarray(W)), (X, torch.from_numpy(W.copy())), (jnp.asarray(X), W)):
        got = programs["auto"](x, w)[0]
        assert type(got) is np.ndarray
        np.testing.assert_allclose(got, WANT, rtol=1e-14)
    got = programs["auto"](torch.from_numpy(X.copy()), W.tolist())[0]  # Python data has no kind of its own
    assert isinstance(got, torch.Tensor)


def test_requires_grad_is_refused_naming_the_input(programs) -> None:
    w = torch.tensor(W, requires_grad=True)
    with pytest.raises(FeedError, match=r"input %w is a torch tensor with requires_grad=True.*\.detach\(\)"):
        programs["auto"](X, w)
    np.testing.assert_allclose(programs["auto"](X, w.detach())[0], WANT, rtol=1e-14)


def test_wrong_dtype_or_shape_of_a_torch_or_jax_feed_is_the_numpy_feed_error(programs) -> None:
    for bad, says in ((np.ones((2, 3), np.float64)[:, :2], r"input %x expects f64\[2,3\], got shape \(2, 2\)"),
                      (np.array([[1, 2, 3], [4, 5, 6]], np.complex128), "input %x expects f64.*complex128")):
        for make in (MAKE["numpy"], MAKE["torch"], MAKE["jax"]):
            with pytest.raises(FeedError, match=says):
                programs["auto"](make(np.ascontiguousarray(bad)), W)


def test_results_do_not_alias_feeds_or_constants() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    b.output(x, b.constant(np.arange(3.0)), b.op("exp", x))
    g = b.freeze()
    for engine in ENGINES:
        f = opgraph.compile(g, backend=engine)
        t = torch.zeros(3, dtype=torch.float64)
        same, const, res = f(t)
        assert isinstance(same, torch.Tensor) and same.data_ptr() != t.data_ptr()
        same.add_(1.0)  # writable, and the caller's tensor is untouched
        assert float(t.sum()) == 0.0
        const.add_(1.0)
        np.testing.assert_array_equal(f(t)[1].numpy(), np.arange(3.0))
        np.testing.assert_array_equal(res.numpy(), np.ones(3))


def test_zero_copy_torch_cpu_on_the_numpy_and_torch_engines() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (1000,)), name="x")
    b.output(b.op("exp", x))
    g = b.freeze()
    t = torch.linspace(0, 1, 1000, dtype=torch.float64)
    numpy_prog = opgraph.compile(g)
    seen = []
    inner = numpy_prog.arena_runtime

    class Spy:  # the arena sees a NumPy view of the tensor's memory, not a copy
        def __call__(self, feeds):
            seen.extend(feeds.values())
            outs = inner(feeds)
            seen.extend(outs)
            return outs

        def positional(self):  # the direct call NumPy arrays take (a torch tensor takes the call above)
            return inner.positional()

    numpy_prog.__dict__["arena_runtime"] = Spy()
    out = numpy_prog(t)[0]
    assert np.shares_memory(seen[0], t.numpy())
    assert isinstance(out, torch.Tensor)
    assert out.data_ptr() == seen[1].ctypes.data  # the tensor is the arena's fresh result, not a copy of it
    np.testing.assert_allclose(out.numpy(), np.exp(t.numpy()), rtol=1e-15)
    # the torch engine takes a tensor of the right type as it is: no NumPy round trip
    f = opgraph.compile(g, backend="torch")
    from opgraph.backends.torch import BACKEND

    assert BACKEND.adopt_feed(t, g.type_of(0), "%x") is t
    assert isinstance(f(t)[0], torch.Tensor)


def test_numpy_results_become_torch_tensors_without_a_copy() -> None:
    from opgraph.backends.arrays import convert

    a = np.arange(5.0)
    t = convert(a, "torch")
    assert t.data_ptr() == a.ctypes.data
    back = convert(t, "numpy")
    assert np.shares_memory(back, a)
    j = convert(t, "jax")
    np.testing.assert_array_equal(np.asarray(j), a)
    np.testing.assert_array_equal(convert(j, "torch").numpy(), a)


def test_jax_arrays_stay_jax_on_the_jax_engine() -> None:
    f = opgraph.compile(_graph(), backend="jax")
    got = f(jnp.asarray(X), jnp.asarray(W))[0]
    assert isinstance(got, jax.Array)
    np.testing.assert_allclose(np.asarray(got), WANT, rtol=1e-14)


def test_dask_keeps_its_own_results() -> None:
    da = pytest.importorskip("dask.array")
    f = opgraph.compile(_graph(), backend="dask", result="dask")
    got = f(X, W)[0]
    assert isinstance(got, da.Array)
    np.testing.assert_allclose(got.compute(), WANT, rtol=1e-14)


def test_an_unknown_result_kind_is_refused() -> None:
    with pytest.raises(BackendError, match=r"result='cupy': choose 'auto', 'numpy', 'jax', 'torch'"):
        opgraph.compile(_graph(), result="cupy")


def test_every_engine_reports_compile_times(engine: str) -> None:
    f = opgraph.compile(_graph(), backend=engine)
    times = f.compile_times
    assert times and all(t >= 0 for t in times.values())
    assert engine in times  # the engine's own compile (the numpy arena's plan)
    assert sum(times.values()) <= f.compile_seconds + 1e-6
    line = f.explain().splitlines()[-1]
    assert line.startswith("compile: ") and f"{engine} " in line


def test_shapes_compiled_on_first_use_add_to_the_engine_time() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (None,)), name="x")
    b.output(b.op("exp", x))
    f = opgraph.compile(b.freeze(), backend="jax")
    before = f.compile_times.get("jax", 0.0)
    f(np.zeros(3))
    after3 = f.compile_times["jax"]
    f(np.zeros(4))
    assert before < after3 < f.compile_times["jax"]


def test_a_context_takes_torch_tensors_and_refuses_requires_grad(engine: str) -> None:
    ctx = opgraph.compile(_graph(), backend=engine).context()
    ctx.set("x", torch.from_numpy(X.copy()))
    with pytest.raises(FeedError, match="input %w is a torch tensor with requires_grad=True"):
        ctx.set("w", torch.tensor(W, requires_grad=True))
    ctx.set("w", jnp.asarray(W))
    np.testing.assert_allclose(ctx.get(_graph().outputs[0]), WANT, rtol=1e-14)
