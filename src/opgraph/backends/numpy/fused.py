"""The NumPy engine's kernels of fused ops: ``matmul_t`` on 2-D operands as one direct BLAS call; the optimiser
updates (``sgd_momentum_update``, ``adagrad_update``, ``adam_update``, ``adam_update_t``) as one compiled loop with
numba, else NumPy in cache-sized blocks, allocating nothing per call; ``fused_elementwise`` block by block in
cache-sized scratch (or, with ``approx``, one compiled float32 loop); ``fma`` with a product too large for a
temporary block by block.

    >>> a = np.arange(4.0).reshape(2, 2)
    >>> BACKEND.kernel_for("matmul_t", 12)(a, a, transpose_a=True, transpose_b=False)
    array([[ 4.,  6.],
           [ 6., 10.]])
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from math import prod
from typing import Any

import numpy as np

from opgraph.backends.numpy import BACKEND
from opgraph.core import accel
from opgraph.core.types import TensorType
from opgraph.ops.fused import overlap, step_types, update_numba_failed, update_numba_usable


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


# ---------------------------------------------------------------- fused_elementwise
# Each step calls the engine's kernel of its kind (the same the unfused op runs: bit-identical results); large
# results are computed block by block in cache-sized scratch buffers, small ones whole, each step writing into the
# buffer of an intermediate it consumes last.
BLOCK_BYTES = 1 << 18
"""Bytes of one block temporary when ``fused_elementwise`` runs block by block.

