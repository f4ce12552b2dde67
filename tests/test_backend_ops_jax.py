"""Every op test case on the jax backend, against the NumPy result (see backend_suite.py)."""

import pytest

from backend_suite import make_module

pytest.importorskip("jax", reason="the jax engine is an optional extra; make test installs it")

make_module("jax", globals())
