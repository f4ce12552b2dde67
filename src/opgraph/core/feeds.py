"""Feeds: how a key names an input and how a fed array is checked against the input's type.

Every runtime and backend accepts feeds the same way, so these live at the bottom layer.

**The conversion rule.** A feed whose dtype is the input's dtype is used as
it is. Otherwise it is converted only when no value changes meaning:

* NumPy arrays, NumPy scalars and other array-likes (``__array__``, torch
  tensors, JAX arrays) follow NumPy's ``np.can_cast(src, dst, "same_kind")``:
  widening (``int8 -> int32``, ``float32 -> float64``, ``int -> float``,
  ``bool -> anything``) always passes; narrowing within a kind
  (``int64 -> int8``, ``float64 -> float32``, ``complex128 -> complex64``,
  ``int64 -> float16``) passes only when every value survives: integers must be
  in range, and no finite value may overflow to infinity. Rounding to the
  narrower float (``0.1`` as float32, underflow to zero) is accepted, as in
  NumPy and JAX. Crossing kinds downwards (``float -> int``, ``complex ->
  float``, ``int -> bool``, signed ``-> unsigned``, strings, objects) is refused.
* Python scalars, lists and tuples are *weak*, as NEP 50 treats Python
  numbers: a Python int fits any integer, float or complex input if its value
  does (``300`` into int8 is an error), a Python float fits float and complex
  inputs (not integer ones), a Python bool fits anything numeric.

A refused feed is a :class:`FeedError` naming the input. To convert anyway
(wrapping integers, truncating floats), convert explicitly before feeding:
``np.asarray(x, dtype=...)`` or ``x.astype(...)`` give the exact dtype, which
is always accepted.
"""

from __future__ import annotations

import difflib
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from opgraph.core.graph import Graph, Value
from opgraph.core.types import TensorType
from opgraph.errors import ExecutionError, FeedError, UnknownKeyError

_SHOWN = 20
"""Input names an unknown-name error lists at most."""

_WEAK_KINDS = {"b": "biufc", "i": "iufc", "u": "iufc", "f": "fc", "c": "c"}
"""Kind of the array NumPy makes of Python data -> the input kinds it may go to (NEP 50 for Python scalars)."""


