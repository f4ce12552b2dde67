"""The NumPy engine's elementwise kernels: float32 ``erf``, ``sigmoid``, ``gelu``, ``silu``, ``hard_swish`` and
``hard_sigmoid`` in cache-sized blocks, with numba loops for large arrays.

The ops' reference kernels (:mod:`opgraph.ops.elementwise`) run each float32
formula once over the whole array; the engine runs the same NumPy passes
(:func:`~opgraph.ops.elementwise.erf_passes`, ...) on blocks of
:data:`BLOCK` elements, so that their temporaries stay in the L2 cache, or,
with numba loaded (the ``fast`` extra), one compiled loop per block. Other
dtypes run the reference kernel.

    >>> BACKEND.kernel_for("erf", 1)(np.array([0.0, 0.5], np.float32))
    array([0.       , 0.5204998], dtype=float32)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.backends.numpy import BACKEND
from opgraph.backends.numpy.jit import NUMBA_MIN, numba_for, prepare_loops
from opgraph.core import accel
from opgraph.core.registry import get_op
from opgraph.ops.elementwise import (
    ERF_P32,
    GELU_P32,
    erf_passes,
    gelu_passes,
    gelu_tanh_passes,
    hard_passes,
    sigmoid_passes,
    silu_passes,
)

_F32 = np.dtype(np.float32)

BLOCK = 1 << 15
"""Elements per block: a body's few float32 temporaries of this size stay in the L2 cache."""


# With numba installed (the ``fast`` extra), the polynomial passes of erf and gelu run as one compiled loop per
# block (the same arithmetic, with fused multiply-adds), and NumPy's SIMD tanh does the rest: about 5x faster
# than the NumPy passes on large arrays. Loaded on the first large array (see .jit); without numba (or with
# OPGRAPH_NUMBA=0) the NumPy passes run.
_loops: Any = None  # None: not compiled yet; else the compiled loops, in the order of _LOOPS


def _odd_poly7(x: Any, o: Any, c0: Any, c1: Any, c2: Any, c3: Any, c4: Any, c5: Any, c6: Any) -> None:
    for i in range(x.size):
        v = x[i]
        s = v * v
        o[i] = v * (c0 + s * (c1 + s * (c2 + s * (c3 + s * (c4 + s * (c5 + s * c6))))))


def _gelu_finish(x: Any, t: Any, o: Any, one: Any, half: Any) -> None:
    for i in range(x.size):
        o[i] = (t[i] + one) * (x[i] * half)


def _sigmoid_finish(e: Any, o: Any, one: Any, big: Any) -> None:
    for i in range(e.size):
        v = e[i]
        v = big if v > big else v  # exp(x) overflowed to inf only where sigmoid(x) rounds to 1 (nan stays)
        o[i] = v / (one + v)


def _silu_finish(x: Any, e: Any, o: Any, one: Any, big: Any) -> None:
    for i in range(x.size):
        v = e[i]
        v = big if v > big else v  # as _sigmoid_finish
        o[i] = x[i] * (v / (one + v))


def _hard_swish_loop(x: Any, o: Any, three: Any, six: Any, sixth: Any, zero: Any) -> None:
    for i in range(x.size):
        v = x[i]
        t = v + three
        t = zero if t < zero else t  # comparisons, not min/max: a nan stays nan
        t = six if t > six else t
        o[i] = (v * t) * sixth


# In-place forms of the loops (x is also the output): with two arguments that are the same array, LLVM's
# vectoriser sees them overlap at run time and falls back to its scalar loop (3x slower, measured), while a
# loop over one array vectorises. The compiled program runs these ops in place whenever the planner can.
def _silu_finish_inplace(x: Any, e: Any, one: Any, big: Any) -> None:
    for i in range(x.size):
        v = e[i]
        v = big if v > big else v
        x[i] = x[i] * (v / (one + v))


def _hard_swish_inplace(x: Any, three: Any, six: Any, sixth: Any, zero: Any) -> None:
    for i in range(x.size):
        v = x[i]
        t = v + three
        t = zero if t < zero else t
        t = six if t > six else t
        x[i] = (v * t) * sixth


def _hard_sigmoid_inplace(x: Any, a: Any, b: Any, zero: Any, one: Any) -> None:
    for i in range(x.size):
        t = x[i] * a + b
        t = zero if t < zero else t
        x[i] = one if t > one else t


def _hard_sigmoid_loop(x: Any, o: Any, a: Any, b: Any, zero: Any, one: Any) -> None:
    for i in range(x.size):
        t = x[i] * a + b
        t = zero if t < zero else t
        o[i] = one if t > one else t


_LOOPS = (_odd_poly7, _gelu_finish, _sigmoid_finish, _silu_finish, _hard_swish_loop, _hard_sigmoid_loop,
          _silu_finish_inplace, _hard_swish_inplace, _hard_sigmoid_inplace)


