"""The dask engine's rules for linear algebra: each matrix of a batch on its own
(:func:`~opgraph.backends.dask.blocks.local_rule`; ``det`` and ``solve`` run whole, see
:data:`~opgraph.backends.dask.WHOLE`).

    >>> from opgraph.backends.dask import BACKEND
    >>> "inv" in BACKEND.rules, "det" in BACKEND.rules
    (True, False)
"""

from __future__ import annotations

from opgraph.backends.dask import BACKEND
from opgraph.backends.dask.blocks import last_two, local_rule

BACKEND.rule("inv", "cholesky", "pinv")(local_rule(last_two))
