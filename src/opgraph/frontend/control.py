"""Control flow front ends: ``cond``, ``while_loop``, ``scan``, ``fori_loop`` and ``call`` (``jax.lax`` signatures).

Each construct traces the user's Python functions once into bodies (frozen
graphs wrapped in :class:`~opgraph.core.subgraph.Subgraph`) and records one
control-flow op (:mod:`opgraph.ops.control`). They work in three settings,
chosen from the operands:

* **lazy arrays** (:mod:`opgraph.numpy`), concrete or placeholders, and so
  inside ``@opgraph.function`` traces: the results are lazy arrays;
* **the explicit builder**: operands are :class:`~opgraph.core.graph.Value`\\ s
  of a :class:`~opgraph.core.builder.GraphBuilder`; the body functions get
  Values of a child builder (build their ops with ``x.owner``, or
  :func:`current_builder` for a body without parameters) and the results are
  Values of the operands' builder;
* nested in another body, in either setting.

Operands and results are pytrees (:mod:`opgraph.frontend.pytree`); Python
numbers and NumPy arrays among the operands become constants. What a body
uses from the enclosing scope (outer lazy arrays, traced inputs, Values of an
enclosing builder) becomes an explicit operand of the op (its ``num_consts``
leading inputs); small constants (at most :data:`SMALL_CONST` elements) are
copied into the body instead.

    >>> import numpy as np, opgraph
    >>> import opgraph.numpy as onp
    >>> def step(c, x):
    ...     c = 0.5 * c + x
    ...     return c, c.sum()
    >>> carry, ys = opgraph.scan(step, onp.zeros(2), onp.ones((4, 2)))
    >>> carry.eval(), ys.eval()
    (array([1.875, 1.875]), array([2.  , 3.  , 3.5 , 3.75]))

Type errors name the body function, the position in the pytree and the
lines of the body and of the call:

    >>> def bad_step(c, x):
    ...     return {"h": c["h"].astype("float32")}, None
    >>> opgraph.scan(bad_step, {"h": onp.zeros(2)}, onp.ones((3, 2)))
    Traceback (most recent call last):
    ...
    opgraph.errors.OpBuildError: opgraph.scan: body 'bad_step' (...) returns f32[2] for carry['h'] where init is...
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Value
from opgraph.core.registry import user_location
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType
from opgraph.errors import OpBuildError
from opgraph.frontend import lazy, pytree
from opgraph.frontend.lazy import LazyArray, TracingError
from opgraph.ops.control import is_predicate, types_match

__all__ = ["SMALL_CONST", "call", "cond", "current_builder", "fori_loop", "scan", "subroutine", "while_loop"]

SMALL_CONST = 64
"""An outer constant of at most this many elements used by a body is copied into it instead of becoming an operand."""

_STACK = threading.local()  # .builders: the child builders of the bodies being traced (builder setting), innermost last


def current_builder() -> GraphBuilder:
    """The builder of the innermost body being traced in the builder setting.

    A body function there receives Values of that builder and builds its ops
    with it; this is how a body without parameters reaches it.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> p = b.input(("bool", ()), name="p")
    >>> x = b.input(("float64", (2,)), name="x")
    >>> y = opgraph.cond(p, lambda: current_builder().exp(x), lambda: x)
    >>> b.run({"p": True, "x": np.zeros(2)}, [y])[0]
    array([1., 1.])
    """
    stack = getattr(_STACK, "builders", None)
    if not stack:
        raise RuntimeError("current_builder() is only defined while a body is traced for builder Values")
    return stack[-1]  # type: ignore[no-any-return]


# ---------------------------------------------------------------- naming and errors
def _unwrap(fn: Any) -> Any:
    # the user's function behind a partial or a wrapper made here (fori_loop's step keeps body_fn as __wrapped__)
    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif getattr(fn, "__wrapped__", None) is not None:
            fn = fn.__wrapped__
        else:
            return fn


def _fname(fn: Any) -> str:
    fn = _unwrap(fn)
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def _defined_at(fn: Any) -> str:
    code = getattr(_unwrap(fn), "__code__", None)
    return f" (defined at {code.co_filename}:{code.co_firstlineno})" if code is not None else ""


def _error(kind: str, text: str) -> OpBuildError:
    loc = user_location()
    return OpBuildError(f"opgraph.{kind}: {text}" + (f" (at {loc})" if loc else ""), op=kind, location=loc)


def _describe(role: str, fn: Any) -> str:
    return f"{role} {_fname(fn)!r}{_defined_at(fn)}"


# ---------------------------------------------------------------- leaves
def _leaf_type(x: Any) -> TensorType | None:
    """The type of an operand or result leaf; None for a Python number (its dtype follows its context)."""
    if isinstance(x, (LazyArray, Value)):
        t = x.type
        return t if isinstance(t, TensorType) else None
    if isinstance(x, (bool, int, float, complex)):
        return None
    return TensorType.of(np.asarray(x))


def _weak(x: Any, like: TensorType | None) -> np.ndarray:
    """A Python number as an array of ``like``'s dtype (NEP 50: numbers take their context's dtype)."""
    if like is not None and isinstance(x, (bool, int, float, complex)):
        return np.asarray(x, dtype=np.result_type(like.dtype, x))
    return np.asarray(x)


def _check_leaf(kind: str, path: str, x: Any) -> None:
    if not isinstance(x, (LazyArray, Value, np.ndarray, np.generic, bool, int, float, complex)) and not hasattr(
            x, "__array__"):
        raise TypeError(f"opgraph.{kind}: {path} is a {type(x).__name__}, not an array or a number")


# ---------------------------------------------------------------- the two settings
class _Mode:
    """Where the op is recorded: lazy arrays, or a builder's Values. Also converts operand leaves."""

    def operand(self, x: Any, like: TensorType | None = None) -> Any:
        raise NotImplementedError

    def trace(self, fn: Any) -> _Trace:
        raise NotImplementedError

    def emit(self, kind: str, operands: Sequence[Any], attrs: dict[str, Any]) -> list[Any]:
        raise NotImplementedError


