"""Building blocks for gradient rules: a re-export of :mod:`opgraph.ops.grad_helpers`.

The helpers moved to ``opgraph.ops`` because the op families' gradient rules use them and ops
sit below autodiff in the layers (DESIGN.md); this module keeps the older import path working.

    >>> from opgraph.autodiff.helpers import no_grad
    >>> no_grad(None, [1, 2], [3], [None], {})
    [None, None]
"""

from opgraph.ops.grad_helpers import (
    broadcast_like,
    dilate,
    expand_reduced,
    eye,
    is_float,
    mask,
    no_grad,
    rank,
    reduced_count,
    scalar,
    static_shape,
    swap_last,
    unbroadcast,
    zeros_like,
)

__all__ = ["broadcast_like", "dilate", "expand_reduced", "eye", "is_float", "mask", "no_grad", "rank",
           "reduced_count", "scalar", "static_shape", "swap_last", "unbroadcast", "zeros_like"]
