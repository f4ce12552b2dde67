"""Symbolic dims while importing ONNX: a dynamic batch stays ``?`` and shape computations on it still resolve.

opgraph types write an unknown dim as ``None`` (``f32[?,1,28,28]``); they do not say *which* unknown it is.
The importer needs that to turn the shape arithmetic torch emits for a dynamic batch (``Shape`` -> ``Gather``
-> ``Unsqueeze`` -> ``Concat`` -> ``Reshape``) into a ``reshape`` with a static target and one ``-1``, which
every engine runs. So it keeps, beside the graph it builds:

* a symbolic shape for each tensor value with unknown dims: each dim an ``int`` or a :class:`SymDim`, a
  monomial such as ``N``, ``4*N`` or ``N*T`` over the model's symbols (a graph input's ``dim_param``, shared by
  every input that names it; a fresh symbol for an unnamed dim or one no monomial describes);
* a symbolic value for each small integer tensor computed from such shapes (``Shape(x)`` is ``[N, 1, 28, 28]``).

Both are found by *probing*, not by a second set of type rules: the op's own type rule (for shapes) or kernel
(for values) runs with each symbol replaced by a concrete size, once with every symbol at a base size, once per
symbol with that one doubled and once with all tripled, and a dim (or element) whose values fit
``c * s1**e1 * s2**e2...`` is that monomial. The base sizes are multiples of 2520, so divisibility checks in type
rules (heads that split a width) pass. Nothing here changes the graph: these are facts the translators consult.

    >>> import numpy as np
    >>> from opgraph.core.builder import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.input(("float32", (None, 4, 6)), name="x")
    >>> sym = Symbols(b)
    >>> sym.declare_input(x, ["N", None, None])
    >>> y = b.op("reshape", x, shape=(-1, 3, 8))
    >>> [str(d) for d in sym.shape_of(y)]
    ['N', '3', '8']
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from opgraph.core.graph import Value
from opgraph.core.registry import resolve
from opgraph.core.types import TensorType
from opgraph.ops.fold import fold

_BASE = 2520  # lcm(1..10): a probe size that any small head count or group divides
_PRIMES = (11, 13, 17, 19, 23, 29, 31, 37)
#: an op on more symbols than this is not probed (each symbol costs one more run of its type rule or kernel)
MAX_SYMBOLS = len(_PRIMES)
#: symbolic values are tracked for integer tensors of at most this many elements (shape vectors)
MAX_ELEMENTS = 64


@dataclass(frozen=True)
class SymDim:
    """A symbolic dim ``coef * prod(symbol ** exp)``; ``names`` renders it (kept here so errors can print it)."""

    coef: Fraction
    powers: tuple[tuple[int, int], ...]
    names: tuple[str, ...] = ()

    def __str__(self) -> str:
        parts = [] if self.coef == 1 else [str(self.coef)]
        for s, e in self.powers:
            name = self.names[s] if s < len(self.names) else f"s{s}"
            parts.append(name if e == 1 else f"{name}**{e}")
        return "*".join(parts)

    def __repr__(self) -> str:
        return f"SymDim({self})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SymDim) and (self.coef, self.powers) == (other.coef, other.powers)

    def __hash__(self) -> int:
        return hash((self.coef, self.powers))


Dim = int | SymDim


def monomial(coef: Fraction, powers: Mapping[int, int], names: tuple[str, ...]) -> Dim:
    """``coef * prod(s ** e)`` as an int when no symbol is left (and the coefficient is whole), else a SymDim.

    >>> monomial(Fraction(6), {}, ())
    6
    >>> str(monomial(Fraction(2), {0: 1}, ("N",)))
    '2*N'
    """
    powers = {s: e for s, e in powers.items() if e}
    if not powers and coef.denominator == 1:
        return int(coef)
    return SymDim(coef, tuple(sorted(powers.items())), names)


def _parts(d: Dim) -> tuple[Fraction, dict[int, int]]:
    return (Fraction(d), {}) if not isinstance(d, SymDim) else (d.coef, dict(d.powers))


def product(dims: Sequence[Dim], names: tuple[str, ...] = ()) -> Dim:
    """The product of dims (ints and monomials).

    >>> str(product([2, SymDim(Fraction(1), ((0, 1),), ("N",)), 3], ("N",)))
    '6*N'
    """
    coef, powers = Fraction(1), {}
    for d in dims:
        c, p = _parts(d)
        coef *= c
        for s, e in p.items():
            powers[s] = powers.get(s, 0) + e
    return monomial(coef, powers, names)


def quotient(a: Dim, b: Dim, names: tuple[str, ...] = ()) -> Dim | None:
    """``a / b`` as a dim (None when b is 0).

    >>> quotient(SymDim(Fraction(12), ((0, 1),), ("N",)), SymDim(Fraction(3), ((0, 1),), ("N",)))
    4
    """
    cb, pb = _parts(b)
    if cb == 0:
        return None
    ca, pa = _parts(a)
    for s, e in pb.items():
        pa[s] = pa.get(s, 0) - e
    return monomial(ca / cb, pa, names)


class Symbols:
    """The symbolic shapes and values of one builder's values (see the module doc)."""

    def __init__(self, builder: Any) -> None:
        self.b = builder
        self.names: list[str] = []
        self._by_name: dict[str, int] = {}
        self.shapes: dict[int, tuple[Dim, ...]] = {}
        self.values: dict[int, np.ndarray] = {}
        #: symbol -> (graph input name, axis) where it first appears, for messages that say what to fix
        self.origin: dict[int, tuple[str, int]] = {}

    # ---------------------------------------------------------------- symbols
    def symbol(self, name: str | None) -> SymDim:
        """The symbol called ``name`` (one per name), or a fresh one for None."""
        if name is not None and name in self._by_name:
            s = self._by_name[name]
        else:
            s = len(self.names)
            self.names.append(name if name is not None else f"?{s}")
            if name is not None:
                self._by_name[name] = s
        return SymDim(Fraction(1), ((s, 1),), ())

    def _named(self, d: Dim) -> Dim:
        return SymDim(d.coef, d.powers, tuple(self.names)) if isinstance(d, SymDim) else d

    def declare_input(self, v: Value, dim_names: Sequence[str | None]) -> None:
        """Give input ``v``'s unknown dims their symbols: the model's ``dim_param`` names (one symbol per name
        across the model), fresh ones where the model names none."""
        t = v.type
        if not isinstance(t, TensorType) or t.shape is None or None not in t.shape:
            return
        owner = self.b.name_of(v.id) or f"%{v.id}"
        dims: list[Dim] = []
        for axis, d in enumerate(t.shape):
            if d is not None:
                dims.append(int(d))
                continue
            name = dim_names[axis] if axis < len(dim_names) else None
            sym = self.symbol(name or None)
            self.origin.setdefault(sym.powers[0][0], (owner, axis))
            dims.append(sym)
        self.shapes[v.id] = tuple(dims)

    def describe(self, dims: Sequence[Dim | None]) -> str:
        """A shape with its symbols named: ``[N,1,28,28]``."""
        return "[" + ",".join("?" if d is None else str(self._named(d)) for d in dims) + "]"

    def where(self, d: Dim) -> str:
        """Which graph inputs' dims a symbolic dim comes from (for error messages)."""
        if not isinstance(d, SymDim):
            return ""
        spots = [f"dim {axis} of input {name!r}" for name, axis in
                 (self.origin.get(s) for s, _ in d.powers) if name is not None] if d.powers else []
        return ", ".join(dict.fromkeys(spots))

    # ---------------------------------------------------------------- tensor shapes
    def shape_of(self, v: Any) -> tuple[Dim, ...] | None:
        """``v``'s shape with its unknown dims as symbols; None when its rank is unknown."""
        if not isinstance(v, Value):
            return None
        t = v.type
        if not isinstance(t, TensorType) or t.shape is None:
            return None
        if None not in t.shape:
            return tuple(int(d) for d in t.shape)
        if v.id not in self.shapes:
            self._infer_ancestors(v.id)
        return tuple(self._named(d) for d in self.shapes[v.id])

    def _static_or_known(self, vid: int) -> bool:
        t = self.b.type_of(vid)
        return vid in self.shapes or not isinstance(t, TensorType) or t.shape is None or None not in t.shape

    def _infer_ancestors(self, vid: int) -> None:
        # the ancestors still to describe, described in id order: an op's outputs come after its inputs
        todo: set[int] = set()
        stack = [vid]
        producer = self.b._value_producer
        while stack:
            u = stack.pop()
            if u in todo or self._static_or_known(u):
                continue
            todo.add(u)
            op = producer[u]
            if op >= 0:
                stack.extend(self.b.op_inputs(op))
        for u in sorted(todo):
            if u not in self.shapes:
                self._infer(u)

    def _dims(self, vid: int) -> tuple[Dim, ...] | None:
        t = self.b.type_of(vid)
        if not isinstance(t, TensorType) or t.shape is None:
            return None
        return self.shapes.get(vid) or tuple(int(d) for d in t.shape)  # type: ignore[arg-type]

    def _fresh(self, vid: int) -> None:
        t = self.b.type_of(vid)
        self.shapes[vid] = tuple(self.symbol(None) if d is None else int(d) for d in t.shape)

    def _infer(self, vid: int) -> None:
        op = self.b._value_producer[vid]
        outs = self.b.op_outputs(op) if op >= 0 else [vid]
        if op < 0:
            self._fresh(vid)
            return
        ins = self.b.op_inputs(op)
        in_dims = [self._dims(i) for i in ins]
        kind, attrs = self.b.kind_of(op), self.b.attrs_of(op)
        syms = sorted({s for dims in in_dims if dims for d in dims if isinstance(d, SymDim) for s, _ in d.powers})
        results: list[list[tuple[int | None, ...] | None]] = []
        if 0 < len(syms) <= MAX_SYMBOLS and all(d is not None for d in in_dims):
            for sizes in _assignments(syms):
                try:
                    types = []
                    for i, dims in zip(ins, in_dims, strict=True):
                        t = self.b.type_of(i)
                        types.append(t.with_shape(tuple(_size(d, sizes) for d in dims)))  # type: ignore[union-attr]
                    out_types = resolve(kind, types, attrs).out_types
                    results.append([t.shape if isinstance(t, TensorType) else None for t in out_types])
                except Exception:  # a rule that refuses the probe sizes: the dims stay fresh symbols
                    results = []
                    break
        for k, u in enumerate(outs):
            t = self.b.type_of(u)
            if not isinstance(t, TensorType) or t.shape is None:
                continue
            dims = []
            for axis, d in enumerate(t.shape):
                if d is not None:
                    dims.append(int(d))
                    continue
                series = [r[k][axis] if r[k] is not None and len(r[k]) == len(t.shape) else None for r in results]
                fit = _fit(series, syms, tuple(self.names)) if results else None
                dims.append(fit if fit is not None else self.symbol(None))
            self.shapes[u] = tuple(dims)

    # ---------------------------------------------------------------- small integer values
    def value_of(self, v: Any, known: Mapping[int, np.ndarray]) -> np.ndarray | None:
        """``v``'s symbolic value (an object array of ints and monomials), or its known value, or None."""
        if not isinstance(v, Value):
            return None
        if v.id in self.values:
            return self.values[v.id]
        return known.get(v.id)

    def set_value(self, v: Value, entries: Sequence[Dim], shape: tuple[int, ...]) -> None:
        """Record that ``v`` (an integer tensor the graph computes) holds ``entries``."""
        arr = np.empty(len(entries), dtype=object)
        arr[:] = list(entries)
        self.values[v.id] = arr.reshape(shape)

    def fold(self, kind: str, vals: Sequence[Value], attrs: Mapping[str, Any],
             known: Mapping[int, np.ndarray]) -> list[np.ndarray] | None:
        """The symbolic results of ``kind`` on inputs each known or symbolic (at least one symbolic), or None.

        A result whose every element is a plain number is returned as a NumPy array of its dtype (the op folds
        to a constant after all: ``Shape(x)[1]`` of an ``f32[?,3]`` is 3).
        """
        arrays = [self.value_of(v, known) for v in vals]
        if any(a is None for a in arrays):
            return None
        syms = sorted({s for a in arrays if a.dtype == object for d in a.reshape(-1) if isinstance(d, SymDim)
                       for s, _ in d.powers})
        if not 0 < len(syms) <= MAX_SYMBOLS:
            return None
        try:
            r = resolve(kind, [v.type for v in vals], attrs)
        except Exception:
            return None
        if not all(isinstance(t, TensorType) and t.shape is not None and None not in t.shape
                   and math.prod(t.shape) <= MAX_ELEMENTS and t.dtype.kind in "biuf" for t in r.out_types):
            return None
        runs = []
        # the last two runs put every symbol at 1, then 2: a comparison with a small size (N == 1), which the
        # large probe sizes would all answer alike, must not pass for a constant
        checks = [dict.fromkeys(syms, 1), dict.fromkeys(syms, 2)]
        for sizes in [*_assignments(syms), *checks]:
            try:
                concrete = [np.asarray(a) if a.dtype != object else
                            np.array([_size(d, sizes) for d in a.reshape(-1)], dtype=v.type.dtype).reshape(a.shape)
                            for a, v in zip(arrays, vals, strict=True)]
                outs = fold(r.opdef, dict(r.attrs), r.version, concrete, r.out_types, limit=MAX_ELEMENTS,
                            in_types=[v.type for v in vals], errstate="raise", catch=False, cast=True)
            except Exception:
                return None
            if outs is None:
                return None
            runs.append([np.asarray(o).reshape(-1) for o in outs])
        results = []
        for k, t in enumerate(r.out_types):
            entries = []
            for j in range(runs[0][k].size):
                fit = _fit([run[k][j].item() for run in runs[:-2]], syms, tuple(self.names))
                if fit is None:
                    return None
                for run, sizes in zip(runs[-2:], checks, strict=True):
                    try:
                        if _size(fit, sizes) != run[k][j].item():
                            return None
                    except ValueError:  # N/2 at N = 1
                        return None
                entries.append(fit)
            if not any(isinstance(e, SymDim) for e in entries):
                results.append(np.asarray(entries, dtype=t.dtype).reshape(t.shape))
                continue
            arr = np.empty(len(entries), dtype=object)
            arr[:] = entries
            results.append(arr.reshape(t.shape))
        return results


