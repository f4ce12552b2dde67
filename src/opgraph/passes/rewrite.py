"""The rule engine: local rewrites written as data (pattern -> replacement), and constant folding.

A :class:`Rule` has a name, a root :class:`P` pattern (an op kind with
child patterns), a replacement function and a documented exactness
condition. Rules are registered per root op kind in a :class:`RuleSet`;
:func:`rewrite` walks the graph once in topological order, tries the rules
of each op's kind, and checks that a replacement has exactly the types of
the values it replaces (otherwise the rule does not fire).

    >>> import numpy as np, opgraph
    >>> from opgraph.passes.rewrite import P, Rule, RuleSet, rewrite
    >>> rules = RuleSet()
    >>> x = P.var("x")
    >>> _ = rules.add(Rule("neg_neg", P("negative", P("negative", x)), lambda m: m["x"],
    ...                exact="always: negation is exact"))
    >>> b = opgraph.GraphBuilder()
    >>> v = b.input(("float64", (2,)), name="v")
    >>> b.output(b.negative(b.negative(v)))
    >>> r = rewrite(b.freeze(), rules)
    >>> r.counts
    {'neg_neg': 1}
    >>> print(r.graph)
    graph(%v: f64[2]) {
      return %v
    }
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgraph.core.graph import Graph, csr_rows
from opgraph.core.registry import CONST, get_op
from opgraph.core.types import TensorType
from opgraph.ops.fold import fold as fold_op
from opgraph.passes.base import Emitter, PassResult


class P:
    """A pattern: an op kind with child patterns, a variable, or a constant.

    * ``P("add", a, b)``: a value produced by an ``add`` op whose inputs match
      ``a`` and ``b`` (both orders are tried for a commutative op);
      ``attrs=pred`` filters on the op's attributes, ``one_use=True`` asks
      that the value has exactly one use, ``name=`` binds the value.
    * ``P.var("x", where=pred)``: any value (``pred(type)``); a name bound twice
      must bind the same value (``x - x``).
    * ``P.const("c", where=pred)``: a value made by a const op (``pred(array)``).
    """

    __slots__ = ("attrs", "children", "kind", "name", "one_use", "where")

    def __init__(self, kind: str | None, *children: P, name: str | None = None,
                 attrs: Callable[[dict[str, Any]], bool] | None = None,
                 where: Callable[[Any], bool] | None = None, one_use: bool = False) -> None:
        self.kind = None if kind is None else get_op(kind).id
        self.children = children
        self.name = name
        self.attrs = attrs
        self.where = where
        self.one_use = one_use

    @staticmethod
    def var(name: str, where: Callable[[TensorType], bool] | None = None) -> P:
        """Any value (optionally with a type predicate)."""
        return P(None, name=name, where=where)

    @staticmethod
    def const(name: str, where: Callable[[np.ndarray], bool] | None = None) -> P:
        """A constant (optionally with a predicate on its array)."""
        return P("const", name=name, where=where)

    def __repr__(self) -> str:
        if self.kind is None:
            return f"${self.name}"
        kind = get_op(self.kind).name
        if kind == "const":
            return f"const ${self.name}"
        return f"{kind}({', '.join(map(repr, self.children))})"


class Match(dict):
    """Bindings of a match (name -> new value id), plus access to the emitter.

    ``m["x"]`` is a value id; :meth:`type`, :meth:`const`, :meth:`attrs` look at
    it; ``m.root_attrs`` are the root op's attributes; ``m.e`` is the emitter
    (``m.e.op(kind, *values, **attrs)``, ``m.e.constant(array)``).
    """

    e: Emitter
    root_attrs: dict[str, Any]
    root_types: tuple[Any, ...]
    flags: frozenset[str]
    aliases: list[tuple[int, int]]
    root_ins: list[int]
    root_kind: int
    root_op: int

    def alias(self, name: str, new: int) -> None:
        """Also replace bound value ``name`` (an intermediate the replacement recomputes) by ``new``."""
        self.aliases.append((self[name], new))

    def type(self, name: str) -> TensorType:
        """Type of a bound value."""
        return self.e.type_of(self[name])  # type: ignore[return-value]

    def const(self, name: str) -> np.ndarray:
        """Array of a bound constant."""
        c = self.e.const_value(self[name])
        assert c is not None
        return c

    def attrs(self, name: str) -> dict[str, Any]:
        """Attributes of the op producing a bound value."""
        return self.e.attrs_of_op(self.e.vprod[self[name]])

    def op(self, kind: str, *names_or_ids: Any, **attrs: Any) -> Any:
        """Emit an op on bound names or value ids."""
        return self.e.op(kind, *(self[a] if isinstance(a, str) else a for a in names_or_ids), **attrs)


class RuleIndex:
    """Per pass, the ops a rule can fire at: a superset, found once from the pass's input graph.

    A rule whose match reads further than its pattern (a scan below the root) gives itself an index
    (``Rule(..., index=cls)``) so that it is not tried, nor its scan run, at every op of its kind:
    :func:`rewrite` builds ``cls(graph)`` once per pass (shared by the rules naming the same ``cls``; a rule
    reaches it as ``m.e.facts[cls]``), visits only ops whose ``mask`` is set (and that the rule's pattern
    prefilter admits), and after each rewrite of an op visits the ops :meth:`rewritten` returns too, those
    where the new ops may now complete a match. ``op in index`` answers for one op (of the input graph).

    >>> import numpy as np, opgraph
    >>> class Outputs(RuleIndex):   # only ops producing a graph output
    ...     def __init__(self, graph):
    ...         super().__init__(graph)
    ...         self.mask[:] = False
    ...         self.mask[graph.value_producer[graph.outputs]] = True
    >>> b = opgraph.GraphBuilder()
    >>> v = b.input(("float64", (2,)))
    >>> b.output(b.negative(b.negative(b.negative(b.negative(v)))))
    >>> x = P.var("x")
    >>> rules = RuleSet().add(Rule("neg_neg", P("negative", P("negative", x)), lambda m: m["x"], index=Outputs))
    >>> rewrite(b.freeze(), rules).counts          # only the last negative is tried
    {'neg_neg': 1}
    """

    def __init__(self, graph: Graph) -> None:
        self.mask = np.ones(graph.num_ops, dtype=bool)
        self._mark: list[bool] | None = None

    def _marks(self) -> list[bool]:
        # a list answers one op faster than the array; made once the subclass has set the mask
        if self._mark is None:
            self._mark = self.mask.tolist()
        return self._mark

    def __contains__(self, op: int) -> bool:
        return self._marks()[op]

    def add(self, op: int) -> None:
        """Admit ``op`` from now on (for :meth:`rewritten`)."""
        self._marks()[op] = True
        self.mask[op] = True

    def rewritten(self, op: int) -> Sequence[int]:
        """Ops (of the input graph) to visit because ``op`` was just rewritten; :meth:`add` them. None here."""
        return ()


@dataclass
class Rule:
    """A rewrite: ``pattern`` (rooted at an op kind) -> ``replace(match)``.

    ``replace`` returns the new value (or a tuple, one per output of the root
    op), or None to decline. ``exact`` documents when the rewrite is exact for
    floating point; ``flag``, if set, names an option of :func:`opgraph.optimize`
    that must be on for the rule to run (rules exact only outside IEEE
    special cases). ``index``, a :class:`RuleIndex` subclass, limits the ops the
    rule is tried at (for a rule whose match scans below its pattern).
    """

    name: str
    pattern: P
    replace: Callable[[Match], Any]
    exact: str = ""
    flag: str | None = None
    where: Callable[[Match], bool] | None = None
    index: type[RuleIndex] | None = None
    needs: frozenset[int] = field(init=False)
    const_needs: tuple[Callable[[np.ndarray], bool], ...] = field(init=False)

    def __post_init__(self) -> None:
        # Kinds of the producers the root's inputs must include, and predicates some constant input must pass
        # (cheap prefilters, run on the whole graph at once).
        self.needs = frozenset(c.kind for c in self.pattern.children if c.kind is not None)
        self.const_needs = tuple(dict.fromkeys(c.where for c in self.pattern.children
                                               if c.kind == CONST.id and c.where is not None))


@dataclass
class RuleSet:
    """Rules registered per root op kind (tried in registration order)."""

    by_kind: dict[int, list[Rule]] = field(default_factory=dict)

    def add(self, *rules: Rule) -> RuleSet:
        """Register rules; returns the set."""
        for r in rules:
            if r.pattern.kind is None:
                raise ValueError(f"rule {r.name}: the root pattern must name an op kind")
            self.by_kind.setdefault(r.pattern.kind, []).append(r)
        return self

    def rule(self, name: str, pattern: P, *, exact: str, flag: str | None = None,
             where: Callable[[Match], bool] | None = None,
             index: type[RuleIndex] | None = None) -> Callable[[Callable[[Match], Any]], Any]:
        """Decorator form of :meth:`add`."""
        def deco(fn: Callable[[Match], Any]) -> Callable[[Match], Any]:
            self.add(Rule(name, pattern, fn, exact, flag, where, index))
            return fn
        return deco

    def __iter__(self) -> Any:
        for rules in self.by_kind.values():
            yield from rules

    def __len__(self) -> int:
        return sum(len(r) for r in self.by_kind.values())

    def __or__(self, other: RuleSet) -> RuleSet:
        out = RuleSet()
        for r in [*self, *other]:
            out.add(r)
        return out


def _match(p: P, v: int, e: Emitter, m: Match) -> bool:
    if p.name is not None and p.name in m:
        if m[p.name] != v:
            return False
        if p.kind is None:
            return True
    if p.kind is None:
        if p.where is not None and not p.where(e.type_of(v)):
            return False
        m[p.name] = v  # type: ignore[index]
        return True
    op = e.vprod[v]
    if op < 0 or e.kind[op] != p.kind:
        return False
    if p.one_use and e.uses[v] != 1:
        return False
    if p.kind == CONST.id:
        if p.where is not None:
            key = (p.where, e.vconst[v])
            ok = e.pred_cache.get(key)
            if ok is None:
                ok = e.pred_cache[key] = bool(p.where(e.constants[e.vconst[v]]))
            if not ok:
                return False
    elif p.attrs is not None and not p.attrs(e.attrs_of_op(op)):
        return False
    if p.children and not _match_inputs(p, e.kind[op], e.inputs_of(op), e, m):
        return False
    if p.name is not None:
        m[p.name] = v
    return True


_COMMUTATIVE: dict[int, bool] = {}


def _commutative(kind: int) -> bool:
    c = _COMMUTATIVE.get(kind)
    if c is None:
        c = _COMMUTATIVE[kind] = get_op(kind).commutative
    return c


def _match_inputs(p: P, kind: int, ins: list[int], e: Emitter, m: Match) -> bool:
    if len(ins) != len(p.children):
        return False
    saved = dict(m)
    if all(_match(c, v, e, m) for c, v in zip(p.children, ins, strict=True)):
        return True
    if len(ins) == 2 and _commutative(kind):
        m.clear()
        m.update(saved)
        if _match(p.children[0], ins[1], e, m) and _match(p.children[1], ins[0], e, m):
            return True
    m.clear()
    m.update(saved)
    return False


FOLD_LIMIT = 1 << 16
"""Constant folding never makes a constant with more elements than this, nor reads a constant with more (per
output and per input, see :func:`opgraph.ops.fold.fits`)."""


def rewrite(graph: Graph, rules: RuleSet | None = None, *, fold: bool = False, fold_limit: int = FOLD_LIMIT,
            flags: Iterable[str] = (), strict: bool = False, refine: bool = False) -> PassResult:
    """Apply ``rules`` (and constant folding with ``fold``) in one topological walk, then drop dead ops.

    Only candidate ops are visited: a vectorised prefilter finds the ops whose
    kind has a rule whose required producer kinds are among the producers of
    the op's inputs (and, with ``fold``, ops whose inputs are all constants);
    when an op is rewritten its consumers become candidates too, so chains of
    rewrites complete in one walk. ``strict`` raises when a rule's
    replacement has the wrong types (for testing rules) instead of skipping it.
    ``refine`` also accepts a replacement whose type is more precise than the
    op's (the same dtype, a shape where the op's had unknown dimensions or rank).
    """
    by_kind = rules.by_kind if rules is not None else {}
    flags = frozenset(flags)
    flags_ok = {None, *flags}
    old = graph
    no = old.num_ops
    if no == 0:
        return PassResult(graph, {})
    order = old.topological_order()
    pos = np.empty(no, dtype=np.int64)
    pos[order] = np.arange(no)
    indexes = _indexes(old, by_kind, flags_ok)
    cand = _candidates(old, by_kind, flags_ok, fold, indexes)
    if not cand.any():
        return PassResult(graph, {})
    heap = (pos[cand]).tolist()
    heapq.heapify(heap)
    pos_l = pos.tolist()
    order_l = order.tolist()
    cons_ptr, cons_ops = old.consumers()
    cons_ptr_l, cons_l = cons_ptr.tolist(), cons_ops.tolist()
    queued = cand.tolist()
    e = Emitter(old)
    e.facts.update(indexes)
    index_list = list(indexes.values())
    in_ptr, in_ids = e.in_ptr, e.in_ids
    out_ptr, out_ids = e.out_ptr, e.out_ids
    kinds = e.kind
    vconst, vprod = e.vconst, e.vprod
    counts: dict[str, int] = {}
    find = e.find
    cand_cache: dict[tuple[int, frozenset[int]], list[Rule]] = {}
    while heap:
        op = order_l[heapq.heappop(heap)]
        outs = out_ids[out_ptr[op]:out_ptr[op + 1]]
        ins = [find(v) for v in in_ids[in_ptr[op]:in_ptr[op + 1]]]
        kind = kinds[op]
        e.root = op
        done = False
        if fold and ins and all(vconst[v] >= 0 for v in ins):
            done = _fold(e, old, op, ins, outs, fold_limit)
            if done:
                counts["fold"] = counts.get("fold", 0) + 1
        if not done:
            rules_here = by_kind.get(kind)
            if rules_here:
                pk = frozenset([kinds[p] if p >= 0 else -1 for p in [vprod[v] for v in ins]])
                ckey = (kind, pk)
                cands = cand_cache.get(ckey)
                if cands is None:
                    cands = cand_cache[ckey] = [r for r in rules_here
                                                if r.flag in flags_ok and (not r.needs or r.needs <= pk)]
                done = bool(cands) and _try_rules(e, op, ins, outs, cands, flags, counts, strict, refine)
        if done:
            # Consumers may now match: those of a kind with rules, or (folding) those fed a new constant.
            for v in outs:
                feeds_const = fold and vconst[find(v)] >= 0
                for c in cons_l[cons_ptr_l[v]:cons_ptr_l[v + 1]]:
                    if not queued[c] and (feeds_const or kinds[c] in by_kind):
                        queued[c] = True
                        heapq.heappush(heap, pos_l[c])
            # Ops further up that an indexed rule's match may now reach (each index says which).
            for index in index_list:
                for c in index.rewritten(op):
                    if not queued[c] and kinds[c] in by_kind:
                        queued[c] = True
                        heapq.heappush(heap, pos_l[c])
    if not counts:
        return PassResult(graph, {})
    return PassResult(e.finish(), counts)


def _indexes(g: Graph, by_kind: dict[int, list[Rule]], flags_ok: set[Any]) -> dict[type[RuleIndex], RuleIndex]:
    """The indexes of the rules that may run in this pass (on ops of a kind the graph has), each built once."""
    out: dict[type[RuleIndex], RuleIndex] = {}
    kinds: set[int] | None = None
    for kind, rules in by_kind.items():
        for r in rules:
            if r.index is None or r.flag not in flags_ok or r.index in out:
                continue
            if kinds is None:
                kinds = set(np.unique(g.op_kind).tolist())
            if kind in kinds:
                out[r.index] = r.index(g)
    return out


def _candidates(g: Graph, by_kind: dict[int, list[Rule]], flags_ok: set[Any], fold: bool,
                indexes: dict[type[RuleIndex], RuleIndex]) -> np.ndarray:
    """Ops a rule or folding might apply to, found with whole-array operations."""
    no = g.num_ops
    cand = np.zeros(no, dtype=bool)
    rows = csr_rows(g.in_ptr)
    prod = g.input_producers()
    pk = np.where(prod >= 0, g.op_kind[np.maximum(prod, 0)], -1)
    has: dict[int, np.ndarray] = {}
    has_const: dict[Any, np.ndarray] = {}
    const_at: tuple[np.ndarray, np.ndarray] | None = None
    for kind, rules in by_kind.items():
        of_kind = g.op_kind == kind
        if not of_kind.any():
            continue
        for r in rules:
            if r.flag not in flags_ok:
                continue
            m = of_kind.copy()
            for k in r.needs:
                h = has.get(k)
                if h is None:
                    h = has[k] = np.bincount(rows[pk == k], minlength=no) > 0
                m &= h
            for pred in r.const_needs:
                h = has_const.get(pred)
                if h is None:
                    if const_at is None:
                        const_at = _const_inputs(g, rows, prod, pk)
                    h = has_const[pred] = _has_const(g, pred, *const_at)
                m &= h
            if r.index is not None:
                m &= indexes[r.index].mask
            cand |= m
    if fold:
        n_in = np.diff(g.in_ptr)
        non_const = np.bincount(rows[pk != CONST.id], minlength=no)
        cand |= (n_in > 0) & (non_const == 0) & (g.op_kind != CONST.id)
    return cand


def _const_inputs(g: Graph, rows: np.ndarray, prod: np.ndarray, pk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(consuming op, constant index) for each input edge that reads a constant."""
    at = np.flatnonzero(pk == CONST.id)
    const_ops = prod[at]
    index = {a: dict(g.attrs[a])["index"] for a in np.unique(g.op_attr[const_ops]).tolist()}
    cidx = np.array([index[a] for a in g.op_attr[const_ops].tolist()], dtype=np.int64)
    return rows[at], cidx


