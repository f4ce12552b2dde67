"""ONNX's own backend test suite (shipped in the onnx wheel) run on opgraph's importer.

Every test that opgraph does not pass is listed, with its reason, in
``tests/onnx_backend_xfail.txt``; they run as expected failures, so a test
that starts passing (an unexpected success) fails the run until it is taken
off the list. The few whose outcome depends on the machine (reason starting
with "~") are excluded instead and show as skipped.
``test_onnx_backend_pass_count`` prints the count.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from pathlib import Path

import pytest

onnx_backend_test = pytest.importorskip("onnx.backend.test")

# The suite needs no network; ONNX_HOME points at scratch space for the "light" real models' data.
os.environ.setdefault("ONNX_HOME", tempfile.mkdtemp(prefix="opgraph-onnx-home-"))

from opgraph.io.onnx import backend  # noqa: E402

if os.environ.get("OPGRAPH_ONNX_BACKEND") == "onnxruntime":
    # tools/onnx_failures.py --backend onnxruntime: the peer's count on the same suite, same machine
    import onnxruntime.backend as backend  # type: ignore[no-redef]

XFAIL_FILE = Path(__file__).with_name("onnx_backend_xfail.txt")


def expected_failures() -> dict[str, str]:
    """Test name -> reason, from the expected-failure list."""
    out: dict[str, str] = {}
    reason = ""
    for raw in XFAIL_FILE.read_text().splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            reason = line.lstrip("# ").strip()
            continue
        name, _, why = line.partition("#")
        out[name.strip()] = why.strip() or reason
    return out


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the suite's generators overflow casts on purpose
    _suite = onnx_backend_test.BackendTest(backend, __name__)
XFAIL = expected_failures()
#: Entries whose reason starts with "~" fail or pass depending on the machine (BLAS kernels, SIMD exp): they are
#: excluded (reported as skipped, with the reason) rather than expected to fail, which would be flaky.
MACHINE_DEPENDENT = {name for name, why in XFAIL.items() if why.startswith("~")}
if not os.environ.get("OPGRAPH_ONNX_NO_XFAIL"):  # tools/onnx_failures.py runs them all
    for _name in XFAIL:
        pattern = "^" + re.escape(_name) + "$"
        if _name in MACHINE_DEPENDENT:
            _suite.exclude(pattern)
        else:
            _suite.xfail(pattern)
_cases = _suite.test_cases
for _case in _cases.values():
    # opgraph runs on the CPU only; the CUDA variants are not generated rather than skipped
    for _attr in [a for a in vars(_case) if a.startswith("test_") and a.endswith("_cuda")]:
        delattr(_case, _attr)
globals().update(_cases)
ALL_TESTS = sorted(a for c in _cases.values() for a in vars(c) if a.startswith("test_"))
del _case, _cases


def test_xfail_list_names_real_tests() -> None:
    # A stale entry would hide nothing but would make the count wrong.
    unknown = sorted(set(XFAIL) - set(ALL_TESTS))
    assert not unknown, f"expected failures that are not tests of this onnx version: {unknown[:20]}"
    assert all(XFAIL.values()), "every expected failure needs a reason"


def test_onnx_backend_pass_count() -> None:
    passing = len(ALL_TESTS) - len(XFAIL)
    n_xfail = len(XFAIL) - len(MACHINE_DEPENDENT)
    print(f"\nONNX backend tests: {passing} of {len(ALL_TESTS)} expected to pass ({n_xfail} expected failures, "
          f"{len(MACHINE_DEPENDENT)} machine-dependent ones excluded)")
    assert passing > 0
