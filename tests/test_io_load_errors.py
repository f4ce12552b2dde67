"""What ``opgraph.load`` says when the caller, not the file, is wrong, and when a file is cut short or corrupt.

* A keyword argument no loader takes (``input_shape=`` for ``input_shapes=``) is a ``TypeError`` naming it and
  the closest one, raised before the file is touched, for every loadable format.
* ``input_shapes=``/``input_types=`` naming no input of an ONNX model list the model's inputs (models made with
  ``onnx.helper``) and stay ``ValueError``s, not complaints about the file.
* A truncated JSON file says where (line, column and byte offset as ``json.loads`` finds them, on the bytes) and
  that the file looks truncated, at every cut point.
* A .cg file written by opgraph, then byte-patched with a type id no op can have, says the file is corrupt
  instead of suggesting ``register_op``; TensCalc's own files (no opgraph metadata) still get the suggestion.
"""

from __future__ import annotations

import inspect
import json
import re
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import opgraph
from opgraph.core.registry import ID_RANGES, USER_IDS, OpDef, register_op
from opgraph.errors import FormatError
from opgraph.io import formats
from opgraph.io.cg import load_cg, save_cg
from opgraph.io.jsonfmt import load_json
from opgraph.io.onnx import OnnxArgumentError, from_onnx

DATA = Path(__file__).parent / "data" / "tenscalc" / "copy"


def _graph() -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (1, 3)), name="x")
    b.output(b.exp(x))
    return b.freeze()


# ----------------------------------------------------------------------------- keyword arguments
LOADABLE = [f for f in formats.formats() if f.loadable and not f.missing()]


@pytest.mark.parametrize("fmt", LOADABLE, ids=lambda f: f.name)
def test_a_misspelt_keyword_is_a_type_error_for_every_format(fmt: formats.Format, tmp_path: Path) -> None:
    path = tmp_path / f"net{fmt.suffixes[0]}"
    opgraph.save(_graph(), path)
    with pytest.raises(TypeError) as err:
        opgraph.load(path, input_shape={"x": (1, 3)}, allow_pickle=True)
    assert isinstance(err.value, formats.UnknownOptionError) and not isinstance(err.value, FormatError)
    takes = formats.load_options(fmt)
    listed = f"take {', '.join(takes)}" if takes else "take no options"
    hint = "; did you mean 'input_shapes' or 'input_types'?" if "input_shapes" in takes else ""
    assert str(err.value) == (f"opgraph.load() got an unexpected keyword argument 'input_shape' for {path}{hint} "
                              f"({fmt.name} files {listed}; every format takes format, allow_pickle)")
    # The file is never opened: a path that does not exist gets the same answer, not FileNotFoundError.
    with pytest.raises(formats.UnknownOptionError, match="'input_shape'"):
        opgraph.load(tmp_path / f"missing{fmt.suffixes[0]}", input_shape={}, allow_pickle=True)


def test_the_suggestion_covers_load_s_own_keywords(tmp_path: Path) -> None:
    path = tmp_path / "g.dag.pkl"
    opgraph.save(_graph(), path)
    with pytest.raises(TypeError, match=r"'allow_pickles' for .*g\.dag\.pkl; did you mean 'allow_pickle'\?"):
        opgraph.load(path, allow_pickles=True)
    with pytest.raises(TypeError, match=r"'mmapp' for .*g\.cg; did you mean 'mmap'\? \(cg files take mmap;"):
        opgraph.load(tmp_path / "g.cg", mmapp=False)


SAVEABLE = [f for f in formats.formats() if f.save is not None and not f.missing()]


