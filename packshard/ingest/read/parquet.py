"""Parquet inputs: rows as records, checked as every other input's records are.

A Parquet file is read one record batch at a time (:func:`parquet_records`: at most
``batch_rows`` rows, fewer when its rows are large, about 64 MiB a batch), and each row becomes
one :class:`RawRecord` numbered by its 1-based row.  The checks match the JSON readers':

- a schema in which one struct holds a field name twice (:func:`repeated_field`) makes every
  row a ``duplicate_key`` reject, as a JSON object with a repeated key is;
- a row over ``max_record_bytes`` is a ``too_large`` reject and is never turned into Python
  values: a batch over the limit is halved until its slices fit (:func:`_within`);
- a row group that cannot be read is one ``unreadable`` reject naming its row range (the
  rows it had left), and reading goes on with the next group: the rows before it and after it
  are kept.

The whole-file reader and a work unit's row groups share :func:`parquet_records`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from packshard.errors import InputError
from packshard.ingest.read.inputs import InputFile, file_domain, reject_record
from packshard.ingest.read.jsonparse import too_large_reason
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


def parquet_records(
    f: InputFile,
    source: Any,
    batch_rows: int,
    limit: int,
    row_groups: Any = None,
    row: int = 0,
) -> Iterator[RawRecord]:
    """Yield the records of Parquet ``source`` (its ``row_groups``), rows numbered from ``row + 1``.

    ``source`` is ``f``'s path or its open file; the rejects are the module docstring's.

    Raises:
        InputError: ``source`` is not a readable Parquet file.

    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pfile = pq.ParquetFile(source)
        repeated = repeated_field(pfile.schema_arrow)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{f.path}: cannot read Parquet file ({exc})") from None
    domain, meta = file_domain(f.path), pfile.metadata
    if meta.num_rows and meta.num_row_groups:  # fewer rows a batch when they are large
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)) or 1
        batch_rows = max(1, min(batch_rows, PARQUET_BATCH_BYTES * meta.num_rows // size))
    for g in range(meta.num_row_groups) if row_groups is None else row_groups:
        left = meta.row_group(g).num_rows
        for batch in _group_batches(pfile, g, batch_rows):
            if isinstance(batch, str):  # the group broke: the rows it had left are not read
                if left:
                    reason = (
                        f"cannot read Parquet data ({batch}); rows {row + 1}–{row + left}"
                        f" of row group {g} ({left} rows) are not read"
                    )
                    yield reject_record(f, row + 1, "unreadable", reason)
                    row += left
                continue
            left -= batch.num_rows
            if repeated is not None:
                why = f"duplicate field {repeated!r} in the Parquet schema (fix the file)"
                for _ in range(batch.num_rows):
                    row += 1
                    yield reject_record(f, row, "duplicate_key", why)
                continue
            for part in _within(batch, limit):
                if part is None:
                    row += 1
                    yield reject_record(f, row, *too_large_reason("row", limit))
                    continue
                for value in part.to_pylist():
                    row += 1
                    yield RawRecord(SourceRef(f.path, row), domain, value)


def _group_batches(pfile: Any, group: int, batch_rows: int) -> Iterator[Any]:
    """Yield the record batches of one row group, then the error (a str) if reading broke."""
    import pyarrow as pa

    try:
        yield from pfile.iter_batches(batch_size=batch_rows, row_groups=[group])
    except (OSError, pa.ArrowException) as exc:
        yield str(exc)


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
