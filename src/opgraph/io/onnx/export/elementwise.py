"""ONNX export of the element-wise ops (:mod:`opgraph.ops.elementwise`): one node each where ONNX has the op,
else a few (``logaddexp`` as ``max + log(1 + exp(-|a - b|))``).

    >>> import opgraph
    >>> from opgraph.io.onnx import to_onnx
    >>> b = opgraph.GraphBuilder()
    >>> x = b.input(("float32", (2,)), name="x")
    >>> b.output(b.op("logaddexp", x, x))
    >>> [n.op_type for n in to_onnx(b.freeze()).graph.node]
    ['Max', 'Sub', 'Abs', 'Neg', 'Exp', 'Add', 'Log', 'Add', 'Equal', 'Add', 'Where']
"""

from __future__ import annotations

import math

import numpy as np

from opgraph.io.onnx.export import EXPORT, Exporter, decomposed
from opgraph.io.onnx.export.common import AttrMap, Names, Types, elem_type, scalar, simple

EXPORT.rules_from({
    "negative": "Neg", "abs": "Abs", "sign": "Sign", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
    "sin": "Sin", "cos": "Cos", "tan": "Tan", "asin": "Asin", "acos": "Acos",
    "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh", "tanh": "Tanh", "asinh": "Asinh", "acosh": "Acosh",
    "atanh": "Atanh", "sigmoid": "Sigmoid", "erf": "Erf", "logical_not": "Not",
    "bitwise_invert": "BitwiseNot", "positive": "Identity",
    "add": "Add", "subtract": "Sub", "multiply": "Mul", "power": "Pow", "maximum": "Max", "minimum": "Min",
    "equal": "Equal", "less": "Less", "less_equal": "LessOrEqual", "greater": "Greater",
    "greater_equal": "GreaterOrEqual", "logical_and": "And", "logical_or": "Or", "logical_xor": "Xor",
    "bitwise_and": "BitwiseAnd", "bitwise_or": "BitwiseOr", "bitwise_xor": "BitwiseXor", "where": "Where",
}, simple)


