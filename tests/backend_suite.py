"""The op test suite re-run on one backend: what it claims must give the NumPy result.

As PyTensor's ``compare_jax_and_py`` does, every family test that runs a
one-op graph (``opcheck.run_op``, used by ``check_op`` and directly) runs here
with ``run_op`` wrapped: the plain executor gives the reference, and when the
backend claims the op (``Backend.why_not`` is None for its types), the
backend's executable on the same graph must give the same dtype, shape and
values (tolerance by dtype). Ops the backend does not claim are counted, not
compared: nothing claimed is expected to fail. ``make_module(name)`` builds
the test functions of one test module (``test_backend_ops_<name>.py``);
``options`` (a mapping, or a function of the case's input arrays giving one)
go to the backend's ``compile_graph``.
"""

from __future__ import annotations

import importlib
import os
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import opcheck
import opgraph
from opgraph import backends
from opgraph.backends.base import OpInfo
from opgraph.core.types import TensorType
from opgraph.errors import GraphError
from opgraph.io.jsonfmt import dumps_json

SAMPLE = int(os.environ.get("OPGRAPH_BACKEND_SAMPLE", "1"))
"""Every case runs on every backend by default; OPGRAPH_BACKEND_SAMPLE=k keeps every k-th case of each
parametrised family test (a different offset per test) for a quicker local run."""
FAMILIES = tuple(sorted(p.stem[len("test_ops_"):] for p in Path(__file__).parent.glob("test_ops_*.py")))
_plain_run_op = opcheck.run_op

#: relative tolerance by result dtype: engines use other (vectorised, fused) math libraries than NumPy
RTOL = {"float16": 2e-3, "float32": 2e-5, "float64": 1e-9, "complex64": 2e-5, "complex128": 1e-9}
ATOL = {"float16": 2e-3, "float32": 2e-6, "float64": 1e-11, "complex64": 2e-6, "complex128": 1e-11}
RECENT = 64
"""How many executables of recent graphs one backend's test module keeps for reuse."""


def compare(got: list[Any], want: list[np.ndarray], what: str) -> None:
    """Same count, dtype and shape; values equal (ints, bools) or close by dtype (floats)."""
    assert len(got) == len(want), f"{what}: {len(got)} outputs, NumPy has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, f"{what} output {i}: dtype {g.dtype} != NumPy's {w.dtype}"
        assert g.shape == w.shape, f"{what} output {i}: shape {g.shape} != NumPy's {w.shape}"
        if w.dtype.kind in "fc":
            np.testing.assert_allclose(g, w, rtol=RTOL[w.dtype.name], atol=ATOL[w.dtype.name], equal_nan=True,
                                       err_msg=f"{what} output {i}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{what} output {i}")


def graph_key(graph: opgraph.Graph, options: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """What identifies a compiled executable: the graph's exact JSON text and the options (None: not keyable)."""
    try:
        return dumps_json(graph), repr(sorted((options or {}).items()))
    except (GraphError, TypeError, ValueError):  # a value the JSON form cannot hold: compiled every time
        return None


def claimed(backend: Any, graph: opgraph.Graph) -> str | None:
    """None when the backend claims every op of ``graph``, else why not."""
    from opgraph.core.registry import CONST

    for op in range(graph.num_ops):
        if graph.op_kind[op] != CONST.id:
            why = backend.why_not(OpInfo.of(graph, op))
            if why is not None:
                return why
    return None


Options = Mapping[str, Any] | Callable[[Sequence[np.ndarray]], Mapping[str, Any]]


def make_module(name: str, namespace: dict[str, Any], options: Options | None = None) -> None:
    """Fill a test module's ``namespace`` with the family tests re-run on backend ``name``, compiled with
    ``options`` (e.g. how to chunk the inputs)."""
    counts = {"compared": 0, "not claimed": 0, "reused": 0}
    # A family test often builds the same one-op graph again (contiguous, then non-contiguous inputs, which
    # reach the backend as the same C-ordered arrays): the executable compiled for an identical graph (same
    # JSON text: ops, attributes, types, constants) and options is reused; every call's results are compared.
    recent: OrderedDict[tuple[str, str], Any] = OrderedDict()
    unclaimed: dict[str, str] = {}

    def run_on_backend(kind: str, *arrays: np.ndarray, **attrs: Any) -> list[np.ndarray]:
        want = _plain_run_op(kind, *arrays, **attrs)
        be = backends.get(name)
        b = opgraph.GraphBuilder()
        ins = [b.input(TensorType.of(a)) for a in arrays]
        outs = b.op(kind, *ins, **attrs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        b.output(*outs)
        g = b.freeze()
        why = claimed(be, g)
        if why is not None:
            counts["not claimed"] += 1
            unclaimed.setdefault(kind, why)
            return want
        opts = options(arrays) if callable(options) else options
        key = graph_key(g, opts)
        exe = recent.get(key) if key is not None else None
        if exe is None:
            exe = be.compile_graph(g, **(opts or {}))
            if key is not None:
                recent[key] = exe
                while len(recent) > RECENT:
                    recent.popitem(last=False)
        else:
            counts["reused"] += 1
            recent.move_to_end(key)
        got = [be.to_numpy(x) for x in exe([be.from_numpy(np.array(a, order="C")) for a in arrays])]
        compare(got, want, f"{kind} on {name}")
        counts["compared"] += 1
        return want

    @pytest.fixture(autouse=True)
    def _backend_run_op(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        monkeypatch.setattr(opcheck, "run_op", run_on_backend)
        for fam in FAMILIES:
            mod = importlib.import_module(f"test_ops_{fam}")
            if hasattr(mod, "run_op"):
                monkeypatch.setattr(mod, "run_op", run_on_backend)
        yield

    def test_zz_cases_really_run_on_the_backend() -> None:
        """The wrapped family tests compare on the backend: an op it claims is compared, not passed through."""
        before, reused = counts["compared"], counts["reused"]
        opcheck.check_op("exp", [np.linspace(-1, 1, 6)], np.exp)
        assert counts["compared"] == before + 2  # contiguous and non-contiguous inputs
        assert counts["reused"] == reused + 1  # the same graph twice: compiled once, both calls compared

    namespace["_backend_run_op"] = _backend_run_op
    namespace["test_zz_cases_really_run_on_the_backend"] = test_zz_cases_really_run_on_the_backend
    namespace["counts"] = counts
    namespace["unclaimed"] = unclaimed
    for fam in FAMILIES:
        mod = importlib.import_module(f"test_ops_{fam}")
        for attr in dir(mod):
            obj = getattr(mod, attr)
            if attr.startswith("test_") and callable(obj) and getattr(obj, "__module__", "") == mod.__name__:
                offset = zlib.crc32(obj.__qualname__.encode())
                fn = opcheck.graph_test_copy(obj, lambda i, offset=offset: (i + offset) % SAMPLE == 0)
                if fn is not None:
                    namespace[f"{attr}__{fam}"] = fn
