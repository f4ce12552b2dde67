"""How a compiled program is called: positional arrays, one dict, or keywords, on every installed engine; any
other call is one FeedError (also a TypeError) naming the inputs and the three forms (issue 33, point 3)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import opgraph
from opgraph.core.feeds import resolve_call
from opgraph.errors import FeedError, GraphError

ENGINES = ["numpy"] + [e for e in ("jax", "torch", "onnxruntime", "dask") if importlib.util.find_spec(e)]


def _exp_graph() -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", ()), name="x")
    b.output(b.op("exp", x))
    return b.freeze()


def _two_inputs() -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    w = b.input(("float64", (3,)), name="w")
    b.output(b.op("multiply", b.op("sin", x), w))
    return b.freeze()


@pytest.fixture(scope="module", params=ENGINES)
def programs(request: pytest.FixtureRequest) -> tuple[str, opgraph.Program, opgraph.Program]:
    return (request.param, opgraph.compile(_exp_graph(), backend=request.param),
            opgraph.compile(_two_inputs(), backend=request.param))


# the values of the report: each gave a different unrelated error as f(x)
@pytest.mark.parametrize("value", [np.array(0.0), np.array(1.5), np.float64(2.0), 2.0, 3])
def test_a_positional_call_of_the_right_arity_runs(programs, value) -> None:
    _, f, _ = programs
    got = f(value)[0]
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, np.exp(np.float64(value)), rtol=1e-15)


def test_the_three_forms_give_the_same_results(programs) -> None:
    _, _, f = programs
    x, w = np.array([0.1, 0.2, 0.3]), np.array([2.0, -1.0, 0.5])
    want = np.sin(x) * w
    for got in (f(x, w), f({"x": x, "w": w}), f({"%x": x, 1: w}), f(x=x, w=w), f({"x": x}, w=w)):
        np.testing.assert_allclose(got[0], want, rtol=1e-14)
    np.testing.assert_allclose(f({"x": x, "w": w}, ["%x"])[0], x)  # p(feeds, targets), as Graph.run


@pytest.mark.parametrize(("args", "named", "says"), [
    ((np.ones(3),), {}, "got 1 positional argument for 2 inputs"),
    ((np.ones(3), np.ones(3), np.ones(3)), {}, "got 3 positional arguments for 2 inputs"),
    (({"x": np.ones(3)}, {"w": np.ones(3)}, np.ones(3)), {}, "got 3 positional arguments"),
    ((np.ones(3), None), {}, "positional argument 1 is None, not an array"),
    ((np.ones(3), {"w": np.ones(3)}), {}, "positional argument 1 is a dict, not an array"),
    ((np.ones(3), np.ones(3)), {"x": np.ones(3)}, "input %x is fed twice: by position 0 and by keyword x="),
])
def test_every_other_call_is_one_feed_error_naming_the_forms(programs, args, named, says) -> None:
    _, _, f = programs
    with pytest.raises(FeedError) as info:
        f(*args, **named)
    text = str(info.value)
    assert says in text
    if "fed twice" not in text:
        assert "x: f64[3], w: f64[3]" in text and "f(x, w)" in text and "f(x=...)" in text and "dict" in text
    assert isinstance(info.value, TypeError) and isinstance(info.value, GraphError)


def test_an_unhashable_or_list_feed_is_data_not_a_key(programs) -> None:
    _, f, two = programs
    with pytest.raises(FeedError, match=r"input %x expects f64\[\], got shape \(1,\)"):
        f([0.5])  # a list is an array-like feed (of the wrong shape here), never a dict key
    with pytest.raises(FeedError, match="got 1 positional argument for 2 inputs"):
        two([np.ones(3), np.ones(3)])  # a list of two arrays is one array-like feed, not the two inputs


def test_state_inputs_may_be_left_out_positionally() -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", ()), name="x")
    s = b.input(("float64", ()), name="s")
    nxt = b.op("add", s, x)
    b.output(nxt)
    b.update(nxt, s)
    g = b.freeze()
    for engine in ENGINES[:3]:
        f = opgraph.compile(g, backend=engine)
        assert float(f(1.0, 10.0)[0]) == 11.0  # every input, in order
        assert float(f(2.0)[0]) == 13.0        # the state input left out: its kept state
        assert float(f(3.0, s=0.0)[0]) == 3.0  # or fed by keyword
    with pytest.raises(FeedError, match=r"got 3 positional arguments for 1 or 2 inputs: .*without the state input"):
        f(1.0, 2.0, 3.0)


def test_resolve_call_maps_each_form_to_input_ids() -> None:
    g = _two_inputs()
    a, c = np.zeros(3), np.ones(3)
    assert resolve_call(g, (a, c)) == {0: a, 1: c}
    assert resolve_call(g, ({"w": c},), {"x": a}) == {1: c, 0: a}
    assert resolve_call(g, (), {"w": c}) == {1: c}
    assert resolve_call(g, (None,)) == {}
