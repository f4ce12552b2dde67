"""What every backend is: a capability set, a rule table, and a compiler from a graph to one callable.

A backend (ONNX Runtime's execution providers and PyTensor's linkers are the
models) declares

* its **capability set**: the op kinds it has a rule for, the dtypes it
  runs, and per-kind limits (:meth:`Backend.why_not` says why an op is not
  supported, :meth:`Backend.supports` asks yes or no);
* its **rule table**: op kind -> a *rule factory* called once per op at
  compile time with the op's static facts (:class:`OpInfo`) and returning the
  callable that computes the op on the backend's arrays. A Backend is a
  :class:`~opgraph.core.ruletable.RuleTable`: every engine registers its rules
  and limits with the same two decorators, ``@BACKEND.rule(kind, ...)`` and
  ``@BACKEND.limit(kind, ...)``, in the module of its package named after the
  op's family (``backends/torch/elementwise.py`` holds torch's elementwise
  rules), as PyTensor lays out ``link/jax/dispatch/``;
* its **compiler** (:meth:`Backend.compile_graph`): a whole graph whose
  every op it supports -> an :class:`Executable` taking the graph's inputs in
  order and returning its outputs in order, as the backend's own arrays.

The JAX and PyTorch backends share :func:`straight_line`: the graph becomes
the source of one Python function of rule calls (as torch.fx's code
generation does), which ``jax.jit`` or ``torch.compile`` then compile whole.

    >>> import numpy as np, opgraph
    >>> from opgraph.backends.base import OpInfo, straight_line
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2,)), name="x")
    >>> b.output(b.op("exp", b.op("multiply", x, 2.0)))
    >>> fn, consts, src = straight_line(b.freeze(), lambda op: getattr(np, op.kind))
    >>> print(src)
    def program(c, a0):
        v2 = f1(a0, c[0])
        v3 = f2(v2)
        return (v3,)
    >>> fn(consts, np.zeros(2))
    (array([1., 1.]),)

Adding a rule to an engine
--------------------------
One decorated function in the engine's module named after the op's family
(``get_op(kind).family``), registered on the engine's ``BACKEND``:
``@BACKEND.rule("logaddexp")`` over a factory ``OpInfo -> callable`` in
``backends/torch/elementwise.py``; ``@BACKEND.limit("logaddexp")`` for the
cases it cannot run (the partitioner sends those ops to numpy and
``explain()`` quotes the reason). ``tests/test_layout.py`` checks where
every rule stands; the op suite (``tests/test_backend_ops_<engine>.py``)
compares every claimed op with NumPy.

Adding an engine
----------------
A package ``backends/<engine>/``: ``__init__.py`` holds the
:class:`Backend` subclass (:meth:`Backend.compile_graph` returning an
:class:`Executable`; ``from_numpy``/``to_numpy`` for its arrays) and
``BACKEND``, and imports its family modules at its end, where the rules are
registered; name it in :mod:`opgraph.backends` (``_MODULES``, and the
package it needs), add ``tests/test_backend_ops_<engine>.py`` (three lines,
as the others) and the extra in ``pyproject.toml``. The smallest engine,
registered for the session, runs what it has and leaves the rest to numpy:

    >>> from opgraph import backends
    >>> class Echo(Backend):
    ...     def compile_graph(self, graph, *, device=None, donate=(), **options):
    ...         fn, consts, _ = straight_line(graph, lambda info: self.rules[info.kind](info))
    ...         return lambda args: list(fn(consts, *args))
    >>> echo = Echo("doc_echo", dtypes=frozenset({"float64"}))
    >>> @echo.rule("exp")
    ... def exp_rule(info):
    ...     return np.exp
    >>> _ = backends.register(echo)
    >>> f = opgraph.compile(b.freeze(), backend="doc_echo")
    >>> f(x=np.zeros(2))[0], [(kind, where) for _op, kind, where, _why in f.placement()]
    (array([1., 1.]), [('multiply', 'numpy'), ('exp', 'doc_echo')])
    >>> backends.unregister("doc_echo")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from opgraph.core.builder import GraphBuilder
from opgraph.core.feeds import coerce_feed
from opgraph.core.graph import Graph
from opgraph.core.opinfo import OpInfo
from opgraph.core.registry import CONST, get_op
from opgraph.core.ruletable import RuleTable
from opgraph.core.subgraph import Subgraph, bodies_in
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import GraphError

RuleFactory = Callable[["OpInfo"], Callable[..., Any]]
"""op facts -> the callable computing that op on the backend's arrays."""
Limit = Callable[["OpInfo"], "str | None"]
"""op facts -> why the backend cannot run this op (None: it can)."""


