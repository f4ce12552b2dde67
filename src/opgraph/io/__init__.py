"""Reading and writing graphs in every format of :mod:`opgraph.io.formats`.

``save`` and ``load`` choose the format by the path's longest matching
suffix (or ``format=``): ``.json`` is JSON; ``.cg``, ``.cgc``, ``.cgio``,
``.cgs`` or no extension at all name a .cg file set; ``.onnx``,
``.graphml``, the drawings (``.dot``, ``.svg``, ``.png``, ``.pdf``; save
only) and the pickled Python forms (``.dag.pkl``, ``.tdag.pkl``,
``.idag.pkl``, ``.unidag.pkl``, ``.dask.pkl``, ``.pytensor.pkl``). Loading
a pickle needs ``allow_pickle=True``: a pickle can run code when loaded.
An unknown extension is an error listing the known ones.

Both are also top-level names: ``opgraph.save(g, "model.cg")`` and
``g = opgraph.load("model.cg")``. A graph that uses an op of your own
(:func:`opgraph.register_op`) loads only in a process where that op is
registered: import the module that registers it before loading.

    >>> import os, tempfile, numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> b.output(b.exp(x))
    >>> g = b.freeze()
    >>> d = tempfile.mkdtemp()
    >>> save(g, os.path.join(d, "model.cg"))
    >>> load(os.path.join(d, "model")) == g
    True
    >>> save(g, os.path.join(d, "model.json"))
    >>> load(os.path.join(d, "model.json")) == g
    True
    >>> save(g, os.path.join(d, "model.tdag.pkl"))
    >>> load(os.path.join(d, "model.tdag.pkl"), allow_pickle=True) == g
    True
    >>> opgraph.save(g, os.path.join(d, "top.cg"))
    >>> opgraph.load(os.path.join(d, "top.cg")).run(x=np.zeros(3))
    [array([1., 1., 1.])]
"""

from __future__ import annotations

import os
from typing import Any

from opgraph.core.graph import Graph

CG_SUFFIXES = (".cg", ".cgc", ".cgio", ".cgs")


def save(graph: Graph, path: str | os.PathLike[str], *, format: str | None = None, **options: Any) -> None:
    """Save ``graph`` to ``path`` in the format its suffix names (or ``format``), atomically.

    Also available as ``opgraph.save`` (``opgraph.save(g, "model.cg")``).
    ``options`` go to the format's writer (``inline_limit`` for JSON,
    ``index_bits`` for .cg, ``feeds`` for Dask, ``updates="outputs"`` for ONNX
    (a training step's new state as extra outputs), ``plan``/``max_ops``/``rankdir``
    for drawings). A format that cannot hold the graph raises
    :class:`~opgraph.io.formats.UnsupportedGraphError` and writes nothing.

    >>> import os, tempfile, opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (2,)), name="x"); b.output(b.exp(x))
    >>> path = os.path.join(tempfile.mkdtemp(), "model.cg")
    >>> opgraph.save(b.freeze(), path)
    >>> sorted(os.listdir(os.path.dirname(path)))
    ['model.cg', 'model.cgc', 'model.cgio', 'model.cgs', 'model.cgtag']
    >>> b = opgraph.GraphBuilder()
    >>> s = b.input(("int64", ()), name="s")
    >>> b.update(b.add(s, 1), s)
    >>> save(b.freeze(), os.path.join(tempfile.mkdtemp(), "counter.onnx"))
    Traceback (most recent call last):
      ...
    opgraph.io.formats.UnsupportedGraphError: ...counter.onnx: the onnx format cannot hold this graph: ...
    """
    from opgraph.io import formats

    formats.save(graph, path, format=format, **options)


def load(path: str | os.PathLike[str], *, format: str | None = None, allow_pickle: bool = False,
         **options: Any) -> Graph:
    """Load a graph saved by :func:`save` (or written by TensCalc, or an ONNX model).

    Also available as ``opgraph.load`` (``g = opgraph.load("model.cg")``).
    A graph with ops of your own needs them registered first (import the
    module that calls :func:`opgraph.register_op`); otherwise the error names
    the op and says so. Never executes code, except that loading a pickle (``.dag.pkl``, ...,
    ``.pytensor.pkl``) runs whatever the pickle says, so it needs
    ``allow_pickle=True``; drawings cannot be loaded. Other keywords go to
    the format's reader: for an ``.onnx`` file those of
    :func:`opgraph.io.onnx.from_onnx` (``input_shapes=``, ...), and with
    ``weights_as_inputs=True`` the result is its ``(graph, weights)`` pair
    (:class:`opgraph.io.onnx.GraphAndWeights`), not a Graph.

    >>> import os, tempfile, numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (2,)), name="x"); b.output(b.exp(x))
    >>> path = os.path.join(tempfile.mkdtemp(), "model.json")
    >>> opgraph.save(b.freeze(), path)
    >>> opgraph.load(path).run(x=np.zeros(2))
    [array([1., 1.])]
    >>> load("model.svg")
    Traceback (most recent call last):
      ...
    opgraph.io.formats.NotLoadableError: model.svg: svg files are drawings; opgraph writes them but cannot ...
    """
    from opgraph.io import formats

    return formats.load(path, format=format, allow_pickle=allow_pickle, **options)


__all__ = ["CG_SUFFIXES", "load", "save"]
