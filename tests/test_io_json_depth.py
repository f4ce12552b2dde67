"""Deeply nested JSON: a FormatError or a correct load, never a RecursionError or a crash (issue 32).

Every place a value may sit in a document is nested from 100 to 10^6 levels deep and loaded
(as a str, as bytes and as a file) in a subprocess per recursion limit (1,000, 70,000 and
200,000: a C-stack overflow kills the process, so it must not be this one). What to expect is
worked out by a character-by-character reference scanner here, independent of opgraph's.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import opgraph
from opgraph.errors import FormatError
from opgraph.io.jsonfmt import MAX_DEPTH, decode_value, dumps_json, from_json_dict, load_json, loads_json, save_json
from opgraph.io.jsonfmt.encoding import short_repr
from opgraph.io.jsonfmt.tokenizer import Depth

ROOT = Path(__file__).resolve().parent.parent
DEPTHS = (100, MAX_DEPTH - 3, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 500, 990, 1000, 5000,
          10**5, 10**6)
LIMITS = (1000, 70_000, 200_000)


def reference_crossing(text: str, limit: int) -> int:
    """The character index of the first ``[``/``{`` outside strings that opens level ``limit + 1`` (-1: none)."""
    depth, i, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':  # a string: to its closing quote, escapes taken two characters at a time
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
                i = _PLAIN(text, i).end()
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return i
        elif ch in "]}":
            depth -= 1
        i += 1
    return -1


_PLAIN = re.compile(r'[^"\\]*').match


# ----------------------------------------------------------------------------- the depth gauge
def test_depth_gauge_matches_a_reference_scanner_on_random_json_cut_anywhere() -> None:
    rng = random.Random(32)

    def value(d: int) -> Any:
        r = rng.random()
        if d > 6 or r < 0.3:
            return rng.choice([0, 1.5, None, True, "a", '"[', "\\]{", "é[\"", ""])
        if r < 0.65:
            return [value(d + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(["k", "[", '"{', "\\"]) + str(i): value(d + 1) for i in range(rng.randint(0, 3))}

    for _ in range(3000):
        text = json.dumps(value(0), ensure_ascii=rng.random() < 0.5)
        data = text.encode()
        limit = rng.randint(0, 7)
        cuts = sorted(rng.sample(range(len(data) + 1), min(len(data) + 1, rng.randint(0, 5))))
        gauge, found, offset = Depth(limit), -1, 0
        for lo, hi in zip([0, *cuts], [*cuts, len(data)], strict=True):
            k = gauge.feed(data[lo:hi])
            if k >= 0:
                found = offset + k
                break
            offset += hi - lo
        expect = reference_crossing(text, limit)
        assert found == (len(text[:expect].encode()) if expect >= 0 else -1), (text, limit, cuts)


# ----------------------------------------------------------------------------- every place, every depth
_CHILD = textwrap.dedent('''
    import json, os, sys, tempfile
    sys.setrecursionlimit(int(sys.argv[1]))
    sys.path.insert(0, sys.argv[2])
    from test_io_json_depth import _cases
    cases = _cases()
    from opgraph.errors import FormatError
    from opgraph.io.jsonfmt import from_json_dict, load_json, loads_json
    out, tmp = [], tempfile.mkdtemp()
    for k, (place, depth, text) in enumerate(cases):
        path = os.path.join(tmp, f"{k}.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        for how in ("str", "bytes", "file"):
            try:
                g = (loads_json(text) if how == "str" else loads_json(text.encode()) if how == "bytes"
                     else load_json(path))
                got = ["loaded", repr(g.file_meta), [list(c.shape) for c in g.constants]]
            except FormatError as exc:
                got = ["FormatError", str(exc), None]
            except BaseException as exc:
                got = ["other", f"{type(exc).__name__}: {str(exc)[:300]}", None]
            out.append([place, depth, how, *got])
    # A document given as Python data, nested as deeply (built without recursion).
    for depth in (100, 254, 255, 1000, 10**5, 10**6):
        meta = 0
        for _ in range(depth):
            meta = [meta]
        doc = {"format": "opgraph", "version": 1, "file_meta": {"m": meta}}
        try:
            got = ["loaded", repr(from_json_dict(doc).file_meta)[:300], None]
        except FormatError as exc:
            got = ["FormatError", str(exc), None]
        except BaseException as exc:
            got = ["other", f"{type(exc).__name__}: {str(exc)[:300]}", None]
        out.append(["from_json_dict", depth, "dict", *got])
    print(json.dumps(out))
''')

_HEAD = '{"format": "opgraph", "version": 1, '
_X = '"inputs": [{"value": "%x", "type": {"dtype": "float64", "shape": [3]}}], '


def _nest(n: int, leaf: str = "0") -> str:
    return "[" * n + leaf + "]" * n


def _cases() -> list[tuple[str, int, str]]:
    """(place, depth, text) for every place a value may sit."""
    cases = []
    for n in DEPTHS:
        op = '{"op": "exp", "inputs": ["%x"], "outputs": [{"value": "%y"}]'
        cases += [
            ("top level", n, _nest(n)),
            ("top-level object", n, "{" * n + "}" * n if n < 2 else '{"a": ' * (n - 1) + "{}" + "}" * (n - 1)),
            ("file_meta", n, _HEAD + '"file_meta": {"m": ' + _nest(n) + "}}"),
            ("file_meta tagged list", n, _HEAD + '"file_meta": {"m": ' + '{"list": [' * (n // 2) + "0"
             + "]}" * (n // 2) + "}}"),
            ("op attribute", n, _HEAD + _X + '"ops": [' + op + ', "attrs": {"a": ' + _nest(n) + '}}], '
             '"outputs": ["%y"]}'),
            ("op name", n, _HEAD + _X + '"ops": [' + op + ', "name": ' + _nest(n, '"y"') + '}], "outputs": ["%y"]}'),
            ("op input refs", n, _HEAD + _X + '"ops": [{"op": "exp", "inputs": ' + _nest(n, '"%x"')
             + ', "outputs": [{"value": "%y"}]}], "outputs": ["%y"]}'),
            ("graph outputs", n, _HEAD + _X + '"outputs": ' + _nest(n, '"%x"') + "}"),
            ("constant data", n, _HEAD + '"constants": [{"dtype": "float64", "shape": ' + json.dumps([1] * min(n, 999))
             + ', "data": ' + _nest(n, "2.5") + "}]}"),
            ("brackets in a string", n, _HEAD + '"file_meta": {"m": "\\"' + "[{" * n + '"}}'),
            ("string after deep-looking text", n, _HEAD + '"file_meta": {"a": "' + "[" * n + '\\\\", "b": '
             + _nest(min(n, 200)) + "}}"),
        ]
    # A constant of rank 60 (as deep as a legitimate file gets), and bracket text across a 1 MiB window.
    cases.append(("constant data", 60, _HEAD + '"constants": [{"dtype": "float64", "shape": ' + json.dumps([1] * 60)
                  + ', "data": ' + _nest(60, "2.5") + "}]}"))
    # (the first window of a file is 2^20 + 3 bytes: these put its end on, before and after the escape)
    for n, x in ((300, (1 << 20) - 55), (200, (1 << 20) - 56), (299, (1 << 20) - 60), (201, (1 << 20) - 2)):
        big = "x" * x + '\\"[[[' + "\\\\" * 20
        cases.append((f"file_meta after a 1 MiB string ({x})", n, _HEAD + '"file_meta": {"s": "' + big + '", "m": '
                      + _nest(n) + "}}"))
    return cases


def _expected_meta(place: str, n: int, text: str) -> str | None:
    """repr of the file_meta a correct load gives (for the places that load), from json.loads."""
    if place.startswith("file_meta") or "string" in place:
        doc = json.loads(text)
        meta = doc["file_meta"]

        def as_value(x: Any) -> Any:  # the attribute encoding: arrays are tuples, {"list": [...]} lists
            if isinstance(x, list):
                return tuple(as_value(v) for v in x)
            if isinstance(x, dict):
                return [as_value(v) for v in x["list"]]
            return x

        return repr({k: as_value(v) for k, v in meta.items()})
    return None


@pytest.fixture(scope="module")
def cases() -> list[tuple[str, int, str]]:
    return _cases()


@pytest.mark.parametrize("limit", LIMITS)
def test_deep_nesting_everywhere_is_a_format_error_or_a_correct_load(limit: int, cases: list[Any]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(limit), str(ROOT / "tests")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])  # negative: killed by a signal
    results = json.loads(proc.stdout)
    assert len(results) == 3 * len(cases) + 6
    texts = {(place, n): text for place, n, text in cases}
    crossing = {key: reference_crossing(text, MAX_DEPTH) for key, text in texts.items()}
    for place, n, how, outcome, message, shapes in results:
        assert outcome in ("loaded", "FormatError"), (place, n, how, message)
        if place == "from_json_dict":
            too_deep = 2 + n > MAX_DEPTH  # the document, file_meta, then n arrays
            assert (outcome == "FormatError") == too_deep, (n, message)
            if too_deep:
                assert message.startswith("<json>: file_meta.m[0]") and "nested too deeply" in message, message
            continue
        text, cross = texts[place, n], crossing[place, n]
        if cross >= 0:
            assert outcome == "FormatError", (place, n, how)
            line = text.count("\n", 0, cross) + 1
            column = cross - text.rfind("\n", 0, cross)
            unit = "character" if how == "str" else "byte"
            offset = cross if how == "str" else len(text[:cross].encode())
            assert f"malformed JSON at line {line} column {column} ({unit} offset {offset}): nested too deeply" \
                   in message, (place, n, how, message)
            assert f"opgraph reads at most {MAX_DEPTH} (opgraph.io.jsonfmt.MAX_DEPTH)" in message
            continue
        expect = _expected_meta(place, n, text)
        if expect is not None:  # a valid document: it loads, with the value nested as written
            assert outcome == "loaded" and message == expect, (place, n, how, message[:200])
        elif place == "constant data" and n <= 64:
            assert outcome == "loaded" and shapes == [[1] * n], (place, n, how, message[:200])
        else:  # wrong for the schema (a list where a name belongs, ...): refused for that, not for depth
            assert outcome == "FormatError" and "nested too deeply" not in message, (place, n, how, message)


# ----------------------------------------------------------------------------- writing and other entry points
def _graph_with_meta(meta: Any) -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    b.output(b.op("exp", x))
    return b.freeze().replace(file_meta={"m": meta})


def _nested(n: int, wrap: Any) -> Any:
    v: Any = 0
    for _ in range(n):
        v = wrap(v)
    return v


@pytest.mark.parametrize("n", [MAX_DEPTH - 2, MAX_DEPTH - 1, 10**5])
def test_the_writer_refuses_what_readers_refuse(tmp_path: Path, n: int) -> None:
    g = _graph_with_meta(_nested(n, lambda v: (v,)))
    path = tmp_path / "g.json"
    path.write_text("old")
    if 2 + n <= MAX_DEPTH:  # the document, file_meta, then n arrays: fits
        save_json(g, path)
        assert load_json(path).file_meta == g.file_meta
        assert reference_crossing(path.read_text(), MAX_DEPTH) == -1
        return
    for write in (lambda: save_json(g, path), lambda: dumps_json(g), lambda: opgraph.io.jsonfmt.to_json_dict(g)):
        with pytest.raises(FormatError, match=rf"cannot write file_meta\.m as JSON: at file_meta\.m\[0\].* "
                                              rf"readers refuse files nested deeper than .*MAX_DEPTH = {MAX_DEPTH}"):
            write()
    assert path.read_text() == "old"  # nothing written


def test_tagged_values_count_every_level_they_open(tmp_path: Path) -> None:
    # {"list": [...]} opens two levels per Python list: 127 lists fit (2 + 2 * 127 = 256), 128 do not.
    assert loads_json(dumps_json(_graph_with_meta(_nested(127, lambda v: [v])))).file_meta["m"] == \
        _nested(127, lambda v: [v])
    with pytest.raises(FormatError, match=r"at file_meta\.m\.list"):
        dumps_json(_graph_with_meta(_nested(128, lambda v: [v])))


def test_decode_value_and_short_repr_take_any_depth() -> None:
    deep = _nested(10**6, lambda v: [v])
    with pytest.raises(ValueError, match=rf"nested too deeply: more than {MAX_DEPTH} levels"):
        decode_value(deep, "meta")
    assert decode_value(_nested(200, lambda v: [v])) == _nested(200, lambda v: (v,))
    assert short_repr(deep) == "[" * 57 + "..."
    assert short_repr({"a": (1,), "b": [None, 2.5, "s"]}, 80) == '{"a": (1,), "b": [null, 2.5, "s"]}'
    with pytest.raises(FormatError, match=r"<json>: ops.*nested too deeply"):
        from_json_dict({"format": "opgraph", "version": 1, "ops": deep})


def test_the_command_prints_one_clean_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text(_HEAD + '"file_meta": {"m": ' + _nest(10**6) + "}}")
    script = Path(sys.executable).with_name("opgraph")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "opgraph.cli.main"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([*command, "dump", str(path)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    cross = reference_crossing(path.read_text(), MAX_DEPTH)
    assert f"{path}: malformed JSON at line 1 column {cross + 1} (byte offset {cross}): nested too deeply" in lines[0]


def test_graphml_refuses_a_value_nested_past_the_limit_naming_it(tmp_path: Path) -> None:
    pytest.importorskip("networkx", reason="GraphML goes through networkx, an extra that make test installs")
    path = tmp_path / "g.graphml"
    g = _graph_with_meta(_nested(MAX_DEPTH + 10, lambda v: (v,)))
    with pytest.raises(opgraph.GraphError, match=r"graphml format cannot hold this graph: file_meta entry 'm': "
                                                 r".*nested more than 256 levels"):
        opgraph.save(g, path)
    assert not path.exists()  # nothing half-written
    shallow = _graph_with_meta(_nested(5, lambda v: (v,)))
    opgraph.save(shallow, path)
    assert opgraph.load(path).file_meta == shallow.file_meta
