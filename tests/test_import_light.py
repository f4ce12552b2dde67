"""`import opgraph` is light: it loads the core IR, and op families, passes, autodiff, formats, ... on first use.

Every check that depends on what is imported runs in a fresh interpreter, since this test process has already
imported most of opgraph. Timings are in bench/import_cost.py, not here.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opgraph
import opgraph.ops
from opgraph.core.registry import all_ops
from opgraph.ops._index import BUILTIN_OPS, render

ROOT = Path(__file__).resolve().parents[1]

# What `import opgraph` may load of opgraph itself: the core IR, the table of op kinds and the lazy-array class
# (whose __array_namespace__ hook it fills).
ALLOWED = {"opgraph", "opgraph._version", "opgraph.errors", "opgraph.ops", "opgraph.ops._index", "opgraph.frontend",
           "opgraph.frontend.lazy"}
HEAVY = ["scipy", "rich", "networkx", "onnx", "onnxruntime", "jax", "torch", "dask", "graphviz", "ml_dtypes",
         "numba", "opt_einsum", "optree", "pytensor", "hashlib", "subprocess"]


def _python(code: str, *args: str) -> str:
    """Run ``code`` in a fresh interpreter and return its stdout (failing the test on an error)."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _modules_after(code: str) -> set[str]:
    return set(json.loads(_python(f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))")))


def test_import_opgraph_loads_only_the_core() -> None:
    loaded = _modules_after("import opgraph")
    ours = {m for m in loaded if m.split(".")[0] == "opgraph"}
    assert ours - ALLOWED - {m for m in ours if m.startswith("opgraph.core")} == set()
    assert {"opgraph.numpy", "opgraph.frontend.api", "opgraph.ops.nn", "opgraph.ops.elementwise", "opgraph.passes",
            "opgraph.autodiff", "opgraph.io", "opgraph.runtime", "opgraph.backends", "opgraph.viz"} & loaded == set()
    assert {m.split(".")[0] for m in loaded} & set(HEAVY) == set()


def test_import_opgraph_core_alone_finds_the_built_in_ops() -> None:
    # Python runs opgraph/__init__.py first, which announces the families to the registry.
    out = _python("from opgraph.core.registry import get_op; import sys\n"
                  "before = 'opgraph.ops.nn' in sys.modules\n"
                  "print(before, get_op('relu').family, get_op(get_op('matmul').id).name,\n"
                  "      'opgraph.ops.nn' in sys.modules)")
    assert out.split() == ["False", "nn", "matmul", "True"]


def test_every_public_name_resolves_to_its_definition() -> None:
    out = _python("import opgraph, json\n"
                  "print(json.dumps({n: [getattr(opgraph, n).__module__, getattr(opgraph, n).__name__]\n"
                  "                  for n in opgraph.__all__ if hasattr(getattr(opgraph, n), '__name__')}))\n"
                  "from opgraph import *\n"
                  "assert set(opgraph.__all__) <= set(dir(opgraph)) and 'numpy' in dir(opgraph)\n")
    got = json.loads(out)
    for name in opgraph.__all__:
        obj = getattr(opgraph, name)
        if hasattr(obj, "__name__"):
            assert got[name] == [obj.__module__, obj.__name__], name
    assert opgraph.compile is sys.modules["opgraph.runtime.compiled"].compile
    assert opgraph.optimize is sys.modules["opgraph.passes"].optimize
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        _ = opgraph.nonexistent


@pytest.mark.parametrize("name", ["numpy", "nn", "optim", "io", "passes", "autodiff", "backends", "cli", "viz"])
def test_submodules_load_on_first_attribute_access(name: str) -> None:
    out = _python(f"import opgraph, sys; m = opgraph.{name}; print(m.__name__, m is sys.modules['opgraph.{name}'])")
    assert out.split() == [f"opgraph.{name}", "True"]


def test_hooks_and_array_namespace_work_without_importing_their_layers() -> None:
    # Graph.run, build_grad_ops and LazyArray.__array_namespace__ import the runtime, autodiff and opgraph.numpy
    # when first used; once imported, the namespace is the module `import opgraph.numpy` gives.
    out = _python(
        "import numpy as np, opgraph, sys\n"
        "b = opgraph.GraphBuilder(); x = b.input(('float64', (3,)), name='x'); y = b.sum(b.square(x))\n"
        "(g,) = b.build_grad_ops(y, [x]); b.output(y, g)\n"
        "assert 'opgraph.runtime' not in sys.modules\n"
        "print(*[v.tolist() for v in b.freeze().run({'x': np.array([1.0, 2.0, 3.0])})])\n"
        "from opgraph.frontend.lazy import placeholder\n"
        "ns = placeholder((2,)).__array_namespace__()\n"
        "assert 'opgraph.numpy' not in sys.modules\n"
        "mean = ns.mean\n"
        "import opgraph.numpy as onp\n"
        "print(mean is onp.mean, placeholder((2,)).__array_namespace__() is onp)")
    lines = out.splitlines()
    x = np.array([1.0, 2.0, 3.0])
    assert json.loads(lines[0].split(" ", 1)[0]) == float(np.sum(x * x))
    np.testing.assert_allclose(json.loads(lines[0].split(" ", 1)[1]), 2 * x)
    assert lines[1] == "True True"


def test_numpy_dispatch_attaches_itself_on_first_use() -> None:
    # lazy sits below the namespace: its NEP 13/18 stand-ins import opgraph.frontend.array_methods on first use,
    # which puts the real methods on the class.
    out = _python(
        "import sys, numpy as np, opgraph\n"
        "from opgraph.frontend.lazy import LazyArray, constant\n"
        "before = 'opgraph.frontend.api' in sys.modules\n"
        "x = constant(np.array([[0.0, 1.0], [2.0, 3.0]]))\n"
        "print(before, np.tanh(x).eval().tolist()[0], np.sum(x, axis=0).eval().tolist(),\n"
        "      LazyArray.__array_ufunc__.__module__, LazyArray.__array_function__.__module__)")
    assert out.split() == ["False", "[0.0,", f"{float(np.tanh(1.0))!r}]", "[2.0,", "4.0]",
                           "opgraph.frontend.array_methods", "opgraph.frontend.array_methods"]


def test_static_op_table_matches_the_registry() -> None:
    # The table names every built-in kind with its id and module, as the families register them.
    table = {name: (op_id, module) for module, ops in BUILTIN_OPS.items() for name, op_id in ops.items()}
    built_in = {d.name: (d.id, f"opgraph.ops.{d.family}") for d in all_ops() if d.family not in ("core", "user")}
    assert table == built_in, "op table out of date; opgraph.ops._index.render() gives it:\n" + render()
    # Every module of opgraph.ops that registers kinds is in the table: importing them all adds none that
    # all_ops() (which imports the table's modules) did not already have.
    before = {d.id for d in all_ops()}
    for info in pkgutil.iter_modules(opgraph.ops.__path__, "opgraph.ops."):
        __import__(info.name)
    assert {d.id for d in all_ops()} == before


@pytest.mark.parametrize("module", list(BUILTIN_OPS))
def test_each_family_alone_registers_what_the_table_says(module: str) -> None:
    # What get_op relies on: importing a kind's module, with nothing else imported first, registers that kind.
    out = _python("import importlib, json, sys, opgraph\nfrom opgraph.core import registry\n"
                  "importlib.import_module(sys.argv[1])\n"
                  "print(json.dumps({d.name: d.id for d in registry._BY_ID.values()}))", module)
    registered = json.loads(out)
    assert {name: registered.get(name) for name in BUILTIN_OPS[module]} == BUILTIN_OPS[module]


def test_runtime_registered_kinds_clash_with_unloaded_families_as_before() -> None:
    # A user kind that takes a built-in name or id is refused even when that family has not been imported yet.
    out = _python(
        "import sys, opgraph\nfrom opgraph import OpDef, register_op\n"
        "def infer(t, a): return t\n"
        "for name, op_id in (('relu', 50101), ('my_relu', 800)):\n"
        "    try:\n"
        "        register_op(OpDef(name=name, id=op_id, arity=1, infer=infer))\n"
        "    except ValueError as exc:\n"
        "        print(exc)\n"
        "d = register_op(OpDef(name='my_cube', id=50102, arity=1, infer=infer, elementwise=True,\n"
        "                      kernel=lambda x, out=None: x ** 3))\n"
        "b = opgraph.GraphBuilder(); x = b.input(('float64', (2,)), name='x'); b.output(b.my_cube(x))\n"
        "print(b.freeze().run({'x': [2.0, 3.0]})[0].tolist())")
    lines = out.splitlines()
    assert "clashes with registered op 'relu' (id 800)" in lines[0]
    assert "clashes with registered op 'relu' (id 800)" in lines[1]
    assert json.loads(lines[2]) == [8.0, 27.0]


@pytest.mark.parametrize("suffix", [".cg", ".json"])
def test_graph_with_a_family_not_yet_loaded_saves_and_loads_in_a_fresh_process(tmp_path: Path, suffix: str) -> None:
    path = str(tmp_path / f"model{suffix}")
    # Built and saved in a process that imports only opgraph (and opgraph.io): relu is nn's, cumsum reduction's.
    _python("import sys, opgraph, opgraph.io\nassert 'opgraph.ops.nn' not in sys.modules\n"
            "b = opgraph.GraphBuilder(); x = b.input(('float64', (5,)), name='x')\n"
            "b.output(b.cumsum(b.relu(x), axis=0))\nopgraph.io.save(b.freeze(), sys.argv[1])", path)
    x = np.array([-2.0, 1.5, -0.5, 3.0, 0.25])
    out = _python("import json, sys, opgraph\nbefore = 'opgraph.ops.nn' in sys.modules\n"
                  "import opgraph.io\ng = opgraph.io.load(sys.argv[1])\n"
                  "print(before, 'opgraph.ops.nn' in sys.modules, 'opgraph.ops.tenscalc' in sys.modules,\n"
                  "      *sorted(g.kind_of(i) for i in range(g.num_ops)))\n"
                  "print(json.dumps(g.run({'x': json.loads(sys.argv[2])})[0].tolist()))", path, json.dumps(x.tolist()))
    lines = out.splitlines()
    # Loading imported the families of the kinds in the file (by id in .cg, by name in JSON), not every family.
    assert lines[0].split() == ["False", "True", "False", "cumsum", "relu"]
    np.testing.assert_allclose(json.loads(lines[1]), np.cumsum(np.maximum(x, 0.0)))
