"""``opgraph.compile``: a graph made into a callable on a backend, partitioned where it must be.

``compile(graph, backend=...)`` returns a :class:`Program` on every engine,
with one surface: call it, :meth:`~Program.explain`, :meth:`~Program.state`,
:meth:`~Program.context` (incremental evaluation), :attr:`~Program.memory_plan`
(where the engine plans memory), :attr:`~Program.code` (where it generates
code) and :attr:`~Program.compile_seconds`. The numpy engine is a one-region
engine like the others: a graph it runs whole is one region, the arena
runtime (:class:`~opgraph.backends.numpy.CompiledGraph`, ``program.arena_runtime``)
compiled on the graph itself, which a call reaches directly. Otherwise:

1. **lower**: ops outside the backend's capability set are rewritten into
   ops inside it where a lowering rule knows how (:mod:`opgraph.passes.lower`:
   fused ops into their parts, contractions into transpose + reshape +
   matmul, ...);
2. **partition**: what is still unsupported runs on numpy; the ops are
   grouped into maximal regions per backend (a topological order that stays
   on one backend as long as it can, so no region depends on itself through
   another), and the values crossing between backends are counted;
3. **compile**: each region becomes one callable of its backend (one
   ``jax.jit`` function, one straight-line torch function, one ONNX Runtime
   session, one arena program); regions with inputs of unknown shape are
   compiled per shape signature on first use and cached.

A call takes the inputs' arrays in order (``p(x, w)``), one dict or keywords,
converts the feeds, runs the regions in order and returns the results in the
callers' array kind: NumPy, jax or torch arrays (``result=``, see :func:`compile`).
Feeds of the engine's own kind are taken as they are (torch CUDA tensors stay on
the device on the torch engine); other kinds cross by DLPack or NumPy views.
Update-edge state stays in the backend's arrays (on its device) between calls.
:meth:`Program.explain` says which op runs where and why, and what compiling took.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2, 3)), name="x")
    >>> b.output(b.op("fma", b.op("einsum", x, x, subscripts="ij,kj->ik"), 2.0, 1.0))
    >>> p = Program(b.freeze(), "numpy")
    >>> p(x=np.ones((2, 3)))[0]
    array([[7., 7.],
           [7., 7.]])
    >>> print(p.explain())
    backend numpy (device cpu); 1 region(s), 0 transfer(s) between backends per call
    region 0 on numpy: 2 op(s) (einsum, fma), arena 0 B
    compile: ... ms (numpy ... ms)
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgraph import backends
from opgraph.backends.arrays import check_feed, convert, describe, kind_of, owns_numpy, to_numpy
from opgraph.backends.arrays import copy as copy_array
from opgraph.backends.base import Backend, BackendError, Executable, OpInfo, region_graph
from opgraph.backends.numpy import CompiledGraph, EvalContext, NumpyBackend, aligned_empty
from opgraph.core import progress
from opgraph.core.feeds import coerce_feed, input_id, resolve_call, target_ids, value_id
from opgraph.core.graph import Graph
from opgraph.core.registry import CONST, get_op
from opgraph.core.types import TensorType
from opgraph.errors import ExecutionError
from opgraph.memory.plan import MemoryPlan
from opgraph.passes.dce import dce
from opgraph.passes.lower import lower

__all__ = ["CompiledGraph", "EvalContext", "Program", "ProgramContext", "Region", "aligned_empty", "compile"]

_PLAIN = frozenset({np.ndarray, float, int, bool, complex, list, tuple})
"""Feed types that leave results NumPy under ``result="auto"``: NumPy arrays and Python data."""

RESULTS = ("auto", "numpy", "jax", "torch")
"""What ``result=`` takes: the callers' array kind (``"auto"``) or a kind to return whatever the feeds are."""


@dataclass
class Region:
    """A maximal run of ops on one backend: its ops (in order), the values it reads and the values it gives."""

    backend: str
    ops: list[int]
    inputs: list[int]
    outputs: list[int]
    consts: list[int] = field(default_factory=list)
    static: bool = True
    executables: dict[tuple[Any, ...], Executable] = field(default_factory=dict)
    whole: bool = False
    """The region is the whole graph (an engine claimed it at once): compiled on the graph, not a rebuilt copy."""


def _whole_region(graph: Graph, backend: str) -> list[Region]:
    """One region of every op of ``graph`` (each constant joins it), built from the graph's columns."""
    order = graph.topological_order()
    is_const = graph.op_kind[order] == CONST.id
    read = np.zeros(graph.num_values, dtype=bool)
    read[graph.in_ids] = True
    inputs = [v for v in graph.inputs.tolist() if read[v]]
    produced = graph.value_producer >= 0
    outs = list(dict.fromkeys(v for v in [*graph.outputs.tolist(), *graph.updates[:, 0].tolist()]
                              if produced[v] and graph.op_kind[graph.value_producer[v]] != CONST.id))
    static = all(isinstance(graph.type_of(v), TensorType) and graph.type_of(v).is_static  # type: ignore[union-attr]
                 for v in inputs)
    # the ops as an array, not a list: a list of 10^6 Python ints would cost the program 36 bytes per op
    return [Region(backend, order[~is_const], inputs, outs, order[is_const].tolist(), static,  # type: ignore[arg-type]
                   whole=True)]


def with_outputs(graph: Graph, outputs: Sequence[int], *, updates: bool = True) -> Graph:
    """The same graph with other outputs (the ``get`` gateways), and without its update edges if not ``updates``;
    everything else shared.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", ())); y = b.op("exp", x); b.output(y)
    >>> with_outputs(b.freeze(), [x.id]).outputs.tolist()
    [0]
    """
    changes = {} if updates else {"updates": np.zeros((0, 2), dtype=np.int64)}
    return graph.replace(outputs=np.asarray(outputs, dtype=np.int64), **changes)


