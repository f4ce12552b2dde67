"""``backend="auto"``: rank the installed engines from the graph, time the ones that can win, keep the fastest.

How it decides, in three steps:

1. **Numerics.** An engine whose results differ from NumPy's on an op of the graph (its declared
   :attr:`~opgraph.backends.base.Backend.numerics`: jax on CPU flushes subnormals to zero) is left out, with the
   reason, so ``auto`` never switches a graph silently to an engine that changes its results;
   ``allow_numerics`` names the differences to accept (``("ftz",)``, or True for all).
2. **Pre-ranking from the graph alone** (:func:`rank`, no compile, no run; O(ops), vectorised over the columnar
   graph, one ``why_not`` per distinct op signature: 45 ms for four engines on 10^4 scalar ops, 0.5 s on 10^5).
   For each engine it estimates, from the measured constants in :data:`COSTS`:

   * the ops it runs and the ops it lacks (these run on numpy; the values crossing between the two are
     transfers, and every transfer may start a region, so ``regions <= transfers + 1``),
   * its compile seconds: ``compile_fixed`` per region of its own plus ``compile_per_op * n +
     compile_per_op2 * n**2`` (XLA's compile time grows faster than the op count),
   * its overhead per call: ``call_fixed`` per region plus ``call_per_op * n`` (plus numpy's per-op cost for the
     ops it lacks and :data:`TRANSFER_SECONDS` per transfer),
   * the work per call, the same for every engine: ``FLOP_SECONDS`` per flop of the contractions (``matmul``: 2 *
     out elements * K; ``einsum``, ``tensordot``, ``conv``: 2 * sqrt(in0 * in1 * out elements)) and
     ``ELEMENT_SECONDS`` per element read or written by every other op, from the static types.

   An engine is **left out** when its estimated compile alone exceeds the whole ``budget`` (it could not finish
   its timing inside it: XLA on 10^4 scalar ops), or when even its optimistic call time ((overhead + work) /
   ``MARGIN``) exceeds the pessimistic one ((overhead + work) * ``MARGIN``) of the timed engine of least overhead:
   a per-op-overhead contest it cannot win (torch's eager dispatch on thousands of scalar ops). Big dense work
   makes the overheads negligible, so jax, torch and onnxruntime stay in. numpy (the reference, cheap to
   compile) is always timed;
   the call-time comparison is skipped where the work is unknown (dynamic shapes) or the device is not the CPU
   the constants were measured on. Engines named in ``candidates=`` are all timed (no pre-ranking): naming them
   is asking for their timings. An engine without constants (a user's own) is timed.
3. **Lazy compiles within the first-call budget.** The remaining engines compile in the pre-ranking's order
   (:func:`_rank_key`), each followed by its first call (JIT compilation happens there) and up to three warm-up
   calls (:data:`WARMUP_SECONDS`). ``budget`` (:data:`BUDGET`, 2 s) starts once the first engine has warmed up;
   then an engine is skipped, uncompiled, when the budget is spent, when its estimated compile (scaled by the
   first compile's measured / estimated seconds where that is above 1) exceeds what is left, or when its estimated
   overhead / ``MARGIN`` exceeds the fastest warm-up call measured; a compiled engine whose warm-up calls took
   more than ``MARGIN`` times the fastest one's is not timed.
4. **Timing.** Up to :data:`ROUNDS` rounds over the candidates, each a block of consecutive calls (at most
   :data:`BLOCK_CALLS`, sized to fill the budget left) through the program's own call with the same feeds and
   targets, the user's call; the order rotates from round to round, so a change of load on a shared machine falls
   on all of them; timing stops when the budget is spent (after one round at least). An engine's time is the median
   of its blocks' medians (the warm-up calls after the first count as one block); the smallest wins. Engines that
   fail to compile or run are left out, with the error's first line in :meth:`Choice.report` and
   :meth:`Choice.decision`, never silently.
5. **The on-disk cache** (:mod:`opgraph.runtime.choice_cache`): the decision is kept in a file keyed by the graph's
   content hash, the feeds' signature, the candidates, the engines' versions and the machine; the next
   :func:`choose` with the same key (another process, say) compiles only the chosen engine and times nothing.

:class:`Choice` records, per engine, "timed" (its median, its compile seconds) or "left out: <reason>" with the
estimates; ``explain()`` prints it. Without example inputs the choice is made on the first call's feeds.

**How the constants were measured** (``python bench/auto_costs.py``; 1 thread, a 2-core x86 machine shared with
other work, engines imported and warmed before timing; the engine's import is not counted): a chain of ``n``
scalar float64 ops (``sin``, ``multiply``, ``add``, ``tanh`` in turn) for n = 100, 1000, 4000, 10000 (jax: 100,
300, 1000, 3000, 6000) gives compile (``compile()`` + first call) and the median call; two 256x256 and
1024x1024 float32 ``matmul`` + ``relu`` layers give the work rate. Measured (compile s / call ms):

=========== ========================== =========================== ===========================
engine      100 ops                    1000 ops                    10000 ops
=========== ========================== =========================== ===========================
numpy       0.025 / 0.21               0.061 / 1.85                0.44 / 18.0
torch       0.028 / 0.46               0.18 / 3.66                 1.88 / 36.5
onnxruntime 0.021 / 0.18               0.16 / 0.79                 1.73 / 7.4
jax         0.16 / 0.50                1.33 / 0.52                 (3000: 6.5 / 0.66; 6000: 35.6 / 0.85)
numba       0.004 / 0.03               0.006 / 0.05                0.02 / 0.25
=========== ========================== =========================== ===========================

numba's register machine (``bench/auto_costs.py`` does not time it yet: these are from
``python bench/run.py finegrained`` on the same machine) compiles in about 1.5 us per op once its interpreter is
loaded (a one-off 0.5 s per process), so ``auto`` leaves numpy out of graphs of many small ops that numba runs whole.

The 1024x1024 layers ran in 0.13 s (numpy), 0.18 s (torch), 0.20 s (onnxruntime), 0.31 s (jax): 4.3e9 flops,
about 3e-11 s per flop on every engine within a factor 2.5.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (4,)), name="x")
    >>> b.output(b.op("exp", x))
    >>> choice = choose(b.freeze(), {"x": np.zeros(4)}, candidates=("numpy",))
    >>> choice.backend, choice.compiled({"x": np.zeros(4)})[0]
    ('numpy', array([1., 1., 1., 1.]))
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgraph import backends
from opgraph.backends.base import BackendError, OpInfo
from opgraph.core.feeds import resolve_call, target_ids, value_id
from opgraph.core.graph import Graph
from opgraph.core.registry import CONST, get_op
from opgraph.core.types import TensorType


@dataclass(frozen=True)
class EngineCost:
    """Measured constants of one engine's cost model (seconds; see the module doc for how they were measured)."""

    compile_fixed: float
    compile_per_op: float
    compile_per_op2: float
    call_fixed: float
    call_per_op: float

    def compile_seconds(self, ops: int, regions: int = 1) -> float:
        """Estimated compile seconds of ``ops`` ops in ``regions`` regions.

        >>> round(COSTS["jax"].compile_seconds(1000), 2)
        1.45
        """
        return self.compile_fixed * regions + self.compile_per_op * ops + self.compile_per_op2 * ops * ops

    def call_seconds(self, ops: int, regions: int = 1) -> float:
        """Estimated overhead of one call (the work aside) over ``ops`` ops in ``regions`` regions.

        >>> round(COSTS["numpy"].call_seconds(1000) * 1e3, 2)
        1.82
        """
        return self.call_fixed * regions + self.call_per_op * ops


