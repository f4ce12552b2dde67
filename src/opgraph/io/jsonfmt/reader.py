"""Reading the JSON form into a verified graph (:func:`load_json`); never executes code."""

from __future__ import annotations

import os
import re
from array import array
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from opgraph.core import progress
from opgraph.core.builder import exact_key
from opgraph.core.gcpause import paused_gc
from opgraph.core.graph import Graph, Symbols, ranges
from opgraph.core.intern import Interner
from opgraph.core.registry import CONST, OpDef, get_op, unknown_op_message
from opgraph.core.subgraph import Subgraph
from opgraph.core.types import TensorType, ValueType
from opgraph.errors import FormatError, VerifyError
from opgraph.io.jsonfmt.encoding import (
    ALL_DIGITS,
    BODY_KEYS,
    CONST_KEYS,
    DEF_KEYS,
    FORMAT,
    INT32,
    MAX_DEPTH,
    OP_KEYS,
    SYMBOL_KEYS,
    TOP_KEYS,
    VERSION,
    VERSION_PLAIN,
    BadJson,
    BodyRef,
    check_keys,
    dec_value,
    decode_array_body,
    decode_type,
    expect_array,
    expect_int,
    expect_object,
    expect_pairs,
    expect_str,
    has_ref,
    key_path,
    short_repr,
    swap_refs,
    too_deep,
    where_of,
)
from opgraph.io.jsonfmt.tokenizer import SCANNER, STREAMED, Malformed, NotUtf8, Text, stream_document


def _numeric_ref(ref: str) -> bool:
    """Whether ``ref`` is ``"%<number>"`` (no leading zeros): ``_NUMERIC_REF.fullmatch``, faster."""
    return ref.isascii() and ref[1:].isdigit() and ref[0] == "%" and (ref[1] != "0" or len(ref) == 2)


_BIG = 2**62
"""Numbers from here on are kept aside (in a dict) and stand as this value in the per-entry arrays."""


def _ref_code(ref: str, names: dict[str, int]) -> int:
    """A value ref as an integer: its number for ``"%<number>"``, else ``-1 - id`` of the interned ref."""
    if _numeric_ref(ref):
        v = int(ref[1:])
        if v < _BIG:
            return v
    code = names.get(ref)
    if code is None:
        code = names[ref] = -1 - len(names)
    return code


def _assign_numbers(explicit: np.ndarray, path_of: Callable[[int], str], what: str,
                    big: dict[int, int]) -> np.ndarray:
    """Explicit numbers (-1: none) must be distinct and in range; the others take the free ones in order.

    Raises at the first offending entry in order, as a loop over the entries would. ``big``
    holds the numbers of entries that stand as ``_BIG``.
    """
    n = len(explicit)
    if n and int(explicit.min()) >= 0 and int(explicit.max()) < n and bool(np.all(explicit[1:] > explicit[:-1])):
        return explicit  # all given, distinct and in range (the writer's files): nothing to assign
    given = np.flatnonzero(explicit >= 0)
    nums = explicit[given]
    first_bad = n
    out_of_range = np.flatnonzero(nums >= n)
    if len(out_of_range):
        first_bad = int(given[out_of_range[0]])
    uniq, first = np.unique(nums, return_index=True)
    if len(uniq) != len(nums):
        again = np.ones(len(nums), dtype=bool)
        again[first] = False
        k = int(np.flatnonzero(again)[0])
        if int(given[k]) < first_bad:
            num = big.get(int(given[k]), int(nums[k]))
            earlier = int(given[first[np.searchsorted(uniq, num)]])
            raise BadJson(path_of(int(given[k])), f"{what} number {num} is defined twice (first at {path_of(earlier)})")
    if first_bad < n:
        number = big.get(first_bad, int(explicit[first_bad]))
        raise BadJson(path_of(first_bad), f"{what} number {number} is out of range: the file defines {n} {what}s")
    if len(given) == n:
        return explicit.copy()
    claimed = np.zeros(n, dtype=bool)
    claimed[nums] = True
    out = explicit.copy()
    out[explicit < 0] = np.flatnonzero(~claimed)[: n - len(given)]
    return out


# ----------------------------------------------------------------------------- reading: the document


_DEF_KEYSET = frozenset(DEF_KEYS)
_OP_KEYSET = frozenset(OP_KEYS)
_NONE = -(2**62)
"""An absent version or op index in the per-op arrays."""
# Classes of problems, in the order a document is checked (the first problem of the lowest class wins).
_C_CONSTANTS, _C_INPUTS, _C_OP_DEFS, _C_OP_INDEX, _C_OPS = 2, 3, 4, 6, 7
_R_KIND, _R_ID, _R_INPUTS, _R_ATTRS, _R_VERSION, _R_INFER, _R_NAME, _R_DESCRIPTION = range(8)


