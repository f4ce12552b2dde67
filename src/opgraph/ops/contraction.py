"""Contraction ops: matmul, einsum, tensordot, vecdot, outer.

Shapes and dtypes follow NumPy (``np.matmul``, ``np.einsum``,
``np.tensordot``, ``np.vecdot``, ``np.outer``); ``einsum`` runs through
opt_einsum, which picks the contraction order. Ids 600-699.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (4, 2, 3)), name="x")
    >>> y = b.input(("float32", (3,)), name="y")
    >>> b.op("matmul", x, y).type
    f64[4,2]
    >>> b.op("einsum", x, y, subscripts="bij,j").type
    f64[4,2]
    >>> b.op("matmul", x, b.input(("float64", (4, 5))))
    Traceback (most recent call last):
    ...
    opgraph.errors.OpBuildError: matmul(f64[4,2,3], f64[4,5]): shapes [4,2,3] and [4,5] do not match: ...
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opgraph.core.registry import Attr, OpDef, attr_any, attr_int, attr_str, mark_traits, register_op, set_rules
from opgraph.core.types import Shape, TensorType, ValueType, broadcast_shapes, shape_str
from opgraph.errors import OpTypeError
from opgraph.ops import batch_helpers as bh
from opgraph.ops._common import normalize_axis, tensor, ufunc_dtypes, write_out
from opgraph.ops.grad_helpers import rank as _rank
from opgraph.ops.grad_helpers import swap_last, unbroadcast
from opgraph.ops.jvp_helpers import multilinear

FAMILY = "contraction"
Dim = int | None


def _known_product(dims: Sequence[Dim]) -> Dim:
    if any(d is None for d in dims):
        return None
    return int(np.prod(dims, dtype=np.int64))  # type: ignore[arg-type]


# ---------------------------------------------------------------- matmul
def matmul_shape(a: Shape, b: Shape) -> Shape:
    """Result shape of NumPy's ``matmul`` (1-D promotion and removal, batch broadcasting).

    >>> matmul_shape((2, 1, 3, 4), (5, 4, 2))
    (2, 5, 3, 2)
    >>> matmul_shape((None, 3), (3,))
    (None,)
    >>> matmul_shape((2, 3), (4, 5))
    Traceback (most recent call last):
    ...
    opgraph.errors.OpTypeError: shapes [2,3] and [4,5] do not match: ...
    """
    if a == () or b == ():
        raise OpTypeError(f"matmul needs inputs of rank >= 1, got shapes {shape_str(a)} and {shape_str(b)}")
    if a is None or b is None:
        return None
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    k1, k2 = a2[-1], b2[-2]
    if k1 is not None and k2 is not None and k1 != k2:
        raise OpTypeError(f"shapes {shape_str(a)} and {shape_str(b)} do not match: the last axis of the first "
                          f"({k1}) must equal the {'only' if len(b) == 1 else 'second-to-last'} axis of the second "
                          f"({k2})")
    try:
        batch = broadcast_shapes(a2[:-2], b2[:-2])
    except OpTypeError:
        raise OpTypeError(f"batch dims of shapes {shape_str(a)} and {shape_str(b)} do not broadcast") from None
    assert batch is not None
    return batch + ((a2[-2],) if len(a) > 1 else ()) + ((b2[-1],) if len(b) > 1 else ())


def _matmul_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, b = (tensor(t) for t in in_types)
    (dt,) = ufunc_dtypes(np.matmul, [a.dtype, b.dtype])
    return (TensorType(dt, matmul_shape(a.shape, b.shape)),)


def _matmul_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """NumPy's matmul; an N-D (C-contiguous) @ 2-D product runs as one 2-D GEMM on views.

    NumPy runs ``(197, 2, 768) @ (768, 2304)`` as 197 small products (8x slower than one
    ``(394, 768) @ (768, 2304)`` product); reshaping a C-contiguous ``a`` is free, and so is reshaping a
    C-contiguous ``out``.

    >>> a, b = np.arange(24.0).reshape(2, 3, 4), np.ones((4, 2))
    >>> bool(np.array_equal(_matmul_kernel(a, b), np.matmul(a, b)))
    True
    """
    if a.ndim >= 3 and b.ndim == 2 and a.flags.c_contiguous and a.size:
        shape = (*a.shape[:-1], b.shape[1])
        if out is None or not (out.flags.c_contiguous and out.shape == shape):
            r = np.matmul(a.reshape(-1, a.shape[-1]), b).reshape(shape)
            return write_out(r, out)  # type: ignore[no-any-return]
        np.matmul(a.reshape(-1, a.shape[-1]), b, out=out.reshape(-1, shape[-1]))
        return out
    return np.asarray(np.matmul(a, b, out=out))


def _matmul_specialize(in_types: Sequence[Any], out_types: Sequence[Any],
                       attrs: Mapping[str, Any]) -> tuple[Callable[..., Any], tuple[()], tuple[()]] | None:
    """np.matmul itself (a ufunc: it writes into ``out``) where no N-D @ 2-D reshaping can apply.

    >>> from opgraph.core.types import TensorType
    >>> _matmul_specialize([TensorType("f8", (2, 3)), TensorType("f8", (3, 4))], [], {})[0] is np.matmul
    True
    """
    a, b = in_types
    if a.shape is None or b.shape is None or (len(a.shape) >= 3 and len(b.shape) == 2):
        return None
    return np.matmul, (), ()


_matmul_kernel.specialize = _matmul_specialize  # type: ignore[attr-defined]


# ---------------------------------------------------------------- gradient rules
# rule(b, inputs, outputs, cotangents, attrs) -> cotangents of the inputs (see opgraph.ops.grad_helpers).
# Real dtypes; batch broadcasting is undone by summing.
def _matmul_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x, y = ins
    (g,) = cots
    x2, y2, g2 = x, y, g
    if _rank(x.type) == 1:
        x2, g2 = b.op("expand_dims", x, axis=0), b.op("expand_dims", g2, axis=-2 if _rank(g.type) else 0)
    if _rank(y.type) == 1:
        y2, g2 = b.op("expand_dims", y, axis=-1), b.op("expand_dims", g2, axis=-1)
    gx = unbroadcast(b, b.op("matmul", g2, swap_last(b, y2)), x2.type)
    gy = unbroadcast(b, b.op("matmul", swap_last(b, x2), g2), y2.type)
    if _rank(x.type) == 1:
        gx = b.op("squeeze", gx, axis=0)
    if _rank(y.type) == 1:
        gy = b.op("squeeze", gy, axis=-1)
    return [gx, gy]


def _einsum_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    # d out / d operand i: einsum of the other operands and the cotangent into operand i's subscripts.
    (g,) = cots
    explicit, _ = einsum_signature(attrs["subscripts"], [x.type.shape for x in ins])
    lhs, out = explicit.split("->")
    terms = lhs.split(",")
    grads = []
    for i, x in enumerate(ins):
        term = terms[i]
        labels = term.replace("...", "")
        if len(set(labels)) != len(labels):
            raise NotImplementedError(f"einsum gradient: operand {i} repeats a subscript ({term!r})")
        others = [t for j, t in enumerate(terms) if j != i] + [out]
        present = set("".join(others).replace(".", ""))
        kept = "".join(c for c in labels if c in present)
        target = term if kept == labels else (("..." if "..." in term else "") + kept)
        if "..." not in target and any("..." in t for t in others):
            target = "..." + target  # batch dims only the others have: summed by unbroadcast
        r = b.op("einsum", *[y for j, y in enumerate(ins) if j != i], g,
                 subscripts=",".join(others) + "->" + target, optimize=attrs["optimize"])
        if kept != labels:  # labels summed away in operand i alone: broadcast back
            if "..." in term and not term.startswith("..."):
                raise NotImplementedError(f"einsum gradient: subscripts {term!r}")
            lead = _rank(x.type) - len(labels)
            pos = tuple(lead + k for k, c in enumerate(labels) if c not in present)
            r = b.op("expand_dims", r, axis=pos)
            order = [c for c in labels if c in present]
            # expand_dims keeps the kept labels in order, so the axes line up with the term.
            del order
            r = b.op("broadcast_to", r, shape=x.type.shape)
        grads.append(unbroadcast(b, r, x.type))
    return grads


def _tensordot_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x, y = ins
    ax_a, ax_b = tensordot_axes(attrs["axes"], _rank(x.type), _rank(y.type))
    letters = iter(string.ascii_letters)
    ta = [next(letters) for _ in range(_rank(x.type))]
    tb = [next(letters) for _ in range(_rank(y.type))]
    for i, j in zip(ax_a, ax_b, strict=True):
        tb[j] = ta[i]
    out = "".join(c for k, c in enumerate(ta) if k not in ax_a) + "".join(c for k, c in enumerate(tb) if k not in ax_b)
    sub = "".join(ta) + "," + "".join(tb) + "->" + out
    return _einsum_grad(b, ins, outs, cots, {"subscripts": sub, "optimize": "auto"})


def _vecdot_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x, y = ins
    (g,) = cots
    axis = attrs["axis"]
    res = []
    for v, other in ((x, y), (y, x)):
        ax = normalize_axis(axis, _rank(v.type))
        oax = normalize_axis(axis, _rank(other.type))
        ge = b.op("expand_dims", g, axis=-1)
        o = b.op("moveaxis", other, source=oax, destination=-1) if oax != _rank(other.type) - 1 else other
        r = b.op("multiply", ge, o)
        t = v.type
        moved = TensorType(t.dtype, (*(d for k, d in enumerate(t.shape) if k != ax), t.shape[ax]))
        r = unbroadcast(b, r, moved)
        if ax != _rank(t) - 1:
            r = b.op("moveaxis", r, source=-1, destination=ax)
        res.append(r)
    return res


def _outer_grad(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    x, y = ins
    (g,) = cots
    xf, yf = b.op("reshape", x, shape=(-1,)), b.op("reshape", y, shape=(-1,))
    gx = b.op("reshape", b.op("matmul", g, yf), shape=x.type.shape)
    gy = b.op("reshape", b.op("matmul", xf, g), shape=y.type.shape)
    return [gx, gy]


register_op(OpDef(
    name="matmul", id=600, arity=2, infer=_matmul_infer, kernel=_matmul_kernel, family=FAMILY,
    grad=_matmul_grad,
    doc="matmul(a, b): NumPy's matmul (1-D operands promoted then removed; batch dims broadcast)",
))


# ---------------------------------------------------------------- einsum
_LETTERS = frozenset(string.ascii_letters)


@dataclass(frozen=True)
class _Term:
    """One operand's subscripts: labels before and after an optional ellipsis."""

    head: str
    ellipsis: bool
    tail: str

    @property
    def labels(self) -> str:
        return self.head + self.tail

    def render(self) -> str:
        return self.head + ("..." if self.ellipsis else "") + self.tail


