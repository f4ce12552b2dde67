"""The arena runtime: a planned graph as a flat program writing into one preallocated arena.

:class:`CompiledGraph` plans the memory of a graph (:mod:`opgraph.memory`),
allocates the arena once (one ``np.empty`` of bytes, every planned value a
typed view of it) and turns the schedule into a list of ``(kernel, input
slots, output slot, attrs)``; a call only runs that list, each kernel writing
into its planned buffer through ``out=``.

    >>> import numpy as np, opgraph
    >>> from opgraph.backends.numpy import CompiledGraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")
    >>> b.output(b.op("exp", b.op("multiply", x, 2.0)))
    >>> f = CompiledGraph(b.freeze())
    >>> f({"x": np.zeros(3)})
    [array([1., 1., 1.])]
    >>> f(x=np.ones(3))[0].round(3)
    array([7.389, 7.389, 7.389])

Outputs are written into buffers allocated fresh for each call (values that
die before the output is computed may be packed into the same buffer), so a
returned array never aliases the arena or an earlier result. Update edges
(``graph.updates``) carry state between calls by swapping two state buffers,
without copying. Calls are serialised by a lock: one compiled object may be
shared by threads, and they take turns; use one compiled object per thread
to run in parallel (each has its own arena).

Values of dynamic shape are allocated when they are computed (the kernel runs
without ``out=``); results that are views of planned memory are copied.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.backends.numpy.buffers import aligned_empty, typed_view
from opgraph.backends.numpy.codegen import Codegen, failing_op
from opgraph.core.feeds import coerce_feed, input_id, resolve_feeds, value_id
from opgraph.core.gcpause import paused_gc
from opgraph.core.graph import Graph
from opgraph.core.registry import CONST, get_op
from opgraph.errors import ExecutionError, GraphError
from opgraph.memory.limit import check_memory_limit, out_of_memory
from opgraph.memory.plan import ALIAS, DYNAMIC, PLANNED, UNSAFE_INPLACE, MemoryPlan, PlacementMap, align, plan_memory

Step = tuple[Callable[..., Any], tuple[int, ...], tuple[int, ...], dict[str, Any], int, int]
"""(kernel, input value ids, output value ids, attrs, op, mode); mode 1: one planned output,
2: several planned outputs, 3: one planned output computed on slices of the batch,
4: views of the first input (outputs of view ops, kept as the kernel returns them),
0: some output not planned (the kernel allocates)."""


_Signature = tuple[list[tuple[int, int, np.dtype, "tuple[int, ...] | None"]], list[tuple[int, int]],
                   list[tuple[int, int]], bool]
"""Per feed-key order: (value id, argument position or -1, dtype, static shape) of each feed; the (argument
position, input) of the inputs taken from the update-edge state, without and with the carried inputs; and
whether a carried input is fed."""

WORKSPACE_LIMIT = 4 * 2**20
"""Bytes of kernel workspace above which a batched op runs on slices of the batch."""
BATCH_SLICED = frozenset({"max_pool2d", "avg_pool2d"})
"""Ops computed sample by sample along axis 0 of their first input (other inputs whole). The convolution
kernel (``opgraph.backends.numpy.nn.conv_nd``) bounds its own im2col workspace, so it is not among them."""


CODEGEN_LIMIT = 20_000
"""Programs of at most this many kernels run as one generated Python function; longer ones run in a loop
over the program (generating and compiling the source of a very long function costs more than it saves)."""

class CompiledGraph:
    """A graph compiled for repeated evaluation; see the module doc.

    ``targets`` default to the graph's outputs (and the update sources, which
    are always computed); a call returns the outputs in order. A plan larger
    than ``memory_limit`` raises :class:`~opgraph.errors.MemoryLimitError`
    (see :mod:`opgraph.memory.limit`: ``"auto"``, bytes, or None for no limit).
    """

    def __init__(self, graph: Graph, *, schedule: str | np.ndarray = "best",
                 plan: MemoryPlan | None = None, memory_limit: Any = "auto", donate: Sequence[int] = ()) -> None:
        self.memory_limit = memory_limit
        self.donate = tuple(int(i) for i in donate)
        """Input positions whose arrays a call may overwrite with results (see :meth:`donors`)."""
        try:
            with paused_gc():
                self._setup(graph, schedule, plan, memory_limit)
        except MemoryError as exc:  # the arena or a state buffer: the plan cannot be allocated at all
            if isinstance(exc, GraphError):
                raise
            raise out_of_memory(graph, None, exc, memory_limit, plan=getattr(self, "plan", None)) from exc

    def _setup(self, graph: Graph, schedule: str | np.ndarray, plan: MemoryPlan | None,
               memory_limit: Any = "auto") -> None:
        self.graph = graph
        self.backend = "numpy"
        self.plan = plan if plan is not None else plan_memory(graph, schedule=schedule)
        check_memory_limit(self.plan, memory_limit)  # before allocating: a clear error, not NumPy's MemoryError
        self.outputs = [int(v) for v in graph.outputs.tolist()]
        self.updates = [(int(s), int(d)) for s, d in graph.updates.tolist()]
        self._lock = threading.Lock()
        self.kernel_calls = 0
        p = self.plan
        self._chunks: dict[int, list[slice]] = {}
        self.program = self._build_program()
        self.arena = aligned_empty(p.arena_bytes)
        self._slots: list[Any] = [None] * graph.num_values
        self._bin_values: dict[int, list[tuple[int, int, int, np.dtype, tuple[int, ...]]]] = {}
        if isinstance(p.placement, PlacementMap):
            vs, bs, offs = p.placement.arrays()
        else:
            rows = np.array([(v, b, off) for v, (b, off) in p.placement.items()], dtype=np.int64).reshape(-1, 3)
            vs, bs, offs = rows[:, 0], rows[:, 1], rows[:, 2]
        # Values at the same offset with the same type (an in-place chain) share one view of the arena.
        views: dict[tuple[int, int], np.ndarray] = {}
        types, nbytes = graph.types, p.nbytes
        for v, b, off, tid in zip(vs.tolist(), bs.tolist(), offs.tolist(), graph.value_type[vs].tolist(),
                                  strict=True):
            t = types[tid]
            if b == 0:
                view = views.get((off, tid))
                if view is None:
                    view = views[off, tid] = typed_view(self.arena, off, nbytes[v] or 0, t.dtype, t.shape)  # type: ignore[union-attr]
                self._slots[v] = view
            else:
                self._bin_values.setdefault(b, []).append((v, off, nbytes[v] or 0, t.dtype, t.shape))  # type: ignore[union-attr]
        for op in np.flatnonzero(graph.op_kind == CONST.id).tolist():
            self._slots[int(graph.op_outputs(op)[0])] = graph.constant_of(op)
        self._output_bins = [b for b, bn in enumerate(p.bins) if bn.kind == "output"]
        self._own_output = {p.bins[b].owner for b in self._output_bins}
        self._own_output |= {v for v in self.outputs if p.kind[v] == DYNAMIC}
        # update edges: a state bin has two buffers; the source is written into one while
        # the destination reads the other, and the two swap after each call
        self._state: dict[int, np.ndarray] = {}
        self._swap: dict[int, int] = {}  # source value -> state bin
        self._state_bufs: dict[int, list[np.ndarray]] = {}
        self._parity = 0
        for b, bn in enumerate(p.bins):
            if bn.kind == "state":
                self._state_bufs[b] = [aligned_empty(bn.size), aligned_empty(bn.size)]
                self._swap[bn.owner] = b
        self._state_views = {
            par: {v: typed_view(bufs[par], *e[1:]) for b, bufs in self._state_bufs.items() for (v, *_r), e in
                  ((x, x) for x in self._bin_values.get(b, []))}
            for par in (0, 1)
        }
        self._dynamic = [v for v, k in enumerate(p.kind) if k == DYNAMIC]
        self._gen: list[Callable[..., Any] | None] = [None, None]  # the generated program, per state parity
        self._sigs: dict[tuple[Any, ...], _Signature] = {}
        taken: set[int] = set()
        self._update_plan: list[tuple[int, bool]] = []  # (destination, takes the source's buffer itself)
        carried_from: dict[int, int] = {}
        for src, dst in self.updates:
            take = src in self._swap and src not in taken
            self._update_plan.append((dst, take))
            taken.add(src)
            if take:
                carried_from[dst] = src
        self._update_dsts = [dst for dst, _take in self._update_plan]
        self._updates_take_all = all(take for _dst, take in self._update_plan)
        # Inputs carried by a swapped state buffer come last: after a call, each is the buffer the other
        # parity's generated function has as the default of that argument, so calls need not pass them.
        needed = self._find_needed_inputs()
        self._carried = {v: carried_from[v] for v in needed if v in carried_from}
        self._needed_inputs = [v for v in needed if v not in self._carried] + list(self._carried)
        self._n_head = len(needed) - len(self._carried)
        self._carried_ready = False  # True once the last call left every carried buffer in place

    # ------------------------------------------------------------------ building
    def _build_program(self) -> list[Step]:
        g, p = self.graph, self.plan
        prog: list[Step] = []
        kernels: dict[tuple[int, int], Callable[..., Any]] = {}
        attr_cache: dict[int, dict[str, Any]] = {}
        in_ptr, in_ids = g.in_ptr.tolist(), g.in_ids.tolist()
        out_ptr, out_ids = g.out_ptr.tolist(), g.out_ids.tolist()
        op_kind, op_version, op_attr = g.op_kind.tolist(), g.op_version.tolist(), g.op_attr.tolist()
        kind_of = p.kind
        sliced = {get_op(name).id for name in BATCH_SLICED}
        from opgraph.backends.numpy import BACKEND as engine  # the package imports this module first
        for op in p.schedule.tolist():
            kind = op_kind[op]
            if kind == CONST.id:
                continue
            key = (kind, op_version[op])
            fn = kernels.get(key)
            if fn is None:
                try:
                    fn = kernels[key] = engine.kernel_for(kind, key[1])
                except (KeyError, NotImplementedError) as exc:
                    raise ExecutionError(f"op {op} ({g.kind_of(op)}): {exc}") from None
            aid = op_attr[op]
            attrs = attr_cache.get(aid)
            if attrs is None:
                attrs = attr_cache[aid] = dict(g.attrs[aid])
            ins = tuple(in_ids[in_ptr[op]:in_ptr[op + 1]])
            outs = tuple(out_ids[out_ptr[op]:out_ptr[op + 1]])
            if len(outs) == 1:
                k = kind_of[outs[0]]
                mode = 1 if k == PLANNED else (4 if k == ALIAS else 0)
            else:
                planned = all(kind_of[v] == PLANNED for v in outs)
                mode = 0 if not planned or not outs else 2
                if outs and all(kind_of[v] == ALIAS for v in outs):
                    mode = 4
            if mode == 1 and kind in sliced:
                chunks = self._batch_chunks(op, ins, outs[0], attrs)
                if chunks:
                    self._chunks[op] = chunks
                    mode = 3
            prog.append((fn, ins, outs, attrs, op, mode))
        return prog

    def _batch_chunks(self, op: int, ins: tuple[int, ...], out: int, attrs: dict[str, Any]) -> list[slice] | None:
        """Batch slices for an op whose kernel's temporaries scale with the batch (pooling's padded windows).

        Run on slices of the batch, the kernel's workspace stays under :data:`WORKSPACE_LIMIT`;
        the results are the same (each sample is computed independently).
        """
        g = self.graph
        kind = g.kind_of(op)
        if kind not in BATCH_SLICED:
            return None
        xt, ot = g.type_of(ins[0]), g.type_of(out)
        if xt.shape is None or len(xt.shape) != 4 or ot.shape is None or len(ot.shape) != 4:  # type: ignore[union-attr]
            return None
        n = int(xt.shape[0])  # type: ignore[union-attr,index,arg-type]
        if n < 2:
            return None
        per_sample = 2 * ((self.plan.nbytes[ins[0]] or 0) + (self.plan.nbytes[out] or 0)) // n
        pieces = min(n, -(-per_sample * n // WORKSPACE_LIMIT))
        if pieces < 2:
            return None
        size = -(-n // pieces)
        return [slice(a, min(a + size, n)) for a in range(0, n, size)]

    def _find_needed_inputs(self) -> list[int]:
        g = self.graph
        used = {v for step in self.program for v in step[1]}
        used |= set(self.plan.targets)
        return [int(v) for v in g.inputs.tolist() if int(v) in used]

    # ------------------------------------------------------------------ code generation
    def donors(self) -> dict[int, int]:
        """Results that a call writes over a donated input's array: ``{output value: input value}``.

        A result takes a donated input (``donate=``, input positions) when it has a buffer of its own (not one
        the memory plan shares with values computed before it), its op
        declares that input position in-place (``OpDef.inplace``, as the memory planner reads it) and is the
        last op to read it, the two have the same type, and nothing reads the input through a view; each
        input is taken once; only generated programs donate (not those longer than ``CODEGEN_LIMIT``). At run
        time the generated program checks the arrays
        (:func:`~opgraph.backends.numpy.codegen.donation_ok`) and allocates as usual where they do not allow it.

        >>> import numpy as np, opgraph
        >>> b = opgraph.GraphBuilder(); w = b.input(("f8", (3,)), name="w"); g = b.input(("f8", (3,)), name="g")
        >>> b.output(b.op("subtract", w, g))
        >>> f = CompiledGraph(b.freeze(), donate=[0]); w0 = np.ones(3)
        >>> f.donors(), f({"w": w0, "g": np.full(3, 0.5)})[0] is w0, w0
        ({2: 0}, True, array([0.5, 0.5, 0.5]))
        """
        g = self.graph
        if len(self.program) > CODEGEN_LIMIT:  # the step loop that runs such programs writes fresh results
            return {}
        donated = {int(g.inputs[i]) for i in self.donate if 0 <= i < len(g.inputs)}
        donated -= {d for _s, d in self.updates}
        donated -= set(self.outputs)
        if not donated:
            return {}
        own = {v for b in self._output_bins for v, off, *_ in self._bin_values.get(b, []) if off == 0
               and len(self._bin_values[b]) == 1}
        last: dict[int, int] = {}
        viewed: set[int] = set()
        for i, (_fn, ins, _outs, _attrs, _op, mode) in enumerate(self.program):
            for v in ins:
                last[v] = i
                if mode in (0, 4):  # its result may be a view of the input
                    viewed.add(v)
        taken: dict[int, int] = {}
        used: set[int] = set()
        for i, (_fn, _ins, outs, _attrs, op, mode) in enumerate(self.program):
            if mode not in (1, 2) or op < 0:
                continue
            opdef = get_op(int(g.op_kind[op]))
            op_ins = g.op_inputs(op).tolist()
            for j, v in enumerate(outs):
                if v not in own:
                    continue
                # the j-th result prefers the j-th input (an update op's p' takes p, m' takes m, ...)
                for pos in sorted(opdef.inplace, key=lambda q, j=j: q != j):
                    if (opdef.name, pos) in UNSAFE_INPLACE or pos >= len(op_ins):
                        continue
                    x = op_ins[pos]
                    if (x in donated and x not in used and x not in viewed and last.get(x) == i
                            and g.value_type[x] == g.value_type[v]):
                        taken[v] = x
                        used.add(x)
                        break
        return taken

    def _generated(self, parity: int) -> Callable[..., Any] | None:
        """The straight-line function running the whole program with state buffers of ``parity``
        (built on first use; None for programs longer than :data:`CODEGEN_LIMIT`, which the loop in
        :meth:`_execute` runs)."""
        fn = self._gen[parity]
        if fn is None and len(self.program) <= CODEGEN_LIMIT:
            fn = self._gen[parity] = Codegen(self, parity).build()
        return fn

    def _signature(self, keys: tuple[Any, ...]) -> _Signature:
        """How feeds given with these keys (in this order) become the generated function's arguments."""
        g = self.graph
        pos = {v: i for i, v in enumerate(self._needed_inputs)}
        checks = []
        for k in keys:
            v = input_id(g, k)
            t = g.type_of(v)
            static = t.shape if t.shape is not None and None not in t.shape else None  # type: ignore[union-attr]
            checks.append((v, pos.get(v, -1), t.dtype, static))  # type: ignore[union-attr]
        fed = {c[0] for c in checks}
        if len(fed) < len(checks):
            resolve_feeds(g, dict.fromkeys(keys))  # raises the FeedError naming the input fed twice
        from_state = [(i, v) for i, v in enumerate(self._needed_inputs) if v not in fed]
        head = [(i, v) for i, v in from_state if i < self._n_head]
        return checks, head, from_state, any(v in fed for v in self._carried)

    def _run_generated(self, fn: Callable[..., Any], feeds: Mapping[Any, Any]) -> list[np.ndarray]:
        keys = tuple(feeds)
        sig = self._sigs.get(keys)
        if sig is None:
            sig = self._signature(keys)
            if len(self._sigs) < 64:
                self._sigs[keys] = sig
        checks, head, from_state, carried_fed = sig
        state = self._state
        g = self.graph
        if self._carried_ready and not carried_fed:  # the carried inputs take their defaults
            args: list[Any] = [None] * self._n_head
            from_state = head
        else:
            args = [None] * len(self._needed_inputs)
        for pos, v in from_state:
            a = state.get(v)
            if a is None:
                raise ExecutionError(f"missing feed for input {g.value_label(v)}: {g.type_of(v)}")
            args[pos] = a
        for (v, pos, dt, shape), data in zip(checks, feeds.values(), strict=True):
            if not (type(data) is np.ndarray and data.dtype == dt and data.shape == shape):
                data = coerce_feed(g, v, data)
            if pos >= 0:
                args[pos] = data
        try:
            outs, sources = fn(*args)
        except GraphError:
            raise
        except MemoryError as exc:
            raise out_of_memory(g, failing_op(exc, fn), exc, self.memory_limit) from exc
        except Exception as exc:
            op = failing_op(exc, fn)
            if op is None:
                raise
            raise ExecutionError(f"op {op} ({g.kind_of(op)}) failed: {type(exc).__name__}: {exc}") from exc
        self.kernel_calls += len(self.program)
        if self._updates_take_all:  # every source's buffer becomes its destination's state (double-buffered)
            state.update(zip(self._update_dsts, sources, strict=True))
        else:
            for (dst, take), x in zip(self._update_plan, sources, strict=True):
                state[dst] = x if take else np.array(x, copy=True)
        if self._swap:
            self._parity ^= 1
        self._carried_ready = True
        return list(outs)

    # ------------------------------------------------------------------ running
    def __call__(self, feeds: Mapping[Any, Any] | None = None, **named: Any) -> list[np.ndarray]:
        """Run the program on ``feeds`` (ids, names or Values to arrays; names also as keywords).

        An update destination that is not fed takes the state left by the
        previous call (it must be fed on the first call).
        """
        with self._lock:
            # Keys are resolved once per key tuple (_signature's cache), so the dict form costs no per-call
            # lookups; keywords go through the shared rule first. Both refuse an input fed twice.
            feeds = resolve_feeds(self.graph, feeds, named) if named else (feeds or {})
            fn = self._generated(self._parity)
            if fn is None:
                return self._run(feeds)
            return self._run_generated(fn, feeds)

    run = __call__

    def positional(self) -> Callable[[Sequence[Any]], list[np.ndarray]]:
        """A call taking the graph's inputs as a list, in order, and returning fresh output arrays.

        For callers whose arrays already have the declared types (a control-flow
        op runs its body once per trip through this): it skips the per-call
        feed lookup and checks of :meth:`__call__`, which cost more than a
        small body's kernels. A failing kernel is reported as by ``__call__``.
        Graphs with update edges keep state, so they go through ``__call__``.

        >>> import numpy as np, opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); b.output(b.op("exp", x))
        >>> CompiledGraph(b.freeze()).positional()([np.zeros(2)])
        [array([1., 1.])]
        """
        inputs = self.graph.inputs.tolist()
        fn = None if self.updates else self._generated(0)
        if fn is None:
            return lambda args: self(dict(zip(inputs, args, strict=True)))
        where = {v: i for i, v in enumerate(inputs)}
        take = [where[v] for v in self._needed_inputs]
        lock = self._lock

        def call(args: Sequence[Any]) -> list[np.ndarray]:
            try:
                with lock:
                    outs, _sources = fn(*[args[i] for i in take])
            except Exception:
                # Run again through the checked path, which names the failing op (or refuses a bad feed).
                return self(dict(zip(inputs, args, strict=True)))
            return list(outs)

        return call

    @property
    def code(self) -> str:
        """The Python source a call runs (generated on first use; see :class:`~opgraph.backends.numpy.codegen.Codegen`).

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); b.output(b.op("exp", x))
        >>> print(CompiledGraph(b.freeze()).code.strip())
        def _program(v0):
            v1 = _empty((2,), d8)
            u9(v0, v1)
            return (v1,), ()
        """
        with self._lock:
            fn = self._generated(self._parity)
        if fn is None:
            return f"# {len(self.program)} kernels: run by a loop over the program (more than CODEGEN_LIMIT)\n"
        return fn.source  # type: ignore[attr-defined,no-any-return]

    def _run(self, feeds: Mapping[Any, Any]) -> list[np.ndarray]:
        g = self.graph
        slots = self._slots
        fed: set[int] = set()
        for k, data in feeds.items():
            v = input_id(g, k)
            if v in fed:
                resolve_feeds(g, feeds)  # raises the FeedError naming the input fed twice
            slots[v] = coerce_feed(g, v, data)
            fed.add(v)
        for v in self._needed_inputs:
            if v not in fed:
                if v in self._state:
                    slots[v] = self._state[v]
                else:
                    raise ExecutionError(f"missing feed for input {g.value_label(v)}: {g.type_of(v)}")
        fresh: dict[int, np.ndarray] = {}
        for b in self._output_bins:
            try:
                buf = fresh[b] = aligned_empty(self.plan.bins[b].size)
            except MemoryError as exc:
                first = self._bin_values[b][0][0] if self._bin_values.get(b) else -1
                raise out_of_memory(g, int(g.value_producer[first]) if first >= 0 else None, exc,
                                    self.memory_limit) from exc
            for v, off, nb, dt, shape in self._bin_values.get(b, ()):
                slots[v] = typed_view(buf, off, nb, dt, shape)
        for v, view in self._state_views[self._parity].items():
            slots[v] = view
        self._execute(slots)
        self.kernel_calls += len(self.program)
        results = []
        for v in self.outputs:
            arr = slots[v]
            if v not in self._own_output:  # inputs, constants, arena or state values: a copy
                arr = np.array(arr, copy=True)
            results.append(arr)
        swapped: set[int] = set()
        for src, dst in self.updates:
            if src in self._swap and src not in swapped:
                self._state[dst] = slots[src]  # the buffer itself: the next call writes the other one
                swapped.add(src)
            else:
                self._state[dst] = np.array(slots[src], copy=True)
        if self._swap:
            self._parity ^= 1
        for b in self._output_bins:  # do not keep the caller's buffers alive
            for v, *_rest in self._bin_values.get(b, ()):
                slots[v] = None
        for v in fed.union(self._needed_inputs):  # do not keep the caller's arrays alive either
            slots[v] = None
        for v in self._dynamic:
            slots[v] = None
        return results

    def _execute(self, slots: list[Any], steps: Iterable[Step] | None = None) -> int:
        n = 0
        for fn, ins, outs, attrs, op, mode in (self.program if steps is None else steps):
            n += 1
            args = [slots[i] for i in ins]
            try:
                if mode == 1:
                    o = slots[outs[0]]
                    r = fn(*args, out=o, **attrs)
                    if r is not o:
                        np.copyto(o, r, casting="unsafe")
                    continue
                if mode == 4:  # views of the input: kept as they are
                    r = fn(*args, **attrs)
                    if len(outs) == 1:
                        slots[outs[0]] = r
                    else:
                        for v, x in zip(outs, r, strict=True):
                            slots[v] = x
                    continue
                if mode == 3:
                    o = slots[outs[0]]
                    x, rest = args[0], args[1:]
                    for sl in self._chunks[op]:
                        part = o[sl]
                        r = fn(x[sl], *rest, out=part, **attrs)
                        if r is not part:
                            np.copyto(part, r, casting="unsafe")
                    continue
                if mode == 2:
                    os_ = tuple(slots[v] for v in outs)
                    r = fn(*args, out=os_, **attrs)
                    for o, x in zip(os_, r, strict=True):
                        if x is not o:
                            np.copyto(o, x, casting="unsafe")
                    continue
                r = fn(*args, **attrs)
            except GraphError:
                raise
            except MemoryError as exc:
                raise out_of_memory(self.graph, op, exc, self.memory_limit) from exc
            except Exception as exc:
                raise ExecutionError(f"op {op} ({self.graph.kind_of(op)}) failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
            r = (r,) if len(outs) == 1 else tuple(r)
            for v, x in zip(outs, r, strict=True):
                x = np.asarray(x)
                if self.plan.kind[v] == PLANNED:
                    np.copyto(slots[v], x, casting="unsafe")
                else:
                    if not x.flags.owndata and _shares_planned(x, slots, ins):
                        x = x.copy()
                    slots[v] = x
        return n

    # ------------------------------------------------------------------ state
    def state(self, key: Any) -> np.ndarray:
        """A copy of the state an update destination holds for the next call.

        >>> import numpy as np, opgraph
        >>> b = opgraph.GraphBuilder()
        >>> s = b.input(("float64", ()), name="s")
        >>> b.update(b.add(s, 1.0), s)
        >>> f = CompiledGraph(b.freeze())
        >>> _ = f(s=np.float64(0)); _ = f(); float(f.state("s"))
        2.0
        """
        v = value_id(self.graph, key)
        if v not in self._state:
            raise KeyError(f"{self.graph.value_label(v)} holds no state (not an update destination, or no call yet)")
        return np.array(self._state[v], copy=True)

    def explain(self) -> str:
        """Where each op runs (all on numpy here) and the memory plan in one line.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,))); b.output(b.op("exp", x))
        >>> print(CompiledGraph(b.freeze()).explain())
        backend numpy (device cpu); 1 region(s), 0 transfer(s) between backends per call
        region 0 on numpy: 1 op(s) (exp), arena 0 B
        """
        kinds: dict[str, int] = {}
        for step in self.program:
            k = self.graph.kind_of(step[4])
            kinds[k] = kinds.get(k, 0) + 1
        body = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in kinds.items())
        return (f"backend numpy (device cpu); 1 region(s), 0 transfer(s) between backends per call\n"
                f"region 0 on numpy: {len(self.program)} op(s) ({body}), arena {self.plan.arena_bytes:,} B")

    def reset_state(self) -> None:
        """Forget the update-edge state: the next call must feed every update destination again."""
        with self._lock:
            self._state.clear()
            self._parity = 0
            self._carried_ready = False

    def context(self) -> EvalContext:
        """A new incremental evaluation context on this compiled graph (its own arena)."""
        return EvalContext(self)

    def __repr__(self) -> str:
        s = self.plan.stats()
        return (f"<CompiledGraph: {len(self.program)} kernels, arena {s['arena_bytes']:,} B, "
                f"planned {s['planned_bytes']:,} B (Owl {s['owl_bytes']:,} B, bound {s['lower_bound_bytes']:,} B)>")


