"""Batching (``vmap``): the sweep that calls each op's batching rule.

Like the reverse sweep (:mod:`opgraph.autodiff.reverse`) it works on *records*
(op definition, attributes, input and output handles) in topological order, so
one engine serves lazy arrays (``opgraph.vmap`` of a function) and builder
values (the bodies of control-flow ops). A batched value always carries its
batch axis at position 0; ops none of whose inputs are batched are left as they
are. An op kind without a batching rule (or whose rule returns None for these
inputs) runs once per example: one ``scan`` over the batch whose body is the op
alone, so the batched graph stays the same size whatever the batch size.

    >>> import numpy as np, opgraph
    >>> from opgraph.autodiff.batching import batch_sweep, builder_records
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float64", (3,)), name="x")          # one example
    >>> y = b.multiply(b.sin(x), 2.0)
    >>> records = builder_records(b, b.num_ops)
    >>> xs = b.input(("float64", (4, 3)), name="xs")      # a batch of 4
    >>> out = batch_sweep(b, records, lambda v: v.id, {x.id: xs}, 4)
    >>> ys = out[y.id]
    >>> ys.type
    f64[4,3]
    >>> data = np.arange(12.0).reshape(4, 3)
    >>> np.allclose(b.run({xs: data, x: data[0]}, [ys])[0], np.sin(data) * 2)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from opgraph.autodiff.reverse import Record, _builder_records
from opgraph.core.builder import GraphBuilder
from opgraph.core.registry import OpDef, exact_key
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType
from opgraph.errors import GraphError

__all__ = ["BatchingError", "batch_sweep", "builder_records", "fallback", "per_example_body"]


class BatchingError(GraphError):
    """A batching rule returned something other than the op's outputs with a leading batch axis."""


def builder_records(b: GraphBuilder, stop: int) -> list[Record]:
    """The records of the first ``stop`` ops of builder ``b`` (constants left out), for :func:`batch_sweep`.

    >>> import opgraph
    >>> b = opgraph.GraphBuilder(); x = b.input(("float64", ()), name="x"); y = b.exp(x)
    >>> [r.opdef.name for r in builder_records(b, b.num_ops)]
    ['exp']
    """
    return _builder_records(b, stop)


def _as_list(res: Any) -> list[Any]:
    return list(res) if isinstance(res, (tuple, list)) else [res]


_BODIES: dict[Any, Subgraph] = {}
_BODIES_MAX = 4096


def per_example_body(opdef: OpDef, attrs: Mapping[str, Any], in_types: Sequence[Any],
                     batched: Sequence[bool]) -> Subgraph:
    """The body of the fallback ``scan``: the op alone, its unbatched inputs first (the scan's consts), then its
    batched ones (one example of each), returning the op's outputs.

    >>> from opgraph.core.registry import get_op
    >>> from opgraph.core.types import TensorType
    >>> t = TensorType("float64", (3,))
    >>> per_example_body(get_op("add"), {}, [t, t], [False, True])
    Subgraph('vmap(add)': (f64[3], f64[3]) -> (f64[3]), 1 op)
    """
    try:
        key: Any = (opdef.name, exact_key(dict(attrs)), tuple(in_types), tuple(batched))
        hit = _BODIES.get(key)
    except TypeError:  # attributes without an exact key: build it each time
        key, hit = None, None
    if hit is not None:
        return hit
    sb = GraphBuilder()
    order = [i for i, f in enumerate(batched) if not f] + [i for i, f in enumerate(batched) if f]
    params: list[Any] = [None] * len(in_types)
    for i in order:
        params[i] = sb.input(in_types[i], name=f"in{i}")
    sb.output(*_as_list(sb.op(opdef.name, *params, **dict(attrs))))
    body = Subgraph(sb.freeze(), name=f"vmap({opdef.name})")
    if key is not None:
        if len(_BODIES) >= _BODIES_MAX:
            _BODIES.clear()
        _BODIES[key] = body
    return body


def fallback(b: Any, rec: Record, inputs: Sequence[Any], batched: Sequence[bool], size: int) -> list[Any]:
    """Run ``rec``'s op once per example: a ``scan`` over the batch axis whose body is the op alone.

    >>> import numpy as np, opgraph
    >>> from opgraph.autodiff.reverse import Record
    >>> from opgraph.core.registry import get_op
    >>> b = opgraph.GraphBuilder()
    >>> x, xs = b.input(("float64", (2,)), name="x"), b.input(("float64", (3, 2)), name="xs")
    >>> (ys,) = fallback(b, Record(get_op("exp"), {}, [x], [b.exp(x)]), [xs], [True], 3)
    >>> ys.type
    f64[3,2]
    """
    body = per_example_body(rec.opdef, rec.attrs, [v.type for v in rec.inputs], batched)
    consts = [v for v, f in zip(inputs, batched, strict=True) if not f]
    xs = [v for v, f in zip(inputs, batched, strict=True) if f]
    if not rec.outputs:
        return []
    return _as_list(b.op("scan", *consts, *xs, body=body, num_consts=len(consts), num_carry=0))