def _parse_term(term: str, what: str) -> _Term:
    head, ell, tail = term.partition("...")
    if "." in head or "." in tail:
        raise OpTypeError(f"{what} {term!r} has a '.' that is not part of an ellipsis '...'")
    for c in head + tail:
        if c not in _LETTERS:
            raise OpTypeError(f"{what} {term!r} has invalid subscript {c!r}; subscripts must be letters")
    return _Term(head, bool(ell), tail)


def _merge_dims(dims: Sequence[Dim], label: str) -> Dim:
    # NumPy einsum broadcasts size-1 dims of a label across operands.
    known = {d for d in dims if d is not None and d != 1}
    if len(known) > 1:
        raise OpTypeError(f"subscript {label!r} has sizes {sorted(known)} that do not match")
    if known:
        return known.pop()
    return None if any(d is None for d in dims) else 1


def einsum_signature(subscripts: str, shapes: Sequence[Shape]) -> tuple[str, Shape]:
    """Parse einsum ``subscripts`` for operands of ``shapes``: the explicit form and the result shape.

    Follows ``np.einsum``: the implicit output is the ellipsis (if any)
    followed by the labels used once, in alphabetical order; size-1 dims
    broadcast; ellipsis dims broadcast. Unknown dims and ranks give ``None``.

    >>> einsum_signature("ij,jk", [(2, 3), (3, 4)])
    ('ij,jk->ik', (2, 4))
    >>> einsum_signature("...ij,...jk", [(5, 1, 2, 3), (4, 3, None)])
    ('...ij,...jk->...ik', (5, 4, 2, None))
    >>> einsum_signature("ii", [(3, 3)])
    ('ii->', ())
    >>> einsum_signature("ij,jk", [(2, 3), (4, 5)])
    Traceback (most recent call last):
    ...
    opgraph.errors.OpTypeError: subscript 'j' has sizes [3, 4] that do not match
    """
    spec = "".join(subscripts.split())
    lhs, arrow, rhs = spec.partition("->")
    if "->" in rhs or "-" in lhs + rhs or ">" in lhs + rhs:
        raise OpTypeError(f"subscripts {subscripts!r} have a stray '-' or '>' (use one '->')")
    raw_terms = lhs.split(",")
    if len(raw_terms) != len(shapes):
        raise OpTypeError(f"subscripts {subscripts!r} name {len(raw_terms)} operand(s), got {len(shapes)}")
    terms = [_parse_term(t, f"operand {i} subscripts") for i, t in enumerate(raw_terms)]

    sizes: dict[str, list[Dim]] = {}
    ell_shapes: list[Shape] = []
    for i, (term, shape) in enumerate(zip(terms, shapes, strict=True)):
        n = len(term.labels)
        if shape is None:
            dims: tuple[Dim, ...] = (None,) * n
            if term.ellipsis:
                ell_shapes.append(None)
        else:
            if len(shape) < n or (len(shape) != n and not term.ellipsis):
                raise OpTypeError(f"operand {i} has rank {len(shape)} but subscripts {term.render()!r} "
                                  f"name {n} ax{'i' if n == 1 else 'e'}s")
            dims = shape[:len(term.head)] + shape[len(shape) - len(term.tail):]
            if term.ellipsis:
                ell_shapes.append(shape[len(term.head):len(shape) - len(term.tail)])
        own: dict[str, Dim] = {}
        for label, d in zip(term.labels, dims, strict=True):
            prev = own.get(label)
            if prev is not None and d is not None and prev != d:
                raise OpTypeError(f"operand {i} repeats subscript {label!r} over axes of different sizes "
                                  f"({prev} != {d})")
            if prev is None:
                own[label] = d
            sizes.setdefault(label, []).append(d)
    size = {label: _merge_dims(dims, label) for label, dims in sizes.items()}
    try:
        ell = broadcast_shapes(*ell_shapes)
    except OpTypeError:
        shown = " and ".join(shape_str(s) for s in ell_shapes)
        raise OpTypeError(f"ellipsis dims {shown} do not broadcast") from None
    any_ellipsis = any(t.ellipsis for t in terms)

    if arrow:
        out = _parse_term(rhs, "output subscripts")
        for c in out.labels:
            if out.labels.count(c) > 1:
                raise OpTypeError(f"output subscripts {rhs!r} repeat {c!r}")
            if c not in size:
                raise OpTypeError(f"output subscript {c!r} does not appear in any operand's subscripts")
        if not out.ellipsis and ell:
            raise OpTypeError(f"operands have {len(ell)} broadcast (ellipsis) dim(s) but output "
                              f"subscripts {rhs!r} have no '...'")
    else:
        counts = "".join(t.labels for t in terms)
        once = "".join(c for c in sorted(set(counts)) if counts.count(c) == 1)
        out = _Term("", any_ellipsis, once)

    explicit = ",".join(t.render() for t in terms) + "->" + out.render()
    if out.ellipsis and ell is None:
        return explicit, None
    result = tuple(size[c] for c in out.head) + (ell if out.ellipsis and ell else ()) + tuple(
        size[c] for c in out.tail)
    return explicit, result


