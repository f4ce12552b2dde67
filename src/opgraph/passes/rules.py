"""The built-in rules: algebraic simplification and fusion, each with its exactness condition.

Every rule is a :class:`~opgraph.passes.rewrite.Rule` in one of three sets:

* ``SIMPLIFY``: identities (x + 0, x * 1, double negation, transpose of
  transpose, ...). A rule that is exact only outside IEEE special cases
  (x * 0 is not 0 for inf or nan) runs for integers and bools, or for
  floats only with the ``fast_math`` flag.
* ``FUSE_UPDATES``: optimiser update patterns (SGD with momentum, Adagrad,
  Adam) written as plain elementwise ops, fused into one multi-output op.
* ``FUSE``: fused multiply-add, transposes absorbed into matmul, GELU's formulas
  into one ``gelu`` op, x * sigmoid(x) into ``silu``, clip(a x + b, 0, 1) into
  ``hard_sigmoid`` and x times it (or torch's x * relu6(x + 3) / 6) into ``hard_swish``,
  and ``power`` by 3, 4, -2, -3, -4 into multiplications
  (last-bit differences documented per rule).
* ``LAYOUT``: einsum split along its path; an N-D @ 2-D matmul as one 2-D GEMM.
* ``FOLD_AFFINE``: a constant per-channel scale and shift (a batch norm in inference form, a linear layer's
  scale) after a conv, conv_transpose or matmul with constant weights, folded into the weights and one bias add.

The engine rejects any replacement whose types differ from the replaced
value's, so rules need not re-check broadcasting or dtype promotion.

    >>> [r.name for r in SIMPLIFY if r.pattern.kind == 201][:3]   # rules rooted at subtract
    ['subtract_zero', 'subtract_neg', 'subtract_self']
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opgraph.core.registry import get_op
from opgraph.core.types import TensorType
from opgraph.passes.base import use_counts
from opgraph.passes.lower import split_einsum
from opgraph.passes.rewrite import FOLD_LIMIT, Match, P, Rule, RuleIndex, RuleSet

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


def _pays(kind: str, aliased: tuple[str, ...], reads: tuple[str, ...] = ("p",)) -> Any:
    """The ``where`` of an update rule: fuse only where the fused kernel is no slower on the NumPy engine (the
    engine ``optimize`` targets; see ``opgraph.ops.fused.update_fusion_pays``: without numba, updates of small
    parameters stay unfused), and only where ``p`` (and the other operands in ``reads`` that are not inputs of the
    intermediates) was computed before the intermediates the fused op also gives (``aliased``): in a scalar graph
    ``p`` may itself depend on them (p = f(v2)), and the fused op, which reads ``p`` and gives ``v2``, would close
    a cycle. The emitter numbers values in the order it emits them.

    >>> callable(_pays("sgd_momentum_update", ("v2",)))
    True
    """
    def where(m: Match) -> bool:
        from opgraph.ops.fused import update_fusion_pays

        if not _independent(m, reads, aliased):
            return False
        t = m.type("p")
        return isinstance(t, TensorType) and update_fusion_pays(kind, t.size if t.is_static else None)
    return where


def _independent(m: Match, reads: tuple[str, ...], aliased: tuple[str, ...], limit: int = 64) -> bool:
    """True when no value of ``reads`` depends on one of ``aliased`` (a walk up the producers of at most ``limit``
    values; a longer walk answers False, so a deep scalar graph stays unfused rather than risk a cycle)."""
    e = m.e
    targets = {m[a] for a in aliased}
    seen: set[int] = set()
    stack = [m[r] for r in reads]
    while stack:
        v = e.find(stack.pop())
        if v in targets:
            return False
        if v in seen:
            continue
        seen.add(v)
        if len(seen) > limit:
            return False
        op = e.vprod[v]
        if op >= 0:
            stack.extend(e.inputs_of(op))
    return True


def _momentum(m: Match) -> int:
    p2, v2 = m.op("sgd_momentum_update", "p", "v", "g", lr=_f(m, "lr"), mu=_f(m, "mu"))
    m.alias("v2", v2)
    return p2


FUSE_UPDATES.add(Rule(
    "sgd_momentum",
    P("subtract", P.var("p"), P("multiply", _c("lr", _scalar),
                                P("add", P("multiply", _c("mu", _scalar), P.var("v")), P.var("g"), name="v2"))),
    _momentum, where=_pays("sgd_momentum_update", ("v2",)),
    exact="always: the fused kernel does the same operations in the same order (v' = mu * v + g; "
          "p' = p - lr * v'); NumPy engine: any size with numba, parameters of 65536+ elements without"))


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
    _adagrad, where=_pays("adagrad_update", ("acc2",)),
    exact="always: same operations, same order (acc' = acc + g * g; p' = p - (lr * g) / (sqrt(acc') + eps)); "
          "NumPy engine: any size with numba, parameters of 65536+ elements without"))


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
            where=_pays("adam_update_t" if _dyn else "adam_update", ("m2", "v2"),
                        ("p", "bc1", "bc2") if _dyn else ("p",)),
            exact="always: same operations, same order (m' = b1 * m + c1 * g; v' = b2 * v + "
                  + ("(g * g) * c2" if _sq else "(c2 * g) * g")
                  + "; p' = p - (lr * (m' / bc1)) / (sqrt(v' / bc2) + eps)); "
                  + ("bc1, bc2 are scalar values of the graph (a step count t in the graph)" if _dyn else
                     "c1, c2, bc1, bc2 are the constants 1 - b1, 1 - b2, 1 - b1^t, 1 - b2^t as the graph computed "
                     "them") + "; NumPy engine: any size with numba, parameters of 65536+ elements without"))


# ---------------------------------------------------------------- layout
LAYOUT = RuleSet()


LAYOUT.add(Rule("einsum_pairwise", P("einsum"), split_einsum,
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


# ---------------------------------------------------------------- power by a small integer
def _power_exponent(m: Match) -> int | None:
    """The constant exponent as an int when it is a scalar integer in [-4, 4], else None."""
    c = m.const("c")
    if c.size != 1 or c.dtype.kind not in "biuf":
        return None
    v = c.reshape(()).item()
    if not (np.isfinite(v) and v == round(v) and -4 <= v <= 4):
        return None
    return int(v)


def _power_int(m: Match, allowed: tuple[int, ...]) -> int | None:
    n = _power_exponent(m)
    t = m.type("x")
    if n is None or n not in allowed or not isinstance(t, TensorType):
        return None
    if n < 0 and t.dtype.kind != "f":  # NumPy refuses integers to negative powers: keep the error
        return None
    if n == 0:
        (r,) = m.root_types
        return _ones_like(m, r) if isinstance(r, TensorType) else None
    x = m["x"]
    k = abs(n)
    p = x if k == 1 else m.e.op("square", x)
    if k == 3:
        p = m.e.op("multiply", p, x)
    elif k == 4:
        p = m.e.op("square", p)
    return m.e.op("reciprocal", p) if n < 0 else p  # type: ignore[no-any-return]


def _ones_like(m: Match, t: TensorType) -> int | None:
    if not t.is_static:
        return None
    if t.size <= FOLD_LIMIT:
        return m.e.constant(np.ones(t.shape, dtype=t.dtype))  # type: ignore[no-any-return]
    return m.e.op("broadcast_to", m.e.constant(np.ones((), dtype=t.dtype)), shape=t.shape)  # type: ignore[no-any-return]


_POW = P("power", X, P.const("c", _scalar))
SIMPLIFY.add(
    Rule("power_square", _POW, lambda m: _power_int(m, (2,)),
         exact="always: pow(x, 2) and x * x are both the correctly rounded square (IEEE; checked bitwise against "
               "np.power in tests), the same for nan, inf and -0.0; x * x is one multiply instead of a pow"),
    Rule("power_reciprocal", _POW, lambda m: _power_int(m, (-1,)),
         exact="floats: always, 1 / x is the correctly rounded pow(x, -1), special values included (integers "
               "are left alone: NumPy refuses negative integer powers)"),
    Rule("power_zero", _POW, lambda m: _power_int(m, (0,)),
         exact="always: pow(x, 0) is 1 for every x, nan and inf included"),
    Rule("power_half", _POW, lambda m: m.op("sqrt", "x"), flag="fast_math",
         where=lambda m: m.type("x").dtype.kind == "f" and bool(m.const("c").reshape(()) == 0.5),
         exact="not for special values: pow(-0.0, 0.5) is +0.0 and pow(-inf, 0.5) is +inf, sqrt gives -0.0 and "
               "nan; fast_math only"),
)
FUSE.add(Rule(
    "power_small_int", _POW, lambda m: _power_int(m, (3, 4, -2, -3, -4)),
    exact="integers exactly (wrapping products are NumPy's integer power); floats: x^3 = (x * x) * x, x^4 = "
          "square(square(x)), x^-n = 1 / x^n round two or three times instead of once, so they differ from pow "
          "by at most 2 ulp (measured) for normal results, agree on nan, inf and signed zeros, and may differ "
          "where x^n over- or underflows (a subnormal or 0 result); 400x faster than NumPy's pow"))


# ---------------------------------------------------------------- N-D @ 2-D matmul as one 2-D GEMM
def _matmul_2d(m: Match) -> int | None:
    ta, tb = m.type("x"), m.type("y")
    (r,) = m.root_types
    if not all(isinstance(t, TensorType) and t.is_static for t in (ta, tb, r)):
        return None
    if ta.rank < 3 or tb.rank != 2 or ta.size == 0:
        return None
    a2 = m.e.op("reshape", m["x"], shape=(-1, ta.shape[-1]))
    return m.e.op("reshape", m.e.op("matmul", a2, m["y"]), shape=r.shape)  # type: ignore[no-any-return]


LAYOUT.add(Rule(
    "matmul_nd_2d", P("matmul", X, Y), _matmul_2d,
    exact="the same dot products; NumPy runs an N-D @ 2-D product as one small product per leading index, the "
          "rewritten graph as one 2-D GEMM (8x faster on (197,2,768) @ (768,2304)), whose blocking may round "
          "the last bits of a sum differently; the reshapes are views"))


# ---------------------------------------------------------------- GELU
# gelu's formulas as ONNX import and model code write them: 0.5 * x * (1 + erf(x / sqrt 2)) and
# 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), with the factors in any order and grouping. The
# matcher reads the expression under the root as a polynomial in x and S, S the one erf or tanh op, through
# single-use ops only (so the rewrite never duplicates work), and compares the coefficients.
_SQ2 = float(np.sqrt(2.0))
_C_TANH = float(np.sqrt(2.0 / np.pi))
_K_TANH = 0.044715
Poly = dict[tuple[int, int], float]


class _GeluScan:
    # A GELU formula is about a dozen ops; the scan gives up past this many, so on a long single-use chain it
    # neither recurses deeper than Python allows nor makes the pass quadratic (every multiply is a candidate root).
    MAX_OPS = 32

    def __init__(self, m: Match, x: int | None = None) -> None:
        self.e = m.e
        self.x = x
        self.special: int | None = None  # the erf or tanh value
        self.budget = self.MAX_OPS

    def leaf(self, v: int) -> Poly | None:
        if self.x is None:
            self.x = v
        return {(1, 0): 1.0} if v == self.x else None

    def poly(self, v: int) -> Poly | None:
        e = self.e
        c = e.const_value(v)
        if c is not None:
            return {(0, 0): float(c.reshape(()))} if c.size == 1 and c.dtype.kind in "biuf" else None
        op = e.vprod[v]
        if op < 0 or e.uses[v] != 1 or e.vidx[v] != 0:
            return self.leaf(v)
        kind = get_op(e.kind[op]).name
        if kind in ("erf", "tanh"):
            if self.special is not None:
                return None
            self.special = v
            return {(0, 1): 1.0}
        if kind not in _POLY_KINDS:
            return self.leaf(v)
        self.budget -= 1
        if self.budget < 0:
            return None
        ps = []
        for a in e.inputs_of(op):
            p = self.poly(a)
            if p is None:
                return None
            ps.append(p)
        return _POLY_KINDS[kind](*ps)  # type: ignore[no-any-return]


def _padd(p: Poly, q: Poly, s: float = 1.0) -> Poly:
    r = dict(p)
    for k, c in q.items():
        r[k] = r.get(k, 0.0) + s * c
    return r


def _pmul(p: Poly, q: Poly) -> Poly | None:
    r: Poly = {}
    for (i, j), a in p.items():
        for (k, n), b in q.items():
            if j + n > 1:
                return None
            r[(i + k, j + n)] = r.get((i + k, j + n), 0.0) + a * b
    return r


def _pdiv(p: Poly, q: Poly) -> Poly | None:
    if set(q) != {(0, 0)} or q[(0, 0)] == 0:
        return None
    return {k: c / q[(0, 0)] for k, c in p.items()}


def _ppow(p: Poly, q: Poly) -> Poly | None:
    n = q.get((0, 0))
    if set(q) != {(0, 0)} or n not in (1.0, 2.0, 3.0):
        return None
    r: Poly | None = p
    for _ in range(int(n) - 1):
        r = None if r is None else _pmul(r, p)
    return r


def _pfma(a: Poly, b: Poly, c: Poly) -> Poly | None:
    ab = _pmul(a, b)
    return None if ab is None else _padd(ab, c)


_POLY_KINDS: dict[str, Any] = {
    "add": lambda p, q: _padd(p, q), "subtract": lambda p, q: _padd(p, q, -1.0),
    "multiply": _pmul, "divide": _pdiv, "square": lambda p: _pmul(p, p), "power": _ppow, "fma": _pfma,
    "negative": lambda p: {k: -c for k, c in p.items()},
}


def _same_poly(p: Poly | None, want: Poly) -> bool:
    if p is None:
        return False
    keys = {k for k, c in p.items() if c != 0.0} | set(want)
    return all(abs(p.get(k, 0.0) - want.get(k, 0.0)) <= 2e-6 * abs(want.get(k, 1.0)) for k in keys)


class _GeluIndex(RuleIndex):
    # The ops a GELU root can be, found once per pass from the erf and tanh ops upward instead of by a scan from
    # every multiply downward: the ops at most MAX_OPS + 1 steps above an erf or tanh value along the only path the
    # scan expands (single-use values, polynomial ops). A rewrite below a root can complete such a path under it,
    # so an op the pass rewrote starts one too (rewritten). That keeps the index a superset of the roots where
    # the scan can succeed: uses only grow during a pass, so a path's single-use values were single-use in the
    # input graph, and above the topmost value a rewrite replaced, a path runs through the input graph's ops.
    # Each start walks at most MAX_OPS + 1 steps.
    def __init__(self, g: Any) -> None:
        super().__init__(g)
        no = g.num_ops
        uses = use_counts(g)
        cons = np.repeat(np.arange(no), np.diff(g.in_ptr))
        single = uses[g.in_ids] == 1
        parent = np.full(g.num_values, -1, dtype=np.int64)  # the one consumer of a single-use value
        parent[g.in_ids[single]] = cons[single]
        poly = np.isin(g.op_kind, [get_op(k).id for k in _POLY_KINDS])
        n_out = np.diff(g.out_ptr)
        out0 = np.full(no, -1, dtype=np.int64)
        out0[n_out > 0] = g.out_ids[g.out_ptr[:-1][n_out > 0]]
        mark = self.mask
        mark[:] = False
        vals = out0[np.isin(g.op_kind, [get_op("erf").id, get_op("tanh").id]) & (n_out > 0)]
        for _ in range(_GeluScan.MAX_OPS + 1):
            ops = parent[vals]
            ops = ops[ops >= 0]
            mark[ops] = True
            vals = out0[ops[poly[ops]]]
            if not len(vals):
                break
        self.parent, self.poly, self.out0 = parent.tolist(), poly.tolist(), out0.tolist()
        self.out_ptr, self.out_ids = g.out_ptr.tolist(), g.out_ids.tolist()

    def rewritten(self, op: int) -> list[int]:
        parent, poly, out0 = self.parent, self.poly, self.out0
        found = []
        for v in self.out_ids[self.out_ptr[op]:self.out_ptr[op + 1]]:
            for _ in range(_GeluScan.MAX_OPS + 1):
                c = parent[v]
                if c < 0:
                    break
                if c not in self:
                    self.add(c)
                    found.append(c)
                if not poly[c]:
                    break
                v = out0[c]
        return found


def _gelu(m: Match) -> int | None:
    s = _GeluScan(m)
    a, b = (s.poly(v) for v in m.root_ins)
    p = None if a is None or b is None else _pmul(a, b)
    if not _same_poly(p, {(1, 0): 0.5, (1, 1): 0.5}) or s.special is None or s.x is None:
        return None
    t = m.e.type_of(s.x)
    if not (isinstance(t, TensorType) and t.dtype.kind == "f" and t == m.root_types[0]):
        return None
    op = m.e.vprod[s.special]
    kind = get_op(m.e.kind[op]).name
    inner = _GeluScan(m, s.x)
    q = inner.poly(m.e.inputs_of(op)[0])
    if inner.special is not None:
        return None
    if kind == "erf" and _same_poly(q, {(1, 0): 1 / _SQ2}):
        return m.e.op("gelu", s.x, approximate="none")  # type: ignore[no-any-return]
    if kind == "tanh" and _same_poly(q, {(1, 0): _C_TANH, (3, 0): _C_TANH * _K_TANH}):
        return m.e.op("gelu", s.x, approximate="tanh")  # type: ignore[no-any-return]
    return None


FUSE.add(Rule(
    "gelu", P("multiply", P("multiply"), Y), _gelu, where=lambda m: m.root_op in m.e.facts[_GeluIndex],
    index=_GeluIndex,
    exact="not bitwise: the gelu kernel computes the same function with its own rounding (float32: within 5 ulp "
          "of x * Phi(x) for x >= -1 and 1e-7 * |x| below, where the unfused 1 + erf cancels; float64: SciPy's "
          "ndtr, more accurate than the unfused formula); constants must match 1/sqrt(2), sqrt(2/pi), 0.044715 "
          "and 0.5 to 2e-6"))


def rule_table() -> list[tuple[str, str, str, str]]:
    """(set, rule, pattern, exactness) for every built-in rule (for docs and reports).

    >>> any(r[1] == "fma" for r in rule_table())
    True
    """
    rows = []
    sets = (("simplify", SIMPLIFY), ("fuse_updates", FUSE_UPDATES), ("fuse", FUSE), ("layout", LAYOUT),
            ("fuse_elementwise", FUSE_ELEMENTWISE), ("fold_affine", FOLD_AFFINE))
    for set_name, rs in sets:
        for r in rs:
            rows.append((set_name, r.name, repr(r.pattern), r.exact + (f" [flag {r.flag}]" if r.flag else "")))
    return rows


# ---------------------------------------------------------------- SiLU, hard sigmoid, hard swish
# x * sigmoid(x) as EfficientNet's ONNX export writes SiLU (Sigmoid then Mul), and the hard activations as
# hand-written code or older importers write them: clip(x / 6 + 1/2, 0, 1) (also after the fma rule made the
# line one fma) and torch's x * relu6(x + 3) / 6.
def _float_root(m: Match, x: int) -> bool:
    t = m.e.type_of(x)
    return isinstance(t, TensorType) and t.dtype.kind == "f" and t == m.root_types[0]


FUSE.add(Rule(
    "silu", P("multiply", X, P("sigmoid", X, one_use=True)),
    lambda m: m.op("silu", "x") if _float_root(m, m["x"]) else None,
    exact="not bitwise: the silu kernel computes sigmoid and the product per block (float32 within 5 ulp of "
          "x * sigmoid(x), measured; the unfused pair rounds twice too); float64 the same two roundings"))


def _scalar_of(m: Match, v: int) -> float | None:
    c = m.e.const_value(v)
    if c is None or c.size != 1 or c.dtype.kind not in "biuf":
        return None
    return float(c.reshape(()))


def _line(m: Match, v: int) -> tuple[int, float, float] | None:
    """(x, a, b) when the single-use value ``v`` is a * x + b with constant scalars a, b."""
    e = m.e
    op = e.vprod[v]
    if op < 0 or e.uses[v] != 1:
        return None
    kind = get_op(e.kind[op]).name
    ins = e.inputs_of(op)
    if kind == "fma":
        for i, j in ((0, 1), (1, 0)):
            a, b = _scalar_of(m, ins[j]), _scalar_of(m, ins[2])
            if a is not None and b is not None and _scalar_of(m, ins[i]) is None:
                return ins[i], a, b
        return None
    if kind not in ("add", "subtract"):
        return None
    for i, j in ((0, 1), (1, 0)) if kind == "add" else ((0, 1),):
        b = _scalar_of(m, ins[j])
        if b is None:
            continue
        b = -b if kind == "subtract" else b
        inner = e.vprod[ins[i]]
        if inner < 0 or e.uses[ins[i]] != 1:
            return ins[i], 1.0, b
        k = get_op(e.kind[inner]).name
        xs = e.inputs_of(inner)
        if k == "multiply":
            for p, q in ((0, 1), (1, 0)):
                a = _scalar_of(m, xs[q])
                if a is not None and _scalar_of(m, xs[p]) is None:
                    return xs[p], a, b
        if k == "divide" and (d := _scalar_of(m, xs[1])) not in (None, 0.0):
            return xs[0], 1.0 / d, b  # type: ignore[operator]
        return ins[i], 1.0, b
    return None


def _clip_bounds(m: Match) -> tuple[float, float] | None:
    lo, hi = (_scalar_of(m, v) for v in m.root_ins[1:])
    return None if lo is None or hi is None else (lo, hi)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 2e-6 * max(abs(b), 1e-30)


def _hard_sigmoid(m: Match) -> int | None:
    line = _line(m, m.root_ins[0])
    if _clip_bounds(m) != (0.0, 1.0) or line is None or not _float_root(m, line[0]):
        return None
    return m.e.op("hard_sigmoid", line[0], alpha=line[1], beta=line[2])  # type: ignore[no-any-return]


def _relu6_plus3(m: Match, v: int) -> int | None:
    """x when the single-use value ``v`` is clip(x + 3, 0, 6)."""
    e = m.e
    op = e.vprod[v]
    if op < 0 or e.uses[v] != 1 or get_op(e.kind[op]).name != "clip":
        return None
    ins = e.inputs_of(op)
    line = _line(m, ins[0])
    if (_scalar_of(m, ins[1]), _scalar_of(m, ins[2])) != (0.0, 6.0) or line is None or line[1:] != (1.0, 3.0):
        return None
    return line[0]


def _hard_swish_relu6(m: Match) -> int | None:
    # (x * relu6(x + 3)) / 6 and (x * relu6(x + 3)) * (1/6), relu6 as clip(x + 3, 0, 6)
    e = m.e
    a, b = m.root_ins
    kind = get_op(m.root_kind).name
    for u, c in ((a, b), (b, a)) if kind == "multiply" else ((a, b),):
        k = _scalar_of(m, c)
        if k is None or (kind == "divide" and k == 0.0) or not _close(1 / k if kind == "divide" else k, 1 / 6):
            continue
        op = e.vprod[u]
        if op < 0 or e.uses[u] != 1 or get_op(e.kind[op]).name != "multiply":
            continue
        p, q = e.inputs_of(op)
        for x, r in ((p, q), (q, p)):
            if _relu6_plus3(m, r) == x and _float_root(m, x):
                return e.op("hard_swish", x)  # type: ignore[no-any-return]
    return None


def _scalar_near(want: float, inverse: bool = False) -> Any:
    """A constant predicate: one number (bool, integer or float) within 2e-6 of ``want`` (its reciprocal with
    ``inverse``). The rules' patterns check it, so only ops fed such a constant are candidates, and the answer is
    cached per constant."""
    def check(a: np.ndarray) -> bool:
        if a.size != 1 or a.dtype.kind not in "biuf":
            return False
        k = float(a.reshape(()))
        if inverse:
            if k == 0.0:
                return False
            k = 1 / k
        return _close(k, want)
    return check


def _scalar_is(want: float) -> Any:
    """A constant predicate: one number (bool, integer or float) equal to ``want``."""
    def check(a: np.ndarray) -> bool:
        return a.size == 1 and a.dtype.kind in "biuf" and float(a.reshape(())) == want
    return check


def _is_hs_gate(a: dict[str, Any]) -> bool:
    return _close(a["alpha"], 1 / 6) and _close(a["beta"], 0.5)


FUSE.add(
    Rule("hard_sigmoid", P("clip", X, P.const("lo", _scalar_is(0.0)), P.const("hi", _scalar_is(1.0))),
         _hard_sigmoid,
         exact="not bitwise where a * x + b was two roundings (x / d + b, a * x + b, fma(x, a, b)): the kernel "
               "rounds a * x then + b; clip to [0, 1] as the unfused clip (nan stays nan)"),
    Rule("hard_swish", P("multiply", X, P("hard_sigmoid", X, one_use=True, attrs=_is_hs_gate)),
         lambda m: m.op("hard_swish", "x") if _float_root(m, m["x"]) else None,
         exact="not bitwise: hard_swish computes x * relu6(x + 3) / 6 as torch does, which rounds differently "
               "from x * clip(x / 6 + 1/2, 0, 1) (most where x / 6 + 1/2 cancels near x = -3, where it is more "
               "accurate); slope and offset must be 1/6 and 1/2 to 2e-6"),
    Rule("hard_swish_relu6", P("divide", P("multiply", one_use=True), P.const("k", _scalar_near(1 / 6, True))),
         _hard_swish_relu6,
         exact="always up to rounding: x * clip(x + 3, 0, 6) / 6 is hard_swish's own formula (the kernel "
               "multiplies by 1/6 instead of dividing by 6: within 1 ulp)"),
    Rule("hard_swish_relu6_mul", P("multiply", P("multiply", one_use=True), P.const("k", _scalar_near(1 / 6))),
         _hard_swish_relu6,
         exact="(x * relu6(x + 3)) * (1/6): hard_swish's own formula (the same roundings)"),
)


# ---------------------------------------------------------------- layer norm
# The decomposition of hand-written layer norms and of torch.onnx.export before opset 17: d = x - mean(x),
# d / sqrt(mean(d^2) + eps) (or d * reciprocal(sqrt(...)), ONNX's function body), over trailing axes with
# keepdims; then * gamma and + beta are absorbed when they vary along the normalised axes only.
def _producer(m: Match, v: int, kind: str, uses: tuple[int, ...] = (1,)) -> list[int] | None:
    e = m.e
    op = e.vprod[v]
    if op < 0 or e.uses[v] not in uses or get_op(e.kind[op]).name != kind or e.vidx[v] != 0:
        return None
    return list(e.inputs_of(op))


def _trailing_mean(m: Match, v: int, uses: tuple[int, ...] = (1,)) -> tuple[int, tuple[int, ...]] | None:
    ins = _producer(m, v, "mean", uses)
    if ins is None:
        return None
    a = m.e.attrs_of_op(m.e.vprod[v])
    t = m.e.type_of(ins[0])
    if not (a["keepdims"] and isinstance(t, TensorType) and t.rank) or a["axis"] is None:
        return None
    axes = tuple(sorted(x % t.rank for x in a["axis"]))
    if axes != tuple(range(t.rank - len(axes), t.rank)):
        return None
    return ins[0], axes


def _layer_norm(m: Match) -> int | None:
    e = m.e
    a, b = m.root_ins
    if get_op(m.root_kind).name == "divide":
        pairs = [(a, _producer(m, b, "sqrt"))]
    else:
        pairs = [(d, None if (r := _producer(m, o, "reciprocal")) is None else _producer(m, r[0], "sqrt"))
                 for d, o in ((a, b), (b, a))]
    for d, sq in pairs:
        added = None if sq is None else _producer(m, sq[0], "add")
        if added is None:
            continue
        for var, c in ((added[0], added[1]), (added[1], added[0])):
            eps = _scalar_of(m, c)
            vm = _trailing_mean(m, var)
            if eps is None or vm is None:
                continue
            sq_ins = _producer(m, vm[0], "square") or _producer(m, vm[0], "multiply")
            if sq_ins is None or any(s != d for s in sq_ins):
                continue
            centred = _producer(m, d, "subtract", (1 + len(sq_ins),))
            mean = None if centred is None else _trailing_mean(m, centred[1])
            if mean is None or mean[0] != centred[0] or mean[1] != vm[1] or not _float_root(m, centred[0]):
                continue
            axis = e.type_of(centred[0]).rank - len(mean[1])  # type: ignore[union-attr]
            return e.op("layer_norm", centred[0], axis=axis, epsilon=eps)  # type: ignore[no-any-return]
    return None


def _affine_ok(m: Match, y: str) -> bool:
    # gamma or beta: x's dtype, varying along the normalised axes only (what the kernel's rows take)
    t, xt = m.type(y), m.type("x")
    axis = m.attrs("ln")["axis"] % xt.rank
    lead = t.shape[:max(t.rank - (xt.rank - axis), 0)] if t.shape is not None else (None,)
    return t.dtype == xt.dtype and all(d == 1 for d in lead) and _float_root(m, m["x"])


def _absorb(m: Match) -> int | None:
    if not _affine_ok(m, "y"):
        return None
    a = m.attrs("ln")
    scale = [m["s"]] if "s" in m else []
    if get_op(m.root_kind).name == "add" and not scale:  # a bias needs a scale before it: ones
        xt = m.type("x")
        if xt.shape is None or None in xt.shape:
            return None
        scale = [m.e.constant(np.ones(xt.shape[a["axis"] % xt.rank:], xt.dtype))]
    ins = [m["x"], *scale, m["y"]]
    return m.e.op("layer_norm", *ins, axis=a["axis"], epsilon=a["epsilon"])  # type: ignore[no-any-return]


FUSE.add(
    Rule("layer_norm", P("divide", X, P("sqrt", one_use=True)), _layer_norm,
         exact="not bitwise: the kernel sums rows by BLAS and multiplies by 1 / sqrt(var + eps) (relative "
               "differences about 1e-7 in float32, checked in tests); same two-pass mean and variance"),
    Rule("layer_norm_rsqrt", P("multiply", X, P("reciprocal", one_use=True)), _layer_norm,
         exact="ONNX's function body (d * reciprocal(sqrt(var + eps))): the kernel's arithmetic, rows summed by "
               "BLAS"),
    Rule("layer_norm_scale", P("multiply", P("layer_norm", X, name="ln", one_use=True), Y), _absorb,
         exact="always: the kernel multiplies the normalised rows by the scale, as the separate multiply did"),
    Rule("layer_norm_bias", P("add", P("layer_norm", X, P.var("s"), name="ln", one_use=True), Y), _absorb,
         exact="always: the kernel adds the bias after the scale, as the separate add did"),
    Rule("layer_norm_bias_only", P("add", P("layer_norm", X, name="ln", one_use=True), Y), _absorb,
         exact="always: the kernel multiplies by a scale of ones (exact) and adds the bias"),
)


# ---------------------------------------------------------------- affine maps folded into weights
# A constant per-channel scale and shift after a conv, conv_transpose or matmul with constant weights, as a batch
# norm in inference form ((y - mean) / sqrt(var + eps) * gamma + beta) or a linear layer's bias and scale become
# once imported or written with lazy arrays: each step is folded into the producer's weights and one bias add, so
# the chain ends as producer(x, w') + b'. One rule per step and root form; a rewrite makes a fresh producer on a
# fresh weight constant, so the next step's single-use checks see true counts.
FOLD_AFFINE = RuleSet()


def _channel_of(e: Any, y: int) -> tuple[int, int, int, int] | None:
    """(operand x, weight w, the output's channel axis, the weight's) of the producer of ``y``, or None.

    The weight is a constant (used elsewhere too, as after CSE merged equal weights, the folded producer gets its
    own: one more constant, as an export with a weight per layer has); the output's dtype is the weight's and a float;
    the channel count is the weight's."""
    op = e.vprod[y]
    kind = get_op(e.kind[op]).name
    ins = e.inputs_of(op)
    t = e.type_of(y)
    if not (isinstance(t, TensorType) and t.shape is not None and t.dtype.kind == "f"):
        return None
    rank = len(t.shape)
    if kind in ("conv", "conv2d", "conv_transpose"):
        x, w = ins[0], ins[1]
        axis, waxis = (rank - 3 if kind == "conv2d" else 1), (1 if kind == "conv_transpose" else 0)
    elif kind in ("matmul", "matmul_t"):
        a = e.attrs_of_op(op) if kind == "matmul_t" else {}
        if e.vconst[ins[1]] >= 0:  # y = x @ W: channels along W's columns, the output's last axis
            x, w, axis = ins[0], ins[1], rank - 1
            waxis = -2 if a.get("transpose_b") else -1
        elif e.vconst[ins[0]] >= 0:  # y = W @ x: along W's rows, the output's second last axis (a vector x: last)
            x, w = ins[1], ins[0]
            xt = e.type_of(x)
            if not isinstance(xt, TensorType) or xt.rank is None:
                return None
            axis = rank - 1 if xt.rank == 1 else rank - 2
            waxis = -1 if a.get("transpose_a") else -2
        else:
            return None
    else:
        return None
    wv = e.const_value(w)
    if wv is None or wv.dtype != t.dtype or wv.ndim < 2 or not 0 <= axis < rank:
        return None
    if t.shape[axis] != wv.shape[waxis] * (e.attrs_of_op(op)["groups"] if kind == "conv_transpose" else 1):
        return None
    return x, w, axis, waxis