COSTS: dict[str, EngineCost] = {
    "numpy": EngineCost(0.02, 4e-5, 0.0, 2e-5, 1.8e-6),
    "torch": EngineCost(0.01, 1.8e-4, 0.0, 1e-4, 3.6e-6),
    "onnxruntime": EngineCost(0.01, 1.7e-4, 0.0, 1e-4, 7e-7),
    "jax": EngineCost(0.05, 8e-4, 6e-7, 5e-4, 6e-8),
    "numba": EngineCost(0.01, 1.5e-6, 0.0, 3e-5, 2.5e-8),
}
"""Per engine, the constants of :func:`rank`'s cost model (the module doc gives the measurements)."""

MARGIN = 2.0
"""How far an estimated call time may be off either way: an engine is left out only when its estimate divided by
this still loses to another's estimate multiplied by it (a factor ``MARGIN**2`` apart)."""
TRANSFER_SECONDS = 2e-5
"""Estimated cost of one value moved between engines in a call (a conversion and a call boundary)."""
FLOP_SECONDS = 3e-11
"""Seconds per flop of a contraction (about 33 GFLOP/s on one thread: the 1024x1024 matmul measurement)."""
ELEMENT_SECONDS = 1e-9
"""Seconds per element read or written by any other op."""
_CONTRACTIONS = frozenset({"einsum", "tensordot", "conv", "conv2d", "conv_transpose", "vecdot"})
_MATMULS = frozenset({"matmul", "matmul_t"})


@dataclass
class Estimate:
    """:func:`rank`'s view of one engine on a graph: what it would run, its estimated costs and its verdict
    (``None``: timed; else why it is left out)."""

    engine: str
    ops: int
    numpy_ops: int = 0
    transfers: int = 0
    regions: int = 1
    compile_seconds: float | None = None
    overhead_seconds: float | None = None
    verdict: str | None = None

    def describe(self) -> str:
        """The estimates in words.

        >>> Estimate("numpy", 3, compile_seconds=0.02, overhead_seconds=3e-5).describe()
        'estimated: compile 0.02 s, overhead 0.030 ms per call, 3 op(s)'
        """
        if self.compile_seconds is None or self.overhead_seconds is None:
            return f"no cost model for {self.engine}"
        lacks = (f", {self.numpy_ops} op(s) on numpy, {self.transfers} transfer(s), <= {self.regions} region(s)"
                 if self.numpy_ops else "")
        return (f"estimated: compile {self.compile_seconds:.2g} s, overhead {self.overhead_seconds * 1e3:.3f} ms "
                f"per call, {self.ops} op(s){lacks}")


@dataclass
class Profile:
    """What :func:`rank` reads from a graph once: the ops that are not constants, and the work per call in
    seconds (``None`` when a shape is dynamic)."""

    real: np.ndarray
    work_seconds: float | None