def _regions(graph: Graph, place: list[str | None]) -> list[Region]:
    """Group ops into maximal regions per backend along one topological order (Kahn's algorithm that drains
    the ready ops of the current backend before switching), so regions never depend on each other in a cycle."""
    src, dst = graph.op_dependencies()
    n = graph.num_ops
    pairs = np.unique(np.stack([src, dst], axis=1), axis=0) if len(src) else np.zeros((0, 2), dtype=np.int64)
    indeg = np.bincount(pairs[:, 1], minlength=n).tolist()
    order_idx = np.argsort(pairs[:, 0], kind="stable")
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs[:, 0], minlength=n), out=succ_ptr[1:])
    succ = pairs[order_idx, 1].tolist()
    sp = succ_ptr.tolist()
    ready: dict[str | None, list[int]] = {}
    for op in range(n):
        if indeg[op] == 0:
            heapq.heappush(ready.setdefault(place[op], []), op)
    order: list[tuple[str | None, int]] = []
    current: str | None = None
    while True:
        if not ready.get(current):
            current = next((k for k, q in ready.items() if q), "")
            if current == "":
                break
        op = heapq.heappop(ready[current])
        order.append((current, op))
        for s in succ[sp[op]:sp[op + 1]]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready.setdefault(place[s], []), s)
    regions: list[Region] = []
    for where, op in order:
        if where is None:  # constants join the region that reads them
            continue
        if not regions or regions[-1].backend != where:
            regions.append(Region(where, [], [], []))
        regions[-1].ops.append(op)
    producer_region = {}
    for i, r in enumerate(regions):
        for op in r.ops:
            for v in graph.op_outputs(op).tolist():
                producer_region[v] = i
    used_outside: set[int] = set(graph.outputs.tolist()) | set(graph.updates[:, 0].tolist())
    for i, r in enumerate(regions):
        seen: set[int] = set()
        consts: list[int] = []
        for op in r.ops:
            for v in graph.op_inputs(op).tolist():
                p = int(graph.value_producer[v])
                if p >= 0 and graph.op_kind[p] == CONST.id:
                    if p not in consts:
                        consts.append(p)
                elif producer_region.get(v) != i and v not in seen:
                    seen.add(v)
                    r.inputs.append(v)
                    if v in producer_region:
                        used_outside.add(v)
        r.consts = consts
    # a region takes the graph's inputs in the graph's order and gives the graph's results in theirs: jax pairs a
    # donated input with the first result of its type in that order, and a crossed pair (m' over v's buffer while
    # v is still read) costs XLA a copy per call
    position = {v: i for i, v in enumerate(graph.inputs.tolist())}
    result_position = {v: i for i, v in enumerate(graph.outputs.tolist())}
    for r in regions:
        r.inputs.sort(key=lambda v: position.get(v, len(position)))
        r.outputs = [v for op in r.ops for v in graph.op_outputs(op).tolist() if v in used_outside]
        r.outputs.sort(key=lambda v: result_position.get(v, len(result_position)))
        r.static = all(isinstance(graph.type_of(v), TensorType) and graph.type_of(v).is_static  # type: ignore[union-attr]
                       for v in r.inputs)
    return regions


class _Variant:
    """The lowered, partitioned graph for one set of targets."""

    def __init__(self, program: Program, graph: Graph) -> None:
        be = program.backend
        self.source = graph
        started = time.perf_counter()
        live = dce(graph).graph
        # an engine that claims the whole graph in one vectorised look (the numba engine on 10^6 scalar ops) skips
        # lowering and the op-by-op placement: one region, compiled on the graph itself
        whole = be.claims(live)
        with progress.task(f"compile: lower {graph.num_ops:,} ops for {be.name}"):
            lowered = lower(live, lambda info: be.why_not(info) is None) if not whole else None
        program._add_time("lower", time.perf_counter() - started)
        started = time.perf_counter()
        self.lowered = g = lowered.graph if lowered is not None else live
        self.lowered_counts = lowered.counts if lowered is not None else {}
        self.input_pos = {v: i for i, v in enumerate(g.inputs.tolist())}
        self.place: list[str | None] = []
        self.reasons: dict[int, str] = {}
        for op in range(g.num_ops if not whole else 0):
            if g.op_kind[op] == CONST.id:
                self.place.append(None)
                continue
            why = be.why_not(OpInfo.of(g, op))
            if why is None:
                self.place.append(be.name)
                continue
            if not program.partition:
                raise BackendError(f"op {op} ({g.kind_of(op)}) cannot run on {be.name}: {why}; "
                                   f"compile with partition=True to run it on numpy, or use backend='numpy'")
            self.place.append("numpy")
            self.reasons[op] = why
        self.regions = _regions(g, self.place) if not whole else _whole_region(g, be.name)
        # per call, counted apart: values one engine computes and another reads, and the caller's NumPy feeds
        # converted to an engine's own arrays (jax, torch: engines whose from_numpy is their own; ONNX Runtime,
        # numba and dask take NumPy arrays; update-edge state stays on its engine between calls)
        made_on = {v: r.backend for r in self.regions for v in r.outputs}
        state = set(g.updates[:, 1].tolist())
        self.transfers = sum(1 for r in self.regions for v in r.inputs if made_on.get(v, r.backend) != r.backend)
        converts = {r.backend for r in self.regions
                    if type(backends.get(r.backend)).from_numpy is not Backend.from_numpy}
        self.feeds = sum(1 for r in self.regions for v in r.inputs
                         if r.backend in converts and g.value_producer[v] < 0 and v not in state)
        # update-edge state a region may let its engine overwrite: read by that region alone and not a result
        readers: dict[int, int] = {}
        for r in self.regions:
            for v in r.inputs:
                readers[v] = readers.get(v, 0) + 1
        results = set(g.outputs.tolist())
        self.donatable = {int(d) for d in [*g.updates[:, 1].tolist(), *g.inputs[list(program.donate)].tolist()]
                          if readers.get(int(d)) == 1 and d not in results}
        # results that no region computes: constants (inputs come with the feeds)
        self.constants = {int(v): g.constant_of(int(g.value_producer[v])) for v in g.outputs.tolist()
                          if g.value_producer[v] >= 0 and g.op_kind[g.value_producer[v]] == CONST.id}
        program._add_time("partition", time.perf_counter() - started)
        with progress.task(f"compile: {len(self.regions)} region(s) on {be.name}", total=len(self.regions)) as tick:
            for r in self.regions:
                if r.static:
                    self._executable(program, r, None)
                tick.advance(1)

    def _executable(self, program: Program, r: Region, shapes: tuple[Any, ...] | None) -> Executable:
        exe = r.executables.get(shapes)  # type: ignore[arg-type]
        if exe is not None:
            return exe
        g = self.lowered
        types = None
        if shapes is not None:
            types = {v: g.type_of(v).with_shape(s) for v, s in zip(r.inputs, shapes, strict=True)}  # type: ignore[union-attr]
        be = backends.get(r.backend)
        shape_opts: dict[str, Any] = {}
        if r.whole:  # the graph itself, its inputs and outputs narrowed to the region's (no rebuild per op)
            sub = g.replace(inputs=np.asarray(r.inputs, dtype=g.inputs.dtype),
                            outputs=np.asarray(r.outputs, dtype=np.int64), updates=np.zeros((0, 2), dtype=np.int64))
            if shapes is not None:
                shape_opts = {"input_shapes": shapes}
        else:
            sub = region_graph(g, [*r.consts, *r.ops], r.inputs, r.outputs, types)
        donate = [i for i, v in enumerate(r.inputs) if v in self.donatable] if be.name == program.backend.name else []
        opts = program.options if be.name == program.backend.name else {}
        if be.name == "numpy":  # the one engine that plans memory (see opgraph.memory.limit)
            opts = {**opts, "memory_limit": program.memory_limit}
        dev = program.device if be.name == program.backend.name else None
        started = time.perf_counter()
        exe = r.executables[shapes] = be.compile_graph(sub, device=dev, donate=donate, **opts,  # type: ignore[index]
                                                       **shape_opts)
        program._add_time(be.name, time.perf_counter() - started)  # lazily compiled shapes count too
        return exe


