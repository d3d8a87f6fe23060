"""Byte and text streams under the readers: chunked decompression and a growing JSON buffer.

``iter_bytes`` feeds ``.gz`` (zlib, multi-member) and ``.zst`` (multi-frame) data through
decompression objects one chunk at a time and checks the end-of-stream marker, so a truncated
file raises :class:`StreamError` instead of silently ending early.

``TextBuffer`` decodes UTF-8 incrementally and hands ``JSONDecoder.raw_decode`` the text of a
JSON array one element at a time.  A decode error near the buffer's end (or an unterminated
string) may just mean "not enough text yet": the buffer then grows by at least its own unread
size and the element is decoded again, so a 50 MB element costs O(50 MB) of parsing, not
O(50 MB × chunks).  A number ending within 3 characters of the buffer's end also grows it,
since "1." may be "1.5".
"""

from __future__ import annotations

import codecs
import json
import re
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO

import zstandard

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_MARGIN = 16  # a decode error this close to the buffer's end may be a cut-off token


class StreamError(Exception):
    """A compressed stream broke; its message is the reject reason."""


def iter_bytes(fh: BinaryIO, codec: str, chunk_size: int) -> Iterator[bytes]:
    """Yield the decompressed bytes; raise :class:`StreamError` on a corrupt or cut stream."""
    if not codec:
        while chunk := fh.read(chunk_size):
            yield chunk
        return
    fresh: Any = (
        (lambda: zlib.decompressobj(wbits=31))
        if codec == ".gz"
        else (lambda: zstandard.ZstdDecompressor().decompressobj())
    )
    obj, open_member = fresh(), False
    while data := fh.read(chunk_size):
        while data:
            open_member = True
            try:
                out = obj.decompress(data, chunk_size) if codec == ".gz" else obj.decompress(data)
            except (zlib.error, zstandard.ZstdError) as exc:
                raise StreamError(f"corrupt {codec} stream ({exc})") from None
            if out:
                yield out
            if obj.eof:  # a member/frame ended; another may follow
                data, obj, open_member = obj.unused_data, fresh(), False
                if codec == ".gz" and not data.strip(b"\0"):
                    data = b""  # gzip allows zero padding after the last member
            else:
                data = obj.unconsumed_tail
    if open_member:
        raise StreamError(f"the {codec} stream is truncated (it ends before its end marker)")


class TextBuffer:
    """Decoded text of a JSON file, read on demand; ``failure`` is why reading stopped early."""

    __slots__ = (
        "_chunks",
        "_decoder",
        "_dropped_lines",
        "_fed",
        "_started",
        "done",
        "failure",
        "pos",
        "text",
    )

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._decoder = chunks, codecs.getincrementaldecoder("utf-8")()
        self._fed, self._dropped_lines, self._started = 0, 0, False
        self.text, self.pos, self.done = "", 0, False
        self.failure: tuple[str, str] | None = None

    def _append(self, piece: str) -> None:
        if not self._started and piece:
            self._started = True
            if piece.startswith("\ufeff"):
                piece = piece[1:]  # a UTF-8 byte order mark opens the file
        self._dropped_lines += self.text.count("\n", 0, self.pos)
        self.text, self.pos = self.text[self.pos :] + piece, 0

    def fill(self) -> bool:
        """Append the next piece of text; False once nothing more will come."""
        if self.done:
            return False
        try:
            chunk = next(self._chunks)
        except StopIteration:
            chunk, self.done = b"", True
        except StreamError as exc:
            self.done, self.failure = True, ("unreadable", f"cannot decompress: {exc}")
            return False
        self._fed += len(chunk)
        try:
            self._append(self._decoder.decode(chunk, final=self.done))
        except UnicodeDecodeError as exc:
            offset = self._fed - len(exc.object) + exc.start
            self._append(exc.object[: exc.start].decode("utf-8"))
            reason = f"invalid UTF-8 at byte offset {offset} of the file ({exc.reason})"
            self.done, self.failure = True, ("invalid_utf8", reason)
        return True

    def grow(self) -> None:
        """Read until at least as much text again as is still unread (amortized linear)."""
        want = len(self.text) - self.pos + len(self.text)
        while len(self.text) - self.pos < want and self.fill():
            pass

    def peek(self) -> str:
        """Skip whitespace and return the next character ('' at the end of the text)."""
        while True:
            self.pos = _WS.match(self.text, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.fill():
                return ""

    def line(self) -> int:
        """1-based line of the file at the current position."""
        return self._dropped_lines + self.text.count("\n", 0, self.pos) + 1

    def decode(self) -> tuple[Any, tuple[str, str] | None]:
        """Decode the value at the position: ``(value, None)`` or ``(None, (code, why))``."""
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                cut = exc.msg.startswith("Unterminated") or exc.pos >= len(self.text) - _MARGIN
                if cut and not self.done:
                    self.grow()
                    continue
                if cut and self.failure:
                    return None, self.failure
                self.pos = exc.pos
                return None, (
                    "invalid_json",
                    f"invalid JSON: {exc.msg.removesuffix(' at')} at line {self.line()}",
                )
            except RecursionError:
                return None, ("invalid_json", "invalid JSON: nested too deeply")
            except ValueError as exc:
                return None, ("invalid_json", f"invalid JSON: {exc}")
            if type(value) in (int, float) and end >= len(self.text) - 3 and not self.done:
                self.grow()  # "1", "1.", "1e-" at the end may be a cut-off "1.5e-3"
                continue
            self.pos = end
            return value, None
