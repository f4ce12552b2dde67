"""Shared harness: run one op through a graph and compare with a NumPy reference.

``check_op`` builds a one-op graph with the builder, runs it with the
executor (which checks every result against the declared type), and then
checks three more things every kernel must honour:

* the result's dtype and shape equal NumPy's reference exactly;
* the same op on non-contiguous views of the inputs gives the same result;
* the kernel writes into preallocated ``out`` buffers when given them.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import opgraph
from opgraph.core.registry import get_op
from opgraph.core.types import TensorType
from opgraph.io.cg.format import METADATA_RECORD

RNG_SEED = 1234


def rand(rng: np.random.Generator, shape: Sequence[int], dtype: Any = np.float64,
         low: float = -3.0, high: float = 3.0) -> np.ndarray:
    """Random array of a dtype: uniform floats, integers in [low, high), random bools."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        lo = max(int(low), 0) if dt.kind == "u" else int(low)
        return rng.integers(lo, max(int(high), lo + 1), size=shape).astype(dt)
    if dt.kind == "c":
        return (rng.uniform(low, high, shape) + 1j * rng.uniform(low, high, shape)).astype(dt)
    return rng.uniform(low, high, shape).astype(dt)


def noncontiguous(a: np.ndarray) -> np.ndarray:
    """A non-contiguous view with the same values (every other element of a bigger array)."""
    if a.ndim == 0 or a.size == 0:
        return a
    big = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), dtype=a.dtype)
    view = big[..., ::2]
    view[...] = a
    assert not view.flags.c_contiguous or a.shape[-1] <= 1
    return view


def run_op(kind: str, *arrays: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    """Build ``kind(*arrays, **attrs)`` as a graph with one input per array and run it."""
    b = opgraph.GraphBuilder()
    ins = [b.input(TensorType.of(a)) for a in arrays]
    outs = b.op(kind, *ins, **attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    b.output(*outs)
    g = b.freeze().verify()
    return g.run({v: a for v, a in zip(ins, arrays, strict=True)})


def out_type(kind: str, *types: Any, **attrs: Any) -> Any:
    """The output type(s) the builder infers for ``kind`` on inputs of ``types``."""
    b = opgraph.GraphBuilder()
    ins = [b.input(t) for t in types]
    outs = b.op(kind, *ins, **attrs)
    return tuple(o.type for o in outs) if isinstance(outs, tuple) else outs.type


def assert_same(got: np.ndarray, want: Any, rtol: float, atol: float, what: str) -> None:
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != NumPy's {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != NumPy's {want.shape}"
    if want.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def check_op(kind: str, arrays: Sequence[np.ndarray], reference: Callable[..., Any],
             *, rtol: float = 1e-7, atol: float = 0.0, noncontig: bool = True, check_out: bool = True,
             **attrs: Any) -> list[np.ndarray]:
    """Run ``kind`` on ``arrays`` and compare with ``reference(*arrays)``; see the module doc."""
    expected = reference(*arrays)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    got = run_op(kind, *arrays, **attrs)
    assert len(got) == len(expected), f"{kind}: {len(got)} outputs, reference has {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert_same(g, e, rtol, atol, f"{kind} output {i}")
    if noncontig and any(a.ndim and a.size and a.shape[-1] > 1 for a in arrays):
        views = [noncontiguous(a) for a in arrays]
        for i, (g, e) in enumerate(zip(run_op(kind, *views, **attrs), expected, strict=True)):
            assert_same(g, e, rtol, atol, f"{kind} output {i} (non-contiguous inputs)")
    if check_out:
        opdef = get_op(kind)
        r = opgraph.core.registry.resolve(kind, [TensorType.of(a) for a in arrays], attrs)
        bufs = tuple(np.empty(np.asarray(e).shape, dtype=np.asarray(e).dtype) for e in expected)
        fn = opdef.kernel_for(r.version)
        result = fn(*arrays, out=bufs[0] if len(bufs) == 1 else bufs, **dict(r.attrs))
        result = (result,) if len(bufs) == 1 else tuple(result)
        for i, (res, buf, e) in enumerate(zip(result, bufs, expected, strict=True)):
            assert res is buf, f"{kind} output {i}: kernel did not return the out buffer"
            assert_same(buf, e, rtol, atol, f"{kind} output {i} (written into out=)")
    return got


def graph_test_copy(fn: Callable[..., Any], keep: Callable[[int], bool]) -> Callable[..., Any] | None:
    """A copy of family test ``fn`` that keeps the parametrised cases ``i`` with ``keep(i)`` (at least one),
    for suites that re-run the family tests elsewhere; None for tests that build no graph or are hypothesis's."""
    import pytest

    names = set(fn.__code__.co_names)
    if not names & {"check_op", "run_op"} or hasattr(fn, "hypothesis"):
        return None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    marks = getattr(fn, "pytestmark", [])
    wrapper.pytestmark = [m for m in marks if m.name != "parametrize"]  # type: ignore[attr-defined]
    for m in [m for m in marks if m.name == "parametrize"]:
        argnames, argvalues = m.args[0], list(m.args[1])
        kwargs = dict(m.kwargs)
        ids = kwargs.pop("ids", None)
        chosen = [i for i in range(len(argvalues)) if keep(i)] or [0]
        if isinstance(ids, (list, tuple)):
            kwargs["ids"] = [ids[i] for i in chosen]
        elif ids is not None:
            kwargs["ids"] = ids
        wrapper.pytestmark.append(  # type: ignore[attr-defined]
            pytest.mark.parametrize(argnames, [argvalues[i] for i in chosen], **kwargs).mark)
    return wrapper


def torch_depthwise(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], padding: tuple[tuple[int, int], ...],
                    dilation: tuple[int, int]) -> np.ndarray:
    """The reference for depthwise convolutions: torch's grouped convolution in float64 after explicit zero
    padding (torch is imported here: only tests that have it call this)."""
    import torch

    F = torch.nn.functional
    xt = F.pad(torch.from_numpy(np.asarray(x, np.float64)), [*padding[1], *padding[0]])
    return F.conv2d(xt, torch.from_numpy(np.asarray(w, np.float64)), stride=stride, dilation=dilation,  # type: ignore[no-any-return]
                    groups=x.shape[1]).numpy()


def edit_metadata(cgc: bytes, fn: Any) -> bytes:
    """Rewrite the JSON text of the metadata record of a .cgc file (keeping its binary arrays)."""
    w = cgc[0] // 8
    fmt = {2: "<2h", 4: "<2i", 8: "<2q"}[w]
    pos, out = 1, [cgc[:1]]
    while pos < len(cgc):
        t, n = struct.unpack_from(fmt, cgc, pos)
        data = cgc[pos + 2 * w:pos + 2 * w + n]
        if t == METADATA_RECORD:
            j = struct.unpack_from("<q", data)[0]
            blobs = data[8 + j + (-(8 + j) % 8):]
            text = fn(data[8:8 + j].decode()).encode()
            data = struct.pack("<q", len(text)) + text + b"\0" * (-(8 + len(text)) % 8) + blobs
        out.append(struct.pack(fmt, t, len(data)) + data)
        pos += 2 * w + n
    return b"".join(out)
