"""Constant folding: one op run on known values, with the kernel the NumPy engine runs.

Three places fold: lazy arrays as each op is built (:mod:`opgraph.frontend.lazy`), the ONNX importer (shape
computations must finish while importing) and the rewrite pass (:func:`opgraph.passes.fold_constants`). They
share :func:`fold`, so they agree on what may fold and how big it may be:

* what: never an op with the ``nondeterministic`` trait (its result is drawn at run time), nor one whose
  ``fold_guard`` refuses these arguments (a loop whose work at build time is unbounded);
* how big (:func:`fits`): every input and every output has at most ``limit`` elements, an input's empty dims
  counted as 1, and every output's size is known. Each caller picks ``limit`` for its reason: lazy arrays
  4096 (folding must cost less than recording the op; a view any size), the rewrite pass
  :data:`opgraph.passes.FOLD_LIMIT` (the constants it adds to a graph), the importer ``2**24`` (it must finish
  the shape computations of large models);
* errors: the caller says whether NumPy's floating-point errors are ignored, raised (and the fold dropped) or
  left to the caller's own state, and whether a kernel's exception drops the fold or reaches the caller.

    >>> import numpy as np
    >>> from opgraph.core.registry import resolve
    >>> from opgraph.core.types import TensorType
    >>> r = resolve("add", [TensorType("float64", (2,))] * 2, {})
    >>> fold(r.opdef, dict(r.attrs), r.version, [np.ones(2), np.ones(2)], r.out_types, limit=16)
    (array([2., 2.]),)
    >>> fold(r.opdef, dict(r.attrs), r.version, [np.ones(2), np.ones(2)], r.out_types, limit=1) is None
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from opgraph.core.registry import OpDef
from opgraph.core.types import TensorType, ValueType

Errstate = Literal["ignore", "raise"] | None
"""NumPy's floating-point error handling while a kernel folds: ``"ignore"``, ``"raise"`` (the fold is dropped,
so evaluation warns as it always does) or None (the caller's own state: its warnings reach the caller)."""


def _elements(t: ValueType, empty_as_one: bool) -> float:
    if not isinstance(t, TensorType) or t.shape is None or any(d is None for d in t.shape):
        return math.inf
    return math.prod(max(d, 1) if empty_as_one else d for d in t.shape)  # type: ignore[type-var]


def fits(in_types: Sequence[ValueType], out_types: Sequence[ValueType], limit: int | None, *,
         refine: bool = False) -> bool:
    """Whether an op with these types is small enough to fold: the one size policy of :func:`fold`.

    Every output has a known size of at most ``limit`` elements, and every input, counting an empty dim as 1,
    has at most ``limit``: a kernel may make intermediates of the other dims' size from an empty input (a
    ``(2**40, 0)`` softmax reduces to ``(2**40, 1)``). With ``refine`` an output of unknown size fits (the
    caller takes the value's type, which is known once it is computed). ``limit=None``: any size.

    >>> f4 = lambda *shape: TensorType("float32", shape)
    >>> fits([f4(3, 4)], [f4(3)], 12), fits([f4(3, 4)], [f4(3)], 11), fits([f4(2**40, 0)], [f4(0)], 2**20)
    (True, False, False)
    >>> fits([f4(3)], [TensorType("int64", (None,))], 8), fits([f4(3)], [TensorType("int64", (None,))], 8,
    ...                                                        refine=True)
    (False, True)
    """
    if limit is None:
        return True
    for t in out_types:
        n = _elements(t, False)
        if n > limit and not (refine and n == math.inf and isinstance(t, TensorType)):
            return False
    return all(_elements(t, True) <= limit for t in in_types)


def fold(opdef: OpDef, attrs: Mapping[str, Any], version: int, args: Sequence[np.ndarray],
         out_types: Sequence[ValueType], *, limit: int | None, in_types: Sequence[ValueType] | None = None,
         errstate: Errstate = "ignore", catch: bool = True, cast: bool = False,
         refine: bool = False) -> tuple[np.ndarray, ...] | None:
    """The results of op ``opdef`` on known ``args``, or None when it must not or cannot fold.

    ``in_types`` (default: the arguments' own types) and ``out_types`` are checked with :func:`fits` against
    ``limit`` (``refine`` as there). ``errstate`` is NumPy's floating-point error handling while the kernel
    runs (see :data:`Errstate`); ``catch``: a kernel's exception drops the fold (it is left to fail at run
    time, where it is reported as usual) instead of reaching the caller. A result must have its output
    type (else the fold is dropped); with ``cast``, one of another dtype is cast to it first.

    >>> import numpy as np
    >>> from opgraph.core.registry import get_op, resolve
    >>> from opgraph.core.types import TensorType
    >>> r = resolve("divide", [TensorType("float64", ())] * 2, {})
    >>> args = [np.float64(1.0), np.float64(0.0)]
    >>> fold(r.opdef, {}, r.version, args, r.out_types, limit=1)
    (array(inf),)
    >>> fold(r.opdef, {}, r.version, args, r.out_types, limit=1, errstate="raise") is None
    True
    """
    if not out_types or "nondeterministic" in opdef.traits:
        return None
    if not fits(in_types if in_types is not None else [TensorType.of(np.asarray(a)) for a in args], out_types,
                limit, refine=refine):
        return None
    if opdef.fold_guard is not None and not opdef.fold_guard(attrs, list(args)):
        return None
    try:
        fn = opdef.kernel_for(version)
        if errstate is None:
            result = fn(*args, **attrs)
        else:
            with np.errstate(all=errstate):
                result = fn(*args, **attrs)
        results = (result,) if len(out_types) == 1 else tuple(result)
    except Exception:
        if catch:
            return None
        raise
    if len(results) != len(out_types):
        return None
    arrays = []
    for r, t in zip(results, out_types, strict=True):
        a = np.asarray(r)
        if not isinstance(t, TensorType):
            return None
        if cast and a.dtype != t.dtype:
            a = a.astype(t.dtype)
        if not t.accepts(a):
            return None
        arrays.append(a)
    return tuple(arrays)
