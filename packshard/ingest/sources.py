r"""Find input files and stream their records, one :class:`RawRecord` at a time.

Inputs are ``.jsonl``, ``.json`` (an array, or one object) and ``.parquet`` files; JSON files may
be compressed as ``.gz`` or ``.zst``.  A spec is a file, a folder (every supported file below it,
hidden entries skipped) or a glob; the result is deduplicated by real path and keeps spec order,
each spec's matches sorted.

Nothing is read whole.  Compressed bytes are fed to ``zlib``/``zstandard`` decompression objects
one chunk at a time (``chunk_size``, 1 MiB), and the end-of-stream marker is checked, so a
truncated ``.gz``/``.zst`` is noticed instead of silently ending early::

    file ──read(chunk)──► decompress ──► JSONL: split on b"\n", json.loads per line
                                     └─► JSON:  incremental UTF-8 ──► text buffer ──► raw_decode

A record's ``line`` is the 1-based physical line for JSONL (blank lines skipped but counted), the
1-based element index of a JSON array (1 for a lone object) and the 1-based Parquet row.

Decompression and the growing JSON text buffer live in :mod:`packshard.ingest.streams`.

Record-level problems never raise: the record carries a :class:`RecordError` (``invalid_json``,
``invalid_utf8``, ``not_an_object``, ``unreadable``).  A broken array or a broken compressed
stream cannot be resynchronized, so one error record marks where reading stopped; every record
read before it is still yielded, so counts add up.  Only a file that cannot be opened raises
:class:`InputError`.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packshard.errors import InputError, RecordError
from packshard.ingest.streams import StreamError, TextBuffer, iter_bytes
from packshard.records import RawRecord, SourceRef

CHUNK_SIZE = 1 << 20
_EXPECTED = "expected .jsonl, .json, .parquet, optionally .gz/.zst"
_CODECS = (".gz", ".zst")
_TYPES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True, slots=True)
class InputFile:
    """One input file: ``path`` as given or found (the recorded ``source``), ``real`` resolved."""

    path: str
    real: Path


def _split_ext(name: str) -> tuple[str, str, str]:
    """Return ``(stem, type, codec)`` of a file name, e.g. ``("chat", ".jsonl", ".gz")``."""
    lower, codec, kind = name.lower(), "", ""
    for ext in _CODECS:
        if lower.endswith(ext):
            codec, name, lower = ext, name[: -len(ext)], lower[: -len(ext)]
            break
    for ext in _TYPES:
        if lower.endswith(ext):
            kind, name = ext, name[: -len(ext)]
            break
    return name, kind, codec


def file_domain(path: str) -> str:
    """Return the file's name without its known extensions (``chat.jsonl.gz`` -> ``chat``)."""
    name = os.path.basename(path)
    stem = _split_ext(name)[0]
    return stem or name


def _check_type(path: str) -> None:
    _, kind, codec = _split_ext(os.path.basename(path))
    if kind == ".parquet" and codec:
        why = f"Parquet is compressed inside; remove the outer {codec}"
        raise InputError(f"{path}: unsupported input type ({why})")
    if not kind:
        raise InputError(f"{path}: unsupported input type ({_EXPECTED})")


def _walk(folder: str) -> list[str]:
    found = []
    for p in Path(folder).rglob("*"):
        rel = p.relative_to(folder)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts):
            _, kind, codec = _split_ext(p.name)
            if kind and not (kind == ".parquet" and codec):
                found.append(rel.as_posix())
    return [str(Path(folder) / rel) for rel in sorted(found)]


def expand_inputs(specs: Sequence[str]) -> list[InputFile]:
    """Expand files, folders and globs into input files, in a deterministic order.

    Folders contribute every supported file below them (sorted, hidden entries and other files
    skipped); globs their sorted matches, each of which must be supported.  A file named twice
    (or reached through two specs or links) is kept once, at its first place.
    """
    files: list[InputFile] = []
    seen: set[Path] = set()
    for spec in specs:
        p = Path(spec)
        if p.is_dir():
            paths = _walk(spec)
            if not paths:
                raise InputError(f"{spec}: folder holds no input files ({_EXPECTED})")
        elif p.is_file():
            _check_type(spec)
            paths = [spec]
        elif any(c in spec for c in "*?["):
            paths = []
            for match in sorted(glob.glob(spec, recursive=True)):
                if os.path.isdir(match):
                    paths.extend(_walk(match))
                else:
                    _check_type(match)
                    paths.append(match)
            if not paths:
                raise InputError(f"{spec}: pattern matches no input files (check the glob)")
        elif p.exists():
            raise InputError(f"{spec}: not a regular file or folder")
        else:
            raise InputError(f"{spec}: no such file or folder")
        for path in paths:
            real = Path(path).resolve()
            if real not in seen:
                seen.add(real)
                files.append(InputFile(path, real))
    return files


def _reject(f: InputFile, line: int, code: str, reason: str) -> RawRecord:
    return RawRecord(
        SourceRef(f.path, line), file_domain(f.path), None, RecordError(code, reason, f.path, line)
    )