class Doc:
    """What a document holds, gathered as it is read, in compact arrays (no object per op or value).

    The top-level values arrive through :meth:`value`; the elements of the inputs,
    constants and ops arrays one at a time through :meth:`stream`. A problem is kept
    (not raised) with its place in the order in which a document is checked, so that
    :meth:`graph` reports the same first problem whatever the order of the keys and
    however the document was read.
    """

    def __init__(self) -> None:
        self.top: Any = {}
        self.problem: tuple[tuple[int, ...], BadJson] | None = None
        # constants
        self.constants: list[np.ndarray] = []
        self.const_names: dict[int, str] = {}
        self.descriptions: dict[tuple[str, int], str] = {}
        # value definitions: inputs and op outputs, kept apart (inputs are numbered first)
        self.names: dict[str, int] = {}  # interned "%name" refs -> -1 - id
        self.type_table: Interner[ValueType] = Interner()
        self.types = self.type_table.items
        self.type_keys: dict[tuple[Any, ...], int] = {}
        self.defs = {"inputs": _Defs(), "ops": _Defs()}
        # ops, in file order
        self.n_ops = 0
        self.op_ndef = array("i")  # output definitions per op
        self.op_index = array("q")  # "index" (or _NONE)
        self.op_kind = array("i")
        self.op_version = array("q")  # (or _NONE)
        self.op_attr = array("i")
        self.op_nin = array("i")  # input refs read per op
        self.in_codes = array("q")  # the refs (see _ref_code)
        self.op_names: dict[int, str] = {}
        self.op_descriptions: dict[int, str] = {}
        self.attrs: list[tuple[tuple[str, Any], ...]] = []
        self.attr_ids: dict[Any, int] = {}
        self.attr_keys: dict[Any, int] = {}
        self.opdefs: dict[Any, OpDef] = {}
        self.checked_ops = 0  # ops whose own checks ran (up to the first op with a problem)
        self.big_index: dict[int, int] = {}  # op indices from _BIG on
        # subgraphs: the bodies attributes may refer to, and the attribute entries that refer to them
        self.bodies: list[Subgraph] = []
        self.in_body = False  # reading a record of "subgraphs" (it may refer only to earlier records)
        self.deferred: dict[int, tuple[OpDef, int, bool]] = {}  # attr id -> (kind, first op, all attrs given)

    # -------------------------------------------------------------- problems
    def keep(self, where: tuple[int, ...], exc: BadJson) -> None:
        if self.problem is None or where < self.problem[0]:
            self.problem = (where, exc)

    def wanted(self, cls: int) -> bool:
        """Whether a problem of class ``cls`` could still be the one reported."""
        return self.problem is None or cls < self.problem[0][0]

    # -------------------------------------------------------------- feeding
    def value(self, key: str, value: Any) -> None:
        self.top[key] = value
        if key in STREAMED:  # not an array (an array is streamed)
            cls = {"constants": _C_CONSTANTS, "inputs": _C_INPUTS, "ops": _C_OP_DEFS}[key]
            what = {"constants": "the constants table", "inputs": "the inputs", "ops": "the ops"}[key]
            try:
                expect_array(value, key, what)
            except BadJson as exc:
                self.keep((cls, -1), exc)

    def stream(self, key: str) -> Callable[[int, Any], None]:
        self.top[key] = _STREAMED_MARK
        return {"constants": self._constant, "inputs": self._input, "ops": self._op}[key]

    def feed(self, doc: Any) -> None:
        """Feed a document already parsed (``from_json_dict``)."""
        if not isinstance(doc, dict):
            self.top = doc
            return
        for key, value in doc.items():
            if key in STREAMED and isinstance(value, list):
                take = self.stream(key)
                for k, x in enumerate(value):
                    take(k, x)
            else:
                self.value(key, value)

    # -------------------------------------------------------------- elements
    def _constant(self, i: int, c: Any) -> None:
        if not self.wanted(_C_CONSTANTS):
            return
        path = f"constants[{i}]"
        try:
            c = expect_object(c, path, "a constant")
            check_keys(c, CONST_KEYS, path)
            self.constants.append(decode_array_body(c, path))
            if "name" in c:
                self.const_names[i] = expect_str(c["name"], f"{path}.name", "a name")
            if "description" in c:
                self.descriptions[("constant", i)] = expect_str(c["description"], f"{path}.description",
                                                                "a description")
        except BadJson as exc:
            self.keep((_C_CONSTANTS, i), exc)

    def _input(self, i: int, d: Any) -> None:
        if self.wanted(_C_INPUTS):
            try:
                self._def(self.defs["inputs"], d, lambda: f"inputs[{i}]")
            except BadJson as exc:
                self.keep((_C_INPUTS, i), exc)

    def _def(self, defs: _Defs, obj: Any, where: Callable[[], str]) -> None:
        """One value definition (the checks of the module doc, in their order)."""
        if type(obj) is not dict:
            expect_object(obj, where(), "a value definition")
        if not obj.keys() <= _DEF_KEYSET:
            check_keys(obj, DEF_KEYS, where())
        ref = obj.get("value")
        if type(ref) is not str:
            if "value" not in obj:
                raise BadJson(where(), "missing key 'value' (the value's ref, like \"%x\" or \"%3\")")
            expect_str(ref, key_path(where(), "value"), "a value ref")
        if ref[:1] != "%" or len(ref) < 2:
            raise BadJson(key_path(where(), "value"), f"a value ref starts with '%', got {ref!r}")
        code = _ref_code(ref, self.names)
        numeric = code >= 0 or _numeric_ref(ref)
        if not numeric and ALL_DIGITS.fullmatch(ref[1:]):
            raise BadJson(key_path(where(), "value"), f"numeric ref {ref!r} has leading zeros")
        number = int(ref[1:]) if numeric else -1
        if "number" in obj:
            n = expect_int(obj["number"], key_path(where(), "number"), "a value number", 0)
            if numeric and n != number:
                raise BadJson(key_path(where(), "number"), f"number {n} disagrees with ref {ref!r}")
            number = n
        k = len(defs.code)
        if number >= _BIG:
            defs.big[k] = number
            number = _BIG
        if "name" in obj:
            name = expect_str(obj["name"], key_path(where(), "name"), "a name")
            if not numeric and name != ref[1:]:
                raise BadJson(key_path(where(), "name"), f"name {name!r} disagrees with ref {ref!r}")
            if numeric:
                defs.names[k] = name
        tid = -1
        if "type" in obj:
            tid = self._type(obj["type"], where)
        if "description" in obj:
            defs.descriptions[k] = expect_str(obj["description"], key_path(where(), "description"), "a description")
        defs.code.append(code)
        defs.number.append(number)
        defs.type.append(tid)

    def _type(self, t: Any, where: Callable[[], str]) -> int:
        """The id of a value type (decoded once per distinct spelling)."""
        key = None
        if type(t) is dict and len(t) == 2:
            dt, shape = t.get("dtype"), t.get("shape")
            if type(dt) is str and type(shape) is list and all(type(d) is int or d is None for d in shape):
                key = (dt, *shape)
                hit = self.type_keys.get(key)
                if hit is not None:
                    return hit
        vt = decode_type(t, key_path(where(), "type"))
        tid = self.type_table.id(vt)
        if key is not None:
            self.type_keys[key] = tid
        return tid

    def _op(self, i: int, op: Any) -> None:
        if not self.wanted(_C_OP_DEFS):
            return
        try:
            if type(op) is not dict:
                expect_object(op, f"ops[{i}]", "an op")
            if not op.keys() <= _OP_KEYSET:
                check_keys(op, OP_KEYS, f"ops[{i}]")
            outs = op.get("outputs", [])
            if type(outs) is not list:
                expect_array(outs, f"ops[{i}].outputs", "the op's outputs")
            defs = self.defs["ops"]
            for j, d in enumerate(outs):
                self._def(defs, d, lambda j=j: f"ops[{i}].outputs[{j}]")
        except BadJson as exc:
            self.keep((_C_OP_DEFS, i), exc)
            return
        self.n_ops += 1
        self.op_ndef.append(len(outs))
        index = op.get("index", _NONE)
        if index is not _NONE and self.wanted(_C_OP_INDEX):
            try:
                index = expect_int(index, f"ops[{i}].index", "an op index", 0)
            except BadJson as exc:
                self.keep((_C_OP_INDEX, i), exc)
        if type(index) is not int:
            index = _NONE
        elif index >= _BIG:
            self.big_index[i] = index
            index = _BIG
        self.op_index.append(index)
        if self.wanted(_C_OPS):
            self._op_checks(i, op, outs)

    def _op_checks(self, i: int, op: dict[str, Any], outs: list[Any]) -> None:
        """The checks of one op that need no other part of the document (kind, inputs, attrs, ...)."""
        path = ""
        rank, j = _R_KIND, 0
        kind, version, aid, n_in = -1, _NONE, -1, 0
        try:
            kind_name = op.get("op")
            opdef = self.opdefs.get(kind_name) if type(kind_name) is str else None
            if opdef is None:
                path = f"ops[{i}]"
                if "op" not in op:
                    raise BadJson(path, "missing key 'op' (the op kind's name)")
                kind_name = expect_str(op["op"], f"{path}.op", "an op kind name")
                try:
                    opdef = self.opdefs[kind_name] = get_op(kind_name)
                except KeyError:
                    raise BadJson(f"{path}.op", unknown_op_message(kind_name)) from None
            kind = opdef.id
            if "id" in op:
                rank = _R_ID
                kid = op["id"]
                if type(kid) is not int or kid != kind:
                    path = f"ops[{i}]"
                    kid = expect_int(kid, f"{path}.id", "an op kind id")
                    raise BadJson(f"{path}.id", f"kind id {kid} disagrees with op {kind_name!r} (id {opdef.id})")
            rank = _R_INPUTS
            ins = op.get("inputs", _NO_REFS)
            if type(ins) is not list:
                j = -1
                expect_array(ins, f"ops[{i}].inputs", "the op's inputs")
            codes, names = self.in_codes, self.names
            for j, ref in enumerate(ins):
                if type(ref) is not str:
                    raise BadJson(f"ops[{i}].inputs[{j}]",
                                  f"expected a value ref (a string like \"%x\"), got {short_repr(ref)}")
                codes.append(_ref_code(ref, names))
                n_in += 1
            rank, j = _R_ATTRS, 0
            aid = self._attrs(op.get("attrs", _EMPTY), opdef, i)
            rank = _R_VERSION
            if "version" in op:
                v = op["version"]
                if type(v) is not int or not INT32[0] <= v <= INT32[1]:
                    expect_int(v, f"ops[{i}].version", "a version", *INT32)
                version = v
            rank = _R_NAME
            if "name" in op:
                self.op_names[i] = expect_str(op["name"], f"ops[{i}].name", "a name")
            rank = _R_DESCRIPTION
            if "description" in op:
                self.op_descriptions[i] = expect_str(op["description"], f"ops[{i}].description", "a description")
        except BadJson as exc:
            self.keep((_C_OPS, i, rank, j), exc)
        self.op_kind.append(kind)
        self.op_version.append(version)
        self.op_attr.append(aid)
        self.op_nin.append(n_in)
        self.checked_ops += 1

    def _attrs(self, obj: Any, opdef: OpDef, i: int) -> int:
        """The attribute-table id of an op's attributes (checked once per distinct spelling and kind)."""
        try:
            key = (opdef.id, _spelling(obj))
        except TypeError:  # not JSON data (from_json_dict): check it every time
            key = None
        if key is not None:
            hit = self.attr_keys.get(key)
            if hit is not None:
                return hit
        attrs = _read_attrs(obj, opdef, f"ops[{i}].attrs")
        deferred = any(has_ref(v) for _, v in attrs)
        ek = exact_key(swap_refs(attrs, _ref_key) if deferred else attrs)
        aid = self.attr_ids.get(ek)
        if aid is None:
            aid = self.attr_ids[ek] = len(self.attrs)
            self.attrs.append(attrs)
            if deferred:
                self.deferred[aid] = (opdef, i, isinstance(obj, dict) and set(obj) == set(opdef.attrs))
        if key is not None:
            self.attr_keys[key] = aid
        return aid

    # -------------------------------------------------------------- the graph
    def graph(self, source: str, verify: bool) -> Graph:
        """Check what needs the whole document, then build (and verify) the Graph."""
        doc = expect_object(self.top, "", "an opgraph document")
        check_keys(doc, TOP_KEYS, "")
        if doc.get("format") != FORMAT:
            raise BadJson("format", f"not an opgraph JSON graph: \"format\" is {short_repr(doc.get('format'))}, "
                                    f"expected \"{FORMAT}\"")
        version = doc.get("version")
        if type(version) is not int or version not in (VERSION_PLAIN, VERSION):
            raise BadJson("version", f"unsupported version {short_repr(version)}; this opgraph reads versions "
                                     f"{VERSION_PLAIN} to {VERSION}")
        if "subgraphs" in doc:
            if version < 2:
                raise BadJson("subgraphs", "subgraph records need version 2")
            self.bodies = _read_bodies(doc["subgraphs"], source, verify)
        if self.problem is not None and self.problem[0][0] <= _C_OP_DEFS:
            raise self.problem[1]
        constants = self.constants

        # Value definitions: inputs first, then op outputs in file order.
        di, do = self.defs["inputs"], self.defs["ops"]
        n_inputs = len(di.code)
        code = np.concatenate([np.frombuffer(di.code, np.int64), np.frombuffer(do.code, np.int64)])
        explicit = np.concatenate([np.frombuffer(di.number, np.int64), np.frombuffer(do.number, np.int64)])
        def_type = np.concatenate([np.frombuffer(di.type, np.int32), np.frombuffer(do.type, np.int32)])
        def_ptr = np.zeros(self.n_ops + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(self.op_ndef, np.int32), out=def_ptr[1:])

        def def_path(k: int) -> str:
            if k < n_inputs:
                return f"inputs[{k}]"
            i = int(np.searchsorted(def_ptr, k - n_inputs, side="right")) - 1
            return f"ops[{i}].outputs[{k - n_inputs - int(def_ptr[i])}]"

        big = {**di.big, **{n_inputs + k: v for k, v in do.big.items()}}
        numbers = _assign_numbers(explicit, def_path, "value", big)
        n_vals = len(numbers)
        named = np.flatnonzero(code < 0)
        name_ids = -1 - code[named]
        uniq, first = np.unique(name_ids, return_index=True)
        if len(uniq) != len(name_ids):
            again = np.ones(len(name_ids), dtype=bool)
            again[first] = False
            k = int(np.flatnonzero(again)[0])
            earlier = int(named[first[np.searchsorted(uniq, name_ids[k])]])
            raise BadJson(key_path(def_path(int(named[k])), "value"),
                          f"ref {self._ref(int(code[named[k]]))!r} is defined twice (first at {def_path(earlier)})")
        name_number = np.full(len(self.names), -1, dtype=np.int64)
        name_number[uniq] = numbers[named[first]]
        missing = np.flatnonzero(def_type[:n_inputs] < 0)
        if len(missing):
            raise BadJson(def_path(int(missing[0])), "an input needs a 'type'")

        # Op numbers.
        if self.problem is not None and self.problem[0][0] <= _C_OP_INDEX:
            raise self.problem[1]
        index = np.frombuffer(self.op_index, np.int64)
        op_number = _assign_numbers(np.where(index == _NONE, -1, index), lambda i: f"ops[{i}].index", "op",
                                    self.big_index) if (index != _NONE).any() else np.arange(self.n_ops, dtype=np.int64)

        # The ops' own checks, input refs and inferred types: the first problem in file order.
        value_type = np.full(n_vals, -1, dtype=np.int32)
        value_type[numbers] = def_type
        self._resolve_bodies()
        ins = self._resolve_inputs(n_vals, name_number)
        self._infer_all(n_vals, n_inputs, numbers, def_ptr, value_type, ins)
        if self.problem is not None:
            raise self.problem[1]

        # Outputs and updates.
        def resolve(ref: Any, path: str) -> int:
            if not isinstance(ref, str):
                raise BadJson(path, f"expected a value ref (a string like \"%x\"), got {short_repr(ref)}")
            v = self._number(ref, n_vals, name_number)
            if v < 0:
                raise BadJson(path, f"unknown value ref {ref!r}")
            return v

        outputs = [resolve(r, f"outputs[{i}]") for i, r in enumerate(expect_array(doc.get("outputs", []), "outputs",
                                                                                   "the outputs"))]
        updates = [[resolve(s, f"updates[{i}][0]"), resolve(d, f"updates[{i}][1]")]
                   for i, (s, d) in enumerate(expect_pairs(doc.get("updates", []), "updates", 2, "the updates"))]

        # Symbols.
        descriptions = self.descriptions
        # (in the order of the definitions, as a loop over them gives)
        ref_of = {c: r for r, c in self.names.items()}
        given_names = {k: ref_of[c][1:] for k, c in zip(named.tolist(), code[named].tolist(), strict=True)}
        given_names.update({k: name for k, name in di.names.items()})
        given_names.update({n_inputs + k: name for k, name in do.names.items()})
        value_names = {int(numbers[k]): given_names[k] for k in sorted(given_names)}
        op_names = {int(op_number[i]): name for i, name in self.op_names.items()}
        for i, text in self.op_descriptions.items():
            descriptions[("op", int(op_number[i]))] = text
        for base, defs in ((0, di), (n_inputs, do)):
            for k, text in defs.descriptions.items():
                descriptions[("value", int(numbers[base + k]))] = text
        const_names = self.const_names
        io_names: dict[int, str] = {}
        if "symbols" in doc:
            sym = expect_object(doc["symbols"], "symbols", "the symbols")
            check_keys(sym, SYMBOL_KEYS, "symbols")
            for key, table in (("values", value_names), ("ops", op_names), ("constants", const_names),
                               ("io", io_names)):
                rows = expect_pairs(sym.get(key, []), f"symbols.{key}", 2, "[index, name] pairs")
                for i, (k, name) in enumerate(rows):
                    k = expect_int(k, f"symbols.{key}[{i}][0]", "an index")
                    if k in table:
                        raise BadJson(f"symbols.{key}[{i}]", f"{key} {k} is named twice")
                    table[k] = expect_str(name, f"symbols.{key}[{i}][1]", "a name")
            for i, (kind, k, text) in enumerate(expect_pairs(sym.get("descriptions", []), "symbols.descriptions", 3,
                                                             "[kind, index, text] triples")):
                key = (expect_str(kind, f"symbols.descriptions[{i}][0]", "a kind"),
                       expect_int(k, f"symbols.descriptions[{i}][1]", "an index"))
                if key in descriptions:
                    raise BadJson(f"symbols.descriptions[{i}]", f"{key} is described twice")
                descriptions[key] = expect_str(text, f"symbols.descriptions[{i}][2]", "a description")
        file_meta: dict[str, Any] = {}
        if "file_meta" in doc:
            for key, value in expect_object(doc["file_meta"], "file_meta", "the file metadata").items():
                file_meta[key] = dec_value(value, key_path("file_meta", key))

        # Columnar arrays, with the tables in the order of first use (by value, by op).
        untyped = np.flatnonzero(value_type < 0)
        if len(untyped):
            raise BadJson(def_path(int(np.flatnonzero(numbers == untyped[0])[0])), "missing 'type'")
        types, value_type = _first_use(value_type, self.types)
        position = np.argsort(op_number) if self.n_ops else np.zeros(0, np.int64)  # file position of op k
        kinds = np.frombuffer(self.op_kind, np.int32)[position]
        versions = np.frombuffer(self.op_version, np.int64)[position]
        attrs_table, op_attr = _first_use(np.frombuffer(self.op_attr, np.int32)[position], self.attrs)
        n_in = np.frombuffer(self.op_nin, np.int32)
        in_ptr, in_ids = _permute_csr(n_in, ins, position)
        ndef = np.frombuffer(self.op_ndef, np.int32)
        out_ptr, out_ids = _permute_csr(ndef, numbers[n_inputs:], position)
        value_producer = np.full(n_vals, -1, dtype=np.int32)
        value_index = np.zeros(n_vals, dtype=np.int32)
        n_out = np.diff(out_ptr)
        value_producer[out_ids] = np.repeat(np.arange(self.n_ops, dtype=np.int32), n_out)
        value_index[out_ids] = np.arange(len(out_ids)) - np.repeat(out_ptr[:-1], n_out)
        graph = Graph(
            op_kind=kinds, op_attr=op_attr, op_version=versions, in_ptr=in_ptr, in_ids=in_ids,
            out_ptr=out_ptr, out_ids=out_ids, value_type=value_type, value_producer=value_producer,
            value_index=value_index, types=types, attrs=attrs_table, constants=constants,
            inputs=numbers[:n_inputs], outputs=outputs, updates=updates,
            symbols=Symbols(value_names, op_names, const_names, descriptions, io_names),
            file_meta=file_meta,
        )
        # Only the graph and what names a problem's place stay for verification.
        del kinds, versions, op_attr, in_ids, out_ids, value_producer, value_index, value_type, ins, n_in, ndef
        del code, explicit, def_type, named, name_ids, index, op_number, n_out, untyped
        self.__init__()  # type: ignore[misc]  # the arrays read from the document
        if verify:
            try:
                graph.verify()
            except VerifyError as exc:
                raise FormatError(f"{source}: {_verify_path(exc, position, numbers, def_path)}: graph fails "
                                  f"verification: {exc}") from exc
            except Exception as exc:
                raise FormatError(f"{source}: (top level): graph fails verification: "
                                  f"{type(exc).__name__}: {exc}") from exc
        return graph

    def _resolve_bodies(self) -> None:
        """Put the subgraphs in the attributes that refer to them, check those, and intern them again."""
        if not self.deferred:
            return
        n = len(self.bodies)
        for aid, (opdef, i, full) in self.deferred.items():
            path = f"ops[{i}].attrs"

            def body(ref: BodyRef, where: str) -> Subgraph:
                if ref.index >= n:
                    if self.in_body:
                        raise BadJson(where, f"subgraph {ref.index} is not a record before this one (a record "
                                             f"refers only to records before it)")
                    raise BadJson(where, f"subgraph {ref.index} is not in 'subgraphs' ({n} record(s))")
                return self.bodies[ref.index]

            try:
                attrs = tuple((k, swap_refs(v, lambda r, k=k: body(r, key_path(path, k))))
                              for k, v in self.attrs[aid])
                self.attrs[aid] = _check_attrs(attrs, opdef, path, full)
            except BadJson as exc:
                self.keep((_C_OPS, i, _R_ATTRS, 0), exc)
        # Records with equal bodies (a hand-written file) make equal entries: one id each again.
        ids: dict[Any, int] = {}
        table: list[tuple[tuple[str, Any], ...]] = []
        lut = np.empty(len(self.attrs), dtype=np.int32)
        for aid, attrs in enumerate(self.attrs):
            try:
                key = exact_key(attrs)
            except TypeError:  # unresolved (a problem is kept): stays apart
                key = ("unresolved", aid)
            lut[aid] = ids.setdefault(key, len(table))
            if lut[aid] == len(table):
                table.append(attrs)
        if len(table) != len(self.attrs):
            self.attrs = table
            self.op_attr = array("i", lut[np.frombuffer(self.op_attr, np.int32)].tobytes())
        self.deferred = {}

    def _ref(self, code: int) -> str:
        if code >= 0:
            return f"%{code}"
        return next(r for r, c in self.names.items() if c == code)

    def _number(self, ref: str, n_vals: int, name_number: np.ndarray) -> int:
        """The value number of a ref, -1 if it names no value."""
        if _numeric_ref(ref):
            v = int(ref[1:])
            return v if v < n_vals else -1
        code = self.names.get(ref)
        return -1 if code is None else int(name_number[-1 - code])

    def _resolve_inputs(self, n_vals: int, name_number: np.ndarray) -> np.ndarray:
        """The input refs of the checked ops as value numbers; keeps the first unknown ref as a problem."""
        codes = np.frombuffer(self.in_codes, np.int64)
        if not len(codes) or (int(codes.min()) >= 0 and int(codes.max()) < n_vals):
            return codes  # numbers only, all in range
        ins = np.where(codes >= 0, codes, name_number[np.clip(-1 - codes, 0, len(name_number) - 1)]
                       if len(name_number) else -1)
        bad = np.flatnonzero((ins < 0) | (ins >= n_vals))
        if len(bad):
            k = int(bad[0])
            ptr = np.zeros(len(self.op_nin) + 1, dtype=np.int64)
            np.cumsum(np.frombuffer(self.op_nin, np.int32), out=ptr[1:])
            i = int(np.searchsorted(ptr, k, side="right")) - 1
            j = k - int(ptr[i])
            self.keep((_C_OPS, i, _R_INPUTS, j), BadJson(f"ops[{i}].inputs[{j}]",
                                                         f"unknown value ref {self._ref(int(codes[k]))!r}"))
        return ins

    def _infer_all(self, n_vals: int, n_inputs: int, numbers: np.ndarray, def_ptr: np.ndarray,
                   value_type: np.ndarray, ins: np.ndarray) -> None:
        """Types and versions a hand-written file leaves out, from the type rules, in file order."""
        checked = self.checked_ops
        version = np.frombuffer(self.op_version, np.int64)
        def_type = np.frombuffer(self.defs["ops"].type, np.int32)
        lacks = np.zeros(checked, dtype=bool)
        lacks |= version[:checked] == _NONE
        untyped = np.flatnonzero(def_type < 0)
        if len(untyped):
            at = np.unique(np.searchsorted(def_ptr, untyped, side="right") - 1)
            lacks[at[at < checked]] = True
        todo = np.flatnonzero(lacks)
        if not len(todo):
            return
        in_ptr = np.zeros(checked + 1, dtype=np.int64)
        np.cumsum(np.frombuffer(self.op_nin, np.int32), out=in_ptr[1:])
        kinds, attr_ids = self.op_kind, self.op_attr
        for i in todo.tolist():
            if self.problem is not None and (_C_OPS, i, _R_INFER) > self.problem[0]:
                return  # an earlier problem is reported
            opdef = get_op(kinds[i])
            outs = numbers[n_inputs + def_ptr[i]:n_inputs + def_ptr[i + 1]]
            try:
                out_types, v = _infer(opdef, self.attrs[attr_ids[i]], ins[in_ptr[i]:in_ptr[i + 1]].tolist(),
                                      value_type, self.types, self.constants, f"ops[{i}]", self._ref, self.in_codes,
                                      int(in_ptr[i]))
                if version[i] == _NONE:
                    self.op_version[i] = v
                missing = [j for j in range(len(outs)) if def_type[def_ptr[i] + j] < 0]
                if missing:
                    if len(out_types) != len(outs):
                        raise BadJson(f"ops[{i}].outputs", f"{opdef.name} gives {len(out_types)} output(s), "
                                                           f"the file lists {len(outs)}")
                    for j in missing:
                        value_type[outs[j]] = self.type_table.id(out_types[j])
            except BadJson as exc:
                self.keep((_C_OPS, i, _R_INFER), exc)
                return



