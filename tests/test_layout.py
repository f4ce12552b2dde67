"""The op x engine matrix as DESIGN.md lays it out on disk, kept true.

* every rule of every engine (and of the ONNX exporter) stands in the engine's module named after its op's
  family (``backends/torch/elementwise.py`` holds torch's ``logaddexp``), registered with the one idiom
  (:class:`opgraph.core.ruletable.RuleTable`), which records where each rule was registered;
* no module defines a rule decorator or a rule dict of its own;
* no package imports another package's private names;
* ``opgraph.compile`` returns one program type on every engine, with one surface.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import opgraph
from opgraph import backends
from opgraph.core.registry import get_op
from opgraph.core.ruletable import RuleTable
from opgraph.runtime.compiled import Program, ProgramContext

SRC = Path(opgraph.__file__).resolve().parent
ENGINES = ["numpy", "jax", "torch", "dask", "numba"]


def _installed(name: str) -> bool:
    return name in backends.available()


def _misplaced(table: RuleTable, package: str) -> dict[str, str | None]:
    """Kind -> the module that registered its rule, for every rule not in ``package.<family of the op>``."""
    return {kind: table.rule_module(kind) for kind in table.rules
            if table.rule_module(kind) != f"{package}.{get_op(kind).family}"}


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_rule_stands_in_the_module_named_after_its_family(engine: str) -> None:
    if not _installed(engine):
        pytest.skip(f"the {engine} engine is an optional extra; make test installs it")
    be = backends.get(engine)
    assert be.rules, f"{engine} registers no rule"
    assert _misplaced(be, f"opgraph.backends.{engine}") == {}


def test_every_onnx_export_rule_stands_in_the_module_named_after_its_family() -> None:
    pytest.importorskip("onnx", reason="the ONNX exporter is an optional extra; make test installs it")
    from opgraph.io.onnx.export import BODY_EXPORT, EXPORT

    assert _misplaced(EXPORT, "opgraph.io.onnx.export") == {}
    assert _misplaced(BODY_EXPORT, "opgraph.io.onnx.export") == {}
    # ONNX Runtime runs what the exporter writes: its rule table is the exporter's
    assert backends.get("onnxruntime").kinds() == frozenset(EXPORT.rules)


def test_the_c_engine_runs_the_numba_engines_rules() -> None:
    # one instruction set, two engines: the C engine's rule table is the numba engine's (same family modules)
    pytest.importorskip("numba", reason="the numba engine is an optional extra; make test installs it")
    if not _installed("c"):
        pytest.skip("no C compiler on PATH")
    assert backends.get("c").rules is backends.get("numba").rules
    assert _misplaced(backends.get("c"), "opgraph.backends.numba") == {}


def test_engine_packages_mirror_the_op_families() -> None:
    families = {p.stem for p in (SRC / "ops").glob("*.py") if not p.stem.startswith("_")}
    for package in ("backends/numpy", "backends/jax", "backends/torch", "backends/dask", "backends/numba",
                    "io/onnx/export"):
        modules = {p.stem for p in (SRC / package).glob("*.py")}
        assert "__init__" in modules, package
        assert modules & families, f"{package} has no family module"
        # every module is a family or one of the engine's own helpers, never a second home for rules
        for stem in modules - families - {"__init__"}:
            table = _table_of(package)
            if table is not None:
                assert not any(table.rule_module(k) == f"opgraph.{package.replace('/', '.')}.{stem}"
                               for k in table.rules), f"{package}/{stem}.py registers rules but is no op family"


def _table_of(package: str) -> RuleTable | None:
    name = package.split("/")[-1]
    if package.startswith("io/"):
        return importlib.import_module("opgraph.io.onnx.export").EXPORT if importlib.util.find_spec("onnx") else None
    return backends.get(name) if _installed(name) else None


def _python_files() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_module_defines_a_rule_decorator_or_a_rule_dict_of_its_own() -> None:
    offenders = []
    for path in _python_files():
        if path == SRC / "core" / "ruletable.py":
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in ("rule", "exports", "register_rule"):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} def {node.name}")
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                name = t.id if isinstance(t, ast.Name) else \
                    t.value.id if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) else ""
                if name in ("RULES", "LIMITS", "BODY_RULES") and not _is_alias_of_a_table(node):
                    offenders.append(f"{path.relative_to(SRC)}:{node.lineno} {name}")
    assert offenders == []


def _is_alias_of_a_table(node: ast.stmt) -> bool:
    """``RULES = EXPORT.rules``: a name for a RuleTable's dict, kept for readers, is no second table."""
    value = getattr(node, "value", None)
    return isinstance(value, ast.Attribute) and value.attr in ("rules", "limits")


def _package_of(path: Path) -> str | None:
    parts = path.relative_to(SRC).parts
    return parts[0] if len(parts) > 1 else None


def test_no_package_imports_another_packages_private_names() -> None:
    found = []
    for path in _python_files():
        home = _package_of(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opgraph.")):
                continue
            parts = node.module.split(".")[1:]
            if parts[0] == home or parts[0] == "_version":  # within a package; the version string
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if private or any(p.startswith("_") for p in parts):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: from {node.module} import "
                             f"{', '.join(a.name for a in node.names)}")
    assert found == []


def _graph() -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    s = b.input(("float64", (3,)), name="s")
    y = b.op("tanh", b.op("multiply", x, 2.0))
    b.output(b.op("sum", y))
    b.update(b.op("add", s, y), s)
    return b.freeze()


@pytest.mark.parametrize("engine", [*ENGINES, "onnxruntime"])
def test_compile_returns_one_program_type_with_one_surface_on_every_engine(engine: str) -> None:
    if not _installed(engine):
        pytest.skip(f"the {engine} engine is an optional extra; make test installs it")
    g = _graph()
    x = np.array([0.0, 0.5, 1.0])
    f = opgraph.compile(g, backend=engine)
    assert type(f) is Program
    assert f.compile_seconds > 0 and isinstance(f.explain(), str) and engine in f.explain()
    want = np.tanh(2 * x)
    np.testing.assert_allclose(f(x=x, s=np.zeros(3))[0], want.sum(), rtol=1e-12)
    np.testing.assert_allclose(f(x=x)[0], want.sum(), rtol=1e-12)  # s comes from the update edge
    np.testing.assert_allclose(f.state("s"), 2 * want, rtol=1e-12)
    assert (f.memory_plan is not None) == (engine == "numpy")  # only the arena plans memory
    ctx = f.context()
    assert isinstance(ctx, ProgramContext)
    ctx.set("x", x)
    ctx.set("s", np.zeros(3))
    np.testing.assert_allclose(ctx.get(g.outputs[0]), want.sum(), rtol=1e-12)
    calls = ctx.kernel_calls
    ctx.get(g.outputs[0])  # nothing changed: nothing runs
    assert ctx.kernel_calls == calls > 0


def test_a_numpy_program_is_one_region_reached_directly() -> None:
    g = _graph()
    f = opgraph.compile(g)
    assert f.arena_runtime is not None and f.code is not None and "def _program" in f.code
    assert f.placement() == [(op, g.kind_of(op), "numpy", "in its capability set")
                             for op in range(g.num_ops) if g.kind_of(op) != "const"]
