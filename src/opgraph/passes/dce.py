"""Dead-code elimination and common-subexpression elimination (vectorised whole-graph passes).

    >>> import opgraph
    >>> from opgraph.passes import dce, cse
    >>> b = opgraph.GraphBuilder(hash_cons=False)
    >>> x = b.input(("float64", (3,)), name="x")
    >>> y1, y2 = b.exp(x), b.exp(x)
    >>> _ = b.log(x)                  # unused
    >>> b.output(b.add(y1, y2))
    >>> r = dce(b.freeze())
    >>> r.counts, r.graph.num_ops
    ({'dce.ops': 1}, 3)
    >>> r = cse(r.graph)
    >>> r.counts, r.graph.num_ops
    ({'cse.ops': 1}, 2)
"""

from __future__ import annotations

import numpy as np

from opgraph.core.graph import Graph, csr_rows, hash_rows, ranges
from opgraph.core.registry import CONST, all_ops
from opgraph.passes.base import PassResult, compact, use_counts


def dce(graph: Graph, *, max_rounds: int = 32) -> PassResult:
    """Drop every op that no ``get`` gateway and no update (``copy``) source needs; inputs stay.

    Unused constants are dropped from the constants table too. Dead ops are
    peeled in vectorised rounds (ops none of whose outputs has a use, then
    their producers, ...), so the cost follows the longest dead chain, not the
    depth of the graph; after ``max_rounds`` a reachability walk from the
    gateways finishes the job.
    """
    keep = ~_dead_ops(graph, max_rounds)
    dropped = int(graph.num_ops - keep.sum())
    if dropped == 0:
        return PassResult(graph, {})
    return PassResult(compact(graph, keep), {"dce.ops": dropped})


def _dead_ops(g: Graph, max_rounds: int) -> np.ndarray:
    no, nv = g.num_ops, g.num_values
    uses = use_counts(g)
    out_rows = csr_rows(g.out_ptr)
    live = np.bincount(out_rows, weights=uses[g.out_ids] > 0, minlength=no)
    dead = live == 0
    newly = np.flatnonzero(dead)
    for _ in range(max_rounds):
        if len(newly) == 0:
            return dead
        ins = g.in_ids[ranges(g.in_ptr[newly], g.in_ptr[newly + 1])]
        if len(ins) == 0:
            return dead
        uses -= np.bincount(ins, minlength=nv)
        touched = np.unique(ins)
        prods = g.value_producer[touched[uses[touched] == 0]]
        prods = np.unique(prods[prods >= 0])
        prods = prods[~dead[prods]]
        n_out = g.out_ptr[prods + 1] - g.out_ptr[prods]
        outs = g.out_ids[ranges(g.out_ptr[prods], g.out_ptr[prods + 1])]
        rows = np.repeat(np.arange(len(prods)), n_out)
        alive = np.bincount(rows, weights=uses[outs] > 0, minlength=len(prods))
        newly = prods[alive == 0]
        dead[newly] = True
    targets = np.concatenate([g.outputs, g.updates[:, 0]])
    return ~g.needed_ops(targets)


def _commutative_ids() -> np.ndarray:
    ids = [d.id for d in all_ops() if d.commutative]
    return np.asarray(ids, dtype=np.int64)


def _const_classes(graph: Graph) -> np.ndarray:
    """For each attribute entry used by a const op, a class id equal for equal constants (bytes, dtype, shape)."""
    cls = np.full(len(graph.attrs), -1, dtype=np.int64)
    const_ops = np.flatnonzero(graph.op_kind == CONST.id)
    seen: dict[tuple[str, tuple[int, ...], bytes], int] = {}
    for aid in np.unique(graph.op_attr[const_ops]).tolist():
        c = graph.constants[dict(graph.attrs[aid])["index"]]
        key = (c.dtype.str, c.shape, c.tobytes())
        cls[aid] = seen.setdefault(key, len(seen))
    return cls


def _group_first(rows: np.ndarray) -> np.ndarray:
    """For each row, the index of the first equal row (rows are in priority order)."""
    h = hash_rows(rows)
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    rep = first[inverse]
    if not np.array_equal(rows, rows[rep]):  # a hash collision: group exactly
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        rep = first[inverse.reshape(-1)]
    return rep


