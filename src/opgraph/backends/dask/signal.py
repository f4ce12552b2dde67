"""The dask engine's rules for signal ops: FFTs along one axis (:func:`~opgraph.backends.dask.blocks.local_rule`).

    >>> from opgraph.backends.dask import BACKEND
    >>> "rfft" in BACKEND.rules
    True
"""

from __future__ import annotations

from opgraph.backends.dask import BACKEND
from opgraph.backends.dask.blocks import along_axis, local_rule

BACKEND.rule("fft", "rfft", "irfft")(local_rule(along_axis))