def _per_channel(c: np.ndarray, shape: tuple[int | None, ...], axis: int, dtype: np.dtype) -> np.ndarray | None:
    """The constant ``c`` as one value per channel (a vector along ``axis`` of an output of ``shape``), when ``c``
    broadcast against that output does not enlarge it and is constant along every other axis; else None.

    >>> _per_channel(np.array([[1.0], [2.0]]), (5, 2, 3), 1, np.dtype("f8"))
    array([1., 2.])
    >>> _per_channel(np.array([[1.0, 2.0]]), (5, 2, 3), 1, np.dtype("f8")) is None   # varies along the last axis
    True
    >>> _per_channel(np.full((2, 3), 7.0), (5, 2, 3), 1, np.dtype("f8"))              # constant along it: fine
    array([7., 7.])
    """
    rank, m = len(shape), shape[axis]
    if c.ndim > rank or c.dtype.kind not in "biuf" or m is None:
        return None
    full = c.reshape((1,) * (rank - c.ndim) + c.shape)
    if any(d != 1 and (d != n or (i != axis and n is None)) for i, (d, n) in enumerate(zip(full.shape, shape,
                                                                                        strict=True))):
        return None
    first = full[tuple(slice(None) if i == axis else slice(0, 1) for i in range(rank))]
    if full.size != first.size and not np.array_equal(np.broadcast_to(first, full.shape), full):
        return None
    v = np.broadcast_to(first.reshape(-1), (m,)).astype(dtype)
    return v if np.isfinite(v).all() else None


