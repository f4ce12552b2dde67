"""Encodings of the .cg records: attributes, types and constants; set/get index bases.

Also how TensCalc's copies into scalarised inputs become update edges (and back).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from opgraph.core.builder import exact_key
from opgraph.core.dtypes import CODE_DTYPES, DTYPE_CODES
from opgraph.core.graph import Graph
from opgraph.core.registry import CONST
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType, ValueType, VoidType
from opgraph.errors import GraphError
from opgraph.io.cg.format import (
    CONST_RECORD_BASE,
    F64_UNKNOWN,
    METADATA_RECORD,
    SUBGRAPH_RECORD,
    TC_DOUBLE_FULL,
    TC_DOUBLE_SPARSE,
    TC_FTENSOR2SCALARS,
    TC_INT64_TENSOR,
    TC_INT64_VECTOR,
    TC_SCALARS2FTENSOR,
    TC_STRING,
)


# ============================================================== attribute / type encoding
def _f8(v: float) -> str:
    return struct.pack(">d", v).hex()


def enc_attr(v: Any, bodies: dict[Subgraph, int] | None = None) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return {"f8": _f8(float(v))}
    if isinstance(v, (complex, np.complexfloating)):
        c = complex(v)
        return {"c16": [_f8(c.real), _f8(c.imag)]}
    if isinstance(v, tuple):
        return [enc_attr(x, bodies) for x in v]
    if isinstance(v, Subgraph) and bodies is not None and v in bodies:
        return {"subgraph": bodies[v]}
    raise GraphError(f"attribute value {v!r} ({type(v).__name__}) cannot be stored in a .cg file")


def _dec_f8(s: Any) -> float:
    if not isinstance(s, str) or len(s) != 16:
        raise ValueError(f"bad float bits {s!r}")
    return struct.unpack(">d", bytes.fromhex(s))[0]


def dec_attr(x: Any, depth: int = 0, bodies: dict[int, Subgraph] | None = None) -> Any:
    if depth > 100:
        raise ValueError("attribute nesting too deep")
    if x is None or isinstance(x, (bool, str, int)):
        return x
    if isinstance(x, list):
        return tuple(dec_attr(y, depth + 1, bodies) for y in x)
    if isinstance(x, dict) and len(x) == 1:
        ((tag, body),) = x.items()
        if tag == "f8":
            return _dec_f8(body)
        if tag == "subgraph":
            if type(body) is not int or bodies is None or body not in bodies:
                raise ValueError(f"{x!r} does not name a subgraph record (type {SUBGRAPH_RECORD}) of the .cgc "
                                 f"file before this one"[:300])
            return bodies[body]
        if tag == "c16" and isinstance(body, list) and len(body) == 2:
            return complex(_dec_f8(body[0]), _dec_f8(body[1]))
    raise ValueError(f"bad attribute value {x!r}"[:200])


def enc_type(t: ValueType) -> Any:
    if isinstance(t, VoidType):
        return {"void": True}
    return {"dtype": t.dtype.name, "shape": None if t.shape is None else list(t.shape)}


def dec_type(x: Any) -> ValueType:
    from opgraph.core.types import VOID

    if x == {"void": True}:
        return VOID
    if not isinstance(x, dict) or set(x) != {"dtype", "shape"} or not isinstance(x["dtype"], str):
        raise ValueError(f"bad type {x!r}"[:200])
    shape = x["shape"]
    if shape is not None and (not isinstance(shape, list) or len(shape) > 64
                              or not all(d is None or (type(d) is int and d >= 0) for d in shape)):
        raise ValueError(f"bad shape {shape!r}"[:200])
    return TensorType(x["dtype"], None if shape is None else tuple(shape))


# ============================================================== constants
def const_record_default(c: np.ndarray, tenscalc: bool) -> int:
    """The record type a constant is written as by default (TensCalc's types in files without metadata).

    >>> const_record_default(np.zeros(3, np.int64), True), const_record_default(np.zeros(3, np.int64), False)
    (20001, 105)
    """
    return const_record_default_of(c.dtype, c.ndim, tenscalc)


def const_record_default_of(dtype: np.dtype, ndim: int, tenscalc: bool) -> int:
    """:func:`const_record_default` of any constant of ``dtype`` and ``ndim`` dimensions.

    >>> const_record_default_of(np.dtype(np.float64), 2, True)
    10001
    """
    if tenscalc:
        if dtype == np.float64:
            return TC_DOUBLE_FULL
        if dtype == np.int64:
            return TC_INT64_VECTOR if ndim == 1 else TC_INT64_TENSOR
        if dtype == np.uint8 and ndim == 1:
            return TC_STRING
    return CONST_RECORD_BASE + DTYPE_CODES[dtype.name]


def const_record_fits(rtype: int, c: np.ndarray) -> bool:
    if rtype == TC_DOUBLE_FULL:
        return c.dtype == np.float64
    if rtype == TC_INT64_VECTOR:
        return c.dtype == np.int64 and c.ndim == 1
    if rtype == TC_INT64_TENSOR:
        return c.dtype == np.int64
    if rtype == TC_STRING:
        return c.dtype == np.uint8 and c.ndim == 1
    return rtype == CONST_RECORD_BASE + DTYPE_CODES.get(c.dtype.name, -1)


def constant_length(rtype: int, c: np.ndarray) -> int:
    """``len(encode_constant(rtype, c))`` without encoding it."""
    data = c.size * c.dtype.itemsize
    return data if rtype in (TC_INT64_VECTOR, TC_STRING) else 8 + 8 * c.ndim + data


def encode_constant(rtype: int, c: np.ndarray) -> bytes:
    if rtype in (TC_INT64_VECTOR, TC_STRING):
        return np.ascontiguousarray(c, dtype=c.dtype.newbyteorder("<")).tobytes()
    head = np.array([c.ndim, *c.shape], dtype="<i8").tobytes()
    if rtype in (TC_DOUBLE_FULL, TC_INT64_TENSOR):
        return head + np.asarray(c, dtype=c.dtype.newbyteorder("<")).ravel(order="F").tobytes()
    return head + np.ascontiguousarray(c, dtype=c.dtype.newbyteorder("<")).tobytes()


def decode_constant(rtype: int, data: np.ndarray, fail: Callable[[str], NoReturn]) -> np.ndarray:
    """Decode one .cgc constant record's data (a uint8 array); ``fail(msg)`` raises."""
    n = len(data)
    if rtype == TC_STRING:
        return np.array(data, dtype=np.uint8)
    if rtype == TC_INT64_VECTOR:
        if n % 8:
            fail(f"int64l_full_vector data of {n} bytes is not a whole number of int64 values")
        return data.view("<i8").astype(np.int64)
    if rtype in (TC_DOUBLE_FULL, TC_INT64_TENSOR):
        dtype, order = np.dtype("<f8" if rtype == TC_DOUBLE_FULL else "<i8"), "F"
    elif CONST_RECORD_BASE < rtype <= CONST_RECORD_BASE + max(CODE_DTYPES):
        dtype, order = CODE_DTYPES[rtype - CONST_RECORD_BASE].newbyteorder("<"), "C"
    elif rtype == TC_DOUBLE_SPARSE:
        fail("constant type 10002 (TensCalc double_sparse_tensor) is not supported")
    else:
        fail(f"unknown record type {rtype}: not a constant, subgraph ({SUBGRAPH_RECORD}) or metadata "
             f"({METADATA_RECORD}) record type this opgraph knows (written by a newer opgraph?)")
    if n < 8:
        fail(f"constant data of {n} bytes is shorter than its int64 ndim")
    ndim = int(data[:8].view("<i8")[0])
    if not 0 <= ndim <= 64:
        fail(f"constant has ndim {ndim} (0..64 allowed)")
    if n < 8 + 8 * ndim:
        fail(f"constant data of {n} bytes is shorter than its header (ndim {ndim})")
    sizes = [int(s) for s in data[8:8 + 8 * ndim].view("<i8")]
    if any(s < 0 for s in sizes):
        fail(f"constant has a negative size {sizes}")
    count = math.prod(sizes)
    if math.prod(s for s in sizes if s) * dtype.itemsize >= 2**62:
        fail(f"constant shape {tuple(sizes)} is too large for any array")
    body = n - 8 - 8 * ndim
    if count * dtype.itemsize != body:
        fail(f"constant of shape {tuple(sizes)} ({dtype.name}) needs {count * dtype.itemsize} data bytes, "
             f"the record has {body}")
    values = data[8 + 8 * ndim:].view(dtype)
    if dtype.kind == "b" and count and int(data[8 + 8 * ndim:].max()) > 1:
        fail("bool constant holds bytes other than 0 and 1")
    arr = values.reshape(sizes, order=order)
    return np.array(arr, dtype=dtype.newbyteorder("="), order="C", copy=True)


def _record_dtype(rtype: int) -> tuple[np.dtype, str] | None:
    """Element dtype (little-endian) and order of a constant record with an ndim/sizes header, else None."""
    if rtype == TC_DOUBLE_FULL:
        return np.dtype("<f8"), "F"
    if rtype == TC_INT64_TENSOR:
        return np.dtype("<i8"), "F"
    if CONST_RECORD_BASE < rtype <= CONST_RECORD_BASE + max(CODE_DTYPES) and rtype - CONST_RECORD_BASE in CODE_DTYPES:
        return CODE_DTYPES[rtype - CONST_RECORD_BASE].newbyteorder("<"), "C"
    return None


BULK_MIN = 8
"""Constants of one record type and shape decoded together when at least this many share them."""


class BulkConstants:
    """Many .cgc constant records decoded at once (:func:`decode_constants`).

    ``arrays``: the constants in record order; ``form``: per constant, its
    index in ``forms``, the distinct ``(dtype, shape)`` pairs in order of
    first use.
    """

    def __init__(self, arrays: list[np.ndarray], form: np.ndarray, forms: list[tuple[np.dtype, tuple[int, ...]]]):
        self.arrays, self.form, self.forms = arrays, form, forms


def _i8_at(body: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The little-endian int64 at each byte position of ``body`` (positions checked by the caller)."""
    return body[pos[:, None] + np.arange(8)].view("<i8")[:, 0].astype(np.int64)


def decode_constants(body: np.ndarray, at: np.ndarray, rtype: np.ndarray, length: np.ndarray) -> BulkConstants | None:
    """Decode the constant records whose data is ``body[at[i]:at[i] + length[i]]`` (record type ``rtype[i]``).

    Records of one type and shape are decoded together with NumPy. Returns
    None when any record is not a valid constant: the caller then decodes
    them one by one with :func:`decode_constant`, which names the first
    problem. Gives the arrays :func:`decode_constant` gives.

    >>> enc = [encode_constant(10001, np.full((1, 1), float(i))) for i in range(9)]
    >>> body = np.frombuffer(b"".join(enc), np.uint8)
    >>> at = np.arange(9) * len(enc[0])
    >>> out = decode_constants(body, at, np.full(9, 10001), np.full(9, len(enc[0])))
    >>> [float(c[0, 0]) for c in out.arrays], out.forms
    ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [(dtype('float64'), (1, 1))])
    """
    n = len(at)
    at = at.astype(np.int64, copy=False)
    rtype = rtype.astype(np.int64, copy=False)
    length = length.astype(np.int64, copy=False)
    arrays: list[Any] = [None] * n
    form = np.empty(n, dtype=np.int64)
    form_ids: dict[tuple[str, tuple[int, ...]], int] = {}
    forms: list[tuple[np.dtype, tuple[int, ...]]] = []

    def form_of(dtype: np.dtype, shape: tuple[int, ...]) -> int:
        key = (dtype.str, shape)
        if key not in form_ids:
            form_ids[key] = len(forms)
            forms.append((dtype, shape))
        return form_ids[key]

    def put(members: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], order: str, skip: int) -> None:
        """Records ``members`` hold one shape: values after ``skip`` header bytes."""
        count = math.prod(shape)
        size = count * dtype.itemsize
        form[members] = form_of(dtype.newbyteorder("="), shape)
        start = at[members] + skip
        if len(members) < BULK_MIN:
            for i, s in zip(members.tolist(), start.tolist(), strict=True):
                vals = body[s:s + size].view(dtype).reshape(shape, order=order)  # type: ignore[call-overload]
                arrays[i] = np.array(vals, dtype=dtype.newbyteorder("="), order="C", copy=True)
            return
        m = len(members)
        vals = body[start[:, None] + np.arange(size)].view(dtype)
        if order == "F":
            block = vals.reshape((m, *shape[::-1])).transpose(0, *range(len(shape), 0, -1))
        else:
            block = vals.reshape((m, *shape))
        block = np.ascontiguousarray(block, dtype=dtype.newbyteorder("="))
        if shape:
            for i, a in zip(members.tolist(), block, strict=True):
                arrays[i] = a
        else:
            for i, a in zip(members.tolist(), block.reshape(m, 1), strict=True):
                arrays[i] = a.reshape(())

    for t in np.unique(rtype).tolist():
        sel = np.flatnonzero(rtype == t)
        lens = length[sel]
        if t == TC_STRING:
            for i in sel.tolist():
                arrays[i] = np.array(body[at[i]:at[i] + length[i]], dtype=np.uint8)
                form[i] = form_of(np.dtype(np.uint8), (int(length[i]),))
            continue
        if t == TC_INT64_VECTOR:
            if (lens % 8).any():
                return None
            for ln in np.unique(lens).tolist():
                put(sel[lens == ln], np.dtype("<i8"), (ln // 8,), "C", 0)
            continue
        spec = _record_dtype(t)
        if spec is None or (lens < 8).any():
            return None
        dtype, order = spec
        ndims = _i8_at(body, at[sel])
        if ((ndims < 0) | (ndims > 64)).any() or (lens < 8 + 8 * ndims).any():
            return None
        for nd in np.unique(ndims).tolist():
            grp = sel[ndims == nd]
            pos = at[grp]
            sizes = np.stack([_i8_at(body, pos + 8 + 8 * k) for k in range(nd)], axis=1) if nd else \
                np.zeros((len(grp), 0), np.int64)
            key = np.column_stack([length[grp], sizes])
            uniq, inv = np.unique(key, axis=0, return_inverse=True)
            inv = inv.reshape(-1)
            for u, row in enumerate(uniq.tolist()):
                ln, shape = row[0], tuple(row[1:])
                if any(d < 0 for d in shape):
                    return None
                if math.prod(d for d in shape if d) * dtype.itemsize >= 2**62:
                    return None
                if math.prod(shape) * dtype.itemsize != ln - 8 - 8 * nd:
                    return None
                members = grp[inv == u]
                if dtype.kind == "b" and math.prod(shape):
                    hi = body[(at[members] + 8 + 8 * nd)[:, None] + np.arange(math.prod(shape))]
                    if int(hi.max()) > 1:
                        return None
                put(members, dtype, shape, order, 8 + 8 * nd)
    if forms:  # forms in order of first use
        first = np.full(len(forms), n, dtype=np.int64)
        np.minimum.at(first, form, np.arange(n))
        rank = np.empty(len(forms), dtype=np.int64)
        order_ = np.argsort(first, kind="stable")
        rank[order_] = np.arange(len(forms))
        form = rank[form]
        forms = [forms[k] for k in order_.tolist()]
    return BulkConstants(arrays, form, forms)


# ============================================================== io base detection
def _io_base_score(base: int, sets: np.ndarray, gets: np.ndarray, produced: np.ndarray,
                   const_out: np.ndarray, limit: int) -> int | None:
    """Score of reading set/get indices with ``base`` (None: impossible). See the module doc."""
    s = sets.astype(np.int64) - base
    g = gets.astype(np.int64) - base
    n_ref = len(produced)
    if (len(s) and int(s.min()) < 0) or (len(g) and int(g.min()) < 0):
        return None
    top = max(n_ref, int(s.max()) + 1 if len(s) else 0, int(g.max()) + 1 if len(g) else 0)
    if top > limit:
        return None
    if len(s):
        inside = s[s < n_ref]
        if produced[inside].any() or len(np.unique(s)) != len(s):
            return None
    setmask = np.zeros(top, dtype=bool)
    setmask[s] = True
    prod = np.zeros(top, dtype=bool)
    prod[:n_ref] = produced
    orphans = int(np.count_nonzero(~prod & ~setmask))
    outside = int(np.count_nonzero(s >= n_ref)) + int(np.count_nonzero((g >= n_ref) & ~setmask[g]))
    gi = g[g < n_ref]
    const_gets = int(np.count_nonzero(const_out[gi]))
    return orphans + outside + const_gets


def detect_io_base(sets: np.ndarray, gets: np.ndarray, produced: np.ndarray, const_out: np.ndarray,
                   limit: int) -> int | None:
    s0 = _io_base_score(0, sets, gets, produced, const_out, limit)
    s1 = _io_base_score(1, sets, gets, produced, const_out, limit)
    if s0 is None and s1 is None:
        return None
    if s1 is None or (s0 is not None and s0 <= s1):
        return 0
    return 1


# ============================================================== saving


# ------------------------------------------------------- copies into scalarised inputs
class CopyProblem(Exception):
    """A copy pair that is neither a copy into an input nor into the scalars of a set variable."""

    def __init__(self, pair: int, message: str) -> None:
        super().__init__(message)
        self.pair, self.message = pair, message


def scalar_copies(view: Graph, counts: Sequence[int]) -> tuple[Graph, list[int]]:
    """``view`` (whose ``updates`` are a file's copy pairs) with its copies into scalars made update edges.

    TensCalc's ``saveScalarized`` writes a copy of a set variable as pairs
    (source scalar, destination scalar) whose destinations are the outputs of
    the ``ftensor2scalars`` that splits the variable (``counts``: pairs per
    copy record). For each copy record and each such variable this appends a
    ``scalars2ftensor`` of the variable's entries in column-major order (the
    copied sources at their positions, the variable's own scalars elsewhere),
    from a ``[1 .. n]`` subscripts constant (``1 x n``, shared by the copies of
    ``n`` scalars), and an update edge from it to the variable. The file does
    not store the variable's size, so the new value is a vector of its ``n``
    entries: the variable must be read only by ``ftensor2scalars`` (as
    saveScalarized writes it), which sees the same entries. Pairs into inputs
    stay update edges. Returns the graph (``file_meta`` and symbols of
    ``view``) and the number of update edges per copy record.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", None), name="x")
    >>> x0, x1 = b.op("ftensor2scalars", x, nout=2)
    >>> y = b.op("Sexp", x0)
    >>> b.output(y)
    >>> g = b.freeze()
    >>> h, rows = scalar_copies(g.replace(updates=[[y.id, x0.id]]), [1])   # x(1) <- exp(x(1))
    >>> [h.kind_of(op) for op in range(h.num_ops)], h.updates.tolist(), rows
    (['ftensor2scalars', 'Sexp', 'const', 'scalars2ftensor'], [[5, 0]], [1])
    >>> ctx = opgraph.compile(h).context()
    >>> ctx.set("x", np.array([0.0, 2.0])); ctx.update()
    >>> ctx.get("x"), ctx.get(y.id)
    (array([1., 2.]), array(2.71828183))
    """
    pairs = view.updates.astype(np.int64)
    src, dst = pairs[:, 0], pairs[:, 1]
    n_vals, n_ops = view.num_values, view.num_ops
    rec = np.repeat(np.arange(len(counts)), np.asarray(counts, dtype=np.int64))
    is_input = np.zeros(n_vals, dtype=bool)
    is_input[view.inputs] = True
    scal = ~is_input[dst]
    rows_per_record = np.bincount(rec, minlength=len(counts)).tolist()
    if not scal.any():
        return view, rows_per_record
    idx = np.flatnonzero(scal)
    prod = view.value_producer[dst[idx]].astype(np.int64)
    ok = prod >= 0
    ok[ok] = view.op_kind[prod[ok]] == TC_FTENSOR2SCALARS
    n_in = np.diff(view.in_ptr)
    ok[ok] = n_in[prod[ok]] == 1
    ok[ok] = is_input[view.in_ids[view.in_ptr[prod[ok]]]]
    if not ok.all():
        k = int(idx[np.flatnonzero(~ok)[0]])
        raise CopyProblem(k, f"copy destination {int(dst[k])} is not an input "
                             f"(it is produced by record {int(view.value_producer[dst[k]])})")
    # A scalar copied twice by one gateway has no single meaning.
    key = rec[idx] * n_vals + dst[idx]
    _, first = np.unique(key, return_index=True)
    if len(first) != len(idx):
        k = int(idx[np.setdiff1d(np.arange(len(idx)), first)[0]])
        raise CopyProblem(k, f"copy destination {int(dst[k])} is copied twice by one copy gateway")
    # One group per (copy record, ftensor2scalars op), in order of first pair.
    gkey = rec[idx] * n_ops + prod
    _, gfirst, ginv = np.unique(gkey, return_index=True, return_inverse=True)
    order = np.argsort(gfirst, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    group = rank[ginv.reshape(-1)]
    types, attrs, constants = list(view.types), list(view.attrs), list(view.constants)

    def table_id(table: list[Any], entry: Any, key: Callable[[Any], Any]) -> int:
        want = key(entry)
        for i, t in enumerate(table):
            if key(t) == want:
                return i
        table.append(entry)
        return len(table) - 1

    f64 = table_id(types, F64_UNKNOWN, lambda t: t)
    nout1 = table_id(attrs, (("nout", 1),), exact_key)
    kinds: list[int] = []
    op_attr: list[int] = []
    ins: list[np.ndarray] = []
    vtypes: list[int] = []
    subs_value: dict[int, int] = {}
    group_value = np.empty(len(order), dtype=np.int64)
    group_dest = np.empty(len(order), dtype=np.int64)
    cptr, cops = view.consumers()
    by_group = np.argsort(group, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=len(order)))])
    for gi, first_pair in enumerate(gfirst[order].tolist()):
        op = int(prod[first_pair])
        var = int(view.in_ids[view.in_ptr[op]])
        readers = cops[cptr[var]:cptr[var + 1]]
        other = readers[view.op_kind[readers] != TC_FTENSOR2SCALARS]
        if len(other):  # its new value would need the size the file does not store
            k = int(idx[first_pair])
            raise CopyProblem(k, f"copy destination {int(dst[k])} is a scalar of variable {var}, which record "
                                 f"{int(other[0])} reads as a tensor (only ftensor2scalars may read it)")
        outs = view.out_ids[view.out_ptr[op]:view.out_ptr[op + 1]].astype(np.int64)
        n = len(outs)
        members = by_group[bounds[gi]:bounds[gi + 1]]
        entries = outs.copy()
        entries[view.value_index[dst[idx[members]]]] = src[idx[members]]
        if n not in subs_value:
            c = np.arange(1, n + 1, dtype=np.int64).reshape(1, n)
            constants.append(c)
            kinds.append(CONST.id)
            op_attr.append(table_id(attrs, (("index", len(constants) - 1),), exact_key))
            ins.append(np.zeros(0, np.int64))
            vtypes.append(table_id(types, TensorType.of(c), lambda t: t))
            subs_value[n] = n_vals + len(vtypes) - 1
        kinds.append(TC_SCALARS2FTENSOR)
        op_attr.append(nout1)
        ins.append(np.concatenate([[subs_value[n]], entries]))
        vtypes.append(f64)
        group_value[gi] = n_vals + len(vtypes) - 1
        group_dest[gi] = var
    m = len(kinds)
    n_in_new = np.array([len(a) for a in ins], dtype=np.int64)
    emit = ~scal
    first_of_group = np.zeros(len(pairs), dtype=bool)
    first_of_group[idx[gfirst]] = True
    emit |= first_of_group
    rows = pairs.copy()
    rows[idx, 0] = group_value[group]
    rows[idx, 1] = group_dest[group]
    graph = Graph(
        op_kind=np.concatenate([view.op_kind, kinds]),
        op_attr=np.concatenate([view.op_attr, op_attr]),
        op_version=np.concatenate([view.op_version, np.zeros(m, np.int64)]),
        in_ptr=np.concatenate([view.in_ptr, view.in_ptr[-1] + np.cumsum(n_in_new)]),
        in_ids=np.concatenate([view.in_ids, *ins]),
        out_ptr=np.concatenate([view.out_ptr, view.out_ptr[-1] + np.arange(1, m + 1)]),
        out_ids=np.concatenate([view.out_ids, np.arange(n_vals, n_vals + m)]),
        value_type=np.concatenate([view.value_type, vtypes]),
        value_producer=np.concatenate([view.value_producer, np.arange(n_ops, n_ops + m)]),
        value_index=np.concatenate([view.value_index, np.zeros(m, np.int64)]),
        types=types, attrs=attrs, constants=constants,
        inputs=view.inputs, outputs=view.outputs, updates=rows[emit],
        symbols=view.symbols, file_meta=view.file_meta,
    )
    return graph, np.bincount(rec[emit], minlength=len(counts)).tolist()
