"""Every code block in README.md and docs/*.md runs as written; the generated docs are current; every op has a
reference test.

The fence convention, for every Markdown file in README.md and docs/ (collected by glob, so a new doc is picked up
without touching this file; each block is one test, ``interop.md:block3`` being the third fenced block of
docs/interop.md counting every fence):

- ```python: a script, run as ``python -c BLOCK`` in a subprocess with cwd = the repository root; it must exit 0
  and write no file into the repository (use ``tempfile``). No ``>>>`` inside (that is a pycon block).
- ```pycon: a doctest session (``>>>`` / ``...`` lines and their expected output), checked with doctest
  (ELLIPSIS | NORMALIZE_WHITESPACE). The pycon blocks of one doc share one namespace, in order, as in
  ``doctest.testfile`` (a page reads as one session: the graph built in its first block is used by the later
  ones); they run in one subprocess per doc with cwd = the repository root.
- ```console: a shell session. Lines starting with ``$ `` are commands (a trailing backslash continues one on the
  next line). All console commands of one doc run in order in one bash process (``cd``, variables and an
  activated venv carry over) with the directory of the running Python (``.venv/bin``) first on PATH, so
  ``opgraph`` is the project's command, in one temporary directory per doc prepared with copies of ``examples/``
  and ``tests/data/``, with ``out/mlp_step.cg`` (+ .cgc, .cgio, .cgs) and ``out/mlp_step.json`` (the
  training-step graph ``make demo`` saves) and with a ``.venv`` link to the running venv (so ``.venv/bin/opgraph``
  and ``. .venv/bin/activate`` work as in the repository). Other lines are expected output and are not compared,
  except that a command whose expected output starts with ``opgraph: error:`` must exit non-zero and print that
  line (compared up to an ellipsis ``...``); every other command must exit 0.
- ```sh: set-up commands (``make demo``, ``make test``, ``pip install``, ``git clone``, activating the venv),
  not run; a ```sh block may hold nothing else.
- ```text, ```json, ```dot, ...: not code, not run. An opening fence without a language is an error.

A doc with runnable blocks says near its top, in one line starting with "Needs", what they need to run; when they
use an optional package (directly, or through the opgraph module or backend that needs it) the line names an extra
of pyproject.toml that contains the package, e.g.
"Needs the `interop` extra: `.venv/bin/pip install -e '.[interop]'` (`make test` installs it)".
"""

from __future__ import annotations

import doctest
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from opgraph.core.registry import all_ops

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest depends on tomli before 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent  # not resolved: the venv's bin, where `opgraph` is installed
TIMEOUT = 180
RUN = ("python", "pycon", "console")
SETUP = re.compile(r"(make|(\S*/)?pip3? install|(\S*/)?python3? -m (pip install|venv)|git clone|cd|\.|source"
                   r"|(sudo )?apt(-get)? install)(\s|$)")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    doc: str  # "README.md" or the name in docs/
    index: int  # 1-based, counting every fenced block of the doc
    line: int  # 1-based line of the opening fence
    lang: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.doc}:block{self.index}"


def doc_name(path: Path) -> str:
    """The name blocks are reported under: ``README.md`` or the file name in docs/."""
    return path.name


def parse_blocks(text: str, doc: str) -> list[Block]:
    """The fenced blocks of a Markdown text, with their languages (CommonMark fences, possibly indented).

    >>> [(b.lang, b.text) for b in parse_blocks("a\\n```python\\nx = 1\\n```\\n  ~~~\\n  y\\n  ~~~\\n", "d.md")]
    [('python', 'x = 1\\n'), ('', 'y\\n')]
    """
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None or (m["fence"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        indent, fence, lang = len(m["indent"]), m["fence"], (m["info"].split() or [""])[0]
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            c = FENCE.match(lines[j])
            if c and c["fence"][0] == fence[0] and len(c["fence"]) >= len(fence) and not c["info"].strip():
                break
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j].lstrip())
            j += 1
        blocks.append(Block(doc, len(blocks) + 1, i + 1, lang, "".join(s + "\n" for s in body)))
        i = j + 1
    return blocks