def _type_name(value: Any) -> str:
    """Name the JSON kind of a value with its article: ``a list``, ``a number``, ``null``."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    names = {list: "a list", str: "a string", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _record(f: InputFile, line: int, domain: str, value: Any) -> RawRecord:
    if type(value) is dict:
        return RawRecord(SourceRef(f.path, line), domain, value)
    reason = f"record is {_type_name(value)}, expected a JSON object"
    return _reject(f, line, "not_an_object", reason)


def _parse_line(f: InputFile, line_no: int, domain: str, line: bytes) -> RawRecord:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        reason = f"invalid UTF-8 at byte offset {exc.start} of the line ({exc.reason})"
        return _reject(f, line_no, "invalid_utf8", reason)
    if line_no == 1 and text.startswith("\ufeff"):
        text = text[1:]
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return _reject(
            f,
            line_no,
            "invalid_json",
            f"invalid JSON: {exc.msg.removesuffix(' at')} at column {exc.colno}",
        )
    except RecursionError:
        return _reject(f, line_no, "invalid_json", "invalid JSON: nested too deeply")
    except ValueError as exc:
        return _reject(f, line_no, "invalid_json", f"invalid JSON: {exc}")
    return _record(f, line_no, domain, value)


def _read_jsonl(f: InputFile, chunks: Iterator[bytes]) -> Iterator[RawRecord]:
    domain, line_no, parts = file_domain(f.path), 0, []
    while True:
        try:
            chunk = next(chunks)
        except StopIteration:
            break
        except StreamError as exc:
            reason = f"cannot decompress: {exc}; the rest of the file is not read"
            yield _reject(f, line_no + 1, "unreadable", reason)
            return
        if b"\n" not in chunk:
            parts.append(chunk)
            continue
        parts.append(chunk)
        lines = b"".join(parts).split(b"\n")
        parts = [lines.pop()]
        for line in lines:
            line_no += 1
            if line.strip():
                yield _parse_line(f, line_no, domain, line)
    tail = b"".join(parts)
    if tail.strip():
        yield _parse_line(f, line_no + 1, domain, tail)


def _read_json(f: InputFile, chunks: Iterator[bytes]) -> Iterator[RawRecord]:
    buf, domain, stop = (
        TextBuffer(chunks),
        file_domain(f.path),
        "; the rest of the file is not read",
    )
    first = buf.peek()
    if first != "[":  # one object (or a broken file)
        if not first:
            code, why = buf.failure or ("invalid_json", "invalid JSON: the file is empty")
            yield _reject(f, 1, code, why)
            return
        value, error = buf.decode()
        if error is None and buf.peek():
            hint = "; a file of one JSON value per line must be named .jsonl"
            error = ("invalid_json", f"invalid JSON: extra data at line {buf.line()}{hint}")
        if error is None and buf.failure:
            error = buf.failure
        yield _reject(f, 1, *error) if error else _record(f, 1, domain, value)
        return
    buf.pos += 1
    index, nxt = 0, buf.peek()
    if nxt == "]":
        buf.pos += 1
    while nxt != "]":
        index += 1
        buf.peek()
        value, error = buf.decode()
        if error:
            yield _reject(f, index, error[0], error[1] + stop)
            return
        yield _record(f, index, domain, value)
        nxt = buf.peek()
        if nxt not in (",", "]"):
            code, why = buf.failure or (
                "invalid_json",
                f"invalid JSON: expected ',' or ']' after element {index} at line {buf.line()}",
            )
            yield _reject(f, index + 1, code, why + stop)
            return
        buf.pos += 1
    if buf.peek():
        why = f"invalid JSON: extra data after the closing ']' at line {buf.line()}"
        yield _reject(f, index + 1, "invalid_json", why)
    elif buf.failure:
        yield _reject(f, index + 1, *buf.failure)


def _read_parquet(f: InputFile, batch_rows: int) -> Iterator[RawRecord]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pfile = pq.ParquetFile(f.real)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{f.path}: cannot read Parquet file ({exc})") from None
    domain, row, batches = file_domain(f.path), 0, pfile.iter_batches(batch_size=batch_rows)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as exc:
            reason = f"cannot read Parquet data ({exc}); the rest of the file is not read"
            yield _reject(f, row + 1, "unreadable", reason)
            return
        for value in batch.to_pylist():
            row += 1
            yield RawRecord(SourceRef(f.path, row), domain, value)


def read_records(f: InputFile, chunk_size: int = CHUNK_SIZE) -> Iterator[RawRecord]:
    """Stream the records of one input file, in file order.

    Bad records come back as records with ``error`` set (see the module docstring); only a
    file that cannot be opened raises :class:`InputError`.  ``chunk_size`` is the number of
    bytes read (and, for ``.gz``, decompressed) at a time; Parquet is read in batches of
    ``min(chunk_size, 1024)`` rows.
    """
    _, kind, codec = _split_ext(os.path.basename(f.path))
    if kind == ".parquet":
        yield from _read_parquet(f, max(1, min(chunk_size, 1024)))
        return
    try:
        fh = open(f.real, "rb")
    except OSError as exc:
        raise InputError(f"{f.path}: cannot open ({exc.strerror or exc})") from None
    with fh:
        chunks = iter_bytes(fh, codec, chunk_size)
        yield from (_read_json if kind == ".json" else _read_jsonl)(f, chunks)
