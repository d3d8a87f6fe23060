"""Shard files: the contract's columns, written one row group at a time and read back.

One Parquet row per packed row (format version 1)::

    input_ids     list<int32>   the row's tokens, at most max_seq_len, no padding stored
    labels        list<int32>   -100 = no loss, else the token itself (unshifted); the first
                                label of every segment is -100
    position_ids  list<int32>   restart at 0 in every segment (policy ``reset``)
    cu_seqlens    list<int32>   [0, end_1, …, num_tokens], strictly increasing
    example_ids   list<int64>   one per segment, key into the examples index
    num_tokens, num_loss_tokens, max_seqlen   int32 per-row totals
    seq_lengths   list<int32>   every segment's length, diff(cu_seqlens): what TRL's
                                padding-free collator reads to keep segments apart

``seq_lengths`` was added to version 1 (an additive column): :func:`write_shard` derives it from
``cu_seqlens`` for every row group it writes, so it can never disagree with the boundaries, and
readers accept shards without it (:data:`SHARD_SCHEMA` is the required set,
:data:`WRITTEN_SCHEMA` what ``pack`` writes).

Integer list columns are written without dictionary encoding (smaller and faster for token
ids), zstd by default; the key-value metadata carries the format version and dataset id
(:mod:`packshard.format.version`).  :func:`write_shard` takes row-group tables made one at a
time and encodes each on a thread while the caller assembles the next, so a shard of any size
never sits in memory whole.  :func:`read_shard` opens a shard and refuses one whose schema or
metadata is not this dataset's; :func:`read_row` and :func:`list_values` give its cells as numpy
arrays.  :func:`rows_problem` and :func:`tokens_problem` are the checks every reader of a shard
(the torch reader, ``export``) runs before it serves a row: boundaries that hold, token ids
inside the vocabulary, labels that are -100 or their own token.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packshard.arrays import arrow_array, exclusive_cumsum, numpy_view
from packshard.digests import sha256_path
from packshard.errors import FormatError
from packshard.format.topology import PADDED_COLUMN, padded_cu_seqlens
from packshard.format.version import metadata_problem, parquet_metadata
from packshard.records import IGNORE_INDEX, PackedRow

SHARD_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int32())),
        ("position_ids", pa.list_(pa.int32())),
        ("cu_seqlens", pa.list_(pa.int32())),
        ("example_ids", pa.list_(pa.int64())),
        ("num_tokens", pa.int32()),
        ("num_loss_tokens", pa.int32()),
        ("max_seqlen", pa.int32()),
    ]
)
OPTIONAL_FIELDS = (pa.field("seq_lengths", pa.list_(pa.int32())),)
"""Columns a version 1 shard may carry beyond :data:`SHARD_SCHEMA`; checked when present."""
WRITTEN_SCHEMA = pa.schema([*SHARD_SCHEMA, *OPTIONAL_FIELDS])
"""The columns :func:`write_shard` writes: the required ones, then the optional ones."""
PAIR_FIELDS = (
    pa.field("branch", pa.list_(pa.int8())),
    pa.field("kto_label", pa.list_(pa.int8())),
)
"""Per-segment columns, parallel to ``example_ids``, of a pack with preference or KTO records
only: ``branch`` 0 not a pair branch, 1 chosen, 2 rejected (a 1 is always followed, in the
same row, by the 2 of the same pair); ``kto_label`` −1 none, 0 undesirable, 1 desirable."""
PAIR_SCHEMA = pa.schema([*WRITTEN_SCHEMA, *PAIR_FIELDS])
"""The columns a preference pack's shards hold: :data:`WRITTEN_SCHEMA`, then the pair columns."""
PADDED_FIELD = pa.field(PADDED_COLUMN, pa.list_(pa.int32()))
"""An aligned pack's padded boundaries (:mod:`packshard.format.topology.aligned`), after
``seq_lengths``; written only with ``--cp``/``--pad-multiple``."""
KNOWN_FIELDS = pa.schema([*PAIR_SCHEMA, PADDED_FIELD])
"""Every column a version 1 shard may hold, with its type."""


def written_schema(pairs: bool, padded: bool) -> pa.Schema:
    """Return the columns :func:`write_shard` writes, in order."""
    extra = [*([PADDED_FIELD] if padded else []), *(PAIR_FIELDS if pairs else [])]
    return pa.schema([*WRITTEN_SCHEMA, *extra])


