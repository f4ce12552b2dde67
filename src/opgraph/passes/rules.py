"""The built-in rules: algebraic simplification and fusion, each with its exactness condition.

Every rule is a :class:`~opgraph.passes.rewrite.Rule` in one of three sets:

* ``SIMPLIFY``: identities (x + 0, x * 1, double negation, transpose of
  transpose, ...). A rule that is exact only outside IEEE special cases
  (x * 0 is not 0 for inf or nan) runs for integers and bools, or for
  floats only with the ``fast_math`` flag.
* ``FUSE_UPDATES``: optimiser update patterns (SGD with momentum, Adagrad,
  Adam) written as plain elementwise ops, fused into one multi-output op.
* ``FUSE``: fused multiply-add and transposes absorbed into matmul.

The engine rejects any replacement whose types differ from the replaced
value's, so rules need not re-check broadcasting or dtype promotion.

    >>> [r.name for r in SIMPLIFY if r.pattern.kind == 201][:3]   # rules rooted at subtract
    ['subtract_zero', 'subtract_neg', 'subtract_self']
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opgraph.core.types import TensorType
from opgraph.passes.rewrite import FOLD_LIMIT, Match, P, Rule, RuleSet

X, Y = P.var("x"), P.var("y")


def _is_int(t: Any) -> bool:
    return isinstance(t, TensorType) and t.dtype.kind in "biu"


def _all(pred: Any) -> Any:
    def check(a: np.ndarray) -> bool:
        return a.size > 0 and bool(np.all(pred(a)))
    return check


zero = _all(lambda a: a == 0)
one = _all(lambda a: a == 1)
neg_zero = _all(lambda a: (a == 0) & np.signbit(a) if a.dtype.kind == "f" else a == 0)
pos_zero = _all(lambda a: (a == 0) & ~np.signbit(a) if a.dtype.kind == "f" else a == 0)


def _scalar(a: np.ndarray) -> bool:
    return a.size == 1


def _zeros_like(m: Match) -> int | None:
    (t,) = m.root_types
    if not (isinstance(t, TensorType) and t.is_static):
        return None
    if t.size <= FOLD_LIMIT:
        return m.e.constant(np.zeros(t.shape, dtype=t.dtype))
    return m.e.op("broadcast_to", m.e.constant(np.zeros((), dtype=t.dtype)), shape=t.shape)


def _ints_or_fast(m: Match) -> bool:
    return _is_int(m.root_types[0]) or "fast_math" in m.flags


SIMPLIFY = RuleSet()
SIMPLIFY.add(
    Rule("add_zero", P("add", X, P.const("c", zero)), lambda m: m["x"],
         exact="x + (-0.0) == x always; x + 0 == x for integers and bools; for floats x + (+0.0) turns -0.0 "
               "into +0.0, so +0.0 needs a float x only with fast_math",
         where=lambda m: _is_int(m.type("x")) or neg_zero(m.const("c")) or "fast_math" in m.flags),
    Rule("add_neg", P("add", X, P("negative", Y)), lambda m: m.op("subtract", "x", "y"),
         exact="always: IEEE defines x - y as x + (-y) (up to a NaN's sign bit, which IEEE leaves unspecified)"),
    Rule("subtract_zero", P("subtract", X, P.const("c", zero)), lambda m: m["x"],
         exact="x - (+0.0) == x always (including -0.0); x - (-0.0) only with fast_math",
         where=lambda m: _is_int(m.type("x")) or pos_zero(m.const("c")) or "fast_math" in m.flags),
    Rule("subtract_neg", P("subtract", X, P("negative", Y)), lambda m: m.op("add", "x", "y"),
         exact="always: x - (-y) == x + y in IEEE arithmetic (up to a NaN's sign bit)"),
    Rule("subtract_self", P("subtract", X, X), _zeros_like,
         exact="integers only (inf - inf and nan - nan are nan); floats with fast_math", where=_ints_or_fast),
    Rule("multiply_one", P("multiply", X, P.const("c", one)), lambda m: m["x"],
         exact="always: x * 1 == x for every x, nan, inf and -0.0 included"),
    Rule("multiply_zero", P("multiply", X, P.const("c", zero)), _zeros_like,
         exact="integers and bools only (inf * 0 is nan, -1.0 * 0 is -0.0); floats with fast_math",
         where=_ints_or_fast),
    Rule("zero_divide", P("divide", P.const("c", zero), X), _zeros_like,
         exact="never for floats (0/0 and 0/nan are nan, 0/-x is -0.0): fast_math only (Owl's 0/x)",
         flag="fast_math"),
    Rule("zero_floor_divide", P("floor_divide", P.const("c", zero), X), _zeros_like,
         exact="integers always (NumPy's integer 0 // 0 is 0); floats only with fast_math",
         where=_ints_or_fast),
    Rule("divide_one", P("divide", X, P.const("c", one)), lambda m: m["x"],
         exact="always: x / 1 == x (divide of integers gives floats, so the type check keeps it for floats)"),
    Rule("power_one", P("power", X, P.const("c", one)), lambda m: m["x"],
         exact="always: pow(x, 1) == x (IEEE 754 pow; NumPy integer power)"),
    Rule("negative_negative", P("negative", P("negative", X)), lambda m: m["x"],
         exact="always: negation only flips the sign (wraps consistently for integers)"),
    Rule("positive", P("positive", X), lambda m: m["x"], exact="always: a copy"),
    Rule("copy", P("copy", X), lambda m: m["x"],
         exact="always: values are immutable, so a copy is the same value"),
    Rule("abs_abs", P("abs", P("abs", X)), lambda m: m.op("abs", "x"), exact="always"),
    Rule("logical_not_not", P("logical_not", P("logical_not", X, where=lambda t: t.dtype == np.bool_)),
         lambda m: m["x"], exact="always for bools (the type check rejects other dtypes)"),
    Rule("cast_same", P("cast", X), lambda m: m["x"], exact="always: a cast to the same dtype is the identity"),
    Rule("log_exp", P("log", P("exp", X)), lambda m: m["x"], flag="fast_math",
         exact="not exact: exp rounds and overflows (log(exp(1000.0)) is inf); fast_math only"),
    Rule("exp_log", P("exp", P("log", X)), lambda m: m["x"], flag="fast_math",
         exact="not exact, and wrong for x <= 0 (nan, 0 gives 0 only by luck); fast_math only"),
)


def _perm(axes: tuple[int, ...] | None, rank: int) -> tuple[int, ...]:
    return tuple(range(rank))[::-1] if axes is None else tuple(a % rank for a in axes)


def _transpose_transpose(m: Match) -> int | None:
    t = m.type("x")
    if not isinstance(t, TensorType) or t.rank is None:
        return None
    rank = t.rank
    inner = _perm(m.attrs("inner")["axes"], rank)
    outer = _perm(m.root_attrs["axes"], rank)
    composed = tuple(inner[a] for a in outer)
    if composed == tuple(range(rank)):
        return m["x"]
    return m.op("permute_dims", "x", axes=composed)


def _same_shape(m: Match) -> bool:
    t, (r,) = m.type("x"), m.root_types
    return isinstance(t, TensorType) and t.is_static and t == r


def _identity_perm(m: Match) -> bool:
    t = m.type("x")
    return _same_shape(m) and _perm(m.root_attrs["axes"], t.rank) == tuple(range(t.rank))


SIMPLIFY.add(
    Rule("transpose_transpose", P("permute_dims", P("permute_dims", X, name="inner")), _transpose_transpose,
         exact="always: data movement only"),
    Rule("transpose_identity", P("permute_dims", X), lambda m: m["x"], where=_identity_perm,
         exact="always, when the permutation is the identity (checked: same type and "
               "axes are 0..n-1)"),
    Rule("reshape_same", P("reshape", X), lambda m: m["x"], where=_same_shape,
         exact="always: reshape to the shape x already has"),
    Rule("reshape_reshape", P("reshape", P("reshape", X)),
         lambda m: m.op("reshape", "x", shape=m.root_attrs["shape"]), exact="always: data movement only"),
    Rule("broadcast_same", P("broadcast_to", X), lambda m: m["x"], where=_same_shape,
         exact="always: broadcast to the shape x already has"),
)

def _reduce_size_one(m: Match) -> int | None:
    t = m.type("x")
    (r,) = m.root_types
    if not (isinstance(t, TensorType) and t.is_static and isinstance(r, TensorType)):
        return None
    axes = m.root_attrs["axis"]
    axes = tuple(range(t.rank)) if axes is None else tuple(a % t.rank for a in axes)  # type: ignore[operator]
    if not all(t.shape[a] == 1 for a in axes):  # type: ignore[index]
        return None
    v = m["x"]
    if r.shape != t.shape:
        v = m.e.op("reshape", v, shape=r.shape)
    if r.dtype != t.dtype:
        v = m.e.op("cast", v, dtype=r.dtype)
    return v


for _kind in ("prod", "max", "min"):
    SIMPLIFY.add(Rule(f"{_kind}_size_one", P(_kind, X), _reduce_size_one,
                      exact=f"always: the {_kind} of one element is that element (cast to the result dtype "
                            "exactly as NumPy's accumulator does: a widening integer cast)"))
SIMPLIFY.add(Rule("sum_size_one", P("sum", X), _reduce_size_one,
                  where=lambda m: _is_int(m.type("x")) or "fast_math" in m.flags,
                  exact="integers and bools; for floats only with fast_math, because NumPy's sum starts "
                        "from +0.0 and so turns a lone -0.0 into +0.0 (found by the property test)"))


_BINARY_BROADCASTING = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power")
for _kind in _BINARY_BROADCASTING:
    for _pos in (0, 1):
        kids = [P.var("x"), P.var("y")]
        kids[_pos] = P("broadcast_to", P.var("b" + "xy"[_pos]), name="xy"[_pos])
        SIMPLIFY.add(Rule(f"{_kind}_drop_broadcast", P(_kind, *kids),
                          lambda m, _k=_kind, _p=_pos: _unwrap(m, _k, "xy"[_p]),
                          exact="always: the elementwise op broadcasts the operand itself (the type check "
                                "ensures the result shape is unchanged)"))
        kids = [P.var("x"), P.var("y")]
        kids[_pos] = P("repeat", P.var("b" + "xy"[_pos]), name="xy"[_pos])
        SIMPLIFY.add(Rule(f"{_kind}_drop_repeat", P(_kind, *kids),
                          lambda m, _k=_kind, _p=_pos: _drop_repeat(m, _k, _p),
                          exact="always, when the repeated axis has size 1 (then repeat is a broadcast)"))


def _drop_repeat(m: Match, kind: str, pos: int) -> int | None:
    name = "xy"[pos]
    t = m.type("b" + name)
    a = m.attrs(name)
    axis = a.get("axis")
    if not isinstance(t, TensorType) or t.shape is None or axis is None or t.shape[axis % max(t.rank, 1)] != 1:
        return None
    return _unwrap(m, kind, name)


def _unwrap(m: Match, kind: str, name: str) -> int:
    # Keep the root's operand order (a commutative match may have bound x and y swapped).
    ins = list(m.root_ins)
    ins[ins.index(m[name])] = m["b" + name]
    return m.e.op(kind, *ins)


# ---------------------------------------------------------------- fusion
FUSE = RuleSet()
FUSE.add(Rule("fma", P("add", P("multiply", P.var("a"), P.var("b"), one_use=True), P.var("c")),
              lambda m: m.op("fma", "a", "b", "c"),
              exact="always: fma here computes a * b then + c with the same two roundings"))


def _is_swap(m: Match, name: str) -> bool:
    t = m.type("a" + name)
    if not isinstance(t, TensorType) or t.rank is None or t.rank < 2:
        return False
    perm = _perm(m.attrs(name)["axes"], t.rank)
    return perm == (*range(t.rank - 2), t.rank - 1, t.rank - 2)


def _mm_t(m: Match, ta: bool, tb: bool) -> int | None:
    a = m["ax"] if ta else m["x"]
    b = m["ay"] if tb else m["y"]
    if (ta and not _is_swap(m, "x")) or (tb and not _is_swap(m, "y")):
        return None
    return m.e.op("matmul_t", a, b, transpose_a=ta, transpose_b=tb)


_MM_EXACT = ("exact for integers; for floats the same products and sums, read through swapped strides, but BLAS "
             "may block a transposed operand differently, so the last bits of a sum can differ (1e-13 in the "
             "property test)")
_TX = P("permute_dims", P.var("ax"), name="x", one_use=True)
_TY = P("permute_dims", P.var("ay"), name="y", one_use=True)
FUSE.add(
    Rule("matmul_transpose_ab", P("matmul", _TX, _TY), lambda m: _mm_t(m, True, True),
         exact=_MM_EXACT),
    Rule("matmul_transpose_a", P("matmul", _TX, Y), lambda m: _mm_t(m, True, False),
         exact=_MM_EXACT),
    Rule("matmul_transpose_b", P("matmul", X, _TY), lambda m: _mm_t(m, False, True),
         exact=_MM_EXACT),
)

# ---------------------------------------------------------------- optimiser updates
FUSE_UPDATES = RuleSet()
_c = P.const


def _f(m: Match, name: str) -> float:
    return float(m.const(name).reshape(()))


def _momentum(m: Match) -> int:
    p2, v2 = m.op("sgd_momentum_update", "p", "v", "g", lr=_f(m, "lr"), mu=_f(m, "mu"))
    m.alias("v2", v2)
    return p2


FUSE_UPDATES.add(Rule(
    "sgd_momentum",
    P("subtract", P.var("p"), P("multiply", _c("lr", _scalar),
                                P("add", P("multiply", _c("mu", _scalar), P.var("v")), P.var("g"), name="v2"))),
    _momentum,
    exact="always: the fused kernel does the same operations in the same order (v' = mu * v + g; "
          "p' = p - lr * v')"))


def _adagrad(m: Match) -> int:
    p2, a2 = m.op("adagrad_update", "p", "acc", "g", lr=_f(m, "lr"), eps=_f(m, "eps"))
    m.alias("acc2", a2)
    return p2


_G = P.var("g")
FUSE_UPDATES.add(Rule(
    "adagrad",
    P("subtract", P.var("p"), P("divide", P("multiply", _c("lr", _scalar), _G),
                                P("add", P("sqrt", P("add", P.var("acc"), P("multiply", _G, _G), name="acc2")),
                                  _c("eps", _scalar)))),
    _adagrad,
    exact="always: same operations, same order (acc' = acc + g * g; p' = p - (lr * g) / (sqrt(acc') + eps))"))


def _adam(m: Match, dynamic: bool, square_first: bool) -> int:
    attrs = dict(lr=_f(m, "lr"), b1=_f(m, "b1"), c1=_f(m, "c1"), b2=_f(m, "b2"), c2=_f(m, "c2"), eps=_f(m, "eps"),
                 square_first=square_first)
    if dynamic:
        p2, m2, v2 = m.op("adam_update_t", "p", "m", "v", "g", "bc1", "bc2", **attrs)
    else:
        p2, m2, v2 = m.op("adam_update", "p", "m", "v", "g", bc1=_f(m, "bc1"), bc2=_f(m, "bc2"), **attrs)
    m.alias("m2", m2)
    m.alias("v2", v2)
    return p2


def _scalar_type(t: Any) -> bool:
    return isinstance(t, TensorType) and t.shape == ()


_M2 = P("add", P("multiply", _c("b1", _scalar), P.var("m")), P("multiply", _c("c1", _scalar), _G), name="m2")
for _dyn in (False, True):
    for _sq in (False, True):
        _gg = P("multiply", P("multiply", _G, _G), _c("c2", _scalar)) if _sq else \
            P("multiply", P("multiply", _c("c2", _scalar), _G), _G)
        _V2 = P("add", P("multiply", _c("b2", _scalar), P.var("v")), _gg, name="v2")
        _bc1 = P.var("bc1", _scalar_type) if _dyn else _c("bc1", _scalar)
        _bc2 = P.var("bc2", _scalar_type) if _dyn else _c("bc2", _scalar)
        FUSE_UPDATES.add(Rule(
            "adam" + ("_t" if _dyn else "") + ("_sq" if _sq else ""),
            P("subtract", P.var("p"),
              P("divide", P("multiply", _c("lr", _scalar), P("divide", _M2, _bc1)),
                P("add", P("sqrt", P("divide", _V2, _bc2)), _c("eps", _scalar)))),
            lambda m, _d=_dyn, _s=_sq: _adam(m, _d, _s),
            exact="always: same operations, same order (m' = b1 * m + c1 * g; v' = b2 * v + "
                  + ("(g * g) * c2" if _sq else "(c2 * g) * g")
                  + "; p' = p - (lr * (m' / bc1)) / (sqrt(v' / bc2) + eps)); "
                  + ("bc1, bc2 are scalar values of the graph (a step count t in the graph)" if _dyn else
                     "c1, c2, bc1, bc2 are the constants 1 - b1, 1 - b2, 1 - b1^t, 1 - b2^t as the graph computed "
                     "them")))


# ---------------------------------------------------------------- layout
LAYOUT = RuleSet()


def _split_einsum(m: Match) -> int | None:
    """An einsum of 3+ operands -> a chain of pairwise einsums along opt_einsum's path."""
    import opt_einsum

    from opgraph.ops.contraction import einsum_signature

    ins = list(m.root_ins)
    types = [m.e.type_of(v) for v in ins]
    if len(ins) < 3 or not all(isinstance(t, TensorType) and t.is_static for t in types):
        return None
    subs, optimize = m.root_attrs["subscripts"], m.root_attrs["optimize"]
    if "..." in subs:
        return None
    explicit, _ = einsum_signature(subs, [t.shape for t in types])  # type: ignore[union-attr]
    _, info = opt_einsum.contract_path(explicit, *[t.shape for t in types], shapes=True,  # type: ignore[union-attr]
                                       optimize=optimize)
    dt = np.result_type(*(t.dtype for t in types))  # type: ignore[union-attr]
    # The einsum kernel casts operands to the common dtype first; so does the chain.
    ops = [v if m.e.type_of(v).dtype == dt else m.e.op("cast", v, dtype=dt) for v in ins]  # type: ignore[union-attr]
    for step in info.contraction_list:
        contract_inds, eq = step[0], step[2]
        tmp = [ops.pop(i) for i in contract_inds]
        ops.append(m.e.op("einsum", *tmp, subscripts=eq, optimize=optimize))
    (out,) = ops
    return out