BLOCKS = {doc_name(p): parse_blocks(p.read_text(), doc_name(p)) for p in DOCS}
ALL = [b for bs in BLOCKS.values() for b in bs]


def _params(langs: tuple[str, ...]) -> list[Any]:
    return [pytest.param(b, id=b.id) for b in ALL if b.lang in langs]


# ----------------------------------------------------------------------------- shared per-doc runs
def _shared_result(tmp_path_factory: pytest.TempPathFactory, key: str, compute: Any) -> Any:
    """``compute()`` once per test session, also under pytest-xdist: the workers share the result through a file
    in the session's base temporary directory, under a lock, so a doc's session runs once even when its blocks'
    tests land on different workers."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    cache = base / "doc-runs"
    cache.mkdir(exist_ok=True)
    result = cache / f"{key}.json"
    with open(cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            result.write_text(json.dumps(compute()))
        return json.loads(result.read_text())


PYCON_RUNNER = r"""
import doctest, json, sys
blocks = json.load(sys.stdin)
parser = doctest.DocTestParser()
flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
globs = {"__name__": "__main__"}
results = {}
for b in blocks:
    test = parser.get_doctest(b["text"], globs, b["id"], b["doc"], b["line"])
    runner = doctest.DocTestRunner(optionflags=flags)
    report = []
    failed, attempted = runner.run(test, out=report.append, clear_globs=False)
    globs = test.globs  # a DocTest works on a copy: carry its names to the next block
    results[b["id"]] = {"failed": failed, "attempted": attempted, "report": "".join(report)}
sys.stdout.flush()
sys.__stdout__.write("\n@@RESULTS@@" + json.dumps(results))
"""


def _run_pycon(doc: str) -> dict[str, Any]:
    blocks = [{"id": b.id, "doc": b.doc, "line": b.line, "text": b.text} for b in BLOCKS[doc] if b.lang == "pycon"]
    proc = subprocess.run([sys.executable, "-c", PYCON_RUNNER], input=json.dumps(blocks), capture_output=True,
                          text=True, cwd=ROOT, timeout=TIMEOUT * 3)
    if "@@RESULTS@@" not in proc.stdout:
        return {b["id"]: {"failed": 1, "attempted": 0, "report": proc.stdout + proc.stderr} for b in blocks}
    return json.loads(proc.stdout.rsplit("@@RESULTS@@", 1)[1])


def _demo_outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``out/mlp_step.*`` as ``make demo`` writes them, built from the demo's own step-graph function (the
    training itself is not needed)."""
    out = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        out = out.parent
    out = out / "demo-out"

    def build() -> str:
        code = ("import sys; sys.path.insert(0, 'examples'); import demo, opgraph.io\n"
                "g = demo.build_step(64).graph\n"
                f"opgraph.io.save(g, {str(out / 'mlp_step.cg')!r}); opgraph.io.save(g, {str(out / 'mlp_step.json')!r})")
        out.mkdir(exist_ok=True)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stderr
        return str(out)

    return Path(_shared_result(tmp_path_factory, "demo-out", build))