def did_you_mean(word: str, names: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` naming the names close to ``word`` (difflib's), or ``""`` when none is: the tail
    of an unknown-name message.

    >>> did_you_mean("rat", ["rate", "x"]), did_you_mean("q", ["rate"])
    ("; did you mean 'rate'?", '')
    """
    close = difflib.get_close_matches(word, list(names), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""



def value_id(graph: Graph, key: Any) -> int:
    """The value id a feed or target key names: an id (``3``, ``"%3"``, ``"3"``), a name (``"x"`` or ``"%x"``)
    or a :class:`Value`. A name wins over an id written as text.

    An unknown name or id is an :class:`UnknownKeyError` suggesting close names.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", ()), name="x")
    >>> g = b.freeze()
    >>> value_id(g, "x"), value_id(g, x), value_id(g, 0), value_id(g, "%0")
    (0, 0, 0, 0)
    >>> value_id(g, "xx")
    Traceback (most recent call last):
      ...
    opgraph.errors.UnknownKeyError: no value named 'xx'; did you mean 'x'?
    """
    if isinstance(key, Value):
        return key.id
    if isinstance(key, str):
        try:
            return graph.find_value(key)
        except KeyError:
            pass
        text = key[1:] if key.startswith("%") else key  # "%x" is the label dumps and errors print
        if text.isascii() and text.isdigit() and int(text) < graph.num_values:
            return int(text)
        if text is not key:
            try:
                return graph.find_value(text)
            except KeyError:
                pass
        names = [n for n in graph.symbols.values.values() if isinstance(n, str)]
        raise UnknownKeyError(f"no value named {key!r}{did_you_mean(key.lstrip('%'), names)}")
    try:
        v = operator.index(key)
    except TypeError:
        raise UnknownKeyError(f"a feed or target key is a value id, a name or a Value, not "
                              f"{type(key).__name__} {key!r}") from None
    if not 0 <= v < graph.num_values:
        raise UnknownKeyError(f"no value {v}: the graph has {graph.num_values} value(s)")
    return v


def input_id(graph: Graph, key: Any, *, verb: str = "fed") -> int:
    """The input a feed key names; anything else is an error naming the graph's inputs.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", ()), name="rate"); y = b.op("exp", x, name="y")
    >>> g = b.freeze()
    >>> input_id(g, "rate")
    0
    >>> input_id(g, "rat")
    Traceback (most recent call last):
      ...
    opgraph.errors.UnknownKeyError: no value named 'rat'; the graph's inputs: rate; did you mean 'rate'?
    >>> input_id(g, "y")
    Traceback (most recent call last):
      ...
    opgraph.errors.ExecutionError: %y is computed by the graph and cannot be fed
    """
    try:
        v = value_id(graph, key)
    except UnknownKeyError as exc:
        labels, shown = _input_list(graph)
        hint = did_you_mean(key.lstrip("%"), labels) if isinstance(key, str) else ""
        what = f"no value named {key!r}" if isinstance(key, str) else str(exc)
        raise UnknownKeyError(f"{what}; the graph's inputs: {shown}{hint}") from None
    if graph.value_producer[v] != -1:
        raise ExecutionError(f"{graph.value_label(v)} is computed by the graph and cannot be {verb}")
    return v


def _input_list(graph: Graph) -> tuple[list[str], str]:
    """The graph's input labels (without ``%``) and their listing for messages (``_SHOWN`` at most)."""
    labels = [graph.value_label(i).lstrip("%") for i in graph.inputs.tolist()]
    shown = ", ".join(labels[:_SHOWN]) + (f", ... ({len(labels)} in all)" if len(labels) > _SHOWN else "")
    return labels, shown or "(none)"


def resolve_feeds(graph: Graph, feeds: Mapping[Any, Any] | None = None,
                  named: Mapping[str, Any] | None = None) -> dict[int, Any]:
    """The feeds of one call as ``{input id: data}``: the one rule every ``run`` and compiled call applies.

    * ``feeds`` (the dict form) is keyed as :func:`input_id` reads a key: a
      value id (``3``, ``"3"``, ``"%3"``), a name (``"x"``, or ``"%x"`` as
      dumps, errors and the command line's ``--set`` spell it) or a
      :class:`Value`. It always works, whatever the inputs are called.
    * ``named`` are keyword arguments (``run(x=...)``): each is an input's
      name; anything else is an :class:`UnknownKeyError` listing the inputs.
      A call's own keyword parameters (``targets``, ``backend``) keep their
      meaning, so an input called ``targets`` is fed through the dict form.
    * Two keys naming the same input (``{"x": a, 0: b}``, or ``{"x": a}``
      with ``x=b``) are a :class:`FeedError` naming it, not a silent choice.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", ()), name="x"); y = b.input(("f8", ()), name="y")
    >>> g = b.freeze()
    >>> resolve_feeds(g, {"%x": 1.0}, {"y": 2.0})
    {0: 1.0, 1: 2.0}
    >>> resolve_feeds(g, {"x": 1.0}, {"x": 2.0})
    Traceback (most recent call last):
      ...
    opgraph.errors.FeedError: input %x is fed twice: by key 'x' and by keyword x=
    >>> resolve_feeds(g, named={"z": 1.0})
    Traceback (most recent call last):
      ...
    opgraph.errors.UnknownKeyError: no input named 'z' (keyword z=); the graph's inputs: x, y
    """
    out: dict[int, Any] = {}
    by: dict[int, str] = {}
    for k, data in (feeds or {}).items():
        v = input_id(graph, k)
        if v in out:
            raise FeedError(f"input {graph.value_label(v)} is fed twice: by key {by[v]} and by key "
                            f"{_key_text(k)}")
        out[v], by[v] = data, _key_text(k)
    for name, data in (named or {}).items():
        try:
            v = graph.find_value(name)
        except KeyError:
            v = -1
        if v < 0 or graph.value_producer[v] != -1:
            labels, shown = _input_list(graph)
            why = "" if v < 0 else f", and {graph.value_label(v)} is computed by the graph"
            raise UnknownKeyError(f"no input named {name!r} (keyword {name}=){why}; the graph's inputs: "
                                  f"{shown}{did_you_mean(name, labels)}")
        if v in out:
            raise FeedError(f"input {graph.value_label(v)} is fed twice: by key {by[v]} and by keyword {name}=")
        out[v], by[v] = data, f"keyword {name}="
    return out


def _call_inputs(graph: Graph) -> tuple[list[int], list[int]]:
    """The graph's inputs, and those a positional call may leave out (update destinations, which hold state),
    worked out once per graph."""
    got = graph._cache.get("call_inputs")
    if got is None:
        inputs = graph.inputs.tolist()
        held = set(graph.updates[:, 1].tolist())
        got = graph._cache["call_inputs"] = (inputs, [v for v in inputs if v not in held])
    return got  # type: ignore[no-any-return]


def call_forms(graph: Graph) -> str:
    """The three ways a compiled program is called, with the graph's inputs and their types, for messages.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", (2,)), name="x"); w = b.input(("f4", ()), name="w")
    >>> print(call_forms(b.freeze()))
    the graph's inputs are x: f64[2], w: f32[]; call it with the arrays in that order (f(x, w)), one dict ...
    """
    inputs, free = _call_inputs(graph)
    labels = [graph.value_label(v).lstrip("%") for v in inputs]
    shown = ", ".join(f"{n}: {graph.type_of(v)}" for n, v in zip(labels[:_SHOWN], inputs, strict=False))
    if len(labels) > _SHOWN:
        shown += f", ... ({len(labels)} in all)"
    if not inputs:
        return "the graph has no inputs; call it with no arguments (f())"
    order = ", ".join(labels[:4]) + (", ..." if len(labels) > 4 else "")
    pos = f"the arrays in that order (f({order}))"
    if len(free) != len(inputs):
        held = [graph.value_label(v).lstrip("%") for v in inputs if v not in set(free)]
        pos += f", or without the state input(s) {', '.join(held[:4])} after the first call"
    ident = labels[0] if labels[0].isidentifier() else "name"
    return (f"the graph's inputs are {shown}; call it with {pos}, one dict keyed by input name, id or Value "
            f"(f({{{labels[0]!r}: ...}})), or keywords (f({ident}=...))")


def resolve_call(graph: Graph, args: Sequence[Any], named: Mapping[str, Any] | None = None) -> dict[int, Any]:
    """The feeds of a compiled program's call ``f(*args, **named)`` as ``{input id: data}``.

    Exactly three forms are taken:

    * positional arrays in the graph's input order: ``f(x)``, ``f(x, w)``;
      every input, or every input but the update destinations (whose state the
      program keeps between calls; keywords may still feed them);
    * one mapping keyed as :func:`resolve_feeds` reads it (ids, names, ``"%x"``,
      Values), optionally with keywords;
    * keywords, each an input's name.

    Anything else is one :class:`FeedError` (also a ``TypeError``) naming the
    graph's inputs with their types, the three forms, and what was given.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("f8", ()), name="x"); w = b.input(("f8", ()), name="w")
    >>> g = b.freeze()
    >>> resolve_call(g, (1.0, 2.0)), resolve_call(g, ({"x": 1.0},), {"w": 2.0}), resolve_call(g, (), {"w": 2.0})
    ({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}, {1: 2.0})
    >>> resolve_call(g, (np.array(1.0),))
    Traceback (most recent call last):
      ...
    opgraph.errors.FeedError: got 1 positional argument for 2 inputs: the graph's inputs are x: f64[], w: f64[]; ...
    """
    n = len(args)
    if n == 0:
        return resolve_feeds(graph, None, named) if named else {}
    first = args[0]
    # type() before isinstance(): an ABC check costs as much as the rest of a small call
    if n == 1 and type(first) is not np.ndarray and (first is None or isinstance(first, Mapping)):
        return resolve_feeds(graph, first, named)
    inputs, free = graph._cache.get("call_inputs") or _call_inputs(graph)
    if n == len(inputs):
        ids = inputs
    elif n == len(free):
        ids = free
    else:
        counts = sorted({len(inputs), len(free)})
        want = " or ".join(map(str, counts)) + (" input" if counts[-1] == 1 else " inputs")
        raise FeedError(f"got {n} positional argument{'s' if n != 1 else ''} for {want}: {call_forms(graph)}")
    for i, a in enumerate(args):
        if type(a) is not np.ndarray and (a is None or isinstance(a, Mapping)):
            raise FeedError(f"positional argument {i} is {'None' if a is None else 'a ' + type(a).__name__}, "
                            f"not an array: {call_forms(graph)}")
    out = dict(zip(ids, args, strict=False))  # lengths equal: checked above
    if named:
        more = resolve_feeds(graph, None, named)
        for v in more:
            if v in out:
                raise FeedError(f"input {graph.value_label(v)} is fed twice: by position {ids.index(v)} and by "
                                f"keyword {graph.value_label(v).lstrip('%')}=")
        out.update(more)
    return out


def target_ids(graph: Graph, targets: Any) -> list[int]:
    """The value ids ``targets`` (a sequence of ids, names or Values) names, by :func:`value_id`.

    When that fails and the graph has an input called ``targets``, the error
    says that ``targets=`` is the call's parameter and the dict form feeds
    such an input.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); t = b.input(("f8", ()), name="targets"); b.output(b.op("exp", t))
    >>> g = b.freeze()
    >>> target_ids(g, ["targets", 1])
    [0, 1]
    >>> target_ids(g, 2.5)
    Traceback (most recent call last):
      ...
    opgraph.errors.UnknownKeyError: targets is a sequence of value ids, names or Values, not float 2.5; ...
    """
    try:
        keys = list(targets)
    except TypeError:
        keys = None
    try:
        if keys is None:
            raise UnknownKeyError(f"targets is a sequence of value ids, names or Values, not "
                                  f"{type(targets).__name__} {targets!r}"[:200])
        return [value_id(graph, t) for t in keys]
    except UnknownKeyError as exc:
        try:
            clash = graph.value_producer[graph.find_value("targets")] == -1
        except KeyError:
            clash = False
        if not clash:
            raise
        raise UnknownKeyError(f"{exc}; targets= is the list of values to compute: feed the input named "
                              f"'targets' through the dict, run({{'targets': ...}})") from None


def _key_text(key: Any) -> str:
    return f"Value {key.id}" if isinstance(key, Value) else repr(key)


def _describe(data: Any, arr: np.ndarray, weak: bool) -> str:
    if weak:
        kind = {"b": "bool", "i": "int", "u": "int", "f": "float", "c": "complex", "U": "str", "S": "bytes"}
        what = "Python " + kind.get(arr.dtype.kind, type(data).__name__)
        return what + ("s" if isinstance(data, (list, tuple)) else "")
    return f"a NumPy {arr.dtype} scalar" if isinstance(data, np.generic) else f"an array of dtype {arr.dtype}"


def _first_lost(arr: np.ndarray, out: np.ndarray) -> int | None:
    """Flat index of the first value the narrowing cast ``arr -> out`` does not keep (None: all kept)."""
    if arr.size == 0:
        return None
    if out.dtype.kind in "iu":
        info = np.iinfo(out.dtype)
        if arr.dtype.kind == "b" or (arr.min() >= info.min and arr.max() <= info.max):
            return None
        bad = (arr < info.min) | (arr > info.max)
    else:  # float or complex: rounding is accepted, overflow of a finite value to infinity is not
        if not np.isinf(out).any():  # the usual case, in one pass over the (narrower) result
            return None
        parts = ((arr.real, out.real), (arr.imag, out.imag)) if out.dtype.kind == "c" else ((arr, out),)
        bad = np.zeros(arr.shape, bool)
        for a, o in parts:
            if a.dtype.kind in "fc":
                bad |= np.isinf(o) & np.isfinite(a)
            else:  # integers and bools are finite
                bad |= np.isinf(o)
        if not bad.any():  # the infinities were there before the cast
            return None
    return int(np.flatnonzero(bad.reshape(-1))[0])


def convert_feed(data: Any, t: TensorType, label: str) -> np.ndarray:
    """``data`` as an array of ``t``'s dtype by the module's rule, or a :class:`FeedError` naming ``label``.

    The shape is not checked here (see :func:`coerce_feed`).

    >>> import numpy as np
    >>> t = TensorType("int8", (3,))
    >>> convert_feed([1, 2, -3], t, "%x")
    array([ 1,  2, -3], dtype=int8)
    >>> convert_feed(np.array([300, 1, 2]), t, "%x")
    Traceback (most recent call last):
      ...
    opgraph.errors.FeedError: input %x expects i8[3]: value 300 at index 0 does not fit in int8 ...
    """
    dst = t.dtype
    if isinstance(data, np.ndarray):
        if data.dtype == dst:
            return data
        arr, weak = data, False
    else:
        # np.float64 and np.complex128 subclass Python's float and complex, but NumPy scalars are strong (NEP 50)
        weak = isinstance(data, (bool, int, float, complex, list, tuple)) and not isinstance(data, np.generic)
        try:
            arr = np.asarray(data)
        except (ValueError, TypeError, OverflowError) as exc:
            raise FeedError(f"input {label} expects {t}, got {type(data).__name__} that is not an array: "
                            f"{exc}") from None
        if arr.dtype == dst:
            return arr
    src = arr.dtype
    if weak and src.kind == "O":  # Python ints beyond int64/uint64: weak ints, converted one by one
        items = arr.reshape(-1).tolist()
        if not all(isinstance(x, int) for x in items) or dst.kind not in "iufc":
            raise FeedError(f"input {label} expects {t}, got Python values that do not form a numeric array of "
                            f"kind {dst.kind!r}")
        try:
            with np.errstate(over="ignore"):
                out = np.asarray(data, dtype=dst)
        except OverflowError:
            out = None
        if out is None or (dst.kind in "iu" and out.reshape(-1).tolist() != items) or np.isinf(out).any():
            raise FeedError(f"input {label} expects {t}: the Python ints fed do not fit in {dst}")
        return out
    allowed = dst.kind in _WEAK_KINDS.get(src.kind, "") if weak else bool(np.can_cast(src, dst, "same_kind"))
    if not allowed:
        raise FeedError(f"input {label} expects {t}, got {_describe(data, arr, weak)}: a cast from "
                        f"{src} to {dst} can change values (convert explicitly, e.g. np.asarray(x, dtype='{dst}'), "
                        f"to accept that)")
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(dst)
    if weak or not np.can_cast(src, dst, "safe"):
        i = _first_lost(arr, out)
        if i is not None:
            index = tuple(int(j) for j in np.unravel_index(i, arr.shape)) if arr.ndim > 1 else i
            where = f" at index {index}" if arr.ndim else ""
            raise FeedError(f"input {label} expects {t}: value {arr.reshape(-1)[i].item()!r}{where} does not fit "
                            f"in {dst} (it would become {out.reshape(-1)[i].item()!r}); convert explicitly, "
                            f"e.g. np.asarray(x, dtype='{dst}'), to accept that")
    return out


def coerce_feed(graph: Graph, v: int, data: Any) -> np.ndarray:
    """Check a fed array against input ``v``'s type and convert it by the module's rule.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float32", (2,)), name="x")
    >>> coerce_feed(b.freeze(), x.id, np.array([0.5, 2.0]))
    array([0.5, 2. ], dtype=float32)
    >>> coerce_feed(b.freeze(), x.id, np.array([0.5, 1e300]))
    Traceback (most recent call last):
      ...
    opgraph.errors.FeedError: input %x expects f32[2]: value 1e+300 at index 1 does not fit in float32 ...
    """
    t = graph.type_of(v)
    assert isinstance(t, TensorType)
    arr = convert_feed(data, t, graph.value_label(v))
    if not t.accepts(arr):
        raise FeedError(f"input {graph.value_label(v)} expects {t}, got shape {arr.shape}")
    return arr
