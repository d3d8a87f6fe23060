r"""Find input files and stream their records, one :class:`RawRecord` at a time.

Inputs are ``.jsonl``, ``.json`` (an array, or one object) and ``.parquet`` files; JSON files may
be compressed as ``.gz`` or ``.zst``.  Specs (files, folders, globs) are expanded by
:mod:`packshard.ingest.read.inputs`; files are opened there too, refusing FIFOs and devices.

Nothing is read whole.  Compressed bytes are fed to ``zlib``/``zstandard`` decompression objects
one chunk at a time (``chunk_size``, 1 MiB), and the end-of-stream marker is checked, so a
truncated ``.gz``/``.zst`` is noticed instead of silently ending early::

    file ──read(chunk)──► decompress ──► JSONL: split on b"\n", json.loads per line
                                     └─► JSON:  incremental UTF-8 ──► text buffer ──► raw_decode

A record's ``line`` is the 1-based physical line for JSONL (blank lines skipped but counted), the
1-based element index of a JSON array (1 for a lone object) and the 1-based Parquet row.

Record-level problems never raise: the record carries a :class:`~packshard.errors.RecordError`
(``invalid_json``, ``invalid_utf8``, ``not_an_object``, ``duplicate_key``, ``too_large``,
``unreadable``; see :mod:`packshard.ingest.read.streams`, ``jsonparse``, ``parquet``).  A
record over ``max_record_bytes`` is rejected unparsed, never held.  A broken array or stream
cannot be resynchronized: one error record marks where reading stopped.  A file that cannot
be opened, or decompresses past its limits, raises InputError.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from packshard.errors import StreamLimitDataError
from packshard.ingest.read.inputs import (
    InputFile,
    expand_inputs,
    file_domain,
    open_stored,
    reject_record,
    split_ext,
)
from packshard.ingest.read.jsonparse import a_json_kind, parse_record, too_large_reason
from packshard.ingest.read.parquet import parquet_records
from packshard.ingest.read.regular import open_regular
from packshard.ingest.read.streams import StreamError, StreamLimitError, TextBuffer, iter_bytes
from packshard.ingest.types import IngestOptions, RawRecord
from packshard.records import SourceRef

__all__ = ["CHUNK_SIZE", "InputFile", "expand_inputs", "file_domain", "read_records"]

CHUNK_SIZE = 1 << 20


def _record(f: InputFile, line: int, domain: str, value: Any) -> RawRecord:
    if type(value) is dict:
        return RawRecord(SourceRef(f.path, line), domain, value)
    reason = f"record is {a_json_kind(value)}, expected a JSON object"
    return reject_record(f, line, "not_an_object", reason)


def _parse_line(f: InputFile, line_no: int, domain: str, line: bytes) -> RawRecord:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        reason = f"invalid UTF-8 at byte offset {exc.start} of the line ({exc.reason})"
        return reject_record(f, line_no, "invalid_utf8", reason)
    if line_no == 1 and text.startswith("\ufeff"):
        text = text[1:]
    value, error = parse_record(text)
    if error is not None:
        return reject_record(f, line_no, *error)
    return _record(f, line_no, domain, value)


def read_jsonl(f: InputFile, chunks: Iterator[bytes], limit: int) -> Iterator[RawRecord]:
    """Split on newlines; a line longer than ``limit`` is rejected and skipped, never held."""
    domain, line_no, parts, pending, skipping = file_domain(f.path), 0, [], 0, False
    while True:
        try:
            chunk = next(chunks)
        except StopIteration:
            break
        except StreamError as exc:
            reason = f"cannot decompress: {exc}; the rest of the file is not read"
            yield reject_record(f, line_no + 1, "unreadable", reason)
            return
        if skipping:  # inside an oversized line: drop bytes up to its newline
            end = chunk.find(b"\n")
            if end < 0:
                continue
            line_no, skipping, chunk = line_no + 1, False, chunk[end + 1 :]
        parts.append(chunk)
        pending += len(chunk)
        if b"\n" in chunk:
            lines = b"".join(parts).split(b"\n")
            tail = lines.pop()
            for line in lines:
                line_no += 1
                if len(line) > limit:
                    yield reject_record(f, line_no, *too_large_reason("line", limit))
                elif line.strip():
                    yield _parse_line(f, line_no, domain, line)
            parts, pending = [tail], len(tail)
        if pending > limit:  # the open line: rejected now, its bytes skipped to its newline
            yield reject_record(f, line_no + 1, *too_large_reason("line", limit))
            parts, pending, skipping = [], 0, True
    tail = b"".join(parts)
    if tail.strip() and not skipping:
        yield _parse_line(f, line_no + 1, domain, tail)


def _read_json(f: InputFile, chunks: Iterator[bytes], limit: int) -> Iterator[RawRecord]:
    buf, domain = TextBuffer(chunks), file_domain(f.path)
    stop = "; the rest of the file is not read"
    first = buf.peek()
    if first != "[":  # one object (or a broken file)
        if not first:
            code, why = buf.failure or ("invalid_json", "invalid JSON: the file is empty")
            yield reject_record(f, 1, code, why)
            return
        value, error, _ = buf.decode(limit)
        if error is None and buf.peek():
            hint = "; a file of one JSON value per line must be named .jsonl"
            error = ("invalid_json", f"invalid JSON: extra data at line {buf.line()}{hint}")
        if error is None and buf.failure:
            error = buf.failure
        yield reject_record(f, 1, *error) if error else _record(f, 1, domain, value)
        return
    buf.pos += 1
    index, nxt = 0, buf.peek()
    if nxt == "]":
        buf.pos += 1
    while nxt != "]":
        index += 1
        buf.peek()
        value, error, fatal = buf.decode(limit)
        if error and fatal:
            yield reject_record(f, index, error[0], error[1] + stop)
            return
        yield reject_record(f, index, *error) if error else _record(f, index, domain, value)
        nxt = buf.peek()
        if nxt not in (",", "]"):
            code, why = buf.failure or (
                "invalid_json",
                f"invalid JSON: expected ',' or ']' after element {index} at line {buf.line()}",
            )
            yield reject_record(f, index + 1, code, why + stop)
            return
        buf.pos += 1
    if buf.peek():
        why = f"invalid JSON: extra data after the closing ']' at line {buf.line()}"
        yield reject_record(f, index + 1, "invalid_json", why)
    elif buf.failure:
        yield reject_record(f, index + 1, *buf.failure)


def read_records(
    f: InputFile, chunk_size: int = CHUNK_SIZE, options: IngestOptions | None = None
) -> Iterator[RawRecord]:
    """Stream the records of one input file, in file order.

    Bad records come back as records with ``error`` set (see the module docstring).
    ``chunk_size`` is the number of bytes read (and decompressed) at a time; Parquet is read
    in batches of ``min(chunk_size, 1024)`` rows, fewer when its rows are large.  ``options``
    gives the limits (``max_record_bytes``, ``max_decompressed_bytes``, ``max_expansion``).

    Raises:
        InputError: the file cannot be opened or is not a regular file, or it decompresses
            past its limits.

    """
    options = options or IngestOptions()
    limit = options.max_record_bytes
    _, kind, codec = split_ext(os.path.basename(f.path))
    opened = open_stored(f) if f.in_store else open_regular(f.real, f.path)
    with opened as fh:
        if kind == ".parquet":
            yield from parquet_records(f, fh, max(1, min(chunk_size, 1024)), limit)
            return
        chunks = iter_bytes(
            fh, codec, chunk_size, options.max_decompressed_bytes, options.max_expansion
        )
        try:
            yield from (_read_json if kind == ".json" else read_jsonl)(f, chunks, limit)
        except StreamLimitError as exc:
            raise StreamLimitDataError(f"{f.path}: {exc}") from None