def _shares_planned(x: np.ndarray, slots: list[Any], ins: Sequence[int]) -> bool:
    return any(isinstance(slots[i], np.ndarray) and np.shares_memory(x, slots[i]) for i in ins)


class EvalContext:
    """Incremental evaluation (Owl, seed 003): values persist between requests.

    :meth:`set` invalidates only the descendants of the input set; :meth:`get`
    recomputes only the invalid values its target needs. Values that share
    bytes in the plan invalidate each other: computing a value marks every
    value overlapping its bytes invalid (Owl tracks the node active in each
    block). ``kernel_calls`` counts the kernels run.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2,)), name="x")
    >>> y = b.input(("float64", (2,)), name="y")
    >>> ex = b.op("exp", x)
    >>> b.output(b.op("add", ex, b.op("sin", y)), ex)   # ex is an output: add cannot overwrite it
    >>> ctx = CompiledGraph(b.freeze()).context()
    >>> ctx.set("x", np.zeros(2)); ctx.set("y", np.zeros(2))
    >>> ctx.get(b.freeze().outputs[0]), ctx.kernel_calls
    (array([1., 1.]), 3)
    >>> ctx.set("y", np.ones(2)); _ = ctx.get(b.freeze().outputs[0]); ctx.kernel_calls   # sin, add
    5
    >>> _ = ctx.get(b.freeze().outputs[0]); ctx.kernel_calls   # still valid: free
    5
    """

    def __init__(self, compiled: CompiledGraph) -> None:
        self.compiled = compiled
        g, p = compiled.graph, compiled.plan
        self.graph = g
        self._lock = threading.RLock()
        self.kernel_calls = 0
        self.slots: list[Any] = [None] * g.num_values
        self.valid = [False] * g.num_values
        self._bufs = [aligned_empty(b.size) for b in p.bins]
        for v, (b, off) in p.placement.items():
            t = g.type_of(v)
            self.slots[v] = typed_view(self._bufs[b], off, p.nbytes[v] or 0, t.dtype, t.shape)  # type: ignore[union-attr]
        for op in np.flatnonzero(g.op_kind == CONST.id).tolist():
            v = int(g.op_outputs(op)[0])
            self.slots[v] = g.constant_of(op)
            self.valid[v] = True
        self._step_of_value: dict[int, int] = {}
        for i, step in enumerate(compiled.program):
            for v in step[2]:
                self._step_of_value[v] = i
        self._clobbers = self._overlaps()

    def _overlaps(self) -> dict[int, list[int]]:
        """For each planned value, the values (views included) whose bytes overlap its own."""
        p = self.compiled.plan
        root = p.extra.get("alias_root", {})
        items = [(b, off, off + align(p.nbytes[v] or 0), v) for v, (b, off) in p.placement.items()]
        for y, r in root.items():
            if r in p.placement:
                b, off = p.placement[r]
                items.append((b, off, off + align(p.nbytes[r] or 0), y))
        items.sort()
        out: dict[int, list[int]] = {v: [] for *_x, v in items}
        for i, (b, _o, oe, v) in enumerate(items):
            for b2, o2, _oe2, v2 in items[i + 1:]:
                if b2 != b or o2 >= oe:
                    break
                if root.get(v, v) != root.get(v2, v2):  # a value and its views do not clobber each other
                    out[v].append(v2)
                    out[v2].append(v)
        return out

    def set(self, key: Any, data: Any) -> None:
        """Give an input a new value; only its descendants become invalid (no copy is made)."""
        with self._lock:
            g = self.graph
            v = input_id(g, key, verb="set")
            self.slots[v] = coerce_feed(g, v, data)
            desc = np.flatnonzero(g.descendants([v])).tolist()
            for d in desc:
                self.valid[d] = False
            self.valid[v] = True

    def get(self, key: Any) -> np.ndarray:
        """The value of ``key`` (a copy), recomputing only what is invalid; free if still valid."""
        with self._lock:
            g = self.graph
            t = value_id(g, key)
            if not self.valid[t]:
                if g.value_producer[t] == -1:
                    raise ExecutionError(f"input {g.value_label(t)} was not set")
                if t not in self._step_of_value:
                    raise ExecutionError(f"{g.value_label(t)} is not computed by this compiled graph")
                self._refresh(t)
            return np.array(self.slots[t], copy=True)

    def _refresh(self, target: int) -> None:
        prog = self.compiled.program
        chosen = {self._step_of_value[target]}
        while True:  # grow the set of steps until every input is valid when its consumer runs
            valid = list(self.valid)
            missing: set[int] = set()
            for i in sorted(chosen):
                _fn, ins, outs, *_ = prog[i]
                for v in ins:
                    if not valid[v]:
                        s = self._step_of_value.get(v)
                        if s is None:
                            raise ExecutionError(f"input {self.graph.value_label(v)} was not set")
                        missing.add(s)
                self._mark(valid, outs)
            if not missing:
                break
            chosen |= missing
        steps = [prog[i] for i in sorted(chosen)]
        for step in steps:
            self.compiled._execute(self.slots, [step])
            self.kernel_calls += 1
            self._mark(self.valid, step[2])

    def _mark(self, valid: list[bool], outs: tuple[int, ...]) -> None:
        for o in outs:
            for c in self._clobbers.get(o, ()):
                valid[c] = False
        for o in outs:
            valid[o] = True

    def update(self) -> None:
        """Apply the update edges: each destination input takes its source's current value."""
        with self._lock:
            news = [(dst, self.get(src)) for src, dst in self.compiled.updates]
            for dst, arr in news:
                self.set(dst, arr)