def console_commands(text: str) -> list[tuple[str, list[str]]]:
    """The ``$ `` commands of a console block with their expected output lines.

    >>> console_commands("$ opgraph info \\\\\\n    m.cg\\nops: 3\\n$ opgraph x\\nopgraph: error: no\\n")
    [('opgraph info \\\\\\n    m.cg', ['ops: 3']), ('opgraph x', ['opgraph: error: no'])]
    """
    commands: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            cmd = [lines[i][2:]]
            while cmd[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd.append(lines[i])
            commands.append(("\n".join(cmd), []))
        elif commands:
            commands[-1][1].append(lines[i])
        i += 1
    return commands


def _problem(cmd: str, expected: list[str], rc: int, output: str) -> str | None:
    """None if a command behaved as its doc says, else what went wrong."""
    got = f"$ {cmd}\n(exit {rc})\n{output}"
    if expected and expected[0].startswith("opgraph: error:"):
        want = expected[0].split("...")[0].rstrip()
        if rc == 0 or not any(line.startswith(want) for line in output.splitlines()):
            return f"expected a non-zero exit and a line starting {want!r}; got\n{got}"
        return None
    return None if rc == 0 else f"expected exit 0; got\n{got}"


def _run_console(doc: str, workdir: Path, demo_out: Path) -> dict[str, list[str]]:
    """Run the doc's console commands in order in one bash process (so ``cd``, variables and an activated venv
    carry over, as in a terminal), each one's output and exit status going to files beside the work directory."""
    shutil.copytree(ROOT / "examples", workdir / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests" / "data", workdir / "tests" / "data")
    shutil.copytree(demo_out, workdir / "out")
    (workdir / ".venv").symlink_to(BIN.parent)  # `.venv/bin/opgraph` and `. .venv/bin/activate` as in the repo
    logs = workdir.parent / f"{workdir.name}-logs"
    logs.mkdir()
    commands = [(b, cmd, want) for b in BLOCKS[doc] if b.lang == "console" for cmd, want in console_commands(b.text)]
    script = [f"cd {shlex.quote(str(workdir))}"]
    for i, (_, cmd, _) in enumerate(commands):
        script += ["{", cmd, f"}} >{logs}/{i}.out 2>&1 </dev/null", f"echo $? >{logs}/{i}.rc"]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run(["bash", "-c", "\n".join(script)], cwd=workdir, env=env, timeout=TIMEOUT * 4, check=False)
    results: dict[str, list[str]] = {b.id: [] for b in BLOCKS[doc] if b.lang == "console"}
    for i, (b, cmd, want) in enumerate(commands):
        rc = logs / f"{i}.rc"
        if not rc.exists():
            results[b.id].append(f"$ {cmd}\nnever finished (did an earlier command exit the shell?)")
        elif (e := _problem(cmd, want, int(rc.read_text()), (logs / f"{i}.out").read_text())) is not None:
            results[b.id].append(e)
    return results


# ----------------------------------------------------------------------------- the tests of the blocks
@pytest.mark.parametrize("block", _params(("python",)))
def test_python_block_runs(block: Block) -> None:
    assert ">>>" not in block.text, "a doctest session goes in a pycon fence"
    before = set(os.listdir(ROOT))
    proc = subprocess.run([sys.executable, "-c", block.text], capture_output=True, text=True, cwd=ROOT,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, f"{block.doc} line {block.line}:\n{proc.stderr}"
    # Only names the block mentions: other tests may be writing beside it under pytest-xdist.
    litter = sorted(n for n in set(os.listdir(ROOT)) - before if n in block.text)
    assert not litter, f"{block.doc} line {block.line} wrote {litter} into the repository; write to a tempfile dir"


@pytest.mark.parametrize("block", _params(("pycon",)))
def test_pycon_block_passes(block: Block, tmp_path_factory: pytest.TempPathFactory) -> None:
    results = _shared_result(tmp_path_factory, f"pycon-{block.doc}", lambda: _run_pycon(block.doc))
    r = results[block.id]
    assert r["attempted"] > 0, f"{block.doc} line {block.line}: no examples\n{r['report']}"
    assert r["failed"] == 0, f"{block.doc} line {block.line}:\n{r['report']}"


@pytest.mark.parametrize("block", _params(("console",)))
def test_console_block_runs(block: Block, tmp_path_factory: pytest.TempPathFactory) -> None:
    assert console_commands(block.text), "a console block has `$ ` commands"
    demo_out = _demo_outputs(tmp_path_factory)

    def run() -> dict[str, list[str]]:
        return _run_console(block.doc, tmp_path_factory.mktemp(f"console-{Path(block.doc).stem}"), demo_out)

    problems = _shared_result(tmp_path_factory, f"console-{block.doc}", run)[block.id]
    assert not problems, f"{block.doc} line {block.line}:\n" + "\n".join(problems)


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in ALL if b.lang == "sh"])
def test_sh_block_is_only_setup(block: Block) -> None:
    for line in block.text.splitlines():
        cmd = line.removeprefix("$ ").split("#")[0].strip()
        assert not cmd or SETUP.match(cmd), f"{block.doc} line {block.line}: {cmd!r} is not a set-up command; " \
                                            "examples go in a console block"


@pytest.mark.parametrize("doc", list(BLOCKS))
def test_every_fence_has_a_language(doc: str) -> None:
    bare = [b.line for b in BLOCKS[doc] if not b.lang]
    assert not bare, f"{doc}: opening fences without a language on lines {bare}"


# ----------------------------------------------------------------------------- links and doc names resolve
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOC_PATH = re.compile(r"\bdocs/[\w.-]+\.(?:md|json)\b")


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown text's headings (outside fenced blocks).

    >>> sorted(heading_anchors("# The optimiser (`opgraph.passes`)\\n```text\\n# not a heading\\n```\\n## Training\\n"))
    ['the-optimiser-opgraphpasses', 'training']
    """
    fenced = {i for b in parse_blocks(text, "") for i in range(b.line - 1, b.line + b.text.count("\n") + 1)}
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for i, line in enumerate(text.splitlines()) if line.startswith("#") and i not in fenced}


@pytest.mark.parametrize("path", DOCS, ids=doc_name)
def test_relative_links_resolve(path: Path) -> None:
    # a renamed doc (optimizer.md -> passes.md) must take every link to it along, anchors included
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z][\w+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file) if file else path
        if not dest.exists():
            broken.append(f"{target} (no file {dest.relative_to(ROOT)})")
        elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest.read_text()):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{path.name} links to what does not exist: {broken}"


def test_docs_named_in_code_exist() -> None:
    # docstrings, comments and tools name docs by path ("measured in docs/passes.md"): those files must exist
    sources = [p for d in ("src", "tests", "tools", "bench", "examples") for p in (ROOT / d).rglob("*.py")]
    missing = sorted({f"{p.relative_to(ROOT)}: {m}" for p in [*sources, ROOT / "Makefile", ROOT / "pyproject.toml"]
                      for m in DOC_PATH.findall(p.read_text()) if not (ROOT / m).exists()})
    assert not missing, f"these name docs that do not exist: {missing}"


# ----------------------------------------------------------------------------- each doc names its extra
OPTIONAL = {"networkx": "networkx", "dask": "dask", "distributed": "distributed", "onnx": "onnx",
            "onnxruntime": "onnxruntime", "pytensor": "pytensor", "jax": "jax", "torch": "torch", "scipy": "scipy",
            "graphviz": "graphviz", "sklearn": "scikit-learn"}
# opgraph modules and engines that import an optional package on use
INDIRECT = {r"opgraph\.io\.nx\b": "networkx", r"opgraph\.io\.dask\b": "dask", r"opgraph\.io\.pytensor\b": "pytensor",
            r"opgraph\.io\.onnx\b": "onnx", r"""backend=["']jax["']""": "jax", r"""backend=["']torch["']""": "torch",
            r"""backend=["']onnxruntime["']""": "onnxruntime"}
IMPORT = re.compile(r"^\s*(?:>>> |\.\.\. )?\s*(?:import\s+([\w., ]+)|from\s+([\w.]+)\s+import)", re.M)


def optional_packages(blocks: list[Block]) -> set[str]:
    """The optional distributions that runnable blocks import, directly or through opgraph.

    >>> sorted(optional_packages([Block("d", 1, 1, "pycon", ">>> import numpy, networkx as nx\\n"),
    ...                           Block("d", 2, 5, "python", "from sklearn.datasets import x\\n")]))
    ['networkx', 'scikit-learn']
    """
    found: set[str] = set()
    for b in blocks:
        if b.lang not in ("python", "pycon"):
            continue
        for names, frm in IMPORT.findall(b.text):
            for name in (names.split(",") if names else [frm]):
                top = name.strip().split(" ")[0].split(".")[0]
                if top in OPTIONAL:
                    found.add(OPTIONAL[top])
        found.update(pkg for pattern, pkg in INDIRECT.items() if re.search(pattern, b.text))
    return found


def extras() -> dict[str, set[str]]:
    """pyproject.toml's extras and the distributions each installs."""
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {name: {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs} for name, reqs in spec.items()}


def needs_line(path: Path) -> str | None:
    """The doc's "Needs ..." line: at its top, i.e. before its first runnable block (or in its first 40 lines)."""
    runnable = [b.line for b in BLOCKS[doc_name(path)] if b.lang in RUN]
    head = path.read_text().splitlines()[:min(runnable, default=41) - 1]
    return next((line for line in head if line.startswith("Needs ")), None)


@pytest.mark.parametrize("path", DOCS, ids=doc_name)
def test_doc_names_the_extra_it_needs(path: Path) -> None:
    blocks = BLOCKS[doc_name(path)]
    needed = optional_packages(blocks)
    line = needs_line(path)
    if line is None:
        assert not any(b.lang in RUN for b in blocks), \
            f"{path.name} has examples: say at its top which extra they need (Needs ...), {sorted(needed) or 'none'}"
        return
    if not needed:
        return
    known = extras()
    named = [w for w in re.findall(r"`([\w-]+)`", line) if w in known]
    assert named, f"{path.name}: {line!r} names no extra of pyproject.toml ({sorted(known)})"
    missing = needed - set().union(*(known[n] for n in named))
    assert not missing, f"{path.name}: {missing} are in none of the extras {named} that {line!r} names"


def test_the_harness_sees_every_kind_of_block() -> None:
    langs = {b.lang for b in ALL}
    assert {"python", "pycon", "console", "sh"} <= langs
    assert len(DOCS) > 10 and sum(b.lang in RUN for b in ALL) > 40


def test_parser_checks_doctest_output() -> None:
    # The pycon harness must fail a session whose output differs, not only one that raises.
    test = doctest.DocTestParser().get_doctest(">>> 1 + 1\n3\n", {}, "t", "t", 0)
    assert doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test, out=lambda s: None).failed == 1