class _Trace:
    """One body being traced: its parameters, its results and what it captured from outside."""

    fn: Any
    params: list[Any]
    captures: dict[Any, Any]  # key -> the outer operand standing for it (in first-use order)

    def param(self, t: TensorType, name: str) -> Any:
        raise NotImplementedError

    def call(self, kind: str, role: str, args: Sequence[Any]) -> Any:
        raise NotImplementedError

    def results(self, leaves: Sequence[Any]) -> None:
        """Note the result leaves (capturing the outer ones)."""
        raise NotImplementedError

    def build(self, consts: Sequence[tuple[Any, Any]], leaves: Sequence[Any],
              types: Sequence[TensorType | None]) -> Subgraph:
        """The body: parameters ``consts`` then the traced ones; results ``leaves`` (numbers cast to ``types``)."""
        raise NotImplementedError


def _retrace_error(kind: str, role: str, fn: Any, exc: TracingError) -> TracingError:
    return TracingError(f"in {role} {_fname(fn)!r} of opgraph.{kind}{_defined_at(fn)}: {exc}")


class _LazyMode(_Mode):
    def operand(self, x: Any, like: TensorType | None = None) -> Any:
        if isinstance(x, LazyArray):
            return x
        return lazy.constant(_weak(x, like))

    def trace(self, fn: Any) -> _Trace:
        return _LazyTrace(fn)

    def emit(self, kind: str, operands: Sequence[Any], attrs: dict[str, Any]) -> list[Any]:
        out = lazy.apply(kind, *operands, **attrs)
        return list(out) if isinstance(out, tuple) else [out]


