"""The README's, docs/backends.md's, docs/numpy-engine.md's and docs/errors.md's snippets run as written; the
generated docs are current; every op has a reference test."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from opgraph.core.registry import all_ops

ROOT = Path(__file__).resolve().parent.parent
README_BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
README_BLOCKS += re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "backends.md").read_text(), re.S)
README_BLOCKS += re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "numpy-engine.md").read_text(), re.S)
README_BLOCKS += re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "errors.md").read_text(), re.S)


@pytest.mark.parametrize("block", README_BLOCKS, ids=[f"block{i}" for i in range(len(README_BLOCKS))])
def test_readme_snippet_runs(block: str) -> None:
    proc = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_readme_starts_with_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text()[:600]
    assert "make demo" in head and "make test" in head


def test_ops_table_is_current() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_ops_doc.py"), "--check"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr


FAMILY_TESTS = {"elementwise": "test_ops_elementwise.py", "reduction": "test_ops_reduction.py",
                "contraction": "test_ops_contraction.py", "shape": "test_ops_shape.py", "nn": "test_ops_nn.py",
                "linalg": "test_ops_linalg.py", "tenscalc": "test_ops_tenscalc.py",
                "fused": "test_ops_fused.py", "indexing": "test_ops_indexing.py",
                "signal": "test_ops_signal.py"}


@pytest.mark.parametrize("opdef", [d for d in all_ops() if d.family in FAMILY_TESTS], ids=lambda d: d.name)
def test_every_op_is_named_in_its_family_tests(opdef) -> None:  # type: ignore[no-untyped-def]
    # A new op must come with tests in its family's file; this catches one added without.
    text = (ROOT / "tests" / FAMILY_TESTS[opdef.family]).read_text()
    assert f'"{opdef.name}"' in text, f"{opdef.name} is not mentioned in {FAMILY_TESTS[opdef.family]}"


def test_every_family_has_a_test_file() -> None:
    families = {d.family for d in all_ops()} - {"core", "user"}
    assert families <= set(FAMILY_TESTS)
