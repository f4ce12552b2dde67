"""Elementwise regions over large arrays as one parallel numba loop, bit-identical to NumPy.

:func:`compile_elementwise` turns a graph whose ops are all elementwise (NumPy ufunc kinds, comparisons,
``where``, ``cast``, ``fused_elementwise`` programs of these; operands of one shape or size-1 scalars) into one
generated ``@numba.njit(parallel=True)`` function: a ``prange`` over chunks of cache-sized blocks, each block
computing every output. Per block, runs of arithmetic steps (add, multiply, ..., comparisons, ``where``, casts)
become one inner loop over the block with the values in registers; every other step (sin, exp, tanh, log,
maximum, integer arithmetic, ...) calls NumPy's own inner loop for that ufunc and dtypes on the block (its C
function, taken from the ufunc object), so the results are NumPy's to the bit: the arithmetic is IEEE in the
step's dtype with no contraction into fused multiply-adds, and the transcendental functions are NumPy's SIMD
kernels, not numba's (libm's ``sinf`` & co. differ from NumPy's in the last bit). ``fast_math=True`` runs float32
exp, log, sin, cos and tanh by the approximations below (a few ulp from NumPy); the rest stays exact.

Compile time: the generated source depends on the graph's op program (kinds, dtypes, which values are
scalars, which are outputs), not on its sizes; each program is compiled once per process and kept in an
in-process dict (the 20-op chain: about 4 s of CPU, numba's start included; with fast_math about 13 s, the
approximations inlined into numba's parallel loop; measured on a loaded 2-core machine).
numba's ``cache=True`` cannot store functions made by ``exec`` (and the NumPy loop addresses are per process),
so nothing goes to disk.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (5,)), name="x")
    >>> b.output(b.op("add", b.op("sin", x), b.constant(np.float32(1.0))))
    >>> g = b.freeze()
    >>> elementwise_region(g) is None
    True
    >>> a = np.linspace(0, 1, 5, dtype=np.float32)
    >>> fn = compile_elementwise(g)
    >>> bool((fn([a])[0] == np.sin(a) + np.float32(1.0)).all())
    True
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from math import prod
from typing import Any

import numpy as np

from opgraph.core.graph import Graph
from opgraph.core.registry import get_op
from opgraph.core.types import TensorType
from opgraph.errors import ArgumentError

__all__ = ["BLOCK", "compile_elementwise", "elementwise_region"]

BLOCK = 2048
"""Elements of one block (a scratch buffer per stored intermediate: 8 KiB of float32, 16 KiB of float64)."""
_GROUP = 4
"""Inline steps in one inner loop at most (longer loop bodies vectorise worse: bench/numpy_levels.py)."""
_CHUNKS_PER_THREAD = 4
"""Chunks of blocks per thread in the prange: few enough to allocate scratch once per chunk, enough to balance."""

# NumPy dtypes the loop handles (numba has no float16; complex arithmetic is left to NumPy)
_DTYPES = frozenset(np.dtype(c) for c in "?bBhHiIlLqQfd")

# Inline float arithmetic: an expression over operands already cast to the step's dtype; each rounds exactly
# as NumPy's loop does (IEEE add/sub/mul/div/sqrt in that dtype; abs, negative only touch the sign bit).
_FLOAT_EXPR = {
    "add": "{0} + {1}", "subtract": "{0} - {1}", "multiply": "{0} * {1}", "divide": "{0} / {1}",
    "negative": "-{0}", "positive": "{0}", "abs": "abs({0})", "square": "{0} * {0}", "sqrt": "np.sqrt({0})",
    "reciprocal": "{d}(1.0) / {0}",
}
_COMPARE_EXPR = {"equal": "{0} == {1}", "not_equal": "{0} != {1}", "less": "{0} < {1}",
                 "less_equal": "{0} <= {1}", "greater": "{0} > {1}", "greater_equal": "{0} >= {1}"}
_BOOL_EXPR = {"logical_and": "{0} & {1}", "logical_or": "{0} | {1}", "logical_xor": "{0} ^ {1}",
              "logical_not": "not {0}"}


# ---------------------------------------------------------------- NumPy's inner loops
class _UfuncObject(ctypes.Structure):
    """The head of NumPy's PyUFuncObject (numpy/ufuncobject.h, the same in NumPy 1.x and 2.x)."""

    _fields_ = [("ob_refcnt", ctypes.c_ssize_t), ("ob_type", ctypes.c_void_p), ("nin", ctypes.c_int),
                ("nout", ctypes.c_int), ("nargs", ctypes.c_int), ("identity", ctypes.c_int),
                ("functions", ctypes.POINTER(ctypes.c_void_p)), ("data", ctypes.POINTER(ctypes.c_void_p)),
                ("ntypes", ctypes.c_int), ("reserved1", ctypes.c_int), ("name", ctypes.c_char_p),
                ("types", ctypes.POINTER(ctypes.c_char))]


# PyUFuncGenericFunction(char **args, npy_intp *dimensions, npy_intp *steps, void *data), all four passed as
# 64-bit integers (the same registers as pointers on the 64-bit ABIs numba runs on)
_LOOP_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)
_LOOPS: dict[tuple[str, tuple[str, ...]], tuple[Any, int] | None] = {}
_LOCK = threading.RLock()