def _check_optimize(optimize: str) -> None:
    import opt_einsum

    try:
        opt_einsum.paths.get_path_fn(optimize)
    except KeyError:
        choices = ", ".join(sorted(getattr(opt_einsum.paths, "_PATH_OPTIONS", ())))
        raise OpTypeError(f"unknown optimize={optimize!r}; opt_einsum offers {choices or 'auto, greedy, optimal'}"
                          ) from None


def _einsum_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    ts = [tensor(t) for t in in_types]
    _check_optimize(attrs["optimize"])
    _, shape = einsum_signature(attrs["subscripts"], [t.shape for t in ts])
    return (TensorType(np.result_type(*(t.dtype for t in ts)), shape),)


@functools.lru_cache(maxsize=512)
def _einsum_plan(subscripts: str, shapes: tuple[tuple[int, ...], ...], optimize: str) -> Any:
    import opt_einsum

    explicit, _ = einsum_signature(subscripts, shapes)
    return opt_einsum.contract_expression(explicit, *shapes, optimize=optimize)


def einsum(subscripts: str, *operands: np.ndarray, optimize: str = "auto", out: np.ndarray | None = None) -> np.ndarray:
    """``np.einsum`` computed by opt_einsum, whose contraction plans are cached per subscripts and shapes.

    Operands are first cast to their common dtype, so every intermediate is
    computed in the result dtype as ``np.einsum`` does.

    >>> einsum("ij,jk,kl", np.ones((2, 3)), np.ones((3, 4)), np.ones((4, 5)))
    array([[12., 12., 12., 12., 12.],
           [12., 12., 12., 12., 12.]])
    """
    dt = np.result_type(*operands)
    arrays = [np.asarray(a).astype(dt, copy=False) for a in operands]
    plan = _einsum_plan(subscripts, tuple(a.shape for a in arrays), optimize)
    if out is not None and out.ndim > 0 and out.dtype == dt:
        # opt_einsum writes the last step into ``out`` (with ``out[:] = ...``, so not for 0-d).
        return plan(*arrays, out=out)  # type: ignore[no-any-return]
    return write_out(np.asarray(plan(*arrays)), out)  # type: ignore[no-any-return]


