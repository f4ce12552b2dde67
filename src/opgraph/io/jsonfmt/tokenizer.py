"""The streaming JSON tokenizer: reads the text a window at a time, as ``json.loads`` would (same errors)."""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from opgraph.core import progress
from opgraph.io.jsonfmt.encoding import MAX_DEPTH, BadJson

if TYPE_CHECKING:  # the reader imports this module: only the annotation needs Doc
    from opgraph.io.jsonfmt.reader import Doc


# ----------------------------------------------------------------------------- reading: the text
class Malformed(Exception):
    """A JSON syntax problem (malformed JSON), with its line and column."""


class Depth:
    r"""The nesting depth of JSON text fed a piece at a time, measured without parsing it (no recursion).

    ``feed(piece)`` takes the next UTF-8 bytes of the text and returns the index in
    ``piece`` of the ``[`` or ``{`` that opens level ``limit + 1`` (-1 if none does).
    Brackets inside strings (escaped quotes included) do not count; the state (depth,
    inside a string, a pending backslash) carries over from piece to piece. On a text
    that is valid JSON up to a point, the depth counted there is exactly the parser's.

    >>> d = Depth(4)
    >>> d.feed(b'[["[[[", {"a": [1, '), d.feed(b'2, {"x": 0}]}]]')
    (-1, 3)
    >>> d = Depth(2)
    >>> d.feed(b'[["\\'), d.feed(b'"[[", "\\\\"], "]"]'), d.max_depth
    (-1, -1, 2)
    """

    def __init__(self, limit: int = MAX_DEPTH) -> None:
        self.limit = limit
        self.depth = 0
        self.max_depth = 0
        self.in_string = False
        self.escape = False  # the piece ended in an odd run of backslashes

    def feed(self, piece: bytes) -> int:
        if self.escape or b"\\" in piece:
            return self._feed_escaped(piece)
        # No backslash: every quote opens or closes a string. Only quotes and brackets matter.
        c = np.frombuffer(piece.translate(None, _NOT_STRUCTURE), np.uint8)
        if not len(c):
            return -1
        steps = _STEP[c]
        quotes = c == 34
        n_quotes = int(np.count_nonzero(quotes))
        if n_quotes:
            inside = (np.cumsum(quotes, dtype=np.int32) + self.in_string) & 1  # (a closing quote: no bracket)
            steps[inside.astype(np.bool_)] = 0
        elif self.in_string:
            return -1  # all of it inside one string
        depth = np.cumsum(steps, dtype=np.int32)
        top = self.depth + int(depth.max())
        if top > self.limit:  # where: the structural character's place in the piece
            j = int(np.argmax(depth > self.limit - self.depth))
            self.max_depth = self.limit + 1
            return int(np.flatnonzero(_STRUCTURE[np.frombuffer(piece, np.uint8)])[j])
        self.max_depth = max(self.max_depth, top)
        self.depth += int(depth[-1])
        self.in_string = bool((n_quotes + self.in_string) & 1)
        return -1

    def _feed_escaped(self, piece: bytes) -> int:
        """The general case: quotes preceded by an odd run of backslashes are escaped."""
        shift = 1 if self.escape else 0
        data = b"\\" + piece if shift else piece
        a = np.frombuffer(data, np.uint8)
        quotes = np.flatnonzero(a == 34)
        if len(quotes):
            backslash = a == 92
            last_other = np.maximum.accumulate(np.where(backslash, -1, np.arange(len(a), dtype=np.int64)))
            before = quotes - 1
            run = np.where(before >= 0, before - last_other[np.maximum(before, 0)], 0)
            quotes = quotes[run % 2 == 0]
        tail = len(data) - len(data.rstrip(b"\\"))
        steps = _STEP[a]
        at = np.flatnonzero(steps)
        outside = (np.searchsorted(quotes, at) + self.in_string) % 2 == 0
        at = at[outside]
        depth = self.depth + np.cumsum(steps[at], dtype=np.int64)
        self.escape = tail % 2 == 1
        self.in_string = bool((len(quotes) + self.in_string) % 2)
        if len(depth):
            over = np.flatnonzero(depth > self.limit)
            if len(over):
                self.max_depth = self.limit + 1
                return int(at[over[0]]) - shift
            self.max_depth = max(self.max_depth, int(depth.max()))
            self.depth = int(depth[-1])
        return -1


