"""Graph -> Graph optimisation passes and :func:`optimize`, their public entry.

    >>> import numpy as np, opgraph
    >>> from opgraph.passes import optimize
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> y = b.add(b.multiply(x, 1.0), b.multiply(x, 2.0))
    >>> b.output(y)
    >>> g = optimize(b.freeze())
    >>> print(g)
    graph(%x: f64[3]) {
      %1: f64[] = const 2.0
      %2: f64[3] = fma(%x, %1, %x)
      return %2
    }
"""

from opgraph.passes.base import Emitter, PassResult, compact, use_counts
from opgraph.passes.dce import cse, dce
from opgraph.passes.pipeline import LEVELS, OptimizeReport, Pipeline, optimize
from opgraph.passes.rewrite import FOLD_LIMIT, Match, P, Rule, RuleIndex, RuleSet, fold_constants, rewrite
from opgraph.passes.rules import FOLD_AFFINE, FUSE, FUSE_ELEMENTWISE, FUSE_UPDATES, LAYOUT, SIMPLIFY, rule_table

__all__ = [
    "FOLD_AFFINE", "FOLD_LIMIT", "FUSE", "FUSE_ELEMENTWISE", "FUSE_UPDATES", "LAYOUT", "LEVELS", "SIMPLIFY", "Emitter",
    "Match", "OptimizeReport", "P", "PassResult", "Pipeline", "Rule", "RuleIndex", "RuleSet", "compact", "cse", "dce",
    "fold_constants", "optimize", "rewrite", "rule_table", "use_counts",
]
