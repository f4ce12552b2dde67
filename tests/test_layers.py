"""Layering (DESIGN.md, "Layers"): the import-linter contracts hold, and core's hooks are filled by the layers above."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opgraph
from opgraph.core import hooks

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (so that nothing this test process imported counts)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_import_linter_contracts_are_kept() -> None:
    pytest.importorskip("importlinter", reason="import-linter is in the 'test' extra")
    # lint-imports reads [tool.importlinter] from pyproject.toml in the working directory; --no-cache writes nothing.
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    proc = subprocess.run([sys.executable, "-c", code, "--no-cache"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_import_opgraph_loads_no_optional_array_library() -> None:
    # jax, torch and onnxruntime are imported only where a backend or a format needs them, never by `import opgraph`.
    proc = _python("import opgraph, sys; loaded = {'jax', 'torch', 'onnxruntime'} & set(sys.modules); "
                   "assert not loaded, sorted(loaded)")
    assert proc.returncode == 0, proc.stderr


def test_built_in_ops_are_registered_after_import_opgraph() -> None:
    # core's registry only looks up: the op families register themselves when `import opgraph` imports opgraph.ops.
    proc = _python("import opgraph; from opgraph.core.registry import get_op; print(get_op('add').family)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "elementwise"


def test_import_opgraph_fills_every_hook() -> None:
    proc = _python("from opgraph.core import hooks; from opgraph.frontend.lazy import ARRAY_NAMESPACE; "
                   "print(hooks.RUN.is_set, hooks.GRAD.is_set, hooks.SVG.is_set, ARRAY_NAMESPACE.is_set)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True"] * 4


def _square_graph() -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2,)), name="x")
    b.output(b.square(x))
    return b.freeze()


def test_graph_run_without_the_runtime_says_what_to_import(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _square_graph()
    np.testing.assert_array_equal(g.run({"x": np.array([1.0, 2.0])})[0], [1.0, 4.0])
    monkeypatch.setattr(hooks.RUN, "_value", None)
    with pytest.raises(hooks.HookNotSetError, match=r"Graph\.run needs opgraph\.runtime"):
        g.run({"x": np.array([1.0, 2.0])})


def test_build_grad_ops_without_autodiff_says_what_to_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks.GRAD, "_value", None)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2,)), name="x")
    with pytest.raises(hooks.HookNotSetError, match=r"build_grad_ops needs opgraph\.autodiff"):
        b.build_grad_ops(b.sum(b.square(x)), [x])


def test_repr_svg_without_viz_falls_back_to_text(monkeypatch: pytest.MonkeyPatch) -> None:
    # Jupyter shows the text repr when _repr_svg_ returns None, as it does when Graphviz is missing.
    monkeypatch.setattr(hooks.SVG, "_value", None)
    assert _square_graph()._repr_svg_() is None