def _check(rec: Record, outs: Sequence[Any], size: int | None) -> None:
    if len(outs) != len(rec.outputs):
        raise BatchingError(f"batching rule of {rec.opdef.name!r}{rec.label} returned {len(outs)} output(s) for "
                            f"{len(rec.outputs)}")
    for k, (o, r) in enumerate(zip(rec.outputs, outs, strict=True)):
        want, got = o.type, r.type
        if not isinstance(want, TensorType) or not isinstance(got, TensorType):
            continue
        ok = want.dtype == got.dtype and (want.shape is None or got.shape is None or (
            len(got.shape) == len(want.shape) + 1 and all(
                a is None or c is None or a == c for a, c in zip((size, *want.shape), got.shape, strict=True))))
        if not ok:
            raise BatchingError(f"batching rule of {rec.opdef.name!r}{rec.label} returned {got} as output {k}, "
                                f"but one example's output is {want} and the batch has size {size}")


def batch_sweep(b: Any, records: Sequence[Record], key: Callable[[Any], Hashable],
                batched: Mapping[Hashable, Any], size: int) -> dict[Hashable, Any]:
    """Batch ``records`` (in topological order): ``batched`` maps the key of a per-example value to its batched
    value (batch axis first, of ``size``). Returns that mapping extended with every value that depends on a
    batched one; values missing from it are the same for every example.
    """
    out: dict[Hashable, Any] = dict(batched)
    for rec in records:
        flags = tuple(key(v) in out for v in rec.inputs)
        if not any(flags):
            continue
        ins = tuple(out[key(v)] if f else v for v, f in zip(rec.inputs, flags, strict=True))
        rule = rec.opdef.batch
        res = rule(b, ins, flags, size, rec.attrs) if rule is not None else None
        res = fallback(b, rec, ins, flags, size) if res is None else _as_list(res)
        _check(rec, res, size)
        for o, r in zip(rec.outputs, res, strict=True):
            out[key(o)] = r
    return out


