"""Lazy arrays: NumPy-style arrays that record ops and evaluate on demand.

A :class:`LazyArray` knows its ``shape`` and ``dtype`` at once (types are
inferred when each op is built) but computes its value only when asked
(``np.asarray(x)``, ``float(x)``, ``bool(x)``, ``x.item()``, ``x.eval()``).
The exception is constant folding: an elementwise, reduction, shape or
indexing op on arrays whose values are already known, of at most 4096
elements (an op whose result is a view, such as basic indexing or a
reshape, at any size), is computed as it is built, since that costs less
than recording it (reading an array element by element, ``x[i] == y[i]``,
stays fast); see :func:`opgraph.ops.fold.fold`.
Every lazy expression is a graph: ``x.graph`` is the same core
:class:`Graph` the explicit builder makes for the same program.

NumPy's own functions take lazy arrays (NEP 13 ``__array_ufunc__`` and
NEP 18 ``__array_function__``): ``np.tanh(x)`` or ``np.sum(x, axis=0)``
record the opgraph op and return a lazy array; a NumPy function opgraph
has no op for raises one ``TypeError`` line naming what to use instead
(see :mod:`opgraph.frontend.array_methods` and docs/numpy-functions.md).

    >>> import numpy as np
    >>> import opgraph.numpy as onp
    >>> x = onp.asarray(np.array([[1.0, 2.0], [3.0, 4.0]]))
    >>> y = (x @ x.T).sum(axis=1)
    >>> y.shape, y.dtype
    ((2,), dtype('float64'))
    >>> y.eval()
    array([16., 36.])
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import numpy as np

from opgraph.core.builder import GraphBuilder
from opgraph.core.graph import Graph
from opgraph.core.hooks import Hook
from opgraph.core.registry import OpDef, Resolved, build_error, resolve, user_location
from opgraph.core.types import TensorType, dtype_and_shape, is_dtype
from opgraph.errors import ExecutionError, GraphError, OpTypeError, OutOfMemoryError

_SEQ = itertools.count()
_TRACING = 0  # how many traces are under way (only changes the wording of errors)

ARRAY_NAMESPACE: Hook[ModuleType] = Hook("LazyArray.__array_namespace__", "opgraph.numpy")
"""The module ``__array_namespace__`` returns: :mod:`opgraph.numpy` sets it when imported (it is the
public façade above the frontend layer, so this module cannot import it)."""

ARRAY_METHODS: Hook[Callable[[], None]] = Hook("LazyArray.__array_ufunc__ / __array_function__",
                                               "opgraph.frontend.array_methods")
"""Sets NumPy's dispatch methods on :class:`LazyArray`: :mod:`opgraph.frontend.array_methods` does when imported
(it needs the whole namespace, which is built on this module). Until then the stand-ins below call this hook, which
``opgraph/__init__.py`` fills with a function that imports that module."""


class TracingError(GraphError):
    """A traced function asked for a value that depends on its inputs (e.g. ``if x > 0``)."""


class _Node:
    """One recorded op (or input, or constant) with the types of its outputs."""

    __slots__ = ("attrs", "const", "free", "inputs", "name", "opdef", "seq", "types", "value", "weak")

    def __init__(self, opdef: OpDef | None, attrs: tuple[tuple[str, Any], ...], inputs: tuple[LazyArray, ...],
                 types: tuple[TensorType, ...], *, const: np.ndarray | None = None, name: str | None = None) -> None:
        self.opdef = opdef
        self.attrs = attrs
        self.inputs = inputs
        self.types = types
        self.const = const
        self.name = name
        self.seq = next(_SEQ)
        self.value: tuple[np.ndarray, ...] | None = None
        # depends on a placeholder (which never gets a value), so it cannot be evaluated outside a graph run
        self.free: bool = self.is_input or any(a._node.free for a in inputs)
        # a weakly typed 0-d value (a Python scalar traced by opgraph.jit): takes the other operands' dtype
        self.weak = False

    @property
    def is_input(self) -> bool:
        return self.opdef is None and self.const is None


class LazyArray:
    """A lazily evaluated array; see the module doc. Made by :mod:`opgraph.numpy` functions."""

    __slots__ = ("__weakref__", "_index", "_node")
    __array_priority__ = 1000  # NumPy defers binary operators to us

    def __init__(self, node: _Node, index: int = 0) -> None:
        self._node = node
        self._index = index

    # ------------------------------------------------------------ type
    @property
    def type(self) -> TensorType:
        """The inferred :class:`TensorType`."""
        return self._node.types[self._index]

    @property
    def shape(self) -> tuple[int | None, ...]:
        """The inferred shape. A dim that depends on data (``unique``, ``nonzero``, a boolean mask) is
        ``None`` while the array depends on placeholders; an array computable now is evaluated to tell it.

        >>> import opgraph.numpy as onp
        >>> onp.nonzero(onp.asarray([0, 3, 0, 4]))[0].shape
        (2,)
        >>> onp.nonzero(onp.placeholder((4,), "int64"))[0].shape
        (None,)
        """
        shape = self.type.shape
        if shape is None or None in shape:
            if not _TRACING and not self._node.free:
                return self._value("shape").shape
            if shape is None:
                raise GraphError("this array's rank is unknown until it is evaluated")
        return shape

    @property
    def dtype(self) -> np.dtype:
        """The inferred dtype."""
        return self.type.dtype

    @property
    def ndim(self) -> int:
        """Number of dimensions (known even where dims are not)."""
        rank = self.type.rank
        if rank is None:
            raise GraphError("this array's rank is unknown until it is evaluated")
        return rank

    @property
    def size(self) -> int | None:
        """Number of elements (None if a dimension is unknown)."""
        return self.type.size

    @property
    def device(self) -> str:
        """Always ``"cpu"``."""
        return "cpu"

    def to_device(self, device: Any, /, *, stream: Any = None) -> LazyArray:
        """Array API: only the CPU device exists."""
        if device != "cpu":
            raise ValueError(f"unsupported device {device!r}")
        return self

    def __dlpack__(self, /, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[Any, int] | None = None, copy: bool | None = None) -> Any:
        """DLPack export of the (evaluated) value, NumPy's capsule: ``torch.from_dlpack(x)`` and
        ``np.from_dlpack(x)`` take lazy arrays.

        >>> import numpy as np, opgraph.numpy as onp
        >>> np.from_dlpack(onp.arange(3) * 2)
        array([0, 2, 4])
        """
        kwargs: dict[str, Any] = {"stream": stream, "copy": copy}
        if max_version is not None:
            kwargs["max_version"] = max_version
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        return self._value("__dlpack__()").__dlpack__(**kwargs)

    def __dlpack_device__(self, /) -> tuple[Any, int]:
        """DLPack device: the CPU (kDLCPU, 0)."""
        return (1, 0)

    def __array_namespace__(self, *, api_version: str | None = None) -> Any:
        """Array API: the namespace of lazy arrays, :mod:`opgraph.numpy`."""
        return ARRAY_NAMESPACE.get()

    def __repr__(self) -> str:
        """The value when it is known or cheap, else the type.

        A value already computed (a constant, or an array evaluated before)
        is shown like NumPy shows it; an unevaluated array without
        placeholders is evaluated first when that is cheap (see
        :func:`_cheap_to_evaluate`; the value is then kept). Anything else,
        e.g. a value inside a traced function, shows its type.

        >>> import opgraph.numpy as onp
        >>> onp.asarray([1.0, 2.0]) * 0.5
        LazyArray([0.5, 1. ], dtype=float64)
        >>> onp.placeholder((3, 4), name="x") * 2
        LazyArray(f64[3,4])
        """
        node = self._node
        if node.value is None and _cheap_to_evaluate(node):
            try:
                _evaluate(node, "repr()")
            except Exception:  # repr must not raise; eval() reports the error
                node.value = None
        if node.value is None:
            return f"LazyArray({self.type})"
        value = node.value[self._index]
        body = np.array2string(value, separator=", ", prefix="LazyArray(")
        return f"LazyArray({body}, dtype={value.dtype})"

    # ------------------------------------------------------------ graph
    @property
    def graph(self) -> Graph:
        """The graph computing this array; its inputs are the placeholders it uses."""
        return to_graph([self])

    # ------------------------------------------------------------ evaluation
    def eval(self) -> np.ndarray:
        """Compute (once) and return the value as a NumPy array; the value is kept on the array.

        >>> import opgraph.numpy as onp
        >>> (onp.asarray([1, 2]) + 1).eval()
        array([2, 3])
        """
        return self._value("x.eval()")

    def _value(self, why: str) -> np.ndarray:
        node = self._node
        if node.value is None:
            _evaluate(node, why)
        assert node.value is not None
        return node.value[self._index]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        # np.asarray(x) evaluates: it is the documented way to get a NumPy array. Inside a traced
        # function _evaluate says to use opgraph.numpy instead (NumPy's functions no longer come here:
        # they dispatch through __array_ufunc__ / __array_function__).
        value = self._value("np.asarray()")
        if dtype is not None and np.dtype(dtype) != value.dtype:
            return value.astype(dtype)
        return value.copy() if copy else value

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """NEP 13: ``np.tanh(x)``, ``np.add(ndarray, x)``, ``np.add.reduce(x)`` record opgraph ops.

        A stand-in: the first call attaches :func:`opgraph.frontend.array_methods.array_ufunc` (which then
        replaces it) and calls it. NumPy looks the method up on the class, so it must exist from the start.

        >>> import numpy as np, opgraph.numpy as onp
        >>> np.tanh(onp.asarray([0.0]))
        LazyArray([0.], dtype=float64)
        """
        return _attached("__array_ufunc__")(self, ufunc, method, *inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """NEP 18: ``np.sum(x, axis=0)``, ``np.linalg.norm(x)``... call the opgraph.numpy function.

        A stand-in, as ``__array_ufunc__`` is, for :func:`opgraph.frontend.array_methods.array_function`.

        >>> import numpy as np, opgraph.numpy as onp
        >>> np.sum(onp.asarray([[1, 2], [3, 4]]), axis=0)
        LazyArray([4, 6], dtype=int64)
        """
        return _attached("__array_function__")(self, func, types, args, kwargs)

    def item(self, *args: Any) -> Any:
        """Evaluate and return one element as a Python scalar (NumPy's ``item``).

        >>> import opgraph.numpy as onp
        >>> onp.sum(onp.asarray([0.5, 0.25])).item()
        0.75
        """
        if not args and self.type.size not in (None, 1):
            raise ValueError(f"can only convert an array of size 1 to a Python scalar; this one is {self.type}")
        return self._value("x.item()").item(*args)

    def __float__(self) -> float:
        return float(self._scalar("float"))

    def __int__(self) -> int:
        return int(self._scalar("int"))

    def __complex__(self) -> complex:
        return complex(self._scalar("complex"))

    def __bool__(self) -> bool:
        return bool(self._scalar("bool"))

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer arrays can be used as an index, not {self.dtype}")
        return int(self._scalar("index"))

    def __format__(self, spec: str) -> str:
        if not spec:
            return str(self)
        return format(self._value("format()"), spec)  # NumPy formats 0-d arrays like their scalar

    def _scalar(self, what: str) -> Any:
        if self.type.shape is not None and self.type.size not in (None, 1):
            raise TypeError(f"only size-1 arrays convert to Python {what}s; this one is {self.type}")
        return self._value(f"{what}()").item()

    def __len__(self) -> int:
        n = self.shape[0] if self.shape else None
        if n is None:
            if not self.shape:
                raise TypeError("len() of a 0-d array")
            n = self._value("len()").shape[0]
        return n

    def __iter__(self) -> Any:
        for i in range(len(self)):
            yield self[i]

    # ------------------------------------------------------------ operators
    def __add__(self, o: Any) -> LazyArray: return apply("add", self, o)
    def __radd__(self, o: Any) -> LazyArray: return apply("add", o, self)
    def __sub__(self, o: Any) -> LazyArray: return apply("subtract", self, o)
    def __rsub__(self, o: Any) -> LazyArray: return apply("subtract", o, self)
    def __mul__(self, o: Any) -> LazyArray: return apply("multiply", self, o)
    def __rmul__(self, o: Any) -> LazyArray: return apply("multiply", o, self)
    def __truediv__(self, o: Any) -> LazyArray: return apply("divide", self, o)
    def __rtruediv__(self, o: Any) -> LazyArray: return apply("divide", o, self)
    def __floordiv__(self, o: Any) -> LazyArray: return apply("floor_divide", self, o)
    def __rfloordiv__(self, o: Any) -> LazyArray: return apply("floor_divide", o, self)
    def __mod__(self, o: Any) -> LazyArray: return apply("remainder", self, o)
    def __rmod__(self, o: Any) -> LazyArray: return apply("remainder", o, self)
    def __pow__(self, o: Any) -> LazyArray: return apply("power", self, o)
    def __rpow__(self, o: Any) -> LazyArray: return apply("power", o, self)
    def __matmul__(self, o: Any) -> LazyArray: return apply("matmul", self, o)
    def __rmatmul__(self, o: Any) -> LazyArray: return apply("matmul", o, self)
    def __and__(self, o: Any) -> LazyArray: return apply("bitwise_and", self, o)
    def __rand__(self, o: Any) -> LazyArray: return apply("bitwise_and", o, self)
    def __or__(self, o: Any) -> LazyArray: return apply("bitwise_or", self, o)
    def __ror__(self, o: Any) -> LazyArray: return apply("bitwise_or", o, self)
    def __xor__(self, o: Any) -> LazyArray: return apply("bitwise_xor", self, o)
    def __rxor__(self, o: Any) -> LazyArray: return apply("bitwise_xor", o, self)
    def __lshift__(self, o: Any) -> LazyArray: return apply("bitwise_left_shift", self, o)
    def __rlshift__(self, o: Any) -> LazyArray: return apply("bitwise_left_shift", o, self)
    def __rshift__(self, o: Any) -> LazyArray: return apply("bitwise_right_shift", self, o)
    def __rrshift__(self, o: Any) -> LazyArray: return apply("bitwise_right_shift", o, self)
    def __neg__(self) -> LazyArray: return apply("negative", self)
    def __pos__(self) -> LazyArray: return apply("positive", self)
    def __abs__(self) -> LazyArray: return apply("abs", self)
    def __invert__(self) -> LazyArray: return apply("bitwise_invert", self)
    def __lt__(self, o: Any) -> LazyArray: return apply("less", self, o)
    def __le__(self, o: Any) -> LazyArray: return apply("less_equal", self, o)
    def __gt__(self, o: Any) -> LazyArray: return apply("greater", self, o)
    def __ge__(self, o: Any) -> LazyArray: return apply("greater_equal", self, o)
    def __eq__(self, o: Any) -> LazyArray: return apply("equal", self, o)  # type: ignore[override]
    def __ne__(self, o: Any) -> LazyArray: return apply("not_equal", self, o)  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]

    def __getitem__(self, key: Any) -> LazyArray:
        from opgraph.frontend import indexing

        return indexing.getitem(self, key)

    def __setitem__(self, key: Any, value: Any, /) -> None:
        """A functional update: this array now names a copy with ``self[key]`` replaced (see
        :mod:`opgraph.frontend.indexing`); arrays computed from it before keep their values.

        >>> import opgraph.numpy as onp
        >>> x = onp.zeros(3)
        >>> x[1] = 2.0
        >>> x.eval()
        array([0., 2., 0.])
        """
        from opgraph.frontend import indexing

        updated = indexing.setitem(self, key, value)
        self._node, self._index = updated._node, updated._index

    # ------------------------------------------------------------ methods
    @property
    def T(self) -> LazyArray:
        """Transpose (all axes reversed)."""
        return apply("permute_dims", self, axes=None)

    @property
    def mT(self) -> LazyArray:
        """Transpose of the last two axes (the namespace's ``matrix_transpose``)."""
        if self.ndim < 2:
            raise ValueError("matrix_transpose needs at least 2 dimensions")
        return apply("permute_dims", self, axes=(*range(self.ndim - 2), self.ndim - 1, self.ndim - 2))

    def astype(self, dtype: Any, copy: bool = True) -> LazyArray:
        """Cast to ``dtype``."""
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return apply("cast", self, dtype=dtype)

    def reshape(self, *shape: Any) -> LazyArray:
        """Reshape (NumPy's method: shape as one tuple or several ints)."""
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        return apply("reshape", self, shape=shape)

    def sum(self, axis: Any = None, keepdims: bool = False) -> LazyArray:
        """Sum over axes."""
        return apply("sum", self, axis=axis, keepdims=keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> LazyArray:
        """Mean over axes."""
        return apply("mean", self, axis=axis, keepdims=keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> LazyArray:
        """Maximum over axes."""
        return apply("max", self, axis=axis, keepdims=keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> LazyArray:
        """Minimum over axes."""
        return apply("min", self, axis=axis, keepdims=keepdims)

    def prod(self, axis: Any = None, keepdims: bool = False) -> LazyArray:
        """Product over axes."""
        return apply("prod", self, axis=axis, keepdims=keepdims)

    def argmax(self, axis: int | None = None, keepdims: bool = False) -> LazyArray:
        """Index of the maximum."""
        return apply("argmax", self, axis=axis, keepdims=keepdims)

    def argmin(self, axis: int | None = None, keepdims: bool = False) -> LazyArray:
        """Index of the minimum."""
        return apply("argmin", self, axis=axis, keepdims=keepdims)

    def transpose(self, *axes: Any) -> LazyArray:
        """Permute axes (NumPy's method)."""
        if len(axes) == 1 and (axes[0] is None or not isinstance(axes[0], int)):
            axes = axes[0]
        return apply("permute_dims", self, axes=axes or None)

    def flatten(self) -> LazyArray:
        """A 1-D copy."""
        return apply("reshape", self, shape=(-1,))

    ravel = flatten

    def squeeze(self, axis: Any = None) -> LazyArray:
        """Drop size-1 axes."""
        return apply("squeeze", self, axis=axis)


_STAND_INS = {"__array_ufunc__": LazyArray.__array_ufunc__, "__array_function__": LazyArray.__array_function__}


def _attached(name: str) -> Callable[..., Any]:
    """LazyArray's method ``name`` as :mod:`opgraph.frontend.array_methods` sets it (attached first if needed)."""
    ARRAY_METHODS.get()()
    method = LazyArray.__dict__[name]
    if method is _STAND_INS[name]:  # a hook that attached nothing would make the stand-in call itself forever
        raise GraphError(f"LazyArray.{name} was not attached by {ARRAY_METHODS.provider}")
    return method


@contextmanager
def tracing() -> Iterator[None]:
    """Mark a trace under way (``@opgraph.function``, a control-flow body, a training step): within the block,
    an array asked for a value that needs a placeholder says "traced value" (the error of a traced function, with
    hints) instead of naming the placeholder, and ``shape`` keeps data-dependent dims ``None``.

    >>> import opgraph.numpy as onp
    >>> x = onp.placeholder((), name="x")
    >>> with tracing():
    ...     bool(x > 0)
    Traceback (most recent call last):
    ...
    opgraph.frontend.lazy.TracingError: bool() of a traced value (it depends on input x): ...
    """
    global _TRACING
    _TRACING += 1
    try:
        yield
    finally:
        _TRACING -= 1


def _weak_dtype(x: Any, others: Sequence[Any]) -> np.dtype:
    # Python scalars are "weak" (NEP 50): they take the dtype of the array operands.
    dts = [o.dtype for o in others if isinstance(o, (LazyArray, np.ndarray, np.generic))]
    return np.result_type(*dts, x) if dts else np.result_type(x)


def constant(value: Any, dtype: Any = None, name: str | None = None) -> LazyArray:
    """A lazy array holding a known value (a graph constant)."""
    arr = np.array(value, dtype=dtype)
    if not arr.flags.c_contiguous:
        arr = arr.copy()
    node = _Node(None, (), (), (TensorType(arr.dtype, arr.shape),), const=arr, name=name)
    node.value = (arr,)
    return LazyArray(node)


def placeholder(shape: Any, dtype: Any = np.float64, name: str | None = None, *, weak: bool = False) -> LazyArray:
    """A lazy array with a type but no value: an input of the graph it feeds.

    A ``weak`` placeholder (0-d) stands for a Python scalar, as JAX traces one: next to array operands of
    another dtype it is cast to the dtype a Python scalar would take there (NEP 50), so ``x_f32 * lr`` stays
    float32 whatever ``lr``'s own (float64) input type.

    >>> import opgraph.numpy as onp
    >>> x = onp.placeholder((None, 3), "float32", name="x")
    >>> (x * 2).shape
    (None, 3)
    >>> (x * placeholder((), "float64", name="lr", weak=True)).dtype
    dtype('float32')

    A shape and a dtype cannot be taken for each other, so the dtype first (``GraphBuilder.placeholder``'s
    order) is read the same: ``placeholder("float32", (None, 3))`` is ``x``'s type.
    """
    dtype, shape = dtype_and_shape(dtype, shape)
    try:
        if is_dtype(shape):
            raise OpTypeError(f"{shape!r} is a dtype, not a shape")
        t = TensorType(dtype, shape)
    except OpTypeError as exc:  # name the call, its expected arguments and the user's line, as GraphBuilder.input
        raise build_error("placeholder", [], f"{exc}; opgraph.numpy.placeholder takes placeholder(shape, "
                                             f"dtype='float64'), e.g. placeholder((2, 3), 'float64') (dtype first "
                                             f"is read the same)") from None
    node = _Node(None, (), (), (t,), name=name)
    node.weak = weak
    return LazyArray(node)


_WEAK_EXAMPLE = {"b": True, "i": 0, "u": 0, "f": 0.0, "c": 0j}  # a Python scalar of each dtype kind


def _strengthen(args: tuple[Any, ...]) -> tuple[tuple[Any, ...], bool]:
    """Cast weak lazy arguments to the dtype a Python scalar of their kind takes next to the strong ones;
    and whether the op's result is weak too (no strong operand)."""
    weak = [isinstance(a, LazyArray) and a._node.weak for a in args]
    if not any(weak):
        return args, False
    strong = [a for a, w in zip(args, weak, strict=True)
              if not w and not isinstance(a, (bool, int, float, complex))
              and isinstance(a, (LazyArray, np.ndarray, np.generic))]
    if not strong:
        return args, True
    out = list(args)
    for i, w in enumerate(weak):
        if w:
            dt = _weak_dtype(_WEAK_EXAMPLE.get(args[i].dtype.kind, 0.0), strong)
            out[i] = _record("cast", (args[i],), {"dtype": dt.name}) if dt != args[i].dtype else args[i]
    return tuple(out), False


def as_lazy(x: Any, others: Sequence[Any] = ()) -> LazyArray:
    """Wrap arrays and Python scalars as lazy constants; pass lazy arrays through."""
    if isinstance(x, LazyArray):
        return x
    if isinstance(x, (bool, int, float, complex)):
        return constant(x, dtype=_weak_dtype(x, others))
    return constant(x)


def apply(kind: str | OpDef, *args: Any, **attrs: Any) -> Any:
    """Record op ``kind`` on ``args``; return a LazyArray, or a tuple for 0 or several outputs.

    >>> import opgraph.numpy as onp
    >>> apply("add", onp.asarray([1, 2]), 3).eval()
    array([4, 5])
    """
    args, weak = _strengthen(args)
    node = _record_node(kind, args, attrs)
    if weak and len(node.types) == 1 and node.types[0].shape == () and all(
            a.dtype == node.types[0].dtype for a in args if isinstance(a, LazyArray)):
        node.weak = True  # arithmetic on weak scalars stays weak (lr * 0.5), as in JAX
    if len(node.types) == 1:
        return LazyArray(node, 0)
    return tuple(LazyArray(node, i) for i in range(len(node.types)))


def _record_node(kind: str | OpDef, args: tuple[Any, ...], attrs: dict[str, Any]) -> _Node:
    # Fresh handles: x[key] = v rebinds the user's handle x, which must not change ops already built on x.
    inputs = tuple(LazyArray(a._node, a._index) for a in (as_lazy(a, args) for a in args))
    r: Resolved = resolve(kind, [a.type for a in inputs], attrs)
    node = _Node(r.opdef, r.attrs, inputs, r.out_types)  # type: ignore[arg-type]
    _fold_small(node, r)
    return node


def _record(kind: str, args: tuple[Any, ...], attrs: dict[str, Any]) -> LazyArray:
    """One single-output op, recorded as it is (no weak-scalar promotion)."""
    return LazyArray(_record_node(kind, args, attrs), 0)


def _fold_small(node: _Node, r: Resolved) -> None:
    """Compute a small op on known values at once (constant folding), with the op's reference kernel.

    Interactive use reads arrays element by element (``x[i] == y[i]``); building and running a graph for each
    would cost a millisecond. Anything the fold cannot do quietly (a kernel error, a warning, a result of
    another type) is left for evaluation, which reports it as usual.
    """
    if node.opdef is None or "linear_time" not in node.opdef.traits or not node.inputs:
        return
    if any(a._node.value is None for a in node.inputs):
        return
    if node.opdef.name == "cast" and node.inputs[0].dtype.kind == "c" and r.out_types[0].dtype.kind != "c":
        return  # NumPy's ComplexWarning belongs to evaluation
    from opgraph.ops.fold import fold  # here, not at the top: `import opgraph` stays as light as it was

    # errstate "raise" (thread-local, unlike warning filters): overflow, division by zero or invalid values drop
    # the fold, so evaluation warns as it always does; a kernel's error too (evaluation reports it, with the
    # user's line). An output of unknown size (data-dependent) gets its value's type.
    arrays = fold(node.opdef, dict(r.attrs), r.version, [a._value("fold") for a in node.inputs], r.out_types,
                  limit=None if "view" in node.opdef.traits else _FOLD_MAX_ELEMENTS,  # a view costs nothing
                  in_types=[a.type for a in node.inputs], errstate="raise", catch=True, refine=True)
    if arrays is not None:
        _set_value(node, arrays)


def _set_value(node: _Node, values: tuple[np.ndarray, ...]) -> None:
    """Keep a computed value on ``node``; it is fixed now, so dims that were data-dependent become known (ops
    built on it later get static types)."""
    node.value = values
    node.types = tuple(t if t.is_static else TensorType(t.dtype, np.shape(v))
                       for t, v in zip(node.types, values, strict=True))


def collect_nodes(roots: Iterable[_Node], stop_at_values: bool) -> list[_Node]:
    """The recorded nodes ``roots`` depend on (``x._node`` of each lazy array ``x``, themselves included), in the
    order they were built; with ``stop_at_values``, the walk does not go past a node whose value is known.

    >>> import opgraph.numpy as onp
    >>> x = onp.placeholder((2,), name="x")
    >>> [n.opdef.name if n.opdef else n.name for n in collect_nodes([(onp.exp(x) + 1)._node], False)]
    ['x', 'exp', None, 'add']
    """
    seen: dict[int, _Node] = {}
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        if stop_at_values and node.value is not None:
            continue
        stack.extend(a._node for a in node.inputs)
    return sorted(seen.values(), key=lambda n: n.seq)


def _build(nodes: list[_Node], builder: GraphBuilder, as_input: set[int],
           input_order: Sequence[_Node] | None = None,
           bound: dict[int, tuple[Any, ...]] | None = None) -> dict[int, tuple[Any, ...]]:
    values: dict[int, tuple[Any, ...]] = dict(bound or {})
    if input_order is not None:
        for node in input_order:
            values[id(node)] = (builder.input(node.types[0], name=node.name),)
    for node in nodes:
        if id(node) in values:
            continue
        if id(node) in as_input:
            values[id(node)] = tuple(builder.input(t) for t in node.types)
        elif node.const is not None:
            values[id(node)] = (builder.constant(node.const, name=node.name),)
        elif node.is_input:
            if input_order is not None:
                raise TracingError(f"the function uses a placeholder {node.name or ''} that is not one of its inputs")
            values[id(node)] = (builder.input(node.types[0], name=node.name),)
        else:
            ins = [values[id(a._node)][a._index] for a in node.inputs]
            out = builder.op(node.opdef, *ins, **dict(node.attrs))  # type: ignore[arg-type]
            values[id(node)] = out if isinstance(out, tuple) else (out,)
    return values


def to_graph(outputs: Sequence[LazyArray], inputs: Sequence[LazyArray] | None = None) -> Graph:
    """The core graph computing ``outputs`` from placeholder ``inputs``.

    Ops appear in the order the program built them, so the graph equals the
    one the explicit builder makes for the same program. Without ``inputs``,
    every placeholder used becomes an input, in creation order.

    >>> import opgraph.numpy as onp
    >>> x = onp.placeholder((3,), name="x")
    >>> print(to_graph([onp.exp(x)]))
    graph(%x: f64[3]) {
      %1: f64[3] = exp(%x)
      return %1
    }
    """
    outputs = [as_lazy(o) for o in outputs]
    nodes = collect_nodes([o._node for o in outputs], stop_at_values=False)
    order = None
    if inputs is not None:
        order = [i._node for i in inputs]
        for i in inputs:
            if not i._node.is_input:
                raise TracingError("graph inputs must be placeholders")
    b = GraphBuilder()
    values = _build(nodes, b, set(), order)
    b.output(*(values[id(o._node)][o._index] for o in outputs))
    return b.freeze()


def append_to(builder: GraphBuilder, outputs: Sequence[LazyArray],
              bound: Sequence[tuple[LazyArray, Any]] = ()) -> list[Any]:
    """Append the ops computing lazy ``outputs`` to ``builder``; return the builder values of the outputs.

    ``bound`` pairs a lazy array used by the outputs (a placeholder, or a
    constant to be turned into a parameter) with the builder value standing
    for it; other placeholders become new inputs (with their names).

    >>> import numpy as np, opgraph, opgraph.numpy as onp
    >>> x = onp.placeholder((2,), name="x")
    >>> b = opgraph.GraphBuilder()
    >>> w = b.input(("float64", (2,)), name="w")
    >>> (y,) = append_to(b, [x * onp.asarray([1.0, 2.0])], bound=[(x, w)])
    >>> b.run({"w": np.ones(2)}, [y])[0]
    array([1., 2.])
    """
    outputs = [as_lazy(o) for o in outputs]
    nodes = collect_nodes([o._node for o in outputs], stop_at_values=False)
    values = _build(nodes, builder, set(), bound={id(a._node): (v,) for a, v in bound})
    return [values[id(o._node)][o._index] for o in outputs]


# What a traced function can do instead of asking for a value, by what asked for it (the error says it in one line).
_TRACED_HINTS = {
    "bool()": "inside a traced function, Python control flow (if, while, and/or) cannot depend on the function's "
              "inputs; use onp.where(), opgraph.cond or opgraph.while_loop, or make the value a static argument",
    "np.asarray()": "the value is only known when the function runs; use opgraph.numpy (onp.tanh) instead of "
                    "NumPy functions inside @opgraph.function, or return the value",
}
_TRACED_DEFAULT_HINT = ("the value is only known when the function runs; keep it a lazy array (use opgraph.numpy "
                        "functions), return it, or make it a static argument")

# repr() evaluates an unevaluated array without placeholders only below these bounds (ops still to run, and the
# elements they read and write), so printing never starts a long computation.
_REPR_MAX_OPS = 64
_REPR_MAX_ELEMENTS = 1 << 16
# Ops on known values up to this many elements (each input and output) are computed when built, for the kinds
# whose cost is about linear in that size (the linear_time trait; no contractions, linear algebra or convolutions:
# those wait for eval()).
_FOLD_MAX_ELEMENTS = 1 << 12


def _cheap_to_evaluate(target: _Node) -> bool:
    """Whether ``target`` can be computed now at a small bounded cost (no placeholders, few small ops).

    >>> import opgraph.numpy as onp
    >>> _cheap_to_evaluate((onp.ones(3) + 1)._node), _cheap_to_evaluate(onp.placeholder((3,))._node)
    (True, False)
    """
    # a bounded walk (not collect_nodes): a huge symbolic graph must not make repr() slow either
    seen: set[int] = set()
    stack = [target]
    total = 0
    while stack:
        node = stack.pop()
        if id(node) in seen or node.value is not None:
            continue
        seen.add(id(node))
        if node.is_input or len(seen) > _REPR_MAX_OPS:
            return False
        for t in (*node.types, *(a.type for a in node.inputs)):
            if t.size is None:
                return False
            total += t.size
        if total > _REPR_MAX_ELEMENTS:
            return False
        stack.extend(a._node for a in node.inputs)
    return True


def _evaluate(target: _Node, why: str = "x.eval()") -> None:
    nodes = collect_nodes([target], stop_at_values=True)
    pending = [n for n in nodes if n.is_input and n.value is None]
    if pending:
        p = pending[0]
        where = user_location()
        at = f" (at {where})" if where else ""
        if _TRACING:
            name = f" (it depends on input {p.name})" if p.name else ""
            raise TracingError(f"{why} of a traced value{name}: {_TRACED_HINTS.get(why, _TRACED_DEFAULT_HINT)}{at}")
        raise TracingError(
            f"this array depends on placeholder {p.name or ('of type ' + repr(p.types[0]))}, which has no value"
            f" ({why} needs it){at}")
    known = {id(n) for n in nodes if n.value is not None and n is not target}
    b = GraphBuilder(hash_cons=False)
    values = _build(nodes, b, known)
    feeds = {}
    for n in nodes:
        if id(n) in known:
            for v, arr in zip(values[id(n)], n.value, strict=True):  # type: ignore[arg-type]
                feeds[v] = arr
    targets = list(values[id(target)])
    try:
        results = b.run(feeds, targets)
    except ExecutionError as exc:
        where = user_location()
        message = f"{exc}" + (f" (evaluating the array built at {where})" if where else "")
        if isinstance(exc, OutOfMemoryError):  # still a MemoryError, with its op and bytes
            raise OutOfMemoryError(message, op=exc.op, requested=exc.requested, limit=exc.limit) from exc
        raise ExecutionError(message) from exc
    _set_value(target, tuple(results))