LAYOUT.add(Rule("einsum_pairwise", P("einsum"), _split_einsum,
                where=lambda m: len(m.root_ins) >= 3,
                exact="integers exactly; floats: the same pairwise contractions (opt_einsum's path, operands cast "
                      "to the common dtype first) that the einsum kernel runs, so the same results (checked in "
                      "tests); each step is now a graph op the memory planner and scheduler can see"))


# ---------------------------------------------------------------- elementwise chains
FUSE_ELEMENTWISE = RuleSet()


def _fuse_chain(m: Match) -> int | None:
    """Inline into one ``fused_elementwise`` op every single-use elementwise producer of the root's inputs."""
    from opgraph.core.registry import get_op
    from opgraph.ops.fused import fusable

    e = m.e
    fused_id = get_op("fused_elementwise").id
    operands: list[int] = []
    prog: list[tuple[Any, ...]] = []

    def operand(v: int) -> int:
        if v not in operands:
            operands.append(v)
        return -1 - operands.index(v)

    def inline(v: int) -> int:
        p = e.vprod[v]
        if p < 0 or e.uses[v] != 1 or e.vidx[v] != 0:
            return operand(v)
        kind = e.kind[p]
        ins = e.inputs_of(p)
        if kind == fused_id:
            sub = e.attrs_of_op(p)["program"]
            base = len(prog)
            for name, *refs in sub:
                prog.append((name, *[operand(ins[-r - 1]) if r < 0 else base + r for r in refs]))
            return len(prog) - 1
        name = get_op(kind).name
        if not fusable(name):
            return operand(v)
        prog.append((name, *[operand(a) for a in ins]))
        return len(prog) - 1

    refs = [inline(v) for v in m.root_ins]
    if not prog:
        return None
    prog.append((get_op(m.root_kind).name, *refs))
    return e.op("fused_elementwise", *operands, program=tuple(prog))


def _register_chain_rules() -> None:
    from opgraph.core.registry import all_ops
    from opgraph.ops.fused import fusable

    for d in all_ops():
        if fusable(d.name):
            FUSE_ELEMENTWISE.add(Rule(f"fuse_elementwise.{d.name}", P(d.name), _fuse_chain,
                                      exact="always: each step calls the same NumPy kernel on the same operands "
                                            "(a buffer is reused only for an intermediate of the same type)"))


_register_chain_rules()


def rule_table() -> list[tuple[str, str, str, str]]:
    """(set, rule, pattern, exactness) for every built-in rule (for docs and reports).

    >>> any(r[1] == "fma" for r in rule_table())
    True
    """
    rows = []
    sets = (("simplify", SIMPLIFY), ("fuse_updates", FUSE_UPDATES), ("fuse", FUSE), ("layout", LAYOUT),
            ("fuse_elementwise", FUSE_ELEMENTWISE))
    for set_name, rs in sets:
        for r in rs:
            rows.append((set_name, r.name, repr(r.pattern), r.exact + (f" [flag {r.flag}]" if r.flag else "")))
    return rows
