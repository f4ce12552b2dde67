"""Signal family (ids 1200-1299): discrete Fourier transforms along one axis, as NumPy's ``np.fft``.

* ``fft(x, axis=-1, n=None, inverse=False, norm="backward")``: complex to complex,
  ``np.fft.fft`` (or ``np.fft.ifft`` with ``inverse=True``); the output keeps
  x's precision (complex64 stays complex64).
* ``rfft(x, axis=-1, n=None, norm="backward")``: real to complex, the
  one-sided spectrum of ``np.fft.rfft`` (``n // 2 + 1`` entries along axis).
* ``irfft(x, axis=-1, n=None, norm="backward")``: a one-sided spectrum back to
  a real signal of length n (default ``2 * (m - 1)``), ``np.fft.irfft``.

``n`` zero-pads or cuts the transformed axis of the input first, and ``norm``
picks where the ``1/n`` goes (``backward``: on the inverse, ``ortho``:
``1/sqrt(n)`` on both, ``forward``: on the forward transform). Ids
1200-1299, stable: append, never renumber.

    >>> import numpy as np, opgraph
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (2, 4)), name="x")
    >>> spec = b.op("rfft", x)
    >>> back = b.op("irfft", spec, n=4)
    >>> spec.type, back.type
    (c64[2,3], f32[2,4])
    >>> s, y = b.run({x: np.array([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=np.float32)}, [spec, back])
    >>> s
    array([[1.+0.j, 1.+0.j, 1.+0.j],
           [4.+0.j, 0.+0.j, 0.+0.j]], dtype=complex64)
    >>> y
    array([[1., 0., 0., 0.],
           [1., 1., 1., 1.]], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opgraph.core.registry import Attr, OpDef, attr_bool, attr_int, attr_str, optional, register_op, set_rules
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import OpTypeError
from opgraph.ops._common import normalize_axis, tensor
from opgraph.ops.batch_helpers import batch_axis, example_ndim
from opgraph.ops.grad_helpers import is_float, rank
from opgraph.ops.jvp_helpers import linear

FAMILY = "signal"

Dim = int | None

NORMS = ("backward", "ortho", "forward")

# complex dtype -> the real dtype of its parts (irfft's output), and back (rfft's output).
_REAL_OF = {np.dtype(np.complex64): np.dtype(np.float32), np.dtype(np.complex128): np.dtype(np.float64)}


# ---------------------------------------------------------------- attributes
def attr_norm(v: Any) -> str:
    """Normalise a ``norm`` attribute: ``backward``, ``ortho`` or ``forward`` (NumPy's names).

    >>> attr_norm("ortho")
    'ortho'
    """
    s = attr_str(v)
    if s not in NORMS:
        raise OpTypeError(f"norm must be one of {', '.join(NORMS)}; got {s!r}")
    return s


def attr_length(v: Any) -> int:
    """Normalise a transform length ``n``: an integer >= 1.

    >>> attr_length(np.int64(8))
    8
    """
    n = attr_int(v)
    if n < 1:
        raise OpTypeError(f"n must be >= 1, got {n}")
    return n


def _attrs(inverse: bool) -> dict[str, Attr]:
    out = {"axis": Attr(attr_int, -1, doc="axis to transform"),
           "n": Attr(optional(attr_length), None,
                     doc="transform length: the axis is zero-padded or cut to it (None: from x)")}
    if inverse:
        out["inverse"] = Attr(attr_bool, False, doc="True: the inverse transform (np.fft.ifft)")
    out["norm"] = Attr(attr_norm, "backward", doc="where the 1/n goes: backward, ortho or forward")
    return out


# ---------------------------------------------------------------- type-rule helpers
def _axis_and_len(x: TensorType, axis: int) -> tuple[int | None, Dim]:
    """The normalised axis and x's length along it (None, None when the rank is unknown)."""
    if x.shape is None:
        return None, None
    if not x.shape:
        raise OpTypeError("x must have rank >= 1")
    ax = normalize_axis(axis, len(x.shape))
    return ax, x.shape[ax]


def _out(x: TensorType, ax: int | None, length: Dim, dtype: np.dtype) -> TensorType:
    if x.shape is None or ax is None:
        return TensorType(dtype, None)
    return TensorType(dtype, (*x.shape[:ax], length, *x.shape[ax + 1:]))


def _length(m: Dim, n: int | None) -> Dim:
    """The transform length: n, else the axis' length (which must not be 0)."""
    if n is not None:
        return n
    if m == 0:
        raise OpTypeError("cannot transform an empty axis (give n to zero-pad it)")
    return m


def _complex_input(x: TensorType, op: str) -> None:
    if x.dtype.kind != "c":
        hint = "use rfft for real signals, or cast x to complex" if op == "fft" else "cast x to complex"
        raise OpTypeError(f"x must be complex, got {x.dtype} ({hint})")


# ---------------------------------------------------------------- gradient helpers
# Gradients follow the autodiff layer's convention for complex values (that of multiply's rule, g * x2
# without a conjugate): the cotangent of a linear map is its transpose applied to the output's cotangent.
# The DFT matrix is symmetric, so the transpose of an fft is the same fft; the zero-padding or cutting of
# ``n`` transposes to cutting or zero-padding back to x's length.
def _fit(b: Any, g: Any, axis: int, m: Dim, what: str) -> Any:
    """``g`` cut or zero-padded along ``axis`` to length ``m``."""
    r = rank(g.type)
    ax = axis % r
    n = g.type.shape[ax]
    if n == m:
        return g
    if n is None or m is None:
        raise NotImplementedError(f"the {what} gradient needs the static length of axis {ax}")
    if n > m:
        return b.op("getitem", g, index=(slice(None),) * ax + (slice(0, m),))
    return b.op("pad", g, pad_width=tuple((0, m - n) if d == ax else (0, 0) for d in range(r)))


def _g_fft(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    (x,), (g,) = ins, cots
    gx = b.op("fft", g, axis=attrs["axis"], inverse=attrs["inverse"], norm=attrs["norm"])
    return [_fit(b, gx, attrs["axis"], x.type.shape[attrs["axis"] % rank(x.type)], "fft")]


def _g_rfft(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    (x,), (g,) = ins, cots
    if not is_float(x.type):
        return [None]
    ax = attrs["axis"] % rank(x.type)
    m = x.type.shape[ax]
    n = attrs["n"] if attrs["n"] is not None else m
    if n is None:
        raise NotImplementedError("the rfft gradient needs the static length of the transformed axis")
    # rfft = (keep the first n//2+1 of) fft(complex(x)): the transposes in reverse order, then the real
    # part, which is the transpose of making a complex value of the real x.
    full = b.op("fft", _fit(b, g, ax, n, "rfft"), axis=ax, norm=attrs["norm"])
    gx = _fit(b, b.op("real", full), ax, m, "rfft")
    return [gx if gx.type.dtype == x.type.dtype else b.op("cast", gx, dtype=x.type.dtype.name)]


def _g_irfft(b: Any, ins: Any, outs: Any, cots: Any, attrs: dict[str, Any]) -> list[Any]:
    (x,), (g,) = ins, cots
    r = rank(x.type)
    ax = attrs["axis"] % r
    n = outs[0].type.shape[ax]
    if n is None:
        raise NotImplementedError("the irfft gradient needs the static output length")
    k = n // 2 + 1
    # irfft(x)[t] = scale * sum_k w[k] * Re(x[k] exp(2 pi i k t / n)) over the one-sided x, with w = 2 for
    # the bins that stand for a conjugate pair and 1 for the DC (and, n even, the Nyquist) bin: its
    # transpose is w * ifft(g) on the first k bins (ifft has the same scale and exp(+2 pi i ...)).
    h = b.op("fft", b.op("cast", g, dtype=x.type.dtype.name), axis=ax, inverse=True, norm=attrs["norm"])
    w = np.ones(k, dtype=x.type.dtype)
    w[1:(n + 1) // 2] = 2
    wc = b.constant(w.reshape((k,) + (1,) * (r - 1 - ax)))
    gx = b.op("multiply", _fit(b, h, ax, k, "irfft"), wc)
    return [_fit(b, gx, ax, x.type.shape[ax], "irfft")]


def _register(name: str, id: int, infer: Any, kernel: Any, doc: str, grad: Any, *, inverse_attr: bool) -> OpDef:
    kernel.__name__ = f"{name}_numpy"
    return register_op(OpDef(
        name=name, id=id, arity=1, infer=infer, attrs=_attrs(inverse_attr), kernel=kernel,
        family=FAMILY, doc=doc, grad=grad,
    ))


# ---------------------------------------------------------------- fft 1200
def _fft_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x = tensor(in_types[0], "x")
    _complex_input(x, "fft")
    ax, m = _axis_and_len(x, attrs["axis"])
    return (_out(x, ax, _length(m, attrs["n"]), x.dtype),)


def _fft_kernel(x: np.ndarray, out: Any = None, *, axis: int, n: int | None, inverse: bool,
                norm: str) -> np.ndarray:
    fn = np.fft.ifft if inverse else np.fft.fft
    return fn(x, n=n, axis=axis, norm=norm, out=out)


_register("fft", 1200, _fft_infer, _fft_kernel,
          "fft(x, axis=-1, n=None, inverse=False, norm='backward'): np.fft.fft (np.fft.ifft when inverse) of "
          "complex x along axis, zero-padded or cut to n first; keeps x's complex dtype",
          _g_fft, inverse_attr=True)


# ---------------------------------------------------------------- rfft 1201
def _rfft_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x = tensor(in_types[0], "x")
    if x.dtype.kind not in "biuf":
        raise OpTypeError(f"x must be real, got {x.dtype} (use fft for complex signals)")
    # NumPy's precision rule: float16 and float32 give complex64, the rest complex128.
    dt = np.dtype(np.complex64) if x.dtype in (np.float16, np.float32) else np.dtype(np.complex128)
    ax, m = _axis_and_len(x, attrs["axis"])
    n = _length(m, attrs["n"])
    return (_out(x, ax, None if n is None else n // 2 + 1, dt),)


def _rfft_kernel(x: np.ndarray, out: Any = None, *, axis: int, n: int | None, norm: str) -> np.ndarray:
    if x.dtype == np.float16:
        # NumPy scales float16 input by a float16 factor (1/sqrt(n) off by up to 4e-4 relative); float32 is exact
        # enough and gives the same complex64 result type.
        x = x.astype(np.float32)
    return np.fft.rfft(x, n=n, axis=axis, norm=norm, out=out)


_register("rfft", 1201, _rfft_infer, _rfft_kernel,
          "rfft(x, axis=-1, n=None, norm='backward'): np.fft.rfft: the n // 2 + 1 non-negative frequency "
          "terms of the DFT of real x along axis (float16/float32 give complex64, others complex128)",
          _g_rfft, inverse_attr=False)


# ---------------------------------------------------------------- irfft 1202
def _irfft_infer(in_types: tuple[ValueType, ...], attrs: dict[str, Any]) -> tuple[TensorType, ...]:
    x = tensor(in_types[0], "x")
    _complex_input(x, "irfft")
    ax, m = _axis_and_len(x, attrs["axis"])
    n: Dim = attrs["n"]
    if n is None and m is not None:
        n = 2 * (m - 1)
        if n < 1:
            raise OpTypeError(f"axis {ax} has {m} bin(s), so the default n = 2 * (m - 1) = {n}; give n >= 1")
    return (_out(x, ax, n, _REAL_OF[x.dtype]),)


def _irfft_kernel(x: np.ndarray, out: Any = None, *, axis: int, n: int | None, norm: str) -> np.ndarray:
    return np.fft.irfft(x, n=n, axis=axis, norm=norm, out=out)


_register("irfft", 1202, _irfft_infer, _irfft_kernel,
          "irfft(x, axis=-1, n=None, norm='backward'): np.fft.irfft: the real signal of length n (default "
          "2 * (m - 1)) whose rfft is the one-sided spectrum x; keeps x's precision (complex64 -> float32)",
          _g_irfft, inverse_attr=False)


# ---------------------------------------------------------------- tangent rules
# The transforms are linear: the op on the tangent. (rfft's gradient takes a real part, and the reverse rule
# of real drops a complex input's cotangent, so its transpose would lose the tangent.)
set_rules("jvp", {k: linear(k) for k in ("fft", "rfft", "irfft")})


# ---------------------------------------------------------------- batching rules (vmap)
def _axis_batch(kind: str) -> Any:
    def rule(b: Any, ins: Any, batched: Any, size: int, attrs: dict[str, Any]) -> list[Any]:
        (x,) = ins
        return [b.op(kind, x, **{**attrs, "axis": batch_axis(attrs["axis"], example_ndim(x, True))})]
    return rule


set_rules("batch", {k: _axis_batch(k) for k in ("fft", "rfft", "irfft")})