@pytest.mark.parametrize("fmt", SAVEABLE, ids=lambda f: f.name)
def test_a_misspelt_save_keyword_is_a_type_error_and_the_file_is_left_as_it_was(fmt: formats.Format,
                                                                                 tmp_path: Path) -> None:
    """``opgraph.save(g, "net.onnx", opst=18)`` names ``opst`` and ``opset``, for every format, and writes nothing
    (it used to say the format "cannot hold this graph", or raise a bare TypeError from inside the writer)."""
    path = tmp_path / f"net{fmt.suffixes[0]}"
    path.write_bytes(b"what was there")
    with pytest.raises(TypeError) as err:
        opgraph.save(_graph(), path, opst=18)
    assert isinstance(err.value, formats.UnknownOptionError)
    msg = str(err.value)
    assert msg.startswith(f"opgraph.save() got an unexpected keyword argument 'opst' for {path}")
    assert msg.endswith("; every format takes format)") and f"({fmt.name} files take" in msg
    assert path.read_bytes() == b"what was there"
    if fmt.name == "onnx":
        assert "; did you mean 'opset'?" in msg


def test_save_s_checked_keywords_are_the_writers_own(tmp_path: Path) -> None:
    from opgraph.io.jsonfmt import save_json
    from opgraph.io.onnx import to_onnx

    for writer, leading, kw in ((save_cg, 2, "index_bits"), (save_json, 2, "inline_limit"), (to_onnx, 1, "opset")):
        assert kw in (formats.options_taken(writer, leading) or ())
    with pytest.raises(TypeError, match=r"'index_bit' for .*g\.cg; did you mean 'index_bits'\? \(cg files take "
                                        r"index_bits; every format takes format\)"):
        opgraph.save(_graph(), tmp_path / "g.cg", index_bit=16)
    opgraph.save(_graph(), tmp_path / "g.cg", index_bits=32)  # the right keyword still reaches the writer
    assert opgraph.load(tmp_path / "g.cg") == _graph()


@pytest.mark.parametrize("name, reader", [("onnx", from_onnx), ("cg", load_cg), ("json", load_json)])
def test_the_checked_keywords_are_the_readers_own(name: str, reader: object) -> None:
    """load() checks the format wrappers' keywords: they must stay those of the reader they call."""
    own = [p.name for p in inspect.signature(reader).parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert list(formats.load_options(formats.get_format(name))) == own


def test_the_right_keywords_still_reach_the_reader(tmp_path: Path) -> None:
    g = _graph()
    for suffix in (".onnx", ".cg", ".json"):
        opgraph.save(g, tmp_path / f"g{suffix}")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    loaded = opgraph.load(tmp_path / "g.onnx", input_shapes={"x": (2, 3)})
    np.testing.assert_allclose(loaded.run(x=x)[0], np.exp(x), rtol=1e-6)
    assert opgraph.load(tmp_path / "g.cg", mmap=False) == g
    assert opgraph.load(tmp_path / "g.json", verify=False) == g


def test_a_format_whose_loader_takes_any_keyword_gets_them_all(tmp_path: Path) -> None:
    seen: dict[str, object] = {}

    def load_any(path: str, **options: object) -> opgraph.Graph:
        seen.update(options)
        return _graph()

    formats.register(formats.Format("test_any", (".testany",), "", save=lambda g, p: None, load=load_any))
    try:
        (tmp_path / "g.testany").write_text("x")
        opgraph.load(tmp_path / "g.testany", whatever=3)
    finally:
        formats.unregister("test_any")
    assert seen == {"whatever": 3}


# ----------------------------------------------------------------------------- ONNX arguments
def _model(path: Path) -> None:
    nodes = [helper.make_node("Add", ["image", "mask"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("image", TensorProto.FLOAT, ("N", 3)),
        helper.make_tensor_value_info("mask", TensorProto.FLOAT, ("N", 3))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ("N", 3))]))
    onnx.save(model, path)