def _einsum_kernel(*operands: np.ndarray, out: np.ndarray | None = None, subscripts: str,
                   optimize: str) -> np.ndarray:
    return einsum(subscripts, *operands, optimize=optimize, out=out)


# ---------------------------------------------------------------- TTGT: a pairwise contraction as one GEMM
@dataclass(frozen=True)
class GemmOperand:
    """How one operand becomes a GEMM operand: sum ``sum_axes`` (labels no one else has), permute by ``perm``
    (a copy; None: no permutation), reshape to ``shape`` (a matrix, or a batch of them), then swap the last two
    axes if ``transpose`` (a view a GEMM reads without a copy)."""

    sum_axes: tuple[int, ...]
    perm: tuple[int, ...] | None
    shape: tuple[int, ...]
    transpose: bool


@dataclass(frozen=True)
class GemmLayout:
    """``einsum(la,lb->lo)`` as one (batched) matmul: ``a @ b`` (``b @ a`` if ``swap``), of shape
    ``product_shape``, reshaped to ``result_shape`` and permuted by ``result_perm`` (None: no permutation)."""

    a: GemmOperand
    b: GemmOperand
    swap: bool
    product_shape: tuple[int, ...]
    result_shape: tuple[int, ...]
    result_perm: tuple[int, ...] | None


def _identity_or(perm: Sequence[int]) -> tuple[int, ...] | None:
    p = tuple(perm)
    return None if p == tuple(range(len(p))) else p


def _blocks(labels: str, free: list[str]) -> tuple[bool, list[str]] | None:
    """How ``labels`` splits into a block of ``free`` labels and a block of the others: (free block first?, its
    order), or None when they interleave."""
    nf = len(free)
    if set(labels[:nf]) == set(free):
        return True, list(labels[:nf])
    if set(labels[len(labels) - nf:]) == set(free):
        return False, list(labels[len(labels) - nf:])
    return None


