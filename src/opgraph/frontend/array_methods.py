"""NumPy's own functions on lazy arrays: the NEP 13 / NEP 18 methods of :class:`LazyArray`.

``np.tanh(x)``, ``np.sum(x, axis=0)`` or ``np.linalg.norm(x)`` on a lazy array
record the opgraph op of the same meaning; anything else raises one
``TypeError`` line naming what to use (a NumPy function must never evaluate
a lazy array behind the user's back: inside ``@opgraph.function`` it cannot).
The dispatch needs the whole namespace (:mod:`opgraph.frontend.api` and
:mod:`opgraph.frontend.array_api`), which sits above :mod:`opgraph.frontend.lazy`;
so, as JAX's ``array_methods`` does, this module imports both and sets
``__array_ufunc__`` and ``__array_function__`` on :class:`LazyArray` when it
is imported. :mod:`opgraph.numpy` imports it; before that, the stand-ins that
``lazy`` defines import it through :data:`opgraph.frontend.lazy.ARRAY_METHODS`
(filled by ``opgraph/__init__.py``) on first use.

    >>> import numpy as np, opgraph.numpy as onp
    >>> x = onp.asarray([[1.0, 2.0], [3.0, 4.0]])
    >>> np.tanh(x).shape, np.sum(x, axis=0).eval()
    ((2, 2), array([4., 6.]))
    >>> np.isclose(x, x)
    Traceback (most recent call last):
    ...
    TypeError: np.isclose is not supported on opgraph lazy arrays; use onp.abs(a - b) <= atol + rtol * onp.abs(b) ...
"""

from __future__ import annotations

import functools
import inspect
import reprlib
from typing import Any, NamedTuple

import numpy as np

from opgraph.frontend import api, array_api, lazy
from opgraph.frontend.lazy import LazyArray, apply, as_lazy

_ONP = "import opgraph.numpy as onp"
_EVAL_FIRST = "call .eval() or np.asarray(x) first to compute a NumPy array"
_ONLY_DEFAULT = "opgraph supports only NumPy's default for this parameter"


def _np_name(func: Any) -> str:
    module = getattr(func, "__module__", None) or "numpy"
    module = "np" + module[len("numpy"):] if module.startswith("numpy") else module
    return f"{module}.{getattr(func, '__name__', func)}"


def _unsupported(what: str, instead: str | None = None, why: str = "opgraph has no op for it") -> TypeError:
    alternative = f"use {instead} ({_ONP})" if instead else f"{why}; {_EVAL_FIRST}"
    return TypeError(f"{what} is not supported on opgraph lazy arrays; {alternative}")


def _no_out(what: str) -> TypeError:
    return TypeError(f"{what}(..., out=...) is not supported on opgraph lazy arrays: their values are immutable "
                     "(x[key] = v makes x name an updated copy); use the returned array")


def _ufunc_lambda(fn: Any, name: str) -> Any:
    fn.__name__ = fn.__qualname__ = name
    return fn


