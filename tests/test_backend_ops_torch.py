"""Every op test case on the torch backend, against the NumPy result (see backend_suite.py)."""

import pytest

from backend_suite import make_module

pytest.importorskip("torch", reason="the torch engine is an optional extra; make test installs it")

make_module("torch", globals())