def gemm_layout(la: str, lb: str, lo: str, size: Mapping[str, int]) -> GemmLayout | None:
    """The TTGT plan of ``einsum(la,lb->lo)`` on operands of label sizes ``size``; None for a repeated label.

    Labels only in one operand and not in the output are summed first. Without batch labels (labels of both
    operands and the output), an operand whose labels come as two blocks (free, contracted; either way round)
    becomes a matrix by a reshape and at most a 2-D transpose, both views; the contracted labels take the order
    that leaves the larger operand so; the product is ``b @ a`` when the output wants b's free labels first.
    Only what cannot be read so is permuted (copied). Both the lowering rule ``lower.einsum_ttgt`` (as graph
    ops) and the NumPy einsum kernel (:func:`gemm`) follow this plan.

    >>> lay = gemm_layout("abij", "cdab", "ijcd", dict(a=8, b=8, c=8, d=8, i=2, j=2))
    >>> lay.a, lay.b.transpose, lay.swap, lay.result_perm
    (GemmOperand(sum_axes=(), perm=None, shape=(64, 4), transpose=True), True, False, None)
    """
    if len(set(la)) != len(la) or len(set(lb)) != len(lb) or len(set(lo)) != len(lo):
        return None
    a_sum = tuple(i for i, c in enumerate(la) if c not in lb and c not in lo)
    b_sum = tuple(i for i, c in enumerate(lb) if c not in la and c not in lo)
    la = "".join(c for i, c in enumerate(la) if i not in a_sum)
    lb = "".join(c for i, c in enumerate(lb) if i not in b_sum)
    batch = [c for c in la if c in lb and c in lo]
    contr = [c for c in la if c in lb and c not in lo]
    fa = [c for c in la if c not in lb]
    fb = [c for c in lb if c not in la]
    prod = lambda cs: int(np.prod([size[c] for c in cs], dtype=np.int64))  # noqa: E731
    nk, na, nn = prod(contr), prod(fa), prod(fb)
    if batch:
        nb = prod(batch)
        a = GemmOperand(a_sum, _identity_or([la.index(c) for c in batch + fa + contr]), (nb, na, nk), False)
        b = GemmOperand(b_sum, _identity_or([lb.index(c) for c in batch + contr + fb]), (nb, nk, nn), False)
        labels = batch + fa + fb
        return GemmLayout(a, b, False, (nb, na, nn), tuple(size[c] for c in labels),
                          _identity_or([labels.index(c) for c in lo]))

    def order_in(labels: str, block: list[str]) -> list[str]:
        return [c for c in labels if c in block]

    def copied(k_order: list[str]) -> int:  # elements permuted if the contracted labels take this order
        return sum(n * nk for labels, free, n in ((la, fa, na), (lb, fb, nn))
                   if _blocks(labels, free) is None or order_in(labels, contr) != k_order)

    k_order = min((order_in(la, contr), order_in(lb, contr)), key=copied)

    def operand(labels: str, free: list[str], sums: tuple[int, ...], free_first: bool) -> tuple[GemmOperand, list[str]]:
        nf = prod(free)
        split = _blocks(labels, free)
        if split is not None and order_in(labels, contr) == k_order:
            own_first, f_order = split
            return GemmOperand(sums, None, (nf, nk) if own_first else (nk, nf), own_first != free_first), f_order
        f_order = [c for c in lo if c in free]  # a copy anyway: the free labels in the output's order
        order = f_order + k_order if free_first else k_order + f_order
        return GemmOperand(sums, tuple(labels.index(c) for c in order), (nf, nk) if free_first else (nk, nf),
                           False), f_order

    b_first = bool(fa) and bool(fb) and lo.index(fb[0]) < lo.index(fa[0])
    a, fa_order = operand(la, fa, a_sum, not b_first)
    b, fb_order = operand(lb, fb, b_sum, b_first)
    labels = fb_order + fa_order if b_first else fa_order + fb_order
    return GemmLayout(a, b, b_first, (nn, na) if b_first else (na, nn), tuple(size[c] for c in labels),
                      _identity_or([labels.index(c) for c in lo]))


def label_sizes(terms: Sequence[str], shapes: Sequence[Sequence[int]]) -> dict[str, int] | None:
    """Each label's size across operands; None when one label has two sizes (einsum broadcasts a size-1 axis,
    which a GEMM plan does not).

    >>> label_sizes(["ij", "jk"], [(2, 3), (3, 4)]), label_sizes(["ij", "ij"], [(3, 1), (1, 2)])
    ({'i': 2, 'j': 3, 'k': 4}, None)
    """
    size: dict[str, int] = {}
    for t, s in zip(terms, shapes, strict=True):
        for c, d in zip(t, s, strict=True):
            if size.setdefault(c, int(d)) != d:
                return None
    return size


def _gemm_operand(x: np.ndarray, op: GemmOperand) -> np.ndarray:
    if op.sum_axes:
        x = x.sum(axis=op.sum_axes)
    if op.perm is not None:
        x = x.transpose(op.perm)
    x = x.reshape(op.shape)
    return x.swapaxes(-1, -2) if op.transpose else x