def test_input_shapes_naming_no_input_lists_the_model_s_inputs(tmp_path: Path) -> None:
    path = tmp_path / "net.onnx"
    _model(path)
    inputs = "the model's inputs are image: float32[N,3], mask: float32[N,3]"
    with pytest.raises(ValueError) as err:
        opgraph.load(path, input_shapes={"imgae": (2, 3)})
    assert isinstance(err.value, OnnxArgumentError) and not isinstance(err.value, FormatError)
    assert str(err.value) == f"{path}: input_shapes names no graph input: 'imgae'; {inputs}; did you mean 'image'?"
    with pytest.raises(OnnxArgumentError) as err:
        opgraph.load(path, input_types={"input": ("float32", (2, 3))})
    assert str(err.value) == f"{path}: input_types names no graph input: 'input'; {inputs}"
    with pytest.raises(OnnxArgumentError) as err:
        opgraph.load(path, input_shapes={"image": (2, 3, 1)})
    assert str(err.value) == (f"{path}: input image has rank 2 in the graph (dims N, 3) and the given shape (2, 3, 1) "
                              "has rank 3; give 2 sizes")
    with pytest.raises(OnnxArgumentError, match=r"input_shapes\['mask'\] must be a sequence of sizes .*, not 3"):
        opgraph.load(path, input_shapes={"mask": 3})
    g = opgraph.load(path, input_shapes={"image": (2, 3), "mask": (2, 3)})
    assert [g.type_of(v).shape for v in g.inputs.tolist()] == [(2, 3), (2, 3)]


def test_one_input_is_suggested_whatever_its_name(tmp_path: Path) -> None:
    path = tmp_path / "net.onnx"
    opgraph.save(_graph(), path)
    with pytest.raises(OnnxArgumentError) as err:
        opgraph.load(path, input_shapes={"input": (1, 3)})
    assert str(err.value) == (f"{path}: input_shapes names no graph input: 'input'; the model's inputs are "
                              "x: float32[1,3]; did you mean 'x'?")


# ----------------------------------------------------------------------------- truncated JSON
def _json_graph() -> opgraph.Graph:
    b = opgraph.GraphBuilder()
    x = b.input(("float32", (2, 3)), name="x\u00e9")  # two bytes in UTF-8: byte and character offsets differ
    c = b.constant(np.arange(6.0).reshape(2, 3) / 7)
    b.output(b.op("exp", b.add(x, c), name="y\u00e9"))
    return b.freeze()


def _expected(data: bytes) -> str:
    """The message for JSON bytes ``data`` from json.loads's own error, its position turned into a byte offset."""
    text = data.decode("utf-8")
    with pytest.raises(json.JSONDecodeError) as err:
        json.loads(text)
    e = err.value
    offset = len(text[:e.pos].encode("utf-8"))
    if e.msg.endswith(" at"):
        where = f"malformed JSON: {e.msg} line {e.lineno} column {e.colno} (byte offset {offset})"
    else:
        where = f"malformed JSON at line {e.lineno} column {e.colno} (byte offset {offset}): {e.msg}"
    return where


