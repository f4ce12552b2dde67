"""Test configuration: make the shared harness (tests/opcheck.py) importable; shared fixtures."""

import os
import sys
from collections.abc import Iterator

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
# backend="auto" keeps its choices on disk by default: tests neither read a choice an earlier test (or run) made nor
# write to the user's cache; the cache's own tests (tests/test_auto_choice.py) pass cache= a folder of their own
os.environ.setdefault("OPGRAPH_AUTO_CACHE", "0")

from opcheck import RNG_SEED


@pytest.fixture
def rng() -> np.random.Generator:
    """A NumPy generator with the suite's fixed seed."""
    return np.random.default_rng(RNG_SEED)


@pytest.fixture(params=["numpy", "numba"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test on the NumPy passes of the float32 kernels and on their numba loops (arrays of at least
    opgraph.backends.numpy.jit.NUMBA_MIN use the loops once they are loaded)."""
    from opgraph.backends.numpy import elementwise, jit
    from opgraph.core import accel

    saved = accel.enabled
    accel.enabled = request.param == "numba"
    if request.param == "numba":
        pytest.importorskip("numba")
        assert elementwise.compiled(jit.NUMBA_LOAD_MIN) is not None  # load the loops
    yield request.param
    accel.enabled = saved


@pytest.fixture
def body_calls() -> Iterator[dict[str, int]]:
    """Counts the calls of every compiled control-flow body, by body name (wraps hooks.BODY) while the test runs."""
    import opgraph.runtime.bodies  # noqa: F401 - fills the hook for good (a first-use stand-in would replace us)
    from opgraph.core import hooks

    orig = hooks.BODY.get()
    calls: dict[str, int] = {}

    def counting(s: object) -> object:
        run = orig(s)

        def wrapped(args: object) -> object:
            calls[s.name] = calls.get(s.name, 0) + 1  # type: ignore[attr-defined]
            return run(args)
        return wrapped

    hooks.BODY.set(counting)  # type: ignore[arg-type]
    try:
        yield calls
    finally:
        hooks.BODY.set(orig)