class BackendError(GraphError, ValueError):
    """A backend cannot be used: unknown, not installed, or missing an op with partitioning off.

    Also a ``ValueError`` (the ``backend=``, ``device=`` or option value given cannot be used), so NumPy's habit of
    ``except ValueError`` catches it.

    >>> issubclass(BackendError, ValueError)
    True
    """


FLOAT_KINDS = frozenset("fc")


Operands = Callable[[Sequence[np.ndarray]], np.ndarray]
"""an op's operands (broadcast together) -> where a declared difference may show."""


def near_subnormal(xs: Sequence[np.ndarray]) -> np.ndarray:
    """Where an operand is subnormal or so close above the subnormal range that an op's intermediates underflow
    (nonzero and below 2**nmant times the smallest normal number).

    >>> near_subnormal([np.array([5e-324, 1e-300, 0.5, 0.0])])
    array([ True,  True, False, False])
    """
    out = np.zeros(np.broadcast_shapes(*(np.shape(x) for x in xs)), dtype=bool)
    for x in xs:
        if x.dtype.kind == "f":
            fi = np.finfo(x.dtype)
            out |= (x != 0) & (np.abs(x) < float(fi.smallest_normal) * 2.0 ** fi.nmant)
    return out


def extreme(xs: Sequence[np.ndarray]) -> np.ndarray:
    """Where an operand is NaN, infinite or zero, or of a magnitude whose square underflows (below the square root
    of the smallest normal number) or whose integer part is not exact (at least 2**nmant).

    >>> extreme([np.array([np.nan, 0.0, 5e-324, 1e-300, 1e30, 0.5, 1e15])])
    array([ True,  True,  True,  True,  True, False, False])
    """
    out = np.zeros(np.broadcast_shapes(*(np.shape(x) for x in xs)), dtype=bool)
    for x in xs:
        if x.dtype.kind == "f":
            fi = np.finfo(x.dtype)
            with np.errstate(invalid="ignore"):
                mag = np.abs(x)
                out |= ~((mag >= np.sqrt(fi.smallest_normal)) & (mag < 2.0 ** fi.nmant))
    return out


@dataclass(frozen=True)
class NumericsDifference:
    """One way an engine's results differ from NumPy's, declared by the engine (:attr:`Backend.numerics`).

    ``tag`` names it (the token ``backend="auto"``'s ``allow_numerics`` takes), ``inputs`` says in words the
    input class where it shows and ``where`` computes it (operands -> mask; the edge-value suite,
    tests/test_engine_edges.py, checks that the engine differs from NumPy nowhere else), ``effect`` what happens
    there. It concerns the ops with a floating-point input or output of the ``kinds`` listed (None: every such op
    but those of the ``exempt`` kinds and families, which only move or inspect values), of ``dtypes`` (None: all),
    on ``devices``.

    >>> ftz = NumericsDifference("ftz", "subnormal operands", "read as zero", where=near_subnormal,
    ...                          exempt=frozenset({"shape"}))
    >>> from opgraph.core.types import TensorType
    >>> f8 = TensorType("float64", (2,))
    >>> ftz.applies(OpInfo("multiply", {}, (f8, f8), (f8,)), "cpu"), ftz.applies(OpInfo("reshape", {}, (f8,), (f8,)))
    (True, False)
    >>> ftz.applies(OpInfo("multiply", {}, (f8, f8), (f8,)), "cuda:0")
    False
    """

    tag: str
    inputs: str
    effect: str
    where: Operands = field(compare=False)
    kinds: frozenset[str] | None = None
    exempt: frozenset[str] = frozenset()
    dtypes: frozenset[str] | None = None
    devices: tuple[str, ...] = ("cpu",)

    def applies(self, info: OpInfo, device: str | None = None) -> bool:
        """True when this difference concerns the op described by ``info`` on ``device`` (None: the default)."""
        if device is not None and device.split(":")[0] not in self.devices:
            return False
        return self.concerns_kind(info.kind) and any(self.concerns_type(t) for t in (*info.in_types, *info.out_types))

    def concerns_kind(self, kind: str) -> bool:
        """True when ops of ``kind`` may be concerned (with an input or output of a type it concerns).

        >>> NumericsDifference("x", "", "", near_subnormal, exempt=frozenset({"shape"})).concerns_kind("reshape")
        False
        """
        if self.kinds is not None:
            return kind in self.kinds
        return kind not in self.exempt and _family(kind) not in self.exempt

    def concerns_type(self, t: Any) -> bool:
        """True when a value of type ``t`` (a floating-point tensor of :attr:`dtypes`) is concerned.

        >>> from opgraph.core.types import TensorType
        >>> d = NumericsDifference("x", "", "", near_subnormal, dtypes=frozenset({"float32"}))
        >>> d.concerns_type(TensorType("float32", ())), d.concerns_type(TensorType("float64", ()))
        (True, False)
        """
        return (isinstance(t, TensorType) and t.dtype.kind in FLOAT_KINDS
                and (self.dtypes is None or t.dtype.name in self.dtypes))

    def ops(self) -> str:
        """The ops it concerns, in words.

        >>> NumericsDifference("x", "", "", near_subnormal, kinds=frozenset({"log1p", "expm1"})).ops()
        'expm1, log1p'
        """
        if self.kinds is not None:
            text = ", ".join(sorted(self.kinds))
        else:
            text = "every op computing on floats" + (f" (not {', '.join(sorted(self.exempt))})" if self.exempt else "")
        return text + (f"; {', '.join(sorted(self.dtypes))} only" if self.dtypes else "")

    def note(self) -> str:
        """One line: the tag, where it shows and what happens.

        >>> NumericsDifference("ftz", "subnormal operands", "read as zero", near_subnormal).note()
        'ftz (cpu): subnormal operands: read as zero'
        """
        return f"{self.tag} ({', '.join(self.devices)}): {self.inputs}: {self.effect}"