def gemm(layout: GemmLayout, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Run a :func:`gemm_layout` plan with NumPy; the product is written straight into a C-contiguous ``out``
    when the plan needs no final permutation.

    >>> a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(4, 3)
    >>> out = np.empty((4, 2))
    >>> gemm(gemm_layout("ij", "kj", "ki", dict(i=2, j=3, k=4)), a, b, out) is out, bool(np.allclose(out, b @ a.T))
    (True, True)
    """
    x, y = _gemm_operand(a, layout.a), _gemm_operand(b, layout.b)
    if layout.swap:
        x, y = y, x
    if out is not None and layout.result_perm is None and out.flags.c_contiguous:
        np.matmul(x, y, out=out.reshape(layout.product_shape))
        return out
    r = np.matmul(x, y).reshape(layout.result_shape)
    if layout.result_perm is not None:
        r = r.transpose(layout.result_perm)
    return write_out(r, out)  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=512)
def einsum_steps(subscripts: str, shapes: tuple[tuple[int, ...], ...], optimize: str
                 ) -> tuple[tuple[tuple[int, ...], str, GemmLayout | None], ...]:
    """opt_einsum's steps for static shapes: the operand positions each takes from the list (popped in that order,
    its result appended), its subscripts, and its GEMM plan (None: np.einsum runs the step). The NumPy kernel
    runs them; the lowering rule ``lower.einsum_pairwise`` writes them as graph ops.

    >>> [(inds, eq) for inds, eq, _ in einsum_steps("ij,jk,kl", ((2, 30), (30, 40), (40, 3)), "auto")]
    [((1, 0), 'jk,ij->ki'), ((1, 0), 'ki,kl->il')]
    """
    import opt_einsum

    explicit, _ = einsum_signature(subscripts, shapes)
    _, info = opt_einsum.contract_path(explicit, *shapes, shapes=True, optimize=optimize)
    current = list(shapes)
    steps = []
    for step in info.contraction_list:
        inds, eq = tuple(step[0]), step[2]
        ins = [current.pop(i) for i in inds]
        lhs, lo = eq.split("->")
        terms = lhs.split(",")
        size = label_sizes(terms, ins)
        layout = gemm_layout(terms[0], terms[1], lo, size) if len(terms) == 2 and size is not None else None
        steps.append((inds, eq, layout))
        current.append(einsum_signature(eq, ins)[1])  # type: ignore[arg-type]
    return tuple(steps)


def _einsum_specialize(in_types: Sequence[Any], out_types: Sequence[Any],
                       attrs: Mapping[str, Any]) -> tuple[Callable[..., Any], tuple[()], tuple[()]] | None:
    """For static float operands of the result's dtype: opt_einsum's steps, each pair a GEMM by
    :func:`gemm_layout` and the last written straight into ``out`` (opt_einsum's own last BLAS step cannot take
    ``out``: it would cost a temporary and a copy, 1.9x on a chain of four products)."""
    dt = out_types[0].dtype
    if dt.kind not in "fc" or "..." in attrs["subscripts"] or any(
            not t.is_static or t.dtype != dt for t in in_types):
        return None
    steps = einsum_steps(attrs["subscripts"], tuple(t.shape for t in in_types), attrs["optimize"])
    last = len(steps) - 1

    def run(*args: np.ndarray) -> np.ndarray:
        *ops, out = args
        for k, (inds, eq, layout) in enumerate(steps):
            tmp = [ops.pop(i) for i in inds]
            target = out if k == last else None
            ops.append(gemm(layout, *tmp, out=target) if layout is not None else np.einsum(eq, *tmp, out=target))
        return out  # type: ignore[no-any-return]

    return run, (), ()


_einsum_kernel.specialize = _einsum_specialize  # type: ignore[attr-defined]


register_op(OpDef(
    name="einsum", id=601, arity=None, min_inputs=1, infer=_einsum_infer, kernel=_einsum_kernel,
    attrs={"subscripts": Attr(attr_str, doc="Einstein summation subscripts, as np.einsum ('ij,jk->ik')"),
           "optimize": Attr(attr_str, "auto", "opt_einsum path optimizer ('auto', 'greedy', 'optimal', ...)")},
    family=FAMILY, grad=_einsum_grad,
    doc="einsum(*xs, subscripts, optimize='auto'): np.einsum semantics; opt_einsum picks the contraction order",
))


# ---------------------------------------------------------------- tensordot
def tensordot_axes(axes: Any, rank_a: int, rank_b: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Normalise ``tensordot``'s ``axes`` (an int N, or a pair of ints / int sequences) for given ranks.

    >>> tensordot_axes(2, 3, 2)
    ((1, 2), (0, 1))
    >>> tensordot_axes(((0, -1), (1, 0)), 3, 2)
    ((0, 2), (1, 0))
    """
    if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        n = int(axes)
        if n < 0:
            raise OpTypeError(f"axes={n} must be >= 0")
        if n > rank_a or n > rank_b:
            raise OpTypeError(f"axes={n} contracts more axes than the ranks {rank_a} and {rank_b} have")
        return tuple(range(rank_a - n, rank_a)), tuple(range(n))
    if not isinstance(axes, (tuple, list)) or len(axes) != 2:
        raise OpTypeError(f"axes must be an int or a pair (axes of a, axes of b), got {axes!r}")
    pair = []
    for side, rank in zip(axes, (rank_a, rank_b), strict=True):
        seq = (side,) if isinstance(side, (int, np.integer)) else side
        if not isinstance(seq, (tuple, list)) or any(
                isinstance(x, bool) or not isinstance(x, (int, np.integer)) for x in seq):
            raise OpTypeError(f"axes must be an int or a pair of ints / int sequences, got {axes!r}")
        norm = tuple(normalize_axis(int(x), rank) for x in seq)
        if len(set(norm)) != len(norm):
            raise OpTypeError(f"repeated axis in {tuple(seq)}")
        pair.append(norm)
    if len(pair[0]) != len(pair[1]):
        raise OpTypeError(f"axes {axes!r} name {len(pair[0])} axes of a but {len(pair[1])} of b")
    return pair[0], pair[1]