# ---------------------------------------------------------------- the function level: opgraph.vmap
def _fname(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _check_axes_spec(what: str, spec: Any, name: str) -> None:
    from opgraph.frontend import pytree

    leaves, _ = pytree.flatten(spec, is_leaf=lambda x: x is None)
    for leaf in leaves:
        if leaf is not None and (isinstance(leaf, bool) or not isinstance(leaf, int)):
            raise TypeError(f"{what}: {name} must be an int, None, or a (nested) container with those types as "
                            f"leaves, but got {spec!r}")


def _prefix_axes(what: str, name: str, axes: Any, tree: Any, root: str) -> list[Any]:
    """One axis (an int or None) per leaf of ``tree``, from ``axes``, a tree prefix of it (JAX's rule)."""
    import optree

    from opgraph.frontend import pytree

    try:
        full = optree.broadcast_prefix(axes, tree, none_is_leaf=True, namespace=pytree.NAMESPACE)
    except ValueError:
        _, tspec = pytree.flatten(tree)
        raise ValueError(f"{what}: {name} specification must be a tree prefix of the corresponding value, got "
                         f"specification {axes!r} for value tree {tspec} ({root})") from None
    leaves = optree.tree_leaves(tree, none_is_leaf=True, namespace=pytree.NAMESPACE)
    return [a for a, leaf in zip(full, leaves, strict=True) if leaf is not None]


def _type_str(x: Any) -> str:
    t = x.type
    return f"{t.dtype.name}[{','.join('?' if d is None else str(d) for d in (t.shape or ()))}]"


def _sizes_message(what: str, found: list[tuple[int | None, str]], axis_size: int | None) -> str:
    by: dict[Any, list[str]] = {}
    for n, where in found:
        by.setdefault(n, []).append(where)
    lines = [] if axis_size is None else [f"  * the `axis_size` argument was {axis_size}"]
    groups = sorted(by.items(), key=lambda kv: -len(kv[1]))
    for k, (n, wheres) in enumerate(groups):
        if len(wheres) == 1:
            lines.append(f"  * one axis had size {n}: {wheres[0]}")
        else:
            most = "most" if k == 0 and len(wheres) > len(groups[1][1] if len(groups) > 1 else ()) else "some"
            lines.append(f"  * {most} axes ({len(wheres)} of them) had size {n}, e.g. {wheres[0]}")
    return f"{what} got inconsistent sizes for array axes to be mapped:\n" + ";\n".join(lines)


class VmapFunction:
    """A function mapped over a batch axis of its arguments (made by :func:`vmap`).

    Called with NumPy arrays (or pytrees of them) it runs a graph traced once per signature; called with lazy
    arrays (inside ``opgraph.jit``, ``grad``, another ``vmap``) it records the batched ops lazily.
    ``.graph(*args)`` is the traced batched graph.

    >>> import numpy as np, opgraph.numpy as onp
    >>> f = VmapFunction(lambda x, y: onp.sum(x * y), 0, 0, None)
    >>> f(np.ones((3, 2)), np.arange(6.0).reshape(3, 2))
    array([1., 5., 9.])
    """

    def __init__(self, fn: Callable[..., Any], in_axes: Any, out_axes: Any, axis_size: int | None) -> None:
        import functools

        from opgraph.frontend.trace import TracedFunction

        functools.update_wrapper(self, fn, updated=())
        self.fn = fn
        self.fname = _fname(fn)
        self._what = f"vmap({self.fname})"
        if isinstance(in_axes, list):  # JAX takes a list at the top level as the tuple it means
            in_axes = tuple(in_axes)
        _check_axes_spec(self._what, in_axes, "in_axes")
        _check_axes_spec(self._what, out_axes, "out_axes")
        if axis_size is not None and (isinstance(axis_size, bool) or not isinstance(axis_size, int)
                                      or axis_size < 0):
            raise TypeError(f"{self._what}: axis_size must be a non-negative int or None, got {axis_size!r}")
        self.in_axes = in_axes
        self.out_axes = out_axes
        self.axis_size = axis_size
        # traced by (*args, **kwargs), not by fn's parameters: binding to those would move keyword arguments and
        # defaults among the positional ones, which in_axes counts
        self._traced = TracedFunction(self._lazy, name=self.fname)

    def _arg_names(self, n: int) -> list[str]:
        import inspect

        try:
            params = list(inspect.signature(self.fn).parameters.values())
        except (TypeError, ValueError):
            params = []
        names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        star = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), "args")
        return [names[i] if i < len(names) else f"{star}[{i - len(names)}]" for i in range(n)]

    def _lazy(self, *args: Any, **kwargs: Any) -> Any:
        from opgraph.autodiff import _lazy_records, _LazyEmitter
        from opgraph.frontend import pytree
        from opgraph.frontend.lazy import LazyArray, as_lazy, placeholder
        from opgraph.frontend.trace import is_array
        from opgraph.ops import batch_helpers as bh

        what = self._what
        if isinstance(self.in_axes, tuple):
            if len(self.in_axes) != len(args):
                raise ValueError(f"{what}: in_axes must be an int, None, or a tuple of entries corresponding to the "
                                 f"positional arguments passed to the function, but got "
                                 f"len(in_axes)={len(self.in_axes)}, len(args)={len(args)}")
            arg_axes = list(self.in_axes)
        elif isinstance(self.in_axes, (int, type(None))):
            arg_axes = [self.in_axes] * len(args)
        else:
            raise ValueError(f"{what}: in_axes must be an int, None, or a tuple of entries corresponding to the "
                             f"positional arguments passed to the function, but got {self.in_axes!r}")
        names = self._arg_names(len(args))
        if kwargs:  # keyword arguments are mapped over their leading axis, as in JAX
            names.append("kwargs")
            arg_axes.append(0)
            args = (*args, kwargs)
        b = _LazyEmitter()
        new_args = []
        mapped: list[tuple[Any, int, str]] = []  # (lazy leaf, axis, where) of each mapped leaf
        specs = []
        for i, (arg, ax) in enumerate(zip(args, arg_axes, strict=True)):
            leaves, spec = pytree.flatten(arg)
            axes = _prefix_axes(what, "in_axes", ax, arg, names[i])
            paths = pytree.keystrs(names[i], arg)
            specs.append((spec, leaves, axes, paths))
        for _, leaves, axes, paths in specs:
            for k, (leaf, a, path) in enumerate(zip(leaves, axes, paths, strict=True)):
                if a is None:
                    continue
                if not (is_array(leaf) or isinstance(leaf, (int, float, complex, bool))):
                    raise ValueError(f"{what}: argument {path} is a {type(leaf).__name__}, which cannot be mapped "
                                     f"over (give it in_axes None)")
                x = as_lazy(leaf)
                r = len(x.type.shape or ())
                if not -r <= a < r:
                    raise ValueError(f"{what} was requested to map its argument along axis {a}, which implies that "
                                     f"its rank should be at least {a + 1 if a >= 0 else -a}, but is only {r} "
                                     f"(its shape is {tuple(x.type.shape or ())}): argument {path}")
                leaves[k] = x
                mapped.append((x, a % r, f"axis {a} of argument {path} of type {_type_str(x)}"))
        sizes = [(m[0].type.shape[m[1]], m[2]) for m in mapped]
        wrong_size = self.axis_size is not None and any(n != self.axis_size for n, _ in sizes)
        if wrong_size or len({n for n, _ in sizes}) > 1:
            raise ValueError(_sizes_message(what, sizes, self.axis_size if wrong_size else None))
        if not mapped and self.axis_size is None:
            raise ValueError(f"{what} must have at least one non-None value in in_axes or axis_size must be "
                             "specified")
        size = sizes[0][0] if sizes else self.axis_size
        if size is None:
            raise ValueError(f"{what}: the mapped axis has an unknown size ({mapped[0][2]}); vmap needs it known")
        holders: dict[Hashable, Any] = {}
        alive = []  # the placeholders, kept until the sweep is done: their ids are the keys

        def key(v: Any) -> Hashable:
            return (id(v._node), v._index)

        for spec, leaves, axes, _ in specs:
            for k, a in enumerate(axes):
                if a is None:
                    continue
                x = leaves[k]
                batched = bh.to_front(b, x, a % len(x.type.shape))
                p = placeholder(tuple(x.type.shape[:a % len(x.type.shape)])
                                + tuple(x.type.shape[a % len(x.type.shape) + 1:]), x.dtype,
                                name="vmap_example", weak=x._node.weak)
                holders[key(p)] = batched
                alive.append(p)
                leaves[k] = p
            new_args.append(pytree.unflatten(spec, leaves))
        result = self.fn(*new_args[:len(new_args) - 1], **new_args[-1]) if kwargs else self.fn(*new_args)
        outs, ospec = pytree.flatten(result)
        out_axes = _prefix_axes(what, "out_axes", self.out_axes, result, "the output")
        lazies = []
        for o in outs:
            if not (isinstance(o, LazyArray) or is_array(o) or isinstance(o, (int, float, complex, bool))):
                raise TypeError(f"{what}: {self.fname} returned a {type(o).__name__} as an output leaf, not an array")
            lazies.append(as_lazy(o))
        done = batch_sweep(b, _lazy_records(lazies), key, holders, size)
        final = []
        for o, a, path in zip(lazies, out_axes, pytree.keystrs("output", result), strict=True):
            got = done.get(key(o))
            r = len(o.type.shape or ())
            if a is None:
                if got is not None:
                    raise ValueError(f"{what}: at vmap out_axes, got axis spec None but output was batched on "
                                     f"axis 0 ({path})")
                final.append(o)
                continue
            if not -(r + 1) <= a < r + 1:
                raise ValueError(f"{what}: out_axes {a} is out of bounds for {path}, which has rank {r + 1} "
                                 "once batched")
            if got is None:  # the same for every example: broadcast it, as JAX does
                got = bh.broadcast_batch(b, o, size)
            final.append(bh.move_axis(b, got, 0, a % (r + 1)))
        return pytree.unflatten(ospec, final)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from opgraph.autodiff import _any_lazy

        if _any_lazy((args, kwargs)):
            return self._lazy(*args, **kwargs)
        return self._traced(*args, **kwargs)

    def graph(self, *args: Any, **kwargs: Any) -> Any:
        """The traced graph computing the batched function for these arguments."""
        return self._traced.graph(*args, **kwargs)