class Program:
    """A graph compiled on one engine, partitioned where it must be (see the module doc): what
    :func:`compile` returns on every backend.

    Called with the inputs' arrays in order (``p(x)``, ``p(x, w)``), one dict (keys: ids, names, ``"%x"``,
    Values) or keywords (input names): :func:`~opgraph.core.feeds.resolve_call`. Results come in the order of
    the graph's outputs (or of ``targets``), as arrays of the callers' kind by ``result=`` (see :func:`compile`).
    ``arena_runtime`` is the numpy engine's arena runtime when the whole
    graph runs on it as one region (None otherwise); its other attributes (``plan``, ``positional()``, ...)
    are reachable through the program too. ``compile_seconds`` is the time the constructor took and
    ``compile_times`` its parts by stage and engine (shapes compiled later, on first use, are added there).

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2,)), name="x")
    >>> b.output(b.op("exp", x))
    >>> p = opgraph.compile(b.freeze())
    >>> type(p).__name__, p.arena_runtime is not None, p.memory_plan.arena_bytes >= 0, p(np.zeros(2))[0]
    ('Program', True, True, array([1., 1.]))
    >>> sorted(p.compile_times)
    ['numpy']
    """

    def __init__(self, graph: Graph, backend: str | Backend, *, device: str | None = None, partition: bool = True,
                 memory_limit: Any = "auto", schedule: str | np.ndarray = "best", donate: Sequence[int] = (),
                 result: str = "auto", **options: Any) -> None:
        started = time.perf_counter()
        self.graph = graph
        self.donate = tuple(donate)
        """Input positions whose buffers the engine may reuse (``opgraph.jit``'s ``donate_argnums``; jax does)."""
        self.memory_limit = memory_limit
        self.backend = backend if isinstance(backend, Backend) else backends.get(backend)
        reason = self.backend.unavailable_reason()
        if reason:
            raise BackendError(reason)
        self.device = self.backend.check_device(device)
        self.compile_times: dict[str, float] = {}
        """Seconds spent compiling, by stage (``lower``, ``partition``) and engine (each engine's region
        compiles, the numpy arena's schedule and memory plan): the program's own and any compiled later for a
        new shape."""
        engine_results = ("dask", "persist") if self.backend.name == "dask" else ()
        if result in engine_results:  # the engine's own lazy or persisted arrays (dask)
            options = {**options, "result": result}
            self.result = "engine"
        elif result in RESULTS:
            if result in ("jax", "torch"):
                backends.get(result)  # installed? (one line naming the package otherwise)
            self.result = result
        else:
            raise BackendError(f"result={result!r}: choose {', '.join(map(repr, RESULTS + engine_results))} "
                               f"('auto': the callers' array kind when all array feeds share one, else NumPy)")
        self.partition = partition
        self.options = options
        self._lock = threading.Lock()
        self._variants: dict[tuple[int, ...], _Variant] = {}
        self._region_state: dict[int, tuple[str, Any]] = {}  # update destination (input position) -> (backend, array)
        self.outputs = graph.outputs.tolist()
        self._input_pos = {v: i for i, v in enumerate(graph.inputs.tolist())}
        self._kernel_calls = 0
        self._transfers = 0
        self.arena_runtime: CompiledGraph | None = None
        if self._runs_whole_on_numpy():
            with progress.task(f"compile: {graph.num_ops:,} ops for numpy (schedule, memory plan, program)"):
                self.arena_runtime = CompiledGraph(graph, schedule=schedule, memory_limit=memory_limit,
                                                  donate=self.donate)
            self._add_time("numpy", time.perf_counter() - started)
        else:
            self.variant(tuple(self.outputs))  # errors (missing ops, bad options) surface at compile time
        self._input_ids = graph.inputs.tolist()
        self._n_inputs = len(self._input_ids)
        self._plain_arena = self.arena_runtime is not None and self.result in ("auto", "numpy")
        self._direct: Any = None  # the direct positional call (see _direct_call): None until the first call
        self.compile_seconds = time.perf_counter() - started
        """Seconds :func:`compile` took (lowering, partitioning, planning and each region's engine compile)."""

    def _add_time(self, what: str, seconds: float) -> None:
        self.compile_times[what] = self.compile_times.get(what, 0.0) + seconds

    def _runs_whole_on_numpy(self) -> bool:
        """True when the graph is one numpy region: the numpy engine, no engine options, and a kernel for every
        kind (asked once per kind, so a graph of 10^7 ops costs a few kinds' look-ups)."""
        be = self.backend
        if not isinstance(be, NumpyBackend) or self.options or self.device != "cpu":
            return False
        kinds = np.unique(self.graph.op_kind).tolist()
        return all(k == CONST.id or be.has_kernel(get_op(k).name) for k in kinds)

    @property
    def kernel_calls(self) -> int:
        """Kernels run so far (on every engine: the ops of the regions run)."""
        return self._kernel_calls + (self.arena_runtime.kernel_calls if self.arena_runtime is not None else 0)

    @property
    def transfers(self) -> int:
        """Values handed to a region from another engine so far: values another region computed, and the
        caller's NumPy feeds that a region on another engine read (:meth:`explain` counts those apart, per call)."""
        return self._transfers

    @property
    def _state(self) -> dict[int, Any]:
        """The update-edge state held between calls, where it is kept: the arena's buffers by destination value,
        or each region engine's arrays by destination input position."""
        if self.arena_runtime is not None:
            return self.arena_runtime._state
        return self._region_state

    @property
    def memory_plan(self) -> MemoryPlan | None:
        """The memory plan, where the engine plans memory (the numpy arena); None elsewhere."""
        return self.arena_runtime.plan if self.arena_runtime is not None else None

    @property
    def code(self) -> str | None:
        """The generated source a call runs, where the engine generates code (numpy's straight-line function,
        the torch and dask engines' programs); None where it does not (jax and onnxruntime compile the graph).

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); b.output(b.op("exp", x))
        >>> print(opgraph.compile(b.freeze()).code.strip().splitlines()[0])
        def _program(v0):
        """
        if self.arena_runtime is not None:
            return self.arena_runtime.code
        var = self.variant(tuple(self.outputs))
        parts = []
        for i, r in enumerate(var.regions):
            for exe in r.executables.values():
                src = getattr(exe, "source", None)
                if src is None and hasattr(exe, "compiled"):  # a numpy region: its arena's code
                    src = exe.compiled.code
                if src is not None:
                    parts.append(f"# region {i} on {r.backend}\n{src}")
        return "\n\n".join(parts) or None

    def __getattr__(self, name: str) -> Any:
        # the arena runtime's own surface (plan, positional(), program, ...) where the graph runs whole on numpy
        arena = self.__dict__.get("arena_runtime")
        if arena is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(arena, name)

    # ---------------------------------------------------------------- building
    def variant(self, targets: tuple[int, ...], *, updates: bool = True) -> _Variant:
        """The compiled form for ``targets`` (built once, then cached); with ``updates`` the update sources are
        computed too (a call applies the update edges)."""
        key = (*targets, -1) if updates else targets
        v = self._variants.get(key)
        if v is None:
            outs = list(targets) + ([int(s) for s in self.graph.updates[:, 0].tolist()] if updates else [])
            v = self._variants[key] = _Variant(self, with_outputs(self.graph, outs, updates=updates))
        return v

    # ---------------------------------------------------------------- running
    def __call__(self, *args: Any, targets: Sequence[Any] | None = None, **named: Any) -> list[Any]:
        """Run on the feeds; ``targets`` (ids, names or Values) default to the graph's outputs.

        The feeds are the inputs' arrays in the graph's input order (``p(x, w)``), one dict keyed as in
        :meth:`Graph.run <opgraph.core.graph.Graph.run>` (ids, names, ``"%x"``, Values) or keywords (input
        names; ``targets`` is this call's parameter, also taken second after a dict, ``p(feeds, targets)``), by
        :func:`~opgraph.core.feeds.resolve_call`; any other call is one :class:`~opgraph.errors.FeedError`.
        Results are arrays of the kind ``result=`` says.

        >>> import numpy as np, opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); w = b.input(("f8", (2,)), name="w")
        >>> b.output(b.op("add", x, w)); p = opgraph.compile(b.freeze())
        >>> p(np.ones(2), np.ones(2))[0], p({"x": np.ones(2)}, w=np.zeros(2))[0]
        (array([2., 2.]), array([1., 1.]))
        """
        if len(args) == self._n_inputs and not named and targets is None:
            direct = self._direct if self._direct is not None else self._direct_call()
            if direct:
                got = direct(args)
                if got is not None:
                    return got  # type: ignore[no-any-return]
        if self._plain_arena and targets is None:  # the common calls, checked by type alone
            arena_call = self.arena_runtime
            if named:
                if not args and {type(a) for a in named.values()} <= _PLAIN:
                    return arena_call(None, **named)  # type: ignore[misc,no-any-return]
            elif len(args) == 1 and type(args[0]) is dict:
                if {type(a) for a in args[0].values()} <= _PLAIN:
                    return arena_call(args[0])  # type: ignore[misc,no-any-return]
            elif len(args) == self._n_inputs and {type(a) for a in args} <= _PLAIN:
                return arena_call(dict(zip(self._input_ids, args, strict=True)))  # type: ignore[misc,no-any-return]
        if len(args) == 2 and targets is None and (args[0] is None or isinstance(args[0], Mapping)):
            args, targets = args[:1], args[1]  # p(feeds, targets), as Graph.run is called
        arena = self.arena_runtime is not None and targets is None
        if arena and len(args) == 1 and not named and type(args[0]) is not np.ndarray and isinstance(args[0], Mapping):
            feeds: Mapping[Any, Any] = args[0]  # the arena resolves a dict's keys once per key tuple
        else:
            feeds = resolve_call(self.graph, args, named)
        kind, device, foreign = self._callers(feeds)
        if arena:
            if foreign:
                feeds = {k: to_numpy(x) for k, x in feeds.items()}
            outs = self.arena_runtime(feeds)  # type: ignore[misc]  # fresh arrays the caller owns
            return outs if kind == "numpy" else [convert(o, kind, device) for o in outs]
        with self._lock:
            if self.arena_runtime is not None and len(self.graph.updates):
                raise ExecutionError("targets= on a program with update edges: its state lives in the arena, "
                                     "which computes the graph's outputs; compile(graph.replace(outputs=...)) "
                                     "for other targets, or run graph.run(feeds, targets) (no update)")
            return self._run(feeds, targets, kind, device)

    run = __call__

    def direct(self) -> Any:
        """The direct positional call (``p(*arrays)`` takes it first), or None where the program has none: a
        function of the inputs' arrays, in order, that returns the results, or None (without running anything
        that is not repeated) when an array is not what the executable takes as it is (type, dtype, shape).

        >>> import numpy as np, opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); b.output(b.op("exp", x))
        >>> run = opgraph.compile(b.freeze()).direct()
        >>> run([np.zeros(2)]), run([np.zeros(3)])
        ([array([1., 1.])], None)
        """
        got = self._direct if self._direct is not None else self._direct_call()
        return got or None

    def _direct_call(self) -> Any:
        """The call ``p(*arrays)`` takes when every array is already what the executable takes (checked by type,
        dtype and shape alone): the arena's positional program, or one engine region's executable fed the
        caller's arrays as they are, its results returned as the engine gives them (the callers' kind). It is
        what ``opgraph.jit`` calls per step. False where the program has none: update edges (state between
        calls), several regions, a dynamic shape, or results asked in another kind; a call whose arrays do not
        fit (None from the direct call) takes the checked path.
        """
        self._direct = False
        g = self.graph
        if len(g.updates) or not all(isinstance(g.type_of(v), TensorType) for v in self._input_ids):
            return False
        dynamic = not all(g.type_of(v).is_static for v in self._input_ids)  # type: ignore[union-attr]
        types = [(g.type_of(v).dtype, g.type_of(v).shape if g.type_of(v).is_static else None)  # type: ignore[union-attr]
                 for v in self._input_ids]
        if dynamic and (self.arena_runtime is not None or self.backend.owns(self.device) is not owns_numpy):
            return False
        if self.arena_runtime is not None:
            if not self._plain_arena:
                return False
            positional = self.arena_runtime.positional()

            def arena(args: Sequence[Any]) -> list[Any] | None:
                for a, (dt, shape) in zip(args, types, strict=True):
                    if not (type(a) is np.ndarray and a.dtype == dt and a.shape == shape):
                        return None
                return positional(args)

            self._direct = arena
            return arena
        owns = self.backend.owns(self.device)
        if owns is None or self.result not in ("auto", self.backend.name):
            return False
        var = self.variant(tuple(self.outputs))
        if len(var.regions) != 1 or var.constants:
            return False
        (region,) = var.regions
        if region.backend != self.backend.name or (dynamic and not region.whole):
            return False
        exe = var._executable(self, region, None) if region.static else None
        take = [var.input_pos[v] for v in region.inputs]
        where = {v: i for i, v in enumerate(region.outputs)}
        lout = var.lowered.outputs.tolist()
        if not all(v in where for v in lout):  # a result that is an input or no region's output
            return False
        give = [where[v] for v in lout]
        n_ops = len(region.ops)

        numpy_arrays = owns is owns_numpy
        identity = take == list(range(len(types))) and give == list(range(len(give)))

        executables = region.executables

        def engine(args: Sequence[Any]) -> list[Any] | None:
            if numpy_arrays:  # the check inlined: a call per array costs more than the register machine's work
                for a, (dt, shape) in zip(args, types, strict=True):
                    if type(a) is not np.ndarray or (a.dtype is not dt and a.dtype != dt) or (
                            a.shape != shape and shape is not None):
                        return None
            else:
                for a, (dt, shape) in zip(args, types, strict=True):
                    if not owns(a, dt, shape):
                        return None
            run = exe
            if run is None:  # inputs of dynamic shape: the executable compiled for these shapes, once there is one
                run = executables.get(tuple(args[i].shape for i in take))
                if run is None:
                    return None
            try:
                outs = run(args if identity else [args[i] for i in take])
            except Exception:  # the checked path runs it again and names the region and the engine
                return None
            self._kernel_calls += n_ops
            return outs if identity else [outs[i] for i in give]

        self._direct = engine
        return engine

    def _callers(self, feeds: Mapping[Any, Any]) -> tuple[str, str | None, bool]:
        """The kind and device results take (by ``result=`` and the array feeds' kinds), and whether a feed is a
        jax or torch array; refuses a feed opgraph cannot take (:func:`~opgraph.backends.arrays.check_feed`)."""
        if self.result in ("auto", "numpy") and {type(x) for x in feeds.values()} <= _PLAIN:
            return "numpy", None, False  # the common call, in one set of types
        kind: str | None = None
        device: str | None = None
        mixed = foreign = False
        for k, x in feeds.items():
            if type(x) is np.ndarray:
                got, dev = "numpy", "cpu"
            else:
                info = describe(x)
                if info is None:  # Python scalars and lists: no kind of their own
                    continue
                got, dev = info.kind, info.device
                if got != "numpy":
                    foreign = True
                    if getattr(x, "requires_grad", False):  # the label only where it is refused
                        check_feed(x, self.graph.value_label(input_id(self.graph, k)))
            if kind is None:
                kind, device = got, dev
            elif got != kind or dev != device:
                mixed = True
        want = self.result
        if want == "engine":
            return "numpy", None, foreign  # dask's own arrays, which its finish() gives
        if want == "auto":
            want = "numpy" if kind is None or mixed else kind
        if want == "numpy":
            return "numpy", None, foreign
        if want != kind or mixed:  # results on the program's device when it is that kind's engine, else the CPU
            device = self.device if want == self.backend.name else None
        return want, device, foreign

    def _run(self, feeds: Mapping[int, Any], targets: Sequence[Any] | None, kind: str = "numpy",
             device: str | None = None) -> list[Any]:
        g = self.graph
        tg = tuple(self.outputs) if targets is None else tuple(target_ids(g, targets))
        var = self.variant(tg)
        lg = var.lowered
        env: dict[int, tuple[str, Any]] = {}
        linputs = lg.inputs.tolist()
        be = self.backend
        for v, data in feeds.items():  # keys are input ids (resolve_feeds)
            own = be.adopt_feed(data, g.type_of(v), g.value_label(v))
            env[linputs[self._input_pos[v]]] = (be.name, own) if own is not None else (
                "numpy", coerce_feed(g, v, to_numpy(data)))
        for pos, st in self._region_state.items():
            env.setdefault(linputs[pos], st)
        for v, c in var.constants.items():
            env[v] = ("numpy", c)
        for r in var.regions:
            self._run_region(var, r, env)
        lout = lg.outputs.tolist()
        kept = set(lout[len(tg):])
        for v in lout[:len(tg)]:
            if v not in env:
                raise ExecutionError(f"missing feed for input {lg.value_label(v)}")
        outs, states = self._finish(env, lout[:len(tg)], lout[len(tg):], kind, device)
        results = []
        for v, a in zip(lout[:len(tg)], outs, strict=True):
            if kind_of(a) is None:  # an engine's own array, asked for (dask's result="dask")
                results.append(a)
                continue
            # a result is writable and never aliases a caller's feed, a constant, or state the next call may
            # overwrite (engines' NumPy views, such as JAX's, are read-only; jax arrays are immutable)
            shared = v in kept or lg.value_producer[v] < 0 or lg.op_kind[lg.value_producer[v]] == CONST.id
            readonly = isinstance(a, np.ndarray) and not a.flags.writeable
            results.append(copy_array(a) if shared or readonly else a)
        for (_src, dst), st in zip(lg.updates.tolist(), states, strict=True):
            self._region_state[var.input_pos[dst]] = st
        return results

    def _finish(self, env: dict[int, tuple[str, Any]], results: Sequence[int], states: Sequence[int],
                kind: str = "numpy", device: str | None = None) -> tuple[list[Any], list[tuple[str, Any]]]:
        """Each engine's :meth:`~opgraph.backends.base.Backend.finish` on its results and state, once per call;
        results come as arrays of ``kind`` on ``device``."""
        outs: list[Any] = [None] * len(results)
        kept: list[tuple[str, Any]] = [env[v] for v in states]
        for where in {env[v][0] for v in (*results, *states)}:
            be = backends.get(where)
            ri = [i for i, v in enumerate(results) if env[v][0] == where]
            si = [i for i, v in enumerate(states) if env[v][0] == where]
            opts = self.options if where == self.backend.name else {}
            got, st = be.finish([env[results[i]][1] for i in ri], [env[states[i]][1] for i in si], opts, kind, device)
            for i, a in zip(ri, got, strict=True):
                outs[i] = a
            for i, a in zip(si, st, strict=True):
                kept[i] = (where, a)
        return outs, kept

    def _run_region(self, var: _Variant, r: Region, env: dict[int, tuple[str, Any]]) -> None:
        """Run one region on the values in ``env`` (``value -> (backend, array)``) and add its outputs to it."""
        g, lg = self.graph, var.lowered
        be = backends.get(r.backend)
        args = []
        for v in r.inputs:
            got = env.get(v)
            if got is None:
                pos = var.input_pos[v]
                raise ExecutionError(f"missing feed for input {g.value_label(int(g.inputs[pos]))}: {lg.type_of(v)}")
            where, arr = got
            if where != r.backend:
                if where != "numpy":
                    arr = backends.get(where).to_numpy(arr)
                arr = be.from_numpy(np.asarray(arr), self.device if r.backend == self.backend.name else None)
                self._transfers += 1
            args.append(arr)
        shapes = None if r.static else tuple(tuple(np.shape(a)) for a in args)
        exe = var._executable(self, r, shapes)
        try:
            outs = exe(args)
        except Exception as exc:  # engines raise their own types; name the region and backend
            if isinstance(exc, ExecutionError):
                raise
            kinds = sorted({lg.kind_of(op) for op in r.ops})
            raise ExecutionError(f"{r.backend} region of {len(r.ops)} op(s) ({', '.join(kinds[:6])}) failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
        self._kernel_calls += len(r.ops)
        for v, o in zip(r.outputs, outs, strict=True):
            env[v] = (r.backend, o)

    # ---------------------------------------------------------------- state and reports
    def state(self, key: Any) -> np.ndarray:
        """A copy of the state an update destination holds for the next call (as NumPy)."""
        if self.arena_runtime is not None:
            return self.arena_runtime.state(key)
        v = value_id(self.graph, key)
        got = self._region_state.get(self._input_pos.get(v, -1))
        if got is None:
            raise KeyError(f"{self.graph.value_label(v)} holds no state (not an update destination, or no call yet)")
        where, arr = got
        return np.array(backends.get(where).to_numpy(arr), copy=True)

    def reset_state(self) -> None:
        """Forget the update-edge state: the next call must feed every update destination again."""
        if self.arena_runtime is not None:
            self.arena_runtime.reset_state()
        with self._lock:
            self._region_state.clear()

    def context(self) -> ProgramContext:
        """A new incremental evaluation context on this program (see :class:`ProgramContext`)."""
        return ProgramContext(self)

    def placement(self) -> list[tuple[int, str, str, str]]:
        """``(op, kind, backend, why)`` for every op of the lowered graph (constants excluded)."""
        if self.arena_runtime is not None:
            g = self.graph
            return [(op, g.kind_of(op), "numpy", "in its capability set") for op in range(g.num_ops)
                    if g.op_kind[op] != CONST.id]
        var = self.variant(tuple(self.outputs))
        g = var.lowered
        out: list[tuple[int, str, str, str]] = []
        for op, where in enumerate(var.place):
            if where is None:
                continue
            why = var.reasons.get(op, "in its capability set")
            out.append((op, g.kind_of(op), where, why))
        return out

    def explain(self) -> str:
        """Which op runs where and why, the regions, the lowering applied and the transfers per call, and where
        the engine's results differ from NumPy's on this graph's ops (its declared ``Backend.numerics``)."""
        if self.arena_runtime is not None:
            return f"{self.arena_runtime.explain()}\n{self._compile_line()}"
        var = self.variant(tuple(self.outputs))
        feeds = f", {var.feeds} NumPy feed(s) converted to {self.backend.name} arrays" if var.feeds else ""
        lines = [f"backend {self.backend.name} (device {self.device}); "
                 f"{len(var.regions)} region(s), {var.transfers} transfer(s) between backends{feeds} per call"]
        if var.lowered_counts:
            done = ", ".join(f"{k} x{n}" for k, n in sorted(var.lowered_counts.items()))
            lines.append(f"lowered: {done}")
        for i, r in enumerate(var.regions):
            # kinds in order of first appearance, counted in one vectorised look (a region may hold 10^6 ops)
            ks = var.lowered.op_kind[np.asarray(r.ops, dtype=np.int64)]
            uniq, first, counts = np.unique(ks, return_index=True, return_counts=True)
            kinds = {get_op(int(uniq[j])).name: int(counts[j]) for j in np.argsort(first).tolist()}
            body = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in kinds.items())
            lines.append(f"region {i} on {r.backend}: {len(r.ops)} op(s), {len(r.inputs)} in, "
                         f"{len(r.outputs)} out: {body}")
        differs: dict[Any, list[str]] = {}
        for op, kind, where, why in self.placement():
            if where != self.backend.name:
                lines.append(f"  op {op} ({kind}) runs on {where}: {why}")
                continue
            info = OpInfo.of(var.lowered, op)
            caveat = self.backend.caveat(info)
            if caveat is not None:
                lines.append(f"  op {op} ({kind}) on {where} {caveat}")
            for d in self.backend.numerics_for(info, self.device):
                differs.setdefault(d, []).append(kind)
        for d, kinds in differs.items():
            names = sorted(set(kinds))
            lines.append(f"numerics: {self.backend.name} differs from NumPy on {len(kinds)} op(s) here "
                         f"({', '.join(names[:8])}{', ...' if len(names) > 8 else ''}): {d.note()}")
        lines.append(self._compile_line())
        return "\n".join(lines)

    def _compile_line(self) -> str:
        """``explain()``'s compile-time line: the total and its parts (:attr:`compile_times`)."""
        times = dict(self.compile_times)
        parts = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in times.items())
        return f"compile: {sum(times.values()) * 1e3:.3f} ms ({parts})"

    def __repr__(self) -> str:
        if self.arena_runtime is not None:
            return f"<Program on numpy: one region, {self.arena_runtime!r}>"
        var = self.variant(tuple(self.outputs))
        return (f"<Program on {self.backend.name}: {sum(len(r.ops) for r in var.regions)} ops in "
                f"{len(var.regions)} region(s)>")