# ----------------------------------------------------------------------------- README, generated docs, op tests
def test_readme_starts_with_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text()[:600]
    assert "make demo" in head and "make test" in head


def test_readme_says_how_to_run_the_command() -> None:
    text = (ROOT / "README.md").read_text()
    assert ".venv/bin/opgraph" in text and ". .venv/bin/activate" in text


def test_ops_table_is_current() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_ops_doc.py"), "--check"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr


FAMILY_TESTS = {"elementwise": "test_ops_elementwise.py", "reduction": "test_ops_reduction.py",
                "contraction": "test_ops_contraction.py", "shape": "test_ops_shape.py", "nn": "test_ops_nn.py",
                "linalg": "test_ops_linalg.py", "tenscalc": "test_ops_tenscalc.py",
                "fused": "test_ops_fused.py", "indexing": "test_ops_indexing.py",
                "signal": "test_ops_signal.py", "control": "test_ops_control.py"}


@pytest.mark.parametrize("opdef", [d for d in all_ops() if d.family in FAMILY_TESTS], ids=lambda d: d.name)
def test_every_op_is_named_in_its_family_tests(opdef) -> None:  # type: ignore[no-untyped-def]
    # A new op must come with tests in its family's file; this catches one added without.
    text = (ROOT / "tests" / FAMILY_TESTS[opdef.family]).read_text()
    assert f'"{opdef.name}"' in text, f"{opdef.name} is not mentioned in {FAMILY_TESTS[opdef.family]}"


def test_every_family_has_a_test_file() -> None:
    families = {d.family for d in all_ops()} - {"core", "user"}
    assert families <= set(FAMILY_TESTS)
