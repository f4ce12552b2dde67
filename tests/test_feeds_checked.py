"""Feeds are converted only when no value changes, the same way on every runtime and backend (issue 15, 7-8).

The reference is NumPy's own rules, computed here independently of :mod:`opgraph.core.feeds`:

* arrays: ``np.can_cast(src, dst, "same_kind")``, and the values must survive ``astype``: integers compare
  equal as Python ints after the cast; for float and complex inputs no finite value may become infinite
  (rounding to the narrower float is accepted, and documented);
* Python lists: each element as a NEP 50 weak scalar: ``np.result_type(dst, element)`` must stay ``dst``
  and ``np.array(element, dtype=dst)`` must neither raise (an int out of range) nor overflow to infinity.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any
from unittest import mock

import numpy as np
import pytest

import opgraph
from opgraph import backends
from opgraph.backends.numpy import arena as numpy_backend
from opgraph.errors import ExecutionError, FeedError, GraphError, UnknownKeyError
from opgraph.runtime.executor import execute

ENGINES = [e for e in ("jax", "torch", "onnxruntime") if importlib.util.find_spec(e) is not None]
DSTS = ["bool", "int8", "uint8", "int16", "int32", "int64", "uint32", "float16", "float32", "float64",
        "complex64", "complex128"]

ARRAYS = [
    np.array([300, -300, 1000]),             # the issue's example: wraps to [44, -44, -24] in int8
    np.array([1, -2, 3]),
    np.array([0, 1, 255], np.int16),
    np.array([1, 2, 3], np.uint8),
    np.array([1.5, -2.25, 3.0]),
    np.array([1e300, 0.1, -1.0]),            # overflows float32 and float16
    np.array([70000.0, 1.0, 2.0], np.float32),  # overflows float16 only
    np.array([np.inf, np.nan, 1.0]),         # non-finite values stay what they are
    np.array([True, False, True]),
    np.array([1 + 2j, 3, 4]),
    np.array([1e300 + 1j, 0, 0]),
    np.array([2**40, 1, 2]),                 # fits int64 and the floats, not int32
    np.array(["a", "b", "c"]),
]
LISTS: list[list[Any]] = [
    [300, -300, 1000],
    [1.7, 300, -1],                          # the issue's example: [1, 44, -1] in int8
    [1, 2, 3],
    [-1, 0, 1],                              # fits every signed input, not unsigned ones
    [0.5, 1.0, 2.0],
    [1e300, 1.0, 2.0],
    [70000, 1, 2],                           # a Python int too large for float16
    [True, False, True],
    [True, 2, 3],
    [1j, 2, 3],
    [2**70, 1, 2],                           # beyond int64: only the floats hold it
    ["a", "b", "c"],
]


# ----------------------------------------------------------------------------- the reference
def reference(data: Any, dst: np.dtype) -> np.ndarray | None:
    """What NumPy's rules accept (the converted array) or None where they refuse."""
    if isinstance(data, np.ndarray):
        if not np.can_cast(data.dtype, dst, "same_kind"):
            return None
        with np.errstate(over="ignore", invalid="ignore"):
            out = data.astype(dst)
        if dst.kind in "biu":
            return out if out.tolist() == data.tolist() else None
        return None if _overflows(data, out) else out
    for element in data:
        try:
            if np.result_type(dst, element) != dst:
                return None
            with np.errstate(over="ignore"):
                one = np.array(element, dtype=dst)
        except (OverflowError, TypeError, ValueError):
            return None
        if dst.kind in "fc" and _overflows(np.array(element, dtype=complex if isinstance(element, complex)
                                                    else float), one):
            return None
    return np.array(data, dtype=dst)


def _overflows(src: np.ndarray, out: np.ndarray) -> bool:
    pairs = [(np.real(src), np.real(out)), (np.imag(src), np.imag(out))]
    return any(bool(np.any(np.isinf(o.astype(float)) & np.isfinite(s.astype(float)))) for s, o in pairs)


# ----------------------------------------------------------------------------- the runners
def _graph(dtype: str) -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input((dtype, (3,)), name="x")
    b.output(b.op("copy", x, name="y"))
    return b.freeze()


_CACHE: dict[tuple[str, str], Callable[[Any], np.ndarray]] = {}


def _loop_runner(g: opgraph.Graph) -> Callable[[Any], np.ndarray]:
    with mock.patch.object(numpy_backend, "CODEGEN_LIMIT", 0):  # the loop over the program, not generated code
        f = numpy_backend.CompiledGraph(g)

    def run(d: Any) -> np.ndarray:
        with mock.patch.object(numpy_backend, "CODEGEN_LIMIT", 0):
            return f(x=d)[0]
    return run