def cse(graph: Graph, *, max_rounds: int = 64) -> PassResult:
    """Merge ops with identical kind, attributes, version and inputs.

    Commutative binary ops are normalised (inputs sorted), and constants with
    equal dtype, shape and bytes are merged. The earliest op (in topological
    order) of each class survives. Each round is vectorised; rounds repeat
    while merging reveals new duplicates (two identical chains need one round
    per link, so after ``max_rounds`` the remaining work is done by a
    dictionary walk).
    """
    no, nv = graph.num_ops, graph.num_values
    if no == 0:
        return PassResult(graph, {})
    order = graph.topological_order()
    pos = np.empty(no, dtype=np.int64)
    pos[order] = np.arange(no)
    n_in = np.diff(graph.in_ptr)
    n_out = np.diff(graph.out_ptr)
    attr_col = graph.op_attr.astype(np.int64)
    is_const = graph.op_kind == CONST.id
    if is_const.any():
        cls = _const_classes(graph)
        attr_col = np.where(is_const, -1 - cls[graph.op_attr], attr_col)
    comm = np.isin(graph.op_kind, _commutative_ids()) & (n_in == 2)
    groups = []
    ordered = graph.is_topologically_ordered()
    for k in np.unique(n_in).tolist():
        ops = np.flatnonzero(n_in == k)
        if not ordered:
            ops = ops[np.argsort(pos[ops], kind="stable")]
        cols = np.empty((len(ops), 4 + k), dtype=np.int64)
        cols[:, 0] = graph.op_kind[ops]
        cols[:, 1] = attr_col[ops]
        cols[:, 2] = graph.op_version[ops]
        cols[:, 3] = n_out[ops]
        in_pos = graph.in_ptr[ops][:, None] + np.arange(k)[None, :] if k else np.zeros((len(ops), 0), np.int64)
        groups.append((ops, cols, in_pos, comm[ops]))
    vmap = np.arange(nv, dtype=np.int64)
    rep_op = np.arange(no, dtype=np.int64)
    out_rows = csr_rows(graph.out_ptr)
    in_rows = csr_rows(graph.in_ptr)
    subset: np.ndarray | None = None  # after the first round, only ops reading a newly merged value can merge
    for _round in range(max_rounds):
        new = 0
        for ops, cols, in_pos, cm in groups:
            if subset is not None:
                sel = subset[ops]
                if not sel.any():
                    continue
                ops, cols, in_pos, cm = ops[sel], cols[sel], in_pos[sel], cm[sel]
            k = in_pos.shape[1]
            if k:
                ins = vmap[graph.in_ids[in_pos]]
                if k == 2 and cm.any():
                    lo = np.minimum(ins[:, 0], ins[:, 1])
                    hi = np.maximum(ins[:, 0], ins[:, 1])
                    ins[cm, 0], ins[cm, 1] = lo[cm], hi[cm]
                cols[:, 4:] = ins
            rep = ops[_group_first(cols)]
            changed = rep != rep_op[ops]
            if changed.any():
                new += int(changed.sum())
                rep_op[ops] = rep
        if not new:
            break
        # Outputs of a merged op become the representative's outputs (same position).
        before = vmap.copy()
        merged = rep_op[out_rows] != out_rows
        src = graph.out_ids[merged]
        rows = rep_op[out_rows[merged]]
        vmap[src] = graph.out_ids[graph.out_ptr[rows] + graph.value_index[src]]
        while True:
            nxt = vmap[vmap]
            if np.array_equal(nxt, vmap):
                break
            vmap = nxt
        # Two ops can newly agree only if both read (through vmap) a value that just became a target.
        target = np.zeros(nv, dtype=bool)
        target[vmap[vmap != before]] = True
        touched = target[vmap[graph.in_ids]]
        subset = np.bincount(in_rows[touched], minlength=no) > 0
    else:
        return _cse_walk(graph, vmap, rep_op, is_const, attr_col, comm)
    dropped = int((rep_op != np.arange(no)).sum())
    if dropped == 0:
        return PassResult(graph, {})
    return PassResult(compact(graph, rep_op == np.arange(no), vmap), {"cse.ops": dropped})


def _cse_walk(graph: Graph, vmap: np.ndarray, rep_op: np.ndarray, is_const: np.ndarray,
              attr_col: np.ndarray, comm: np.ndarray) -> PassResult:
    """Finish CSE with one dictionary walk in topological order (deep duplicated chains)."""
    vm = vmap.tolist()
    seen: dict[tuple[int, ...], int] = {}
    in_ptr, in_ids = graph.in_ptr.tolist(), graph.in_ids.tolist()
    out_ptr, out_ids = graph.out_ptr.tolist(), graph.out_ids.tolist()
    kinds, vers, attrs, cm = graph.op_kind.tolist(), graph.op_version.tolist(), attr_col.tolist(), comm.tolist()
    keep = np.ones(graph.num_ops, dtype=bool)
    for op in graph.topological_order().tolist():
        ins = [vm[v] for v in in_ids[in_ptr[op]:in_ptr[op + 1]]]
        if cm[op] and ins[0] > ins[1]:
            ins.reverse()
        key = (kinds[op], attrs[op], vers[op], *ins)
        hit = seen.get(key)
        if hit is None:
            seen[key] = op
            continue
        keep[op] = False
        for a, b in zip(out_ids[out_ptr[op]:out_ptr[op + 1]], out_ids[out_ptr[hit]:out_ptr[hit + 1]], strict=True):
            vm[a] = b
    dropped = int((~keep).sum())
    if dropped == 0:
        return PassResult(graph, {})
    return PassResult(compact(graph, keep, np.asarray(vm, dtype=np.int64)), {"cse.ops": dropped})


__all__ = ["cse", "dce", "ranges"]
