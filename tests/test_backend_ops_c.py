"""Every op test case on the c engine, against the NumPy result (see backend_suite.py).

The cases run on the engine's one compiled interpreter (``embed=False``: the same C interpreter that big
programs embed, compiled once for the module rather than once per case, since a compiler run per case would
cost minutes); straight-line code is checked opcode by opcode in test_backend_c.py."""

import pytest

from backend_suite import make_module
from opgraph import backends

_why = backends.get("c").unavailable_reason()
if _why:
    pytest.skip(f"the c engine needs a C compiler: {_why}", allow_module_level=True)

make_module("c", globals(), options={"embed": False})
