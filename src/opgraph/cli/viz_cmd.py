"""``opgraph viz FILE [-o OUT] [--plan] [--max-ops N] [--format F]``: draw a graph file with Graphviz.

OUT's extension picks the format (svg, png, pdf; ``.dot``/``.gv`` write the DOT
text and need no Graphviz); without ``-o`` the DOT text goes to stdout. ``--plan``
colours values by their memory-plan slot (see :mod:`opgraph.viz`).

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="opgraph")
    >>> sub = parser.add_subparsers(dest="command")
    >>> add_parser(sub, argparse.ArgumentParser(add_help=False))
    >>> args = parser.parse_args(["viz", "g.json", "-o", "g.svg", "--plan", "--max-ops", "50"])
    >>> args.output, args.plan, args.max_ops
    ('g.svg', True, 50)
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    """Add the ``viz`` subcommand (with ``parents=[common]``)."""
    p = subparsers.add_parser("viz", parents=[common], help="draw a graph with Graphviz (svg, png, pdf or dot)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write the drawing here (format from the extension: .svg .png .pdf need the Graphviz "
                        "'dot' binary, .dot/.gv do not); without it print the DOT text")
    p.add_argument("--format", choices=("svg", "png", "pdf", "dot"), help="override the format chosen by OUT")
    p.add_argument("--plan", action="store_true", help="colour values by memory-plan slot (buffer + offset)")
    p.add_argument("--max-ops", type=int, default=300, metavar="N",
                   help="draw at most N ops; the middle of larger graphs is collapsed (default 300)")
    p.add_argument("--rankdir", choices=("TB", "LR", "BT", "RL"), default="TB", help="layout direction (default TB)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; returns the exit status."""
    from opgraph.cli.main import UsageError, load_graph
    from opgraph.viz import render, to_dot

    if args.max_ops < 2:
        raise UsageError("--max-ops must be at least 2")
    graph = load_graph(args.file)
    if not args.output:
        if args.format not in (None, "dot"):
            raise UsageError(f"--format {args.format} needs -o OUT")
        sys.stdout.write(to_dot(graph, plan=True if args.plan else None, max_ops=args.max_ops, rankdir=args.rankdir))
        return 0
    path = render(graph, args.output, format=args.format, plan=True if args.plan else None, max_ops=args.max_ops,
                  rankdir=args.rankdir)
    print(f"{args.file} -> {path} ({graph.num_ops} ops)")
    return 0