def profile(graph: Graph) -> Profile:
    """The graph's ops (constants aside) and its work per call, from the static types (vectorised).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float32", (100, 100)))
    >>> b.output(b.op("matmul", x, x))
    >>> p = profile(b.freeze()); int(p.real.sum()), round(p.work_seconds * 1e6, 1)
    (1, 60.0)
    """
    n = graph.num_ops
    real = graph.op_kind != CONST.id
    numel = np.array([math.prod(t.shape) if isinstance(t, TensorType) and t.is_static else -1
                      for t in graph.types] or [0], dtype=np.float64)
    vel = numel[graph.value_type] if graph.num_values else np.zeros(0)
    in_op = np.repeat(np.arange(n), np.diff(graph.in_ptr))
    out_op = np.repeat(np.arange(n), np.diff(graph.out_ptr))
    in_el, out_el = vel[graph.in_ids], vel[graph.out_ids]
    if ((in_el < 0) & real[in_op]).any() or ((out_el < 0) & real[out_op]).any():
        return Profile(real, None)
    elements = np.bincount(in_op, in_el, minlength=n) + np.bincount(out_op, out_el, minlength=n)
    flops = np.zeros(n)
    names = {int(k): get_op(int(k)).name for k in np.unique(graph.op_kind).tolist()}
    for k, name in names.items():
        if name not in _MATMULS and name not in _CONTRACTIONS:
            continue
        ops = np.flatnonzero(graph.op_kind == k)
        first = graph.in_ptr[ops]
        a, b = graph.in_ids[first], graph.in_ids[np.minimum(first + 1, graph.in_ptr[ops + 1] - 1)]
        out = vel[graph.out_ids[graph.out_ptr[ops]]]
        if name in _MATMULS:
            inner = np.array([(graph.type_of(int(v)).shape or (1,))[-1] for v in a.tolist()], dtype=np.float64)
            flops[ops] = 2.0 * out * inner
        else:
            flops[ops] = 2.0 * np.sqrt(vel[a] * vel[b] * np.maximum(out, 1.0))
        elements[ops] = 0.0
    work = float(flops[real].sum() * FLOP_SECONDS + elements[real].sum() * ELEMENT_SECONDS)
    return Profile(real, work)