def tensordot_subscripts(axes: Any, rank_a: int, rank_b: int) -> tuple[str, str, str]:
    """``tensordot``'s contraction as einsum letters: (operand a's, operand b's, the result's).

    >>> tensordot_subscripts(1, 2, 2)
    ('ab', 'bd', 'ad')
    """
    axa, axb = tensordot_axes(axes, rank_a, rank_b)
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    la = [next(letters) for _ in range(rank_a)]
    lb = [next(letters) for _ in range(rank_b)]
    for i, j in zip(axa, axb, strict=True):
        lb[j] = la[i]
    lo = [c for i, c in enumerate(la) if i not in axa] + [c for j, c in enumerate(lb) if j not in axb]
    return "".join(la), "".join(lb), "".join(lo)


_UNKNOWN_RANK = 1 << 30  # stands in for an unknown rank when checking axes


@functools.cache
def _tensordot_dtype(a: np.dtype, b: np.dtype) -> np.dtype:
    return np.asarray(np.tensordot(np.ones((1,), a), np.ones((1,), b), axes=1)).dtype


def _tensordot_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, b = (tensor(t) for t in in_types)
    dt = _tensordot_dtype(a.dtype, b.dtype)
    if a.shape is None or b.shape is None:
        # The result's rank depends on the unknown one; still check what can be checked.
        tensordot_axes(attrs["axes"], _UNKNOWN_RANK if a.rank is None else a.rank,
                       _UNKNOWN_RANK if b.rank is None else b.rank)
        return (TensorType(dt, None),)
    ax_a, ax_b = tensordot_axes(attrs["axes"], len(a.shape), len(b.shape))
    for i, j in zip(ax_a, ax_b, strict=True):
        da, db = a.shape[i], b.shape[j]
        if da is not None and db is not None and da != db:
            raise OpTypeError(f"shapes {shape_str(a.shape)} and {shape_str(b.shape)} do not match: axis {i} of "
                              f"the first has size {da}, axis {j} of the second {db}")
    shape = tuple(d for i, d in enumerate(a.shape) if i not in ax_a) + tuple(
        d for j, d in enumerate(b.shape) if j not in ax_b)
    return (TensorType(dt, shape),)


def _tensordot_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, *, axes: Any) -> np.ndarray:
    return write_out(np.asarray(np.tensordot(a, b, axes=axes)), out)  # type: ignore[no-any-return]


register_op(OpDef(
    name="tensordot", id=602, arity=2, infer=_tensordot_infer, kernel=_tensordot_kernel,
    attrs={"axes": Attr(attr_any, 2, "N (last N axes of a with first N of b) or (axes of a, axes of b)")},
    family=FAMILY, grad=_tensordot_grad,
    doc="tensordot(a, b, axes=2): NumPy's tensordot (negative int axes are rejected)",
))


# ---------------------------------------------------------------- vecdot
def vecdot_shape(a: Shape, b: Shape, axis: int) -> Shape:
    """Result shape of ``vecdot`` along ``axis`` (taken on each operand), batch dims broadcast.

    >>> vecdot_shape((3, 4, 5), (4, 5), -2)
    (3, 5)
    """
    for s in (a, b):
        if s is not None:
            if len(s) == 0:
                raise OpTypeError(f"vecdot needs inputs of rank >= 1, got shapes {shape_str(a)} and {shape_str(b)}")
            normalize_axis(axis, len(s))
    if a is None or b is None:
        return None
    ia, ib = normalize_axis(axis, len(a)), normalize_axis(axis, len(b))
    if a[ia] is not None and b[ib] is not None and a[ia] != b[ib]:
        raise OpTypeError(f"shapes {shape_str(a)} and {shape_str(b)} do not match along axis {axis} "
                          f"({a[ia]} != {b[ib]})")
    try:
        return broadcast_shapes(a[:ia] + a[ia + 1:], b[:ib] + b[ib + 1:])
    except OpTypeError:
        raise OpTypeError(f"batch dims of shapes {shape_str(a)} and {shape_str(b)} do not broadcast") from None


def _vecdot_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, b = (tensor(t) for t in in_types)
    (dt,) = ufunc_dtypes(np.vecdot, [a.dtype, b.dtype])
    return (TensorType(dt, vecdot_shape(a.shape, b.shape, attrs["axis"])),)


def _vecdot_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, *, axis: int) -> np.ndarray:
    return np.asarray(np.vecdot(a, b, axis=axis, out=out))


register_op(OpDef(
    name="vecdot", id=603, arity=2, infer=_vecdot_infer, kernel=_vecdot_kernel,
    attrs={"axis": Attr(attr_int, -1, "axis to contract, counted on each operand (negative: from the end)")},
    family=FAMILY, grad=_vecdot_grad,
    doc="vecdot(x1, x2, axis=-1): sum(conj(x1) * x2) over axis with broadcast batch dims (Array API, np.vecdot)",
))


