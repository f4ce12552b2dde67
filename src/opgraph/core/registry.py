"""The op registry: every op kind, its attributes, type rule, versions and kernels.

An op kind is an :class:`OpDef`. Families under ``opgraph.ops`` define the
built-in kinds and register them when imported; since ops sit above core in
the layers, this module only keeps and looks up what was registered, plus a
table of announced kinds (:func:`defer_ops`, filled by ``opgraph.ops``, which
``import opgraph`` imports) so that a family is imported the first time one
of its kinds is looked up. Users register their own kinds with
:func:`register_op`::

    >>> import numpy as np
    >>> import opgraph
    >>> from opgraph.core.registry import register_op, OpDef, get_op
    >>> from opgraph.core.types import TensorType
    >>> def cube_infer(in_types, attrs):
    ...     (t,) = in_types
    ...     return (t,)
    >>> cube = register_op(OpDef(
    ...     name="doc_cube", id=50001, arity=1, infer=cube_infer,
    ...     kernel=lambda x, out=None: np.power(x, 3, out=out),
    ...     elementwise=True, doc="x ** 3"))
    >>> get_op("doc_cube") is cube
    True
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(TensorType("float64", (3,)), name="x")
    >>> y = b.op("doc_cube", x)
    >>> b.run({x: np.array([1.0, 2.0, 3.0])}, [y])[0]
    array([ 1.,  8., 27.])

Ids 1-9999 are opgraph's own, 10001-30002 are reserved for TensCalc's
registered types, and user kinds should take ids of 40000 and above.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from opgraph.core.dtypes import DTYPE_CODES, as_dtype
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import OpBuildError, OpTypeError

Attrs = tuple[tuple[str, Any], ...]
"""Normalised attributes: ``(name, value)`` pairs in schema order (hashable)."""

InferFn = Callable[[tuple[ValueType, ...], dict[str, Any]], Sequence[ValueType]]
VersionFn = Callable[[tuple[ValueType, ...], dict[str, Any]], int]


class Emit(Protocol):
    """What an op's ``decompose`` writes with: an emitter whose values are whatever its user's are (value ids
    in ``opgraph.passes``' lowering, ONNX tensor names in the exporter, a builder's values in tests)."""

    def op(self, kind: str, *ins: Any, **attrs: Any) -> Any:
        """Append op ``kind`` on ``ins``; its output (or a tuple of outputs)."""

    def constant(self, value: Any, dtype: Any = None) -> Any:
        """A constant holding ``value`` (cast to ``dtype`` if given)."""

    def type_of(self, v: Any) -> ValueType:
        """The type of value ``v``."""


DecomposeFn = Callable[[Emit, Sequence[Any], Mapping[str, Any]], Any]
"""``fn(e, ins, attrs)``: emit an op's parts on ``e`` from its inputs and attributes; return its output (a
tuple for several), or None where this case has none (the op is then kept, or refused)."""

_REQUIRED = object()


def exact_key(value: Any) -> Any:
    """A hashable key that tells apart values Python calls equal (1, 1.0, True; 0.0, -0.0).

    Raises TypeError for values that have no exact key (arrays, unhashables).

    >>> exact_key(True) == exact_key(1), exact_key(0.0) == exact_key(-0.0)
    (False, False)
    """
    if isinstance(value, dict):
        value = tuple(sorted(value.items()))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(exact_key(v) for v in value))
    if value is None or isinstance(value, (str, int, float, complex, np.generic)):
        return (type(value).__name__, repr(value) if isinstance(value, (float, complex, np.generic)) else value)
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    if isinstance(value, Subgraph):
        return ("subgraph", value.key)
    raise TypeError(f"no exact key for {type(value).__name__}")


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, np.ndarray):
        return _freeze(value.tolist())
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return value
    raise OpTypeError(f"attribute value {value!r} is not a number, string, dtype or tuple of them")


# Attribute normalisers: each maps what a user may pass to one hashable,
# JSON-able canonical value, so equal attributes intern to one entry.
def attr_int(v: Any) -> int:
    """Normalise an integer attribute.

    >>> attr_int(np.int64(3))
    3
    """
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise OpTypeError(f"expected an integer, got {v!r}")
    return int(v)


def attr_ints(v: Any) -> tuple[int, ...]:
    """Normalise a tuple-of-ints attribute (a single int becomes a 1-tuple).

    >>> attr_ints([1, 2]), attr_ints(3)
    ((1, 2), (3,))
    """
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return (int(v),)
    return tuple(attr_int(x) for x in v)


def attr_axes(v: Any) -> tuple[int, ...] | None:
    """Normalise an ``axis`` attribute: None (all axes), an int or ints.

    >>> attr_axes(None), attr_axes(1), attr_axes((0, -1))
    (None, (1,), (0, -1))
    """
    return None if v is None else attr_ints(v)


def attr_float(v: Any) -> float:
    """Normalise a float attribute.

    >>> attr_float(1)
    1.0
    """
    return float(v)


def attr_bool(v: Any) -> bool:
    """Normalise a boolean attribute.

    >>> attr_bool(np.True_)
    True
    """
    if not isinstance(v, (bool, np.bool_)):
        raise OpTypeError(f"expected a bool, got {v!r}")
    return bool(v)


def attr_str(v: Any) -> str:
    """Normalise a string attribute.

    >>> attr_str("same")
    'same'
    """
    if not isinstance(v, str):
        raise OpTypeError(f"expected a string, got {v!r}")
    return v


def attr_dtype(v: Any) -> str:
    """Normalise a dtype attribute to its name.

    >>> attr_dtype(np.float32)
    'float32'
    """
    return as_dtype(v).name


def attr_any(v: Any) -> Any:
    """Normalise a nested structure of numbers/strings/None to tuples.

    >>> attr_any([[0, 1], [2, 3]])
    ((0, 1), (2, 3))
    """
    return _freeze(v)


def optional(norm: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Allow ``None`` besides what ``norm`` accepts.

    >>> optional(attr_int)(None), optional(attr_int)(2)
    (None, 2)
    """

    def normalise(v: Any) -> Any:
        return None if v is None else norm(v)

    return normalise