def _distinct_rows(cols: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The first row of each distinct row of the table ``cols`` (columns of ints), and each row's distinct index:
    the columns packed into one int64 key where their ranges allow (a 1-D unique is a plain sort), else
    ``np.unique(axis=0)``.

    >>> first, inverse = _distinct_rows([np.array([3, 1, 3]), np.array([-1, 2, -1])])
    >>> first.tolist(), inverse.tolist()
    ([1, 0], [1, 0, 1])
    """
    if not len(cols) or not len(cols[0]):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    lows = [int(c.min()) for c in cols]
    sizes = [int(c.max()) - lo + 1 for c, lo in zip(cols, lows, strict=True)]
    if math.prod(sizes) < 1 << 62:
        key = np.zeros(len(cols[0]), dtype=np.int64)
        for c, lo, size in zip(cols, lows, sizes, strict=True):
            key = key * size + (c.astype(np.int64) - lo)
        _keys, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    else:
        _rows, first, inverse = np.unique(np.stack(cols, axis=1), axis=0, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def _runs(graph: Graph, name: str) -> np.ndarray:
    """Per op: True where engine ``name`` runs it (directly, or after lowering: a kind with a lowering rule is
    taken as lowered); constants count as run. One ``why_not`` per distinct (kind, attributes, types) signature."""
    from opgraph.passes.lower import LOWER

    n = graph.num_ops
    if name == "numpy":
        return np.ones(n, dtype=bool)
    be = backends.get(name)
    ok = np.ones(n, dtype=bool)
    kinds = np.unique(graph.op_kind).tolist()
    ruled = {k for k in kinds if k == CONST.id or get_op(k).name in be.rules}
    lowers = {k for k in kinds if k in LOWER.by_kind}
    ok[~np.isin(graph.op_kind, list(ruled | lowers))] = False
    check = np.flatnonzero(np.isin(graph.op_kind, list(ruled - lowers - {CONST.id})))
    if not len(check):
        return ok
    # a signature row: kind, attributes, arities and the first 4 input / 2 output types (more: checked one by one)
    a_in, a_out = np.diff(graph.in_ptr)[check], np.diff(graph.out_ptr)[check]
    cols = [graph.op_kind[check], graph.op_attr[check], a_in, a_out]
    for ptr, ids, arity, width in ((graph.in_ptr, graph.in_ids, a_in, 4), (graph.out_ptr, graph.out_ids, a_out, 2)):
        for j in range(width):
            at = np.minimum(ptr[check] + j, len(ids) - 1) if len(ids) else np.zeros(len(check), dtype=np.int64)
            cols.append(np.where(arity > j, graph.value_type[ids[at]] if len(ids) else -1, -1))
    wide = (a_in > 4) | (a_out > 2)
    first, inverse = _distinct_rows([c[~wide] for c in cols])
    narrow = check[~wide]
    verdict = np.array([be.why_not(OpInfo.of(graph, int(narrow[i]))) is None for i in first.tolist()], dtype=bool)
    ok[narrow] = verdict[inverse] if len(first) else True
    for op in check[wide].tolist():
        ok[op] = be.why_not(OpInfo.of(graph, op)) is None
    return ok


def estimate(graph: Graph, name: str, prof: Profile | None = None) -> Estimate:
    """Engine ``name``'s estimated compile seconds and call overhead on ``graph`` (see the module doc).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", ()))
    >>> b.output(b.op("exp", x))
    >>> estimate(b.freeze(), "numpy").ops
    1
    """
    prof = prof or profile(graph)
    cost = COSTS.get(name)
    ok = _runs(graph, name) if cost is not None or name in backends.available() else np.ones(graph.num_ops, bool)
    engine_ops = int((ok & prof.real).sum())
    numpy_ops = int((~ok & prof.real).sum())
    transfers, regions = 0, 1
    if numpy_ops:
        # values produced on one side and read on the other (constants and inputs go wherever they are read)
        in_op = np.repeat(np.arange(graph.num_ops), np.diff(graph.in_ptr))
        prod = graph.value_producer[graph.in_ids]
        real_prod = (prod >= 0) & (graph.op_kind[np.maximum(prod, 0)] != CONST.id)
        cross = real_prod & (ok[np.maximum(prod, 0)] != ok[in_op])
        transfers = len(np.unique(graph.in_ids[cross]))
        regions = transfers + 1
    if cost is None:
        return Estimate(name, engine_ops, numpy_ops, transfers, regions)
    own_regions = (regions + 1) // 2 if numpy_ops else 1
    numpy = COSTS["numpy"]
    compile_s = cost.compile_seconds(engine_ops, own_regions) + (numpy.compile_per_op * numpy_ops if numpy_ops else 0)
    if engine_ops and name in backends.available():  # a one-off cost not yet paid (numba's interpreter)
        compile_s += backends.get(name).first_compile_seconds()
    overhead = (cost.call_seconds(engine_ops, own_regions)
                + (numpy.call_seconds(numpy_ops, regions - own_regions) if numpy_ops else 0.0)
                + TRANSFER_SECONDS * transfers)
    return Estimate(name, engine_ops, numpy_ops, transfers, regions, compile_s, overhead)


def rank(graph: Graph, names: Sequence[str], *, budget: float = 20.0, device: str | None = None) -> dict[str, Estimate]:
    """The pre-ranking rule (the module doc): each engine's :class:`Estimate`, ``verdict`` None for the engines to
    time and the reason for the others. Deterministic given the graph, the names, the budget and the device.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", ()), name="x"); y = x
    >>> for _ in range(200):
    ...     y = b.op("sin", y)
    >>> b.output(y)
    >>> r = rank(b.freeze(), ["numpy", "jax"], budget=0.1)
    >>> r["numpy"].verdict is None, r["jax"].verdict
    (True, 'compile estimated at 0.23 s for 200 op(s), more than the whole budget (0.1 s)')
    """
    prof = profile(graph)
    out: dict[str, Estimate] = {}
    for n in names:
        try:
            out[n] = estimate(graph, n, prof)
        except Exception:  # not installed, or unknown: its compile reports why, as a failure
            out[n] = Estimate(n, int(prof.real.sum()))
    for e in out.values():
        if e.engine != "numpy" and e.compile_seconds is not None and e.compile_seconds > budget:
            e.verdict = (f"compile estimated at {e.compile_seconds:.2g} s for {e.ops} op(s), more than the whole "
                         f"budget ({budget:g} s)")
    cpu = device is None or device.split(":")[0] == "cpu"
    if not cpu or prof.work_seconds is None:
        return out
    work = prof.work_seconds
    timed = [e for e in out.values() if e.verdict is None and e.overhead_seconds is not None]
    if not timed:
        return out
    best = min(timed, key=lambda e: e.overhead_seconds)  # type: ignore[arg-type,return-value]
    upper = (best.overhead_seconds + work) * MARGIN  # type: ignore[operator]
    for e in timed:
        # numpy, the reference, is timed unless an engine that runs the whole graph, compiles faster and calls
        # cheaper beats it by far (the register machine on 10^5 scalar ops, where numpy's compile takes seconds)
        if e is best or (e.engine == "numpy" and (best.numpy_ops or best.compile_seconds is None
                                                   or e.compile_seconds is None
                                                   or best.compile_seconds >= e.compile_seconds)):
            continue
        lower = (e.overhead_seconds + work) / MARGIN  # type: ignore[operator]
        if lower > upper:
            e.verdict = (f"cannot win: at least {lower * 1e3:.3g} ms per call ({e.ops} op(s) at "
                         f"{COSTS[e.engine].call_per_op * 1e6:.2g} us/op"
                         + (f", {e.numpy_ops} on numpy, {e.transfers} transfer(s)" if e.numpy_ops else "")
                         + f"), {best.engine} at most {upper * 1e3:.3g} ms")
    return out


@dataclass
class Choice:
    """What ``auto`` chose: the backend, its compiled graph, the median seconds per call of each timed candidate
    (the median of its blocks' medians; ``None`` where it failed), why each failure happened (the error's first
    line), each candidate's fastest call, the engines left out (``excluded``: their results differ from NumPy's;
    ``left_out``: the pre-ranking says they cannot win; ``skipped``: not timed because the budget ran out or the
    measurements so far say they cannot win), the pre-ranking's estimates and order, each timed engine's compile
    seconds (compile and warm-up calls) and the total; ``cached``: the cache file the choice was read from (then
    nothing was timed in this process: the other fields are the original decision's)."""

    backend: str
    compiled: Any
    timings: dict[str, float | None] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    fastest: dict[str, float] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)
    """Engines not timed because their results differ from NumPy's on this graph, and how."""
    left_out: dict[str, str] = field(default_factory=dict)
    """Engines not timed because the pre-ranking (:func:`rank`) says they cannot win, and why."""
    estimates: dict[str, Estimate] = field(default_factory=dict)
    compile_seconds: dict[str, float] = field(default_factory=dict)
    """Per engine compiled: seconds of its compile and warm-up calls."""
    seconds: float = 0.0
    """Seconds the whole choice took: ranking, every candidate's compile and the timing runs."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Engines ranked but not timed: the budget ran out, or the timings so far say they cannot win."""
    order: list[str] = field(default_factory=list)
    """The candidates in the order the pre-ranking put them (best estimate first); compiled lazily in this order."""
    calls: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per timed engine: (blocks, calls per block) of its timing."""
    budget: float = 0.0
    cached: str | None = None
    """The cache file this choice was read from (None: made in this process)."""

    def status(self) -> dict[str, str]:
        """Per engine considered: ``"timed"``, ``"failed: <reason>"``, ``"skipped: <reason>"`` or
        ``"left out: <reason>"``.

        >>> Choice("numpy", None, {"numpy": 1e-5}, left_out={"jax": "why"}).status()
        {'numpy': 'timed', 'jax': 'left out: why'}
        """
        out = {n: "timed" if t is not None else f"failed: {self.failures[n]}" for n, t in self.timings.items()}
        out.update({n: f"failed: {why}" for n, why in self.failures.items() if n not in out})
        out.update({n: f"skipped: {why}" for n, why in self.skipped.items()})
        out.update({n: f"left out: {why}" for n, why in {**self.excluded, **self.left_out}.items()})
        return out

    def report(self) -> str:
        """One line: the choice and every candidate's median time (or why it failed, was skipped or left out)."""
        parts = []
        for name, t in sorted(self.timings.items(), key=lambda kv: (kv[1] is None, kv[1] or 0.0)):
            if t is not None:
                parts.append(f"{name} {t * 1e3:.3f} ms")
        parts += [f"{name} failed ({why})" for name, why in self.failures.items()]
        parts += [f"{name} skipped ({why})" for name, why in self.skipped.items()]
        parts += [f"{name} left out ({why})" for name, why in {**self.excluded, **self.left_out}.items()]
        src = f" (read from the cache {self.cached}: nothing timed in this process)" if self.cached else ""
        return f"auto chose {self.backend}{src}: " + ", ".join(parts)

    def decision(self) -> str:
        """Several lines: per engine in the pre-ranking's order, timed (median of the blocks' medians, the blocks,
        compile seconds), failed (the error), skipped or left out (why), with the estimates.

        >>> print(Choice("numpy", None, {"numpy": 1e-5}, compile_seconds={"numpy": 0.01}, seconds=0.2).decision())
        how auto decided (0.2 s in all: ranking, compiles, timing runs):
          numpy: timed: median 0.010 ms, compile 0.01 s
        """
        budget = f"; budget {self.budget:g} s after the first compile" if self.budget else ""
        lines = [f"how auto decided ({self.seconds:.2g} s in all: ranking, compiles, timing runs{budget}):"]
        if self.cached:
            lines.append(f"  read from the cache {self.cached} (OPGRAPH_AUTO_CACHE=0 or cache=False chooses afresh)")
        status = self.status()
        ranked = [n for n in self.order if n in status] + [n for n in status if n not in self.order]
        for name in ranked:
            st = status[name]
            if st == "timed":
                blocks = self.calls.get(name)
                how = f" ({blocks[0]} block(s) of {blocks[1]} call(s) after the warm-up calls)" if blocks else ""
                st = (f"timed: median {self.timings[name] * 1e3:.3f} ms{how}, "  # type: ignore[operator]
                      f"compile {self.compile_seconds.get(name, 0.0):.2g} s")
            est = self.estimates.get(name)
            notes = ([f"ranked {self.order.index(name) + 1}"] if name in self.order else []) + (
                [est.describe()] if est is not None else [])
            lines.append(f"  {name}: {st}" + (f" ({'; '.join(notes)})" if notes else ""))
        return "\n".join(lines)

    def record(self) -> dict[str, Any]:
        """The decision as JSON-able data (what the on-disk cache keeps; the compiled program aside).

        >>> Choice("numpy", None, {"numpy": 1e-5}).record()["timings"]
        {'numpy': 1e-05}
        """
        return {"backend": self.backend, "timings": self.timings, "failures": self.failures,
                "fastest": self.fastest, "excluded": self.excluded, "left_out": self.left_out,
                "skipped": self.skipped, "order": self.order, "compile_seconds": self.compile_seconds,
                "seconds": self.seconds, "budget": self.budget, "calls": {k: list(v) for k, v in self.calls.items()},
                "estimates": {k: {f: getattr(e, f) for f in ("engine", "ops", "numpy_ops", "transfers", "regions",
                                                             "compile_seconds", "overhead_seconds", "verdict")}
                              for k, e in self.estimates.items()}}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], compiled: Any, cached: str) -> Choice:
        """The decision :meth:`record` kept, with this process's ``compiled`` program.

        >>> Choice.from_record(Choice("numpy", None, {"numpy": 1e-5}).record(), None, "f.json").report()
        'auto chose numpy (read from the cache f.json: nothing timed in this process): numpy 0.010 ms'
        """
        return cls(rec["backend"], compiled, dict(rec.get("timings", {})), dict(rec.get("failures", {})),
                   dict(rec.get("fastest", {})), dict(rec.get("excluded", {})), dict(rec.get("left_out", {})),
                   {k: Estimate(**e) for k, e in rec.get("estimates", {}).items()},
                   dict(rec.get("compile_seconds", {})), float(rec.get("seconds", 0.0)),
                   dict(rec.get("skipped", {})), list(rec.get("order", [])),
                   {k: (int(v[0]), int(v[1])) for k, v in rec.get("calls", {}).items()},
                   float(rec.get("budget", 0.0)), cached)