class _LazyTrace(_Trace):
    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.start = next(lazy._SEQ)  # nodes made from now on are the body's; older ones are outside it
        self.params = []
        self.captures = {}
        self.inner: dict[int, Any] = {}

    def param(self, t: TensorType, name: str) -> Any:
        p = lazy.placeholder(t.shape, t.dtype, name=name)
        self.params.append(p)
        return p

    def call(self, kind: str, role: str, args: Sequence[Any]) -> Any:
        with lazy.tracing():  # an array asked for its value now says "traced value"
            try:
                return self.fn(*args)
            except TracingError as exc:
                raise _retrace_error(kind, role, self.fn, exc) from None

    def results(self, leaves: Sequence[Any]) -> None:
        params = {id(p._node) for p in self.params}
        stack = [x for x in leaves if isinstance(x, LazyArray)]
        while stack:
            a = stack.pop()
            node = a._node
            if id(node) in params or id(node) in self.inner:
                continue
            if node.seq < self.start:  # made outside the body
                if node.const is not None and node.const.size <= SMALL_CONST:
                    self.inner[id(node)] = node
                else:
                    self.captures.setdefault((id(node), a._index), a)
                continue
            if node.is_input:
                raise TracingError(f"body {_fname(self.fn)!r} uses a placeholder {node.name or ''} made inside it; "
                                   "a body's inputs are its parameters")
            self.inner[id(node)] = node
            stack.extend(node.inputs)

    def build(self, consts: Sequence[tuple[Any, Any]], leaves: Sequence[Any],
              types: Sequence[TensorType | None]) -> Subgraph:
        sb = GraphBuilder()
        bound: dict[int, list[Any]] = {}
        for key, a in consts:
            v = sb.input(a.type)
            if key in self.captures:
                bound.setdefault(id(a._node), [None] * len(a._node.types))[a._index] = v
        for p in self.params:
            bound[id(p._node)] = [sb.input(p.type, name=p._node.name)]
        nodes = sorted(self.inner.values(), key=lambda n: n.seq)
        values = lazy._build(nodes, sb, set(), bound={k: tuple(v) for k, v in bound.items()})
        outs = [values[id(x._node)][x._index] if isinstance(x, LazyArray) else sb.constant(_weak(x, t))
                for x, t in zip(leaves, types, strict=True)]
        sb.output(*outs)
        return Subgraph(sb.freeze(), name=_fname(self.fn))


class _BuilderMode(_Mode):
    def __init__(self, builder: GraphBuilder) -> None:
        self.builder = builder

    def operand(self, x: Any, like: TensorType | None = None) -> Any:
        if isinstance(x, Value):
            return x
        return self.builder.constant(_weak(x, like))

    def trace(self, fn: Any) -> _Trace:
        return _BuilderTrace(fn)

    def emit(self, kind: str, operands: Sequence[Any], attrs: dict[str, Any]) -> list[Any]:
        out = self.builder.op(kind, *operands, **attrs)
        return list(out) if isinstance(out, tuple) else [out]


class _BuilderTrace(_Trace):
    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.sb = GraphBuilder()
        self.sb.on_foreign_value = self._capture
        self.params = []
        self.captures = {}
        self.inner: dict[Any, Value] = {}  # capture key -> the body's input standing for it

    def _capture(self, v: Value) -> Value:
        key = (id(v.owner), v.id)
        mine = self.inner.get(key)
        if mine is None:
            mine = self.inner[key] = self.sb.input(v.type)
            self.captures[key] = v
        return mine

    def param(self, t: TensorType, name: str) -> Any:
        v = self.sb.input(t, name=name)
        self.params.append(v)
        return v

    def call(self, kind: str, role: str, args: Sequence[Any]) -> Any:
        stack = _STACK.__dict__.setdefault("builders", [])
        stack.append(self.sb)
        try:
            return self.fn(*args)
        finally:
            stack.pop()

    def results(self, leaves: Sequence[Any]) -> None:
        for x in leaves:
            if isinstance(x, Value) and x.owner is not self.sb:
                self._capture(x)

    def build(self, consts: Sequence[tuple[Any, Any]], leaves: Sequence[Any],
              types: Sequence[TensorType | None]) -> Subgraph:
        sb = self.sb
        for key, v in consts:
            if key not in self.inner:  # used by another body of the same op only: an unused parameter here
                self._capture(v)
        outs = [self.inner[(id(x.owner), x.id)] if isinstance(x, Value) and x.owner is not sb
                else x if isinstance(x, Value) else sb.constant(_weak(x, t))
                for x, t in zip(leaves, types, strict=True)]
        sb.output(*outs)
        g = sb.freeze()
        order = [self.inner[key].id for key, _ in consts] + [p.id for p in self.params]
        return Subgraph(g.replace(inputs=np.asarray(order, dtype=g.inputs.dtype)), name=_fname(self.fn))