ROW_GROUP_ROWS = 256
SHARD_PATTERN = "shard-{index:05d}.parquet"
EVAL_SHARD_PATTERN = "eval-shard-{index:05d}.parquet"  # the eval split's shards, when packed


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """What the manifest records about one written shard."""

    path: str
    rows: int
    tokens: int
    loss_tokens: int
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, object]:
        """Return the manifest entry."""
        return asdict(self)


def seq_lengths_column(cu_seqlens: pa.ChunkedArray | pa.Array) -> pa.ListArray:
    """Return ``diff(cu_seqlens)`` of every row as a list column (one entry per segment)."""
    values, offsets = list_values(cu_seqlens)
    steps = np.diff(values).astype(np.int32)
    keep = np.ones(len(steps), dtype=bool)
    keep[offsets[1:-1] - 1] = False  # the steps from one row's last entry to the next row's first
    lengths = np.maximum(np.diff(offsets) - 1, 0)
    return pa.ListArray.from_arrays(
        arrow_array(exclusive_cumsum(lengths).astype(np.int32)), arrow_array(steps[keep])
    )


def with_seq_lengths(table: pa.Table, multiple: int = 1) -> pa.Table:
    """Return ``table`` in :data:`WRITTEN_SCHEMA` order, ``seq_lengths`` derived from it.

    A table with the pair columns keeps them, last (:data:`PAIR_SCHEMA`).  ``multiple`` > 1
    adds ``cu_seqlens_padded`` (each segment rounded up to it), derived from ``cu_seqlens`` too.
    """
    derived = [c for c in ("seq_lengths", PADDED_COLUMN) if c in table.column_names]
    table = table.drop_columns(derived)
    table = table.append_column(OPTIONAL_FIELDS[0], seq_lengths_column(table["cu_seqlens"]))
    if multiple > 1:
        values, offsets = list_values(table["cu_seqlens"])
        padded = padded_cu_seqlens(values, offsets, multiple)
        lists = arrow_array(offsets.astype(np.int32))
        column = pa.ListArray.from_arrays(lists, arrow_array(padded))
        table = table.append_column(PADDED_FIELD, column)
    schema = written_schema("branch" in table.column_names, multiple > 1)
    table = table.select(schema.names)
    if table.schema.types == schema.types:  # the schema as it is (no cast: pyarrow.compute)
        return pa.Table.from_arrays(table.columns, schema=schema)
    return table.cast(schema)


def write_shard(
    tables: pa.Table | Iterable[pa.Table],
    folder: Path,
    name: str,
    dataset_id: str,
    compression: str,
    pairs: bool = False,
    multiple: int = 1,
    overlap: bool = True,
) -> ShardInfo:
    """Write one shard file from a table, or from row-group tables made one at a time.

    Given an iterable, each table is written as soon as it is made, so a shard of many rows
    never sits in memory whole; blocks of ``ROW_GROUP_ROWS`` rows give the same file as one
    table.  ``seq_lengths`` is derived from each table's ``cu_seqlens`` (any given is
    replaced).  ``pairs``: the tables carry the pair columns (:data:`PAIR_SCHEMA`).  ``multiple``
    > 1 adds ``cu_seqlens_padded`` (:data:`PADDED_FIELD`).  ``overlap`` encodes a row group on
    a thread while the next one is made (two row groups in memory); without it, one at a time
    (the same bytes).  Returns the shard's manifest entry.
    """
    meta = parquet_metadata(dataset_id)
    path = folder / name
    rows = tokens = loss_tokens = 0
    with (
        pq.ParquetWriter(
            path,
            written_schema(pairs, multiple > 1).with_metadata(meta),
            compression=None if compression == "none" else compression,
            use_dictionary=False,
            write_statistics=["num_tokens", "num_loss_tokens", "max_seqlen"],
        ) as writer,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="packshard-write") as pool,
    ):
        # Encoding and compressing a row group releases the GIL: it runs on the pool while
        # this thread assembles the next one.
        writing: Future[None] | None = None
        for table in [tables] if isinstance(tables, pa.Table) else tables:
            if writing is not None:
                writing.result()
            group = with_seq_lengths(table, multiple).replace_schema_metadata(meta)
            rows += table.num_rows
            for chunk in table["num_tokens"].chunks:
                tokens += int(numpy_view(chunk).sum(dtype=np.int64))
            for chunk in table["num_loss_tokens"].chunks:
                loss_tokens += int(numpy_view(chunk).sum(dtype=np.int64))
            del table  # the group (the pool's while it writes) holds its columns
            if not overlap:  # here: what the encoder frees is this thread's to reuse
                writer.write_table(group, row_group_size=ROW_GROUP_ROWS)
                continue
            writing = pool.submit(writer.write_table, group, row_group_size=ROW_GROUP_ROWS)
            del group
        if writing is not None:
            writing.result()
    return ShardInfo(
        path=name,
        rows=rows,
        tokens=tokens,
        loss_tokens=loss_tokens,
        bytes=path.stat().st_size,
        sha256=sha256_path(path),
    )