class _Defs:
    """Value definitions in compact arrays: ref code, explicit number (-1: none), type id (-1: none)."""

    __slots__ = ("big", "code", "descriptions", "names", "number", "type")

    def __init__(self) -> None:
        self.big: dict[int, int] = {}  # numbers from _BIG on, by definition
        self.code = array("q")
        self.number = array("q")
        self.type = array("i")
        self.names: dict[int, str] = {}  # explicit names (of "%<number>" values), by definition
        self.descriptions: dict[int, str] = {}


def _ref_key(ref: BodyRef) -> str:
    return f"\0subgraph {ref.index}"  # no attribute value is spelled so (interning before bodies are known)


def _read_bodies(raw: Any, source: str, verify: bool) -> list[Subgraph]:
    """The records of ``subgraphs``, in order; each may refer only to the records before it."""
    records = expect_array(raw, "subgraphs", "the subgraph records")
    bodies: list[Subgraph] = []
    for k, rec in enumerate(records):
        path = f"subgraphs[{k}]"
        rec = expect_object(rec, path, "a subgraph record (a graph with a 'name')")
        check_keys(rec, BODY_KEYS, path)
        name = expect_str(rec.get("name", ""), f"{path}.name", "a name")
        sub = Doc()
        sub.bodies, sub.in_body = list(bodies), True
        sub.feed({"format": FORMAT, "version": VERSION, **{key: v for key, v in rec.items() if key != "name"}})
        try:
            graph = sub.graph(f"{source}: {path}", verify)
        except BadJson as exc:
            inner = exc.path
            raise BadJson(f"{path}{inner if inner.startswith('[') else '.' + inner}" if inner else path,
                          exc.message) from None
        bodies.append(Subgraph(graph, name=name))
    return bodies


