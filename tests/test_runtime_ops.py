"""The compiled runtime on the op test suite: every family test that runs a one-op graph runs here too.

``opcheck.run_op`` (used by ``check_op`` and directly by the family tests) is
wrapped: besides the plain executor it runs the compiled runtime on the same
one-op graph twice, once on the inputs as given and once with each input
copied by a ``cast`` first, so the inputs are planned values the op may
overwrite in place, and checks both give the executor's results. Every case
of every family test runs (``SAMPLE = 1``); tests that never build a graph
are skipped.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import opcheck
import opgraph
from opgraph.core.types import TensorType
from opgraph.runtime.compiled import compile

SAMPLE = 1
FAMILIES = tuple(sorted(p.stem[len("test_ops_"):] for p in Path(__file__).parent.glob("test_ops_*.py")))
_plain_run_op = opcheck.run_op
compiled_checks = {"n": 0}


def _compare(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want), what
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} != {w.dtype}{w.shape}"
        if w.dtype.kind in "fc":
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=0, equal_nan=True, err_msg=what)
        else:
            np.testing.assert_array_equal(g, w, err_msg=what)


def run_both(kind: str, *arrays: np.ndarray, **attrs: Any) -> list[np.ndarray]:
    want = _plain_run_op(kind, *arrays, **attrs)
    for copied in (False, True):
        b = opgraph.GraphBuilder()
        ins = [b.input(TensorType.of(a)) for a in arrays]
        args = [b.op("cast", v, dtype=a.dtype) for v, a in zip(ins, arrays, strict=True)] if copied else ins
        outs = b.op(kind, *args, **attrs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        b.output(*outs)
        f = compile(b.freeze())
        feeds = {v.id: a for v, a in zip(ins, arrays, strict=True)}
        _compare(f(feeds), want, f"{kind} compiled{' (inputs copied)' if copied else ''}")
        _compare(f(feeds), want, f"{kind} compiled, second call")
    compiled_checks["n"] += 1
    return want


@pytest.fixture(autouse=True)
def _compiled_run_op(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(opcheck, "run_op", run_both)
    for fam in FAMILIES:
        mod = importlib.import_module(f"test_ops_{fam}")
        if hasattr(mod, "run_op"):
            monkeypatch.setattr(mod, "run_op", run_both)
    yield


for _fam in FAMILIES:
    _mod = importlib.import_module(f"test_ops_{_fam}")
    for _name in dir(_mod):
        _obj = getattr(_mod, _name)
        if _name.startswith("test_") and callable(_obj) and getattr(_obj, "__module__", "") == _mod.__name__:
            _fn = opcheck.graph_test_copy(_obj, lambda i: i % SAMPLE == 0)
            if _fn is not None:
                globals()[f"{_name}__{_fam}"] = _fn


def test_zz_wrapper_is_used() -> None:
    """The sampled family tests above really went through the compiled runtime."""
    test_ops_elementwise = importlib.import_module("test_ops_elementwise")
    before = compiled_checks["n"]
    opcheck.check_op("exp", [np.linspace(-1, 1, 6)], np.exp)
    assert compiled_checks["n"] > before
    assert test_ops_elementwise.check_op.__module__ == "opcheck"