def read_shard_groups(
    path: Path, dataset_id: str, columns: list[str] | None, data: bytes | bytearray
) -> Iterator[pa.Table]:
    """Yield a shard's row groups one at a time, its metadata checked first (:func:`read_shard`).

    For a reader that takes every row once: a row group's decode is about a twentieth of the
    shard's (the shards' row groups hold ``ROW_GROUP_ROWS`` rows), so its buffers are reused
    from one group to the next instead of being made for the whole shard at once.  Each is
    decoded on the calling thread: spread over Arrow's threads, the columns of a 23.0M-token
    shard decoded in 0.29 s instead of 0.45 but took 0.52-0.58 CPU-s instead of 0.43-0.48,
    and the reader (``repack``) counts CPU, not wall time, a row group at a time.
    """
    try:
        file = pq.ParquetFile(pa.BufferReader(pa.py_buffer(data)))
        problem = metadata_problem(file.schema_arrow.metadata, dataset_id)
        if problem is None and columns is None:
            problem = schema_problem(file.schema_arrow)
    except Exception as exc:  # any decode failure: pyarrow raises many kinds
        raise FormatError(str(path), f"unreadable Parquet: {exc}") from None
    if problem is not None:
        raise FormatError(str(path), problem)
    for group in range(file.num_row_groups):
        try:
            table = file.read_row_group(group, columns=columns, use_threads=False)
        except Exception as exc:
            raise FormatError(str(path), f"unreadable Parquet (row group {group}): {exc}") from None
        yield table