def _mode(kind: str, leaves: Sequence[Any]) -> _Mode:
    has_lazy = any(isinstance(x, LazyArray) for x in leaves)
    owners = {id(x.owner): x.owner for x in leaves if isinstance(x, Value)}
    if has_lazy and owners:
        raise TypeError(f"opgraph.{kind}: the operands mix lazy arrays and builder Values")
    if has_lazy:
        return _LazyMode()
    stack = getattr(_STACK, "builders", None) or []
    if stack and all(any(o is s for s in stack) for o in owners.values()):
        return _BuilderMode(stack[-1])  # inside a body being traced: the op belongs to that body
    if len(owners) > 1:
        raise TypeError(f"opgraph.{kind}: the operands are Values of {len(owners)} different builders")
    if owners:
        owner = next(iter(owners.values()))
        if not isinstance(owner, GraphBuilder):
            raise TypeError(f"opgraph.{kind}: the operands are Values of a frozen Graph; use a GraphBuilder's Values")
        return _BuilderMode(owner)
    return _LazyMode()


# ---------------------------------------------------------------- shared steps
def _flatten(kind: str, root: str, tree: Any) -> tuple[list[Any], pytree.PyTreeSpec, list[str]]:
    leaves, spec = pytree.flatten(tree)
    paths = pytree.keystrs(root, tree)
    for p, x in zip(paths, leaves, strict=True):
        _check_leaf(kind, p, x)
    return leaves, spec, paths


def _params(tr: _Trace, types: Sequence[TensorType], spec: pytree.PyTreeSpec, root: str, paths_tree: Any) -> Any:
    names = [pytree.input_name(root, p) for p in pytree.paths(paths_tree)]
    return pytree.unflatten(spec, [tr.param(t, n) for t, n in zip(types, names, strict=True)])


def _operand_types(mode: _Mode, leaves: Sequence[Any]) -> tuple[list[Any], list[TensorType]]:
    ops = [mode.operand(x) for x in leaves]
    return ops, [o.type for o in ops]


def _check_tree(kind: str, what: str, fn: Any, got: pytree.PyTreeSpec, want: pytree.PyTreeSpec, of: str) -> None:
    if got != want:
        raise _error(kind, f"{what} of {_describe('body', fn)} has structure {got} but {of} has structure {want}")


def _check_types(kind: str, role: str, fn: Any, leaves: Sequence[Any], want: Sequence[TensorType],
                 paths: Sequence[str], of: str) -> None:
    for x, t, p in zip(leaves, want, paths, strict=True):
        got = _leaf_type(x)
        if got is None:  # a number takes the carry's dtype if it can (NEP 50)
            got = TensorType(_weak(x, t).dtype, ())
        if not types_match(got, t):
            raise _error(kind, f"{_describe(role, fn)} returns {got} for {p} where {of} is {t}")


def _union(traces: Sequence[_Trace]) -> list[tuple[Any, Any]]:
    merged: dict[Any, Any] = {}
    for tr in traces:
        for key, v in tr.captures.items():
            merged.setdefault(key, v)
    return list(merged.items())


def _pair(kind: str, fn: Any, out: Any, what: str) -> tuple[Any, Any]:
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        got = f"a {type(out).__name__}" + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else "")
        raise _error(kind, f"{_describe('body', fn)} must return a pair {what}, got {got}")
    return out[0], out[1]