NOT_TIMED = frozenset({"dask", "c"})
"""Installed backends ``auto`` does not time unless named in ``candidates`` (dask: for data beyond memory; c: a
C compiler's run per graph, where the numba engine runs the same program without one)."""


def _numpy_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options the NumPy candidate takes: only compile()'s own keywords (backend options are not its)."""
    return {k: options[k] for k in ("memory_limit", "result", "donate") if k in options}


def numerics_exclusions(graph: Graph, names: Sequence[str], device: str | None = None,
                        allow_numerics: Sequence[str] | bool = ()) -> dict[str, str]:
    """Engine -> why ``auto`` leaves it out: its declared differences from NumPy that concern an op of ``graph``
    (on ``device``) and are not in ``allow_numerics`` (True: allow all).

    >>> import opgraph
    >>> from opgraph.backends.base import Backend, NumericsDifference, near_subnormal
    >>> ftz = NumericsDifference("ftz", "subnormal operands", "read as zero", near_subnormal)
    >>> _ = backends.register(Backend("doc_ftz", rules={"log": np.log}, numerics=(ftz,)))
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (4,)), name="x"); b.output(b.op("log", x))
    >>> print(numerics_exclusions(b.freeze(), ["numpy", "doc_ftz"])["doc_ftz"])
    1 op(s) (log) would change: ftz (cpu): subnormal operands: read as zero; allow_numerics=('ftz',) times it
    >>> numerics_exclusions(b.freeze(), ["numpy", "doc_ftz"], allow_numerics=("ftz",))
    {}
    >>> backends.unregister("doc_ftz")
    """
    if allow_numerics is True:
        return {}
    allowed = set() if allow_numerics is False else set(allow_numerics)
    out: dict[str, str] = {}
    for name in names:
        if name == "numpy":
            continue
        try:
            be = backends.get(name)
        except Exception:  # not installed: compiling it below reports that
            continue
        if not be.numerics:
            continue
        dev = device if device is not None else be.devices[0]
        found = {tag: ops for tag, ops in be.differs_from_numpy(graph, dev).items() if tag not in allowed}
        if found:
            notes = {d.tag: d for d in be.numerics}
            ops = sorted({op for o in found.values() for op in o})
            kinds = sorted({graph.kind_of(op) for op in ops})
            out[name] = (f"{len(ops)} op(s) ({', '.join(kinds[:6])}{', ...' if len(kinds) > 6 else ''}) would change: "
                         + "; ".join(notes[t].note() for t in found)
                         + f"; allow_numerics={tuple(found)!r} times it")
    return out