def _family(kind: str) -> str:
    try:
        return get_op(kind).family
    except (KeyError, GraphError):
        return ""


class Executable:
    """A graph compiled by one backend: ``exe(args) -> outputs``, both in the backend's arrays.

    ``args`` follow ``graph.inputs`` and the results ``graph.outputs``.
    """

    def __call__(self, args: Sequence[Any]) -> list[Any]:
        raise NotImplementedError


@dataclass
class Backend(RuleTable):
    """One engine opgraph can run graphs on (see the module doc).

    ``dtypes`` are the dtype names it runs (every input and output of a
    claimed op must have one); ``limits`` narrow a kind further.
    ``module`` is the Python package it needs and ``extra`` the pip extra
    that installs it.
    """

    name: str
    rules: dict[str, RuleFactory] = field(default_factory=dict)
    dtypes: frozenset[str] = frozenset()
    limits: dict[str, Limit] = field(default_factory=dict)
    module: str = ""
    extra: str = ""
    devices: tuple[str, ...] = ("cpu",)
    doc: str = ""
    numerics: tuple[NumericsDifference, ...] = ()
    """Where this engine's results differ from NumPy's (docs/backends.md tabulates them; ``explain()`` names them
    for the ops of a graph; ``backend="auto"`` leaves the engine out of graphs they touch unless allowed)."""
    lowers_bodies: ClassVar[bool] = False
    """Whether control-flow bodies are lowered before they are checked and compiled (see :meth:`prepare_body`)."""

    # ---------------------------------------------------------------- capability
    def kinds(self) -> frozenset[str]:
        """The op kinds this backend has a rule for.

        >>> "add" in get_numpy().kinds()
        True
        """
        return frozenset(self.rules)

    def why_not(self, info: OpInfo) -> str | None:
        """Why this backend cannot run the op described by ``info`` (None when it can).

        >>> from opgraph.core.types import TensorType
        >>> get_numpy().why_not(OpInfo("add", {}, (TensorType("f8", ()),) * 2, (TensorType("f8", ()),)))
        """
        if info.kind not in self.rules:
            return f"{self.name} has no rule for {info.kind!r}"
        for t in (*info.in_types, *info.out_types):
            if not isinstance(t, TensorType):
                return f"{self.name} runs tensors only, not {t}"
            if self.dtypes and t.dtype.name not in self.dtypes:
                return f"{self.name} does not run {t.dtype.name}"
        limit = self.limits.get(info.kind)
        why = limit(info) if limit is not None else None
        return why if why is not None else self.why_not_bodies(info)

    def why_not_bodies(self, info: OpInfo) -> str | None:
        """Why this backend cannot run the bodies of a control-flow op (None: it runs every op of each).

        A control op runs on a backend only with its bodies (they are lowered to the engine's own
        ``cond``/``while_loop``/``scan``), so every op of every body (as :meth:`prepare_body` gives it)
        must be supported; the answer names the body and the op. Cached per body.

        >>> get_numpy().why_not_bodies(OpInfo("exp", {}, (), ()))
        """
        for value in info.attrs.values():
            for body in bodies_in(value):
                why = body.cache(("why_not", self.name, id(self)), lambda body=body: self._body_why_not(body))
                if why is not None:
                    return why  # type: ignore[no-any-return]
        return None

    def _body_why_not(self, body: Subgraph) -> str | None:
        g = self.prepare_body(body)
        for op in range(g.num_ops):
            if g.op_kind[op] == CONST.id:
                continue
            why = self.why_not(OpInfo.of(g, op))
            if why is not None:
                return f"body {body.label} op {op} ({g.kind_of(op)}): {why}"
        return None

    def prepare_body(self, body: Subgraph) -> Graph:
        """The graph of ``body`` as this backend checks and compiles it: the body's own graph, or with
        :attr:`lowers_bodies` its lowered form (:func:`lowered_body`), as the top-level graph is compiled
        (so a fused op in a loop body still runs on the backend).

        >>> import opgraph
        >>> from opgraph.core.subgraph import Subgraph
        >>> sb = opgraph.GraphBuilder(); x = sb.input(("float64", (2,)), name="x"); sb.output(sb.op("silu", x))
        >>> body = Subgraph(sb.freeze())
        >>> get_numpy().prepare_body(body) is body.graph
        True
        >>> class Lowering(Backend):
        ...     lowers_bodies = True
        >>> g = Lowering("doc", rules=dict.fromkeys(("sigmoid", "multiply"), np.add)).prepare_body(body)
        >>> [g.kind_of(op) for op in range(g.num_ops)]
        ['sigmoid', 'multiply']
        """
        return lowered_body(self, body) if self.lowers_bodies else body.graph

    def claims(self, graph: Graph) -> bool:
        """True when this backend runs every op of ``graph`` and says so in one vectorised look, so compiling
        skips lowering and the op-by-op placement (an engine for graphs of 10^6 small ops needs that); False:
        ask op by op (:meth:`why_not`), as every engine but numba does.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (2,))); b.output(b.op("exp", x))
        >>> get_numpy().claims(b.freeze())
        False
        """
        return False

    def first_compile_seconds(self) -> float:
        """Seconds of one-off work this engine's next compile would do before any graph's own (numba compiling
        its interpreter where no cached copy is on disk): ``backend="auto"`` adds them to its compile estimate,
        so a first use that would overrun the budget is not started. 0.0 for engines without such a cost.

        >>> get_numpy().first_compile_seconds()
        0.0
        """
        return 0.0

    def supports(self, kind: str, in_types: Sequence[Any] | None = None, out_types: Sequence[Any] | None = None,
                 attrs: Mapping[str, Any] | None = None) -> bool:
        """True when this backend runs ``kind``; with types (and attrs), for those types.

        Without types only the rule table is asked.

        >>> get_numpy().supports("matmul"), get_numpy().supports("no_such_kind")
        (True, False)
        """
        if in_types is None:
            return kind in self.rules
        its = tuple(TensorType(*t) if isinstance(t, tuple) else t for t in in_types)
        ots = tuple(TensorType(*t) if isinstance(t, tuple) else t for t in (out_types or its[:1]))
        return self.why_not(OpInfo(kind, dict(attrs or {}), its, ots)) is None

    # ---------------------------------------------------------------- availability
    def available(self) -> bool:
        """True when the package this backend needs can be imported."""
        return self.unavailable_reason() is None

    def unavailable_reason(self) -> str | None:
        """Why the backend cannot be used here (None when it can)."""
        if not self.module:
            return None
        import importlib.util

        if importlib.util.find_spec(self.module) is None:
            return (f"backend {self.name!r} needs the {self.module!r} package: "
                    f"pip install \"opgraph[{self.extra or self.module}]\"")
        return None

    def check_device(self, device: str | None) -> str:
        """The device to run on (``None``: the backend's default); raises when it is not present."""
        if device is None:
            return self.devices[0]
        kind = device.split(":")[0]
        if kind not in self.devices:
            raise BackendError(f"backend {self.name!r} runs on {', '.join(self.devices)}, not {device!r}")
        return device

    # ---------------------------------------------------------------- compiling
    def compile_graph(self, graph: Graph, *, device: str | None = None, donate: Sequence[int] = (),
                      **options: Any) -> Executable:
        """Compile ``graph`` (every op supported) into one :class:`Executable`.

        ``donate`` lists input positions whose buffers the executable may
        reuse for its outputs (update-edge state the runtime will not read again).
        """
        raise NotImplementedError

    def caveat(self, info: OpInfo) -> str | None:
        """How this backend runs an op it claims, where the user should know (None: nothing to say).

        :meth:`Program.explain <opgraph.runtime.compiled.Program.explain>` lists these; the dask backend
        says which ops run as one task on whole inputs rather than chunk by chunk.

        >>> get_numpy().caveat(OpInfo("exp", {}, (), ())) is None
        True
        """
        return None

    def numerics_for(self, info: OpInfo, device: str | None = None) -> list[NumericsDifference]:
        """The declared differences from NumPy (:attr:`numerics`) that concern this op on ``device``.

        >>> get_numpy().numerics_for(OpInfo("exp", {}, (), ()))
        []
        """
        return [d for d in self.numerics if d.applies(info, device)]

    def differs_from_numpy(self, graph: Graph, device: str | None = None) -> dict[str, list[int]]:
        """Tag of each declared difference from NumPy that concerns an op of ``graph`` -> those ops.

        Free for an engine without declared differences; otherwise one look at each op of a kind it may concern.

        >>> import opgraph
        >>> b = opgraph.GraphBuilder(); x = b.input(("float64", (2,))); b.output(b.op("exp", x))
        >>> get_numpy().differs_from_numpy(b.freeze())
        {}
        """
        if not self.numerics:
            return {}
        device = device or self.devices[0]
        n = graph.num_ops
        # vectorised over ops (a scan per op would cost as much as a compile on a large graph): an op is concerned
        # when its kind is and one of its inputs or outputs has a concerned type
        edge_op = {side: np.repeat(np.arange(n), np.diff(getattr(graph, f"{side}_ptr"))) for side in ("in", "out")}
        kinds = np.unique(graph.op_kind).tolist()
        found: dict[str, list[int]] = {}
        for d in self.numerics:
            if device.split(":")[0] not in d.devices:
                continue
            type_ok = np.array([d.concerns_type(t) for t in graph.types] + [False], dtype=bool)
            kind_ok = {k for k in kinds if k != CONST.id and d.concerns_kind(get_op(k).name)}
            if not type_ok.any() or not kind_ok:
                continue
            value_ok = type_ok[graph.value_type]
            op_ok = np.zeros(n, dtype=bool)
            for side in ("in", "out"):
                op_ok[edge_op[side][value_ok[getattr(graph, f"{side}_ids")]]] = True
            op_ok &= np.isin(graph.op_kind, list(kind_ok))
            if op_ok.any():
                found.setdefault(d.tag, []).extend(np.nonzero(op_ok)[0].tolist())
        return {tag: sorted(set(ops)) for tag, ops in found.items()}

    def doc_cell(self, kind: str) -> str | None:
        """How docs/backends.md's op table describes ``kind`` on this backend, where its rule table does not
        say it all (None: by the rule table, as tools/gen_ops_doc.py reads it).

        >>> get_numpy().doc_cell("exp") is None
        True
        """
        return None

    def adopt_feed(self, data: Any, t: ValueType, label: str) -> Any | None:
        """A feed taken as this backend's own array without converting it to NumPy (None: convert it as usual).

        The dask backend takes dask and zarr arrays and file memmaps as they are, so a feed larger than
        memory is never read whole; ``label`` names the input in errors.

        >>> get_numpy().adopt_feed([1.0], TensorType("f8", (1,)), "%x") is None
        True
        """
        return None

    def finish(self, results: Sequence[Any], states: Sequence[Any], options: Mapping[str, Any],
               kind: str = "numpy", device: str | None = None) -> tuple[list[Any], list[Any]]:
        """A call's results as arrays of ``kind`` (``"numpy"``, ``"jax"``, ``"torch"``) on ``device`` and its new
        update-edge state as this backend keeps it.

        Called once per call with every result and state computed on this backend, so an engine that
        evaluates lazily (dask) computes them in one pass; ``options`` are the program's compile options.

        >>> get_numpy().finish([np.zeros(1)], [], {})
        ([array([0.])], [])
        """
        return [self.export(r, kind, device) for r in results], list(states)

    def export(self, array: Any, kind: str = "numpy", device: str | None = None) -> Any:
        """This backend's array as an array of ``kind`` on ``device``: its own kind stays as it is (moved where
        ``device`` says), others cross by :func:`opgraph.backends.arrays.convert` (DLPack, NumPy views).

        >>> get_numpy().export(np.zeros(1))
        array([0.])
        """
        from opgraph.backends import arrays

        if kind == self.name:
            return self.as_own(array, device)
        own = array if arrays.kind_of(array) is not None else self.to_numpy(array)
        return arrays.convert(own, kind, device)

    def owns(self, device: str | None) -> Callable[[Any, np.dtype, tuple[int, ...]], bool] | None:
        """A check that an array can go to this engine's executables on ``device`` as it is: of the engine's own
        array type, dtype and shape (and device), so a program's direct call may skip the feed rule (None: no
        array is taken that way; the numpy engine's arena has its own direct call).

        >>> get_numpy().owns("cpu") is None
        True
        """
        return None

    def as_own(self, array: Any, device: str | None = None) -> Any:
        """A NumPy, jax or torch array as this backend's own array on ``device`` (None: where the array is, or the
        backend's default), without a copy where the engines allow it; the numpy backend gives NumPy arrays.

        >>> a = np.zeros(2); get_numpy().as_own(a) is a
        True
        """
        from opgraph.backends import arrays

        return self.from_numpy(np.asarray(arrays.to_numpy(array)), device)

    def from_numpy(self, array: np.ndarray, device: str | None = None) -> Any:
        """A NumPy array as this backend's array."""
        return array

    def to_numpy(self, array: Any) -> np.ndarray:
        """This backend's array as a NumPy array (possibly sharing memory)."""
        return np.asarray(array)

    def __repr__(self) -> str:
        return f"<backend {self.name}: {len(self.rules)} op kinds>"