# ---------------------------------------------------------------- cond
def cond(pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any], *operands: Any) -> Any:
    """``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, as one ``cond`` op (``jax.lax.cond``).

    ``pred`` is a scalar (one element; nonzero is true). Both branches are
    traced; they must return pytrees of the same structure, dtypes and
    shapes. Only the branch taken runs.

    >>> import numpy as np, opgraph, opgraph.numpy as onp
    >>> x = onp.placeholder((3,), name="x")
    >>> y = opgraph.cond(onp.sum(x) > 0, lambda v: v * 2, lambda v: -v, x)
    >>> g = onp.to_graph([y], inputs=[x])
    >>> g.run({"x": np.array([1.0, 2.0, -1.0])})[0], g.run({"x": np.array([-1.0, 0.0, 0.0])})[0]
    (array([ 2.,  4., -2.]), array([ 1., -0., -0.]))
    """
    kind = "cond"
    leaves, spec, _ = _flatten(kind, "operands", operands)
    _check_leaf(kind, "pred", pred)
    mode = _mode(kind, [pred, *leaves])
    p = mode.operand(pred)
    if not is_predicate(p.type):
        raise _error(kind, f"pred must be a scalar (one element), got {p.type}")
    ops, types = _operand_types(mode, leaves)
    traces, outs = [], []
    for role, fn in (("true_fn", true_fn), ("false_fn", false_fn)):
        tr = mode.trace(fn)
        args = _params(tr, types, spec, "operands", operands)
        out = tr.call(kind, role, args)
        o_leaves, o_spec = pytree.flatten(out)
        for path, x in zip(pytree.keystrs("result", out), o_leaves, strict=True):
            _check_leaf(kind, f"{path} of {role} {_fname(fn)!r}", x)
        tr.results(o_leaves)
        traces.append(tr)
        outs.append((o_leaves, o_spec, out))
    (t_leaves, t_spec, t_out), (f_leaves, f_spec, _) = outs
    if t_spec != f_spec:
        raise _error(kind, f"{_describe('true_fn', true_fn)} returns structure {t_spec} but "
                           f"{_describe('false_fn', false_fn)} returns {f_spec}")
    out_types: list[TensorType | None] = []
    for path, a, b in zip(pytree.keystrs("result", t_out), t_leaves, f_leaves, strict=True):
        ta, tb = _leaf_type(a), _leaf_type(b)
        if ta is None:
            ta = TensorType(_weak(a, tb).dtype, ())
        if tb is None:
            tb = TensorType(_weak(b, ta).dtype, ())
        if ta.dtype != tb.dtype or not types_match(ta, tb):
            raise _error(kind, f"{_describe('true_fn', true_fn)} returns {ta} for {path} but "
                               f"{_describe('false_fn', false_fn)} returns {tb}")
        out_types.append(ta)
    consts = _union(traces)
    bodies = [tr.build(consts, lv, out_types) for tr, (lv, _, _) in zip(traces, outs, strict=True)]
    res = mode.emit(kind, [p, *(v for _, v in consts), *ops], {"then_body": bodies[0], "else_body": bodies[1]})
    return pytree.unflatten(t_spec, res)


# ---------------------------------------------------------------- while_loop
def while_loop(cond_fn: Callable[[Any], Any], body_fn: Callable[[Any], Any], init_val: Any, *,
               max_trip: int | None = None) -> Any:
    """``val = init_val; while cond_fn(val): val = body_fn(val)``, as one ``while_loop`` op (``jax.lax.while_loop``).

    ``body_fn`` returns a pytree of the structure, dtypes and shapes of
    ``init_val``; ``cond_fn`` returns a scalar. The trip count is decided by
    the data when the graph runs. ``max_trip`` bounds it (reverse-mode
    differentiation needs a bound).

    >>> import numpy as np, opgraph, opgraph.numpy as onp
    >>> def halve(s):
    ...     return {"x": s["x"] / 2, "n": s["n"] + 1}
    >>> out = opgraph.while_loop(lambda s: s["x"] > 1.0, halve, {"x": onp.asarray(40.0), "n": 0})
    >>> float(out["x"]), int(out["n"])
    (0.625, 6)
    """
    return _while_loop("while_loop", cond_fn, body_fn, init_val, max_trip, _same)