@EXPORT.rule("floor", "ceil", "round")
def _rounding(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    op_type = {"floor": "Floor", "ceil": "Ceil", "round": "Round"}[ex.current_kind]
    # integers and bools are already whole (ONNX's rounding ops take floats only)
    return [ex.one(op_type if it[0].dtype.kind == "f" else "Identity", ins[0])]


@EXPORT.rule("square")
def _square(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Mul", ins[0], ins[0])]


@EXPORT.rule("expm1")
def _expm1(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Sub", ex.one("Exp", ins[0]), scalar(ex, 1, ot[0]))]


@EXPORT.rule("log1p")
def _log1p(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Log", ex.one("Add", ins[0], scalar(ex, 1, ot[0])))]


@EXPORT.rule("log2", "log10")
def _log_base(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    base = 2.0 if ex.current_kind == "log2" else 10.0
    return [ex.one("Div", ex.one("Log", ins[0]), scalar(ex, math.log(base), ot[0]))]


@EXPORT.rule("exp2")
def _exp2(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Pow", scalar(ex, 2, ot[0]), ins[0])]


@EXPORT.rule("erfc")
def _erfc(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Sub", scalar(ex, 1, ot[0]), ex.one("Erf", ins[0]))]


@EXPORT.rule("trunc")
def _trunc(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    if it[0].dtype.kind != "f":
        return [ex.one("Identity", ins[0])]
    return [ex.one("Mul", ex.one("Sign", ins[0]), ex.one("Floor", ex.one("Abs", ins[0])))]


@EXPORT.rule("reciprocal")
def _reciprocal(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    if it[0].dtype.kind != "f":  # Reciprocal takes floats only; NumPy's of an integer is 1 // x truncated, as Div
        return [ex.one("Div", scalar(ex, 1, it[0]), ins[0])]
    return [ex.one("Reciprocal", ins[0])]


@EXPORT.rule("isnan", "isinf", "isfinite")
def _isnan(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    x, kind = ins[0], ex.current_kind
    if it[0].dtype.kind != "f":  # IsNaN and IsInf take floats only; an integer or bool is always finite
        same = ex.one("Equal", x, x)
        return [same if kind == "isfinite" else ex.one("Not", same)]
    if it[0].dtype == np.float16 and ex.opset < 20:  # IsInf takes float16 from opset 20 on
        x = ex.one("Cast", x, to=elem_type(np.float32))
    if kind == "isnan":
        return [ex.one("IsNaN", x)]
    if kind == "isinf":
        return [ex.one("IsInf", x)]
    return [ex.one("Not", ex.one("Or", ex.one("IsNaN", x), ex.one("IsInf", x)))]


@EXPORT.rule("not_equal")
def _not_equal(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Not", ex.one("Equal", *ins))]


@EXPORT.rule("divide")
def _divide(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    a, b = (ex.one("Cast", x, to=elem_type(ot[0].dtype)) if t.dtype != ot[0].dtype else x
            for x, t in zip(ins, it, strict=True))
    return [ex.one("Div", a, b)]


@EXPORT.rule("floor_divide", "remainder")
def _floor_divide(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    a, b = ins
    kind = ex.current_kind
    if ot[0].dtype.kind in "iu":
        if kind == "remainder":
            return [ex.one("Mod", a, b, fmod=0)]
        # floor division = (a - mod(a, b)) / b, exact in integers
        return [ex.one("Div", ex.one("Sub", a, ex.one("Mod", a, b, fmod=0)), b)]
    if kind == "remainder":
        # NumPy's npy_divmod: C's exact fmod (also where a / b overflows), moved by b where its sign differs from
        # b's; a zero takes b's sign (a - floor(a / b) * b loses it all once a / b is past 2**nmant)
        zero = scalar(ex, 0, ot[0])
        mod = ex.one("Mod", a, b, fmod=1)
        b_neg = ex.one("Less", b, zero)
        differ = ex.one("Xor", b_neg, ex.one("Less", mod, zero))
        moved = ex.one("And", ex.one("Not", ex.one("Equal", mod, zero)), differ)
        signed_zero = ex.one("Where", b_neg, ex.one("Neg", zero), zero)
        res = ex.one("Where", moved, ex.one("Add", mod, b), mod)
        return [ex.one("Where", ex.one("Equal", mod, zero), signed_zero, res)]
    return [ex.one("Floor", ex.one("Div", a, b))]


@EXPORT.rule("hypot")
def _hypot(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    # max * sqrt(1 + (min / max)**2): squares neither overflow nor underflow; an infinite side wins over NaN
    a, b = (ex.one("Abs", x) for x in ins)
    hi, lo = ex.one("Max", a, b), ex.one("Min", a, b)
    zero, one = scalar(ex, 0, ot[0]), scalar(ex, 1, ot[0])
    r = ex.one("Div", lo, ex.one("Where", ex.one("Equal", hi, zero), one, hi))
    h = ex.one("Mul", hi, ex.one("Sqrt", ex.one("Add", one, ex.one("Mul", r, r))))
    inf = ex.one("Or", ex.one("IsInf", a), ex.one("IsInf", b))
    return [ex.one("Where", inf, scalar(ex, np.inf, ot[0]), h)]


@EXPORT.rule("logaddexp")
def _logaddexp(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    a, b = ins
    hi = ex.one("Max", a, b)
    gap = ex.one("Neg", ex.one("Abs", ex.one("Sub", a, b)))
    res = ex.one("Add", hi, ex.one("Log", ex.one("Add", scalar(ex, 1, ot[0]), ex.one("Exp", gap))))
    # equal operands: a + log 2, which keeps logaddexp(inf, inf) = inf (inf - inf is NaN above)
    return [ex.one("Where", ex.one("Equal", a, b), ex.one("Add", a, scalar(ex, math.log(2), ot[0])), res)]


@EXPORT.rule("cast")
def _cast(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Cast", ins[0], to=elem_type(ot[0].dtype))]


@EXPORT.rule("clip")
def _clip(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    x = ins[0]
    # Clip wants bounds of the input's type and scalar; Max/Min broadcast like NumPy's clip
    x = ex.one("Max", x, ins[1]) if len(ins) > 1 else x
    return [ex.one("Min", x, ins[2]) if len(ins) > 2 else x]


@EXPORT.rule("fmod")
def _fmod(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Mod", *ins, fmod=1)]


@EXPORT.rule("silu")
def _silu(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    return [ex.one("Mul", ins[0], ex.one("Sigmoid", ins[0]))]


@EXPORT.rule("hard_sigmoid")
def _hard_sigmoid(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    if it[0].dtype == np.float64:  # the node's alpha and beta are float32 attributes: float64 keeps its constants
        return decomposed(ex, "hard_sigmoid", ins, it, attrs)
    return [ex.one("HardSigmoid", ins[0], alpha=float(attrs["alpha"]), beta=float(attrs["beta"]))]


@EXPORT.rule("hard_swish")
def _hard_swish(ex: Exporter, ins: Names, attrs: AttrMap, it: Types, ot: Types) -> Names:
    # float64: ONNX Runtime's HardSwish multiplies by 1/6 in float32 (measured: 5e-9 off). NumPy's semantics:
    # HardSwish(3.4e38) is finite where x * (x + 3) / 6 overflows to inf as NumPy's does
    if it[0].dtype == np.float64 or ex.nan_semantics == "numpy":
        return decomposed(ex, "hard_swish", ins, it, attrs)
    return [ex.one("HardSwish", ins[0])]