class ProgramContext:
    """Incremental evaluation, the one context of every :class:`Program`: values persist between requests.

    :meth:`set` gives an input a new value and :meth:`get` recomputes only
    what the change reaches: op by op on a graph that runs whole on numpy
    (its arena knows each op's buffer), a region at a time elsewhere (a
    region is one compiled callable of its engine: the unit the engine
    runs). ``kernel_calls`` counts the ops run.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2,)), name="x"); y = b.input(("float64", (2,)), name="y")
    >>> b.output(b.op("add", b.op("exp", x), b.op("sin", y)))
    >>> ctx = Program(b.freeze(), "numpy").context()
    >>> ctx.set("x", np.zeros(2)); ctx.set("y", np.zeros(2))
    >>> ctx.get(b.freeze().outputs[0]), ctx.kernel_calls
    (array([1., 1.]), 3)
    >>> _ = ctx.get(b.freeze().outputs[0]); ctx.kernel_calls   # nothing changed: free
    3
    >>> ctx.set("y", np.ones(2)); _ = ctx.get(b.freeze().outputs[0]); ctx.kernel_calls   # exp too: add wrote over it
    6
    """

    def __init__(self, program: Program) -> None:
        self.program = program
        self.graph = program.graph
        # a graph run whole on numpy is one region, but its arena knows each op: incremental op by op there
        self._ops = EvalContext(program.arena_runtime) if program.arena_runtime is not None else None
        self._lock = threading.RLock()
        self._inputs: dict[int, tuple[str, Any]] = {}   # input position -> (backend, array)
        self._stamp: dict[int, int] = {}                # input position -> when it was last set
        self._clock = 0
        self._envs: dict[int, tuple[dict[int, tuple[str, Any]], dict[int, int], dict[int, tuple[int, ...]]]] = {}
        self.kernel_calls = 0

    def set(self, key: Any, data: Any) -> None:
        """Give an input a new value; regions that read it (directly or not) run again when next needed."""
        if self._ops is not None:
            check_feed(data, self.graph.value_label(input_id(self.graph, key, verb="set")))
            return self._ops.set(key, to_numpy(data))
        with self._lock:
            g = self.graph
            v = input_id(g, key, verb="set")
            check_feed(data, g.value_label(v))
            self._clock += 1
            pos = self.program._input_pos[v]
            self._inputs[pos] = ("numpy", coerce_feed(g, v, to_numpy(data)))
            self._stamp[pos] = self._clock

    def get(self, key: Any) -> np.ndarray:
        """The value of ``key`` (a copy), running only the regions whose inputs changed since their last run."""
        if self._ops is not None:
            got = self._ops.get(key)
            self.kernel_calls = self._ops.kernel_calls
            return got
        with self._lock:
            g, prog = self.graph, self.program
            t = value_id(g, key)
            if g.value_producer[t] == -1:
                pos = prog._input_pos[t]
                if pos not in self._inputs:
                    raise ExecutionError(f"input {g.value_label(t)} was not set")
                return np.array(backends.get(self._inputs[pos][0]).to_numpy(self._inputs[pos][1]), copy=True)
            with prog._lock:
                var = prog.variant((t,), updates=False)
                env, stamps, last = self._envs.setdefault(t, ({}, {}, {}))
                lg = var.lowered
                for pos, v in enumerate(lg.inputs.tolist()):
                    if pos in self._inputs:
                        env[v], stamps[v] = self._inputs[pos], self._stamp[pos]
                for v, c in var.constants.items():
                    env[v], stamps[v] = ("numpy", c), 0
                for i, r in enumerate(var.regions):
                    seen = tuple(stamps.get(v, -1) for v in r.inputs)
                    if last.get(i) == seen and all(v in env for v in r.outputs):
                        continue
                    before = prog.kernel_calls
                    prog._run_region(var, r, env)
                    self.kernel_calls += prog.kernel_calls - before
                    self._clock += 1
                    for v in r.outputs:
                        stamps[v] = self._clock
                    last[i] = seen
                where, arr = env[lg.outputs.tolist()[0]]
                return np.array(backends.get(where).to_numpy(arr), copy=True)

    def update(self) -> None:
        """Apply the update edges: each destination input takes its source's current value."""
        if self._ops is not None:
            self._ops.update()
            self.kernel_calls = self._ops.kernel_calls
            return
        with self._lock:
            news = [(int(dst), self.get(int(src))) for src, dst in self.graph.updates.tolist()]
            for dst, arr in news:
                self.set(dst, arr)


