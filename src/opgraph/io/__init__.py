"""Reading and writing graphs: the TensCalc .cg binary format and a JSON form.

``save`` and ``load`` choose the format by the path: a path ending in
``.json`` is JSON; anything else names a .cg file set (the base name, or
any of ``.cg``, ``.cgc``, ``.cgio``, ``.cgs``).

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
"""

from __future__ import annotations

import os
from typing import Any

from opgraph.core.graph import Graph

CG_SUFFIXES = (".cg", ".cgc", ".cgio", ".cgs")


def _is_json(path: str | os.PathLike[str]) -> bool:
    return os.fspath(path).lower().endswith(".json")


def save(graph: Graph, path: str | os.PathLike[str], **options: Any) -> None:
    """Save ``graph`` to ``path`` (JSON for ``.json``, else a .cg file set), atomically."""
    if _is_json(path):
        from opgraph.io.jsonfmt import save_json

        save_json(graph, path, **options)
    else:
        from opgraph.io.cg import save_cg

        save_cg(graph, path, **options)


def load(path: str | os.PathLike[str], **options: Any) -> Graph:
    """Load a graph saved by :func:`save` (or written by TensCalc); never executes code."""
    if _is_json(path):
        from opgraph.io.jsonfmt import load_json

        return load_json(path, **options)
    from opgraph.io.cg import load_cg

    return load_cg(path, **options)


__all__ = ["CG_SUFFIXES", "load", "save"]
