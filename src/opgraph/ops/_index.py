"""Where each built-in op kind is defined: its name, its id and its family module, without importing it.

``opgraph.ops`` hands this table to the registry (:func:`opgraph.core.registry.defer_ops`), so ``import
opgraph`` imports no op family: the first lookup of a kind by name or id (building an op, loading a file)
imports its family, and ``all_ops()`` imports them all. A new op is added to its family module and here;
tests/test_import_light.py checks that the two agree, and :func:`render` gives the table as the families
define it, to paste below (``python -c "from opgraph.ops._index import render; print(render())"``).

    >>> BUILTIN_OPS["opgraph.ops.contraction"]["matmul"]
    600
"""

from __future__ import annotations

BUILTIN_OPS: dict[str, dict[str, int]] = {
    "opgraph.ops.elementwise": {
        "negative": 1, "positive": 2, "abs": 3, "sign": 4, "exp": 5, "expm1": 6, "log": 7, "log1p": 8, "log2": 9,
        "log10": 10, "sqrt": 11, "square": 12, "reciprocal": 13, "sin": 14, "cos": 15, "tan": 16, "asin": 17,
        "acos": 18, "atan": 19, "sinh": 20, "cosh": 21, "tanh": 22, "asinh": 23, "acosh": 24, "atanh": 25,
        "floor": 26, "ceil": 27, "trunc": 28, "round": 29, "sigmoid": 30, "erf": 31, "isnan": 32, "isinf": 33,
        "isfinite": 34, "logical_not": 35, "bitwise_invert": 36, "conj": 37, "signbit": 38, "exp2": 39, "cbrt": 40,
        "erfc": 41, "real": 42, "imag": 43, "gelu": 44, "silu": 45, "hard_sigmoid": 46, "hard_swish": 47, "add": 200,
        "subtract": 201, "multiply": 202, "divide": 203, "floor_divide": 204, "remainder": 205, "power": 206,
        "maximum": 207, "minimum": 208, "atan2": 209, "hypot": 210, "logaddexp": 211, "copysign": 212,
        "nextafter": 213, "equal": 220, "not_equal": 221, "less": 222, "less_equal": 223, "greater": 224,
        "greater_equal": 225, "logical_and": 230, "logical_or": 231, "logical_xor": 232, "bitwise_and": 240,
        "bitwise_or": 241, "bitwise_xor": 242, "bitwise_left_shift": 243, "bitwise_right_shift": 244, "fmax": 245,
        "fmin": 246, "fmod": 247, "where": 400, "cast": 401, "clip": 402,
    },
    "opgraph.ops.reduction": {
        "sum": 500, "prod": 501, "max": 502, "min": 503, "mean": 504, "any": 505, "all": 506, "var": 507, "std": 508,
        "argmax": 510, "argmin": 511, "cumsum": 520, "cumprod": 521, "logsumexp": 530,
    },
    "opgraph.ops.contraction": {
        "matmul": 600, "einsum": 601, "tensordot": 602, "vecdot": 603, "outer": 604,
    },
    "opgraph.ops.shape": {
        "reshape": 700, "permute_dims": 701, "broadcast_to": 702, "expand_dims": 703, "squeeze": 704, "concat": 705,
        "stack": 706, "split": 707, "getitem": 708, "take": 709, "pad": 710, "flip": 711, "roll": 712, "tile": 713,
        "repeat": 714, "moveaxis": 715, "copy": 716, "bitcast": 717, "slice": 718, "slice_update": 719, "shape": 720,
        "arange": 721, "alloc": 722, "reshape_to": 723, "assert_all": 724,
    },
    "opgraph.ops.nn": {
        "relu": 800, "softmax": 801, "log_softmax": 802, "conv2d": 803, "max_pool2d": 804, "avg_pool2d": 805,
        "conv": 806, "conv_transpose": 807, "max_pool": 808, "max_pool_argmax": 809, "avg_pool": 810, "lp_pool": 811,
        "lrn": 812, "resize": 813, "grid_sample": 814, "layer_norm": 815,
    },
    "opgraph.ops.linalg": {
        "eigh": 900, "qr": 901, "svd": 902, "cholesky": 903, "solve": 904, "inv": 905, "det": 906, "slogdet": 907,
        "eigvalsh": 908, "svdvals": 909, "pinv": 910, "eig": 911,
    },
    "opgraph.ops.fused": {
        "fma": 1000, "matmul_t": 1001, "fused_elementwise": 1002, "sgd_momentum_update": 1010, "adagrad_update": 1011,
        "adam_update": 1012, "adam_update_t": 1013,
    },
    "opgraph.ops.indexing": {
        "gather_elements": 1100, "scatter_elements": 1101, "gather_nd": 1102, "scatter_nd": 1103, "topk": 1104,
        "one_hot": 1105, "trilu": 1106, "reverse_sequence": 1107, "sort": 1108, "unique": 1109, "nonzero": 1110,
        "searchsorted": 1111,
    },
    "opgraph.ops.signal": {
        "fft": 1200, "rfft": 1201, "irfft": 1202,
    },
    "opgraph.ops.control": {
        "call": 1300, "cond": 1301, "while_loop": 1302, "scan": 1303,
    },
    "opgraph.ops.tenscalc": {
        "Vzeros": 10001, "Vones": 10002, "Veye": 10003, "Vsubsref": 10004, "Vrepmat": 10005, "Vcat": 10006,
        "Vreshape": 10007, "Vfull": 10008, "Vplus": 10009, "Vtprod": 10010, "Vtprod_matlab": 10011, "Vnorm2": 10012,
        "Vnorminf": 10013, "Vmin": 10014, "Vmax": 10015, "Vall": 10016, "Vany": 10017, "Vabs": 10018, "Vclp": 10019,
        "Vcompose": 10020, "Vlu": 10021, "Vchol": 10022, "Vmldivide_l1": 10023, "Vmldivide_u": 10024,
        "Vmtimes": 10025, "Vctranspose": 10026, "Vtranspose": 10027, "Vrdivide": 10028, "Vsum": 10029, "Vdiag": 10030,
        "Ssum": 20001, "Ssumprod": 20002, "Sinv": 20003, "Sminus_inv_sqr": 20004, "Sdiv": 20005, "Sminus_dot": 20006,
        "Sminus_dot_div": 20007, "Splus_minus_dot": 20008, "Splus_sqr": 20009, "Splus_minus_dot_div": 20010,
        "Smin": 20011, "Smin0": 20012, "Smax": 20013, "Smax0": 20014, "Smax_abs": 20015, "Sclp": 20016, "Sexp": 20017,
        "Slog": 20018, "Scos": 20019, "Sminus_cos": 20020, "Ssin": 20021, "Sminus_sin": 20022, "Sabs": 20023,
        "Ssqrt": 20024, "SDsqrt": 20025, "SDDsqrt": 20026, "Ssqr": 20027, "S2times": 20028, "S2": 20029,
        "Satan": 20030, "SDatan": 20031, "SDDatan": 20032, "scalars2ftensor": 30001, "ftensor2scalars": 30002,
    },
}
"""Family module -> {op name: op id}, in the order the families are listed in opgraph/ops/__init__.py."""


def table() -> dict[str, tuple[int, str]]:
    """The table as the registry takes it: op name -> (id, module).

    >>> table()["relu"]
    (800, 'opgraph.ops.nn')
    """
    return {name: (op_id, module) for module, ops in BUILTIN_OPS.items() for name, op_id in ops.items()}


def render() -> str:
    """``BUILTIN_OPS`` as the imported families define it, formatted as the literal above (imports them all).

    >>> "opgraph.ops.elementwise" in render()
    True
    """
    from opgraph.core.registry import all_ops

    by_module: dict[str, list[str]] = {}
    for d in all_ops():
        if d.family not in ("core", "user"):
            by_module.setdefault(f"opgraph.ops.{d.family}", []).append(f'"{d.name}": {d.id},')
    lines = ["BUILTIN_OPS: dict[str, dict[str, int]] = {"]
    for module, items in by_module.items():
        lines.append(f'    "{module}": {{')
        line = "       "
        for item in items:
            if len(line) + 1 + len(item) > 118:
                lines.append(line)
                line = "       "
            line += " " + item
        lines += [line, "    },"]
    return "\n".join([*lines, "}"])