def _same(path: str) -> str:
    return path


def _while_loop(kind: str, cond_fn: Callable[[Any], Any], body_fn: Callable[[Any], Any], init_val: Any,
                max_trip: int | None, rename: Callable[[str], str]) -> Any:
    leaves, spec, paths = _flatten(kind, "carry", init_val)
    paths = [rename(p) for p in paths]
    mode = _mode(kind, leaves)
    ops, types = _operand_types(mode, leaves)
    tc = mode.trace(cond_fn)
    pred = tc.call(kind, "cond_fn", [_params(tc, types, spec, "carry", init_val)])
    _check_leaf(kind, f"the result of cond_fn {_fname(cond_fn)!r}", pred)
    pred_type = _leaf_type(pred)  # None: a Python number
    if pred_type is not None and not is_predicate(pred_type):
        raise _error(kind, f"{_describe('cond_fn', cond_fn)} must return a scalar, got {pred_type}")
    tc.results([pred])
    tb = mode.trace(body_fn)
    out = tb.call(kind, "body_fn", [_params(tb, types, spec, "carry", init_val)])
    o_leaves, o_spec = pytree.flatten(out)
    _check_tree(kind, "the result", body_fn, o_spec, spec, "init_val")
    _check_types(kind, "body_fn", body_fn, o_leaves, types, paths, "init_val")
    tb.results(o_leaves)
    consts = _union([tc, tb])
    cb = tc.build(consts, [pred], [TensorType(np.bool_, ())])
    body = tb.build(consts, o_leaves, types)
    res = mode.emit("while_loop", [*(v for _, v in consts), *ops],
                    {"cond_body": cb, "body": body, "num_consts": len(consts), "max_trip": max_trip})
    return pytree.unflatten(spec, res[:len(leaves)])


# ---------------------------------------------------------------- scan
def scan(f: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any = None, length: int | None = None,
         reverse: bool = False) -> tuple[Any, Any]:
    """Loop ``f(carry, x) -> (carry, y)`` over the leading axis of ``xs``; return ``(carry, ys)`` (``jax.lax.scan``).

    ``xs`` is a pytree of arrays of one leading length (or ``None``, with
    ``length``); ``ys`` stacks each leaf of ``y`` along a new leading axis.
    ``reverse=True`` runs from the last slice to the first (``ys`` keep
    their positions). One ``scan`` op; its body is stored once.

    >>> import numpy as np, opgraph, opgraph.numpy as onp
    >>> total, partial = opgraph.scan(lambda c, x: (c + x, c + x), 0.0, onp.asarray(np.arange(5.0)))
    >>> float(total), partial.eval()
    (10.0, array([ 0.,  1.,  3.,  6., 10.]))
    """
    return _scan("scan", f, init, xs, length, reverse, _same)