def test_a_truncated_json_file_says_where_and_that_it_looks_truncated(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    opgraph.save(_json_graph(), path)
    data = path.read_bytes()
    assert data.endswith(b"}\n") and "\u00e9".encode() in data
    cut = tmp_path / "cut.json"
    for k in range(1, len(data) - 1):  # every cut but the trailing newline's
        cut.write_bytes(data[:k])
        with pytest.raises(FormatError) as err:
            opgraph.load(cut)
        try:
            data[:k].decode("utf-8")
        except UnicodeDecodeError:  # the cut splits the two bytes of an é
            assert str(err.value) == f"{cut}: not UTF-8 text (byte {k - 1}): the file ends inside a character, " \
                                     "it looks truncated"
            continue
        assert str(err.value) == f"{cut}: {_expected(data[:k])}; the file ends at byte offset {k}: it looks truncated"


def test_the_issue_s_unterminated_string(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    opgraph.save(_json_graph(), path)
    data = path.read_bytes()
    start = data.index(b'"%y\xc3\xa9"')  # the outputs list, after the name with an é
    path.write_bytes(data[:start + 3])
    line = data[:start].count(b"\n") + 1
    column = len(data[data.rindex(b"\n", 0, start) + 1:start].decode()) + 1
    with pytest.raises(FormatError) as err:
        opgraph.load(path)
    assert str(err.value) == (f"{path}: malformed JSON: Unterminated string starting at line {line} column {column} "
                              f"(byte offset {start}); the file ends at byte offset {start + 3}: it looks truncated")


def test_a_wrong_json_file_is_not_called_truncated(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    opgraph.save(_json_graph(), path)
    data = path.read_bytes()
    comma = data.index(b", ", data.index(b'"data"'))
    bad = data[:comma] + b" " + data[comma + 1:]  # [[0.0 0.14...]]: a missing comma in the middle
    path.write_bytes(bad)
    with pytest.raises(FormatError) as err:
        opgraph.load(path)
    assert str(err.value) == f"{path}: {_expected(bad)}"
    assert "truncated" not in str(err.value)


def test_a_truncated_file_larger_than_a_window_and_with_a_bom(tmp_path: Path) -> None:
    """The byte offset counts every window before the error, and the BOM."""
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (300_000,)), name="\u00e9" * 1000)  # 2000 bytes, 1000 characters, before the data
    b.output(b.add(x, b.constant(np.linspace(0.0, 1.0, 300_000))))
    path = tmp_path / "g.json"
    opgraph.save(b.freeze(), path)
    data = path.read_bytes()
    assert len(data) > 3 << 20
    k = data.index(b'"op": "add"') + 5  # inside the ops, after the constant's data: in the string "add"
    path.write_bytes(b"\xef\xbb\xbf" + data[:k])
    with pytest.raises(FormatError) as err:
        opgraph.load(path)
    expected = re.sub(r"byte offset (\d+)", lambda m: f"byte offset {int(m.group(1)) + 3}", _expected(data[:k]))
    assert str(err.value) == f"{path}: {expected}; the file ends at byte offset {k + 3}: it looks truncated"


def test_a_json_string_counts_the_bytes_of_its_utf8_form() -> None:
    text = '{"format": "opgraph", "version": 1, "inputs": [{"value": "%x\u00e9'
    start = text.index('"%x')
    with pytest.raises(FormatError) as err:
        opgraph.io.jsonfmt.loads_json(text)
    assert str(err.value) == (f"<string>: malformed JSON: Unterminated string starting at line 1 column {start + 1} "
                              f"(byte offset {start}); the text ends at byte offset {len(text.encode())}: it looks "
                              "truncated")


# ----------------------------------------------------------------------------- corrupt .cg type ids
def _record_offset(cg: bytes, record: int) -> int:
    """Byte offset of .cg record ``record`` in a 32-bit file (docs/cg-format.md): ``[type, nin, nout, in...,
    out...]`` per record, except that type 0 (a constant) is ``[0, constant record, output variable]``."""
    assert cg[0] == 32
    ints = np.frombuffer(cg[1:], "<i4")
    at = 0
    for _ in range(record):
        at += 3 if ints[at] == 0 else 3 + int(ints[at + 1]) + int(ints[at + 2])
    assert ints[at] != 0, "patch a function record, not a constant"
    return 1 + 4 * at


def _patch_type(base: Path, record: int, kind: int) -> int:
    cg = Path(f"{base}.cg")
    data = cg.read_bytes()
    off = _record_offset(data, record)
    cg.write_bytes(data[:off] + struct.pack("<i", kind) + data[off + 4:])
    return off


RANGES = ("0-9999 opgraph's own, 10001-30002 TensCalc's registered types, 40000-2147483647 ops of your own")


def test_ranges_are_the_documented_ones() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "ops.md").read_text()
    assert ID_RANGES[2][0] == USER_IDS
    for lo, hi, _ in ID_RANGES[1:2]:
        assert f"| {lo}-{hi} |" in doc
    assert f"| {USER_IDS} and up |" in doc