def _has_const(g: Graph, pred: Callable[[np.ndarray], bool], ops: np.ndarray, cidx: np.ndarray) -> np.ndarray:
    """Per op: whether one of its inputs is a constant that passes ``pred`` (asked once per constant)."""
    uniq = np.unique(cidx)
    ok = np.zeros(len(g.constants), dtype=bool)
    for i in uniq.tolist():
        try:
            ok[i] = bool(pred(g.constants[i]))
        except Exception:  # the match asks again, and behaves as without the prefilter
            ok[i] = True
    return np.bincount(ops[ok[cidx]], minlength=g.num_ops) > 0


def _fold(e: Emitter, old: Graph, op: int, ins: list[int], outs: list[int], limit: int) -> bool:
    # errors ignored and a failing kernel left to fail at run time, where it is reported
    news = fold_op(get_op(int(old.op_kind[op])), old.attrs_of(op), int(old.op_version[op]),
                [e.constants[e.vconst[v]] for v in ins], [old.type_of(v) for v in outs], limit=limit,
                in_types=[e.type_of(v) for v in ins], errstate="ignore", catch=True)
    if news is None:
        return False
    for v, r in zip(outs, news, strict=True):
        e.replace(v, e.constant(r))
    return True


def refines(new: Any, old: Any) -> bool:
    """True when type ``new`` is ``old`` or a more precise form of it (same dtype; known where ``old`` was not).

    >>> from opgraph.core.types import TensorType
    >>> refines(TensorType("f8", ()), TensorType("f8", None)), refines(TensorType("f8", (2,)), TensorType("f4", (2,)))
    (True, False)
    """
    if new == old:
        return True
    if not (isinstance(new, TensorType) and isinstance(old, TensorType)) or new.dtype != old.dtype:
        return False
    if old.shape is None:
        return True
    return new.shape is not None and len(new.shape) == len(old.shape) and all(
        o is None or o == n for n, o in zip(new.shape, old.shape, strict=True))


