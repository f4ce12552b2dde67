"""The streaming JSON tokenizer: reads the text a window at a time, as ``json.loads`` would (same errors)."""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

from opgraph.core import progress
from opgraph.io.jsonfmt.encoding import BadJson

if TYPE_CHECKING:  # the reader imports this module: only the annotation needs Doc
    from opgraph.io.jsonfmt.reader import Doc


# ----------------------------------------------------------------------------- reading: the text
class Malformed(Exception):
    """A JSON syntax problem (malformed JSON), with its line and column."""


_WINDOW = 1 << 20
"""Characters (bytes) read at a time from a file."""
_MARGIN = 16
"""A parse that ends this close to the end of the window is tried again with more text."""
_WS = re.compile(r"[ \t\n\r]*").match
_SCAN = json.decoder.scanstring
_TRAILING_COMMA = sys.version_info >= (3, 13)  # json names a trailing comma from 3.13 on


class Text:
    """JSON text read a window at a time, so that no more than a window and one element are in memory.

    ``source`` is a str (used as it is), bytes or a binary file (decoded as UTF-8, a
    window at a time). Positions in messages are those of the whole text.
    """

    def __init__(self, source: str | bytes | bytearray | BinaryIO, scan: Callable[[str, int], Any]) -> None:
        self.scan = scan
        self.i = 0  # position in buf
        self.off = 0  # position of buf[0] in the text
        self.lines = 0  # newlines before buf[0]
        self.last_nl = -1  # position of the last newline before buf[0]
        self._pending = b""  # bytes of a character cut by the window
        self._byte = 0  # bytes decoded so far (after a BOM)
        self._failed: str | None = None
        self.tick: Any = progress.NO_TASK  # the load's progress task, reported once per window
        if isinstance(source, str):
            self.buf = source[1:] if source.startswith("\ufeff") else source
            self.eof = True
            self._file: Any = None
            return
        self.buf = ""
        self.eof = False
        self._file = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
        head = self._file.read(3)
        self._pending = head[3:] if head == b"\xef\xbb\xbf" else head

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
            raise NotUtf8(self._byte + exc.start) from None
        self._byte += cut
        self.tick.advance(cut)
        self._pending = raw[cut:]
        if final:
            self.eof = True
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
        while not self.eof:
            self._decode()

    # -------------------------------------------------------------- tokens
    def malformed(self, msg: str, pos: int) -> Malformed:
        buf = self.buf
        line = self.lines + buf.count("\n", 0, pos) + 1
        r = buf.rfind("\n", 0, pos)
        col = pos - r if r >= 0 else self.off + pos - self.last_nl
        return Malformed(f"malformed JSON at line {line} column {col}: {msg}")

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
    def __init__(self, byte: int) -> None:
        super().__init__(byte)
        self.byte = byte


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
