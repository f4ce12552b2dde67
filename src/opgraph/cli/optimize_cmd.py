"""``opgraph optimize FILE -o OUT [--level N] [--fast-math] [--report]``: optimise a graph file.

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="opgraph")
    >>> sub = parser.add_subparsers(dest="command")
    >>> add_parser(sub, argparse.ArgumentParser(add_help=False))
    >>> parser.parse_args(["optimize", "g.json", "-o", "o.json", "--level", "1"]).level
    1
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any, common: argparse.ArgumentParser) -> None:
    """Add the ``optimize`` subcommand (with ``parents=[common]``)."""
    from opgraph.io.formats import known_suffixes
    from opgraph.passes.pipeline import LEVELS

    p = subparsers.add_parser("optimize", parents=[common],
                              help="optimise a graph (dce, cse, folding, simplification, fusion)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write the optimised graph here, in the format OUT's extension names as 'opgraph convert' "
                        f"does ({' '.join(known_suffixes())}, or no extension for a .cg file set; drawings are "
                        "drawings, see 'opgraph formats'); without it only report")
    p.add_argument("--level", type=int, default=2, choices=sorted(LEVELS),
                   help="; ".join(f"{k}: {v}" for k, v in sorted(LEVELS.items())) + " (default 2)")
    p.add_argument("--fast-math", action="store_true",
                   help="also apply rules that are exact only outside IEEE special cases (x * 0 -> 0, ...)")
    p.add_argument("--report", action="store_true", help="print ops and values before and after, and rule counts")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; returns the exit status."""
    from opgraph.cli.main import UsageError, load_graph, print_table, save_graph
    from opgraph.io.formats import UnknownFormatError, format_for_path
    from opgraph.passes import optimize

    fmt = None
    if args.output:
        try:  # before the (maybe long) optimisation: a misspelt extension is a usage error
            fmt = format_for_path(args.output)
        except UnknownFormatError as exc:
            raise UsageError(str(exc)) from None
        fmt.check_available("saving")
    g = load_graph(args.file)
    rep = optimize(g, level=args.level, fast_math=args.fast_math, report="data")
    if args.output:
        save_graph(rep.graph, args.output)
    if args.report or not args.output:
        rows: list[tuple[str, Any, Any]] = [("ops", rep.ops_before, rep.ops_after),
                                            ("values", rep.values_before, rep.values_after)]
        print_table(f"optimize {args.file} (level {args.level})", ["", "before", "after"], rows)
        if rep.counts:
            print_table("rules fired", ["rule", "times"], sorted(rep.counts.items()))
    if args.output:
        print(f"{args.file} -> {args.output} ({fmt.name if fmt else ''}: {rep.ops_before} -> {rep.ops_after} ops)")
    return 0
