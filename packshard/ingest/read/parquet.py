"""Parquet inputs: rows as records, checked as every other input's records are.

A Parquet file is read one record batch at a time (:func:`parquet_batches`: at most
``batch_rows`` rows, fewer when its rows are large, about 64 MiB a batch), and each row becomes
one :class:`RawRecord` numbered by its 1-based row.  The checks match the JSON readers':

- a schema in which one struct holds a field name twice (:func:`repeated_field`) makes every
  row a ``duplicate_key`` reject, as a JSON object with a repeated key is;
- a row over ``max_record_bytes`` is a ``too_large`` reject and is never turned into Python
  values: a batch over the limit is halved until its slices fit (:func:`_within`);
- a batch that cannot be read is one ``unreadable`` reject, and reading the file stops there.

The whole-file reader (:func:`read_parquet`) and the row-group reader of a work unit
(:mod:`packshard.ingest.read.splits`) share :func:`parquet_records`, so a unit's records are the
whole file's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from packshard.errors import InputError
from packshard.ingest.read.inputs import (
    InputFile,
    file_domain,
    open_regular,
    reject_record,
    too_large_record,
)
from packshard.ingest.types import RawRecord
from packshard.records import SourceRef

PARQUET_BATCH_BYTES = 64 << 20  # Parquet rows are read in batches of about this many bytes


def repeated_field(fields: Any) -> str | None:
    """Return a field name occurring twice in one struct of an Arrow schema, if any."""
    import pyarrow as pa

    stack = [list(fields)]
    while stack:
        level = stack.pop()
        names = [field.name for field in level]
        for name in names:
            if names.count(name) > 1:
                return str(name)
        for field in level:
            kind = field.type
            while pa.types.is_list(kind) or pa.types.is_large_list(kind):
                kind = kind.value_type
            if pa.types.is_struct(kind):
                stack.append([kind.field(i) for i in range(kind.num_fields)])
    return None


def read_parquet(f: InputFile, batch_rows: int, limit: int) -> Iterator[RawRecord]:
    """Yield the records of a whole Parquet file, ``batch_rows`` rows at a time at most."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open_regular(f.real, f.path) as fh:
        try:
            pfile = pq.ParquetFile(fh)
            repeated = repeated_field(pfile.schema_arrow)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{f.path}: cannot read Parquet file ({exc})") from None
        yield from parquet_records(f, parquet_batches(pfile, batch_rows), 0, repeated, limit)


def parquet_batches(pfile: Any, batch_rows: int, row_groups: Any = None) -> Iterator[Any]:
    """Record batches of at most ``batch_rows``, fewer when rows are large (about 64 MiB)."""
    meta = pfile.metadata
    if meta.num_rows and meta.num_row_groups:
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)) or 1
        batch_rows = max(1, min(batch_rows, PARQUET_BATCH_BYTES * meta.num_rows // size))
    return pfile.iter_batches(batch_size=batch_rows, row_groups=row_groups)


def parquet_records(
    f: InputFile,
    batches: Iterator[Any],
    row: int,
    repeated: str | None,
    limit: int,
    stopped: Callable[[], None] | None = None,
) -> Iterator[RawRecord]:
    """Yield the records of Parquet record ``batches``, rows numbered from ``row + 1``.

    A schema with a ``repeated`` field makes every row a ``duplicate_key`` reject; a row over
    ``limit`` bytes is ``too_large`` (never turned into Python values); a batch that cannot be
    read is one ``unreadable`` reject, ends the file and calls ``stopped``.
    """
    import pyarrow as pa

    domain = file_domain(f.path)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as exc:
            reason = f"cannot read Parquet data ({exc}); the rest of the file is not read"
            if stopped is not None:
                stopped()
            yield reject_record(f, row + 1, "unreadable", reason)
            return
        if repeated is not None:
            why = f"duplicate field {repeated!r} in the Parquet schema (fix the file)"
            for _ in range(batch.num_rows):
                row += 1
                yield reject_record(f, row, "duplicate_key", why)
            continue
        for part in _within(batch, limit):
            if part is None:
                row += 1
                yield too_large_record(f, row, "row", limit)
                continue
            for value in part.to_pylist():
                row += 1
                yield RawRecord(SourceRef(f.path, row), domain, value)


def _within(batch: Any, limit: int) -> Iterator[Any]:
    """Cut a record batch, in order, into slices of at most ``limit`` bytes (None: one row over)."""
    stack = [batch]
    while stack:
        part = stack.pop()
        if part.nbytes <= limit:
            yield part
        elif part.num_rows == 1:
            yield None
        else:
            half = part.num_rows // 2
            stack += [part.slice(half), part.slice(0, half)]