@pytest.mark.parametrize("kind, message", [
    (16777215, "unknown function type 16777215: no op is registered under this id, and the file does not record "
               "using an op of your own under it (opgraph's writer lists each one a file uses; this file lists "
               "none): the file is corrupt"),
    (35000, f"unknown function type 35000: the id is outside every range of op ids ({RANGES}): the file is corrupt "
            "or was written by a newer or extended writer"),
    (2**31, f"unknown function type 2147483648: the id is outside every range of op ids ({RANGES}): the file is "
            "corrupt or was written by a newer or extended writer"),
    (4999, "unknown function type 4999: the id is in the range of opgraph's own (0-9999) but no op of this opgraph "
           "version has it: the file is corrupt or was written by a newer opgraph"),
])
def test_a_corrupt_type_id_in_opgraph_s_file_says_corrupt(tmp_path: Path, kind: int, message: str) -> None:
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    b.output(b.exp(b.add(x, x)))
    save_cg(b.freeze(), tmp_path / "g", index_bits=64 if kind >= 2**31 else 32)
    if kind >= 2**31:
        data = Path(tmp_path / "g.cg").read_bytes()
        ints = np.frombuffer(data[1:], "<i8")
        off = 1 + 8 * (3 + int(ints[1]) + int(ints[2]))
        Path(tmp_path / "g.cg").write_bytes(data[:off] + struct.pack("<q", kind) + data[off + 8:])
    else:
        off = _patch_type(tmp_path / "g", 1, kind)
    with pytest.raises(FormatError) as err:
        opgraph.load(tmp_path / "g.cg")
    assert str(err.value) == f"{tmp_path / 'g.cg'}: record 1 at byte offset {off}: {message}"
    assert "register_op" not in str(err.value)


def test_an_id_the_file_does_not_list_among_its_own_ops_is_corrupt(tmp_path: Path) -> None:
    register_op(OpDef(name="test_loaderr_twice", id=59401, arity=1, infer=lambda ts, a: ts,
                      kernel=lambda x, out=None: np.multiply(x, 2, out=out), elementwise=True), replace=True)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (3,)), name="x")
    b.output(b.op("test_loaderr_twice", b.exp(x)))
    save_cg(b.freeze(), tmp_path / "g")
    off = _patch_type(tmp_path / "g", 0, 59402)  # the exp becomes an id no op has, nor the file lists
    with pytest.raises(FormatError) as err:
        opgraph.load(tmp_path / "g.cg")
    assert str(err.value).endswith(f"record 0 at byte offset {off}: unknown function type 59402: no op is registered "
                                   "under this id, and the file does not record using an op of your own under it "
                                   "(opgraph's writer lists each one a file uses; this file lists 59401): the file "
                                   "is corrupt")


def test_tenscalc_s_files_still_load_and_a_user_range_id_still_suggests_register_op(tmp_path: Path) -> None:
    for form in ("scalarized", "vectorized"):
        g = load_cg(DATA / f"{form}.cg")
        assert g.num_ops > 0 and not g.file_meta["cg_opgraph_metadata"]
    for suffix in (".cg", ".cgc", ".cgio", ".cgs"):
        (tmp_path / f"t{suffix}").write_bytes((DATA / f"scalarized{suffix}").read_bytes())
    off = _patch_type(tmp_path / "t", 1, 41234)  # TensCalc's writer keeps no list of ops: it may be the user's
    with pytest.raises(FormatError) as err:
        opgraph.load(tmp_path / "t.cg")
    assert f"record 1 at byte offset {off}: unknown function type 41234" in str(err.value)
    assert "call opgraph.register_op(OpDef(id=41234, ...))" in str(err.value)
    off = _patch_type(tmp_path / "t", 1, 35000)
    with pytest.raises(FormatError) as err:
        opgraph.load(tmp_path / "t.cg")
    assert str(err.value) == (f"{tmp_path / 't.cg'}: record 1 at byte offset {off}: unknown function type 35000: the "
                              f"id is outside every range of op ids ({RANGES}): the file is corrupt or was written by "
                              "a newer or extended writer")
