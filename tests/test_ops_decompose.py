"""Every op with a decomposition (``OpDef.decompose``) computes with it what its NumPy kernel computes.

The decomposition is emitted into a fresh graph through an emitter of its own (not lowering's nor the ONNX
exporter's), run on random float64 inputs, and compared with the op's kernel on the same inputs. Each op that
has a decomposition needs a case below: a new decomposition without one fails ``test_every_decomposition_has_a_case``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import opgraph
from opgraph.core.registry import all_ops, get_op

ROOT = Path(__file__).resolve().parents[1]

Gen = Callable[[np.random.Generator], list[np.ndarray]]


def _normal(*shapes: tuple[int, ...], scale: float = 3.0) -> Gen:
    return lambda rng: [rng.normal(0, scale, s) for s in shapes]


def _adam_inputs(rng: np.random.Generator, shape: tuple[int, ...] = (4, 5)) -> list[np.ndarray]:
    p, m, g = (rng.normal(size=shape) for _ in range(3))
    return [p, m, rng.uniform(0.0, 2.0, shape), g]  # v is a running mean of squares: >= 0


_ADAM = {"lr": 1e-2, "b1": 0.9, "c1": 0.1, "b2": 0.999, "c2": 1e-3, "eps": 1e-8}

# op name -> cases (inputs, attributes); float64 throughout.
CASES: dict[str, list[tuple[Gen, dict[str, Any]]]] = {
    "fma": [(_normal((3, 4), (3, 4), (3, 4)), {}), (_normal((2, 1, 4), (3, 1), (4,)), {})],
    "matmul_t": [(_normal((5, 3), (5, 4)), {"transpose_a": True, "transpose_b": False}),
                 (_normal((3, 5), (4, 5)), {"transpose_a": False, "transpose_b": True}),
                 (_normal((2, 5, 3), (2, 4, 5)), {"transpose_a": True, "transpose_b": True}),
                 (_normal((3, 5), (5, 4)), {"transpose_a": False, "transpose_b": False})],
    "fused_elementwise": [
        (_normal((3, 4), (4,), (3, 1)), {"program": (("multiply", -1, -2), ("tanh", 0), ("add", 1, -3))}),
        (_normal((6,), (6,)), {"program": (("subtract", -1, -2), ("square", 0), ("exp", 1))})],
    "sgd_momentum_update": [(_normal((4, 3), (4, 3), (4, 3)), {"lr": 0.05, "mu": 0.9})],
    "adagrad_update": [(lambda rng: [rng.normal(size=(7,)), rng.uniform(0.0, 3.0, (7,)), rng.normal(size=(7,))],
                        {"lr": 0.1, "eps": 1e-10})],
    "adam_update": [(_adam_inputs, {**_ADAM, "bc1": 0.19, "bc2": 0.002, "square_first": sq})
                    for sq in (False, True)],
    "adam_update_t": [(lambda rng: [*_adam_inputs(rng), np.array(0.271), np.array(0.003)],
                       {**_ADAM, "square_first": sq}) for sq in (False, True)],
    "gelu": [(_normal((50,)), {"approximate": "none"}), (_normal((50,)), {"approximate": "tanh"})],
    "silu": [(_normal((50,), scale=10.0), {})],
    "hard_sigmoid": [(_normal((50,)), {"alpha": 0.2, "beta": 0.5}), (_normal((50,)), {"alpha": 1 / 6, "beta": 0.5})],
    "hard_swish": [(_normal((50,)), {})],
    "layer_norm": [(_normal((3, 8)), {}),
                   (_normal((2, 3, 4), (3, 4), (4,)), {"axis": 1, "epsilon": 1e-3}),
                   (_normal((5, 6), (6,)), {"axis": -1})],
}

DECOMPOSED = sorted(d.name for d in all_ops() if d.decompose is not None)


class ToBuilder:
    """An emitter that writes a decomposition into a GraphBuilder (values are the builder's values)."""

    def __init__(self, b: opgraph.GraphBuilder) -> None:
        self.b = b

    def op(self, kind: str, *ins: Any, **attrs: Any) -> Any:
        return self.b.op(kind, *ins, **attrs)

    def constant(self, value: Any, dtype: Any = None) -> Any:
        return self.b.constant(np.asarray(value, dtype))

    def type_of(self, v: Any) -> Any:
        return v.type


def _outputs(res: Any) -> list[Any]:
    return list(res) if isinstance(res, tuple) else [res]


def test_every_decomposition_has_a_case() -> None:
    assert DECOMPOSED, "no op registers a decomposition"
    assert set(DECOMPOSED) - set(CASES) == set(), "add a case for each new decomposition"
    assert set(CASES) - set(DECOMPOSED) == set(), "a case for an op that has no decomposition"


@pytest.mark.parametrize("name", DECOMPOSED)
def test_decomposition_equals_the_numpy_kernel(name: str) -> None:
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # a seed per op, the same in every run
    d = get_op(name)
    for gen, attrs in CASES[name]:
        arrays, norm = gen(rng), dict(d.normalise_attrs(attrs))
        kernel = d.kernel_for(12)
        expected = _outputs(kernel(*[a.copy() for a in arrays], **norm))  # copies: kernels may work in place
        b = opgraph.GraphBuilder()
        xs = [b.input(("float64", a.shape), name=f"x{i}") for i, a in enumerate(arrays)]
        res = d.decompose(ToBuilder(b), xs, norm)
        assert res is not None, f"{name}{attrs}: no decomposition for float64 operands"
        outs = _outputs(res)
        for o in outs:
            b.output(o)
        g = b.freeze()
        kinds = {g.kind_of(op) for op in range(g.num_ops)}
        assert name not in kinds and kinds <= {k.name for k in all_ops()}
        got = g.run(dict(zip(xs, arrays, strict=True)), outs)
        assert len(got) == len(expected)
        for gv, ev in zip(got, expected, strict=True):
            assert gv.dtype == ev.dtype == np.float64 and gv.shape == ev.shape
            np.testing.assert_allclose(gv, ev, rtol=1e-13, atol=1e-15, err_msg=f"{name} {attrs}")


def test_decompositions_live_in_their_family_and_load_with_it() -> None:
    # Looking up one op's decomposition loads that op's family only: they register with their ops, lazily.
    code = ("import json, sys; from opgraph.core.registry import get_op\n"
            "fams = {k: get_op(k).decompose.__module__ for k in ('gelu', 'layer_norm')}\n"
            "print(json.dumps([fams, sorted(m for m in sys.modules if m.startswith('opgraph.ops.'))]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    fams, loaded = json.loads(proc.stdout)
    assert fams == {"gelu": "opgraph.ops.elementwise", "layer_norm": "opgraph.ops.nn"}
    assert "opgraph.ops.fused" not in loaded and "opgraph.ops.elementwise" in loaded and "opgraph.ops.nn" in loaded
    for d in all_ops():
        if d.decompose is not None:
            assert d.decompose.__module__ == f"opgraph.ops.{d.family}", d.name