def _probe(dt: np.dtype) -> np.ndarray:
    """Operand values to check a loop with: specials, signed zeros, subnormals, large and small values."""
    if dt.kind == "b":
        return np.array([True, False] * 64)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        base = np.array([0, 1, 2, 3, 7, 100, info.max, info.max - 1, info.min, info.min + 1], dtype=dt)
        rng = np.random.default_rng(7)
        return np.concatenate([base, rng.integers(info.min, info.max, 118, dtype=dt, endpoint=True)])
    f = np.finfo(dt)
    base = np.array([0.0, -0.0, 1.0, -1.0, 0.5, np.pi, 1e4, -1e4, 88.5, -104.0, 1e30, -1e30, np.inf, -np.inf,
                     np.nan, f.tiny, f.tiny / 4, f.max, -f.max], dtype=dt)
    rng = np.random.default_rng(7)
    return np.concatenate([base, (rng.standard_normal(109) * 10.0 ** rng.integers(-3, 4, 109)).astype(dt)])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal to the bit, NaNs (whatever their payload) counting as equal."""
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        return bool((nan == np.isnan(b)).all()
                    and (a[~nan].view(f"u{a.itemsize}") == b[~nan].view(f"u{a.itemsize}")).all())
    return bool((a == b).all())


def ufunc_loop(uf: np.ufunc, dtypes: Sequence[np.dtype]) -> tuple[Any, int] | None:
    """NumPy's inner loop of ``uf`` for exactly ``dtypes`` (inputs then outputs) as ``(ctypes function, data)``,
    or None when the ufunc has no such loop or the loop, called on probe values, does not give the ufunc's
    own results (a new-style loop the legacy table does not hold).

    >>> fn, data = ufunc_loop(np.sin, [np.dtype("float32")] * 2)
    >>> x = np.linspace(-3, 3, 7, dtype=np.float32); o = np.empty_like(x)
    >>> ptrs = np.array([x.ctypes.data, o.ctypes.data]); dims = np.array([7]); steps = np.array([4, 4])
    >>> fn(ptrs.ctypes.data, dims.ctypes.data, steps.ctypes.data, data)
    >>> bool((o == np.sin(x)).all())
    True
    """
    key = (uf.__name__, tuple(np.dtype(d).str for d in dtypes))
    with _LOCK:
        if key in _LOOPS:
            return _LOOPS[key]
        _LOOPS[key] = found = _find_loop(uf, [np.dtype(d) for d in dtypes])
        return found


def _find_loop(uf: np.ufunc, dts: list[np.dtype]) -> tuple[Any, int] | None:
    if uf.nout != 1 or len(dts) != uf.nargs or not all(d in _DTYPES for d in dts):
        return None
    head = _UfuncObject.from_address(id(uf))
    if head.nin != uf.nin or head.nout != uf.nout or head.ntypes != uf.ntypes:
        return None  # not the layout this module reads
    nums = [d.num for d in dts]
    for i in range(head.ntypes):
        if [head.types[i * head.nargs + j][0] for j in range(head.nargs)] == nums:
            fn = _LOOP_TYPE(head.functions[i])
            data = int(head.data[i] or 0) if head.data else 0
            break
    else:
        return None
    ins = [_probe(d) for d in dts[:-1]]
    if len(ins) == 2:  # every pair of special values, and the random tails
        n = len(ins[0])
        ins = [np.repeat(ins[0], n), np.tile(ins[1], n)]
    ins = [np.ascontiguousarray(x) for x in ins]
    out = np.empty(len(ins[0]), dts[-1])
    with np.errstate(all="ignore"):
        want = uf(*ins, dtype=dts[-1] if dts[-1].kind != "b" else None, casting="unsafe")
    ptrs = np.array([x.ctypes.data for x in ins] + [out.ctypes.data], dtype=np.int64)
    dims = np.array([len(out)], dtype=np.int64)
    steps = np.array([d.itemsize for d in dts], dtype=np.int64)
    with np.errstate(all="ignore"):
        fn(ptrs.ctypes.data, dims.ctypes.data, steps.ctypes.data, data)
    if want.dtype != out.dtype or not _same(out, want):
        return None
    return fn, data


# ---------------------------------------------------------------- fast_math: float32 approximations
# The NumPy engine's compiled float32 loop (opgraph.backends.numpy.fused, optimize(..., fast_math=True)) and
# compile_elementwise(..., fast_math=True) evaluate these kinds by branch-free polynomial approximations with
# explicit fused multiply-adds (llvm.fma: one rounding, no fastmath flags); they vectorise, where NumPy's
# loops and numba's own np.sin & co. do not run as fast. An argument outside an approximation's checked range
# (APPROX_OUTSIDE) makes the caller compute NumPy's result instead.
APPROX_ULP = {"exp": 3, "log": 4, "sin": 3, "cos": 3, "tanh": 5}
"""Largest distance, in float32 ulps, between a compiled step's result and NumPy's for the same input, measured
on every 7th float32 of the step's checked range (tests/test_numpy_engine_fused_numba.py checks every 61st). The
other compiled kinds (arithmetic, sqrt, floor/ceil/trunc, maximum/minimum/relu) round exactly as NumPy does."""

# float32 scalar expressions of the kinds compiled with fast_math over operands {0}, {1}, {2} (names or loads)
APPROX_EXPR = {
    "negative": "-{0}", "positive": "{0}", "abs": "abs({0})", "square": "{0} * {0}", "reciprocal": "_ONE / {0}",
    "add": "{0} + {1}", "subtract": "{0} - {1}", "multiply": "{0} * {1}", "divide": "{0} / {1}",
    "maximum": "{0} if ({0} >= {1}) | ({0} != {0}) else {1}", "minimum": "{0} if ({0} <= {1}) | ({0} != {0}) else {1}",
    "relu": "{0} if ({0} >= _ZERO) | ({0} != {0}) else _ZERO", "fma": "{0} * {1} + {2}", "sqrt": "np.sqrt({0})",
    "floor": "np.floor({0})", "ceil": "np.ceil({0})", "trunc": "np.trunc({0})",
    "exp": "_nb_exp({0})", "log": "_nb_log({0})", "sin": "_nb_sincos({0}, 0)", "cos": "_nb_sincos({0}, 1)",
    "tanh": "_nb_tanh({0})",
}
# per approximated kind: the condition on its argument under which the approximation is not used
APPROX_OUTSIDE = {
    "exp": "not (({0} >= _F(-87.0)) & ({0} <= _F(88.0)))",
    "log": "not (({0} >= _F(1.1754944e-38)) & ({0} <= _F(3.4028235e38)))",
    "sin": "not (abs({0}) <= _F(6000.0))", "cos": "not (abs({0}) <= _F(6000.0))", "tanh": "{0} != {0}",
}

# Stand-ins for the numba intrinsics the helpers below call (bound when numba loads; the helpers only run compiled).
_fma: Any = None   # fused multiply-add of three float32
_i2f: Any = None   # int32 bits as float32
_f2i: Any = None   # float32 bits as int32
_F, _I = np.float32, np.int32
_ROUND = np.float32(12582912.0)  # 1.5 * 2**23: adding and subtracting it rounds a float32 below 2**22 to an integer


def _nb_exp(x: Any) -> Any:  # pragma: no cover - compiled by numba
    """Cephes' expf: exp(x) = 2**k exp(r), |r| <= ln(2)/2, for x in [-87, 88]."""
    k = _fma(x, _F(1.44269504088896341), _ROUND) - _ROUND
    r = _fma(k, _F(-0.693359375), x)
    r = _fma(k, _F(2.12194440e-4), r)
    p = _fma(_fma(_fma(_fma(_fma(_fma(_F(1.9875691500e-4), r, _F(1.3981999507e-3)), r, _F(8.3334519073e-3)), r,
                                 _F(4.1665795894e-2)), r, _F(1.6666665459e-1)), r, _F(5.0000001201e-1)),
             r * r, r + _F(1.0))
    return p * _i2f((_I(k) + _I(127)) << _I(23))


