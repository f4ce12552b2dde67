"""The .cg reader's bulk paths (constants by record type and shape, symbol texts, the scanner's last cursors).

Loaded graphs are checked against an independent decoder written here
(``struct`` over the raw bytes, one record at a time), against what the
generator of a file set wrote, and against the reader's own record-by-record
path (forced by disabling the bulk decoder): the same graph, file_meta and
symbols, the same bytes when saved again, the same error messages.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from opgraph.core.dtypes import CODE_DTYPES
from opgraph.core.graph import Graph
from opgraph.core.registry import CONST
from opgraph.core.types import TensorType
from opgraph.errors import FormatError
from opgraph.io import cg
from opgraph.io.cg import load_cg, reader, save_cg
from opgraph.io.cg.encoding import decode_constant, decode_constants

SUFFIXES = (".cg", ".cgc", ".cgio", ".cgs")
TENSCALC = Path(__file__).resolve().parents[2] / "shared" / "tenscalc"
if not TENSCALC.is_dir():
    TENSCALC = Path("/work/shared/tenscalc")
SHARED = [f"{c}/{v}" for c in ("linalg", "nonlinear", "mpc_medium") for v in ("scalarized", "vectorized")]
KIND = {1: "constant", 2: "op", 3: "value", 4: "io"}


# ---------------------------------------------------------------- an independent decoder
def decode_cgc(data: bytes) -> list[tuple[int, np.ndarray]]:
    """(record type, array) of each constant record, one ``struct`` read at a time (TensCalc's layouts)."""
    w = data[0] // 8
    fmt = {2: "<h", 4: "<i", 8: "<q"}[w]
    out, pos = [], 1
    while pos < len(data):
        (t,) = struct.unpack_from(fmt, data, pos)
        (n,) = struct.unpack_from(fmt, data, pos + w)
        body = data[pos + 2 * w:pos + 2 * w + n]
        pos += 2 * w + n
        if t == 30001:
            out.append((t, np.array(list(body), dtype=np.uint8)))
        elif t == 20001:
            out.append((t, np.array(struct.unpack(f"<{n // 8}q", body), dtype=np.int64)))
        elif t in (10001, 20002) or 100 < t < 115:
            (ndim,) = struct.unpack_from("<q", body, 0)
            shape = struct.unpack_from(f"<{ndim}q", body, 8)
            count = int(np.prod(shape))
            if t in (10001, 20002):  # column-major
                vals = struct.unpack_from(f"<{count}{'d' if t == 10001 else 'q'}", body, 8 + 8 * ndim)
                arr = np.array(vals, dtype=np.float64 if t == 10001 else np.int64).reshape(shape, order="F")
            else:  # opgraph's records: 100 + dtype code, row-major
                dt = CODE_DTYPES[t - 100]
                arr = np.frombuffer(body[8 + 8 * ndim:], dtype=dt.newbyteorder("<")).astype(dt).reshape(shape)
            out.append((t, arr))
        else:
            raise AssertionError(f"record type {t} is not expected in these files")
    return out


def decode_cgs(data: bytes) -> list[tuple[int, int, bytes, bytes]]:
    w = data[0] // 8
    fmt = {2: "<4h", 4: "<4i", 8: "<4q"}[w]
    out, pos = [], 1
    while pos < len(data):
        t, i, nl, dl = struct.unpack_from(fmt, data, pos)
        pos += 4 * w
        out.append((t, i, data[pos:pos + nl], data[pos + nl:pos + nl + dl]))
        pos += nl + dl
    return out


def constants_by_record(g: Graph) -> dict[int, np.ndarray]:
    """Constant index (its .cgc record) -> the array a const op of ``g`` gives."""
    ops = np.flatnonzero(g.op_kind == CONST.id)
    return {dict(g.attrs[int(g.op_attr[op])])["index"]: g.constants[dict(g.attrs[int(g.op_attr[op])])["index"]]
            for op in ops.tolist()}


def check_against_decoder(g: Graph, base: Path) -> None:
    consts = decode_cgc((Path(f"{base}.cgc")).read_bytes())
    assert len(g.constants) == len(consts)
    for c, (_, want) in zip(g.constants, consts, strict=True):
        assert c.dtype == want.dtype and c.shape == want.shape and c.tobytes() == want.tobytes()
    for op in np.flatnonzero(g.op_kind == CONST.id).tolist():  # each const op's value has its constant's type
        c = g.constants[dict(g.attrs[int(g.op_attr[op])])["index"]]
        assert g.type_of(int(g.out_ids[g.out_ptr[op]])) == TensorType(c.dtype, c.shape)
    recs = decode_cgs(Path(f"{base}.cgs").read_bytes())
    enc = g.file_meta.get("cg_text_encoding", "utf-8")
    names: dict[str, dict[int, str]] = {k: {} for k in KIND.values()}
    descriptions: dict[tuple[str, int], str] = {}
    for t, i, nm, ds in recs:
        if nm:
            names[KIND[t]][i] = nm.decode(enc)
        if ds:
            descriptions[(KIND[t], i)] = ds.decode(enc)
    s = g.symbols
    assert (s.constants, s.ops, s.values, s.io) == (names["constant"], names["op"], names["value"], names["io"])
    assert s.descriptions == descriptions
    order = [(t, i) for t, i, _, _ in recs]
    assert ("cg_cgs_order" in g.file_meta) == (order != sorted(set(order)))
    if "cg_cgs_order" in g.file_meta:
        assert list(g.file_meta["cg_cgs_order"]) == order


def record_by_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the reader decode constants one record at a time (its reference path)."""
    monkeypatch.setattr(reader, "decode_constants", lambda *a: None)


def load_outcome(base: Path, monkeypatch: pytest.MonkeyPatch | None = None) -> Any:
    try:
        if monkeypatch is None:
            return load_cg(base)
        with monkeypatch.context() as m:
            record_by_record(m)
            return load_cg(base)
    except FormatError as exc:
        return str(exc)


def assert_same_graph(g: Graph, h: Graph) -> None:
    assert g.equals(h, check_names=True)
    assert g.file_meta == h.file_meta and g.symbols == h.symbols
    assert g.types == h.types and g.attrs == h.attrs
    assert [(c.dtype, c.shape, c.tobytes()) for c in g.constants] == [(c.dtype, c.shape, c.tobytes())
                                                                       for c in h.constants]


# ---------------------------------------------------------------- TensCalc's own files
@pytest.mark.parametrize("case", SHARED)
def test_shared_tenscalc_sets_match_independent_decoder(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    base = TENSCALC / case
    g = load_cg(base)
    check_against_decoder(g, base)
    if "mpc_medium" not in case:  # the large set's record-by-record read takes seconds
        assert_same_graph(g, load_outcome(base, monkeypatch))


# ---------------------------------------------------------------- generated TensCalc-like sets
def put_ints(w: int, values: list[int]) -> bytes:
    return np.array(values, dtype=f"<i{w}").tobytes()


def tc_constant(rng: np.random.Generator, kind: int) -> tuple[int, bytes, np.ndarray]:
    """A random constant as TensCalc writes it: (record type, data, the array)."""
    if kind == 0:  # doubles, often 1x1 (scalar parameters), column-major
        shape = [(1, 1), (1, 1), (3, 1), (2, 3), (), (0, 2), (2, 2, 2)][int(rng.integers(7))]
        a = rng.standard_normal(shape)
        return 10001, np.array([a.ndim, *a.shape], "<i8").tobytes() + a.ravel(order="F").tobytes(), a
    if kind == 1:  # int64 column vectors (Ssum signs, subscripts)
        a = rng.integers(-3, 4, int(rng.choice([0, 1, 2, 2, 2, 5])))
        return 20001, a.astype("<i8").tobytes(), a
    if kind == 2:  # int64 tensors
        shape = [(1, 3), (2, 2), (2, 1, 2)][int(rng.integers(3))]
        a = rng.integers(-9, 9, shape)
        return 20002, np.array([a.ndim, *a.shape], "<i8").tobytes() + a.astype("<i8").ravel(order="F").tobytes(), a
    text = bytes(rng.integers(32, 127, int(rng.integers(0, 6))).astype(np.uint8))
    return 30001, text, np.frombuffer(text, np.uint8)


def tc_set(base: Path, rng: np.random.Generator, n_const: int, *, w: int = 4,
           texts: str = "ascii", shuffle_symbols: bool = False) -> list[np.ndarray]:
    """Write a TensCalc-like set: constants, a const function per constant, symbols; returns the arrays."""
    recs = [tc_constant(rng, int(rng.choice(4, p=[0.6, 0.25, 0.1, 0.05]))) for _ in range(n_const)]
    magic = bytes([8 * w])
    cgc = magic + b"".join(put_ints(w, [t, len(d)]) + d for t, d, _ in recs)
    cg_ints: list[int] = []
    for i in range(n_const):
        cg_ints += [0, i, i]
    alphabet = {"ascii": "abcxyz_0123", "utf-8": "aé€ß_1", "latin-1": "aéßü_1"}[texts]
    syms = []
    for t, limit in ((1, n_const), (2, n_const), (3, n_const)):
        for i in sorted(rng.choice(limit, size=min(limit, 20), replace=False).tolist()) if limit else []:
            name = "".join(rng.choice(list(alphabet), int(rng.integers(1, 5))))  # TensCalc names every record
            desc = "".join(rng.choice(list(alphabet), int(rng.integers(0, 4))))
            syms.append((t, i, name, desc))
    if shuffle_symbols:
        syms = [syms[k] for k in rng.permutation(len(syms))]
    enc = "utf-8" if texts != "latin-1" else "latin-1"
    cgs = magic + b"".join(put_ints(w, [t, i, len(n.encode(enc)), len(d.encode(enc))]) + n.encode(enc) + d.encode(enc)
                           for t, i, n, d in syms)
    files = {".cg": magic + put_ints(w, cg_ints), ".cgc": cgc, ".cgio": magic, ".cgs": cgs}
    for s, data in files.items():
        Path(f"{base}{s}").write_bytes(data)
    return [a for _, _, a in recs]


@pytest.mark.parametrize(("seed", "n", "w", "texts", "shuffle"), [
    (1, 200, 4, "ascii", False), (2, 60, 8, "utf-8", True), (3, 90, 2, "latin-1", False), (4, 0, 4, "ascii", False),
    (5, 7, 4, "ascii", True)])
def test_generated_sets_load_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, n: int, w: int,
                                        texts: str, shuffle: bool) -> None:
    base = tmp_path / "tc"
    arrays = tc_set(base, np.random.default_rng(seed), n, w=w, texts=texts, shuffle_symbols=shuffle)
    g = load_cg(base)
    assert [(c.dtype, c.shape, c.tobytes()) for c in g.constants] == [
        (a.dtype, a.shape, np.ascontiguousarray(a).tobytes()) for a in arrays]
    check_against_decoder(g, base)
    assert (g.file_meta.get("cg_text_encoding") == "latin-1") == (texts == "latin-1")
    assert_same_graph(g, load_outcome(base, monkeypatch))
    save_cg(g, tmp_path / "again")  # file_meta and symbols are what the writer needs for the same bytes
    for s in SUFFIXES:
        assert Path(f"{tmp_path / 'again'}{s}").read_bytes() == Path(f"{base}{s}").read_bytes()


def test_high_bytes_in_symbol_headers_only(tmp_path: Path) -> None:
    # Indices 0x80.. put bytes >= 0x80 in the headers; the texts stay ASCII and are cut from one string.
    base = tmp_path / "hi"
    tc_set(base, np.random.default_rng(9), 300, w=2)
    syms = [(3, i, f"v{i}", "d" if i % 2 else "") for i in range(128, 300)]
    Path(f"{base}.cgs").write_bytes(bytes([16]) + b"".join(
        put_ints(2, [t, i, len(n), len(d)]) + n.encode() + d.encode() for t, i, n, d in syms))
    g = load_cg(base)
    assert g.symbols.values == {i: f"v{i}" for i in range(128, 300)}
    assert g.symbols.descriptions == {("value", i): "d" for i in range(129, 300, 2)}
    assert "cg_text_encoding" not in g.file_meta


def test_opgraph_constants_of_every_dtype_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import opgraph

    rng = np.random.default_rng(3)
    b = opgraph.GraphBuilder()
    x = b.input(("float64", (2, 3)), name="x")
    outs = []
    for dt in ("bool", "int8", "int32", "int64", "uint8", "float32", "float64", "complex128"):
        for k in range(10):  # ten of a kind: decoded together
            shape = [(), (3,), (2, 3), (0, 3)][k % 4]
            if dt == "bool":
                c = rng.random(shape) > 0.5
            elif dt.startswith(("int", "uint")):
                c = rng.integers(-100, 100, shape).astype(dt)
            else:
                c = (rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if "complex" in dt else 0))
            outs.append(b.constant(np.asarray(c, dtype=dt)))
    b.output(x)
    for o in outs:
        b.output(o)
    g = b.freeze()
    save_cg(g, tmp_path / "all")
    h = load_cg(tmp_path / "all")
    assert h.equals(g)
    assert_same_graph(h, load_outcome(tmp_path / "all", monkeypatch))


# ---------------------------------------------------------------- bulk decoding against one by one
def test_decode_constants_equals_decode_constant() -> None:
    rng = np.random.default_rng(7)
    recs = [tc_constant(rng, int(rng.integers(4))) for _ in range(400)]
    recs += [(112, np.array([1, 3], "<i8").tobytes() + np.arange(3.0).tobytes(), None)] * 9  # float64, C order
    body = np.frombuffer(b"".join(d for _, d, _ in recs), np.uint8)
    at = np.cumsum([0] + [len(d) for _, d, _ in recs[:-1]])
    out = decode_constants(body, at, np.array([t for t, _, _ in recs]), np.array([len(d) for _, d, _ in recs]))
    assert out is not None

    def fail(msg: str) -> Any:
        raise AssertionError(msg)

    for k, (t, d, _) in enumerate(recs):
        want = decode_constant(t, np.frombuffer(d, np.uint8), fail)
        got = out.arrays[k]
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
        assert got.flags.c_contiguous
        assert out.forms[int(out.form[k])] == (want.dtype, want.shape)
    first = [int(np.flatnonzero(out.form == f)[0]) for f in range(len(out.forms))]
    assert first == sorted(first)  # forms in order of first use


# ---------------------------------------------------------------- errors inside a bulk run
def same_shape_set(base: Path, n: int = 30) -> list[int]:
    """``n`` 1x1 double constants (one bulk run); returns each record's byte offset in the .cgc file."""
    recs = [(10001, np.array([2, 1, 1], "<i8").tobytes() + np.float64(k).tobytes(), None) for k in range(n)]
    magic = bytes([32])
    Path(f"{base}.cgc").write_bytes(magic + b"".join(put_ints(4, [t, len(d)]) + d for t, d, _ in recs))
    Path(f"{base}.cg").write_bytes(magic + put_ints(4, [x for i in range(n) for x in (0, i, i)]))
    Path(f"{base}.cgio").write_bytes(magic)
    Path(f"{base}.cgs").write_bytes(magic)
    return [1 + k * (8 + 32) for k in range(n)]


def patch_cgc(base: Path, offset: int, value: bytes) -> None:
    data = bytearray(Path(f"{base}.cgc").read_bytes())
    data[offset:offset + len(value)] = value
    Path(f"{base}.cgc").write_bytes(bytes(data))


@pytest.mark.parametrize(("field", "value", "message"), [
    (16, 2, "constant of shape (1, 2) (float64) needs 16 data bytes, the record has 8"),  # second size 1 -> 2
    (0, 65, "constant has ndim 65"),
    (8, -1, "constant has a negative size [-1, 1]"),
    (8, 2**61, "too large for any array"),
    ("type", 10002, "constant type 10002 (TensCalc double_sparse_tensor) is not supported"),
    ("type", 77, "unknown record type 77"),
])
def test_bad_constant_in_the_middle_of_a_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: Any,
                                             value: int, message: str) -> None:
    base = tmp_path / "run"
    offsets = same_shape_set(base)
    k = 17
    if field == "type":  # the record type (an int32 of the record header)
        patch_cgc(base, offsets[k], put_ints(4, [value]))
    else:  # an int64 of the constant's own header (its data starts after the 8-byte record header)
        patch_cgc(base, offsets[k] + 8 + field, np.array([value], "<i8").tobytes())
    err = load_outcome(base)
    assert isinstance(err, str)
    assert f"run.cgc: record {k} at byte offset {offsets[k]}: " in err and message in err
    assert load_outcome(base, monkeypatch) == err  # exactly the record-by-record message