def input_dtypes(graph: Graph) -> list[np.dtype | None]:
    """The dtype each input of ``graph`` declares (None for a non-tensor input), for :func:`conform_args`.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); _ = b.input(("int8", (2,)))
    >>> input_dtypes(b.freeze())
    [dtype('int8')]
    """
    return [t.dtype if isinstance(t := graph.type_of(v), TensorType) else None for v in graph.inputs.tolist()]


def conform_args(graph: Graph, dtypes: Sequence[np.dtype | None], args: Sequence[Any]) -> Sequence[Any]:
    """An executable's arguments, each one whose dtype is not its input's converted by the feed rule.

    The rule is :mod:`opgraph.core.feeds`' (values must survive; a lossy conversion is a
    :class:`~opgraph.errors.FeedError` naming the input). Arguments of the right dtype
    (NumPy or the backend's own arrays) pass untouched, at the cost of one comparison each.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); _ = b.input(("int8", (2,)), name="x"); g = b.freeze()
    >>> conform_args(g, input_dtypes(g), [[1, 2]])
    [array([1, 2], dtype=int8)]
    """
    for a, dt in zip(args, dtypes, strict=False):
        if dt is not None and not has_dtype(a, dt):
            break
    else:
        return args
    return [a if dt is None or has_dtype(a, dt) else coerce_feed(graph, v, a)
            for a, dt, v in zip(args, dtypes, graph.inputs.tolist(), strict=False)]


