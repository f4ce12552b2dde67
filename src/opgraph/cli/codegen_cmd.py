"""``opgraph codegen FILE -o out.c``: a graph file as standalone C99 (see :mod:`opgraph.backends.c.codegen`).

Writes ``out.c`` and its header (``--header``, default ``out.h`` beside it) and prints one line per file
written. The entry points: one per ``get`` gateway of a .cg file set (TensCalc's ``cmex2compute`` has one
per get), named ``NAME_<gateway>``; otherwise one, ``NAME_run``, computing the graph's outputs.
``--targets ENTRY=V1,V2,...`` (repeatable) chooses them instead (values by name or id); ``--targets outputs``
asks for the single entry. Inputs whose type has no shape (TensCalc's) take one from
``--input-shape NAME=D1,D2,...``, NAME an input's name or its set gateway's.

    >>> import argparse
    >>> parser = argparse.ArgumentParser(); sub = parser.add_subparsers()
    >>> add_parser(sub, argparse.ArgumentParser(add_help=False))
    >>> parser.parse_args(["codegen", "g.json", "-o", "g.c", "--targets", "get_y=y"]).targets
    ['get_y=y']
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from typing import Any


def _cmd_codegen(args: argparse.Namespace) -> int:
    from opgraph.backends.c.codegen import STRAIGHT_LINE_MAX, generate_c
    from opgraph.cli.main import UsageError, load_graph
    from opgraph.core.atomic import atomic_files

    c_path = args.output
    h_path = args.header or os.path.splitext(c_path)[0] + ".h"
    if os.path.abspath(h_path) == os.path.abspath(c_path):
        raise UsageError(f"the header and the C file are both {c_path!r}")
    name = args.name or _identifier(os.path.splitext(os.path.basename(c_path))[0])
    graph = load_graph(args.file)
    targets = _targets(graph, args.targets)
    shapes = _input_shapes(graph, args.input_shape)
    limit = STRAIGHT_LINE_MAX if args.straight_line_max is None else args.straight_line_max
    source, header = generate_c(graph, name=name, input_shapes=shapes, straight_line_max=limit, targets=targets)
    entries = sorted(targets) if targets else [None]
    with atomic_files([c_path, h_path]) as (fc, fh):
        fc.write(source.encode())
        fh.write(header.encode())
    what = ", ".join(f"{name}_{e}_run" if e else f"{name}_run" for e in entries)
    print(f"wrote {c_path} ({len(source):,} bytes: {what})")
    print(f"wrote {h_path} ({len(header):,} bytes)")
    return 0


def _identifier(stem: str) -> str:
    """A C identifier from a file name (``my-model.c`` -> ``my_model``).

    >>> _identifier("my-model"), _identifier("2x")
    ('my_model', '_2x')
    """
    name = re.sub(r"\W", "_", stem, flags=re.ASCII) or "opgraph_program"
    return "_" + name if name[0].isdigit() else name


def _targets(graph: Any, items: Sequence[str] | None) -> dict[str, list[int]] | None:
    """The entry points: ``--targets`` as given, else the .cg file's get gateways (None: one, the outputs)."""
    from opgraph.cli.main import UsageError
    from opgraph.core.feeds import value_id

    if items == ["outputs"]:
        return None
    if items:
        out: dict[str, list[int]] = {}
        for item in items:
            entry, sep, names = item.partition("=")
            if not sep or not entry or not names:
                raise UsageError(f"--targets expects ENTRY=V1,V2,... (or 'outputs'), got {item!r}")
            out[entry] = [value_id(graph, v.strip()) for v in names.split(",") if v.strip()]
        return out
    from opgraph.io.cg import gateways

    gets = {gw.name: list(gw.values) for gw in gateways(graph) if gw.kind == "get" and gw.name}
    return gets or None


def _input_shapes(graph: Any, items: Sequence[str] | None) -> list[tuple[int, ...] | None] | None:
    """``--input-shape NAME=D1,...`` as one shape (or None) per input, in order; NAME an input or its set
    gateway."""
    from opgraph.cli.main import UsageError, _input_shape
    from opgraph.core.feeds import value_id

    if not items:
        return None
    by_gateway: dict[str, int] = {}
    if graph.symbols.io:
        from opgraph.io.cg import gateways

        by_gateway = {gw.name: gw.values[0] for gw in gateways(graph)
                      if gw.kind == "set" and gw.name and len(gw.values) == 1}
    position = {int(v): i for i, v in enumerate(graph.inputs.tolist())}
    shapes: list[tuple[int, ...] | None] = [None] * len(position)
    for item in items:
        key, shape = _input_shape(item)
        v = by_gateway[key] if key in by_gateway else value_id(graph, key)
        if v not in position:
            raise UsageError(f"--input-shape {item!r}: {key!r} is not an input of the graph")
        shapes[position[v]] = shape
    return shapes


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``codegen`` to the ``opgraph`` command's subparsers."""
    p = sub.add_parser("codegen", parents=[common], help="write a graph as standalone C99 (a .c file and a header)",
                       description="Write FILE's computation as standalone C99: the register machine's program "
                                   "as straight-line code (small programs) or as static arrays and a small "
                                   "interpreter; one entry point per get gateway of a .cg file set.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("-o", "--output", required=True, metavar="OUT.c", help="the C file to write")
    p.add_argument("--header", metavar="OUT.h", help="the header to write (default: OUT.c with .h)")
    p.add_argument("--name", metavar="NAME", help="prefix of the C names (default: OUT.c's stem)")
    p.add_argument("--targets", action="append", metavar="ENTRY=V1,V2,...",
                   help="one entry point NAME_ENTRY_run computing these values (repeatable; default: the .cg "
                        "file's get gateways, else one entry NAME_run for the outputs; 'outputs' forces that)")
    p.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                   help="the shape of an input whose type has none (TensCalc's files; NAME: the input or its "
                        "set gateway; repeatable)")
    p.add_argument("--straight-line-max", type=int, metavar="N",
                   help="write programs of at most N instructions as straight-line code (default 2000), "
                        "bigger ones as arrays and an interpreter")
    p.set_defaults(func=_cmd_codegen)