BUDGET = 2.0
"""The default first-call budget: seconds ``auto`` may spend after the first candidate's compile and warm-up (the
candidate the pre-ranking puts first, or the next where it fails) on compiling and timing the others; when they
run out it stops and takes the best so far (``budget=`` of ``opgraph.compile``, ``Graph.run``'s auto and the
command line's ``--budget``). 2 s keeps a real model's first call near 5 s (load, optimise, the first engine's
compile, 2 s) and the choice is cached on disk for later processes; ``budget=10`` times more engines for longer."""
WARMUP_SECONDS = 0.2
"""After a candidate's first call (where JIT compilation happens), more untimed warm-up calls while this many
seconds last (at least one, at most three): their fastest is its first measured time, used to skip candidates."""
BLOCK_CALLS = 20
"""At most this many timed calls per block."""
ROUNDS = 7
"""Rounds of blocks the timing aims at (at least 3 while the budget lasts, always at least 1)."""


def _rank_key(e: Estimate | None) -> tuple[float, float]:
    """Best first: the smallest estimated overhead (the work is the same on every engine), then compile; an engine
    without a cost model (a user's own) first, since it may be the best."""
    if e is None or e.overhead_seconds is None or e.compile_seconds is None:
        return (0.0, 0.0)
    return (e.overhead_seconds, e.compile_seconds)