def _try_rules(e: Emitter, op: int, ins: list[int], outs: list[int], rules: list[Rule],
               flags: frozenset[str], counts: dict[str, int], strict: bool, refine: bool = False) -> bool:
    kind = e.kind[op]
    root_attrs = e.attrs_of_op(op)
    vtype, types = e.vtype, e.types
    root_tids = [vtype[v] for v in outs]
    m = Match()
    m.e = e
    m.root_attrs = root_attrs
    m.root_types = tuple(types[t] for t in root_tids)
    m.flags = flags
    m.root_ins = ins
    m.root_kind = kind
    m.root_op = op  # the op's index in the input graph (for passes that planned something per op)
    for rule in rules:
        p = rule.pattern
        if p.attrs is not None and not p.attrs(root_attrs):
            continue
        if m:
            m.clear()
        m.aliases = []
        if p.children and not _match_inputs(p, kind, ins, e, m):
            continue
        if rule.where is not None and not rule.where(m):
            continue
        mark = e.checkpoint()
        result = rule.replace(m)
        if result is None:
            e.rollback(mark)
            continue
        news = result if isinstance(result, tuple) else (result,)
        if [vtype[v] for v in news] != root_tids:
            got = tuple(types[vtype[v]] for v in news)
            if got != m.root_types and not (refine and all(map(refines, got, m.root_types))):
                e.rollback(mark)
                if strict:
                    raise AssertionError(f"rule {rule.name}: replacement has types {got}, the op has {m.root_types}")
                continue
        for v, nv in zip(outs, news, strict=True):
            e.replace(v, nv)
        for was, now in m.aliases:
            if e.type_of(was) == e.type_of(now):
                e.replace(was, now)
        counts[rule.name] = counts.get(rule.name, 0) + 1
        return True
    return False


def fold_constants(graph: Graph, *, limit: int = FOLD_LIMIT) -> PassResult:
    """Evaluate every op whose inputs are all constants (outputs of at most ``limit`` elements each).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> b.output(b.add(b.constant(2.0), b.constant(3.0)))
    >>> g = fold_constants(b.freeze()).graph
    >>> g.run()
    [array(5.)]
    >>> g.num_ops
    1
    """
    return rewrite(graph, None, fold=True, fold_limit=limit)