def compile(graph: Graph, backend: str = "numpy", *, device: str | None = None, partition: bool = True,
            schedule: str | np.ndarray = "best", example_inputs: Mapping[Any, Any] | None = None,
            budget: float = 5.0, memory_limit: Any = "auto", result: str = "auto", **options: Any) -> Any:
    """Compile ``graph`` for repeated evaluation on ``backend`` (see the module doc).

    * ``backend``: ``"numpy"`` (default: the arena runtime), ``"jax"``,
      ``"torch"``, ``"onnxruntime"``, or ``"auto"``, which ranks the installed
      backends from the graph, compiles and times those that can win on
      ``example_inputs`` (or on the first call's feeds) within ``budget``
      seconds after the first one's compile (default 5) and keeps the fastest;
      its ``explain()`` gives the ranking, the choice, the timings and what
      failed or was skipped and why (:mod:`opgraph.runtime.auto`). The choice is
      cached on disk by graph hash (``cache=False`` or ``OPGRAPH_AUTO_CACHE=0``
      turns that off: :mod:`opgraph.runtime.choice_cache`). It leaves out an engine whose results differ
      from NumPy's on an op of the graph (``Backend.numerics``: jax on CPU flushes subnormals to zero)
      unless ``allow_numerics=("ftz",)`` (the tags to accept, or True) allows it.
    * ``device``: ``"cpu"`` or ``"cuda"`` (``"cuda:1"``) where the backend has it.
    * ``partition``: run what the backend lacks on numpy (default); with
      False a missing op is an error naming it.
    * ``memory_limit``: refuse (:class:`~opgraph.errors.MemoryLimitError`,
      naming the largest buffers) a memory plan of more bytes than this;
      ``"auto"`` (default) reads ``$OPGRAPH_MEMORY_LIMIT``, else takes the
      total physical RAM; ``None`` or ``0``: no limit (:mod:`opgraph.memory.limit`).
      It applies wherever memory is planned: the numpy arena, and the
      regions a partitioned program runs on numpy.
    * ``result``: the array kind of the results. ``"auto"`` (default): the
      callers' kind and device when every array feed is of one kind on one
      device (torch tensors in, torch tensors out; jax arrays stay jax arrays;
      Python scalars and lists do not count), NumPy otherwise. ``"numpy"``,
      ``"jax"`` or ``"torch"`` force a kind (on the callers' device where they
      fed that kind, else on the program's device if it is that kind's engine,
      else the CPU). The dask engine also takes ``"dask"`` (lazy) and
      ``"persist"``. A torch tensor that requires grad is refused (pass
      ``x.detach()``).
    * ``options`` go to the backend's compiler (``mode=`` for torch.compile's
      mode, ``compile=True`` for torch.compile, ``threads=`` for onnxruntime).

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (2, 2)), name="x")
    >>> b.output(b.op("relu", b.op("matmul", x, x)))
    >>> compile(b.freeze())(x=-np.eye(2, dtype=np.float32))[0]
    array([[1., 0.],
           [0., 1.]], dtype=float32)
    """
    if hasattr(graph, "freeze"):
        graph = graph.freeze()
    if backend == "auto":
        from opgraph.runtime.auto import AutoCompiled, choose

        if memory_limit != "auto":  # handed to each candidate's compile() (a keyword there, not a backend option)
            options["memory_limit"] = memory_limit
        if result != "auto":
            options["result"] = result
        auto = AutoCompiled(graph, budget=budget, device=device, **options)
        if example_inputs is not None:
            auto.choice = choose(graph, example_inputs, budget=budget, device=device, **options)
        return auto  # type: ignore[return-value]
    return Program(graph, backend, device=device, partition=partition, memory_limit=memory_limit, schedule=schedule,
                   result=result, **options)


def run_on(graph: Graph, feeds: Mapping[Any, Any], targets: Sequence[Any] | None, backend: str) -> list[np.ndarray]:
    """``graph.run(feeds, targets, backend=...)`` on a backend other than numpy: the compiled :class:`Program` is
    cached on the (immutable) graph, one per backend, and compiles one variant per target set. As on numpy,
    ``run`` evaluates the targets only: update edges are not applied (a compiled program applies them).

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); y = b.op("exp", x); b.output(y)
    >>> run_on(b.freeze(), {"x": np.zeros(2)}, None, "numpy")
    [array([1., 1.])]

    ``backend="auto"`` chooses on the first run and keeps the choice on the graph
    (:func:`opgraph.runtime.auto.run_auto`).
    """
    if backend == "auto":
        from opgraph.runtime.auto import run_auto

        return run_auto(graph, feeds, targets)
    key = ("program", backend)
    prog = graph._cache.get(key)
    if prog is None:
        prog = graph._cache[key] = Program(with_outputs(graph, graph.outputs.tolist(), updates=False), backend)
    return prog(feeds, targets=targets)  # type: ignore[no-any-return]