def _assignments(syms: Sequence[int]) -> list[dict[int, int]]:
    """Probe sizes: every symbol at its base size; each one doubled in turn; all tripled (the check)."""
    base = {s: _BASE * _PRIMES[i] for i, s in enumerate(syms)}
    runs = [base]
    for s in syms:
        runs.append({**base, s: 2 * base[s]})
    runs.append({s: 3 * n for s, n in base.items()})
    return runs


def _size(d: Dim | None, sizes: Mapping[int, int]) -> int:
    if d is None:
        raise ValueError("unknown dim")
    if not isinstance(d, SymDim):
        return int(d)
    value = d.coef
    for s, e in d.powers:
        if s not in sizes:
            raise ValueError("a symbol without a probe size")
        value *= Fraction(sizes[s]) ** e
    if value.denominator != 1:
        raise ValueError("not a whole size at these probe sizes")
    return int(value)


def _fit(series: Sequence[Any], syms: Sequence[int], names: tuple[str, ...]) -> Dim | None:
    """The monomial over ``syms`` whose values at the probe sizes (:func:`_assignments`) are ``series``."""
    if any(v is None for v in series) or len(series) != len(syms) + 2:
        return None
    try:
        vals = [Fraction(v) for v in series]
    except (TypeError, ValueError):
        return None
    if all(v == vals[0] for v in vals):
        return int(vals[0]) if vals[0].denominator == 1 else None
    if vals[0] == 0:
        return None
    powers = {}
    for i, s in enumerate(syms):
        ratio = vals[1 + i] / vals[0]
        if ratio <= 0:
            return None
        e = round(math.log2(ratio))
        if Fraction(2) ** e != ratio:
            return None
        powers[s] = e
    base = {s: _BASE * _PRIMES[i] for i, s in enumerate(syms)}
    coef = vals[0]
    for s, e in powers.items():
        coef /= Fraction(base[s]) ** e
    check = coef
    for s, e in powers.items():
        check *= Fraction(3 * base[s]) ** e
    if check != vals[-1]:
        return None
    return monomial(coef, powers, names)