def choose(graph: Graph, feeds: Mapping[Any, Any], *, budget: float = BUDGET, repeats: int = 5,
           candidates: Sequence[str] | None = None, device: str | None = None,
           allow_numerics: Sequence[str] | bool = (), targets: Sequence[Any] | None = None,
           cache: Any = None, **options: Any) -> Choice:
    """Rank the installed backends (or time every one of ``candidates``), compile the ones that can win lazily in
    the ranking's order and time them on ``feeds`` (computing ``targets``, default the outputs) within ``budget``
    seconds after the first compile, keep the fastest; engines whose results differ from NumPy's on this graph are
    left out unless ``allow_numerics`` allows it (see the module doc). ``cache`` (default on; False, or
    ``OPGRAPH_AUTO_CACHE=0``, turns it off; a path puts it there): read the choice from, and write it to, the
    on-disk cache (:mod:`opgraph.runtime.choice_cache`), so a second process compiles only the chosen engine.
    ``repeats``: at least this many timed calls per block where the budget allows."""
    import warnings

    from opgraph.runtime import choice_cache
    from opgraph.runtime.compiled import compile as compile_on

    started = time.perf_counter()
    # dask is for data larger than one machine's memory: timing it on small example feeds says nothing about
    # that, so "auto" picks among the in-memory engines unless dask is named as a candidate
    names = list(candidates or [n for n in backends.available() if n not in NOT_TIMED])
    call = {} if targets is None else {"targets": targets}

    def build(name: str) -> Any:
        return compile_on(graph, backend=name, device=device if name != "numpy" else None,
                          **(options if name != "numpy" else _numpy_options(options)))

    folder = choice_cache.directory(cache)
    key = None
    if folder is not None:
        key = choice_cache.choice_key(
            graph, feeds, names, targets=None if targets is None else list(targets), device=device,
            allow_numerics=allow_numerics, options=sorted(options.items()), candidates=candidates is not None,
            costs=(sorted(COSTS.items()), MARGIN, TRANSFER_SECONDS, FLOP_SECONDS, ELEMENT_SECONDS))
        rec = choice_cache.read(folder, key)
        path = choice_cache.path_of(folder, key)
        got: Choice | None = None
        if rec is not None:
            try:
                got = Choice.from_record(rec, None, path)
            except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
                warnings.warn(f"auto: ignoring the choice cache file {path} (not a choice record: "
                              f"{type(exc).__name__}: {exc}); choosing again", RuntimeWarning, stacklevel=2)
        if got is not None and got.backend in names:
            try:
                got.compiled = build(got.backend)
            except Exception as exc:  # the engine changed under the same versions (or the file was edited)
                warnings.warn(f"auto: the cached choice {got.backend} ({path}) does not compile now "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                              "choosing again", RuntimeWarning, stacklevel=2)
            else:
                got.seconds = time.perf_counter() - started
                return got

    excluded = numerics_exclusions(graph, names, device, allow_numerics)
    names = [n for n in names if n not in excluded]
    estimates = rank(graph, names, budget=budget, device=device)
    # named candidates are all timed (the estimates still go into the report)
    left_out = {n: e.verdict for n, e in estimates.items() if e.verdict is not None and candidates is None}
    order = sorted((n for n in names if n not in left_out), key=lambda n: _rank_key(estimates.get(n)))
    failures: dict[str, str] = {}
    skipped: dict[str, str] = {}
    compiled: dict[str, Any] = {}
    compile_seconds: dict[str, float] = {}
    warm: dict[str, float] = {}  # per compiled engine: its fastest warm-up call after the first
    warm_block: dict[str, float] = {}  # and their median: the warm-up calls after the first are its first block
    # After the first call the update destinations hold state on each engine: later calls feed the rest only, as
    # steady-state calls do (feeding the state every call would time its transfer, not the engine).
    dests = {int(d) for d in graph.updates[:, 1].tolist()}
    steady = {k: v for k, v in feeds.items() if value_id(graph, k) not in dests}

    def failed(name: str, exc: Exception) -> None:
        failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        compiled.pop(name, None)

    deadline: float | None = None
    scale = 1.0
    for name in order:  # lazily, best estimate first: what cannot win or would overrun the budget is not compiled
        now = time.perf_counter()
        est = estimates.get(name)
        if deadline is not None and candidates is None:
            left = deadline - now
            if left <= 0:
                skipped[name] = f"not compiled: the budget ({budget:g} s after the first compile) ran out"
                continue
            if est is not None and est.compile_seconds is not None and est.compile_seconds * scale > left:
                skipped[name] = (f"not compiled: compile estimated at {est.compile_seconds * scale:.2g} s "
                                 + (f"({est.compile_seconds:.2g} s by the cost model, times {scale:.3g} as the "
                                    "first compile measured against its estimate) " if scale > 1 else "")
                                 + f"and {left:.2g} s of the budget left")
                continue
            if warm and est is not None and est.overhead_seconds is not None:
                best = min(warm, key=warm.__getitem__)
                if est.overhead_seconds / MARGIN > warm[best]:
                    skipped[name] = (f"not compiled: its overhead alone, estimated at {est.overhead_seconds * 1e3:.3g} "
                                     f"ms per call, is more than {MARGIN:g}x {best}'s measured "
                                     f"{warm[best] * 1e3:.3g} ms")
                    continue
        t0 = time.perf_counter()
        try:  # compile and warm up (JIT compilation happens in the first call)
            c = build(name)
            c(dict(feeds), **call)
            t_first = time.perf_counter()
            seen = []
            while not seen or (len(seen) < 3 and time.perf_counter() - t_first < WARMUP_SECONDS):
                t1 = time.perf_counter()
                c(dict(steady), **call)
                seen.append(time.perf_counter() - t1)
            compiled[name], warm[name], warm_block[name] = c, min(seen), float(np.median(seen))
        except Exception as exc:  # a backend that cannot compile or run this graph is left out, with the reason
            failed(name, exc)
        compile_seconds[name] = time.perf_counter() - t0
        if deadline is None and name in compiled:
            deadline = time.perf_counter() + budget
            # the cost model's compile constants come from scalar chains; a real model's weights and kernels take
            # longer: the first compile's measured / estimated ratio scales the others' estimates
            if est is not None and est.compile_seconds:
                scale = max(1.0, (t_first - t0) / est.compile_seconds)  # compile() and the first call
    if not compiled:
        raise BackendError("auto: no backend could run the graph (or was allowed to): " + "; ".join(
            f"{k}: {v}" for k, v in {**failures, **skipped, **excluded, **left_out}.items()))
    best_warm = min(warm.values())
    for name in list(compiled):  # measured at warm-up already far behind: not worth the timing rounds
        if candidates is None and warm[name] > MARGIN * best_warm:
            best = min(warm, key=warm.__getitem__)
            skipped[name] = (f"not timed: its warm-up calls took {warm[name] * 1e3:.3g} ms, more than {MARGIN:g}x "
                             f"{best}'s {best_warm * 1e3:.3g} ms")
            del compiled[name]
    # The timing: rounds over the candidates, each a block of consecutive calls (a steady state: calls of other
    # engines in between slow every engine down through the caches and the allocator), the order rotating from
    # round to round so that a change of load on a shared machine falls on all of them; each engine's time is the
    # median of its blocks' medians, the warm-up calls after the first counting as a block (where the budget allows
    # one round only: a big model). Blocks are sized so that ROUNDS rounds fill what is left of the budget.
    assert deadline is not None
    per_round = sum(warm[n] for n in compiled)
    left = max(deadline - time.perf_counter(), 0.0)
    size = max(1, min(max(BLOCK_CALLS, repeats), int(left / (ROUNDS * per_round)) if per_round > 0 else BLOCK_CALLS))
    blocks: dict[str, list[float]] = {n: [warm_block[n]] for n in compiled}
    fastest: dict[str, float] = dict(warm)
    rounds = 0
    while compiled and rounds < ROUNDS:
        names_now = list(compiled)
        shift = rounds % len(names_now)
        for name in names_now[shift:] + names_now[:shift]:
            try:
                if size > 1 and warm[name] < 0.05:  # the first call after another engine's block re-warms
                    compiled[name](dict(steady), **call)
                ts = []
                for _ in range(size):
                    t1 = time.perf_counter()
                    compiled[name](dict(steady), **call)
                    ts.append(time.perf_counter() - t1)
                blocks[name].append(float(np.median(ts)))
                fastest[name] = min(fastest[name], min(ts))
            except Exception as exc:
                failed(name, exc)
        rounds += 1
        if time.perf_counter() >= deadline:  # the budget is spent: the best so far
            break
    if not compiled:
        raise BackendError("auto: no backend could run the graph (or was allowed to): " + "; ".join(
            f"{k}: {v}" for k, v in {**failures, **skipped, **excluded, **left_out}.items()))
    timings: dict[str, float | None] = {n: float(np.median(blocks[n])) for n in compiled}
    timings.update(dict.fromkeys(failures))
    for c in compiled.values():
        c.reset_state()  # the timing calls must not leave update-edge state behind
    chosen = min(compiled, key=lambda n: timings[n])  # type: ignore[arg-type,return-value]
    choice = Choice(chosen, compiled[chosen], timings, failures, {n: fastest[n] for n in compiled}, excluded,
                    left_out, estimates, compile_seconds, time.perf_counter() - started, skipped, order,
                    {n: (len(blocks[n]) - 1, size) for n in compiled}, budget)
    if folder is not None and key is not None:
        choice_cache.write(folder, key, choice.record())
    return choice