def _scan(kind: str, f: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any, length: int | None,
          reverse: bool, rename: Callable[[str], str]) -> tuple[Any, Any]:
    c_leaves, c_spec, c_paths = _flatten(kind, "carry", init)
    c_paths = [rename(p) for p in c_paths]
    x_leaves, x_spec, x_paths = _flatten(kind, "xs", xs)
    mode = _mode(kind, [*c_leaves, *x_leaves])
    c_ops, c_types = _operand_types(mode, c_leaves)
    x_ops, x_types = _operand_types(mode, x_leaves)
    n: int | None = length
    first = ""
    for p, t in zip(x_paths, x_types, strict=True):
        if t.shape is None or len(t.shape) == 0:
            raise _error(kind, f"{p} is {t}: it needs a leading axis to scan over")
        d = t.shape[0]
        if d is not None:
            if n is not None and d != n:
                raise _error(kind, f"{p} has leading length {d} but " + (
                    f"{first} has {n}" if first else f"length={n}"))
            n, first = d, first or p
    if not x_leaves and length is None:
        raise _error(kind, "scan without xs needs length=")
    slices = [TensorType(t.dtype, None if t.shape is None else t.shape[1:]) for t in x_types]
    tr = mode.trace(f)
    carry_in = _params(tr, c_types, c_spec, "carry", init)
    x_in = _params(tr, slices, x_spec, "x", xs) if xs is not None else None
    out = tr.call(kind, "body", [carry_in, x_in])
    c_out, y_out = _pair(kind, f, out, "(carry, y)")
    o_leaves, o_spec = pytree.flatten(c_out)
    init_name = "init_val" if kind == "fori_loop" else "init"
    _check_tree(kind, "the carry", f, o_spec, c_spec, init_name)
    _check_types(kind, "body", f, o_leaves, c_types, c_paths, init_name)
    y_leaves, y_spec = pytree.flatten(y_out)
    for path, y in zip(pytree.keystrs("y", y_out), y_leaves, strict=True):
        _check_leaf(kind, f"{path} of body {_fname(f)!r}", y)
    tr.results([*o_leaves, *y_leaves])
    consts = _union([tr])
    body = tr.build(consts, [*o_leaves, *y_leaves], [*c_types, *[None] * len(y_leaves)])
    res = mode.emit("scan", [*(v for _, v in consts), *c_ops, *x_ops],
                    {"body": body, "num_consts": len(consts), "num_carry": len(c_leaves), "length": length,
                     "reverse": bool(reverse)})
    nc = len(c_leaves)
    return pytree.unflatten(c_spec, res[:nc]), pytree.unflatten(y_spec, res[nc:])


# ---------------------------------------------------------------- fori_loop
def _static_int(x: Any) -> bool:
    if isinstance(x, np.ndarray):
        return x.ndim == 0 and x.dtype.kind in "iu"
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _op(kind: str, *args: Any, **attrs: Any) -> Any:
    """An op on body parameters, in whichever setting the body is traced."""
    if any(isinstance(a, Value) for a in args):
        return current_builder().op(kind, *args, **attrs)
    return lazy.apply(kind, *args, **attrs)


def _fori_path(path: str) -> str:
    # the loop carries (i, val): report val's positions as init_val's
    if path == "carry[0]":
        return "i"
    return "init_val" + path[len("carry[1]"):] if path.startswith("carry[1]") else path


def fori_loop(lower: Any, upper: Any, body_fn: Callable[[Any, Any], Any], init_val: Any) -> Any:
    """``val = init_val; for i in range(lower, upper): val = body_fn(i, val)`` (``jax.lax.fori_loop``).

    With Python int bounds this is a ``scan`` of ``upper - lower`` trips
    carrying ``i`` (reverse-differentiable); with array bounds (known only
    when the graph runs) a ``while_loop`` carrying ``i``.

    >>> import numpy as np, opgraph, opgraph.numpy as onp
    >>> float(opgraph.fori_loop(1, 5, lambda i, acc: acc * i, 1.0))
    24.0
    >>> n = onp.placeholder((), "int64", name="n")
    >>> g = onp.to_graph([opgraph.fori_loop(0, n, lambda i, acc: acc + i, 0)], inputs=[n])
    >>> int(g.run({"n": np.int64(5)})[0]), [op.kind for op in g.ops()][-1]
    (10, 'while_loop')
    """
    kind = "fori_loop"
    _check_leaf(kind, "lower", lower)
    _check_leaf(kind, "upper", upper)
    spec = pytree.flatten(init_val)[1]

    def run_body(i: Any, val: Any) -> Any:
        out = body_fn(i, val)
        _check_tree(kind, "the result", body_fn, pytree.flatten(out)[1], spec, "init_val")  # without the i carried
        return out
    if _static_int(lower) and _static_int(upper):
        lo = np.asarray(lower)
        dt = np.result_type(lo, np.asarray(upper))

        def step(carry: tuple[Any, Any], _: Any) -> tuple[tuple[Any, Any], None]:
            i, val = carry
            return (_op("add", i, np.asarray(1, dtype=dt)), run_body(i, val)), None

        functools.update_wrapper(step, body_fn)
        n = max(int(upper) - int(lower), 0)
        (_, val), _ = _scan(kind, step, (lo.astype(dt), init_val), None, n, False, _fori_path)
        return val
    mode = _mode(kind, [lower, upper, *pytree.flatten(init_val)[0]])
    lo, up = mode.operand(lower), mode.operand(upper)
    for name, t in (("lower", lo.type), ("upper", up.type)):
        if t.dtype.kind not in "iu" or (t.shape is not None and t.size != 1):
            raise _error(kind, f"{name} must be an integer scalar, got {t}")
    # a Python int bound takes the other bound's dtype (NEP 50)
    dt = up.dtype if _static_int(lower) else lo.dtype if _static_int(upper) else np.result_type(lo.dtype, up.dtype)
    lo, up = (mode.operand(np.asarray(b, dtype=dt)) if _static_int(b) else
              v if v.dtype == dt else v.owner.op("cast", v, dtype=dt) if isinstance(v, Value) else
              lazy.apply("cast", v, dtype=dt) for b, v in ((lower, lo), (upper, up)))

    def test(carry: tuple[Any, Any]) -> Any:
        return _op("less", carry[0], up)

    def body(carry: tuple[Any, Any]) -> tuple[Any, Any]:
        i, val = carry
        return _op("add", i, np.asarray(1, dtype=dt)), run_body(i, val)

    functools.update_wrapper(body, body_fn)
    return _while_loop(kind, test, body, (lo, init_val), None, _fori_path)[1]


