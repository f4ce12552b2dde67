"""A graph input's dtype and shape in either order: ``GraphBuilder.input``/``placeholder`` takes (dtype, shape),
``opgraph.numpy.placeholder`` (shape, dtype); a shape and a dtype cannot be taken for each other, so both read
either order, and what cannot be read says the signature expected (issue 36)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph
import opgraph.numpy as onp

DTYPES = ["float64", np.dtype("float32"), np.int16, float, "complex64", bool]
SHAPES = [(2, 3), [4], 5, (), (None, 3)]


def _reference(dtype: object, shape: object) -> tuple[np.dtype, tuple[int | None, ...]]:
    """What NumPy makes of the pair (``None`` dims as NumPy would see a 1)."""
    dims = (shape,) if isinstance(shape, int) else tuple(shape)  # type: ignore[arg-type]
    arr = np.empty(tuple(1 if d is None else d for d in dims), dtype=dtype)  # type: ignore[call-overload]
    return arr.dtype, dims


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_builder_input_reads_either_order(dtype: object, shape: object) -> None:
    want_dtype, want_shape = _reference(dtype, shape)
    for t in (opgraph.GraphBuilder().input(dtype, shape).type, opgraph.GraphBuilder().placeholder(shape, dtype).type,
              opgraph.GraphBuilder().input((shape, dtype)).type):
        assert (t.dtype, t.shape) == (want_dtype, want_shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_lazy_placeholder_reads_either_order(dtype: object, shape: object) -> None:
    want_dtype, want_shape = _reference(dtype, shape)
    for x in (onp.placeholder(shape, dtype), onp.placeholder(dtype, shape), onp.placeholder(dtype=shape, shape=dtype)):
        assert (x.dtype, x.shape) == (want_dtype, want_shape)


def test_both_orders_make_the_same_graph() -> None:
    def build(swap: bool) -> opgraph.Graph:
        b = opgraph.GraphBuilder()
        x = b.placeholder(*(((2, 3), "float64") if swap else ("float64", (2, 3))), name="x")
        b.output(b.tanh(b.matmul(x, b.constant(np.ones((3, 4))))))
        return b.freeze()

    lazy = onp.placeholder("float64", (2, 3), name="x")
    g = onp.to_graph([onp.tanh(lazy @ onp.asarray(np.ones((3, 4))))], inputs=[lazy])
    assert build(True) == build(False) == g
    x = np.full((2, 3), 0.1)
    np.testing.assert_allclose(g.run({"x": x})[0], np.tanh(x @ np.ones((3, 4))))


def test_the_aliases_are_the_same_methods() -> None:
    assert opgraph.GraphBuilder.placeholder is opgraph.GraphBuilder.input
    assert opgraph.GraphBuilder.const is opgraph.GraphBuilder.constant


BUILDER_FORMS = ("GraphBuilder.input (placeholder) takes input(dtype, shape), e.g. input('float64', (2, 3)) "
                 "(shape first is read the same), or one (dtype, shape) pair or TensorType")
LAZY_FORMS = ("opgraph.numpy.placeholder takes placeholder(shape, dtype='float64'), e.g. placeholder((2, 3), "
              "'float64') (dtype first is read the same)")


@pytest.mark.parametrize(("args", "reason"), [
    (((2, 3),), "(2, 3) is a shape without a dtype"),
    (((2, 3), (3,)), "not a dtype: (2, 3)"),
    (("float64", "x"), "invalid dimension 'x' in shape 'x'"),
    (("float65", (2,)), "not a dtype: 'float65'"),
])
def test_builder_input_that_cannot_be_read_says_the_signature(args: tuple[object, ...], reason: str) -> None:
    with pytest.raises(opgraph.OpBuildError) as err:
        opgraph.GraphBuilder().input(*args)
    msg = str(err.value)
    assert msg.startswith(f"input(): {reason}; {BUILDER_FORMS} (at ") and "test_placeholder_order.py" in msg
    assert isinstance(err.value, ValueError) and isinstance(err.value, TypeError)


@pytest.mark.parametrize(("args", "reason"), [
    (("float64",), "'float64' is a dtype, not a shape"),
    (((2, "a"), "float32"), "invalid dimension 'a' in shape (2, 'a')"),
    (((2,), "float65"), "not a dtype: 'float65'"),
])
def test_lazy_placeholder_that_cannot_be_read_says_the_signature(args: tuple[object, ...], reason: str) -> None:
    with pytest.raises(opgraph.OpBuildError) as err:
        onp.placeholder(*args)
    msg = str(err.value)
    assert msg.startswith(f"placeholder(): {reason}; {LAZY_FORMS} (at ") and "test_placeholder_order.py" in msg
