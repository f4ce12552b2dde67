"""The dask engine's rules for neural-network ops: each computed independently along some axes
(:func:`~opgraph.backends.dask.blocks.local_rule`).

    >>> from opgraph.backends.dask import BACKEND
    >>> "conv" in BACKEND.rules
    True
"""

from __future__ import annotations

from opgraph.backends.base import OpInfo
from opgraph.backends.dask import BACKEND
from opgraph.backends.dask.blocks import along_axis, local_rule


def _from_axis(info: OpInfo, rank: int) -> list[int]:
    return list(range(int(info.attrs.get("axis", -1)) % rank, rank))


def _all_but_batch(info: OpInfo, rank: int) -> list[int]:
    return list(range(1, rank))


BACKEND.rule("softmax", "log_softmax")(local_rule(along_axis))
BACKEND.rule("layer_norm")(local_rule(_from_axis))
BACKEND.rule("conv2d", "conv", "conv_transpose", "max_pool2d", "avg_pool2d", "max_pool", "avg_pool", "lp_pool",
             "lrn")(local_rule(_all_but_batch))