# ---------------------------------------------------------------- call
def call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` as one ``call`` op whose body is ``fn`` traced on the types of ``args``.

    Equal bodies are stored once in a graph, so calling the same function
    on arguments of the same types any number of times keeps one copy of its
    ops (see :func:`subroutine` for the decorator form).

    >>> import numpy as np, opgraph, opgraph.numpy as onp
    >>> x = onp.placeholder((2,), name="x")
    >>> def sq(v):
    ...     return v * v
    >>> g = onp.to_graph([opgraph.call(sq, opgraph.call(sq, x))], inputs=[x])
    >>> [op.kind for op in g.ops()], len(g.subgraphs)
    (['call', 'call'], 1)
    >>> g.run({"x": np.array([2.0, 3.0])})[0]
    array([16., 81.])
    """
    kind = "call"
    leaves, spec, _ = _flatten(kind, "args", args)
    mode = _mode(kind, leaves)
    ops, types = _operand_types(mode, leaves)
    tr = mode.trace(fn)
    out = tr.call(kind, "function", list(_params(tr, types, spec, "args", args)))
    o_leaves, o_spec = pytree.flatten(out)
    for path, y in zip(pytree.keystrs("result", out), o_leaves, strict=True):
        _check_leaf(kind, f"{path} of {_fname(fn)!r}", y)
    tr.results(o_leaves)
    consts = _union([tr])
    body = tr.build(consts, o_leaves, [None] * len(o_leaves))
    res = mode.emit(kind, [*(v for _, v in consts), *ops], {"body": body})
    return pytree.unflatten(o_spec, res)


class Subroutine:
    """A function whose every use is a ``call`` op on one stored body; see :func:`subroutine`."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any) -> Any:
        return call(self.fn, *args)

    def __repr__(self) -> str:
        return f"<opgraph.subroutine {_fname(self.fn)}>"


def subroutine(fn: Callable[..., Any]) -> Subroutine:
    """Decorator: each call of ``fn`` records a ``call`` op instead of inlining ``fn``'s ops.

    The body is traced per call but stored once per graph (equal bodies are
    one attribute), so a graph that uses a large block ten times keeps one
    copy of it.

    >>> import numpy as np, opgraph, opgraph.numpy as onp
    >>> @opgraph.subroutine
    ... def layer(h, w):
    ...     return onp.tanh(h @ w)
    >>> @opgraph.function
    ... def net(x, w):
    ...     return layer(layer(layer(x, w), w), w)
    >>> g = net.graph(np.ones((1, 3)), np.eye(3))
    >>> [op.kind for op in g.ops()], len(g.subgraphs)
    (['call', 'call', 'call'], 1)
    """
    return Subroutine(fn)
