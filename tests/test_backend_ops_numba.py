"""Every op test case on the numba engine (the register machine), against the NumPy result (see backend_suite.py)."""

import pytest

from backend_suite import make_module

pytest.importorskip("numba", reason="the numba engine is an optional extra (fast); make test installs it")

make_module("numba", globals())