_STREAMED_MARK = object()
"""Stands for an array of inputs, constants or ops that was read element by element."""
_EMPTY: dict[str, Any] = {}
_NO_REFS: list[Any] = []


def _spelling(x: Any) -> Any:
    """A hashable key that tells apart every JSON value (``1``, ``1.0``, ``true``; key order)."""
    t = type(x)
    # (loops, not comprehensions: one Python frame per level of nesting, which MAX_DEPTH bounds)
    if t is dict:
        items: list[Any] = [dict]
        for k, v in x.items():
            items.append((k, _spelling(v)))
        return tuple(items)
    if t is list:
        items = [list]
        for v in x:
            items.append(_spelling(v))
        return tuple(items)
    if t is float:
        return (float, x.hex())
    hash(x)
    return (t, x)


def _first_use(ids: np.ndarray, table: list[Any]) -> tuple[list[Any], np.ndarray]:
    """Renumber table ids in the order of their first use (the order a loop interning them gives)."""
    if not len(ids):
        return [], ids.astype(np.int32)
    uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    return [table[int(t)] for t in uniq[order]], rank[inverse]


def _permute_csr(counts: np.ndarray, ids: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR rows given in file order, reordered so that row k is the one at file position ``position[k]``."""
    ptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    if len(position) and not np.array_equal(position, np.arange(len(position))):
        out_counts = counts[position]
        ids = ids[ranges(ptr[:-1][position], ptr[:-1][position] + out_counts)]
        np.cumsum(out_counts, out=ptr[1:])
    return ptr, ids


def from_json_dict(obj: Any, *, source: str = "<json>", verify: bool = True) -> Graph:
    """Build the :class:`Graph` a JSON document describes (inverse of :func:`to_json_dict`).

    Raises :class:`~opgraph.errors.FormatError` naming ``source`` and the JSON
    path of the first problem; the graph is verified unless ``verify=False``.

    >>> g = from_json_dict({"format": "opgraph", "version": 1,
    ...     "inputs": [{"value": "%x", "type": {"dtype": "float64", "shape": [2]}}],
    ...     "ops": [{"op": "exp", "inputs": ["%x"], "outputs": [{"value": "%y"}]}],
    ...     "outputs": ["%y"]})
    >>> print(g)
    graph(%x: f64[2]) {
      %y: f64[2] = exp(%x)
      return %y
    }
    >>> from_json_dict({"format": "opgraph", "version": 1, "ops": [{"op": "exp", "inputs": ["%q"]}]})
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: <json>: ops[0].inputs[0]: unknown value ref '%q'

    A document nested more than :data:`~opgraph.io.jsonfmt.MAX_DEPTH` levels deep is
    refused (as the same text would be) before anything walks it.
    """
    deep = too_deep(obj, "", MAX_DEPTH)
    if deep is not None:
        raise FormatError(f"{source}: {where_of(deep.path)}: {deep.message}")
    doc = Doc()
    doc.feed(obj)
    try:
        return doc.graph(source, verify)
    except BadJson as exc:
        raise FormatError(f"{source}: {where_of(exc.path)}: {exc.message}") from None


def _verify_path(exc: VerifyError, position: np.ndarray, numbers: np.ndarray, def_path: Callable[[int], str]) -> str:
    """The JSON path of the first op (in file order) or value that verification problems name."""
    ops = [int(m.group(1)) for p in exc.problems if (m := re.match(r"op (\d+)", p))]
    ops = [int(position[op]) for op in ops if op < len(position)]
    if ops:
        return f"ops[{min(ops)}]"
    for p in exc.problems:
        m = re.match(r"value (\d+)", p)
        if m:
            hit = np.flatnonzero(numbers == int(m.group(1)))
            if len(hit):
                return def_path(int(hit[0]))
    return "(top level)"


def _read_attrs(obj: Any, opdef: OpDef, path: str) -> tuple[tuple[str, Any], ...]:
    """An op's attributes; those that refer to subgraph records are checked later (:meth:`Doc._resolve_bodies`)."""
    obj = expect_object(obj, path, "the op's attributes")
    if not obj and not opdef.attrs:
        return ()
    decoded = tuple((k, dec_value(v, key_path(path, k), True)) for k, v in obj.items())
    if any(has_ref(v) for _, v in decoded):
        for k, _ in decoded:
            if k not in opdef.attrs:
                raise BadJson(key_path(path, k), f"{opdef.name} has no attribute {k!r} "
                                                 f"(it takes {', '.join(opdef.attrs) or 'none'})")
        return decoded
    return _check_attrs(decoded, opdef, path, set(obj) == set(opdef.attrs))


def _check_attrs(decoded: tuple[tuple[str, Any], ...], opdef: OpDef, path: str,
                 full: bool) -> tuple[tuple[str, Any], ...]:
    for k, v in decoded:
        spec = opdef.attrs.get(k)
        if spec is None:
            raise BadJson(key_path(path, k), f"{opdef.name} has no attribute {k!r} "
                                             f"(it takes {', '.join(opdef.attrs) or 'none'})")
        try:
            spec.normalise(v)
        except Exception as exc:
            raise BadJson(key_path(path, k), f"{opdef.name}: invalid value {v!r}: {exc}") from None
    try:
        normalised = opdef.normalise_attrs(dict(decoded))
    except Exception as exc:
        raise BadJson(path, f"{opdef.name}: {exc}") from None
    # Kept exactly as written when every attribute is given (the writer's case);
    # attributes left out (hand-written files) take their defaults.
    return decoded if full else normalised


def _infer(opdef: OpDef, attrs: tuple[tuple[str, Any], ...], ins: list[int], value_type: np.ndarray,
           types: list[ValueType], constants: list[np.ndarray], path: str, ref: Callable[[int], str],
           codes: Any, first: int) -> tuple[tuple[ValueType, ...], int]:
    attr_dict = dict(attrs)
    if opdef is CONST:
        idx = attr_dict.get("index")
        if not (type(idx) is int and 0 <= idx < len(constants)):
            raise BadJson(f"{path}.attrs.index", f"constant index {idx!r} is not in the constants table")
        return (TensorType.of(constants[idx]),), 0
    in_types = []
    for j, v in enumerate(ins):
        t = int(value_type[v])
        if t < 0:
            raise BadJson(f"{path}.inputs[{j}]", f"the type of {ref(codes[first + j])} is not known here; give the "
                                                 f"op's output types and version, or list the ops in topological order")
        in_types.append(types[t])
    try:
        opdef.check_arity(len(in_types))
        out = tuple(opdef.infer(tuple(in_types), attr_dict))
        version = int(opdef.version(tuple(in_types), attr_dict))
    except Exception as exc:
        raise BadJson(path, f"{opdef.name}: type rule rejects inputs {tuple(in_types)}: {exc}") from None
    return out, version


def loads_json(text: str | bytes, *, source: str = "<string>", verify: bool = True) -> Graph:
    """Parse JSON text (as written by :func:`dumps_json`) into a verified Graph.

    Bytes are decoded a window at a time and the big arrays are read element by
    element, so memory stays a small multiple of the graph, not of the text.

    >>> loads_json('{"format": "opgraph", "version": 3}')
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: <string>: version: unsupported version 3; this opgraph reads versions 1 to 2
    >>> loads_json('{"format": ')
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: <string>: malformed JSON at line 1 column 12 (byte offset 11): Expecting value; ...
    """
    return _load(text, source, verify)


def _load(source_data: str | bytes | BinaryIO, source: str, verify: bool) -> Graph:
    doc = Doc()
    text = Text(source_data, SCANNER)
    with paused_gc(), progress.task(f"loading {source}: parsing JSON (bytes)",
                                    total=progress.byte_size(source_data)) as text.tick:
        try:
            try:
                stream_document(text, doc)
            except (Malformed, BadJson, RecursionError, ValueError):
                text.check_rest()  # text that is not UTF-8 is reported first, wherever it is
                raise
        except NotUtf8 as exc:
            cut = ": the file ends inside a character, it looks truncated" if exc.at_end else ""
            raise FormatError(f"{source}: not UTF-8 text (byte {exc.byte}){cut}") from None
        except Malformed as exc:
            raise FormatError(f"{source}: {exc}") from None
        except BadJson as exc:
            raise FormatError(f"{source}: {exc.message}") from None
        except RecursionError:
            raise FormatError(f"{source}: malformed JSON: nested too deeply") from None
        except ValueError as exc:  # e.g. an integer with too many digits
            raise FormatError(f"{source}: malformed JSON: {exc}") from None
        try:
            with progress.task(f"loading {source}: building the graph"):
                return doc.graph(source, verify)
        except BadJson as exc:
            raise FormatError(f"{source}: {where_of(exc.path)}: {exc.message}") from None


def load_json(path: str | os.PathLike[str], *, verify: bool = True) -> Graph:
    """Read a graph written by :func:`save_json`; never executes code.

    The file is read a window at a time. Raises
    :class:`~opgraph.errors.FormatError` naming the file and the JSON path of
    the problem (``OSError`` when the file cannot be read).

    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "bad.json")
    >>> _ = open(p, "w").write('{"format": "opgraph", "version": 1, "ops": [{"op": "frobnicate"}]}')
    >>> load_json(p)
    Traceback (most recent call last):
    ...
    opgraph.errors.FormatError: .../bad.json: ops[0].op: unknown op kind 'frobnicate': it is not a built-in op; ...
    """
    with open(path, "rb") as f:
        return _load(f, os.fspath(path), verify)
