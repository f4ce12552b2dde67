"""Built-in op families. Importing this package announces every built-in op kind to the registry.

Each family module holds its ops' attributes, type rules, kernels and
gradient rules together. Id ranges: const 0, elementwise 1-499,
reductions 500-599, contractions 600-699, shape 700-799, nn 800-899,
linalg 900-999, fused 1000-1099, indexing 1100-1199, signal 1200-1299, control flow 1300-1399,
TensCalc 10001-30002 (ops/tenscalc.py).

A family is imported the first time one of its kinds is looked up (the
table of names, ids and modules is :mod:`opgraph.ops._index`), so ``import
opgraph`` stays light; ``all_ops()`` imports every family.

    >>> from opgraph.core.registry import get_op
    >>> get_op("add").family
    'elementwise'
"""

import importlib

from opgraph.core.registry import defer_ops
from opgraph.ops._index import table

defer_ops(table(), importlib.import_module)
