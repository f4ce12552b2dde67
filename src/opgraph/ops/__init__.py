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

Adding an op
------------
One op, one place, plus one rule per engine in the engine's module of the
same family (``tests/test_layout.py`` checks that every rule stands there):

1. **Its family module** ``ops/<family>.py``: ``register_op(OpDef(name=,
   id=, arity=, attrs=, infer=, kernel=, grad=, decompose=, family=FAMILY,
   doc=))``. ``infer`` is the type rule (raise ``OpTypeError`` naming what
   is wrong); ``kernel`` is one plain NumPy reference kernel
   ``fn(*arrays, out=None, **attrs)``; ``grad`` the reverse-mode rule,
   written with builder ops; ``decompose`` (optional) the op in more basic
   ops, which lowering and the ONNX exporter use where an engine lacks it.
   Facts about the op are traits in the ``mark_traits`` table at the
   module's end (``view``, ``compute_bound``, ...; see
   :data:`opgraph.core.registry.TRAITS`).
2. **Its id** in :mod:`opgraph.ops._index` (ids are stable: the ``type`` of
   .cg records; never reuse one).
3. **One rule per engine**, each in the module named after the family:
   ``@BACKEND.rule("kind")`` in ``backends/jax/<family>.py`` and
   ``backends/torch/<family>.py`` (a factory ``OpInfo -> callable``), in
   ``backends/dask/<family>.py`` only where the NumPy kernel cannot run
   block by block, ``@EXPORT.rule("kind")`` in
   ``io/onnx/export/<family>.py`` (ONNX Runtime runs what it writes; its
   dtype limits are ``@BACKEND.limit`` in ``backends/onnxruntime.py``),
   and optionally a fast kernel in ``backends/numpy/<family>.py``.
4. **Tests**: a case in ``tests/test_ops_<family>.py`` with
   ``opcheck.check_op`` against NumPy (the op suite re-runs it on every
   engine, ``tests/test_backend_ops_<engine>.py``) and a finite-difference
   gradient check; then ``python tools/gen_ops_doc.py`` rewrites the op and
   op x backend tables.

The smallest case, a user's op with only a reference kernel, runs on the
NumPy engine at once:

    >>> import numpy as np, opgraph
    >>> from opgraph.core.registry import OpDef, register_op
    >>> cube = register_op(OpDef(name="doc_cube3", id=50031, arity=1, infer=lambda ts, a: ts,
    ...                          kernel=lambda x, out=None: np.power(x, 3, out=out), family="user"))
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (2,)), name="x"); b.output(b.op("doc_cube3", x))
    >>> opgraph.compile(b.freeze())(x=np.array([1.0, 2.0]))[0]
    array([1., 8.])
"""

import importlib

from opgraph.core.registry import defer_ops
from opgraph.ops._index import table

defer_ops(table(), importlib.import_module)