def _along(v: np.ndarray, w: np.ndarray, waxis: int, groups: int) -> np.ndarray:
    """``v`` (one value per output channel) shaped to broadcast along the weight's channel axis. A grouped
    conv_transpose's weight is (C, M // groups, ...): output channel g * (M // groups) + j is column j of group g's
    rows, so the vector is laid out (groups, 1, M // groups, 1...) against the weight regrouped."""
    if groups == 1:
        shape = [1] * w.ndim
        shape[waxis] = v.size
        return v.reshape(shape)
    return v.reshape(groups, 1, v.size // groups, *(1,) * (w.ndim - 2))


def _fold_affine(m: Match, form: str) -> int | None:
    """Replace ``form`` applied to (producer [+ bias]) by producer(x, w') [+ b'] (see ``FOLD_AFFINE``)."""
    e = m.e
    y = m["y"]
    spec = _channel_of(e, y)
    (rt,) = m.root_types
    yt = e.type_of(y)
    if spec is None or rt != yt or ("a" in m and e.type_of(m["a"]) != yt):
        return None
    x, w_id, axis, waxis = spec
    shape, dt = yt.shape, yt.dtype
    per = {k: _per_channel(m.const(k), shape, axis, dt) for k in ("b", "s", "t") if k in m}
    if any(v is None for v in per.values()):
        return None
    b, s, t = per.get("b"), per.get("s"), per.get("t")
    op = e.vprod[y]
    kind = get_op(e.kind[op]).name
    attrs = e.attrs_of_op(op)
    groups = attrs["groups"] if kind == "conv_transpose" else 1
    w = m.e.const_value(w_id)
    wg = w.reshape(groups, w.shape[0] // groups, *w.shape[1:]) if groups > 1 else w
    with np.errstate(all="ignore"):
        if form in ("scale", "fma"):
            w2, b2 = wg * _along(s, w, waxis, groups), None if b is None else b * s
        elif form == "divide":
            w2, b2 = wg / _along(s, w, waxis, groups), None if b is None else b / s
        elif form == "negate":
            w2, b2 = -wg, None
        else:
            w2, b2 = wg, b
        if form == "shift":
            b2 = t if b2 is None else b2 + t
        elif form == "unshift":
            b2 = -t if b2 is None else b2 - t
        elif form == "negate":
            b2 = t if b is None else t - b
        elif form == "fma":
            b2 = t if b2 is None else b2 + t
    w2 = w2.reshape(w.shape).astype(w.dtype, copy=False)
    same = form in ("shift", "unshift")  # the weights unchanged: the same array, not a copy
    if not ((same or np.isfinite(w2).all()) and (b2 is None or np.isfinite(b2).all())):
        return None
    ins = [x, e.constant_again(w_id) if same else e.constant(w2)]
    if kind in ("matmul", "matmul_t") and e.inputs_of(op)[0] == w_id:
        ins.reverse()
    out = e.op(kind, *ins, **attrs)
    if b2 is None:
        return out  # type: ignore[no-any-return]
    return e.op("add", out, e.constant(b2.reshape((b2.size,) + (1,) * (len(shape) - 1 - axis)).astype(dt)))


_FOLD_EXACT = {
    "scale": "within rounding, not bitwise: (x * w) * s becomes x * (w * s) (and a bias b * s), the weights "
             "rounded once before the sums; for a scale constant along every axis but the output channels, finite",
    "divide": "within rounding: (x * w) / d becomes x * (w / d) (and b / d); d per channel, finite, nonzero",
    "shift": "within rounding: (y + b) + t becomes y + (b + t); y - t becomes y + (-t), exactly",
    "fma": "within rounding: fma(y [+ b], s, t) becomes y' + (b * s + t), as the scale and shift rules",
    "negate": "within rounding: t - (y [+ b]) becomes y(x, -w) + (t - b); negating the weights is exact",
}
_FOLD_PRODUCERS = ("conv", "conv2d", "conv_transpose", "matmul", "matmul_t")
for _k in _FOLD_PRODUCERS:
    _Y = P(_k, name="y", one_use=True)
    for _a in (_Y, P("add", _Y, P.const("b"), name="a", one_use=True)):
        _rules = [("fold_scale", "scale", P("multiply", _a, P.const("s"))),
                  ("fold_scale", "divide", P("divide", _a, P.const("s"))),
                  ("fold_shift", "unshift", P("subtract", _a, P.const("t"))),
                  ("fold_negate", "negate", P("subtract", P.const("t"), _a)),
                  ("fold_fma", "fma", P("fma", _a, P.const("s"), P.const("t"))),
                  ("fold_fma", "fma", P("fma", P.const("s"), _a, P.const("t")))]
        if _a is not _Y:  # y + t is already the folded form
            _rules.append(("fold_shift", "shift", P("add", _a, P.const("t"))))
        for _name, _form, _pat in _rules:
            FOLD_AFFINE.add(Rule(_name, _pat, lambda m, _f=_form: _fold_affine(m, _f),
                                 exact=_FOLD_EXACT[_form if _form != "unshift" else "shift"]))