def _nb_log(x: Any) -> Any:  # pragma: no cover - compiled by numba
    """Cephes' logf: log(m 2**e) with m in [sqrt(1/2), sqrt(2)), for positive normal x."""
    b = _f2i(x)
    e = _F(((b >> _I(23)) & _I(0xff)) - _I(126))
    m = _i2f((b & _I(0x007fffff)) | _I(0x3f000000))
    low = m < _F(0.707106781186547524)
    e = e - _F(1.0) if low else e
    m = (m + m - _F(1.0)) if low else (m - _F(1.0))
    z = m * m
    y = _fma(_fma(_fma(_fma(_fma(_fma(_fma(_fma(_F(7.0376836292e-2), m, _F(-1.1514610310e-1)), m,
                                           _F(1.1676998740e-1)), m, _F(-1.2420140846e-1)), m, _F(1.4249322787e-1)),
                               m, _F(-1.6668057665e-1)), m, _F(2.0000714765e-1)), m, _F(-2.4999993993e-1)),
             m, _F(3.3333331174e-1)) * m * z
    y = _fma(_F(-2.12194440e-4), e, y)
    y = _fma(_F(-0.5), z, y)
    return _fma(_F(0.693359375), e, m + y)


def _nb_sincos(x: Any, q: int) -> Any:  # pragma: no cover - compiled by numba
    """sin(x) (q = 0) or cos(x) (q = 1) for |x| <= 6000: x - k pi/2 by a four-part Cody-Waite reduction
    (the first three parts of 12 bits, so k * part is exact), then Cephes' sinf/cosf polynomials."""
    k = _fma(x, _F(0.636619772367581343), _ROUND) - _ROUND
    r = _fma(k, _F(-1.57080078125), x)
    r = _fma(k, _F(4.453584551811218e-06), r)
    r = _fma(k, _F(8.706138032721356e-10), r)
    r = _fma(k, _F(-6.223371969669989e-14), r)
    n = (_I(k) + _I(q)) & _I(3)
    z = r * r
    s = _fma(_fma(_fma(_F(-1.9515295891e-4), z, _F(8.3321608736e-3)), z, _F(-1.6666654611e-1)) * z, r, r)
    c = _fma(_fma(_fma(_F(2.443315711809948e-5), z, _F(-1.388731625493765e-3)), z, _F(4.166664568298827e-2)) * z, z,
             _fma(_F(-0.5), z, _F(1.0)))
    v = s if (n & _I(1)) == 0 else c
    return -v if (n & _I(2)) != 0 else v