def _context_runner(f: Any) -> Callable[[Any], np.ndarray]:
    ctx = f.context()

    def run(d: Any) -> np.ndarray:
        ctx.set("x", d)
        return ctx.get("y")
    return run


def _executable_runner(engine: str, g: opgraph.Graph) -> Callable[[Any], np.ndarray]:
    be = backends.get(engine)
    exe = be.compile_graph(g)
    return lambda d: be.to_numpy(exe([d])[0])


def runner(kind: str, dtype: str) -> Callable[[Any], np.ndarray]:
    key = (kind, dtype)
    if key not in _CACHE:
        g = _graph(dtype)
        if kind == "graph.run":
            _CACHE[key] = lambda d: g.run({"x": d})[0]
        elif kind == "executor":
            _CACHE[key] = lambda d: execute(g, {g.inputs[0]: d})[0]
        elif kind == "numpy":
            f = opgraph.compile(g)
            _CACHE[key] = lambda d: f(x=d)[0]
        elif kind == "numpy-loop":
            _CACHE[key] = _loop_runner(g)
        elif kind == "numpy-context":
            _CACHE[key] = _context_runner(opgraph.compile(g))
        elif kind.startswith("exe-"):
            _CACHE[key] = _executable_runner(kind[4:], g)
        elif kind.endswith("-context"):
            _CACHE[key] = _context_runner(opgraph.compile(g, backend=kind[:-8]))
        else:
            f2 = opgraph.compile(g, backend=kind)
            _CACHE[key] = lambda d: f2({"x": d})[0]
    return _CACHE[key]


RUNNERS = (["graph.run", "executor", "numpy", "numpy-loop", "numpy-context"] + ENGINES
           + [f"{e}-context" for e in ENGINES])
# the engines' own executables take only the dtypes the engine declares (others run on numpy in a Program)
EXECUTABLES = [(f"exe-{e}", d) for e in ["numpy", *ENGINES] for d in DSTS
               if e == "numpy" or d in backends.get(e).dtypes]
CASES = [(kind, d) for kind in RUNNERS for d in DSTS] + EXECUTABLES


def _ids(case: tuple[str, str]) -> str:
    return f"{case[0]}-{case[1]}"


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_feeds_follow_numpys_rules(case: tuple[str, str]) -> None:
    kind, dtype = case
    run = runner(kind, dtype)
    dst = np.dtype(dtype)
    for data in [*ARRAYS, *LISTS]:
        want = reference(data, dst)
        if want is None:
            with pytest.raises(ExecutionError, match="input %x expects") as info:
                run(data)
            assert isinstance(info.value, FeedError) and isinstance(info.value, ValueError)
        else:
            got = run(data)
            assert got.dtype == dst, (data, got)
            np.testing.assert_array_equal(got, want, err_msg=f"{data!r} -> {dtype}")


# ----------------------------------------------------------------------------- the issue's findings
@pytest.mark.parametrize("kind", RUNNERS + [f"exe-{e}" for e in ["numpy", *ENGINES]])
def test_issue_examples_are_errors_naming_the_input(kind: str) -> None:
    run = runner(kind, "int8")
    with pytest.raises(FeedError, match=r"input %x expects i8\[3\]: value 300 at index 0 does not fit in int8"):
        run(np.array([300, -300, 1000]))
    with pytest.raises(FeedError, match=r"input %x expects i8\[3\], got Python floats"):
        run([1.7, 300, -1])
    # the documented opt-in: convert explicitly, then the exact dtype is taken as it is
    np.testing.assert_array_equal(run(np.asarray([300, -300, 1000]).astype(np.int8)), [44, -44, -24])
    run_f = runner(kind, "float64")
    with pytest.raises(FeedError, match="input %x expects f64") as info:
        run_f(["a", "b", "c"])
    assert isinstance(info.value, GraphError) and isinstance(info.value, ValueError)


def test_float64_into_float32_is_value_checked() -> None:
    run = runner("numpy", "float32")
    x = np.array([0.1, 1e-50, 3.4e38])
    np.testing.assert_array_equal(run(x), x.astype(np.float32))  # rounding and underflow: accepted
    with pytest.raises(FeedError, match=r"value 1e\+39 at index 2 does not fit in float32 \(it would become inf\)"):
        run(np.array([0.1, 1.0, 1e39]))


def _feeders(kind: str) -> Callable[[dict[str, Any]], Any]:
    g = _graph("float64")
    if kind == "graph.run":
        return g.run
    if kind == "numpy":
        return opgraph.compile(g)
    if kind == "numpy-context":
        ctx = opgraph.compile(g).context()
        return lambda feeds: [ctx.set(k, v) for k, v in feeds.items()]
    if kind.endswith("-context"):
        ctx2 = opgraph.compile(g, backend=kind[:-8]).context()
        return lambda feeds: [ctx2.set(k, v) for k, v in feeds.items()]
    return opgraph.compile(g, backend=kind)