def compiled(n: int, *, load: bool = False) -> Any:
    """The compiled loops for an array of ``n`` elements, or None to run the NumPy passes (``load``: load
    numba for any array that would use the loops, as a compiled program does once, when it is built).

    >>> compiled(10) is None   # too small for the loops
    True
    """
    global _loops
    if not accel.enabled or n < NUMBA_MIN:
        return None
    if _loops is None:
        numba = numba_for(n, load=load)
        if numba is None:
            return None
        jit = numba.njit(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")
        _loops = tuple(jit(f) for f in _LOOPS)
    return _loops


def _erf_block_nb(x: np.ndarray, o: np.ndarray, s: np.ndarray, r: np.ndarray) -> None:
    _loops[0](x, o, *ERF_P32)
    np.tanh(o, out=o)


def _sigmoid_block_nb(x: np.ndarray, o: np.ndarray, s: np.ndarray, r: np.ndarray) -> None:
    np.exp(x, out=r)
    _loops[2](r, o, np.float32(1.0), np.float32(3e38))


def _gelu_block_nb(x: np.ndarray, o: np.ndarray, s: np.ndarray, r: np.ndarray) -> None:
    _loops[0](x, r, *GELU_P32)
    np.tanh(r, out=r)
    _loops[1](x, r, o, np.float32(1.0), np.float32(0.5))


def _silu_block_nb(x: np.ndarray, o: np.ndarray, s: np.ndarray, r: np.ndarray) -> None:
    np.exp(x, out=r)
    if np.may_share_memory(x, o):  # the same block (the kernel runs in place): the one-array loop
        _loops[6](o, r, np.float32(1.0), np.float32(3e38))
    else:
        _loops[3](x, r, o, np.float32(1.0), np.float32(3e38))


def blocked_f32(body: Callable[..., None], x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """Run ``body(x_block, out_block, tmp1, tmp2)`` over float32 ``x`` in cache-sized blocks, into ``out``.

    ``out`` may be ``x`` itself: a body reads its input block before it writes the output block.

    >>> blocked_f32(erf_passes, np.array([0.0, 0.5], np.float32), None)
    array([0.       , 0.5204998], dtype=float32)
    """
    if not (x.dtype == _F32 and x.flags.c_contiguous):
        x = np.array(x, dtype=_F32, order="C")  # np.ascontiguousarray would make a 0-d array 1-d
    direct = out is not None and out.dtype == _F32 and out.flags.c_contiguous and out.shape == x.shape
    res = out if direct else np.empty(x.shape, _F32)
    xf, of = x.reshape(-1), res.reshape(-1)  # type: ignore[union-attr]
    n = xf.size
    m = min(n, BLOCK)
    s, r = np.empty(m, _F32), np.empty(m, _F32)
    # x * x of a large x is inf by design; gelu(-inf) is 0 * inf = nan, as in the formula torch uses
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for i in range(0, n, BLOCK):
            j = min(n, i + BLOCK)
            body(xf[i:j], of[i:j], s[:j - i], r[:j - i])
    if out is not None and not direct:
        np.copyto(out, res, casting="unsafe")
        return out
    return res  # type: ignore[return-value]


def _half(body: Callable[..., None], x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    # float16 is computed in float32 and rounded once
    res = blocked_f32(body, x.astype(_F32), None).astype(np.float16)
    if out is None:
        return res
    np.copyto(out, res, casting="unsafe")
    return out


_erf_ref = get_op("erf").kernel
_sigmoid_ref = get_op("sigmoid").kernel
_gelu_ref = get_op("gelu").kernel
_silu_ref = get_op("silu").kernel
_hard_swish_ref = get_op("hard_swish").kernel
_hard_sigmoid_ref = get_op("hard_sigmoid").kernel


@BACKEND.rule("erf")
def erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The error function: float32 in cache-sized blocks (numba loops for large arrays), else SciPy's.

    >>> erf(np.array([0.0, 0.5, -2.0], np.float32))
    array([ 0.        ,  0.5204998 , -0.99532217], dtype=float32)
    """
    if isinstance(x, np.ndarray) and x.dtype == _F32:
        return blocked_f32(_erf_block_nb if compiled(x.size) is not None else erf_passes, x, out)
    return _erf_ref(x, out=out)  # type: ignore[no-any-return]


@BACKEND.rule("sigmoid")
def sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The logistic function: float32 in cache-sized blocks (numba loops for large arrays), else SciPy's expit.

    >>> sigmoid(np.array([0.0, 2.0, -100.0], np.float32))
    array([5.0000000e-01, 8.8079715e-01, 3.7835059e-44], dtype=float32)
    """
    if isinstance(x, np.ndarray) and x.dtype == _F32:
        return blocked_f32(_sigmoid_block_nb if compiled(x.size) is not None else sigmoid_passes, x, out)
    return _sigmoid_ref(x, out=out)  # type: ignore[no-any-return]


erf.specialize = prepare_loops  # type: ignore[attr-defined]
sigmoid.specialize = prepare_loops  # type: ignore[attr-defined]


@BACKEND.rule("gelu")
def gelu(x: np.ndarray, out: np.ndarray | None = None, *, approximate: str = "none") -> np.ndarray:
    """GELU: float16 and float32 in cache-sized blocks (``"none"`` by numba loops for large arrays), float64 by
    the op's reference kernel.

    >>> gelu(np.array([-1.0, 0.0, 2.0], np.float32))
    array([-0.15865523,  0.        ,  1.9544997 ], dtype=float32)
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    x = np.asarray(x)
    if x.dtype in (np.float16, np.float32):
        if approximate == "tanh":
            body = gelu_tanh_passes
        else:
            body = _gelu_block_nb if compiled(x.size) is not None else gelu_passes
        if x.dtype == np.float16:
            return _half(body, x, out)
        return blocked_f32(body, x, out)
    return _gelu_ref(x, out, approximate=approximate)  # type: ignore[no-any-return]


gelu.specialize = prepare_loops  # type: ignore[attr-defined]


@BACKEND.rule("silu")
def silu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """SiLU: float16 and float32 in cache-sized blocks (``exp`` and one numba loop for large arrays), float64
    by the op's reference kernel.

    >>> silu(np.array([-1.0, 0.0, 2.0], np.float32))
    array([-0.2689414,  0.       ,  1.7615943], dtype=float32)
    """
    x = np.asarray(x)
    if x.dtype in (np.float16, np.float32):
        body = _silu_block_nb if compiled(x.size) is not None else silu_passes
        if x.dtype == np.float16:
            return _half(body, x, out)
        return blocked_f32(body, x, out)
    return _silu_ref(x, out)  # type: ignore[no-any-return]


FUSED_NUMBA_MIN = 1 << 12
"""silu, hard_swish and hard_sigmoid use the compiled loops (once numba is loaded) from this many elements: one
loop replaces three to five NumPy passes, which pays from a few thousand elements (measured)."""


def _silu_direct(x: np.ndarray, o: np.ndarray, s: np.ndarray, r: np.ndarray) -> None:
    with np.errstate(over="ignore"):  # exp(x) overflows where sigmoid(x) rounds to 1 (the loop clamps it)
        _silu_block_nb(x, o, s, r)


_SCRATCH = threading.local()


def scratch(shape: tuple[int, ...], k: int) -> np.ndarray:
    """Temporary ``k`` (0 or 1) of ``shape`` in float32, one buffer per thread shared by every call: the same
    memory stays in the cache from op to op, as the planner's arena buffers do (a buffer per op measured 4%
    slower on MobileNetV3). Programs of one thread run one op at a time, so sharing is safe.

    >>> scratch((2, 3), 0).shape
    (2, 3)
    """
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = [np.empty(0, _F32), np.empty(0, _F32)]
    n = int(np.prod(shape))
    if bufs[k].size < n:
        bufs[k] = np.empty(n, _F32)
    return bufs[k][:n].reshape(shape)


def specializer(kernel: Callable[..., Any], block: Callable[[dict[str, Any], bool], Callable[..., None]],
                blocked: bool, temporaries: int) -> Callable[..., Any]:
    """``kernel.specialize`` for a unary float32 op of a static shape: a call ``(x, out)`` for the compiled
    program, its buffers allocated and its path chosen once. With the compiled loops (numba loaded, at least
    :data:`FUSED_NUMBA_MIN` elements): the loop over cache-sized blocks (``blocked``: it needs a temporary) or
    over the whole array. Otherwise the NumPy passes over whole arrays, the ufunc calls the unfused ops make:
    blocks of a CNN's activations (which fit the L2 cache whole) only added per-block calls (measured 1.3x
    slower on 200K elements); the generic kernel's per-call set-up costs as much as the work on small arrays.
    ``temporaries``: whether the NumPy passes need temporaries (small arrays get their own, allocated once; large
    ones share the thread's, see :func:`scratch`).

    >>> from opgraph.core.types import TensorType
    >>> spec = specializer(silu, lambda attrs, loops: silu_passes, blocked=True, temporaries=2)
    >>> call, _, _ = spec([TensorType("f4", (3,))], [], {})
    >>> out = np.empty(3, np.float32)
    >>> call(np.zeros(3, np.float32), out)
    >>> out
    array([0., 0., 0.], dtype=float32)
    """
    def specialize(in_types: Sequence[Any], out_types: Sequence[Any], attrs: Mapping[str, Any]) -> Any:
        t = in_types[0]
        if not (t.dtype == _F32 and t.shape is not None and None not in t.shape):
            return None
        n = int(np.prod(t.shape))
        loops = n >= FUSED_NUMBA_MIN and compiled(max(n, NUMBA_MIN), load=n >= NUMBA_MIN) is not None
        if not loops:
            passes = block(dict(attrs), False)
            if n <= BLOCK:
                ts, tr = np.empty(t.shape, _F32), np.empty(t.shape, _F32)
                return (lambda x, out: passes(x, out, ts, tr)), (), ()  # exact types: any strides work
            if temporaries == 0:
                return (lambda x, out: passes(x, out, None, None)), (), ()
            shape = tuple(t.shape)
            return (lambda x, out: passes(x, out, scratch(shape, 0), scratch(shape, 1))), (), ()
        body = block(dict(attrs), True)
        m = min(n, BLOCK) if blocked else 0
        s, r = np.empty(m, _F32), np.empty(m, _F32)
        kw = dict(attrs)

        def call(x: np.ndarray, out: np.ndarray) -> np.ndarray:
            if not (x.flags.c_contiguous and out.flags.c_contiguous):
                return kernel(x, out=out, **kw)  # type: ignore[no-any-return]
            xf, of = x.reshape(-1), out.reshape(-1)
            if not blocked:
                body(xf, of, s, r)
                return out
            for i in range(0, n, BLOCK):
                j = min(n, i + BLOCK)
                body(xf[i:j], of[i:j], s[:j - i], r[:j - i])
            return out

        return call, (), ()

    return specialize


silu.specialize = specializer(  # type: ignore[attr-defined]
    silu, lambda attrs, loops: _silu_direct if loops else silu_passes, blocked=True, temporaries=2)


def _hard_block(alpha: float, beta: float, swish: bool, loops: bool) -> Callable[..., None]:
    """The block body: the numba loop (``loops``) or the op's NumPy passes."""
    if not loops:
        return hard_passes(alpha, beta, swish)
    a, c = np.float32(alpha), np.float32(beta)
    zero, one, three, six, sixth = (np.float32(v) for v in (0.0, 1.0, 3.0, 6.0, 1 / 6))

    def body(x: np.ndarray, o: np.ndarray, s: np.ndarray, r: np.ndarray) -> None:
        same = np.may_share_memory(x, o)  # in place: the one-array loops (see _silu_finish_inplace)
        if swish:
            if same:
                _loops[7](o, three, six, sixth, zero)
            else:
                _loops[4](x, o, three, six, sixth, zero)
        elif same:
            _loops[8](o, a, c, zero, one)
        else:
            _loops[5](x, o, a, c, zero, one)

    return body


def _hard(x: np.ndarray, out: np.ndarray | None, alpha: float, beta: float, swish: bool) -> np.ndarray:
    if x.dtype in (np.float16, np.float32):
        body = _hard_block(alpha, beta, swish, compiled(x.size) is not None)
        if x.dtype == np.float16:
            return _half(body, x, out)
        return blocked_f32(body, x, out)
    if swish:
        return _hard_swish_ref(x, out)  # type: ignore[no-any-return]
    return _hard_sigmoid_ref(x, out, alpha=alpha, beta=beta)  # type: ignore[no-any-return]


@BACKEND.rule("hard_sigmoid")
def hard_sigmoid(x: np.ndarray, out: np.ndarray | None = None, *, alpha: float = 0.2,
                 beta: float = 0.5) -> np.ndarray:
    """ONNX HardSigmoid: float16 and float32 in cache-sized blocks (numba loops for large arrays), float64 by the
    op's reference kernel.

    >>> hard_sigmoid(np.array([-4.0, 0.0, 1.0, 4.0], np.float32), alpha=1 / 6)
    array([0.       , 0.5      , 0.6666667, 1.       ], dtype=float32)
    """
    return _hard(np.asarray(x), out, alpha, beta, False)


@BACKEND.rule("hard_swish")
def hard_swish(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """ONNX HardSwish: float16 and float32 in cache-sized blocks (one numba loop for large arrays), float64 by
    the op's reference kernel.

    >>> hard_swish(np.array([-4.0, -1.0, 0.0, 1.0, 4.0], np.float32))
    array([-0.        , -0.33333334,  0.        ,  0.6666667 ,  4.        ], dtype=float32)
    """
    return _hard(np.asarray(x), out, 1 / 6, 0.5, True)


hard_swish.specialize = specializer(  # type: ignore[attr-defined]
    hard_swish, lambda attrs, loops: _hard_block(1 / 6, 0.5, True, loops), blocked=False, temporaries=1)
hard_sigmoid.specialize = specializer(  # type: ignore[attr-defined]
    hard_sigmoid, lambda attrs, loops: _hard_block(attrs["alpha"], attrs["beta"], False, loops), blocked=False,
    temporaries=0)