def vmap(fun: Callable[..., Any], in_axes: Any = 0, out_axes: Any = 0, axis_size: int | None = None) -> VmapFunction:
    """Vectorise ``fun`` over an axis of its arguments, with ``jax.vmap``'s semantics.

    ``in_axes``: an int (the mapped axis of every argument, negative counts from the end), None (an argument
    shared by every example), or a tuple with one entry per positional argument, each a tree prefix of that
    argument (a dict of axes for a dict argument...). ``out_axes``: where the batch axis goes in the results
    (a tree prefix of the result); an output that is the same for every example is broadcast, unless its
    out_axes entry is None. ``axis_size``: the batch size, needed only when no argument is mapped.
    Composes with ``grad`` (``vmap(grad(f))`` gives per-example gradients), ``jit`` and itself; the batched
    graph is an ordinary graph.

    >>> import numpy as np, opgraph, opgraph.numpy as onp
    >>> xs, w = np.arange(6.0).reshape(3, 2), np.array([1.0, 10.0])
    >>> opgraph.vmap(lambda x, w: onp.dot(x, w), in_axes=(0, None))(xs, w)
    array([10., 32., 54.])
    >>> opgraph.vmap(opgraph.grad(lambda w, x: onp.sum(w * x) ** 2), in_axes=(None, 0))(w, xs)
    array([[  0.,  20.],
           [128., 192.],
           [432., 540.]])
    """
    if not callable(fun):
        raise TypeError(f"vmap: fun must be callable, got {type(fun).__name__}")
    return VmapFunction(fun, in_axes, out_axes, axis_size)
