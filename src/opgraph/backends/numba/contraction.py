"""Small contractions on the register machine: one ``SUMPROD`` per result element.

Each result element is a sum of products; its factors' slots come from the operands' slot arrays broadcast
against each other (the index trick of :mod:`.shape`), so ``matmul`` (batched, 1-D operands included), ``vecdot``,
``outer``, ``tensordot`` and ``einsum`` (no repeated letter within one operand, no ellipsis) share one
emitter: slots of shape ``(result elements, summed elements, factors)``.

    >>> from opgraph.backends.numba import BACKEND
    >>> "matmul" in BACKEND.rules and "einsum" in BACKEND.rules
    True
"""

from __future__ import annotations

import numpy as np

from opgraph.backends.numba import BACKEND
from opgraph.backends.numba.assemble import Assembler
from opgraph.backends.numba.machine import OP
from opgraph.core.opinfo import OpInfo
from opgraph.ops.contraction import tensordot_subscripts


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(..., m, n, k, 2) factor slots of ``a @ b`` (1-D operands promoted and their axis dropped, as NumPy)."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    left = a2[..., :, None, :]
    right = np.swapaxes(b2, -1, -2)[..., None, :, :]
    left, right = np.broadcast_arrays(left, right)
    pairs = np.stack([left, right], axis=-1)
    if a.ndim == 1:
        pairs = pairs[..., 0, :, :, :]
    if b.ndim == 1:
        pairs = pairs[..., 0, :, :]
    return pairs


def _einsum(subscripts: str, operands: list[np.ndarray]) -> np.ndarray:
    """(result..., summed elements, factors) factor slots of an einsum without ellipsis or repeated letters."""
    ins, _, out = subscripts.replace(" ", "").partition("->")
    specs = ins.split(",")
    if not _:
        letters_all = "".join(specs)
        out = "".join(sorted(c for c in set(letters_all) if letters_all.count(c) == 1))
    sizes: dict[str, int] = {}
    for spec, arr in zip(specs, operands, strict=True):
        for c, d in zip(spec, arr.shape, strict=True):
            sizes[c] = d if sizes.get(c, 1) == 1 else sizes[c]  # a 1 broadcasts against any size, 0 too
    summed = [c for c in sizes if c not in out]
    order = list(out) + summed
    full = tuple(sizes[c] for c in order)
    parts = []
    for spec, arr in zip(specs, operands, strict=True):
        perm = sorted(range(len(spec)), key=lambda i: order.index(spec[i]))
        moved = np.transpose(arr, perm)
        shape = [1] * len(order)
        for i in perm:
            shape[order.index(spec[i])] = arr.shape[i]
        parts.append(np.broadcast_to(moved.reshape(shape), full))
    summed_size = int(np.prod(full[len(out):])) if summed else 1
    return np.stack(parts, axis=-1).reshape(*full[:len(out)], summed_size, len(operands))


def factors(asm: Assembler, op: int) -> np.ndarray:
    """The factor slots of each result element of ``op``: ``(result elements, summed elements, factors)``."""
    g = asm.graph
    kind = g.kind_of(op)
    attrs = g.attrs_of(op)
    ins = [asm.slots_of(int(v)) for v in g.op_inputs(op)]
    if kind == "matmul":
        got = _matmul(*ins)
    elif kind == "vecdot":
        a, b = np.broadcast_arrays(*ins)
        axis = int(attrs.get("axis", -1))
        got = np.stack([np.moveaxis(a, axis, -1), np.moveaxis(b, axis, -1)], axis=-1)
    elif kind == "outer":
        got = _einsum("i,j->ij", [ins[0].ravel(), ins[1].ravel()])
    elif kind == "tensordot":
        la, lb, lo = tensordot_subscripts(attrs.get("axes", 2), ins[0].ndim, ins[1].ndim)
        got = _einsum(f"{la},{lb}->{lo}", ins)
    else:
        got = _einsum(str(attrs["subscripts"]), ins)
    return _rows(got)


def _rows(got: np.ndarray) -> np.ndarray:
    """``(..., summed, factors)`` as ``(result elements, summed, factors)`` (empty results and sums included)."""
    return got.reshape(int(np.prod(got.shape[:-2])), got.shape[-2], got.shape[-1])


@BACKEND.rule("matmul", "vecdot", "outer", "tensordot", "einsum")
def emit_contraction(asm: Assembler, ops: np.ndarray) -> None:
    """One SUMPROD per result element (a MOV of zero where nothing is summed)."""
    for op in ops.tolist():
        f = factors(asm, op)
        out = int(asm.graph.op_outputs(op)[0])
        m, k, p = f.shape
        if m == 0:
            continue
        many = np.full(m, op)
        dst = asm.slot[out] + np.arange(m)
        if k == 0:
            asm.emit(many, OP["MOV"], dst, asm.const_slot(0.0))
            continue
        starts = asm.operand_list(f, np.full(m, k * p))
        asm.emit(many, OP["SUMPROD"], dst, starts, p, 0, k)


@BACKEND.limit("einsum")
def einsum_limit(info: OpInfo) -> str | None:
    """No ellipsis and no letter twice in one operand (a diagonal)."""
    sub = str(info.attrs.get("subscripts", ""))
    if "." in sub:
        return "numba runs einsum without an ellipsis"
    if any(len(set(s)) != len(s) for s in sub.split("->")[0].split(",")):
        return "numba runs einsum without a repeated letter in one operand"
    return None