def has_dtype(a: Any, dt: np.dtype) -> bool:
    """True when ``a`` is an array (NumPy's or an engine's) of dtype ``dt``.

    Not ``getattr(a, "dtype", None) == dt``: NumPy reads ``None`` as float64, so a Python list would pass as one.

    >>> has_dtype([1.0], np.dtype("float64")), has_dtype(np.zeros(1), np.dtype("float64"))
    (False, True)
    """
    got = getattr(a, "dtype", None)
    return got is not None and got == dt


def get_numpy() -> Backend:
    """The numpy backend (a shortcut for defaults and examples).

    >>> get_numpy().name
    'numpy'
    """
    from opgraph.backends import get

    return get("numpy")


def unsupported_ops(graph: Graph, backend: Backend) -> dict[int, str]:
    """Op -> why ``backend`` cannot run it, for every op it cannot run (constants always run).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2,)))
    >>> b.output(b.op("exp", x))
    >>> unsupported_ops(b.freeze(), get_numpy())
    {}
    """
    out: dict[int, str] = {}
    for op in range(graph.num_ops):
        if graph.op_kind[op] == CONST.id:
            continue
        why = backend.why_not(OpInfo.of(graph, op))
        if why is not None:
            out[op] = why
    return out


def straight_line(graph: Graph, rule_for: Callable[[OpInfo], Callable[..., Any]], *,
                  fix: Callable[[Any, ValueType], Any] | None = None, fix_ops: Any = None,
                  name: str = "program", release: bool = False) -> tuple[Callable[..., Any], list[np.ndarray], str]:
    """Generate one Python function computing ``graph``: ``fn(consts, *inputs) -> outputs``.

    Each op becomes one line calling the callable its rule made; constants
    are read from ``consts`` (returned as NumPy arrays, for the backend to
    convert once). With ``fix``, the result of every op in ``fix_ops``
    (default: every op) is passed through ``fix(result, declared_type)``,
    which backends use to match the declared dtype where their promotion
    rules differ from NumPy's. With ``release``, a ``del`` drops each
    intermediate after its last use, so an eager engine frees (and its
    allocator reuses) the memory of dead values during the call instead of
    holding every intermediate until it returns. Returns ``(fn, consts, source)``.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2,)), name="x")
    >>> b.output(b.op("sin", b.op("exp", x)))
    >>> print(straight_line(b.freeze(), lambda op: getattr(np, op.kind), release=True)[2])
    def program(c, a0):
        v1 = f0(a0)
        v2 = f1(v1)
        del v1
        return (v2,)
    """
    # under opgraph's name, so the tests' error::DeprecationWarning:opgraph.* filter covers the generated code
    env: dict[str, Any] = {"__name__": "opgraph.backends.generated"}
    names: dict[int, str] = {}
    consts: list[np.ndarray] = []
    params = []
    for i, v in enumerate(graph.inputs.tolist()):
        names[v] = f"a{i}"
        params.append(f"a{i}")
    lines = [f"def {name}(c{''.join(', ' + p for p in params)}):"]
    if fix is not None:
        env["fix"] = fix
    order = graph.topological_order().tolist()
    last_use: dict[int, int] = {}  # value -> the position in ``order`` of its last reader
    if release:
        for pos, op in enumerate(order):
            for v in graph.op_inputs(op).tolist():
                last_use[v] = pos
        for v in graph.outputs.tolist():
            last_use[v] = len(order)  # returned: never released
    for pos, op in enumerate(order):
        outs = graph.op_outputs(op).tolist()
        if graph.op_kind[op] == CONST.id:
            names[outs[0]] = f"c[{len(consts)}]"
            consts.append(graph.constant_of(op))
            continue
        info = OpInfo.of(graph, op)
        fname = f"f{op}"
        env[fname] = rule_for(info)
        args = ", ".join(names[int(v)] for v in graph.op_inputs(op))
        call = f"{fname}({args})"
        for v in outs:
            names[v] = f"v{v}"
        fixing = fix is not None and (fix_ops is None or op in fix_ops)
        if len(outs) == 1:
            if fixing:
                env[f"t{outs[0]}"] = graph.type_of(outs[0])
                call = f"fix({call}, t{outs[0]})"
            lines.append(f"    v{outs[0]} = {call}")
        elif outs:
            lines.append(f"    r{op} = {call}")
            for k, v in enumerate(outs):
                if fixing:
                    env[f"t{v}"] = graph.type_of(v)
                    lines.append(f"    v{v} = fix(r{op}[{k}], t{v})")
                else:
                    lines.append(f"    v{v} = r{op}[{k}]")
            if release:
                lines.append(f"    del r{op}")
        if release:
            # this op's inputs read for the last time, and its results nothing reads
            dead = [names[v] for v in dict.fromkeys(graph.op_inputs(op).tolist()) if last_use.get(v) == pos
                    and names[v][0] == "v"]
            dead += [names[v] for v in outs if v not in last_use]
            if dead:
                lines.append(f"    del {', '.join(dead)}")
    rets = "".join(names[int(v)] + ", " for v in graph.outputs.tolist())
    lines.append(f"    return ({rets.rstrip(' ')})" if rets else "    return ()")
    source = "\n".join(lines)
    code = compile(source, f"<opgraph {name}>", "exec")
    exec(code, env)  # the source is generated above from op ids alone: no user text reaches it
    return env[name], consts, source