@pytest.mark.parametrize("kind", ["graph.run", "numpy", "numpy-context", *ENGINES, *[f"{e}-context" for e in ENGINES]])
def test_an_unknown_feed_name_lists_the_inputs(kind: str) -> None:
    feed = _feeders(kind)
    one = np.ones(3)
    with pytest.raises(UnknownKeyError, match=r"no value named 'xx'; the graph's inputs: x; did you mean 'x'\?") as e:
        feed({"xx": one})
    assert isinstance(e.value, ExecutionError) and isinstance(e.value, KeyError)  # KeyError: as before
    with pytest.raises(UnknownKeyError, match=r"no value named 'zzz'; the graph's inputs: x$"):
        feed({"zzz": one})
    with pytest.raises(UnknownKeyError, match="no value 7: the graph has 2 value"):
        feed({7: one})
    with pytest.raises(UnknownKeyError, match=r"not float 0\.5"):
        feed({0.5: one})  # once truncated to value 0 by int()
    with pytest.raises(ExecutionError, match="%y is computed by the graph and cannot be"):
        feed({"y": one})


def test_close_names_and_long_input_lists() -> None:
    b = opgraph.GraphBuilder()
    for i in range(30):
        b.input(("float64", ()), name=f"in{i}")
    b.input(("float64", ()), name="learning_rate")
    g = b.freeze()
    with pytest.raises(UnknownKeyError) as e:
        g.run({"learning_rat": 1.0})
    msg = str(e.value)
    assert "in0, in1" in msg and "(31 in all)" in msg and "did you mean 'learning_rate'?" in msg
    assert g.run({"%learning_rate": 1.0}, ["learning_rate"])[0] == 1.0  # the label dumps print is a name too


def test_unknown_targets_are_graph_errors_too() -> None:
    g = _graph("float64")
    with pytest.raises(UnknownKeyError, match="no value named 'yy'; did you mean 'y'"):
        g.run({"x": np.ones(3)}, ["yy"])
    with pytest.raises(UnknownKeyError, match="no value named 'q'"):
        opgraph.compile(g, backend=ENGINES[0] if ENGINES else "numpy")({"x": np.ones(3)}, ["q"])


def test_the_numpy_fast_path_does_not_check_exact_feeds() -> None:
    f = opgraph.compile(_graph("float32"))
    exact = np.ones(3, np.float32)
    f(x=exact)
    with mock.patch.object(numpy_backend, "coerce_feed", side_effect=AssertionError("fallback used")):
        np.testing.assert_array_equal(f(x=exact)[0], exact)  # exact dtype and shape: never converted
        with pytest.raises(AssertionError, match="fallback used"):
            f(x=np.ones(3))  # another dtype: the checked fallback
    with pytest.raises(FeedError):
        f(x=np.array([1e39, 0.0, 0.0]))


def test_python_scalars_follow_nep50() -> None:
    b = opgraph.GraphBuilder()
    i8 = b.input(("int8", ()), name="i8")
    f16 = b.input(("float16", ()), name="f16")
    b.output(b.op("copy", i8), b.op("copy", f16))
    f = opgraph.compile(b.freeze())
    for i, h in [(127, 65504), (-128, 1.5), (True, 2**20 - 2**20)]:
        got = f(i8=i, f16=h)
        assert got[0] == np.array(i, dtype=np.int8) and got[1] == np.array(h, dtype=np.float16)
    for bad in (128, -129, 1.0, 2**70, "1", 1j):
        with pytest.raises(FeedError, match="input %i8"):
            f(i8=bad, f16=0.0)
    for bad in (70000, 1e5, 1j, "1.0"):
        with pytest.raises(FeedError, match="input %f16"):
            f(i8=0, f16=bad)
    # NumPy scalars are strong, like arrays: np.float64 (a subclass of Python's float) is not weak
    for scalar in (np.int64(5), np.int64(300), np.float64(1.0), np.float32(2.5), np.float64(1e300), np.bool_(True)):
        for name, dt in (("i8", np.dtype("int8")), ("f16", np.dtype("float16"))):
            want = reference(np.asarray(scalar), dt)
            feeds = {"i8": 0, "f16": 0.0, name: scalar}
            if want is None:
                with pytest.raises(FeedError, match=f"input %{name} expects"):
                    f(feeds)
            else:
                assert f(feeds)[0 if name == "i8" else 1] == want
