"""Every op test case on the c engine (the register machine as compiled C), against the NumPy result (see
backend_suite.py). Compiled programs are cached on disk by their C source, so a rerun compiles nothing."""

import pytest

from backend_suite import make_module
from opgraph import backends

_why = backends.get("c").unavailable_reason()
if _why:
    pytest.skip(f"the c engine needs a C compiler: {_why}", allow_module_level=True)

make_module("c", globals())