@dataclass(frozen=True)
class Attr:
    """Schema of one attribute: a normaliser and a default (``REQUIRED`` if none).

    >>> Attr(attr_int, 0).normalise(np.int8(4))
    4
    """

    norm: Callable[[Any], Any]
    default: Any = _REQUIRED
    doc: str = ""

    def normalise(self, value: Any) -> Any:
        """Apply the normaliser."""
        return self.norm(value)

    @property
    def required(self) -> bool:
        """True when the attribute has no default."""
        return self.default is _REQUIRED


def default_version(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> int:
    """The default version: the code of the promoted dtype of the inputs (0 if none).

    >>> default_version((TensorType("int8", ()), TensorType("float32", ())), {})
    11
    """
    dts = [t.dtype for t in in_types if isinstance(t, TensorType)]
    if not dts:
        return 0
    return DTYPE_CODES[np.result_type(*dts).name]


@dataclass(eq=False)
class OpDef:
    """One op kind.

    * ``name``, ``id``: unique; the id is stable (it is the type in .cg files).
    * ``arity``: number of inputs, or None for variadic (at least ``min_inputs``).
    * ``attrs``: the attribute schema, name -> :class:`Attr`.
    * ``infer(in_types, attrs) -> out_types``: the type rule; raises
      :class:`~opgraph.errors.OpTypeError` with a reason when inputs are bad.
    * ``version(in_types, attrs) -> int``: picks the version stored on the op
      (default: the promoted input dtype's code).
    * ``kernel``: the reference kernel, plain NumPy: ``fn(*arrays, out=None, **attrs)``
      returning an array (one output) or a tuple; ``out`` is a preallocated array
      (or tuple of them) to write into. ``kernels``: ``{version: fn}``, kernels of
      single versions, which win over ``kernel`` (:meth:`kernel_for`). An engine's
      own faster kernel is a rule of that engine (``@BACKEND.rule(kind)`` in
      ``opgraph.backends.numpy``), not part of the op.
    * flags: ``elementwise``, ``commutative``, ``inplace`` (the input
      positions whose buffer an output may overwrite).
    * ``grad``: the reverse-mode rule ``fn(b, inputs, outputs, cotangents, attrs) -> cotangent per input``.
    * ``jvp``: the forward-mode (tangent) rule ``fn(b, inputs, outputs, tangents, attrs) -> tangent per output``
      (a tangent is None where it is zero); a kind with a ``grad`` rule and no ``jvp`` rule gets its tangents by
      transposing the reverse rule (:mod:`opgraph.autodiff.forward`).
    * ``batch``: the batching rule ``fn(b, inputs, batched, size, attrs) -> outputs`` for ``vmap``: the inputs
      flagged in ``batched`` carry a leading batch axis of ``size``, and every output it returns carries one
      (None: the op runs once per example instead, :mod:`opgraph.autodiff.batching`).
    The three rules sit in the op's family module, set by :func:`set_rules` tables or ``OpDef(...)``.
    * ``workspace``: for an op that runs subgraphs, ``fn(attrs, peak_of) -> bytes`` it needs besides its
      inputs and outputs while it runs, given ``peak_of(body)`` (a body's planned peak); the memory
      planner counts it (None: no workspace).
    * ``decompose``: the op written with more basic ops (a :data:`DecomposeFn`
      ``fn(e, ins, attrs)`` emitting on an :class:`Emit`), or None. Lowering
      (``opgraph.passes.lower``) rewrites the op with it for a backend that
      lacks the op, and the ONNX exporter writes an op without an ONNX
      operator through it; it computes what the op's kernel computes.
    * ``traits``: facts about the kind that passes, planners and folders read, declared with
      :func:`mark_traits` in a table at the end of the op's family module (asked with :func:`has_trait`):

      - ``"view"``: the NumPy kernel may return a view of (alias) its first input when called without
        ``out`` (the memory planner gives the output its root's storage);
      - ``"compute_bound"``: an elementwise kind whose NumPy loop computes for longer than it moves memory
        (transcendental functions, division); the fusion cost model does not count it for wide dtypes;
      - ``"nondeterministic"``: its result must be drawn at run time (random ops): constant folding never
        runs it and loop-invariant hoisting never moves it;
      - ``"linear_time"``: its work is about linear in the elements it reads and writes (elementwise,
        reduction, shape and indexing ops; not contractions, linear algebra or convolutions): lazy arrays fold
        only these as they are built, where folding must cost no more than recording the op;
      - ``"no_fuse"``: never a step of a ``fused_elementwise`` program, although elementwise without
        attributes (:func:`opgraph.ops.fused.fusable`);
      - ``"promotes"``: computes in its result's dtype, its inputs promoted to it as NumPy does (an
        exporter to a format without implicit promotion, such as ONNX, casts the inputs first);
      - ``"truth_valued"``: computes on the truth of its inputs (any dtype, nonzero is true: NumPy's logical
        ops, ``any``, ``all``);
      - ``"comparison"``: compares its operands in their common dtype, giving bools.
    * ``fold_guard``: ``fn(attrs, args) -> bool``, whether constant folding may run the op on these known
      arguments (a loop folds only when its work at build time is bounded); None: it may.

    >>> get_op("fma").decompose is not None, get_op("add").decompose is None
    (True, True)
    """

    name: str
    id: int
    infer: InferFn
    arity: int | None = None
    min_inputs: int = 0
    attrs: Mapping[str, Attr] = field(default_factory=dict)
    kernel: Callable[..., Any] | None = None
    kernels: dict[int, Callable[..., Any]] = field(default_factory=dict)
    version: VersionFn = default_version
    elementwise: bool = False
    commutative: bool = False
    inplace: tuple[int, ...] = ()
    grad: Callable[..., Any] | None = None
    jvp: Callable[..., Any] | None = None
    batch: Callable[..., Any] | None = None
    family: str = "user"
    doc: str = ""
    decompose: DecomposeFn | None = None
    workspace: Callable[[Mapping[str, Any], Callable[[Any], int]], int] | None = None
    traits: frozenset[str] = frozenset()
    fold_guard: Callable[[Mapping[str, Any], Sequence[np.ndarray]], bool] | None = None

    def __post_init__(self) -> None:
        for key in self.kernels:
            if not isinstance(key, int) or isinstance(key, bool):
                raise TypeError(kernels_key_message(self.name, key))

    def kernel_for(self, version: int) -> Callable[..., Any]:
        """The reference kernel of ``version`` (a kernel of that version wins over :attr:`kernel`).

        >>> get_op("add").kernel_for(12) is get_op("add").kernel
        True
        """
        fn = self.kernels.get(version) or self.kernel
        if fn is None:
            raise NotImplementedError(f"op {self.name!r} has no kernel")
        return fn

    def normalise_attrs(self, raw: Mapping[str, Any]) -> Attrs:
        """Check names against the schema, fill defaults, normalise values.

        >>> get_op("sum").normalise_attrs({"axis": 1})
        (('axis', (1,)), ('keepdims', False))
        """
        unknown = set(raw) - set(self.attrs)
        if unknown:
            raise OpTypeError(
                f"unknown attribute(s) {sorted(unknown)}; {self.name} takes {sorted(self.attrs) or 'none'}"
            )
        out = []
        for key, spec in self.attrs.items():
            if key in raw:
                try:
                    value = spec.normalise(raw[key])
                except (TypeError, ValueError) as exc:
                    raise OpTypeError(f"attribute {key}={raw[key]!r}: {exc}") from None
            elif spec.required:
                raise OpTypeError(f"missing required attribute {key!r}")
            else:
                value = spec.default
            out.append((key, value))
        return tuple(out)

    def check_arity(self, n: int) -> None:
        """Raise OpTypeError when ``n`` inputs do not fit the arity."""
        if self.arity is not None and n != self.arity:
            raise OpTypeError(f"takes {self.arity} input(s), got {n}")
        if n < self.min_inputs:
            raise OpTypeError(f"takes at least {self.min_inputs} input(s), got {n}")


def kernels_key_message(name: str, key: Any) -> str:
    """What ``OpDef(kernels=...)`` says about a key that is not a version (the old per-backend form).

    >>> print(kernels_key_message("cube", "numpy"))  # doctest: +NORMALIZE_WHITESPACE
    op 'cube': kernels={'numpy': fn} is the old per-backend form; write OpDef(kernel=fn)
    (and kernels={version: fn} for a kernel of one version)
    >>> OpDef(name="cube", id=50009, infer=lambda t, a: t, kernels={"numpy": abs})
    Traceback (most recent call last):
    ...
    TypeError: op 'cube': kernels={'numpy': fn} is the old per-backend form; write OpDef(kernel=fn) ...
    """
    if isinstance(key, tuple) and len(key) == 2:
        return (f"op {name!r}: kernels={{{key!r}: fn}} is the old per-backend form; write "
                f"OpDef(kernels={{{key[1]!r}: fn}}) (and kernel=fn for every other version)")
    return (f"op {name!r}: kernels={{{key!r}: fn}} is the old per-backend form; write OpDef(kernel=fn) "
            f"(and kernels={{version: fn}} for a kernel of one version)")


_BY_NAME: dict[str, OpDef] = {}
_BY_ID: dict[int, OpDef] = {}

# Op kinds announced but not registered yet: name or id -> the module that defines them. A layer above fills
# these with defer_ops (opgraph.ops announces its families this way), so `import opgraph` need not import
# every family: the first lookup of a kind imports its module. An entry leaves when its kind registers.
_DEFERRED_BY_NAME: dict[str, str] = {}
_DEFERRED_BY_ID: dict[int, str] = {}
_IMPORTERS: dict[str, Callable[[str], object]] = {}


def defer_ops(table: Mapping[str, tuple[int, str]], import_module: Callable[[str], object]) -> None:
    """Announce op kinds that a module registers when it is imported, without importing it.

    ``table`` maps a kind's name to ``(id, module)``; ``import_module(module)``
    imports one (core imports nothing from the layers above, so the layer that
    owns the modules passes its importer). :func:`get_op` imports the module on
    the first lookup of one of its kinds, :func:`all_ops` imports every
    announced module, and :func:`register_op` imports the module that owns a
    name or id before registering another kind under it, so the clash is
    reported as if everything had been imported.

    >>> def import_module(module):  # stands for importlib.import_module
    ...     print("importing", module)
    ...     register_op(OpDef(name="doc_later", id=50003, arity=1, infer=lambda t, a: t))
    >>> defer_ops({"doc_later": (50003, "doc.family")}, import_module)
    >>> get_op(50003).name
    importing doc.family
    'doc_later'
    >>> get_op("doc_later").id
    50003
    """
    for name, (op_id, module) in table.items():
        _IMPORTERS[module] = import_module
        if name not in _BY_NAME:
            _DEFERRED_BY_NAME[name] = module
        if op_id not in _BY_ID:
            _DEFERRED_BY_ID[op_id] = module


_LOADING: set[str] = set()


def _load(module: str, *, wait: bool = True) -> None:
    # wait=True (a lookup): always ask the importer, which returns at once for an imported module and waits for
    # another thread that is importing it. wait=False (a registration): not for a module imported or being
    # imported, since that is usually the module registering its own kinds.
    if not wait and (module in sys.modules or module in _LOADING):
        return
    _LOADING.add(module)
    try:
        _IMPORTERS[module](module)
    finally:
        _LOADING.discard(module)


def _load_all() -> None:
    for module in sorted(set(_DEFERRED_BY_NAME.values()) | set(_DEFERRED_BY_ID.values())):
        _load(module)


def register_op(opdef: OpDef, *, replace: bool = False) -> OpDef:
    """Add an op kind to the registry and return it.

    Names and ids are unique; ``replace=True`` re-registers a kind with the
    same name and id (useful while developing a user op).

    >>> from opgraph.core.registry import register_op, OpDef
    >>> d = register_op(OpDef(name="doc_ident", id=50002, arity=1,
    ...                       infer=lambda t, a: t, kernel=lambda x, out=None: x))
    >>> d.id
    50002
    """
    for owner in {_DEFERRED_BY_NAME.get(opdef.name), _DEFERRED_BY_ID.get(opdef.id)} - {None}:
        _load(owner, wait=False)  # type: ignore[arg-type]
    old_name = _BY_NAME.get(opdef.name)
    old_id = _BY_ID.get(opdef.id)
    if not replace and (old_name is not None or old_id is not None):
        other = old_name or old_id
        raise ValueError(f"op {opdef.name!r} (id {opdef.id}) clashes with registered op "
                         f"{other.name!r} (id {other.id})")  # type: ignore[union-attr]
    if replace and old_name is not None and old_name.id != opdef.id:
        raise ValueError(f"op {opdef.name!r} is registered with id {old_name.id}, not {opdef.id}")
    if not (0 <= opdef.id < 2**31):
        raise ValueError(f"op id {opdef.id} out of range")
    _BY_NAME[opdef.name] = opdef
    _BY_ID[opdef.id] = opdef
    _DEFERRED_BY_NAME.pop(opdef.name, None)
    _DEFERRED_BY_ID.pop(opdef.id, None)
    return opdef


def get_op(kind: str | int | OpDef) -> OpDef:
    """Look up an op kind by name or id, importing the module that defines it on first use.

    >>> get_op("matmul").name, get_op(get_op("matmul").id).name
    ('matmul', 'matmul')
    """
    if isinstance(kind, OpDef):
        return kind
    found = _BY_NAME.get(kind) if isinstance(kind, str) else _BY_ID.get(int(kind))
    return found if found is not None else _get_deferred(kind)


TRAITS = frozenset({"view", "compute_bound", "nondeterministic", "linear_time", "no_fuse", "promotes", "truth_valued",
                    "comparison"})
"""The traits something reads (see :class:`OpDef`); :func:`mark_traits` refuses others, so a typo fails loudly."""


def mark_traits(trait: str, *kinds: str) -> frozenset[str]:
    """Give each of ``kinds`` the trait ``trait``; return the kinds (a family module's table of its ops' facts).

    Each family module ends with its table, one call per trait, in the manner of tinygrad's ``GroupOp`` sets
    beside its op list.

    >>> _ = register_op(OpDef(name="doc_draw", id=50004, arity=0, infer=lambda t, a: ()))
    >>> mark_traits("nondeterministic", "doc_draw")
    frozenset({'doc_draw'})
    >>> has_trait("doc_draw", "nondeterministic"), has_trait("add", "nondeterministic")
    (True, False)
    >>> mark_traits("slow", "doc_draw")
    Traceback (most recent call last):
    ...
    ValueError: unknown op trait 'slow' (known: comparison, compute_bound, linear_time, no_fuse, nondeterministic, ...)
    """
    if trait not in TRAITS:
        raise ValueError(f"unknown op trait {trait!r} (known: {', '.join(sorted(TRAITS))})")
    for kind in kinds:
        opdef = get_op(kind)
        opdef.traits = opdef.traits | {trait}
    return frozenset(kinds)


RULE_KINDS = ("grad", "jvp", "batch")
"""The transformation rules an op kind may carry (see :class:`OpDef`)."""


def set_rules(rule: str, table: Mapping[str, Callable[..., Any]]) -> frozenset[str]:
    """Give each kind in ``table`` its ``rule`` (``"grad"``, ``"jvp"`` or ``"batch"``); return the kinds.

    A family module's table of tangent or batching rules, beside its ``mark_traits`` table.

    >>> _ = register_op(OpDef(name="doc_twice", id=50005, arity=1, infer=lambda t, a: t))
    >>> sorted(set_rules("jvp", {"doc_twice": lambda b, ins, outs, tans, attrs: [tans[0]]}))
    ['doc_twice']
    >>> get_op("doc_twice").jvp is not None
    True
    >>> set_rules("hvp", {})
    Traceback (most recent call last):
    ...
    ValueError: unknown op rule 'hvp' (known: grad, jvp, batch)
    """
    if rule not in RULE_KINDS:
        raise ValueError(f"unknown op rule {rule!r} (known: {', '.join(RULE_KINDS)})")
    for kind, fn in table.items():
        setattr(get_op(kind), rule, fn)
    return frozenset(table)


def has_trait(kind: str | int | OpDef, trait: str) -> bool:
    """Whether op ``kind`` has ``trait`` (see :class:`OpDef`).

    >>> has_trait("reshape", "view"), has_trait("exp", "compute_bound"), has_trait("add", "compute_bound")
    (True, True, False)
    """
    return trait in get_op(kind).traits


def family_kinds(family: str) -> tuple[str, ...]:
    """The names of the registered kinds of ``family``, by id (for a family module's trait table, which marks a
    trait that every op of the family has).

    >>> "matmul" in family_kinds("contraction")
    True
    """
    return tuple(d.name for d in sorted(_BY_NAME.values(), key=lambda d: d.id) if d.family == family)


def _get_deferred(kind: str | int) -> OpDef:
    # get_op's miss path: import the module that the kind was announced from, then look again.
    table, deferred = (_BY_NAME, _DEFERRED_BY_NAME) if isinstance(kind, str) else (_BY_ID, _DEFERRED_BY_ID)
    key = kind if isinstance(kind, str) else int(kind)
    owner = deferred.get(key)  # type: ignore[call-overload]
    if owner is not None:
        _load(owner)
    found = table.get(key)  # type: ignore[call-overload]
    if found is None and (_DEFERRED_BY_NAME or _DEFERRED_BY_ID):
        # Not announced, or its module did not register it (an announcement table behind its module): the answer
        # must not depend on what happened to be imported, so look again with every announced module imported.
        _load_all()
        found = table.get(key)  # type: ignore[call-overload]
    if found is None:
        raise KeyError(f"unknown op kind {kind!r}{_announce_hint()}")
    return found


def _announce_hint() -> str:
    return "" if _IMPORTERS else " (the built-in ops are announced by importing opgraph)"


USER_IDS = 40000
"""Op kind ids from here up are for user-defined kinds (docs/ops.md)."""

ID_RANGES: tuple[tuple[int, int, str], ...] = (
    (0, 9999, "opgraph's own"),
    (10001, 30002, "TensCalc's registered types"),
    (USER_IDS, 2**31 - 1, "ops of your own"),
)
"""The ranges op kind ids come from (docs/ops.md): an id outside all of them is no op kind at all."""


def id_range(kind: int) -> tuple[int, int, str] | None:
    """The range of :data:`ID_RANGES` an op kind id falls in (None: outside every range).

    >>> id_range(5), id_range(16777215)[2], id_range(35000), id_range(-1)
    ((0, 9999, "opgraph's own"), 'ops of your own', None, None)
    """
    return next((r for r in ID_RANGES if r[0] <= kind <= r[1]), None)


def _ranges_text() -> str:
    return ", ".join(f"{lo}-{hi} {what}" for lo, hi, what in ID_RANGES)


def unknown_op_message(kind: str | int, *, saved_name: str | None = None, called: str = "op kind",
                       recorded: Sequence[int] | None = None) -> str:
    """What a loader says about an op kind this process does not know: the one message every format uses.

    It names the kind, says it is not a built-in op and must be registered in
    this process before loading (``opgraph.register_op``: import the module
    that registers it), and suggests close registered names when the kind
    looks like a typo. ``kind`` is a name (JSON, dict DAGs, GraphML) or an id
    (.cg files, which may know the name the kind had when it was saved:
    ``saved_name``); ``called`` is what the format calls a kind.

    An id can also be corruption, and registering an op would not help: an id
    outside every range of :data:`ID_RANGES` says so first, an id in opgraph's
    or TensCalc's range says it is no op of this version, and an id of the
    users' range that the file itself says it does not use (``recorded``: the
    ids of ops of your own the writer listed, when it lists them) is corrupt.

    >>> print(unknown_op_message(-7, called="function type"))  # doctest: +NORMALIZE_WHITESPACE
    unknown function type -7: the id is outside every range of op ids (0-9999 opgraph's own, 10001-30002 TensCalc's
    registered types, 40000-2147483647 ops of your own): the file is corrupt or was written by a newer or extended
    writer
    >>> "register_op" in unknown_op_message(16777215, recorded=[]), "register_op" in unknown_op_message(41234)
    (False, True)

    >>> print(unknown_op_message("softplus"))  # doctest: +NORMALIZE_WHITESPACE
    unknown op kind 'softplus': it is not a built-in op; an op of your own must be registered in this process
    before loading: call opgraph.register_op(OpDef(name='softplus', ...)), i.e. import the module that registers it
    >>> "did you mean 'matmul'" in unknown_op_message("matmull")
    True
    >>> unknown_op_message(41234, saved_name="softplus").startswith("unknown op kind 41234 ('softplus' when saved)")
    True
    """
    _load_all()  # close names come from every announced kind
    if not isinstance(kind, str):
        corrupt = _corrupt_id_message(kind, saved_name, called, recorded)
        if corrupt is not None:
            return corrupt
    if isinstance(kind, str):
        what, name = f"unknown {called} {kind!r}", kind
    else:
        what, name = f"unknown {called} {kind}" + (f" ({saved_name!r} when saved)" if saved_name else ""), saved_name
    builtin = "it is not a built-in op"
    spec = f"name={name!r}, id={kind}" if name and not isinstance(kind, str) else (
        f"name={name!r}" if name else f"id={kind}")
    msg = (f"{what}{_announce_hint()}: {builtin}; an op of your own must be registered in this process before "
           f"loading: call opgraph.register_op(OpDef({spec}, ...)), i.e. import the module that registers it")
    if name:
        close = difflib.get_close_matches(name, list(_BY_NAME), n=3, cutoff=0.75)
        if close:
            msg += f"; did you mean {' or '.join(repr(c) for c in close)}?"
    return msg


def _corrupt_id_message(kind: int, saved_name: str | None, called: str, recorded: Sequence[int] | None) -> str | None:
    """The message for an id no op of your own can have (None: registering one is the likely fix)."""
    what = f"unknown {called} {kind}" + (f" ({saved_name!r} when saved)" if saved_name else "")
    where = id_range(kind)
    if where is None:
        return (f"{what}: the id is outside every range of op ids ({_ranges_text()}): the file is corrupt or was "
                f"written by a newer or extended writer")
    if where[0] < USER_IDS:
        newer = "a newer opgraph" if where[0] == 0 else "a TensCalc with types this opgraph does not know"
        return (f"{what}: the id is in the range of {where[2]} ({where[0]}-{where[1]}) but no op of this opgraph "
                f"version has it: the file is corrupt or was written by {newer}")
    if recorded is not None and kind not in recorded:
        listed = ", ".join(str(k) for k in sorted(recorded)[:20]) or "none"
        return (f"{what}: no op is registered under this id, and the file does not record using an op of your own "
                f"under it (opgraph's writer lists each one a file uses; this file lists {listed}): the file is "
                f"corrupt")
    return None


def all_ops() -> list[OpDef]:
    """Every op kind, by id (importing every module announced with :func:`defer_ops`).

    >>> any(d.name == "add" for d in all_ops())
    True
    """
    _load_all()
    return sorted(_BY_ID.values(), key=lambda d: d.id)


_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def user_location() -> str | None:
    """``file:line`` of the innermost caller outside the opgraph package.

    >>> user_location() is None or ":" in user_location()
    True
    """
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not os.path.abspath(filename).startswith(_PKG_DIR + os.sep):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return None


@dataclass(frozen=True)
class Resolved:
    """What building one op decided: normalised attrs, output types, version."""

    opdef: OpDef
    attrs: Attrs
    out_types: tuple[ValueType, ...]
    version: int


def resolve(kind: str | int | OpDef, in_types: Sequence[ValueType], raw_attrs: Mapping[str, Any]) -> Resolved:
    """Normalise attributes, run the type rule and choose the version.

    Raises :class:`OpBuildError` naming the op, its input types and the
    user's source line.

    >>> from opgraph.core.types import TensorType
    >>> resolve("add", [TensorType("f4", (2, 1)), TensorType("f4", (3,))], {}).out_types
    (f32[2,3],)
    >>> resolve("add", [TensorType("f4", (2,)), TensorType("f4", (3,))], {})
    Traceback (most recent call last):
    ...
    opgraph.errors.OpBuildError: add(f32[2], f32[3]): shapes (2,) and (3,) do not broadcast (at ...)
    """
    opdef = get_op(kind)
    in_types = tuple(in_types)
    try:
        opdef.check_arity(len(in_types))
        attrs = opdef.normalise_attrs(raw_attrs)
        attr_dict = dict(attrs)
        out_types = tuple(opdef.infer(in_types, attr_dict))
        version = int(opdef.version(in_types, attr_dict))
    except OpTypeError as exc:
        raise build_error(opdef.name, in_types, str(exc)) from None
    return Resolved(opdef, attrs, out_types, version)


def build_error(op_name: str, in_types: Sequence[ValueType], reason: str) -> OpBuildError:
    """Make the :class:`OpBuildError` for a rejected op, with the user's line.

    >>> str(build_error("add", [], "nope")).startswith("add(): nope")
    True
    """
    loc = user_location()
    where = f" (at {loc})" if loc else ""
    sig = ", ".join(repr(t) for t in in_types)
    return OpBuildError(f"{op_name}({sig}): {reason}{where}", op=op_name, location=loc)


def _const_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[ValueType, ...]:
    raise OpTypeError("const ops are made with GraphBuilder.constant(), which knows the constant's type")


CONST = register_op(
    OpDef(
        name="const",
        id=0,
        arity=0,
        infer=_const_infer,
        attrs={"index": Attr(attr_int, doc="index into the graph's constants table")},
        family="core",
        doc="A constant from the graph's constants table (type 0 in .cg files).",
    )
)
