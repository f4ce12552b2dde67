"""Every op test case on the onnxruntime backend, against the NumPy result (see backend_suite.py)."""

import pytest

from backend_suite import make_module

pytest.importorskip("onnxruntime", reason="the onnxruntime engine is an optional extra; make test installs it")

make_module("onnxruntime", globals())
