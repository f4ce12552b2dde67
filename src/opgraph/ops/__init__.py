"""Built-in op families. Importing this package registers every built-in op kind.

Each family module holds its ops' attributes, type rules, kernels (and,
later, gradient rules) together. Id ranges: const 0, elementwise 1-499,
reductions 500-599, contractions 600-699, shape 700-799, nn 800-899,
linalg 900-999, fused 1000-1099, indexing 1100-1199, signal 1200-1299, TensCalc 10001-30002 (ops/tenscalc.py).

    >>> from opgraph.core.registry import get_op
    >>> get_op("add").family
    'elementwise'
"""

from opgraph.ops import (  # noqa: F401
    contraction,
    elementwise,
    fused,
    indexing,
    linalg,
    nn,
    reduction,
    shape,
    signal,
    tenscalc,
)