def _nb_tanh(x: Any) -> Any:  # pragma: no cover - compiled by numba
    """Eigen's float tanh: a 13/6 rational function on x clamped to +-7.9 (where tanh rounds to +-1)."""
    c = min(max(x, _F(-7.90531110763549805)), _F(7.90531110763549805))
    z = c * c
    p = _fma(_fma(_fma(_fma(_fma(_fma(_F(-2.76076847742355e-16), z, _F(2.00018790482477e-13)), z,
                                 _F(-8.60467152213735e-11)), z, _F(5.12229709037114e-08)), z,
                       _F(1.48572235717979e-05)), z, _F(6.37261928875436e-04)), z, _F(4.89352455891786e-03)) * c
    q = _fma(_fma(_fma(_F(1.19825839466702e-06), z, _F(1.18534705686654e-04)), z, _F(2.26843463243900e-03)), z,
             _F(4.89352518554385e-03))
    return x if abs(x) < _F(0.0004) else p / q


def approx_namespace() -> dict[str, Any] | None:
    """The names the approximations' source needs: numba, its intrinsics and the helpers above compiled
    against them (None: numba missing or in pure-Python ``NUMBA_DISABLE_JIT`` mode). Built once per process.

    >>> ns = approx_namespace()
    >>> sorted(k for k in ns if k.startswith("_nb_"))
    ['_nb_exp', '_nb_log', '_nb_sincos', '_nb_tanh']
    """
    global _approx_ns
    if _approx_ns is not None:
        return _approx_ns or None
    _approx_ns = _approx_namespace() or False
    return _approx_ns or None


_approx_ns: Any = None