class AutoCompiled:
    """A graph whose backend is chosen by timing on its first call's feeds (``backend="auto"`` without examples).

    Called as a program is: a dict of feeds, keywords, or the graph's inputs in order as positional arrays.
    ``choice`` is None until the first call; after it, calls go to the chosen backend's program (``program``).
    ``compile_seconds`` is the whole choice's seconds (ranking, every candidate's compile, the timing runs; 0.0
    before the first call); ``choice.compile_seconds`` gives them per engine.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (2,)), name="x"); b.output(b.op("exp", x))
    >>> f = AutoCompiled(b.freeze(), budget=0.1, candidates=("numpy",))
    >>> f.program is None, f(np.zeros(2))[0], f.program is f.choice.compiled, f.compile_seconds > 0
    (True, array([1., 1.]), True, True)
    """

    def __init__(self, graph: Graph, *, budget: float = BUDGET, device: str | None = None, **options: Any) -> None:
        self.graph = graph
        self.budget = budget
        self.device = device
        self.options = options
        self.choice: Choice | None = None
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **named: Any) -> list[np.ndarray]:
        """Run; the first call decides the backend (its result comes from the chosen one)."""
        feeds = resolve_call(self.graph, args, named)
        with self._lock:
            if self.choice is None:
                self.choice = choose(self.graph, feeds, budget=self.budget, device=self.device, **self.options)
        return self.choice.compiled(feeds)  # type: ignore[no-any-return]

    run = __call__

    @property
    def program(self) -> Any:
        """The chosen backend's program (None before the first call)."""
        return None if self.choice is None else self.choice.compiled

    @property
    def compile_seconds(self) -> float:
        """Seconds the choice took in all (0.0 before the first call)."""
        return 0.0 if self.choice is None else self.choice.seconds

    def __getattr__(self, name: str) -> Any:
        # state(), context(), plan, ... are the chosen backend's (after the first call)
        choice = self.__dict__.get("choice")
        if choice is None:
            raise AttributeError(f"{name!r}: the backend is chosen on the first call (backend='auto')")
        return getattr(choice.compiled, name)

    def explain(self) -> str:
        """The choice and the timings (after the first call), how auto decided (per engine: timed, with its compile
        seconds, or left out and why), then the chosen backend's own explanation."""
        if self.choice is None:
            return "auto: the backend is chosen on the first call"
        inner = self.choice.compiled.explain() if hasattr(self.choice.compiled, "explain") else ""
        return self.choice.report() + "\n" + self.choice.decision() + ("\n" + inner if inner else "")


def run_auto(graph: Graph, feeds: Mapping[Any, Any], targets: Sequence[Any] | None = None, *,
             budget: float = BUDGET) -> list[np.ndarray]:
    """``graph.run(feeds, targets, backend="auto")``: the first run chooses (timing ``targets`` on ``feeds``) and the
    choice is kept on the (immutable) graph, so later runs go straight to the chosen program (:func:`cached_choice`).
    As on numpy, ``run`` evaluates the targets only: update edges are not applied.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); b.output(b.op("exp", x))
    >>> g = b.freeze()
    >>> run_auto(g, {"x": np.zeros(2)}, budget=0.5), cached_choice(g).backend in backends.available()
    ([array([1., 1.])], True)
    """
    from opgraph.runtime.compiled import with_outputs

    choice: Choice | None = graph._cache.get(_CHOICE)
    if choice is None:
        plain = with_outputs(graph, graph.outputs.tolist(), updates=False)
        tids = None if targets is None else target_ids(graph, targets)
        choice = graph._cache[_CHOICE] = choose(plain, feeds, budget=budget, targets=tids)
    return choice.compiled(feeds, targets=targets)  # type: ignore[no-any-return]


_CHOICE = ("program", "auto")


def cached_choice(graph: Graph) -> Choice | None:
    """The choice a ``backend="auto"`` run made for ``graph`` (None before the first).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", ())); b.output(x)
    >>> cached_choice(b.freeze()) is None
    True
    """
    return graph._cache.get(_CHOICE)  # type: ignore[no-any-return]