Measured on the 20-op float32 chain of ``bench/numpy_levels.py`` (4M elements, one thread, 2 MiB L2
per core): blocks of 16K, 32K, 64K, 128K float32 elements ran at 0.70, 0.66, 0.63, 0.64x NumPy eager's
time; 256 KiB (64K float32, 32K float64) keeps every temporary in L2 while the per-block cost of the
Python loop (one kernel call per step) stays small against the work of a block.
"""

BLOCKED_MIN_BLOCKS = 2
"""Results of fewer blocks than this run whole (they already fit in cache; the loop would only add calls)."""

class _Plan:
    """How one program runs on operands of given dtypes and shapes (cached per program and operand types).

    ``whole``: per step, kernel, refs, the earlier step whose buffer it may overwrite (-1: a new one).
    ``steps``: per step, kernel, indexes into the environment (operands, then steps) of its arguments,
    and the buffer it writes (-1: the result's block, k >= 0: scratch slot k); ``slots`` the dtype of each
    scratch slot; ``steps_alias`` and ``slots_alias`` the same when the result is an operand's memory
    (then only the last step writes it); ``block`` the elements of a block.
    """

    __slots__ = ("block", "dtype", "shape", "slots", "slots_alias", "steps", "steps_alias", "whole")

    def __init__(self, program: tuple[tuple[Any, ...], ...], xs: tuple[np.ndarray, ...]) -> None:
        types = step_types(program, tuple(TensorType.of(x) for x in xs))
        nx = len(xs)
        last_use: dict[int, int] = {}
        for i, (_, *refs) in enumerate(program):
            for r in refs:
                if r >= 0:
                    last_use[r] = i
        fns = [BACKEND.kernel_for(kind, 0) for kind, *_ in program]
        self.whole: list[tuple[Any, tuple[int, ...], int]] = []
        for i, (_, *refs) in enumerate(program):
            reuse = -1
            for r in refs:  # an intermediate used for the last time here, of this step's exact type, is scratch
                if r >= 0 and last_use[r] == i and types[r] == types[i] and refs.count(r) == 1:
                    reuse = r
                    break
            self.whole.append((fns[i], tuple(refs), reuse))
        # Blocked: every step's block is block-shaped (operands are broadcast per block), so a buffer is
        # reused by dtype alone. Without aliasing the result's own block is one of the buffers (a chain
        # then needs no scratch at all); when the result takes over an operand's memory it is not.
        self.steps, self.slots = self._assign(program, types, last_use, nx, own=True)
        self.steps_alias, self.slots_alias = self._assign(program, types, last_use, nx, own=False)
        out_t = types[-1]
        self.dtype = out_t.dtype
        self.shape: tuple[int, ...] = out_t.shape  # type: ignore[assignment]
        width = max([t.dtype.itemsize for t in types] + [1])
        self.block = max(BLOCK_BYTES // width, 256)

    @staticmethod
    def _assign(program: tuple[tuple[Any, ...], ...], types: list[TensorType], last_use: dict[int, int], nx: int,
                own: bool) -> tuple[list[tuple[Any, tuple[int, ...], int]], list[np.dtype[Any]]]:
        """Linear scan over the steps: each takes a buffer freed after its last use (-1 is the result's)."""
        n = len(program)
        slot_of: list[int] = []
        slots: list[np.dtype[Any]] = []
        free: dict[np.dtype[Any], list[int]] = {types[-1].dtype: [-1]} if own else {}
        steps = []
        for i, (kind, *refs) in enumerate(program):
            dt = types[i].dtype
            slot = -1
            if i < n - 1:
                slot = -2
                # in place on an intermediate read for the last time here (elementwise: safe); not on fma's c,
                # which would make fma compute its product aside
                for r in (refs[:2] if kind == "fma" else refs):
                    if r >= 0 and last_use[r] == i and types[r].dtype == dt and refs.count(r) == 1:
                        slot = slot_of[r]
                        break
                if slot == -2:
                    pool = free.get(dt)
                    if pool:
                        slot = pool.pop()
                    else:
                        slot = len(slots)
                        slots.append(dt)
            for r in set(refs):
                if r >= 0 and last_use[r] == i and slot_of[r] != slot:
                    free.setdefault(types[r].dtype, []).append(slot_of[r])
            if i not in last_use and i < n - 1:  # a result nothing reads: its buffer is free again
                free.setdefault(dt, []).append(slot)
            slot_of.append(slot)
            steps.append((BACKEND.kernel_for(kind, 0), tuple(-r - 1 if r < 0 else nx + r for r in refs),
                          slot))
        return steps, slots


_PLANS: dict[Any, _Plan] = {}


def _plan(program: tuple[tuple[Any, ...], ...], xs: tuple[np.ndarray, ...]) -> _Plan:
    key = (program, tuple((x.dtype.str, x.shape) for x in xs))
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) > 1024:
            _PLANS.clear()
        plan = _PLANS[key] = _Plan(program, xs)
    return plan


_scratch_local = threading.local()


def _scratch(dtypes: list[np.dtype[Any]], size: int) -> tuple[list[np.ndarray], bool]:
    """Block buffers, one per slot, cached per thread; (buffers, whether they are the thread's cache)."""
    if getattr(_scratch_local, "busy", False):  # a kernel inside a blocked step: buffers of its own
        return [np.empty(size, dt) for dt in dtypes], False
    cache: dict[np.dtype[Any], list[np.ndarray]] = _scratch_local.__dict__.setdefault("bufs", {})
    seen: dict[np.dtype[Any], int] = {}
    out = []
    for dt in dtypes:
        k = seen[dt] = seen.get(dt, -1) + 1
        pool = cache.setdefault(dt, [])
        if k == len(pool):
            pool.append(np.empty(size, dt))
        elif len(pool[k]) < size:
            pool[k] = np.empty(size, dt)
        out.append(pool[k])
    return out, True


def _blocks(shape: tuple[int, ...], block: int) -> Iterator[tuple[tuple[Any, ...], tuple[int, ...], int]]:
    """(index, block shape, elements) covering ``shape`` in C order, each at most ``block`` elements.

    Blocks are runs of whole trailing sub-arrays along one axis, so each is contiguous in a C-ordered
    array of ``shape``.

    >>> [n for _, _, n in _blocks((2, 3), 2)], [s for _, s, _ in _blocks((4, 3), 7)]
    ([2, 1, 2, 1], [(2, 3), (2, 3)])
    """
    k, inner = len(shape) - 1, 1
    while k > 0 and inner * shape[k] <= block:
        inner *= shape[k]
        k -= 1
    if inner * shape[k] <= block:
        yield (), tuple(shape), inner * shape[k]
        return
    rows = max(block // inner, 1)
    tail = tuple(shape[k + 1:])
    for idx in np.ndindex(*shape[:k]):
        for j in range(0, shape[k], rows):
            hi = min(j + rows, shape[k])
            yield (*idx, slice(j, hi)), (hi - j, *tail), (hi - j) * inner


def _run_whole(plan: _Plan, xs: tuple[np.ndarray, ...], out: np.ndarray | None) -> Any:
    vals: list[Any] = []
    n = len(plan.whole)
    for i, (fn, refs, reuse) in enumerate(plan.whole):
        args = [xs[-r - 1] if r < 0 else vals[r] for r in refs]
        if i == n - 1 and out is not None:
            target = out
        elif reuse >= 0 and isinstance(vals[reuse], np.ndarray) and vals[reuse].flags.writeable:
            target = vals[reuse]
        else:
            target = None
        vals.append(np.asarray(fn(*args, out=target)))
    return vals[-1]


def _call(fn: Any, env: list[Any], idx: tuple[int, ...], t: np.ndarray) -> np.ndarray:
    # Unrolled by arity: this runs once per step and block, where a list of arguments is measurable.
    n = len(idx)
    if n == 1:
        r = fn(env[idx[0]], out=t)
    elif n == 2:
        r = fn(env[idx[0]], env[idx[1]], out=t)
    else:
        r = fn(*[env[j] for j in idx], out=t)
    if r is not t:
        np.copyto(t, r, casting="unsafe")
    return t


def _run_blocked(plan: _Plan, xs: tuple[np.ndarray, ...], out: np.ndarray, aliased: bool) -> np.ndarray:
    shape, size, block = plan.shape, out.size, plan.block
    flat = out.flags.c_contiguous and all(x.size <= 1 or (x.shape == shape and x.flags.c_contiguous) for x in xs)
    # Operands of one element stay whole (broadcast by the kernels); the others are cut per block.
    views: list[Any] = [x.reshape(()) if x.size == 1 else (x.reshape(-1) if flat else np.broadcast_to(x, shape))
                        for x in xs]
    cut = [i for i, x in enumerate(xs) if x.size != 1]
    steps = plan.steps_alias if aliased else plan.steps
    nx = len(xs)
    env: list[Any] = views + [None] * len(steps)
    bufs, cached = _scratch(plan.slots_alias if aliased else plan.slots, block)
    if cached:
        _scratch_local.busy = True
    try:
        if flat:
            target = out.reshape(-1)
            tmp: list[Any] = [b[:block] for b in bufs] + [None]  # the last entry (slot -1) is the result's block
            for j in range(0, size, block):
                k = j + block
                if k > size:
                    tmp[:-1] = [b[:size - j] for b in bufs]
                for i in cut:
                    env[i] = views[i][j:k]
                tmp[-1] = target[j:k]
                for i, (fn, idx, slot) in enumerate(steps, nx):
                    env[i] = _call(fn, env, idx, tmp[slot])
        else:
            for sl, bshape, count in _blocks(shape, block):
                for i in cut:
                    env[i] = views[i][sl]
                tmp = [b[:count].reshape(bshape) for b in bufs]
                tmp.append(out[sl])
                for i, (fn, idx, slot) in enumerate(steps, nx):
                    env[i] = _call(fn, env, idx, tmp[slot])
    finally:
        if cached:
            _scratch_local.busy = False
    return out


# ---------------------------------------------------------------- fused_elementwise: the compiled float32 loop
# With ``approx`` (set by ``optimize(..., fast_math=True)``) and numba installed (the ``fast`` extra), a float32
# program runs as one compiled kernel: sub-blocks of APPROX_SUB elements (L1-resident scratch), a few vectorised
# loops per sub-block (each of at most _NB_GROUP steps, one of them approximated), transcendental steps by
# branch-free polynomial approximations evaluated with explicit fused multiply-adds (llvm.fma: one rounding, no
# fastmath flags; they live in opgraph.backends.numba.fused, one home for this engine's loop and the numba
# engine's compile_elementwise). Not numba's own np.sin & co.: those call the scalar libm once per element and do not
# vectorise (measured: the 20-op chain 15x slower than NumPy eager). An input outside an approximation's
# checked range (sin/cos |x| > 6000, exp outside [-87, 88], log outside the positive normal floats, tanh of
# nan) ends the compiled run: NumPy's kernels compute the rest of the result.
APPROX_MIN = 1 << 16
"""Results of at least this many elements run the compiled loop (smaller ones: NumPy, whose calls cost less)."""
_APPROX_LOAD_MIN = 1 << 21
"""Results of at least this many elements load numba (importing it costs about 0.4 s) when no one has yet."""
APPROX_SUB = 2048
"""Elements of one sub-block of the compiled loop (each scratch buffer: 8 KiB, in L1). 1024 to 4096 measured
the same on the 20-op chain."""
_NB_GROUP = 4
"""Steps in one loop of a sub-block at most (3 to 8 measured the same; all 20 in one loop ran 2x slower)."""


def __getattr__(name: str) -> Any:
    # APPROX_ULP lives with the approximations in opgraph.backends.numba.fused (imported on first use: the NumPy
    # engine loads without the numba engine)
    if name == "APPROX_ULP":
        from opgraph.backends.numba.fused import APPROX_ULP

        return APPROX_ULP
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_nb: Any = None  # None: not tried yet; False: numba missing or unusable; else the namespace compiled kernels see
_NB_KERNELS: dict[Any, Any] = {}


def _nb_namespace() -> dict[str, Any] | None:
    """numba's njit and the approximations of opgraph.backends.numba.fused (None: numba missing or unusable)."""
    from opgraph.backends.numba.fused import approx_namespace

    return approx_namespace()


def _nb_source(program: tuple[tuple[Any, ...], ...], plan: _Plan, scalar: tuple[bool, ...], alias: bool) -> str:
    """Python source of the compiled kernel ``_k(start, o, *operands) -> stop`` for ``program``.

    It fills ``o[start:stop]``; ``stop < o.size`` where a sub-block holds an argument outside an
    approximation's checked range (the caller computes the rest with NumPy). With ``alias`` (``o`` is an
    operand's memory) no step but the last writes ``o``, and the last writes a sub-block of it only once
    the sub-block's checks passed, so the caller's NumPy run still reads intact operands. Per sub-block, the steps run
    in loops of at most one approximated step and :data:`_NB_GROUP` steps: longer loop bodies vectorise
    badly (measured); a step's result is stored only when a later loop reads it.
    """
    from opgraph.backends.numba.fused import APPROX_EXPR, APPROX_OUTSIDE

    nx = len(scalar)
    n = len(program)
    groups: list[list[int]] = []
    for i, (kind, *_) in enumerate(program):
        g = groups[-1] if groups else None
        if g is None or len(g) >= _NB_GROUP or (kind in APPROX_OUTSIDE and any(program[j][0] in APPROX_OUTSIDE
                                                                                for j in g)):
            groups.append([i])
        else:
            g.append(i)
    group_of = [k for k, g in enumerate(groups) for _ in g]
    stored = [i == n - 1 for i in range(n)]
    for i, (_, *refs) in enumerate(program):
        for r in refs:
            if r >= 0 and group_of[r] != group_of[i]:
                stored[r] = True
    steps = plan.steps_alias if alias else plan.steps
    slots = max([s for _, _, s in steps] + [-1]) + 1
    sub = APPROX_SUB
    lines = [f"def _k(start, o, {', '.join(f'a{j}' for j in range(nx))}):", "    _wide()", "    n = o.size"]
    lines += [f"    t{s} = np.empty({sub}, np.float32)" for s in range(slots)]
    lines += [f"    for lo in range(start, n, {sub}):", f"        m = min({sub}, n - lo)", "        ov = o[lo:lo + m]"]
    lines += [f"        v{j} = a{j}[lo:lo + m]" for j in range(nx) if not scalar[j]]
    buf = ["ov" if slot < 0 else f"t{slot}" for _, _, slot in steps]
    if alias:
        buf[-1] = "tr"
        lines.insert(2, f"    tr = np.empty({sub}, np.float32)")
    for g in groups:
        checked = any(program[i][0] in APPROX_OUTSIDE for i in g)
        if checked:
            lines.append("        bad = False")
        lines.append("        for i in range(m):")
        for i in g:
            kind, *refs = program[i]
            args = [(f"a{-r - 1}" if scalar[-r - 1] else f"v{-r - 1}[i]") if r < 0
                    else (f"s{r}" if group_of[r] == group_of[i] else f"{buf[r]}[i]") for r in refs]
            if kind in APPROX_OUTSIDE:
                lines.append(f"            bad |= {APPROX_OUTSIDE[kind].format(*args)}")
            lines.append(f"            s{i} = _F({APPROX_EXPR[kind].format(*args)})")
            if stored[i]:
                lines.append(f"            {buf[i]}[i] = s{i}")
        if checked:
            lines += ["        if bad:", "            return lo"]
    if alias:
        lines.append("        ov[:] = tr[:m]")
    lines.append("    return n")
    return "\n".join(lines)


def _nb_kernel(program: tuple[tuple[Any, ...], ...], plan: _Plan, xs: tuple[np.ndarray, ...], size: int,
               alias: bool = False) -> Any:
    """The compiled kernel of a float32 ``program`` on ``xs`` (into an operand's memory with ``alias``), or
    None to run NumPy's kernels."""
    global _nb
    from opgraph.backends.numba.fused import APPROX_EXPR
    from opgraph.core import accel

    if not accel.enabled or size < APPROX_MIN or plan.dtype != np.float32 \
            or any(x.dtype != np.float32 for x in xs) or any(step[0] not in APPROX_EXPR for step in program):
        return None
    if _nb is None:
        import sys

        if size < _APPROX_LOAD_MIN and "numba" not in sys.modules:
            return None
        _nb = _nb_namespace() or False
    if not _nb:
        return None
    scalar = tuple(x.size == 1 for x in xs)
    key = (program, scalar, alias)
    fn = _NB_KERNELS.get(key)
    if fn is None:
        ns = dict(_nb)
        exec(_nb_source(program, plan, scalar, alias), ns)  # source built from the templates above, not from input
        fn = _NB_KERNELS[key] = _nb["numba"].njit(nogil=True, error_model="numpy")(ns["_k"])
    return fn


def _run_approx(plan: _Plan, program: tuple[tuple[Any, ...], ...], xs: tuple[np.ndarray, ...],
                out: np.ndarray | None) -> np.ndarray | None:
    """The compiled path of an ``approx`` program, or None when it does not apply (the NumPy path runs)."""
    size = prod(plan.shape)
    if not all(x.size == 1 or (x.shape == plan.shape and x.flags.c_contiguous) for x in xs):
        return None  # broadcast or strided operands: NumPy's kernels
    direct = out is not None and out.dtype == plan.dtype and out.shape == plan.shape and out.flags.c_contiguous
    shared = overlap(out, xs) if direct else 0  # type: ignore[arg-type]
    direct = direct and shared < 2  # 1: the very elements of an operand (the planner's in-place choice)
    fn = _nb_kernel(program, plan, xs, size, shared == 1 and direct)
    if fn is None:
        return None
    res = out if direct else np.empty(plan.shape, plan.dtype)
    flat = res.reshape(-1)  # type: ignore[union-attr]
    stop = fn(0, flat, *[x.reshape(-1)[0] if x.size == 1 else x.reshape(-1) for x in xs])
    if stop < size:
        _fused_kernel(*[x.reshape(()) if x.size == 1 else x.reshape(-1)[stop:] for x in xs], out=flat[stop:],
                      program=program)
    if out is not None and not direct:
        np.copyto(out, res, casting="unsafe")
        return out
    return res  # type: ignore[return-value]


@BACKEND.rule("fused_elementwise")
def _fused_kernel(*xs: np.ndarray, out: np.ndarray | None = None, program: tuple[tuple[Any, ...], ...],
                  approx: bool = False) -> Any:
    xs = tuple(x if isinstance(x, np.ndarray) else np.asarray(x) for x in xs)
    plan = _plan(program, xs)
    if approx:
        res = _run_approx(plan, program, xs, out)
        if res is not None:
            return res
    size = prod(plan.shape)
    shared = 0 if out is None else overlap(out, xs)
    if size < BLOCKED_MIN_BLOCKS * plan.block:
        if shared == 2:
            np.copyto(out, _run_whole(plan, xs, None), casting="unsafe")  # type: ignore[arg-type]
            return out
        return _run_whole(plan, xs, out)
    if out is None:
        return _run_blocked(plan, xs, np.empty(plan.shape, plan.dtype), False)
    if shared == 2 or out.dtype != plan.dtype or out.shape != plan.shape:
        np.copyto(out, _run_blocked(plan, xs, np.empty(plan.shape, plan.dtype), False), casting="unsafe")
        return out
    return _run_blocked(plan, xs, out, shared == 1)


# ---------------------------------------------------------------- fma
_FMA_PROGRAM = (("multiply", -1, -2), ("add", 0, -3))


@BACKEND.rule("fma")
def _fma_kernel(a: np.ndarray, b: np.ndarray, c: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    # Kept short: on small arrays this function's own overhead is what fma costs over multiply + add.
    if type(a) is not np.ndarray or type(b) is not np.ndarray or type(c) is not np.ndarray:
        a, b, c = np.asarray(a), np.asarray(b), np.asarray(c)
    if out is None:
        prod = np.multiply(a, b)
        if isinstance(prod, np.ndarray) and prod.shape == np.broadcast_shapes(prod.shape, c.shape) \
                and prod.dtype == np.result_type(prod, c):
            return np.add(prod, c, out=prod)  # reuse the product's buffer
        return np.add(prod, c)
    # The product goes straight into ``out`` when it has the product's dtype (so it rounds exactly as
    # a * b does) and ``out`` is not c's memory (the planner may give fma c's buffer, position 2: a 0-d c
    # too, when out has one element; a 0-d c beside a larger out cannot be its buffer).
    dt = out.dtype
    if ((a.dtype == dt and b.dtype == dt) or np.promote_types(a.dtype, b.dtype) == dt) \
            and ((c.ndim == 0 and out.size > 1) or not np.may_share_memory(out, c)):
        np.multiply(a, b, out=out)
        return np.add(out, c, out=out)
    # Otherwise the product cannot go into ``out`` first. A small one is a temporary as cheap as the unfused
    # multiply's (the fused program's set-up would cost more than the work); a large one goes block by block,
    # so it needs no full-size temporary.
    if out.size <= FMA_TEMPORARY_MAX:
        return np.add(np.multiply(a, b), c, out=out)
    return _fused_kernel(a, b, c, out=out, program=_FMA_PROGRAM)  # type: ignore[no-any-return]


FMA_TEMPORARY_MAX = 1 << 16
"""Largest result (elements) for which fma into c's buffer makes its product a temporary instead of blocking."""