def _approx_namespace() -> dict[str, Any] | None:
    import contextlib
    import types as pytypes

    try:
        import numba
        from llvmlite import ir
        from numba.core import cgutils
        from numba.extending import intrinsic
    except Exception:  # missing, or broken against this NumPy: the NumPy path is always there
        return None
    if numba.config.DISABLE_JIT:
        return None
    nt = numba.types

    def fma_codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.FloatType(), [ir.FloatType()] * 3),
                                            "llvm.fma.f32")
        return builder.call(fn, args)

    def fma(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
        return nt.float32(nt.float32, nt.float32, nt.float32), fma_codegen

    def i2f(typingctx: Any, v: Any) -> Any:
        return nt.float32(nt.int32), lambda ctx, builder, sig, args: builder.bitcast(args[0], ir.FloatType())

    def f2i(typingctx: Any, v: Any) -> Any:
        return nt.int32(nt.float32), lambda ctx, builder, sig, args: builder.bitcast(args[0], ir.IntType(32))

    def wide_codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        # LLVM's tuning for recent Intel cores prefers 256-bit vectors; the kernel's loops are pure arithmetic,
        # and 512-bit ones ran the 20-op chain 1.5x faster (measured; ignored by CPUs without AVX-512). llvmlite
        # checks function attributes against a list without string attributes, hence set.add.
        with contextlib.suppress(Exception):
            set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        return context.get_dummy_value()

    def wide(typingctx: Any) -> Any:
        return nt.none(), wide_codegen

    ns: dict[str, Any] = {"np": np, "_F": _F, "_I": _I, "_ROUND": _ROUND, "_ONE": _F(1.0), "_ZERO": _F(0.0),
                          "_fma": intrinsic(fma), "_i2f": intrinsic(i2f), "_f2i": intrinsic(f2i),
                          "_wide": intrinsic(wide), "numba": numba}
    helper = numba.njit(inline="always", error_model="numpy")
    for fn in (_nb_exp, _nb_log, _nb_sincos, _nb_tanh):
        ns[fn.__name__] = helper(pytypes.FunctionType(fn.__code__, ns, fn.__name__))
    return ns


# ---------------------------------------------------------------- the program of a graph
# A program is hashable and says everything the generated source depends on:
#   ins: per graph input, (dtype str, scalar)
#   consts: per constant, (dtype str, scalar); its array is passed as an argument
#   steps: (how, kind, refs, dtype str, scalar, extra): how "inline" or "ufunc"; refs index values (inputs,
#          then constants, then steps); extra: the computation dtype of the operands (inline) or the ufunc's
#          loop dtypes (ufunc)
#   outs: value index per graph output
class _NotRegion(Exception):
    pass


def _resolve(uf: np.ufunc, dts: list[np.dtype]) -> tuple[np.dtype, ...]:
    try:
        return tuple(np.dtype(d) for d in uf.resolve_dtypes((*dts, None)))
    except Exception as e:  # no loop for these dtypes
        raise _NotRegion(f"NumPy's {uf.__name__} has no loop for {[str(d) for d in dts]}") from e


class _Builder:
    def __init__(self) -> None:
        self.dtypes: list[np.dtype] = []
        self.scalar: list[bool] = []
        self.steps: list[tuple[Any, ...]] = []

    def value(self, dt: np.dtype, scalar: bool) -> int:
        self.dtypes.append(dt)
        self.scalar.append(scalar)
        return len(self.dtypes) - 1

    def cast(self, v: int, dt: np.dtype) -> int:
        """v as dtype dt (an implicit cast step where the dtypes differ)."""
        if self.dtypes[v] == dt:
            return v
        return self.add("inline", "cast", (v,), dt, dt.str)

    def add(self, how: str, kind: str, refs: tuple[int, ...], dt: np.dtype, extra: Any) -> int:
        if dt not in _DTYPES:
            raise _NotRegion(f"{kind} gives {dt}, a dtype the loop does not handle")
        self.steps.append((how, kind, refs, dt.str, all(self.scalar[r] for r in refs), extra))
        return self.value(dt, all(self.scalar[r] for r in refs))

    def op(self, kind: str, refs: tuple[int, ...], out_dt: np.dtype | None, attrs: dict[str, Any]) -> int:
        """Steps computing one op on values ``refs``; the value it gives. ``out_dt``: its declared dtype."""
        dts = [self.dtypes[r] for r in refs]
        if kind == "cast":
            to = np.dtype(attrs["dtype"])
            src = dts[0]
            if to not in _DTYPES:
                raise _NotRegion(f"cast to {to}, a dtype the loop does not handle")
            if src.kind == "f" and to.kind in "iu":  # NaN and out-of-range values: undefined in LLVM
                raise _NotRegion(f"cast from {src} to {to} (NumPy's result for NaN and out-of-range values "
                                 f"is the CPU's, LLVM's is undefined)")
            return self.add("inline", "cast", refs, to, to.str)
        if kind == "where":
            dt = np.result_type(dts[1], dts[2])
            if dts[0] != np.bool_:
                raise _NotRegion("where with a condition that is not bool")
            return self.add("inline", "where", (refs[0], self.cast(refs[1], dt), self.cast(refs[2], dt)), dt, None)
        if kind == "fused_elementwise":
            vals: list[int] = []
            for step_kind, *srefs in attrs["program"]:
                vals.append(self.op(step_kind, tuple(refs[-r - 1] if r < 0 else vals[r] for r in srefs), None, {}))
            return vals[-1]
        opdef = get_op(kind)
        uf = getattr(opdef.kernel, "ufunc", None)
        if kind == "round" and dts[0].kind == "f":  # round keeps the dtype: NumPy's rint on floats
            uf = np.rint
        if not opdef.elementwise or not isinstance(uf, np.ufunc) or attrs:
            raise _NotRegion(f"{kind} is not a NumPy ufunc op")
        loop = _resolve(uf, dts)
        if out_dt is not None and loop[-1] != out_dt:
            raise _NotRegion(f"{kind} on {[str(d) for d in dts]} is declared {out_dt}, NumPy gives {loop[-1]}")
        cast = tuple(self.cast(r, d) for r, d in zip(refs, loop[:-1], strict=True))
        cdt = loop[0]
        if (kind in _FLOAT_EXPR and cdt.kind == "f" and loop[-1] == cdt) \
                or (kind in _COMPARE_EXPR and cdt.kind in "fiub") \
                or (kind in _BOOL_EXPR and cdt.kind == "b"):
            return self.add("inline", kind, cast, loop[-1], cdt.str)
        if ufunc_loop(uf, loop) is None:
            raise _NotRegion(f"no NumPy inner loop of {uf.__name__} for {[str(d) for d in loop]} to call")
        return self.add("ufunc", kind, cast, loop[-1], tuple(d.str for d in loop))


def _program(graph: Graph) -> tuple[Any, ...]:
    """The program of ``graph`` (see above) and its constants' arrays; raises _NotRegion saying why not."""
    if len(graph.updates):
        raise _NotRegion("the graph has state updates")
    shape: tuple[int, ...] | None = None
    for v in range(graph.num_values):
        t = graph.type_of(v)
        if not isinstance(t, TensorType) or t.shape is None or any(d is None for d in t.shape):
            raise _NotRegion(f"value {graph.value_label(v)} has type {t}, not a tensor of static shape")
        if t.dtype not in _DTYPES:
            raise _NotRegion(f"value {graph.value_label(v)} is {t.dtype}, a dtype the loop does not handle")
        if prod(t.shape) != 1:  # type: ignore[arg-type]
            if shape is not None and t.shape != shape:
                raise _NotRegion(f"value {graph.value_label(v)} has shape {list(t.shape)}, another than "
                                 f"{list(shape)} (only size-1 values broadcast)")
            shape = t.shape  # type: ignore[assignment]
    b = _Builder()
    local: dict[int, int] = {}
    ins = []
    for v in graph.inputs:
        t = graph.type_of(int(v))
        local[int(v)] = b.value(t.dtype, prod(t.shape) == 1)  # type: ignore[union-attr, arg-type]
        ins.append((t.dtype.str, prod(t.shape) == 1))  # type: ignore[union-attr, arg-type]
    order = graph.topological_order()
    const_ops = [int(i) for i in order if graph.kind_of(int(i)) == "const"]
    consts, arrays = [], []
    for i in const_ops:
        (v,) = graph.op_outputs(i)
        a = np.ascontiguousarray(graph.constant_of(i)).reshape(-1)
        local[int(v)] = b.value(a.dtype, a.size == 1)
        consts.append((a.dtype.str, a.size == 1))
        arrays.append(a)
    for i in order:
        kind = graph.kind_of(int(i))
        if kind == "const":
            continue
        outs = graph.op_outputs(int(i))
        if len(outs) != 1:
            raise _NotRegion(f"op {int(i)} ({kind}) has {len(outs)} outputs")
        refs = tuple(local[int(v)] for v in graph.op_inputs(int(i)))
        try:
            out_dt = graph.type_of(int(outs[0])).dtype  # type: ignore[union-attr]
            got = b.op(kind, refs, out_dt, graph.attrs_of(int(i)))
        except _NotRegion as e:
            raise _NotRegion(f"op {int(i)} ({kind}): {e}") from None
        if b.dtypes[got] != out_dt:
            raise _NotRegion(f"op {int(i)} ({kind}) gives {b.dtypes[got]}, declared {out_dt}")
        local[int(outs[0])] = got
    outs_t = [graph.type_of(int(v)) for v in graph.outputs]
    program = (tuple(ins), tuple(consts), tuple(b.steps), tuple(local[int(v)] for v in graph.outputs),
               tuple((t.dtype.str, prod(t.shape) == 1) for t in outs_t))  # type: ignore[union-attr, arg-type]
    return program, arrays, shape or (), [t.shape for t in outs_t]  # type: ignore[union-attr]


def elementwise_region(graph: Graph) -> str | None:
    """Why ``graph`` is not a region :func:`compile_elementwise` compiles, or None when it is.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float32", (4, 3)), name="x")
    >>> b.output(b.op("sum", x))
    >>> print(elementwise_region(b.freeze()))
    op 0 (sum): sum is not a NumPy ufunc op
    """
    try:
        _program(graph)
    except _NotRegion as e:
        return str(e)
    return None


# ---------------------------------------------------------------- the generated source
def _source(program: tuple[Any, ...], fast_math: bool) -> tuple[str, dict[str, Any]]:
    """Python source of ``_k(n, chunks, *inputs, *constants, *outputs)`` and the names it needs.

    Per block, the exact body: runs of inline steps as loops over the block, ufunc steps as calls of NumPy's
    loop. With ``fast_math`` and float32 steps of :data:`APPROX_EXPR`, a fast body runs first with those steps
    inline; a block where an approximated step met an argument outside its checked range runs the exact body
    again (it rewrites every value of the block, reading only inputs and constants).
    """
    ins, consts, steps, outs, out_types = program
    nb = len(ins) + len(consts)
    dtype = [np.dtype(d) for d, _ in ins] + [np.dtype(d) for d, _ in consts] + [np.dtype(s[3]) for s in steps]
    scalar = [s for _, s in ins] + [s for _, s in consts] + [s[4] for s in steps]
    names: dict[str, Any] = {}
    arg = [f"a{j}" for j in range(nb)]
    out_of: dict[int, int] = {}
    for k, v in enumerate(outs):
        out_of.setdefault(v, k)
    f4 = np.dtype(np.float32).str
    approx = {nb + s for s, (how, kind, _, dt, sc, extra) in enumerate(steps)
              if fast_math and how == "ufunc" and not sc and kind in APPROX_EXPR and set(extra) == {f4}}
    if approx:
        ns = approx_namespace()
        if ns is None:
            approx = set()
        else:
            names.update(ns)
    loops = [0]

    def dname(dt: np.dtype) -> str:
        names[f"_{dt.str[1:]}"] = dt.type
        return f"_{dt.str[1:]}"

    def ufunc_name(v: int) -> str:
        _, kind, _, _, _, uf_dts = steps[v - nb]
        fn, data = ufunc_loop(get_op(kind).kernel.ufunc, [np.dtype(d) for d in uf_dts])  # type: ignore[misc]
        name = f"_u{loops[0]}"
        loops[0] += 1
        names[name], names[f"{name}_data"] = fn, data
        return name

    def call(v: int, refs: tuple[int, ...], count: str, ptr: Callable[[int], str], ind: str) -> list[str]:
        uf_dts = steps[v - nb][5]
        fn = ufunc_name(v)
        out = [f"{ind}p[{j}] = {ptr(r)}" for j, r in enumerate((*refs, v))] + [f"{ind}d[0] = {count}"]
        out += [f"{ind}q[{j}] = {0 if scalar[r] else np.dtype(uf_dts[j]).itemsize}" for j, r in enumerate((*refs, v))]
        return [*out, f"{ind}{fn}(p.ctypes.data, d.ctypes.data, q.ctypes.data, {fn}_data)"]

    def expr(v: int, ops: list[str]) -> str:
        how, kind, refs, dt, _, _ = steps[v - nb]
        d = dname(np.dtype(dt))
        if how == "ufunc":  # an approximated float32 step
            return f"_F({APPROX_EXPR[kind].format(*ops)})"
        if kind == "cast":
            src = dtype[refs[0]]
            if np.dtype(dt).kind == "b":
                return f"{ops[0]} != {dname(src)}(0)"
            if src.kind == "b":
                return f"{d}(1) if {ops[0]} else {d}(0)"
            return f"{d}({ops[0]})"
        if kind == "where":
            return f"{ops[1]} if {ops[0]} else {ops[2]}"
        if kind in _FLOAT_EXPR:
            return f"{d}({_FLOAT_EXPR[kind].format(*ops, d=d)})"
        return (_COMPARE_EXPR if kind in _COMPARE_EXPR else _BOOL_EXPR)[kind].format(*ops)

    def body(inline: Callable[[int], bool], tname: str, ind: str) -> tuple[list[str], list[np.dtype]]:
        """One block's code, ``inline(v)``: whether full-size step v runs in a loop (else it calls NumPy's)."""
        units: list[list[int]] = []
        for s in range(len(steps)):
            v = nb + s
            if scalar[v]:
                continue
            u = units[-1] if units else None
            if inline(v) and u is not None and inline(u[-1]) and len(u) < _GROUP \
                    and not (v in approx and any(w in approx for w in u)):
                u.append(v)
            else:
                units.append([v])
        unit_of = {v: k for k, vs in enumerate(units) for v in vs}
        last_use: dict[int, int] = {}
        stored = set()
        for s, step in enumerate(steps):
            v = nb + s
            for r in step[2]:
                if r >= nb and not scalar[r]:
                    last_use[r] = unit_of[v]
                    if not inline(v) or unit_of[r] != unit_of[v]:
                        stored.add(r)
        # memory of each full-size step value: an output's array, else a scratch slot reused after its last use
        slot: dict[int, int] = {}
        slot_dt: list[np.dtype] = []
        free: dict[np.dtype, list[int]] = {}
        for k, vs in enumerate(units):
            for r in {r for v in vs for r in steps[v - nb][2]}:
                if r in slot and last_use.get(r) == k:
                    free.setdefault(dtype[r], []).append(slot[r])
            for v in vs:
                if v in out_of or (v not in stored and inline(v)):
                    continue
                pool = free.get(dtype[v])
                if pool:
                    slot[v] = pool.pop()
                else:
                    slot[v] = len(slot_dt)
                    slot_dt.append(dtype[v])

        def at(v: int, i: str) -> str:  # element i of the block of full-size value v
            if v < nb or v in out_of:
                return f"{arg[v] if v < nb else f'o{out_of[v]}'}[lo + {i}]"
            return f"{tname}{slot[v]}[{i}]"

        def ptr(r: int) -> str:  # address of the block's first element of value r
            if scalar[r]:
                return f"m{r}.ctypes.data"
            if r < nb or r in out_of:
                return f"{arg[r] if r < nb else f'o{out_of[r]}'}.ctypes.data + lo * {dtype[r].itemsize}"
            return f"{tname}{slot[r]}.ctypes.data"

        lines: list[str] = []
        for vs in units:
            if not inline(vs[0]):
                lines += call(vs[0], steps[vs[0] - nb][2], "m", ptr, ind)
                continue
            lines.append(f"{ind}for i in range(m):")
            inside = set(vs)
            for r in sorted({r for v in vs for r in steps[v - nb][2] if not scalar[r] and r not in inside}):
                lines.append(f"{ind}    s{r} = {at(r, 'i')}")
            for v in vs:
                ops = [f"c{r}" if scalar[r] else f"s{r}" for r in steps[v - nb][2]]
                if v in approx:
                    lines.append(f"{ind}    bad |= {APPROX_OUTSIDE[steps[v - nb][1]].format(*ops)}")
                lines.append(f"{ind}    s{v} = {expr(v, ops)}")
            for v in vs:
                if v in out_of or v in slot:
                    lines.append(f"{ind}    {at(v, 'i')} = s{v}")
        return lines, slot_dt

    lines = [f"def _k(n, chunks, {', '.join(arg + [f'o{k}' for k in range(len(outs))])}):"]
    # scalars, once: each a local c{v} and a one-element array m{v} (a ufunc loop reads it with stride 0)
    for v in range(nb):
        if scalar[v]:
            lines += [f"    m{v} = {arg[v]}", f"    c{v} = {arg[v]}[0]"]
    lines += ["    p = np.empty(4, np.int64)", "    d = np.empty(1, np.int64)", "    q = np.empty(4, np.int64)"]
    for v in (nb + s for s in range(len(steps)) if scalar[nb + s]):
        how, _, refs, dt, _, _ = steps[v - nb]
        lines.append(f"    m{v} = np.empty(1, {dname(np.dtype(dt))})")
        if how == "inline":
            lines.append(f"    m{v}[0] = {expr(v, [f'c{r}' for r in refs])}")
        else:
            lines += call(v, refs, "1", lambda r: f"m{r}.ctypes.data", "    ")
        lines.append(f"    c{v} = m{v}[0]")
    for k, v in enumerate(outs):
        if out_types[k][1]:
            lines.append(f"    o{k}[0] = c{v}")
    full = [nb + s for s in range(len(steps)) if not scalar[nb + s]]
    full_outs = [(k, v) for k, v in enumerate(outs) if not out_types[k][1] and (v < nb or out_of[v] != k)]
    if full or full_outs:
        ind = "            "
        exact, exact_slots = body(lambda v: steps[v - nb][0] == "inline", "t", ind + ("    " if approx else ""))
        fast: list[str] = []
        fast_slots: list[np.dtype] = []
        if approx:
            fast, fast_slots = body(lambda v: steps[v - nb][0] == "inline" or v in approx, "f", ind)
            fast = [f"{ind}bad = False", *fast, f"{ind}if bad:"]
        lines += [f"    blocks = (n + {BLOCK - 1}) // {BLOCK}", "    per = (blocks + chunks - 1) // chunks",
                  "    for c in numba.prange(chunks):"]
        if approx:  # inside the prange: its body is compiled as a function of its own, which takes the attribute
            lines.append("        _wide()")
        lines += [f"        t{j} = np.empty({BLOCK}, {dname(dt)})" for j, dt in enumerate(exact_slots)]
        lines += [f"        f{j} = np.empty({BLOCK}, {dname(dt)})" for j, dt in enumerate(fast_slots)]
        lines += ["        p = np.empty(4, np.int64)", "        d = np.empty(1, np.int64)",
                  "        q = np.empty(4, np.int64)",
                  "        for b in range(c * per, min(blocks, (c + 1) * per)):",
                  f"            lo = b * {BLOCK}", f"            m = min({BLOCK}, n - lo)"]
        lines += fast + exact
        for k, v in full_outs:  # an output that is an input, a constant, or another output's value
            src = arg[v] if v < nb else f"o{out_of[v]}"
            lines.append(f"{ind}o{k}[lo:lo + m] = {src}[lo:lo + m]")
    lines.append("    return 0")
    return "\n".join(lines), names


# ---------------------------------------------------------------- compiling
_KERNELS: dict[Any, Any] = {}


def _kernel(program: tuple[Any, ...], fast_math: bool) -> Any:
    key = (program, fast_math)
    with _LOCK:
        fn = _KERNELS.get(key)
        if fn is None:
            import numba

            src, names = _source(program, fast_math)
            ns: dict[str, Any] = {"np": np, "numba": numba, **names}
            exec(src, ns)  # source built from the templates above and the graph's kinds and dtypes only
            # No LLVM fastmath flags even with fast_math: reassociation breaks the approximations (they round to
            # integers by adding and subtracting 1.5 * 2**23), assuming no NaNs breaks their range checks, and
            # contraction would move them off their measured APPROX_ULP; the inline arithmetic gains nothing.
            fn = _KERNELS[key] = numba.njit(parallel=True, nogil=True, error_model="numpy")(ns["_k"])
        return fn


def compile_elementwise(graph: Graph, *, threads: int | None = None,
                        fast_math: bool = False) -> Callable[[list[np.ndarray]], list[np.ndarray]] | None:
    """``graph`` as one parallel numba loop, ``fn(args) -> outputs`` (inputs in ``graph.inputs`` order, outputs
    in ``graph.outputs`` order, of the declared dtypes and shapes), or None when the graph is not an elementwise
    region (:func:`elementwise_region` says why) or numba is missing.

    Results equal NumPy's to the bit (NaNs: NaN, whatever the payload); ``fast_math=True``: float32 exp, log,
    sin, cos and tanh within :data:`APPROX_ULP` of NumPy's per step, the rest exact. ``threads``: numba threads
    per call (default: numba's count). NumPy's floating-point warnings (log of 0, ...) are not raised.
    The first call of a new program compiles it (seconds); later graphs with the same program reuse it.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x"); y = b.input(("float64", ()), name="y")
    >>> b.output(b.op("where", b.op("less", x, y), b.op("exp", x), b.op("multiply", x, y)))
    >>> fn = compile_elementwise(b.freeze(), threads=1)
    >>> fn([np.array([0.0, 1.0, 2.0]), np.array(1.5)])[0]
    array([1.        , 2.71828183, 3.        ])
    """
    try:
        program, arrays, shape, out_shapes = _program(graph)
    except _NotRegion:
        return None
    try:
        import numba
    except Exception:
        return None
    if numba.config.DISABLE_JIT:
        return None
    kernel = _kernel(program, fast_math)
    n = prod(shape)
    in_types = [graph.type_of(int(v)) for v in graph.inputs]
    in_names = [graph.name_of(int(v)) or graph.value_label(int(v)) for v in graph.inputs]
    out_dts = [np.dtype(d) for d, _ in program[4]]

    def fn(args: list[np.ndarray]) -> list[np.ndarray]:
        if len(args) != len(in_types):
            raise ArgumentError(f"the region takes {len(in_types)} inputs, got {len(args)}")
        flat = []
        for a, t, name in zip(args, in_types, in_names, strict=True):
            a = np.asarray(a)
            if a.dtype != t.dtype or a.shape != t.shape:  # type: ignore[union-attr]
                raise ArgumentError(f"input {name} must be {t}, got {a.dtype}{list(a.shape)}")
            flat.append(np.ascontiguousarray(a).reshape(-1))
        outs = [np.empty(s, d) for s, d in zip(out_shapes, out_dts, strict=True)]
        old = numba.get_num_threads()
        nt = old if threads is None else max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS))
        if nt != old:
            numba.set_num_threads(nt)
        try:
            chunks = max(1, min(-(-n // BLOCK), nt * _CHUNKS_PER_THREAD))
            kernel(n, chunks, *flat, *arrays, *[o.reshape(-1) for o in outs])
        finally:
            if nt != old:
                numba.set_num_threads(old)
        return outs

    return fn


# ---------------------------------------------------------------- the engine's rules for the fused family
def _register_rules() -> None:
    """``fma`` on the register machine (one FMA instruction: ``a * b + c``, rounded twice as NumPy's reference
    does); ``fused_elementwise`` only as steps of a parallel loop (:func:`compile_elementwise` expands it)."""
    from opgraph.backends.base import BackendError
    from opgraph.backends.numba import BACKEND
    from opgraph.backends.numba.elementwise import emit_elementwise
    from opgraph.backends.numba.machine import OP

    @BACKEND.rule("fma")
    def emit_fma(asm: Any, ops: np.ndarray) -> None:
        emit_elementwise(asm, ops, OP["FMA"], 3)

    @BACKEND.rule("fused_elementwise")
    def emit_fused_elementwise(asm: Any, ops: np.ndarray) -> None:
        raise BackendError("fused_elementwise runs on numba only in a parallel loop over large arrays")


_register_rules()