# NumPy ufunc name -> the opgraph.numpy function with the same meaning (or a composite of them).
_UFUNC_TABLE: dict[str, Any] = {
    **{n: n for n in (
        "add", "subtract", "multiply", "divide", "floor_divide", "remainder", "fmod", "power", "negative",
        "positive", "sign", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "square", "cbrt",
        "reciprocal", "sin", "cos", "tan", "sinh", "cosh", "tanh", "hypot", "logaddexp", "maximum", "minimum",
        "fmax", "fmin", "copysign", "nextafter", "signbit", "floor", "ceil", "trunc", "isfinite", "isinf",
        "isnan", "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and",
        "logical_or", "logical_xor", "logical_not", "bitwise_and", "bitwise_or", "bitwise_xor", "matmul",
        "vecdot")},
    "absolute": "abs", "fabs": "abs", "arcsin": "asin", "arccos": "acos", "arctan": "atan", "arctan2": "atan2",
    "arcsinh": "asinh", "arccosh": "acosh", "arctanh": "atanh", "rint": "round", "conjugate": "conj",
    "invert": "bitwise_invert", "left_shift": "bitwise_left_shift", "right_shift": "bitwise_right_shift",
    "deg2rad": _ufunc_lambda(lambda x: apply("multiply", x, np.pi / 180), "deg2rad"),
    "rad2deg": _ufunc_lambda(lambda x: apply("multiply", x, 180 / np.pi), "rad2deg"),
    "float_power": _ufunc_lambda(
        lambda x, y: apply("power", *(as_lazy(a).astype(np.promote_types(as_lazy(a).dtype, np.float64))
                                      for a in (x, y))), "float_power"),
    "divmod": _ufunc_lambda(lambda x, y: (apply("floor_divide", x, y), apply("remainder", x, y)), "divmod"),
    "matvec": _ufunc_lambda(lambda a, v: api.squeeze(api.matmul(a, api.expand_dims(v, axis=-1)), axis=-1),
                            "matvec"),
    "vecmat": _ufunc_lambda(
        lambda v, a: api.squeeze(api.matmul(api.expand_dims(apply("conj", v), axis=-2), a), axis=-2), "vecmat"),
}
# What to write instead of a ufunc opgraph has no op for.
_UFUNC_HINTS = {
    "heaviside": "onp.where(x < 0, 0.0, onp.where(x > 0, 1.0, h))",
    "logaddexp2": "onp.logaddexp(x * onp.log(2.0), y * onp.log(2.0)) / onp.log(2.0)",
    "ldexp": "x * onp.exp2(e)",
}
# ufunc.reduce / ufunc.accumulate -> the opgraph reduction; NumPy's default axis there is 0, not None.
_UFUNC_REDUCE = {"add": "sum", "multiply": "prod", "maximum": "max", "minimum": "min", "logical_and": "all",
                 "logical_or": "any"}
_UFUNC_ACCUMULATE = {"add": "cumsum", "multiply": "cumprod"}


# keyed by the ufunc object, not its name: another library's ufunc (scipy.special.erf) is not NumPy's
_UFUNC_BY_OBJECT: dict[np.ufunc, Any] = {
    getattr(np, n): t for n, t in _UFUNC_TABLE.items() if isinstance(getattr(np, n, None), np.ufunc)}


def _ufunc_target(ufunc: np.ufunc) -> Any:
    target = _UFUNC_BY_OBJECT.get(ufunc)
    return getattr(api, target) if isinstance(target, str) else target


