"""How the dask engine runs one op: its NumPy kernel as a task function over blocks (:class:`BlockKernel`), the
fallback of one task on whole inputs (:func:`whole_block`), and what the family modules' rules share.

A rule factory may decline an instance it cannot chunk by raising :class:`Whole` (the reason): the op then
runs as one task on its whole inputs and ``explain()`` gives the reason.

    >>> import numpy as np
    >>> from opgraph.core.types import TensorType as T
    >>> static(T("f8", (2, 3)))
    (2, 3)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dask
import dask.array as da
import numpy as np

from opgraph.backends.base import OpInfo
from opgraph.core.types import ValueType

Rule = Callable[[OpInfo], Callable[..., Any]]


class BlockKernel:
    """A picklable task function: an op's NumPy kernel with its attributes, its result cast to the
    declared dtype(s) (NumPy's own promotion can differ from the graph's declared type for a block).

    >>> import numpy as np
    >>> from opgraph.core.registry import get_op
    >>> k = BlockKernel(get_op("exp").kernel_for(0), {}, ("float32",), "exp")
    >>> k(np.zeros(2, dtype=np.float32))
    array([1., 1.], dtype=float32)
    """

    __slots__ = ("attrs", "dtypes", "fn", "kind")

    def __init__(self, fn: Callable[..., Any], attrs: Mapping[str, Any], dtypes: Sequence[str], kind: str) -> None:
        self.fn = fn
        self.attrs = dict(attrs)
        self.dtypes = tuple(dtypes)
        self.kind = kind

    def __call__(self, *blocks: Any) -> Any:
        got = self.fn(*[np.asarray(b) for b in blocks], **self.attrs)
        if len(self.dtypes) == 1:
            return _as_dtype(got, self.dtypes[0])
        return tuple(_as_dtype(g, d) for g, d in zip(got, self.dtypes, strict=True))

    def __dask_tokenize__(self) -> Any:
        return ("opgraph.BlockKernel", self.kind, repr(sorted(self.attrs.items())), self.dtypes,
                getattr(self.fn, "__qualname__", repr(self.fn)))

    def __repr__(self) -> str:
        return f"BlockKernel({self.kind!r})"


def _as_dtype(a: Any, dtype: str) -> np.ndarray:
    a = np.asarray(a)
    return a if a.dtype == dtype else a.astype(dtype)


def block_kernel(info: OpInfo) -> BlockKernel:
    """The op's NumPy kernel as a :class:`BlockKernel` (attributes bound, results in the declared dtypes).

    >>> from opgraph.core.types import TensorType as T
    >>> block_kernel(OpInfo("exp", {}, (T("f8", (2,)),), (T("f8", (2,)),)))
    BlockKernel('exp')
    """
    from opgraph.backends.numpy import BACKEND as NUMPY  # the engine's fast kernels, block by block

    fn = NUMPY.kernel_for(info.kind, info.version)
    return BlockKernel(fn, info.attrs, [t.dtype.name for t in info.out_types], info.kind)  # type: ignore[union-attr]


def _shape_of(t: ValueType) -> tuple[float, ...]:
    shape = t.shape  # type: ignore[union-attr]
    return tuple(math.nan if d is None else d for d in shape)


def whole_block(info: OpInfo) -> Callable[..., Any]:
    """The fallback rule: the op runs as one task on its whole inputs (each input's chunks concatenated).

    >>> import numpy as np
    >>> from opgraph.core.types import TensorType as T
    >>> fn = whole_block(OpInfo("cumsum", {"axis": 0}, (T("f8", (4,)),), (T("f8", (4,)),)))
    >>> fn(da.from_array(np.array([3.0, 1, 2, 0]), chunks=2)).compute()
    array([3., 4., 6., 6.])
    """
    kernel = block_kernel(info)
    outs = info.out_types
    nout = len(outs)

    def run(*xs: Any) -> Any:
        task = dask.delayed(kernel, pure=True, nout=nout if nout > 1 else None)(*xs)
        if nout == 1:
            return da.from_delayed(task, _shape_of(outs[0]), dtype=outs[0].dtype)  # type: ignore[union-attr]
        return tuple(da.from_delayed(t, _shape_of(o), dtype=o.dtype)  # type: ignore[union-attr]
                     for t, o in zip(task, outs, strict=True))
    return run



class Whole(Exception):
    """Raised by a rule factory for an op instance it does not chunk (the reason is the message).

    >>> str(Whole("its shape is only known at run time"))
    'its shape is only known at run time'
    """


def static(t: ValueType) -> tuple[int, ...]:
    """``t``'s shape, every dim known; raises :class:`Whole` where one is known only at run time.

    >>> from opgraph.core.types import TensorType as T
    >>> static(T("f8", (None, 3)))
    Traceback (most recent call last):
    ...
    opgraph.backends.dask.blocks.Whole: its shape is only known at run time
    """
    shape = getattr(t, "shape", None)
    if shape is None or any(d is None for d in shape):
        raise Whole("its shape is only known at run time")
    return tuple(int(d) for d in shape)


def axis_attr(attrs: Mapping[str, Any]) -> Any:
    """An op's ``axis`` attribute as dask takes it (a list of axes as a tuple).

    >>> axis_attr({"axis": [0, 1]}), axis_attr({"axis": 1}), axis_attr({})
    ((0, 1), 1, None)
    """
    axis = attrs.get("axis")
    return tuple(axis) if isinstance(axis, (list, tuple)) else axis


def acc_dtype(dt: np.dtype) -> Any:
    """The dtype partial products over chunks are summed in: float16 ones in float32, as NumPy's kernels
    accumulate them (dask sums the partials of a chunked contraction axis in their own dtype).

    >>> acc_dtype(np.dtype("float16")), acc_dtype(np.dtype("float64"))
    (<class 'numpy.float32'>, dtype('float64'))
    """
    return np.float32 if dt == np.float16 else dt


def elementwise_rule(info: OpInfo) -> Callable[..., Any]:
    """The rule of every elementwise op: its NumPy kernel mapped over aligned blocks.

    >>> from opgraph.core.types import TensorType as T
    >>> fn = elementwise_rule(OpInfo("exp", {}, (T("f8", (4,)),), (T("f8", (4,)),)))
    >>> fn(da.zeros(4, chunks=2)).compute()
    array([1., 1., 1., 1.])
    """
    kernel = block_kernel(info)
    dtype = info.out_dtype

    def run(*xs: Any) -> Any:
        return da.core.elemwise(kernel, *xs, dtype=dtype)
    return run


def local_rule(axes_of: Callable[[OpInfo, int], Sequence[int]]) -> Rule:
    """A rule for an op computed independently along some axes of its first input (a softmax row, an image of
    a batch): those axes are joined into one chunk, the first input stays chunked along the others, and the
    op's NumPy kernel runs on each block (the other inputs, weights and the like, whole beside it).

    >>> import numpy as np
    >>> from opgraph.core.types import TensorType as T
    >>> t = T("f8", (4, 3))
    >>> fn = local_rule(lambda info, rank: [rank - 1])(OpInfo("softmax", {"axis": -1}, (t,), (t,)))
    >>> x = np.arange(12.0).reshape(4, 3)
    >>> y = fn(da.from_array(x, chunks=(2, 1)))
    >>> y.chunks, bool(np.allclose(y.compute().sum(axis=1), 1))
    (((2, 2), (3,)), True)
    """
    def factory(info: OpInfo) -> Callable[..., Any]:
        if len(info.out_types) != 1:
            raise Whole("an op with several results has no chunked rule")
        shape, out = static(info.in_types[0]), static(info.out_types[0])
        local = sorted({a % len(shape) for a in axes_of(info, len(shape))}) if shape else []
        if len(out) != len(shape) or any(out[a] != shape[a] for a in range(len(shape)) if a not in local):
            raise Whole("its result is not shaped like its input outside the axes it works along")
        kernel, dt = block_kernel(info), info.out_dtype
        ind = "".join(chr(ord("a") + i) for i in range(len(shape)))

        def run(x: Any, *rest: Any) -> Any:
            args: list[Any] = [x.rechunk({a: -1 for a in local}), ind]
            k = len(shape)
            for y in rest:  # whole, under indices of their own: blockwise concatenates their blocks
                args += [y.rechunk(-1), "".join(chr(ord("a") + i) for i in range(k, k + y.ndim))]
                k += y.ndim
            return da.blockwise(kernel, ind, *args, concatenate=True, dtype=dt,
                                adjust_chunks={ind[a]: out[a] for a in local}, meta=np.empty((0,) * len(out), dt))
        return run
    return factory


def along_axis(info: OpInfo, rank: int) -> list[int]:
    """For :func:`local_rule`: an op computed along its ``axis`` attribute (default: the last axis).

    >>> along_axis(OpInfo("softmax", {"axis": 0}, (), ()), 3)
    [0]
    """
    return [int(info.attrs.get("axis", -1))]


def last_two(info: OpInfo, rank: int) -> list[int]:
    """For :func:`local_rule`: an op computed on each matrix of a batch (its last two axes).

    >>> last_two(OpInfo("inv", {}, (), ()), 3)
    [1, 2]
    """
    return [rank - 2, rank - 1]
