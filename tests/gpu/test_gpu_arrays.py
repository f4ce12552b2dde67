"""On a GPU: torch CUDA tensors in -> CUDA tensors out on the torch engine, with the update-edge state kept on
the device; jax GPU arrays stay jax GPU arrays on the jax engine (issue 33, point 2). Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph
from opgraph.errors import FeedError

torch = pytest.importorskip("torch")


def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("torch reports no CUDA device here")


def _accumulator() -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (256,)), name="x")
    s = b.input(("float32", (256,)), name="s")
    nxt = b.op("add", s, b.op("exp", x))
    b.output(nxt)
    b.update(nxt, s)
    return b.freeze()


def test_cuda_tensors_in_cuda_tensors_out_and_state_on_the_device() -> None:
    _needs_cuda()
    f = opgraph.compile(_accumulator(), backend="torch", device="cuda")
    xs = np.linspace(-1, 1, 256, dtype=np.float32)
    x = torch.from_numpy(xs).cuda()
    out = f(x, torch.zeros(256, device="cuda"))[0]
    assert out.is_cuda
    out2 = f(x)[0]  # the state input left out: its kept state
    assert out2.is_cuda
    np.testing.assert_allclose(out2.cpu().numpy(), 2 * np.exp(xs), rtol=1e-6)
    kept = [a for _, a in f._state.values()]
    assert kept and all(isinstance(a, torch.Tensor) and a.is_cuda for a in kept)


def test_cuda_tensors_on_the_numpy_engine_come_back_on_the_device() -> None:
    _needs_cuda()
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (8,)), name="x")
    b.output(b.op("sin", x))
    got = opgraph.compile(b.freeze())(torch.arange(8.0, dtype=torch.float64, device="cuda"))[0]
    assert got.is_cuda
    np.testing.assert_allclose(got.cpu().numpy(), np.sin(np.arange(8.0)), rtol=1e-15)


def test_requires_grad_on_cuda_is_refused() -> None:
    _needs_cuda()
    f = opgraph.compile(_accumulator(), backend="torch", device="cuda")
    x = torch.zeros(256, device="cuda", requires_grad=True)
    with pytest.raises(FeedError, match="requires_grad"):
        f(x, torch.zeros(256, device="cuda"))


def test_jax_gpu_arrays_stay_on_the_gpu() -> None:
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("jax reports no GPU device here")
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (16,)), name="x")
    b.output(b.op("exp", x))
    f = opgraph.compile(b.freeze(), backend="jax", device="cuda")
    got = f(jax.device_put(np.zeros(16, np.float32), gpu))[0]
    assert isinstance(got, jax.Array) and next(iter(got.devices())).platform == "gpu"
    np.testing.assert_allclose(np.asarray(got), np.ones(16), rtol=1e-6)
