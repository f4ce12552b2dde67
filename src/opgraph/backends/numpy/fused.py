"""The NumPy engine's kernels of fused ops: ``matmul_t`` on 2-D operands as one direct BLAS call; the optimiser
updates (``sgd_momentum_update``, ``adagrad_update``, ``adam_update``, ``adam_update_t``) as one compiled loop with
numba, else NumPy in cache-sized blocks, allocating nothing per call.

    >>> a = np.arange(4.0).reshape(2, 2)
    >>> BACKEND.kernel_for("matmul_t", 12)(a, a, transpose_a=True, transpose_b=False)
    array([[ 4.,  6.],
           [ 6., 10.]])
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.backends.numpy import BACKEND
from opgraph.core import accel
from opgraph.ops.fused import overlap, update_numba_failed, update_numba_usable


@BACKEND.rule("matmul_t")
def _matmul_t_kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, *,
                     transpose_a: bool, transpose_b: bool) -> np.ndarray:
    # the op's reference computation; a compiled program on 2-D operands calls what specialize gives instead
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    return np.asarray(np.matmul(a, b, out=out))


def _matmul_ta(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.matmul(a.T, b, out)  # type: ignore[no-any-return]


def _matmul_tb(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.matmul(a, b.T, out)  # type: ignore[no-any-return]


def _matmul_tab(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    return np.matmul(a.T, b.T, out)  # type: ignore[no-any-return]


def _matmul_t_specialize(in_types: Sequence[Any], out_types: Sequence[Any],
                         attrs: Mapping[str, Any]) -> tuple[Callable[..., Any], tuple[()], tuple[()]] | None:
    """For 2-D operands (where ``.T`` swaps the last two axes): one small function per transpose pattern.

    >>> from opgraph.core.types import TensorType
    >>> t = TensorType("f8", (2, 2))
    >>> _matmul_t_specialize([t, t], [t], {"transpose_a": True, "transpose_b": False})[0].__name__
    '_matmul_ta'
    """
    if any(t.shape is None or len(t.shape) != 2 for t in in_types):
        return None
    fn = {(False, False): np.matmul, (True, False): _matmul_ta, (False, True): _matmul_tb,
          (True, True): _matmul_tab}[bool(attrs["transpose_a"]), bool(attrs["transpose_b"])]
    return fn, (), ()


_matmul_t_kernel.specialize = _matmul_t_specialize  # type: ignore[attr-defined]


# ---------------------------------------------------------------- optimiser updates
# Each update is one pass over its arrays, allocating nothing per call. With numba (the ``fast`` extra): one
# compiled loop that reads every operand's element i before it writes element i of a result, so a result may
# take over any operand's memory (the planner's in-place choice), with the same operations in the same order as
# the unfused ops (no fastmath: bit-identical). Without it: NumPy's kernels block by block, the intermediates in
# cache-sized per-thread scratch, each result written by its last step. Either way results that overlap an
# operand other than as its very same elements are computed aside and copied.
UPDATE_BLOCK = 1 << 14
"""Elements of one block of the NumPy path (128 KiB of float64 per array: a block's operands, scratch and
results stay in L2)."""

_nb_upd: Any = None  # None: not loaded yet; False: numba missing or unusable; else {name: compiled loop}
_CONSTS: dict[Any, np.ndarray] = {}


def _consts(dt: np.dtype, *vals: float) -> np.ndarray:
    """The scalars ``vals`` in dtype ``dt``, as one array (cached: the same attributes on every call)."""
    key = (dt.char, vals)
    a = _CONSTS.get(key)
    if a is None:
        if len(_CONSTS) > 4096:
            _CONSTS.clear()
        a = _CONSTS[key] = np.array(vals, dtype=dt)
    return a


def _nb_clash(o: Any, x: Any, same_ok: bool) -> bool:  # pragma: no cover - compiled by numba
    """True when contiguous ``o`` and ``x`` share memory (other than as the very same elements, if ``same_ok``)."""
    a, b = o.ctypes.data, x.ctypes.data
    n, m = o.size * o.itemsize, x.size * x.itemsize
    if n == 0 or m == 0 or a >= b + m or b >= a + n:
        return False
    return not (same_ok and a == b and n == m)


def _nb_apart(o0: Any, o1: Any, O0: Any, O1: Any, x: Any, y: Any, z: Any) -> bool:  # pragma: no cover - numba
    """True when two-output loops may run: both results contiguous (``ravel`` did not copy them), apart from each
    other, and each either apart from inputs ``x``, ``y``, ``z`` or exactly one of them (read before written)."""
    if O0.ctypes.data != o0.ctypes.data or O1.ctypes.data != o1.ctypes.data or _nb_clash(O0, O1, False):
        return False
    return not (_nb_clash(O0, x, True) or _nb_clash(O1, x, True) or _nb_clash(O0, y, True)
                or _nb_clash(O1, y, True) or _nb_clash(O0, z, True) or _nb_clash(O1, z, True))


def _nb_momentum(p: Any, v: Any, g: Any, o0: Any, o1: Any, lr: float, mu: float) -> bool:  # pragma: no cover
    P, V, G, O0, O1 = p.ravel(), v.ravel(), g.ravel(), o0.ravel(), o1.ravel()
    if not _nb_apart(o0, o1, O0, O1, P, V, G):
        return False
    k = np.empty(2, P.dtype)  # the scalars in the arrays' dtype, as NumPy computes with them
    k[0], k[1] = lr, mu
    lr, mu = k[0], k[1]
    for i in range(P.size):
        v2 = mu * V[i] + G[i]
        p2 = P[i] - lr * v2
        O1[i] = v2
        O0[i] = p2
    return True


def _nb_adagrad(p: Any, a: Any, g: Any, o0: Any, o1: Any, lr: float, eps: float) -> bool:  # pragma: no cover
    P, A, G, O0, O1 = p.ravel(), a.ravel(), g.ravel(), o0.ravel(), o1.ravel()
    if not _nb_apart(o0, o1, O0, O1, P, A, G):
        return False
    k = np.empty(2, P.dtype)
    k[0], k[1] = lr, eps
    lr, eps = k[0], k[1]
    for i in range(P.size):
        gi = G[i]
        a2 = A[i] + gi * gi
        p2 = P[i] - (lr * gi) / (np.sqrt(a2) + eps)
        O1[i] = a2
        O0[i] = p2
    return True


def _nb_adam(p: Any, m: Any, v: Any, g: Any, o0: Any, o1: Any, o2: Any, k: Any, bc1: Any, bc2: Any,
             square_first: bool) -> bool:  # pragma: no cover - compiled by numba
    P, M, V, G = p.ravel(), m.ravel(), v.ravel(), g.ravel()
    O0, O1, O2 = o0.ravel(), o1.ravel(), o2.ravel()
    if O0.ctypes.data != o0.ctypes.data or O1.ctypes.data != o1.ctypes.data or O2.ctypes.data != o2.ctypes.data:
        return False  # a result that is not contiguous (ravel copied it): the NumPy path
    if _nb_clash(O0, O1, False) or _nb_clash(O0, O2, False) or _nb_clash(O1, O2, False):
        return False
    for x in (P, M, V, G):
        if _nb_clash(O0, x, True) or _nb_clash(O1, x, True) or _nb_clash(O2, x, True):
            return False
    lr, b1, c1, b2, c2, eps = k[0], k[1], k[2], k[3], k[4], k[5]
    d1, d2 = bc1[0], bc2[0]
    for i in range(P.size):
        gi = G[i]
        m2 = b1 * M[i] + c1 * gi
        sq = (gi * gi) * c2 if square_first else (c2 * gi) * gi
        v2 = b2 * V[i] + sq
        p2 = P[i] - (lr * (m2 / d1)) / (np.sqrt(v2 / d2) + eps)
        O1[i] = m2
        O2[i] = v2
        O0[i] = p2
    return True


def _nb_updates() -> Any:
    """The compiled update loops (numba imported on first use), or False without numba."""
    global _nb_upd, _nb_clash, _nb_apart
    if _nb_upd is None:
        _nb_upd = False
        try:
            import numba
        except Exception:  # missing, or broken against this NumPy: the NumPy path is always there
            update_numba_failed()
            return False
        if numba.config.DISABLE_JIT:
            update_numba_failed()
            return False
        # cache=True: numba keeps the machine code on disk, so later processes load it instead of compiling
        jit = numba.njit(cache=True, nogil=True, error_model="numpy")
        _nb_clash = jit(_nb_clash)
        _nb_apart = jit(_nb_apart)
        _nb_upd = {"momentum": jit(_nb_momentum), "adagrad": jit(_nb_adagrad), "adam": jit(_nb_adam)}
    return _nb_upd


def _compiled(p: np.ndarray, outs: tuple[np.ndarray, ...]) -> Any:
    """The compiled loops when they apply to parameter ``p`` (the loops check the results), else None."""
    nb = _nb_upd
    if nb is None:
        if not update_numba_usable():
            return None
        nb = _nb_updates()
    if not nb or not accel.enabled or p.ndim == 0 or p.dtype.char not in "fd":
        return None
    return nb


def _fresh(p: np.ndarray, out: Any, n: int) -> tuple[np.ndarray, ...]:
    return tuple(np.empty(p.shape, p.dtype) for _ in range(n)) if out is None else tuple(out)


_upd_local = threading.local()


def _update_scratch(p: np.ndarray, shape: tuple[int, ...], k: int) -> list[np.ndarray]:
    """``k`` scratch arrays of ``shape`` in ``p``'s dtype, kept per thread (an update kernel calls nothing that
    could use them meanwhile): at most :data:`UPDATE_BLOCK` elements each."""
    cache = _upd_local.__dict__
    key = (p.dtype.char, shape, k)
    bufs = cache.get(key)
    if bufs is None:
        if len(cache) > 64:
            cache.clear()
        bufs = cache[key] = [np.empty(shape, p.dtype) for _ in range(k)]
    return bufs  # type: ignore[no-any-return]


def _update_blocks(ins: tuple[np.ndarray, ...], outs: tuple[np.ndarray, ...], k: int) -> list[Any] | None:
    """The (operand blocks, result blocks, scratch blocks) the NumPy path runs on, or None when the results must
    be computed aside.

    Each block's operands are read into scratch and the results written last (p' by its one step, the others
    copied from scratch), so a result may be any operand's memory. One block (the arrays whole): any overlap
    is safe (NumPy's ufuncs handle an output overlapping their inputs). Several blocks: a result overlapping an
    operand other than as its very same elements would overwrite elements of a later block first (None).
    """
    p = ins[0]
    size = p.size
    if size <= UPDATE_BLOCK:
        return [(ins, outs, _update_scratch(p, p.shape, k))]
    for o in outs:
        if overlap(o, ins) == 2:
            return None
    if not all(x.flags.c_contiguous for x in (*ins, *outs)):  # strided: whole, with whole-size scratch
        return [(ins, outs, [np.empty(p.shape, p.dtype) for _ in range(k)])]
    flat_in = [x.reshape(-1) for x in ins]
    flat_out = [o.reshape(-1) for o in outs]
    bufs = _update_scratch(p, (UPDATE_BLOCK,), k)
    blocks = []
    for j in range(0, size, UPDATE_BLOCK):
        e = min(j + UPDATE_BLOCK, size)
        blocks.append(([x[j:e] for x in flat_in], [o[j:e] for o in flat_out],
                       bufs if e - j == UPDATE_BLOCK else [t[:e - j] for t in bufs]))
    return blocks


def _copy_into(outs: tuple[np.ndarray, ...], res: tuple[np.ndarray, ...]) -> Any:
    for o, r in zip(outs, res, strict=True):
        np.copyto(o, r)
    return outs


@BACKEND.rule("sgd_momentum_update")
def _momentum_kernel(p: np.ndarray, v: np.ndarray, g: np.ndarray, out: Any = None, *,
                     lr: float, mu: float) -> tuple[np.ndarray, np.ndarray]:
    o0, o1 = outs = _fresh(p, out, 2)
    nb = _compiled(p, outs)
    if nb is not None and nb["momentum"](p, v, g, o0, o1, lr, mu):
        return o0, o1
    blocks = _update_blocks((p, v, g), outs, 2)
    if blocks is None:
        return _copy_into(outs, _momentum_kernel(p, v, g, lr=lr, mu=mu))  # type: ignore[no-any-return]
    for (P, V, G), (O0, O1), (S, T) in blocks:
        np.multiply(mu, V, S)
        np.add(S, G, S)
        np.multiply(lr, S, T)
        np.subtract(P, T, O0)
        np.copyto(O1, S)
    return o0, o1


@BACKEND.rule("adagrad_update")
def _adagrad_kernel(p: np.ndarray, acc: np.ndarray, g: np.ndarray, out: Any = None, *,
                    lr: float, eps: float) -> tuple[np.ndarray, np.ndarray]:
    o0, o1 = outs = _fresh(p, out, 2)
    nb = _compiled(p, outs)
    if nb is not None and nb["adagrad"](p, acc, g, o0, o1, lr, eps):
        return o0, o1
    blocks = _update_blocks((p, acc, g), outs, 3)
    if blocks is None:
        return _copy_into(outs, _adagrad_kernel(p, acc, g, lr=lr, eps=eps))  # type: ignore[no-any-return]
    k = _consts(p.dtype, lr, eps)
    klr, keps = k[0], k[1]
    for (P, A, G), (O0, O1), (S, T, U) in blocks:
        np.multiply(klr, G, T)
        np.multiply(G, G, S)
        np.add(A, S, S)
        np.sqrt(S, U)
        np.add(U, keps, U)
        np.divide(T, U, T)
        np.subtract(P, T, O0)
        np.copyto(O1, S)
    return o0, o1


def _adam_core(p: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, bc1: np.ndarray, bc2: np.ndarray,
               out: Any, lr: float, b1: float, c1: float, b2: float, c2: float, eps: float,
               square_first: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    o0, o1, o2 = outs = _fresh(p, out, 3)
    k = _consts(p.dtype, lr, b1, c1, b2, c2, eps)
    nb = _compiled(p, outs)
    if nb is not None and nb["adam"](p, m, v, g, o0, o1, o2, k, bc1.reshape(1), bc2.reshape(1), square_first):
        return o0, o1, o2
    bc1, bc2 = bc1.reshape(()), bc2.reshape(())
    blocks = _update_blocks((p, m, v, g), outs, 4)
    if blocks is None:
        return _copy_into(outs, _adam_core(p, m, v, g, bc1, bc2, None, lr, b1, c1, b2, c2, eps,  # type: ignore
                                           square_first))
    klr, kb1, kc1, kb2, kc2, keps = k
    for (P, M, V, G), (O0, O1, O2), (s, T, u, W) in blocks:
        np.multiply(kb1, M, s)
        np.multiply(kc1, G, T)
        np.add(s, T, s)                  # m' = b1 * m + c1 * g
        if square_first:
            np.multiply(G, G, T)
            np.multiply(T, kc2, T)
        else:
            np.multiply(kc2, G, T)
            np.multiply(T, G, T)
        np.multiply(kb2, V, u)
        np.add(u, T, u)                  # v' = b2 * v + sq
        np.divide(u, bc2, T)
        np.sqrt(T, T)
        np.add(T, keps, T)               # sqrt(v' / bc2) + eps
        np.divide(s, bc1, W)
        np.multiply(klr, W, W)
        np.divide(W, T, W)
        np.subtract(P, W, O0)
        np.copyto(O1, s)
        np.copyto(O2, u)
    return o0, o1, o2


@BACKEND.rule("adam_update")
def _adam_kernel(p: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, out: Any = None, *,
                 lr: float, b1: float, c1: float, b2: float, c2: float, bc1: float, bc2: float,
                 eps: float, square_first: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bc = _consts(p.dtype, bc1, bc2)  # 1-element arrays: the compiled loop reads them as such
    return _adam_core(p, m, v, g, bc[0:1], bc[1:2], out, lr, b1, c1, b2, c2, eps, square_first)


@BACKEND.rule("adam_update_t")
def _adam_t_kernel(p: np.ndarray, m: np.ndarray, v: np.ndarray, g: np.ndarray, bc1: np.ndarray, bc2: np.ndarray,
                   out: Any = None, *, lr: float, b1: float, c1: float, b2: float, c2: float,
                   eps: float, square_first: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _adam_core(p, m, v, g, np.asarray(bc1), np.asarray(bc2), out, lr, b1, c1, b2, c2, eps, square_first)