_STEP = np.zeros(256, np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_STRUCTURE = np.zeros(256, np.bool_)
_STRUCTURE[list(b'[]{}"')] = True


_WINDOW = 1 << 20
"""Characters (bytes) read at a time from a file."""
_MARGIN = 16
"""A parse that ends this close to the end of the window is tried again with more text."""
_WS = re.compile(r"[ \t\n\r]*").match
_SCAN = json.decoder.scanstring
_TRAILING_COMMA = sys.version_info >= (3, 13)  # json names a trailing comma from 3.13 on
_INCOMPLETE = re.compile("|".join([
    r"-?\d*(?:\.\d*)?(?:[eE][-+]?\d*)?",  # nothing left, or what is left of a number cut short ("1.", "e-", "-")
    *(re.escape(w[:k]) for w in ("true", "false", "null", "NaN", "Infinity", "-Infinity") for k in range(1, len(w))),
]))
"""What may follow a JSON error at the end of the text when the text was cut short: a token's first part."""


class Text:
    """JSON text read a window at a time, so that no more than a window and one element are in memory.

    ``source`` is a str (used as it is), bytes or a binary file (decoded as UTF-8, a
    window at a time). Positions in messages are those of the whole text.
    """

    def __init__(self, source: str | bytes | bytearray | BinaryIO, scan: Callable[[str, int], Any],
                 max_depth: int = MAX_DEPTH) -> None:
        self.scan = scan
        self.i = 0  # position in buf
        self.off = 0  # position of buf[0] in the text
        self.lines = 0  # newlines before buf[0]
        self.last_nl = -1  # position of the last newline before buf[0]
        self._pending = b""  # bytes of a character cut by the window
        self._byte = 0  # bytes decoded so far (after a BOM)
        self._chars = 0  # characters decoded so far
        self._failed: str | None = None
        self.tick: Any = progress.NO_TASK  # the load's progress task, reported once per window
        # Nesting is measured before the parser (which recurses) sees the text: the text is cut
        # where it opens level max_depth + 1, and a parse that reaches the cut reports it.
        self._depth = Depth(max_depth)
        self.deep: tuple[int, int, str] | None = None  # (cut, errors from here on are the cut's, "byte N")
        if isinstance(source, str):
            self._bom = 3 if source.startswith("\ufeff") else 0  # the BOM's UTF-8 bytes, counted in byte offsets
            self.buf = source[1:] if self._bom else source
            self.eof = self._final = True
            self._file: Any = None
            self._measure_str()
            return
        self.buf = ""
        self.eof = self._final = False
        self._file = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
        head = self._file.read(3)
        self._bom = 3 if head == b"\xef\xbb\xbf" else 0
        self._pending = head[3:] if self._bom else head

    def _measure_str(self) -> None:
        buf = self.buf
        for lo in range(0, len(buf), _WINDOW):
            piece = buf[lo:lo + _WINDOW].encode("utf-8", "surrogatepass")
            k = self._depth.feed(piece)
            if k >= 0:
                at = lo + len(piece[:k].decode("utf-8", "surrogatepass"))
                self._cut(0, buf[:at], f"character offset {at}")
                self.buf = buf[:at]
                return

    def _cut(self, start: int, text: str, where: str) -> str:
        """End the text after ``text`` (which starts at ``start``): the bracket that is too deep comes next."""
        self.deep = (start + len(text), start + len(text.rstrip(" \t\n\r")), where)
        self.eof = True
        return text

    # -------------------------------------------------------------- windows
    def _decode(self) -> str:
        """The next window of text ('' at the end)."""
        raw = self._pending + self._file.read(_WINDOW)
        final = len(raw) == len(self._pending)
        cut = len(raw)
        if not final:  # keep a character the window cuts in two for the next one
            k = cut - 1
            while k >= 0 and cut - k < 4 and raw[k] & 0xC0 == 0x80:
                k -= 1
            if k >= 0 and raw[k] >= 0xC0 and cut - k < (2 if raw[k] < 0xE0 else 3 if raw[k] < 0xF0 else 4):
                cut = k
        try:
            text = raw[:cut].decode("utf-8")
        except UnicodeDecodeError as exc:
            # Only the last window can end inside a character: the text stops in the middle of one.
            raise NotUtf8(self._bom + self._byte + exc.start,
                          final and exc.reason == "unexpected end of data") from None
        if self.deep is None:
            k = self._depth.feed(raw[:cut])
            if k >= 0:
                text = self._cut(self._chars, raw[:k].decode("utf-8"), f"byte offset {self._byte + k}")
            self._chars += len(text)
        else:
            text = ""  # past the cut: only checked to be UTF-8
        self._byte += cut
        self.tick.advance(cut)
        self._pending = raw[cut:]
        if final:
            self.eof = self._final = True
        return text

    def _more(self) -> None:
        """Drop what is read and append the next window (at least doubling what is left)."""
        self._drop()
        parts = [self.buf]
        size = len(self.buf)
        while not self.eof and size < max(_WINDOW, 2 * len(self.buf)):
            part = self._decode()
            parts.append(part)
            size += len(part)
        self.buf = "".join(parts)

    def _drop(self) -> None:
        i, buf = self.i, self.buf
        if i:
            self.lines += buf.count("\n", 0, i)
            r = buf.rfind("\n", 0, i)
            if r >= 0:
                self.last_nl = self.off + r
            self.off += i
            self.buf = buf[i:]
            self.i = 0

    def check_rest(self) -> None:
        """Decode the rest of the text, which must be UTF-8 (before a syntax error is reported)."""
        while not self._final:
            self._decode()

    # -------------------------------------------------------------- tokens
    def malformed(self, msg: str, pos: int) -> Malformed:
        deep = self.deep
        if deep is not None and self.off + pos >= deep[1]:  # the parse reached the cut
            pos = deep[0] - self.off
            msg = (f"nested too deeply: this opens level {self._depth.limit + 1} of arrays and objects; opgraph "
                   f"reads at most {self._depth.limit} (opgraph.io.jsonfmt.MAX_DEPTH)")
        buf = self.buf
        line = self.lines + buf.count("\n", 0, pos) + 1
        r = buf.rfind("\n", 0, pos)
        col = pos - r if r >= 0 else self.off + pos - self.last_nl
        if deep is not None:
            where = f" ({deep[2]})" if pos == deep[0] - self.off else ""
            return Malformed(f"malformed JSON at line {line} column {col}{where}: {msg}")
        offset, end = self._offsets(pos)
        if msg.endswith(" at"):  # json's "Unterminated string starting at" expects its position after it
            text = f"malformed JSON: {msg} line {line} column {col} ({offset})"
        else:
            text = f"malformed JSON at line {line} column {col} ({offset}): {msg}"
        if self._cut_short(msg, pos):
            what = "text" if self._file is None or isinstance(self._file, io.BytesIO) else "file"
            text += f"; the {what} ends at {end}: it looks truncated"
        return Malformed(text)

    def _offsets(self, pos: int) -> tuple[str, str]:
        """The byte offsets of ``buf[pos]`` and of the end of the text read so far (in UTF-8, a str's too)."""
        if self._file is None:  # buf is the whole str
            end = self._bom + len(self.buf.encode("utf-8", "surrogatepass"))
        else:
            end = self._bom + self._byte  # buf ends where the decoded bytes end (nothing is cut when not too deep)
        return f"byte offset {end - len(self.buf[pos:].encode('utf-8', 'surrogatepass'))}", f"byte offset {end}"

    def _cut_short(self, msg: str, pos: int) -> bool:
        """True when the text ends inside the token the error is about: a truncated file, not a wrong one."""
        if not self.eof:
            return False
        if msg.startswith("Unterminated string"):  # json says so only when no closing quote follows
            return True
        return _INCOMPLETE.fullmatch(self.buf[pos:].rstrip(" \t\n\r")) is not None

    def ws(self) -> None:
        while True:
            self.i = _WS(self.buf, self.i).end()
            if self.i < len(self.buf) or self.eof:
                return
            self._more()

    def peek(self) -> str:
        """The next character ('' at the end); call after ws()."""
        return self.buf[self.i:self.i + 1]

    def at_end(self) -> bool:
        self.ws()
        return self.i >= len(self.buf)

    def value(self) -> Any:
        """Parse the JSON value at the current position."""
        return self._parse(self.scan)

    def string(self) -> str:
        """Parse the string whose opening quote is at the current position."""
        return self._parse(lambda buf, i: _SCAN(buf, i + 1, True))

    def _parse(self, fn: Callable[[str, int], tuple[Any, int]]) -> Any:
        while True:
            buf, i = self.buf, self.i
            try:
                obj, end = fn(buf, i)
            except StopIteration as exc:  # no value starts there
                msg, pos = "Expecting value", exc.value
            except json.JSONDecodeError as exc:
                msg, pos = exc.msg, exc.pos
            except (RecursionError, BadJson):
                raise
            except ValueError as exc:  # e.g. an integer with too many digits: try once more with more text
                if self.eof or self._failed == str(exc):
                    raise
                self._failed = str(exc)
                self._more()
                continue
            else:
                if self.eof or end + _MARGIN <= len(buf):  # a number could go on past the window
                    self.i = end
                    self._failed = None
                    return obj
                self._more()
                continue
            # An error far enough from the end of the window is an error of the whole text.
            if self.eof or (not msg.startswith("Unterminated string") and pos + _MARGIN < len(buf)):
                raise self.malformed(msg, pos)
            self._more()


class NotUtf8(Exception):
    def __init__(self, byte: int, at_end: bool = False) -> None:
        super().__init__(byte)
        self.byte = byte
        self.at_end = at_end  # the text stops in the middle of a character


def stream_document(text: Text, doc: Doc) -> None:
    """Parse a document, feeding ``doc`` as json.loads would build it (same errors at the same places).

    The top-level object is parsed here, and the arrays of inputs, constants and ops
    element by element; every other value is parsed whole.
    """
    text.ws()
    if text.peek() != "{":
        doc.top = text.value()
        if not text.at_end():
            raise text.malformed("Extra data", text.i)
        return
    text.i += 1
    keys: list[str] = []
    text.ws()
    c = text.peek()
    if c == "}":
        text.i += 1
    elif c != '"':
        raise text.malformed("Expecting property name enclosed in double quotes", text.i)
    else:
        while True:
            key = text.string()
            text.ws()
            if text.peek() != ":":
                raise text.malformed("Expecting ':' delimiter", text.i)
            text.i += 1
            text.ws()
            keys.append(key)
            if key in STREAMED and text.peek() == "[":
                _stream_array(text, doc.stream(key))
            else:
                doc.value(key, text.value())
            if _item_ends(text, "}"):
                break
            if text.peek() != '"':
                raise text.malformed("Expecting property name enclosed in double quotes", text.i)
    if len(set(keys)) != len(keys):
        _no_duplicates([(k, None) for k in keys])
    if not text.at_end():
        raise text.malformed("Extra data", text.i)


def _stream_array(text: Text, take: Callable[[int, Any], None]) -> None:
    """Parse the array at the current position, handing each element to ``take(index, element)``."""
    text.i += 1
    text.ws()
    if text.peek() == "]":
        text.i += 1
        return
    k = 0
    while True:
        take(k, text.value())
        k += 1
        if _item_ends(text, "]"):
            return


def _item_ends(text: Text, close: str) -> bool:
    """After an object member or array element: True past the closing ``close``, else False past the comma.

    Errors as json.loads gives them: a missing delimiter, and (where this Python's json rejects it
    with its own message) a trailing comma before ``close``.
    """
    text.ws()
    c = text.peek()
    if c == close:
        text.i += 1
        return True
    if c != ",":
        raise text.malformed("Expecting ',' delimiter", text.i)
    comma = text.i
    text.i += 1
    text.ws()
    if _TRAILING_COMMA and text.peek() == close:
        what = "object" if close == "}" else "array"
        raise text.malformed(f"Illegal trailing comma before end of {what}", comma)
    return False


STREAMED = ("inputs", "constants", "ops")


def _reject_constant(name: str) -> Any:
    raise BadJson("", f"malformed JSON: {name} is not JSON (write 'nan'/'inf' in constant data, "
                      f"{{\"float\": \"nan\"}} in attributes)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise BadJson("", f"malformed JSON: duplicate key {k!r} in an object")
            seen.add(k)
    return out


SCANNER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_no_duplicates).scan_once