# ---------------------------------------------------------------- outer
def _outer_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    a, b = (tensor(t) for t in in_types)
    (dt,) = ufunc_dtypes(np.multiply, [a.dtype, b.dtype])
    sizes = tuple(None if t.shape is None else _known_product(t.shape) for t in (a, b))
    return (TensorType(dt, sizes),)


def _outer_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    return np.outer(a, b, out=out)


register_op(OpDef(
    name="outer", id=604, arity=2, infer=_outer_infer, kernel=_outer_kernel, family=FAMILY,
    grad=_outer_grad,
    doc="outer(a, b): NumPy's outer product of the flattened inputs, shape (a.size, b.size)",
))


# ---------------------------------------------------------------- traits (see OpDef)
mark_traits("promotes", "einsum", "matmul", "outer", "tensordot")


# ---------------------------------------------------------------- tangent rules
# Every contraction is linear in each operand: the product rule, one contraction per operand with a tangent
# (the transposed gradient rules add transposes and unbroadcasting sums on top).
set_rules("jvp", {k: multilinear(k) for k in ("matmul", "einsum", "tensordot", "vecdot", "outer")})


# ---------------------------------------------------------------- batching rules (vmap)
def _fresh_letter(used: str) -> str | None:
    return next((c for c in string.ascii_letters if c not in used), None)


def _b_matmul(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    x, y = ins
    rx, ry = bh.ndim(x) - batched[0], bh.ndim(y) - batched[1]
    # one shared matrix: the batch axis is one more row axis, so the whole batch is a single product (a GEMM
    # for a batch of vectors, as x @ w in a per-example layer)
    if not batched[1] and ry == 2:
        return [b.op("matmul", x, y)]
    if not batched[0] and rx == 2 and ry == 1:
        return [b.op("matmul", y, b.op("permute_dims", x, axes=(1, 0)))]
    drop = []
    if rx == 1:  # a vector is a 1 x k matrix whose row axis goes again afterwards, as NumPy does it
        x, rx = b.op("expand_dims", x, axis=(bh.ndim(x) - 1,)), 2
        drop.append(-2)
    if ry == 1:
        y, ry = b.op("expand_dims", y, axis=(bh.ndim(y),)), 2
        drop.append(-1)
    x = bh.lift_rank(b, x, max(rx, ry)) if batched[0] else x
    y = bh.lift_rank(b, y, max(rx, ry)) if batched[1] else y
    out = b.op("matmul", x, y)
    if drop:
        out = b.op("squeeze", out, axis=tuple(bh.ndim(out) + d for d in drop))
    return [out]


def _example_shapes(ins: Sequence[Any], batched: Sequence[bool]) -> list[Any]:
    return [x.type.shape[1:] if f else x.type.shape for x, f in zip(ins, batched, strict=True)]


def _b_einsum(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any] | None:
    explicit, _ = einsum_signature(attrs["subscripts"], _example_shapes(ins, batched))
    z = _fresh_letter(explicit)
    if z is None:
        return None  # all 52 letters taken: the per-example fallback
    lhs, rhs = explicit.split("->")
    terms = [z + t if f else t for t, f in zip(lhs.split(","), batched, strict=True)]
    return [b.op("einsum", *ins, subscripts=",".join(terms) + "->" + z + rhs, optimize=attrs["optimize"])]


def _b_tensordot(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any] | None:
    x, y = ins
    rx, ry = bh.ndim(x) - batched[0], bh.ndim(y) - batched[1]
    ax, ay = tensordot_axes(attrs["axes"], rx, ry)
    if not batched[1]:
        return [b.op("tensordot", x, y, axes=(tuple(i + 1 for i in ax), ay))]
    if not batched[0]:  # the batch axis comes out after x's free axes
        out = b.op("tensordot", x, y, axes=(ax, tuple(j + 1 for j in ay)))
        return [bh.move_axis(b, out, rx - len(ax), 0)]
    lx, ly, lo = tensordot_subscripts(attrs["axes"], rx, ry)
    z = _fresh_letter(lx + ly)
    if z is None:
        return None
    out = b.op("einsum", x, y, subscripts=f"{z}{lx},{z}{ly}->{z}{lo}")
    want = _tensordot_dtype(x.type.dtype, y.type.dtype)
    return [out if out.type.dtype == want else b.op("cast", out, dtype=want)]


def _b_vecdot(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any] | None:
    axis = attrs["axis"]
    ranks = [bh.ndim(x) - f for x, f in zip(ins, batched, strict=True)]
    # the axis from the end on each operand, which leading batch and broadcast axes leave where it is
    ends = {axis - r if axis >= 0 else axis for r in ranks}
    if len(ends) != 1:
        return None
    return [b.op("vecdot", *bh.same_rank(b, ins, batched), axis=ends.pop())]


def _b_outer(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
    x, y = ins
    x = b.op("reshape", x, shape=(int(size), -1, 1) if batched[0] else (-1, 1))
    y = b.op("reshape", y, shape=(int(size), 1, -1) if batched[1] else (1, -1))
    return [b.op("multiply", x, y)]


set_rules("batch", {"matmul": _b_matmul, "einsum": _b_einsum, "tensordot": _b_tensordot, "vecdot": _b_vecdot,
                    "outer": _b_outer})
