"""Byte and text streams under the readers: chunked decompression and a growing JSON buffer.

``iter_bytes`` feeds ``.gz`` (zlib, multi-member) and ``.zst`` (multi-frame) data through
decompression objects one chunk at a time and checks the end-of-stream marker, so a truncated
file raises :class:`StreamError` instead of silently ending early — after every byte decoded
before the break has been yielded, so the readers keep each complete line before it.

``TextBuffer`` decodes UTF-8 incrementally and hands ``JSONDecoder.raw_decode`` the text of a
JSON array one element at a time.  A decode error near the buffer's end (or an unterminated
string) may just mean "not enough text yet": the buffer then grows by at least its own unread
size and the element is decoded again, so a 50 MB element costs O(50 MB) of parsing, not
O(50 MB × chunks).  A number ending within 3 characters of the buffer's end also grows it,
since "1." may be "1.5".

Limits (the ``--max-…`` options): an element larger than ``limit`` characters, one nested
too deeply, holding a repeated key or an unconvertible number is skipped with
:class:`~packshard.ingest.read.jsonparse.ValueScanner` and reported, and reading goes on with the
next element.  Decompression is bounded too: zlib gives at most ``chunk_size`` bytes a call,
zstd is fed ``ZSTD_FEED`` bytes at a time (at most about 32 MiB out a call).  A file
decompressing to more than ``max_bytes``, or past ``EXPANSION_FLOOR`` to more than
``max_expansion`` times its compressed size (a decompression bomb), raises
:class:`StreamLimitError`: the records past that point cannot be counted, so the run stops.
"""

from __future__ import annotations

import codecs
import json
import re
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO

import zstandard

from packshard.ingest.read.jsonparse import DECODER, ValueScanner, too_large_reason, unusable_reason

_WS = re.compile(r"[ \t\n\r]*")
_MARGIN = 16  # a decode error this close to the buffer's end may be a cut-off token
ZSTD_FEED = 1024
EXPANSION_FLOOR = 16 << 20


class StreamError(Exception):
    """A compressed stream broke; its message is the reject reason."""


class StreamLimitError(Exception):
    """A compressed stream decompresses to more than its limits allow (the run stops)."""


def iter_bytes(
    fh: BinaryIO, codec: str, chunk_size: int, max_bytes: int, max_expansion: int
) -> Iterator[bytes]:
    """Yield the decompressed bytes, about ``chunk_size`` at a time.

    Raises:
        StreamError: a corrupt or cut stream.
        StreamLimitError: more than ``max_bytes`` decompressed, or, past
            ``EXPANSION_FLOOR``, more than ``max_expansion`` times the bytes read.

    """
    if not codec:
        while chunk := fh.read(chunk_size):
            yield chunk
        return
    read = [0]
    made, ready, pending = 0, [], 0
    try:
        for out in _decompress(fh, codec, chunk_size, read):
            made += len(out)
            _check_expansion(codec, read[0], made, max_bytes, max_expansion)
            ready.append(out)
            pending += len(out)
            if pending >= chunk_size:
                yield b"".join(ready) if len(ready) > 1 else out
                ready, pending = [], 0
    except StreamError:
        if ready:  # every byte decoded before the break is still read
            yield b"".join(ready)
        raise
    if ready:
        yield b"".join(ready)


def _decompress(fh: BinaryIO, codec: str, chunk_size: int, read: list[int]) -> Iterator[bytes]:
    """Decompressed pieces of a multi-member gzip or multi-frame zstd stream, bounded in size.

    Input is fed in slices, positions tracked as offsets (many small members cost no copy);
    ``read[0]`` counts the compressed bytes read so far.
    """
    gz = codec == ".gz"
    feed = chunk_size if gz else ZSTD_FEED
    fresh: Any = (
        (lambda: zlib.decompressobj(wbits=31))
        if gz
        else (lambda: zstandard.ZstdDecompressor().decompressobj())
    )
    obj, open_member, between = fresh(), False, False
    while data := fh.read(chunk_size):
        read[0] += len(data)
        view, pos = memoryview(data), 0
        while pos < len(data):
            if between and gz and view[pos] == 0 and not bytes(view[pos:]).strip(b"\0"):
                break  # gzip allows zero padding after the last member
            piece = view[pos : pos + feed]
            open_member, between = True, False
            try:
                out = obj.decompress(piece, chunk_size) if gz else obj.decompress(piece)
            except (zlib.error, zstandard.ZstdError) as exc:
                raise StreamError(f"corrupt {codec} stream ({exc})") from None
            if out:
                yield out
            if obj.eof:  # a member/frame ended; another may follow
                pos += len(piece) - len(obj.unused_data)
                obj, open_member, between = fresh(), False, True
            else:
                pos += len(piece) - (len(obj.unconsumed_tail) if gz else 0)
    if open_member:
        raise StreamError(f"the {codec} stream is truncated (it ends before its end marker)")


def _check_expansion(codec: str, read: int, made: int, max_bytes: int, max_expansion: int) -> None:
    if made > max_bytes:
        raise StreamLimitError(
            f"decompresses to more than {max_bytes:,} bytes (use --max-decompressed-bytes "
            "to raise the limit for a file this large)"
        )
    if made > EXPANSION_FLOOR and made > max_expansion * read:
        raise StreamLimitError(
            f"expands more than {max_expansion}x ({read:,} {codec} bytes to over {made:,}): a "
            "decompression bomb? (use --max-expansion to allow more)"
        )


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

    def decode(self, limit: int | None = None) -> tuple[Any, tuple[str, str] | None, bool]:
        """Decode the value at the position.

        Returns ``(value, None, False)``; or ``(None, (code, why), fatal)``: a fatal error
        leaves the position there, any other has skipped the value so reading goes on.
        """
        while True:
            try:
                value, end = DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                cut = exc.msg.startswith("Unterminated") or exc.pos >= len(self.text) - _MARGIN
                if cut and not self.done:
                    if limit is not None and len(self.text) - self.pos > limit:
                        return self.skip(*too_large_reason("element", limit))
                    self.grow()
                    continue
                if cut and self.failure:
                    return None, self.failure, True
                self.pos = exc.pos
                why = f"invalid JSON: {exc.msg.removesuffix(' at')} at line {self.line()}"
                return None, ("invalid_json", why), True
            except (ValueError, RecursionError) as exc:  # a repeated key, too deep, a number
                return self.skip(*unusable_reason(exc))
            if type(value) in (int, float) and end >= len(self.text) - 3 and not self.done:
                self.grow()  # "1", "1.", "1e-" at the end may be a cut-off "1.5e-3"
                continue
            if limit is not None and end - self.pos > limit:
                self.pos = end
                return None, too_large_reason("element", limit), False
            self.pos = end
            return value, None, False

    def skip(self, code: str, why: str) -> tuple[None, tuple[str, str], bool]:
        """Move past the value at the position without parsing it; report ``(code, why)``.

        Fatal when the text ends inside the value.
        """
        scanner, i = ValueScanner(), self.pos
        while (end := scanner.scan(self.text, i)) is None:
            self.pos = len(self.text)
            if not self.fill():
                failure = self.failure or ("invalid_json", "invalid JSON: the file ends inside it")
                return None, (code, f"{why}; {failure[1]}"), True
            i = self.pos
        self.pos = end
        return None, (code, why), False
