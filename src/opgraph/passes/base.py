"""Pass framework: results, graph compaction, and the emitter rule passes write into.

A *pass* is a function ``Graph -> PassResult``. It never mutates its input;
``PassResult.graph`` is the new graph (the input itself when nothing
changed) and ``PassResult.counts`` says how often each rule fired.

    >>> import opgraph
    >>> from opgraph.passes.base import PassResult
    >>> r = PassResult(opgraph.GraphBuilder().freeze(), {"x": 2})
    >>> r.changed, r.total
    (True, 2)

Adding a pass
-------------
A local rewrite is data, not a pass: a :class:`~opgraph.passes.rewrite.Rule`
(pattern, replacement, and the condition under which it is exact) added to
the rule set of its purpose in :mod:`opgraph.passes.rules` (``SIMPLIFY``,
``FUSE``, ``LAYOUT``, ...), which :func:`~opgraph.passes.rewrite.rewrite`
applies in one topological walk. A whole-graph pass is a function
``Graph -> PassResult`` that builds a new graph (an
:class:`Emitter`, or ``graph.replace(...)`` for array-level changes: a pass
never mutates its input) in O(n log n) or better; it joins the optimiser by
its name in :func:`opgraph.passes.pipeline.pipeline_for` at the level
where it belongs (and in ``LEVELS``' description). Tests: before/expected
graphs in ``tests/test_passes.py``, and optimised against unoptimised
results on random graphs in ``tests/test_passes_property.py``. A pass that
renames nothing and changes nothing returns its input:

    >>> def drop_nothing(graph):
    ...     return PassResult(graph, {})
    >>> g = opgraph.GraphBuilder().freeze()
    >>> drop_nothing(g).graph is g, drop_nothing(g).changed
    (True, False)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgraph.core.graph import PTR, Graph, Symbols, csr_rows, ranges
from opgraph.core.intern import Interner
from opgraph.core.registry import CONST, Attrs, exact_key, get_op, resolve
from opgraph.core.types import TensorType, ValueType


@dataclass
class PassResult:
    """What a pass returns: the new graph and how often each rule fired."""

    graph: Graph
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """True when some rule fired."""
        return any(self.counts.values())

    @property
    def total(self) -> int:
        """Number of rewrites in all."""
        return int(sum(self.counts.values()))


def use_counts(graph: Graph) -> np.ndarray:
    """Uses of each value: consuming ops, plus one per ``get`` gateway and per update source.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2,)))
    >>> b.output(b.add(x, x))
    >>> use_counts(b.freeze()).tolist()
    [2, 1]
    """
    n = graph.num_values
    uses = np.bincount(graph.in_ids, minlength=n)
    uses += np.bincount(graph.outputs, minlength=n)
    uses += np.bincount(graph.updates[:, 0], minlength=n)
    return uses


def compact(graph: Graph, keep_op: np.ndarray, value_map: np.ndarray | None = None) -> Graph:
    """A new graph with only the ops in ``keep_op``; uses of value v become uses of ``value_map[v]``.

    Inputs always stay. Values are renumbered in order, constants no kept op
    uses are dropped, and names, descriptions and gateways follow their
    values (a merged value's name moves to its representative if that has
    none). Vectorised: no Python loop over ops or values.
    """
    nv = graph.num_values
    vmap = np.arange(nv, dtype=np.int64) if value_map is None else np.asarray(value_map, dtype=np.int64)
    keep_op = np.asarray(keep_op, dtype=bool)
    keep_val = np.zeros(nv, dtype=bool)
    keep_val[graph.inputs] = True
    out_rows = csr_rows(graph.out_ptr)
    keep_val[graph.out_ids[keep_op[out_rows]]] = True
    new_vid = np.cumsum(keep_val, dtype=np.int64) - 1
    new_op = np.cumsum(keep_op, dtype=np.int64) - 1
    kept = np.flatnonzero(keep_op)

    n_in = np.diff(graph.in_ptr)[kept]
    in_ptr = np.zeros(len(kept) + 1, dtype=PTR)
    np.cumsum(n_in, out=in_ptr[1:])
    in_sel = ranges(graph.in_ptr[kept], graph.in_ptr[kept + 1])
    in_ids = new_vid[vmap[graph.in_ids[in_sel]]]
    n_out = np.diff(graph.out_ptr)[kept]
    out_ptr = np.zeros(len(kept) + 1, dtype=PTR)
    np.cumsum(n_out, out=out_ptr[1:])
    out_ids = new_vid[graph.out_ids[ranges(graph.out_ptr[kept], graph.out_ptr[kept + 1])]]

    vals = np.flatnonzero(keep_val)
    prod = graph.value_producer[vals].astype(np.int64)
    value_producer = np.where(prod >= 0, new_op[np.maximum(prod, 0)], -1)

    # Interned attributes: only those kept ops use; const ops renumbered into the kept constants.
    op_attr_old = graph.op_attr[kept]
    used_attrs, op_attr = np.unique(op_attr_old, return_inverse=True)
    attrs: list[Attrs] = [graph.attrs[a] for a in used_attrs.tolist()]
    constants = list(graph.constants)
    const_names = dict(graph.symbols.constants)
    is_const = graph.op_kind[kept] == CONST.id
    const_attr_ids = np.unique(op_attr[is_const]).tolist()
    old_cidx = [dict(attrs[a])["index"] for a in const_attr_ids]
    if len(set(old_cidx)) != len(constants):
        order = sorted(set(old_cidx))
        renum = {c: i for i, c in enumerate(order)}
        constants = [graph.constants[c] for c in order]
        for a, c in zip(const_attr_ids, old_cidx, strict=True):
            attrs[a] = (("index", renum[c]),)
        const_names = {renum[c]: nm for c, nm in graph.symbols.constants.items() if c in renum}
    else:
        renum = None

    sym = graph.symbols
    names: dict[int, str] = {}
    for v, nm in sym.values.items():
        if keep_val[v] and vmap[v] == v:
            names[int(new_vid[v])] = nm
    for v, nm in sym.values.items():
        rep = int(vmap[v])
        if rep != v and keep_val[rep] and int(new_vid[rep]) not in names:
            names[int(new_vid[rep])] = nm
    op_names = {int(new_op[o]): nm for o, nm in sym.ops.items() if keep_op[o]}
    desc: dict[tuple[str, int], str] = {}
    for (k, i), text in sym.descriptions.items():
        if k == "value":
            if keep_val[i]:
                desc[(k, int(new_vid[i]))] = text
        elif k == "op":
            if keep_op[i]:
                desc[(k, int(new_op[i]))] = text
        elif k == "constant":
            if renum is None or i in renum:
                desc[(k, i if renum is None else renum[i])] = text
        else:
            desc[(k, i)] = text
    upd = graph.updates
    return Graph(
        op_kind=graph.op_kind[kept], op_attr=op_attr, op_version=graph.op_version[kept],
        in_ptr=in_ptr, in_ids=in_ids, out_ptr=out_ptr, out_ids=out_ids,
        value_type=graph.value_type[vals], value_producer=value_producer, value_index=graph.value_index[vals],
        types=graph.types, attrs=attrs, constants=constants,
        inputs=new_vid[graph.inputs], outputs=new_vid[vmap[graph.outputs]],
        updates=np.stack([new_vid[vmap[upd[:, 0]]], new_vid[upd[:, 1]]], axis=1) if len(upd) else upd,
        symbols=Symbols(names, op_names, const_names, desc, dict(sym.io)),
    )


class Emitter:
    """An overlay on an old graph that a rule pass appends to.

    The old graph's ops and values keep their ids; new ops and values are
    appended after them, and ``vmap[v]`` redirects a replaced value (follow it
    with :meth:`find`). :meth:`finish` orders the new ops just before the op
    they replace, renumbers everything, remaps gateways and drops dead ops.
    Rules call :meth:`op` and :meth:`constant`; :meth:`checkpoint` and
    :meth:`rollback` undo a replacement that is rejected.
    """

    BIG = 1 << 62

    def __init__(self, old: Graph) -> None:
        self.old = old
        self.base_ops, self.base_values = old.num_ops, old.num_values
        type_table: Interner[ValueType] = Interner(list(old.types))
        attr_table: Interner[Attrs] = Interner(list(old.attrs), key=exact_key)
        self.types, self.type_ids, self._tid = type_table.items, type_table.ids, type_table.id
        self.attrs, self.attr_ids, self._aid = attr_table.items, attr_table.ids, attr_table.id
        self.constants: list[np.ndarray] = list(old.constants)
        self.kind: list[int] = old.op_kind.tolist()
        self.attr: list[int] = old.op_attr.tolist()
        self.version: list[int] = old.op_version.tolist()
        self.in_ptr: list[int] = old.in_ptr.tolist()
        self.in_ids: list[int] = old.in_ids.tolist()
        self.out_ptr: list[int] = old.out_ptr.tolist()
        self.out_ids: list[int] = old.out_ids.tolist()
        self.vtype: list[int] = old.value_type.tolist()
        self.vprod: list[int] = old.value_producer.tolist()
        self.vidx: list[int] = old.value_index.tolist()
        vconst = np.full(old.num_values, -1, dtype=np.int64)
        const_ops = np.flatnonzero(old.op_kind == CONST.id)
        if len(const_ops):
            idx = {a: dict(old.attrs[a])["index"] for a in np.unique(old.op_attr[const_ops]).tolist()}
            vconst[old.out_ids[old.out_ptr[const_ops]]] = [idx[a] for a in old.op_attr[const_ops].tolist()]
        self.vconst: list[int] = vconst.tolist()
        self.uses: list[int] = use_counts(old).tolist()
        self.vmap: list[int] = list(range(old.num_values))
        self.anchor: list[int] = []  # per appended op: the old op it is emitted for
        self.root = -1               # the old op being rewritten
        self._memo: dict[Any, tuple[tuple[int, ...], int, int]] = {}
        self._attr_dicts: dict[int, dict[str, Any]] = {}
        self.pred_cache: dict[Any, bool] = {}  # (constant predicate, constant index) -> result
        self.facts: dict[Any, Any] = {}  # per-pass facts rules reuse (rewrite puts each rule's RuleIndex here)

    # ------------------------------------------------------------ queries
    def find(self, v: int) -> int:
        """The value that now stands for ``v``."""
        vmap = self.vmap
        while vmap[v] != v:
            v = vmap[v]
        return v

    def type_of(self, v: int) -> ValueType:
        """Type of value ``v``."""
        return self.types[self.vtype[v]]

    def attrs_of_op(self, op: int) -> dict[str, Any]:
        """Attributes of op ``op``."""
        aid = self.attr[op]
        d = self._attr_dicts.get(aid)
        if d is None:
            d = self._attr_dicts[aid] = dict(self.attrs[aid])
        return d

    def const_value(self, v: int) -> np.ndarray | None:
        """The array of value ``v`` if a const op produces it."""
        c = self.vconst[v]
        return None if c < 0 else self.constants[c]

    def inputs_of(self, op: int) -> list[int]:
        """Current input values of op ``op`` (replacements followed)."""
        find = self.find
        return [find(v) for v in self.in_ids[self.in_ptr[op]:self.in_ptr[op + 1]]]

    # ------------------------------------------------------------ emitting
    def raw_op(self, kind: int, aid: int, version: int, ins: list[int], out_tids: list[int] | tuple[int, ...],
               const: int = -1) -> int:
        """Append an op whose types are known; return its first output."""
        op = len(self.kind)
        self.kind.append(kind)
        self.attr.append(aid)
        self.version.append(version)
        self.in_ids.extend(ins)
        self.in_ptr.append(len(self.in_ids))
        self.anchor.append(self.root)
        first = len(self.vtype)
        for i, t in enumerate(out_tids):
            self.vtype.append(t)
            self.vprod.append(op)
            self.vidx.append(i)
            self.vconst.append(const)
            self.uses.append(0)
            self.vmap.append(first + i)
            self.out_ids.append(first + i)
        self.out_ptr.append(len(self.out_ids))
        uses = self.uses
        for v in ins:
            uses[v] += 1
        return first

    def op(self, kind: str, *ins: int, **attrs: Any) -> Any:
        """Emit op ``kind`` on values ``ins``; its output (or a tuple of outputs)."""
        opdef = get_op(kind)
        in_tids = tuple(self.vtype[v] for v in ins)
        key = (opdef.id, exact_key(attrs), in_tids)
        memo = self._memo.get(key)
        if memo is None:
            r = resolve(opdef, [self.types[t] for t in in_tids], attrs)
            memo = self._memo[key] = (tuple(self._tid(t) for t in r.out_types), r.version, self._aid(r.attrs))
        out_tids, version, aid = memo
        first = self.raw_op(opdef.id, aid, version, list(ins), out_tids)
        if len(out_tids) == 1:
            return first
        return tuple(range(first, first + len(out_tids)))

    def constant(self, value: Any, dtype: Any = None) -> int:
        """Emit a const op for ``value`` (cast to ``dtype`` if given)."""
        arr = np.array(value, dtype=dtype)
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")
        arr.flags.writeable = False
        cidx = len(self.constants)
        self.constants.append(arr)
        return self.raw_op(CONST.id, self._aid((("index", cidx),)), 0, [], (self._tid(TensorType.of(arr)),), cidx)

    def constant_again(self, v: int) -> int:
        """A new const op on the array of constant value ``v``, shared, not copied: for a rule that rebuilds an
        op on an unchanged constant, so that the new const's use count is its own (the old op, left dead, keeps
        counting its uses until :meth:`finish`)."""
        cidx = self.vconst[v]
        assert cidx >= 0, f"value {v} is not a constant"
        return self.raw_op(CONST.id, self._aid((("index", cidx),)), 0, [], (self.vtype[v],), cidx)

    def replace(self, v: int, new: int) -> None:
        """From now on, uses of ``v`` are uses of ``new``."""
        if v != new:
            self.vmap[v] = new
            self.uses[new] += self.uses[v]

    def checkpoint(self) -> tuple[int, ...]:
        """A mark to :meth:`rollback` to."""
        return (len(self.kind), len(self.in_ids), len(self.out_ids), len(self.vtype), len(self.constants))

    def rollback(self, mark: tuple[int, ...]) -> None:
        """Forget everything emitted after ``mark``."""
        n_op, n_in, n_out, n_v, n_c = mark
        for v in self.in_ids[n_in:]:
            self.uses[v] -= 1
        del self.kind[n_op:], self.attr[n_op:], self.version[n_op:], self.anchor[n_op - self.base_ops:]
        del self.in_ptr[n_op + 1:], self.out_ptr[n_op + 1:]
        del self.in_ids[n_in:], self.out_ids[n_out:]
        del self.vtype[n_v:], self.vprod[n_v:], self.vidx[n_v:], self.vconst[n_v:], self.uses[n_v:]
        del self.vmap[n_v:]
        del self.constants[n_c:]

    def finish(self) -> Graph:
        """The new graph: appended ops placed before the op they replace, everything renumbered, no dead ops."""
        old = self.old
        n_new = len(self.kind) - self.base_ops
        if n_new == 0 and all(v == i for i, v in enumerate(self.vmap)):
            return old
        vm = np.asarray(self.vmap, dtype=np.int64)
        while True:
            nxt = vm[vm]
            if np.array_equal(nxt, vm):
                break
            vm = nxt
        pos = np.empty(self.base_ops, dtype=np.int64)
        pos[old.topological_order()] = np.arange(self.base_ops)
        anchor = np.asarray(self.anchor, dtype=np.int64)
        n_ops = len(self.kind)
        # Ops: old op o at (pos[o], BIG); new op k emitted for root r at (pos[r], k).
        key1 = np.concatenate([pos, pos[anchor]]) if n_new else pos
        key2 = np.concatenate([np.full(self.base_ops, self.BIG), np.arange(n_new)])
        op_order = np.lexsort((key2, key1))
        # Values: old v at (v, BIG); a new value just before the first output of its op's root.
        n_values = len(self.vtype)
        vprod = np.asarray(self.vprod, dtype=np.int64)
        out_ptr = np.asarray(self.out_ptr, dtype=np.int64)
        out_ids = np.asarray(self.out_ids, dtype=np.int64)
        new_vals = np.arange(self.base_values, n_values)
        root_first = out_ids[out_ptr[anchor]] if n_new else np.zeros(0, np.int64)
        v1 = np.concatenate([np.arange(self.base_values), root_first[vprod[new_vals] - self.base_ops]])
        v2 = np.concatenate([np.full(self.base_values, self.BIG), new_vals])
        val_order = np.lexsort((v2, v1))
        new_vid = np.empty(n_values, dtype=np.int64)
        new_vid[val_order] = np.arange(n_values)
        new_op = np.empty(n_ops, dtype=np.int64)
        new_op[op_order] = np.arange(n_ops)
        in_ptr = np.asarray(self.in_ptr, dtype=np.int64)
        in_ids = np.asarray(self.in_ids, dtype=np.int64)
        n_in = np.diff(in_ptr)[op_order]
        ptr = np.zeros(n_ops + 1, dtype=np.int64)
        np.cumsum(n_in, out=ptr[1:])
        ins = new_vid[vm[in_ids[ranges(in_ptr[op_order], in_ptr[op_order + 1])]]]
        n_out = np.diff(out_ptr)[op_order]
        optr = np.zeros(n_ops + 1, dtype=np.int64)
        np.cumsum(n_out, out=optr[1:])
        outs = new_vid[out_ids[ranges(out_ptr[op_order], out_ptr[op_order + 1])]]
        prod = vprod[val_order]
        value_producer = np.where(prod >= 0, new_op[np.maximum(prod, 0)], -1)
        names: dict[int, str] = {}
        for v, nm in old.symbols.values.items():
            names[int(new_vid[v])] = nm
        for v, nm in old.symbols.values.items():  # a replaced value's name moves to its replacement if unnamed
            rep = int(new_vid[vm[v]])
            if vm[v] != v and rep not in names:
                del names[int(new_vid[v])]
                names[rep] = nm
        # An op keeps its name; a replaced op's name goes to the new op computing its first output, if unnamed.
        op_names = {int(new_op[o]): nm for o, nm in old.symbols.ops.items()}
        for o, nm in old.symbols.ops.items():
            first = int(old.out_ids[old.out_ptr[o]]) if old.out_ptr[o + 1] > old.out_ptr[o] else -1
            rep = int(vm[first]) if first >= 0 else first
            if rep != first and rep >= 0 and vprod[rep] >= self.base_ops and int(new_op[vprod[rep]]) not in op_names:
                op_names[int(new_op[vprod[rep]])] = nm
        upd = old.updates
        g = Graph(
            op_kind=np.asarray(self.kind)[op_order], op_attr=np.asarray(self.attr)[op_order],
            op_version=np.asarray(self.version)[op_order], in_ptr=ptr, in_ids=ins, out_ptr=optr, out_ids=outs,
            value_type=np.asarray(self.vtype)[val_order], value_producer=value_producer,
            value_index=np.asarray(self.vidx)[val_order], types=self.types, attrs=self.attrs,
            constants=self.constants, inputs=new_vid[old.inputs], outputs=new_vid[vm[old.outputs]],
            updates=np.stack([new_vid[vm[upd[:, 0]]], new_vid[upd[:, 1]]], axis=1) if len(upd) else upd,
            symbols=Symbols(names, op_names, dict(old.symbols.constants), {}, dict(old.symbols.io)),
        )
        # Names of dead values go with them in DCE; keep only one name per value and per name.
        from opgraph.passes.dce import dce

        return dce(g).graph


def merge_counts(total: dict[str, int], counts: Mapping[str, int]) -> None:
    """Add ``counts`` into ``total``."""
    for k, n in counts.items():
        if n:
            total[k] = total.get(k, 0) + n
