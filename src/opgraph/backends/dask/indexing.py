"""The dask engine's rules for indexing ops: triangles of each matrix
(:func:`~opgraph.backends.dask.blocks.local_rule`).

    >>> from opgraph.backends.dask import BACKEND
    >>> "trilu" in BACKEND.rules
    True
"""

from __future__ import annotations

from opgraph.backends.dask import BACKEND
from opgraph.backends.dask.blocks import last_two, local_rule

BACKEND.rule("trilu")(local_rule(last_two))