def test_truncated_and_misplaced_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "run"
    offsets = same_shape_set(base)
    data = Path(f"{base}.cgc").read_bytes()
    # The file cut inside record 12's data: its length runs past the end.
    Path(f"{base}.cgc").write_bytes(data[:offsets[12] + 20])
    err = load_outcome(base)
    assert isinstance(err, str) and f"record 12 at byte offset {offsets[12]}: data length 32 runs past" in err
    assert load_outcome(base, monkeypatch) == err
    # A data length of 16 in record 5 (its value bytes then read as record 6's header): one message, as before.
    Path(f"{base}.cgc").write_bytes(data)
    patch_cgc(base, offsets[5] + 4, put_ints(4, [16]))
    err = load_outcome(base)
    assert isinstance(err, str) and "record 5 at byte offset" in err
    assert load_outcome(base, monkeypatch) == err
    # An int64 vector whose data is not whole int64 values, between good ones.
    recs = [(20001, np.arange(3, dtype="<i8").tobytes())] * 12
    recs[6] = (20001, b"\x00" * 12)
    Path(f"{base}.cgc").write_bytes(bytes([32]) + b"".join(put_ints(4, [t, len(d)]) + d for t, d in recs))
    Path(f"{base}.cg").write_bytes(bytes([32]) + put_ints(4, [x for i in range(12) for x in (0, i, i)]))
    err = load_outcome(base)
    at = decode_cgc_heads(Path(f"{base}.cgc").read_bytes())[6][0]
    assert isinstance(err, str) and f"record 6 at byte offset {at}: int64l_full_vector data of 12 bytes" in err
    assert load_outcome(base, monkeypatch) == err