def region_graph(graph: Graph, ops: Sequence[int], inputs: Sequence[int], outputs: Sequence[int],
                 input_types: Mapping[int, ValueType] | None = None) -> Graph:
    """A standalone graph of ``ops`` (in order) of ``graph``: ``inputs`` become its inputs, ``outputs`` its outputs.

    Types are inferred again, so ``input_types`` may give concrete shapes for
    inputs of dynamic shape (one compiled variant per shape signature).

    >>> import opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (2,)), name="x")
    >>> y = b.op("exp", x); z = b.op("sin", y)
    >>> b.output(z)
    >>> print(region_graph(b.freeze(), [1], [y.id], [z.id]))
    graph(%0: f64[2]) {
      %1: f64[2] = sin(%0)
      return %1
    }
    """
    b = GraphBuilder(hash_cons=False)
    new: dict[int, Any] = {}
    for v in inputs:
        t = (input_types or {}).get(v, graph.type_of(v))
        new[v] = b.input(t, name=graph.name_of(v))  # the user's names, which engine options may refer to
    for op in ops:
        outs = graph.op_outputs(op).tolist()
        if graph.op_kind[op] == CONST.id:
            new[outs[0]] = b.constant(graph.constant_of(op))
            continue
        res = b.op(graph.kind_of(op), *[new[int(v)] for v in graph.op_inputs(op)], **graph.attrs_of(op))
        res = res if isinstance(res, tuple) else (res,)
        for v, r in zip(outs, res, strict=True):
            new[v] = r
    b.output(*[new[v] for v in outputs])
    return b.freeze()


