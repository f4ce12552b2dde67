"""Every op test case on the dask backend, against the NumPy result (see backend_suite.py), with every
input of two or more elements along an axis split into two chunks along it, so chunked rules really
combine blocks (a reduction's partial results, a matmul's partial products, a slice across a boundary)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from backend_suite import make_module

pytest.importorskip("dask.array", reason="the dask engine is an optional extra; make test installs it")


def halves(shape: Sequence[int]) -> tuple[int, ...]:
    """Chunk sizes splitting each axis of two or more elements into two (uneven for odd lengths)."""
    return tuple(max(1, -(-int(n) // 2)) for n in shape)


def split_inputs(arrays: Sequence[np.ndarray]) -> dict[str, Any]:
    """``compile_graph`` options chunking the suite's inputs (named ``0``, ``1``, ... in its graphs) by halves."""
    return {"chunks": {str(i): halves(np.shape(a)) for i, a in enumerate(arrays)}}


make_module("dask", globals(), split_inputs)