def _check_ufunc_kwargs(what: str, kwargs: dict[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    kwargs = dict(kwargs)
    out = kwargs.pop("out", None)
    if out is not None and not (isinstance(out, tuple) and all(o is None for o in out)):
        raise _no_out(what)
    where_ = kwargs.pop("where", True)
    if where_ is not True:
        raise _unsupported(f"{what}(..., where=...)", "onp.where(mask, result, other)")
    for key, default in (("casting", "same_kind"), ("order", "K"), ("subok", True), ("signature", None)):
        if key in kwargs and kwargs.pop(key) != default:
            raise _unsupported(f"{what}(..., {key}=...)", why=_ONLY_DEFAULT)
    extra = sorted(set(kwargs) - set(allowed))
    if extra:
        raise _unsupported(f"{what}(..., {extra[0]}=...)", why=_ONLY_DEFAULT)
    return kwargs


def array_ufunc(self: LazyArray, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
    """``LazyArray.__array_ufunc__`` (NEP 13): a NumPy ufunc on lazy arrays (and NumPy arrays, scalars) records
    an op.

    >>> import numpy as np, opgraph.numpy as onp
    >>> x = onp.asarray([1.0, 4.0])
    >>> np.sqrt(x).eval(), np.add(np.ones(2), x).eval(), np.add.reduce(x).eval()
    (array([1., 2.]), array([2., 5.]), array(5.))
    """
    for a in (*inputs, *(kwargs.get("out") or ())):
        # NEP 13: defer to other array types we do not know (they may know us); NumPy arrays become constants.
        if not isinstance(a, (LazyArray, np.ndarray, np.generic)) and hasattr(type(a), "__array_ufunc__"):
            return NotImplemented
    name = f"np.{ufunc.__name__}" if getattr(np, ufunc.__name__, None) is ufunc else ufunc.__name__
    target = _ufunc_target(ufunc)
    if method == "__call__":
        if target is None:
            same_name = f"onp.{ufunc.__name__}" if ufunc.__name__ in api.__all__ else None
            raise _unsupported(name, _UFUNC_HINTS.get(ufunc.__name__, same_name))
        kw = _check_ufunc_kwargs(name, kwargs, ("dtype", "axis") if ufunc is getattr(np, "vecdot", 0) else ("dtype",))
        dtype = kw.pop("dtype", None)
        args = [as_lazy(a, inputs) for a in inputs]
        if dtype is not None:  # NumPy's dtype= picks the loop: the inputs are cast to it
            args = [a.astype(dtype) for a in args]
        return target(*args, **kw)
    what = f"{name}.{method}"
    along = {"reduce": _UFUNC_REDUCE, "accumulate": _UFUNC_ACCUMULATE}.get(method, {}).get(ufunc.__name__)
    if along is not None and target is not None:
        keys = ("axis", "dtype", "keepdims") if method == "reduce" else ("axis", "dtype")
        kw = _check_ufunc_kwargs(what, kwargs, keys)
        kw.setdefault("axis", 0)  # NumPy's default axis for reduce/accumulate, not None
        dtype = kw.pop("dtype", None)
        x = as_lazy(inputs[0])
        return apply(along, x if dtype is None else x.astype(dtype), **kw)
    if method == "outer" and target is not None and ufunc.nin == 2:
        _check_ufunc_kwargs(what, kwargs, ())
        a, b = (as_lazy(v, inputs) for v in inputs)
        return target(api.reshape(a, (*a.shape, *(1,) * b.ndim)), b)
    if method == "reduce" and ufunc.__name__ in ("bitwise_and", "bitwise_or", "bitwise_xor", "logical_xor"):
        raise _unsupported(what)
    instead = {"reduce": "a reduction such as onp.sum / onp.prod / onp.max",
               "accumulate": "onp.cumsum / onp.cumprod",
               "at": "x[idx] = new or onp.where(mask, new, x) (values are immutable)",
               "outer": "broadcasting: f(x[:, None], y)", "reduceat": None}.get(method)
    raise _unsupported(what, instead)


def _is_default(key: str, value: Any, default: Any) -> bool:
    if value is None or value is np._NoValue or value is default or (key == "where" and value is True):
        return True
    return isinstance(value, (bool, int, float, str)) and type(value) is type(default) and value == default


def _np_where(condition: Any, x: Any = None, y: Any = None, /) -> Any:
    if x is None and y is None:
        raise _unsupported("np.where(condition) with one argument (its shape depends on the data)",
                           "onp.where(condition, x, y)")
    return api.where(condition, x, y)


def _np_round(a: Any, decimals: int = 0, out: Any = None) -> LazyArray:
    if out is not None:
        raise _no_out("np.round")
    a = as_lazy(a)
    if decimals == 0 or a.dtype.kind not in "fc":
        return apply("round", a)
    scale = 10.0 ** decimals  # NumPy's own method: scale, round half to even, scale back
    return apply("divide", apply("round", apply("multiply", a, scale)), scale)


def _np_trace(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype: Any = None,
              out: Any = None) -> LazyArray:
    if out is not None:
        raise _no_out("np.trace")
    return api.linalg.trace(api.moveaxis(a, (axis1, axis2), (-2, -1)), offset=offset, dtype=dtype)


def _np_svd(a: Any, full_matrices: bool = True, compute_uv: bool = True, hermitian: bool = False) -> Any:
    if hermitian:
        raise _unsupported("np.linalg.svd(..., hermitian=True)", "onp.linalg.svd(x)")
    return api.linalg.svd(a, full_matrices=full_matrices) if compute_uv else api.linalg.svdvals(a)


def _np_swapaxes(a: Any, axis1: int, axis2: int) -> LazyArray:
    a = as_lazy(a)
    axes = list(range(a.ndim))
    axes[axis1], axes[axis2] = axes[axis2], axes[axis1]
    return api.permute_dims(a, tuple(axes))


def _np_size(a: Any, axis: int | None = None) -> int | None:
    a = as_lazy(a)
    return a.size if axis is None else a.shape[axis]


def _np_result_type(*arrays_and_dtypes: Any) -> np.dtype:
    return np.result_type(*(a.dtype if isinstance(a, LazyArray) else a for a in arrays_and_dtypes))


class _Entry(NamedTuple):
    target: Any  # the opgraph function (or an adapter taking NumPy's own parameters)
    positional: tuple[str, ...]  # NumPy parameters passed positionally; "*" for an adapter taking everything as is
    rename: dict[str, str]  # NumPy keyword -> opgraph keyword


_FUNCTION_SPECS: list[tuple[str, Any, tuple[str, ...], dict[str, str]]] = [
    # reductions
    *((n, n, ("a",), {}) for n in ("sum", "prod", "mean", "max", "min", "amax", "amin", "any", "all", "argmax",
                                   "argmin", "cumsum", "cumprod")),
    ("var", api.var, ("a",), {"ddof": "correction"}),
    ("std", api.std, ("a",), {"ddof": "correction"}),
    ("cumulative_sum", api.cumulative_sum, ("x",), {}),
    ("cumulative_prod", api.cumulative_prod, ("x",), {}),
    # products
    ("dot", api.dot, ("a", "b"), {}), ("vdot", api.vdot, ("a", "b"), {}), ("inner", api.inner, ("a", "b"), {}),
    ("outer", api.outer, ("a", "b"), {}), ("tensordot", api.tensordot, ("a", "b"), {}),
    ("einsum", api.einsum, ("operands",), {}),
    ("linalg.matmul", api.matmul, ("x1", "x2"), {}), ("linalg.tensordot", api.tensordot, ("x1", "x2"), {}),
    ("linalg.outer", api.outer, ("x1", "x2"), {}), ("linalg.vecdot", api.vecdot, ("x1", "x2"), {}),
    # shapes
    ("reshape", api.reshape, ("a", "shape"), {}), ("transpose", api.transpose, ("a",), {}),
    ("matrix_transpose", api.matrix_transpose, ("x",), {}),
    ("linalg.matrix_transpose", api.matrix_transpose, ("x",), {}),
    ("moveaxis", api.moveaxis, ("a", "source", "destination"), {}), ("swapaxes", _np_swapaxes, ("*",), {}),
    ("expand_dims", api.expand_dims, ("a",), {}), ("squeeze", api.squeeze, ("a",), {}),
    ("ravel", api.ravel, ("a",), {}),
    ("broadcast_to", api.broadcast_to, ("array",), {}), ("broadcast_arrays", api.broadcast_arrays, ("args",), {}),
    ("concatenate", api.concatenate, ("arrays",), {}), ("stack", api.stack, ("arrays",), {}),
    ("unstack", api.unstack, ("x",), {}), ("split", api.split, ("ary",), {}), ("flip", api.flip, ("m",), {}),
    ("roll", api.roll, ("a",), {}), ("tile", api.tile, ("A", "reps"), {}), ("repeat", api.repeat, ("a", "repeats"), {}),
    ("pad", api.pad, ("array",), {}), ("take", api.take, ("a", "indices"), {}),
    ("tril", api.tril, ("m",), {}), ("triu", api.triu, ("m",), {}),
    # elementwise functions that are not ufuncs
    ("where", _np_where, ("*",), {}), ("clip", api.clip, ("a",), {"a_min": "min", "a_max": "max"}),
    ("round", _np_round, ("*",), {}), ("around", _np_round, ("*",), {}),
    ("real", "real", ("val",), {}), ("imag", "imag", ("val",), {}), ("astype", api.astype, ("x", "dtype"), {}),
    ("copy", lambda a: api.asarray(a, copy=True), ("a",), {}),  # a new handle: x[k] = v on it leaves a alone
    # creation from an array
    ("zeros_like", api.zeros_like, ("a",), {}), ("ones_like", api.ones_like, ("a",), {}),
    ("empty_like", api.empty_like, ("prototype",), {}), ("full_like", api.full_like, ("a",), {}),
    # static facts: no op needed
    ("shape", lambda a: as_lazy(a).shape, ("a",), {}), ("ndim", lambda a: as_lazy(a).ndim, ("a",), {}),
    ("size", _np_size, ("*",), {}), ("result_type", _np_result_type, ("*",), {}),
    ("trace", _np_trace, ("*",), {}),
    # linalg
    *((f"linalg.{n}", getattr(api.linalg, n), ("a",), {}) for n in ("inv", "det", "slogdet", "cholesky", "qr",
                                                                  "eigh", "eigvalsh", "pinv")),
    ("linalg.solve", api.linalg.solve, ("a", "b"), {}), ("linalg.svd", _np_svd, ("*",), {}),
    ("linalg.svdvals", api.linalg.svdvals, ("x",), {}), ("linalg.norm", api.linalg.norm, ("x",), {}),
    ("linalg.vector_norm", api.linalg.vector_norm, ("x",), {}),
    ("linalg.matrix_norm", api.linalg.matrix_norm, ("x",), {}),
    ("linalg.trace", api.linalg.trace, ("x",), {}),
    # eig and eigvals give complex results always (the Array API's rule): NumPy's dtype depends on the values
    ("linalg.eig", api.linalg.eig, ("a",), {}), ("linalg.eigvals", api.linalg.eigvals, ("a",), {}),
    ("linalg.matrix_rank", api.linalg.matrix_rank, ("A",), {}),
    ("linalg.matrix_power", api.linalg.matrix_power, ("a", "n"), {}),
    ("linalg.cross", api.linalg.cross, ("x1", "x2"), {}),
    ("linalg.diagonal", api.linalg.diagonal, ("x",), {}),
]
# Array API functions of opgraph.frontend.array_api that NumPy also has.
_ARRAY_API_SPECS: list[tuple[str, str, tuple[str, ...], dict[str, str]]] = [
    ("sort", "sort", ("a",), {}), ("argsort", "argsort", ("a",), {}), ("nonzero", "nonzero", ("a",), {}),
    ("count_nonzero", "count_nonzero", ("a",), {}), ("searchsorted", "searchsorted", ("a", "v"), {}),
    ("isin", "isin", ("element", "test_elements"), {}), ("diff", "diff", ("a",), {}),
    ("meshgrid", "meshgrid", ("xi",), {}), ("take_along_axis", "take_along_axis", ("arr", "indices"), {}),
    ("broadcast_shapes", "broadcast_shapes", ("args",), {}),
]
# What to write instead of a NumPy function opgraph has no op for (the others say to evaluate first).
_FUNCTION_HINTS = {
    "np.isclose": "onp.abs(a - b) <= atol + rtol * onp.abs(b)",
    "np.nansum": "onp.sum(onp.where(onp.isnan(x), 0.0, x))",
    "np.average": "onp.sum(x * w) / onp.sum(w)",
    "np.linalg.lstsq": "onp.linalg.pinv(a) @ b",
    "np.trapezoid": "onp.sum((y[1:] + y[:-1]) / 2 * dx)",
}


def _lookup(path: str) -> Any:
    obj: Any = np
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return obj


# NumPy function -> how to call the opgraph function; NumPy versions without a function just lack its entry.
_FUNCTION_TABLE: dict[Any, _Entry] = {}
for _np_path, _target, _positional, _rename in _FUNCTION_SPECS:
    _np_func = _lookup(_np_path)
    if _np_func is not None:
        _FUNCTION_TABLE.setdefault(_np_func, _Entry(getattr(api, _target) if isinstance(_target, str) else _target,
                                                    _positional, _rename))
for _np_path, _name, _positional, _rename in _ARRAY_API_SPECS:
    _np_func = _lookup(_np_path)
    if _np_func is not None:
        _FUNCTION_TABLE.setdefault(_np_func, _Entry(getattr(array_api, _name), _positional, _rename))


@functools.cache
def _signature(func: Any) -> inspect.Signature:
    return inspect.signature(func)


@functools.cache
def _keywords(target: Any) -> frozenset[str]:
    return frozenset(p.name for p in inspect.signature(target).parameters.values()
                     if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def array_function(self: LazyArray, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``LazyArray.__array_function__`` (NEP 18): NumPy's API functions call the opgraph.numpy function of the
    same meaning.

    NumPy's parameter names are accepted (``axis=``, ``keepdims=``, ``ddof=``...);
    a parameter opgraph cannot honour (``out=``, ``order='F'``, ``initial=``)
    raises a ``TypeError`` unless it has NumPy's default value.

    >>> import numpy as np, opgraph.numpy as onp
    >>> x = onp.asarray([[1.0, 2.0], [3.0, 4.0]])
    >>> np.mean(x, axis=0).eval(), np.linalg.norm(x, ord=np.inf).eval()
    (array([2., 3.]), array(7.))
    """
    if not all(issubclass(t, (LazyArray, np.ndarray)) for t in types):
        return NotImplemented  # NEP 18: another array type may know how to mix with lazy arrays

    name = _np_name(func)
    entry = _FUNCTION_TABLE.get(func)
    if entry is None:
        raise _unsupported(name, _FUNCTION_HINTS.get(name))
    if entry.positional == ("*",):
        return entry.target(*args, **kwargs)
    sig = _signature(func)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{name}(): {exc}") from None
    pos: list[Any] = []
    kw: dict[str, Any] = {}
    accepted = _keywords(entry.target)
    for pname, value in bound.arguments.items():
        param = sig.parameters[pname]
        if pname in entry.positional:
            if param.kind is param.VAR_POSITIONAL:
                pos.extend(value)
            else:
                pos.append(value)
            continue
        items = value.items() if param.kind is param.VAR_KEYWORD else [(pname, value)]
        for key, val in items:
            target_key = entry.rename.get(key, key)
            if target_key in accepted:
                if val is not np._NoValue:
                    kw[target_key] = val
            elif key == "out" and val is not None:
                raise _no_out(name)
            elif not _is_default(key, val, param.default if param.kind is not param.VAR_KEYWORD else None):
                raise _unsupported(f"{name}(..., {key}={reprlib.repr(val)})", why=_ONLY_DEFAULT)
    return entry.target(*pos, **kw)


def attach() -> None:
    """Set :func:`array_ufunc` and :func:`array_function` as ``LazyArray``'s NEP 13 / NEP 18 methods (done when
    this module is imported; calling it again changes nothing).

    >>> from opgraph.frontend.lazy import LazyArray
    >>> attach(); LazyArray.__array_ufunc__ is array_ufunc and LazyArray.__array_function__ is array_function
    True
    """
    LazyArray.__array_ufunc__ = array_ufunc  # type: ignore[method-assign]
    LazyArray.__array_function__ = array_function  # type: ignore[method-assign]
    lazy.ARRAY_METHODS.set(attach)


attach()
