"""Lowering: rewrite ops a backend lacks into ops it has (seed 004's "basic ops" of a backend).

``LOWER`` is a rule set like the optimiser's (:mod:`opgraph.passes.rules`),
each rule exact: it computes the same values with more basic ops.

* fused ops into their parts: ``fma`` -> ``multiply`` + ``add``; ``gelu`` ->
  its erf (or tanh) formula; ``silu``, ``hard_sigmoid``, ``hard_swish`` and
  ``layer_norm`` -> their elementwise formulas and means;
  ``matmul_t`` -> ``permute_dims`` + ``matmul``; ``fused_elementwise`` -> its
  program's ops; the optimiser updates (``sgd_momentum_update``,
  ``adagrad_update``, ``adam_update``, ``adam_update_t``) -> their textbook
  elementwise forms. These rules write each op as its decomposition
  (its ``OpDef.decompose``, registered with the op in its family module), so
  the ONNX exporter writes an op without an ONNX translation the same way;
* contractions into transpose + reshape + matmul (TTGT): two-operand
  ``einsum`` and ``tensordot``; an ``einsum`` of three or more operands first
  into pairwise einsums in the order opt_einsum picks; ``outer`` -> reshape + multiply; ``vecdot``
  -> ``conj`` + ``multiply`` + ``sum``;
* TensCalc's scalar functions (``Ssum``, ``Ssumprod``, the dot forms,
  ``Sdiv``, ``Sexp`` ... ``SDDatan``) into elementwise ops on 0-d operands,
  in the order of TensCalc's C code.

:func:`lower` applies only the rules whose root op the target cannot run
(``can_run(OpInfo) -> bool``), to a fixed point, and never touches its input.

    >>> import opgraph
    >>> from opgraph.passes.lower import lower
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2, 3)), name="x"); y = b.input(("float64", (3, 4)), name="y")
    >>> b.output(b.op("einsum", x, y, subscripts="ij,jk->ik"))
    >>> print(lower(b.freeze(), lambda op: op.kind != "einsum").graph)
    graph(%x: f64[2,3], %y: f64[3,4]) {
      %2: f64[2,4] = matmul(%x, %y)
      return %2
    }
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from opgraph.core.graph import Graph
from opgraph.core.opinfo import OpInfo
from opgraph.core.registry import get_op
from opgraph.core.types import TensorType
from opgraph.passes.base import PassResult, merge_counts
from opgraph.passes.rewrite import Match, P, Rule, RuleSet, rewrite

LOWER = RuleSet()
_EXACT = "exact: the same arithmetic in the same order, written with more basic ops"


def _decomposed(kind: str) -> Callable[[Match], Any]:
    """The replacement that writes op ``kind`` as its decomposition (``get_op(kind).decompose``)."""
    def replace(m: Match) -> Any:
        fn = get_op(kind).decompose  # looked up when the rule fires: the family loads on first use
        return None if fn is None else fn(m.e, m.root_ins, m.root_attrs)
    replace.__name__ = f"decompose_{kind}"
    return replace


def _static(m: Match, *vs: int) -> bool:
    return all(isinstance(t, TensorType) and t.is_static for t in (m.e.type_of(v) for v in vs))


def ttgt(m: Match, a: int, b: int, la: str, lb: str, lo: str) -> int | None:
    """Emit ``einsum(la,lb->lo)(a, b)`` as transposes, reshapes and one (batched) matmul; None if it cannot.

    The plan is :func:`opgraph.ops.contraction.gemm_layout`'s (which the NumPy einsum kernel runs too):
    operands whose labels come in blocks become matrices by a reshape and a 2-D transpose, views a GEMM reads
    without a copy; only what cannot be read so is permuted. A label repeated within one operand (a trace) is
    left to the einsum.
    """
    from opgraph.ops.contraction import GemmOperand, gemm_layout, label_sizes

    e = m.e
    if not _static(m, a, b):
        return None
    ta, tb = e.type_of(a), e.type_of(b)
    size = label_sizes([la, lb], [ta.shape, tb.shape])  # type: ignore[union-attr,list-item]
    layout = None if size is None else gemm_layout(la, lb, lo, size)
    if layout is None:
        return None
    dt = np.dtype(m.root_types[0].dtype)

    def operand(v: int, t: Any, op: GemmOperand) -> int:
        if t.dtype != dt:
            v = e.op("cast", v, dtype=dt)
        if op.sum_axes:
            v = e.op("sum", v, axis=op.sum_axes)
        if op.perm is not None:
            v = e.op("permute_dims", v, axes=op.perm)
        if e.type_of(v).shape != op.shape:  # type: ignore[union-attr]
            v = e.op("reshape", v, shape=op.shape)
        if op.transpose:
            v = e.op("permute_dims", v, axes=(1, 0))
        return v

    x, y = operand(a, ta, layout.a), operand(b, tb, layout.b)
    r = e.op("matmul", *((y, x) if layout.swap else (x, y)))
    if e.type_of(r).shape != layout.result_shape:  # type: ignore[union-attr]
        r = e.op("reshape", r, shape=layout.result_shape)
    if layout.result_perm is not None:
        r = e.op("permute_dims", r, axes=layout.result_perm)
    return r  # type: ignore[no-any-return]


def _einsum(m: Match) -> int | None:
    from opgraph.ops.contraction import einsum_signature

    if len(m.root_ins) != 2 or not _static(m, *m.root_ins):
        return None
    types = [m.e.type_of(v) for v in m.root_ins]
    explicit, _ = einsum_signature(m.root_attrs["subscripts"], [t.shape for t in types])  # type: ignore[union-attr]
    if "." in explicit:
        return None
    lhs, lo = explicit.split("->")
    la, lb = lhs.split(",")
    return ttgt(m, *m.root_ins, la, lb, lo)


def split_einsum(m: Match) -> int | None:
    """An einsum of 3+ operands -> a chain of pairwise einsums along opt_einsum's path (None if it cannot).

    The steps are :func:`opgraph.ops.contraction.einsum_steps`, the ones the NumPy einsum kernel runs. Shared by
    the optimiser's layout rules and by lowering, where each pairwise step then becomes TTGT.
    """
    from opgraph.ops.contraction import einsum_steps

    ins = list(m.root_ins)
    types = [m.e.type_of(v) for v in ins]
    if len(ins) < 3 or not all(isinstance(t, TensorType) and t.is_static for t in types):
        return None
    subs, optimize = m.root_attrs["subscripts"], m.root_attrs["optimize"]
    if "..." in subs:
        return None
    dt = np.result_type(*(t.dtype for t in types))  # type: ignore[union-attr]
    # The einsum kernel casts operands to the common dtype first; so does the chain.
    ops = [v if m.e.type_of(v).dtype == dt else m.e.op("cast", v, dtype=dt) for v in ins]  # type: ignore[union-attr]
    for inds, eq, _ in einsum_steps(subs, tuple(t.shape for t in types), optimize):  # type: ignore[union-attr]
        tmp = [ops.pop(i) for i in inds]
        ops.append(m.e.op("einsum", *tmp, subscripts=eq, optimize=optimize))
    (out,) = ops
    return out


def _tensordot(m: Match) -> int | None:
    from opgraph.ops.contraction import tensordot_subscripts

    a, b = m.root_ins
    if not _static(m, a, b):
        return None
    ta, tb = m.e.type_of(a), m.e.type_of(b)
    ra, rb = len(ta.shape), len(tb.shape)  # type: ignore[union-attr,arg-type]
    return ttgt(m, a, b, *tensordot_subscripts(m.root_attrs["axes"], ra, rb))


def _outer(m: Match) -> int:
    a, b = m.root_ins
    dt = m.root_types[0].dtype
    e = m.e
    a2 = e.op("reshape", a, shape=(-1, 1))
    b2 = e.op("reshape", b, shape=(1, -1))
    r = e.op("multiply", a2, b2)
    return r if e.type_of(r).dtype == dt else e.op("cast", r, dtype=dt)  # type: ignore[union-attr,no-any-return]


def _vecdot(m: Match) -> int | None:
    a, b = m.root_ins
    e = m.e
    if e.type_of(a).dtype.kind == "c":  # type: ignore[union-attr]
        a = e.op("conj", a)
    return e.op("sum", e.op("multiply", a, b), axis=m.root_attrs["axis"])  # type: ignore[no-any-return]


LOWER.add(
    Rule("lower.fma", P("fma"), _decomposed("fma"), exact=_EXACT + " (fma is two roundings, as unfused)"),
    Rule("lower.silu", P("silu"), _decomposed("silu"),
         exact="x * sigmoid(x): the same function, the backend's rounding"),
    Rule("lower.hard_sigmoid", P("hard_sigmoid"), _decomposed("hard_sigmoid"),
         exact="clip(alpha * x + beta, 0, 1), ONNX's HardSigmoid formula: the kernel's arithmetic"),
    Rule("lower.hard_swish", P("hard_swish"), _decomposed("hard_swish"),
         exact="clip(x + 3, 0, 6) * x * (1/6): the kernel's arithmetic in its order"),
    Rule("lower.layer_norm", P("layer_norm"), _decomposed("layer_norm"),
         exact="ONNX's LayerNormalization body (mean, centred square mean, divide by sqrt(var + eps)): the same "
               "function; the kernel multiplies by 1 / sqrt(...) and sums rows by BLAS (rounding may differ)"),
    Rule("lower.gelu", P("gelu"), _decomposed("gelu"),
         exact="the textbook formula (ONNX's Gelu decomposition): the same function, not the same rounding as the "
               "gelu kernel (see its doc)"),
    Rule("lower.matmul_t", P("matmul_t"), _decomposed("matmul_t"), exact=_EXACT),
    Rule("lower.fused_elementwise", P("fused_elementwise"), _decomposed("fused_elementwise"), exact=_EXACT),
    Rule("lower.sgd_momentum_update", P("sgd_momentum_update"), _decomposed("sgd_momentum_update"), exact=_EXACT),
    Rule("lower.adagrad_update", P("adagrad_update"), _decomposed("adagrad_update"), exact=_EXACT),
    Rule("lower.adam_update", P("adam_update"), _decomposed("adam_update"), exact=_EXACT),
    Rule("lower.adam_update_t", P("adam_update_t"), _decomposed("adam_update_t"), exact=_EXACT),
    Rule("lower.einsum_ttgt", P("einsum"), _einsum,
         exact="the same products; the sums run in the matmul's order instead of einsum's (rounding may differ)"),
    Rule("lower.einsum_pairwise", P("einsum"), split_einsum, where=lambda m: len(m.root_ins) >= 3,
         exact="the pairwise contractions opt_einsum's path gives, which the einsum kernel runs (same results); "
               "each step is then a two-operand einsum for lower.einsum_ttgt"),
    Rule("lower.tensordot_ttgt", P("tensordot"), _tensordot,
         exact="the same products; the sums run in the matmul's order (rounding may differ)"),
    Rule("lower.outer", P("outer"), _outer, exact=_EXACT),
    Rule("lower.vecdot", P("vecdot"), _vecdot,
         exact="the same products; the sum runs in the reduction's order (rounding may differ)"),
)


# ---------------------------------------------------------------- TensCalc's scalar functions (20001-20032)
# Each operand is a scalar (a size-1 array that the NumPy kernel reads as 0-d): it is reshaped to 0-d, which
# fails loudly at run time on a non-scalar operand instead of broadcasting differently. The arithmetic follows
# the C code TensCalc emits (the NumPy kernels' order, left to right), so the lowered graph gives the same bits.
def _scalars(m: Match, vs: Any) -> list[int]:
    return [m.e.op("reshape", v, shape=()) for v in vs]


def _f64(m: Match, x: float) -> int:
    return m.e.constant(np.asarray(x, dtype=np.float64))  # type: ignore[no-any-return]


def _dot_chain(m: Match, ops: list[int]) -> int:
    acc = None
    for i in range(0, len(ops), 2):
        t = m.e.op("multiply", ops[i], ops[i + 1])
        acc = t if acc is None else m.e.op("add", acc, t)
    return acc  # type: ignore[return-value]


def _const_ints(m: Match, v: int) -> list[int] | None:
    c = m.e.const_value(v)
    if c is None:
        return None
    a = np.asarray(c).reshape(-1, order="F")
    if a.dtype.kind == "f" and not np.all(a == np.round(a)):
        return None
    return [int(x) for x in a.tolist()]


def _ssum(m: Match) -> int | None:
    signs = _const_ints(m, m.root_ins[0])
    ops = _scalars(m, m.root_ins[1:])
    if signs is None or len(signs) != len(ops) or not ops:
        return None
    acc = None
    for sign, a in zip(signs, ops, strict=True):
        if acc is None:
            acc = a if sign > 0 else m.e.op("negative", a)
        else:
            acc = m.e.op("add" if sign > 0 else "subtract", acc, a)
    return acc


def _ssumprod(m: Match) -> int | None:
    p = _const_ints(m, m.root_ins[0])
    ops = _scalars(m, m.root_ins[1:])
    if p is None or len(p) != 2 or p[0] < 1 or p[1] < 1 or p[0] * p[1] != len(ops):
        return None
    k, acc = p[0], None
    for j in range(p[1]):
        prod = ops[j * k]
        for a in ops[j * k + 1:(j + 1) * k]:
            prod = m.e.op("multiply", prod, a)
        acc = prod if acc is None else m.e.op("add", acc, prod)
    return acc


def _pairs_ok(ops: list[int], lead: int) -> bool:
    return len(ops) >= lead and (len(ops) - lead) % 2 == 0


def _sminus_dot(m: Match) -> int | None:
    ops = _scalars(m, m.root_ins)
    return m.e.op("negative", _dot_chain(m, ops)) if ops and _pairs_ok(ops, 0) else None


def _sminus_dot_div(m: Match) -> int | None:
    ops = _scalars(m, m.root_ins)
    if len(ops) < 3 or not _pairs_ok(ops, 1):
        return None
    return m.e.op("divide", m.e.op("negative", _dot_chain(m, ops[1:])), ops[0])  # type: ignore[no-any-return]


def _splus_minus_dot(m: Match) -> int | None:
    ops = _scalars(m, m.root_ins)
    if len(ops) < 3 or not _pairs_ok(ops, 1):
        return None
    return m.e.op("subtract", ops[0], _dot_chain(m, ops[1:]))  # type: ignore[no-any-return]


def _splus_minus_dot_div(m: Match) -> int | None:
    ops = _scalars(m, m.root_ins)
    if len(ops) < 4 or not _pairs_ok(ops, 2):
        return None
    return m.e.op("divide", m.e.op("subtract", ops[0], _dot_chain(m, ops[2:])), ops[1])  # type: ignore[no-any-return]


def _splus_sqr(m: Match) -> int | None:
    ops = _scalars(m, m.root_ins)
    return _dot_chain(m, [a for a in ops for _ in (0, 1)]) if ops else None


def _sdiv(m: Match) -> int | None:
    if len(m.root_ins) != 2:
        return None
    a, b = _scalars(m, m.root_ins)
    return m.e.op("divide", a, b)  # type: ignore[no-any-return]


_TENSCALC_UNARY: dict[str, Callable[[Match, int], int]] = {
    "Sexp": lambda m, a: m.e.op("exp", a),
    "Slog": lambda m, a: m.e.op("log", a),
    "Scos": lambda m, a: m.e.op("cos", a),
    "Sminus_cos": lambda m, a: m.e.op("negative", m.e.op("cos", a)),
    "Ssin": lambda m, a: m.e.op("sin", a),
    "Sminus_sin": lambda m, a: m.e.op("negative", m.e.op("sin", a)),
    "Sabs": lambda m, a: m.e.op("abs", a),
    "Ssqrt": lambda m, a: m.e.op("sqrt", a),
    "SDsqrt": lambda m, a: m.e.op("multiply", _f64(m, 0.5), m.e.op("power", a, _f64(m, -0.5))),
    "SDDsqrt": lambda m, a: m.e.op("multiply", _f64(m, -0.25), m.e.op("power", a, _f64(m, -1.5))),
    "Ssqr": lambda m, a: m.e.op("multiply", a, a),
    "S2times": lambda m, a: m.e.op("multiply", _f64(m, 2.0), a),
    "Satan": lambda m, a: m.e.op("atan", a),
    "SDatan": lambda m, a: m.e.op("divide", _f64(m, 1.0), m.e.op("add", _f64(m, 1.0), m.e.op("multiply", a, a))),
    "SDDatan": lambda m, a: _ddatan(m, a),
    "Sinv": lambda m, a: m.e.op("divide", _f64(m, 1.0), a),
    "Sminus_inv_sqr": lambda m, a: m.e.op("divide", _f64(m, -1.0), m.e.op("multiply", a, a)),
}


def _ddatan(m: Match, a: int) -> int:
    d = m.e.op("add", _f64(m, 1.0), m.e.op("multiply", a, a))
    return m.e.op("divide", m.e.op("divide", m.e.op("multiply", _f64(m, -2.0), a), d), d)  # type: ignore[no-any-return]


def _tenscalc_unary(fn: Callable[[Match, int], int]) -> Callable[[Match], int | None]:
    def replace(m: Match) -> int | None:
        if len(m.root_ins) != 1 or m.root_attrs.get("nout", 1) != 1:
            return None
        return fn(m, _scalars(m, m.root_ins)[0])
    return replace


_TC_EXACT = "exact: the operations of TensCalc's C code (the NumPy kernel's), on 0-d float64 operands"
LOWER.add(
    Rule("lower.Ssum", P("Ssum"), _ssum, exact=_TC_EXACT),
    Rule("lower.Ssumprod", P("Ssumprod"), _ssumprod, exact=_TC_EXACT),
    Rule("lower.Sminus_dot", P("Sminus_dot"), _sminus_dot, exact=_TC_EXACT),
    Rule("lower.Sminus_dot_div", P("Sminus_dot_div"), _sminus_dot_div, exact=_TC_EXACT),
    Rule("lower.Splus_minus_dot", P("Splus_minus_dot"), _splus_minus_dot, exact=_TC_EXACT),
    Rule("lower.Splus_minus_dot_div", P("Splus_minus_dot_div"), _splus_minus_dot_div, exact=_TC_EXACT),
    Rule("lower.Splus_sqr", P("Splus_sqr"), _splus_sqr, exact=_TC_EXACT),
    Rule("lower.Sdiv", P("Sdiv"), _sdiv, exact=_TC_EXACT),
    *(Rule(f"lower.{k}", P(k), _tenscalc_unary(f), exact=_TC_EXACT) for k, f in _TENSCALC_UNARY.items()),
)


def _info(m: Match) -> OpInfo:
    return OpInfo(get_op(m.root_kind).name, m.root_attrs, tuple(m.e.type_of(v) for v in m.root_ins),
                   tuple(m.root_types))


def lower(graph: Graph, can_run: Callable[[Any], bool], *, rules: RuleSet | None = None,
          max_rounds: int = 4) -> PassResult:
    """Rewrite the ops ``can_run`` refuses with the lowering rules (to a fixed point); see the module doc."""
    chosen = RuleSet()
    for r in rules or LOWER:
        inner = r.where
        chosen.add(Rule(r.name, r.pattern, r.replace, r.exact, r.flag,
                        where=lambda m, inner=inner: not can_run(_info(m)) and (inner is None or inner(m)),
                        index=r.index))
    counts: dict[str, int] = {}
    g = graph
    for _ in range(max_rounds):
        res = rewrite(g, chosen, refine=True)
        if not res.counts:
            break
        merge_counts(counts, res.counts)
        g = res.graph
    return PassResult(g, counts)