def test_metadata_record_not_last_and_bool_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import opgraph

    b = opgraph.GraphBuilder()
    for k in range(12):
        b.output(b.constant(np.array([(k >> j) & 1 for j in range(4)], dtype=bool)))
    save_cg(b.freeze(), tmp_path / "m")
    data = Path(f"{tmp_path / 'm'}.cgc").read_bytes()
    heads = decode_cgc_heads(data)
    assert [t for _, t, _ in heads[:12]] == [101] * 12
    # A byte 2 in the sixth bool constant (decoded together with the others).
    at = heads[5][0] + 2 * (data[0] // 8) + 16
    bad = data[:at] + b"\x02" + data[at + 1:]
    Path(f"{tmp_path / 'm'}.cgc").write_bytes(bad)
    err = load_outcome(tmp_path / "m")
    assert isinstance(err, str) and f"record 5 at byte offset {heads[5][0]}: bool constant holds bytes" in err
    assert load_outcome(tmp_path / "m", monkeypatch) == err
    # The metadata record (last) copied before the constants: a record follows it.
    meta_at = heads[-1][0]
    moved = data[:1] + data[meta_at:] + data[1:meta_at]
    Path(f"{tmp_path / 'm'}.cgc").write_bytes(moved)
    err = load_outcome(tmp_path / "m")
    assert isinstance(err, str) and "record 1 at byte offset" in err and "follows the opgraph metadata" in err
    assert load_outcome(tmp_path / "m", monkeypatch) == err


def decode_cgc_heads(data: bytes) -> list[tuple[int, int, int]]:
    """(byte offset, record type, data length) of each record of a .cgc file (any integer width)."""
    w = data[0] // 8
    fmt = {2: "<2h", 4: "<2i", 8: "<2q"}[w]
    out, pos = [], 1
    while pos < len(data):
        t, n = struct.unpack_from(fmt, data, pos)
        out.append((pos, t, n))
        pos += 2 * w + n
    return out


# ---------------------------------------------------------------- the scanner's last cursors
@pytest.mark.parametrize("tail", [0, 3, 10**6])
def test_scanner_tail_cursors_equal_reference(monkeypatch: pytest.MonkeyPatch, tail: int) -> None:
    # Long records (a gateway function with thousands of inputs) keep a few cursors stepping one
    # integer at a time; they finish one by one (TAIL_CURSORS) with the same result.
    monkeypatch.setattr(cg.scan, "TAIL_CURSORS", tail)
    rng = np.random.default_rng(2)
    vals: list[int] = []
    for k in range(3000):
        if k % 700 == 5:
            n_in = int(rng.integers(2000, 5000))
            vals += [30001, n_in, 1, *rng.integers(0, 20000, n_in).tolist(), 50000 + k]
        elif k % 2:
            vals += [0, k, 60000 + k]
        else:
            vals += [20003, 2, 1, int(rng.integers(0, 9000)), int(rng.integers(0, 9000)), 70000 + k]
    for cut in (None, len(vals) - 3):
        layout = cg.scan.CgLayout(np.array(vals[:cut], dtype="<i4"))
        try:
            want: Any = cg.scan_records_reference(layout).tolist()
        except cg.scan.ScanError as e:
            want = (e.record, e.pos, e.reason)
        for block in (None, 97, 1024):
            try:
                got: Any = cg.scan_records(layout, block=block).tolist()
            except cg.scan.ScanError as e:
                got = (e.record, e.pos, e.reason)
            assert got == want