def lowered_body(backend: Backend, body: Subgraph) -> Graph:
    """``body``'s graph with the ops ``backend`` lacks lowered into ops it has (:mod:`opgraph.passes.lower`,
    as :func:`opgraph.compile` does for the top-level graph); computed once per body and backend.

    A backend whose :meth:`Backend.prepare_body` returns this checks and compiles bodies in their lowered form.

    >>> import opgraph
    >>> from opgraph.core.subgraph import Subgraph
    >>> sb = opgraph.GraphBuilder(); x = sb.input(("float64", (2,)), name="x")
    >>> sb.output(sb.op("fma", x, x, 1.0))
    >>> no_fma = Backend("doc", rules=dict.fromkeys(("add", "multiply"), np.add))
    >>> [lowered_body(no_fma, Subgraph(sb.freeze())).kind_of(op) for op in (1, 2)]
    ['multiply', 'add']
    """
    def make() -> Graph:
        from opgraph.passes.lower import lower

        return lower(body.graph, lambda info: backend.why_not(info) is None).graph

    return body.cache(("lowered", backend.name, id(backend)), make)  # type: ignore[no-any-return]


def body_program(backend: Backend, body: Subgraph, rule_for: Callable[[OpInfo], Callable[..., Any]], *,
                 fix: Callable[[Any, ValueType], Any] | None = None,
                 tag: Any = None) -> tuple[Callable[..., Any], list[np.ndarray], str]:
    """:func:`straight_line` of ``body`` as ``backend`` prepares it, generated once per body, backend and ``tag``.

    How the JAX and PyTorch backends turn a body into a function of their arrays: ``fn(consts, *params)``
    returns the body's results as a tuple; nested control ops in the body call this again for theirs.

    >>> import opgraph
    >>> from opgraph.core.subgraph import Subgraph
    >>> sb = opgraph.GraphBuilder(); x = sb.input(("float64", (2,)), name="x"); sb.output(sb.exp(x))
    >>> fn, consts, _ = body_program(get_numpy(), Subgraph(sb.freeze()), lambda op: getattr(np, op.kind))
    >>> fn(consts, np.zeros(2))
    (array([1., 1.]),)
    """
    def make() -> tuple[Callable[..., Any], list[np.ndarray], str]:
        return straight_line(backend.prepare_body(body), rule_for, fix=fix, name="body")

    return body.cache(("program", backend.name, id(backend), tag), make)  # type: ignore[no-any-return]