def list_values(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Return a list column's flat values and int64 offsets (zero-copy where possible)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = numpy_view(arr.offsets).astype(np.int64)
    values = numpy_view(arr.values)
    base = int(offsets[0])
    return values[base : int(offsets[-1])], offsets - base


def read_row(table: pa.Table, index: int) -> PackedRow:
    """Return row ``index`` of a shard table as a :class:`PackedRow`."""

    def cell(name: str, dtype: type) -> np.ndarray:
        return np.asarray(table[name][index].values.to_numpy(zero_copy_only=False), dtype=dtype)

    return PackedRow(
        input_ids=cell("input_ids", np.int32),
        labels=cell("labels", np.int32),
        position_ids=cell("position_ids", np.int32),
        cu_seqlens=cell("cu_seqlens", np.int32),
        example_ids=cell("example_ids", np.int64),
    )


def cu_problems(
    cu: np.ndarray, cu_off: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Check a ``cu_seqlens`` column's flat values and offsets against its rows' lengths.

    Returns, per row, whether it fails to start at 0 and end at its length with a segment or
    more, and the flat indices ``i`` where ``cu[i + 1] <= cu[i]`` within a row (vectorised).
    The steps are taken in int64: an int32 step from 2**31 - 1 down to -2**31 would wrap.
    """
    cu = cu.astype(np.int64, copy=False)
    has_cu = np.diff(cu_off) > 0
    padded = np.append(cu, -1)  # -1 for a row with an empty list (never a valid entry)
    first = np.where(has_cu, padded[np.minimum(cu_off[:-1], len(cu))], -1)
    last = np.where(has_cu, padded[np.maximum(cu_off[1:] - 1, 0)], -1)
    step = np.diff(cu)
    inner = np.ones(len(step), dtype=bool)
    cross = cu_off[1:-1] - 1  # steps that cross from one row's list to the next
    inner[cross[(cross >= 0) & (cross < len(step))]] = False
    ends = (np.diff(cu_off) < 2) | (first != 0) | (last != lengths)
    return ends, np.flatnonzero(inner & (step <= 0))


def rows_problem(table: pa.Table) -> str | None:
    """Say which row first breaks the boundaries a reader relies on, or None (vectorised).

    The token lists agree in length, and each row's ``cu_seqlens`` starts at 0, strictly
    increases, ends at its length and has one entry more than ``example_ids`` (the columns
    present are checked: ``position_ids`` may be left out by a reader that derives it).
    """
    _, tok_off = list_values(table["input_ids"])
    for name in ("labels", "position_ids"):
        if name in table.column_names and not np.array_equal(list_values(table[name])[1], tok_off):
            row = int(np.flatnonzero(np.diff(list_values(table[name])[1]) != np.diff(tok_off))[0])
            return f"row {row}: input_ids and {name} differ in length"
    cu, cu_off = list_values(table["cu_seqlens"])
    bad, broken = cu_problems(cu, cu_off, np.diff(tok_off))
    bad[np.searchsorted(cu_off, broken, side="right") - 1] = True
    if "example_ids" in table.column_names:
        bad |= np.diff(list_values(table["example_ids"])[1]) != np.diff(cu_off) - 1
    if bad.any():
        return f"row {int(np.flatnonzero(bad)[0])}: cu_seqlens or example_ids break the row"
    return None


def replaced_shard(out: object) -> str:
    """Return the problem of a shard whose bytes are not the manifest's (every reader's)."""
    return (
        "SHA-256 differs from the manifest: the shard was replaced or modified after it was "
        f"packed (run packshard verify {out}, and pack again)"
    )


def tokens_problem(table: pa.Table, vocab_size: int) -> str | None:
    """Say which row first holds a token a model cannot be trained on, or None (vectorised).

    Every ``input_ids`` value must lie in ``[0, vocab_size)`` (the manifest's tokenizer: an
    id outside it indexes past the embedding table, or wraps to another token), and every
    label be -100 or the token at its place.  The row and the first bad value are named.
    """
    ids, tok_off = list_values(table["input_ids"])
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):  # two fast passes
        at = int(np.flatnonzero((ids < 0) | (ids >= vocab_size))[0])
        row = int(np.searchsorted(tok_off, at, side="right")) - 1
        return f"row {row}: token id {int(ids[at])} outside the vocabulary [0, {vocab_size})"
    labels, lab_off = list_values(table["labels"])
    if not np.array_equal(lab_off, tok_off):
        return "input_ids and labels differ in length"
    # ids are >= 0 here, so "the token" and "-100" never coincide: counting both suffices,
    # two compares and no index array (the positions are found only when a count is short)
    if np.count_nonzero(labels == ids) + np.count_nonzero(labels == IGNORE_INDEX) < len(ids):
        at = int(np.flatnonzero((labels != ids) & (labels != IGNORE_INDEX))[0])
        row = int(np.searchsorted(tok_off, at, side="right")) - 1
        return f"row {row}: label {int(labels[at])} is neither -100 nor its token"
    return None


def schema_problem(schema: pa.Schema) -> str | None:
    """Say what is wrong with a shard's columns, or None when they match the contract.

    Optional columns are checked only when present; columns the contract does not know are
    ignored.
    """
    missing = [c for c in SHARD_SCHEMA.names if c not in schema.names]
    if missing:
        return f"missing columns {', '.join(missing)} (not a format version 1 shard)"
    for name in KNOWN_FIELDS.names:
        if name not in schema.names:
            continue
        want, got = KNOWN_FIELDS.field(name).type, schema.field(name).type
        if got != want:
            return f"column {name} is {got}, the contract says {want}"
    return None


def read_shard(
    path: Path,
    dataset_id: str,
    columns: list[str] | None = None,
    data: bytes | bytearray | None = None,
) -> pa.Table:
    """Read a shard (memory-mapped), checking its schema and its packshard metadata.

    ``data``: the shard's bytes, already read (and hashed) by the caller, decoded instead of
    the file, which ``path`` then only names.

    Raises:
        FormatError: not Parquet, columns not the contract's, or metadata of another dataset.

    """
    source: Any = path if data is None else pa.BufferReader(pa.py_buffer(data))
    try:
        # ParquetFile, not read_table: read_table imports pyarrow.dataset, and with it pandas
        # (0.4 CPU-s at every start of a command that reads a pack)
        table = pq.ParquetFile(source, memory_map=data is None).read(columns=columns)
    except Exception as exc:  # any decode failure: pyarrow raises many kinds
        raise FormatError(str(path), f"unreadable Parquet: {exc}") from None
    problem = metadata_problem(table.schema.metadata, dataset_id)
    if problem is None and columns is None:
        problem = schema_problem(table.schema)
    if problem is not None:
        raise FormatError(str(path), problem)
    return table
