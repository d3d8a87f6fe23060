"""The examples index, ``examples.parquet``: one row per packed example, written and read here.

Columns, in order (one row per segment of every shard, sorted by ``example_id``)::

    example_id       int64    0 … n-1, numbered in input order (record, then part)
    source           string   the input path as recorded in the manifest
    line             int64    1-based line (JSONL), element (JSON array) or row (Parquet)
    part             int32    0 unless the record was split
    token_offset     int64    where the example starts within its record's tokens
    domain           string
    num_tokens       int32
    num_loss_tokens  int32    trained labels, the seam-masked first one not counted
    truncated        bool
    shard            int32    0-based index into the manifest's shards
    row              int32    0-based row within that shard
    turn             int32    --turns expand: the 1-based message the example trains, else 0
                              (added within format version 1: a file without it reads as 0)
    split            string   ``train`` or ``eval``; only in a pack with an eval split
                              (added within format version 1: a file without it is all train)
    repeat           int32    which copy of its record's example (0 first, 1, 2 …); only in a
                              pack made with ``--mix`` (added within format version 1)
    pair_id          int64    the chosen branch's example_id; only in a pack with preference
                              or KTO records, null for an example that is no pair branch
    branch           string   ``chosen`` / ``rejected`` (null: no pair branch); same packs
    kto_label        bool     an unpaired KTO record's label (null otherwise); same packs
    media            list<struct>  the example's images in order: ``root``, ``path`` (relative
                              to root), ``bytes``, ``sha256``, ``width``, ``height``, ``grid_t``,
                              ``grid_h``, ``grid_w``; only in a pack with images (last column)

Like the shards, the file carries the format version and dataset id in its key-value metadata
and readers refuse a file of another dataset.  :class:`ExamplesIndex` holds the columns verify
needs as arrays, with sources dictionary-encoded, so no per-example Python runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packshard.arrays import arrow_array, arrow_coded_strings
from packshard.errors import FormatError
from packshard.format.folder.paths import open_inside
from packshard.format.version import metadata_problem, parquet_metadata

EXAMPLES_NAME = "examples.parquet"
EXAMPLES_SCHEMA = pa.schema(
    [
        ("example_id", pa.int64()),
        ("source", pa.string()),
        ("line", pa.int64()),
        ("part", pa.int32()),
        ("token_offset", pa.int64()),
        ("domain", pa.string()),
        ("num_tokens", pa.int32()),
        ("num_loss_tokens", pa.int32()),
        ("truncated", pa.bool_()),
        ("shard", pa.int32()),
        ("row", pa.int32()),
        ("turn", pa.int32()),
    ]
)
OPTIONAL_COLUMNS = ("turn",)
"""Columns added within format version 1: a file written before them reads without them."""
SPLITS = ("train", "eval")
SPLIT_SCHEMA = EXAMPLES_SCHEMA.append(pa.field("split", pa.string()))
"""The index of a pack with an eval split: one more column, ``split``, after the others."""
REPEAT_FIELD = pa.field("repeat", pa.int32())
"""The last column of a ``--mix`` pack's index (:mod:`packshard.pack.plan.mix`)."""
PAIR_FIELDS = (
    pa.field("pair_id", pa.int64()),
    pa.field("branch", pa.string()),
    pa.field("kto_label", pa.bool_()),
)
"""Last columns of the index of a pack with preference or KTO records (null elsewhere).

``pair_id`` is the ``example_id`` of the pair's chosen branch (so ``pair_id`` and
``pair_id + 1`` are its two segments), ``branch`` ``chosen`` or ``rejected``, ``kto_label`` a
KTO record's label.  Given to :func:`build_examples_table` as one int8 column ``pair_code``
(0 plain, 1 chosen, 2 rejected, 3 KTO undesirable, 4 KTO desirable).
"""
BRANCHES = ("chosen", "rejected")
MEDIA_FIELD = pa.field(
    "media",
    pa.list_(
        pa.struct(
            [
                ("root", pa.string()),
                ("path", pa.string()),
                ("bytes", pa.int64()),
                ("sha256", pa.string()),
                ("width", pa.int32()),
                ("height", pa.int32()),
                ("grid_t", pa.int32()),
                ("grid_h", pa.int32()),
                ("grid_w", pa.int32()),
            ]
        )
    ),
)
"""The last column of the index of a pack with images: each example's images by reference."""


def has_media(folder: Path) -> bool:
    """Tell whether a pack's examples index records images (a ``media`` column).

    The index is opened only inside ``folder`` (:func:`open_inside`): a link leaving it, or
    anything but a regular file, reads as no images here and is integrity's finding.
    """
    try:
        fd = open_inside(folder, EXAMPLES_NAME)
    except FormatError:
        return False
    with os.fdopen(fd, "rb") as fh:
        try:
            return MEDIA_FIELD.name in pq.read_schema(fh).names
        except Exception:  # an unreadable index is integrity's finding, not the caller's
            return False


def build_examples_table(
    columns: Mapping[str, np.ndarray], source_names: list[str], domain_names: list[str]
) -> pa.Table:
    """Return the index table from per-example arrays.

    ``columns`` holds every column of :data:`EXAMPLES_SCHEMA` as a numpy array, except that
    ``source`` and ``domain`` are codes into ``source_names`` and ``domain_names``; an
    optional column left out is all zeros; ``split`` (a bool per example, True for eval) and
    ``repeat`` are written only when given; so are the :data:`PAIR_FIELDS`, made from
    ``pair_code``.
    """
    arrays = []
    n = len(columns["example_id"])
    schema = SPLIT_SCHEMA if "split" in columns else EXAMPLES_SCHEMA
    if "repeat" in columns:
        schema = schema.append(REPEAT_FIELD)
    for name, kind in zip(schema.names, schema.types, strict=True):
        if name == "split":
            codes = np.asarray(columns[name]).astype(np.int8)
            arrays.append(arrow_coded_strings(codes, list(SPLITS)))
        elif name not in columns and name in OPTIONAL_COLUMNS:
            arrays.append(arrow_array(np.zeros(n, dtype=np.int32), kind))
        elif name == "source":
            arrays.append(arrow_coded_strings(columns[name], source_names))
        elif name == "domain":
            arrays.append(arrow_coded_strings(columns[name], domain_names))
        else:
            arrays.append(arrow_array(np.asarray(columns[name]), kind))
    if "pair_code" in columns:
        code = np.asarray(columns["pair_code"], dtype=np.int8)
        ids = np.asarray(columns["example_id"], dtype=np.int64)
        branch = (code == 1) | (code == 2)
        kto = code >= 3
        arrays.append(pa.array(ids - (code == 2), pa.int64(), mask=~branch))
        which = pa.array(np.where(branch, code - 1, 0).astype(np.int8), mask=~branch)
        names = pa.array(BRANCHES, pa.string())
        arrays.append(pa.DictionaryArray.from_arrays(which, names).cast(pa.string()))
        arrays.append(pa.array(code == 4, pa.bool_(), mask=~kto))
        schema = pa.schema([*schema, *PAIR_FIELDS])
    if "media" in columns:
        arrays.append(pa.array(list(columns["media"]), MEDIA_FIELD.type))
        schema = schema.append(MEDIA_FIELD)
    return pa.Table.from_arrays(arrays, schema=schema)


EXAMPLE_GROUP_ROWS = 128 * 1024
"""Rows of a row group of the index: ``pack`` builds and writes it one chunk at a time.

131,072 rows (1,048,576 before): a chunk costs about 180 bytes a row while it is written
(the Arrow table, half of it the ``source`` and ``domain`` strings, and the Parquet
writer's buffers), about 23 MiB, reached at 131,072 examples and fixed from there.  An
index of at most this many rows is one row group, the same bytes as before; a larger one
has a row group per chunk (readers read the whole file and do not care).
"""


def write_examples(path: Path, tables: pa.Table | Iterable[pa.Table], dataset_id: str) -> None:
    """Write the index with zstd and the dataset's metadata.

    ``tables`` is the index, or its chunks of :data:`EXAMPLE_GROUP_ROWS` rows (the last one
    shorter), each written as one row group: the same bytes as the whole table, without the
    whole index in memory at once.
    """
    metadata = parquet_metadata(dataset_id)
    writer = None
    try:
        for table in [tables] if isinstance(tables, pa.Table) else tables:
            table = table.replace_schema_metadata(metadata)
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, compression="zstd")
            writer.write_table(table)
            del table  # not alive while the next chunk is built
            pa.default_memory_pool().release_unused()
    finally:
        if writer is not None:
            writer.close()


def read_examples(
    path: Path,
    dataset_id: str,
    columns: list[str] | None = None,
    dictionary: list[str] | None = None,
) -> pa.Table:
    """Read the index, refusing one whose metadata or columns are not this dataset's.

    ``dictionary`` names string columns read dictionary-encoded (a name once per row group,
    a code per example), as Parquet stores them.

    Raises:
        FormatError: unreadable, of another dataset, or missing a column.

    """
    try:  # no pyarrow.dataset: no pandas
        table = pq.ParquetFile(path, read_dictionary=dictionary).read(columns=columns)
    except Exception as exc:  # any decode failure: pyarrow raises many kinds
        raise FormatError(str(path), f"unreadable Parquet: {exc}") from None
    problem = metadata_problem(table.schema.metadata, dataset_id)
    wanted = columns or [c for c in EXAMPLES_SCHEMA.names if c not in OPTIONAL_COLUMNS]
    missing = [c for c in wanted if c not in table.column_names]
    if problem is None and missing:
        problem = f"missing columns {', '.join(missing)}"
    if problem is not None:
        raise FormatError(str(path), problem)
    return table


def _equals(table: pa.Table, column: str, value: str) -> np.ndarray:
    """Where a string column holds ``value`` (nowhere where it is null), as bools."""
    import pyarrow.compute as pc  # readers only: pack writes the index without it

    return np.asarray(pc.equal(table[column], value).fill_null(False).to_numpy(False), bool)


@dataclass(frozen=True, slots=True)
class ExamplesIndex:
    """The examples index as arrays, in file order (``example_id[i] == i`` when sound).

    Sources are kept dictionary-encoded (one name per input file, a code per example), and
    ids are looked up by position when dense, else by binary search: no per-example Python.
    """

    example_id: np.ndarray
    shard: np.ndarray
    row: np.ndarray
    num_tokens: np.ndarray
    num_loss_tokens: np.ndarray
    token_offset: np.ndarray
    source_code: np.ndarray
    source_names: tuple[str, ...]
    lines: np.ndarray
    order: np.ndarray | None  # argsort of example_id; None when example_id[i] == i
    turns: np.ndarray | None = None  # the ``turn`` column; None: the file has none (all 0)
    is_eval: np.ndarray | None = None  # the ``split`` column == "eval"; None: no such column
    domain_code: np.ndarray | None = None  # codes into ``domain_names``; None: not read
    domain_names: tuple[str, ...] = ()
    repeats: np.ndarray | None = None  # the ``repeat`` column (``--mix``); None: no such column
    branches: np.ndarray | None = None  # int8 1 chosen, 2 rejected, 0 none; None: no pairs
    pair_ids: np.ndarray | None = None  # int64 ``pair_id``, -1 where null; None: no pairs

    @staticmethod
    def from_table(table: pa.Table) -> ExamplesIndex:
        """Build from the table :func:`read_examples` returns."""
        ids = np.asarray(table["example_id"].to_numpy(), dtype=np.int64)
        n = len(ids)
        dense = n == 0 or (ids[0] == 0 and bool(np.all(np.diff(ids) == 1)))
        source = table["source"].combine_chunks().fill_null("").dictionary_encode()
        names = table.column_names
        domain = None
        if "domain" in names:
            domain = table["domain"].combine_chunks().fill_null("").dictionary_encode()
        branches = None
        if "branch" in names:  # 1 chosen, 2 rejected
            chosen, rejected = (_equals(table, "branch", b) for b in BRANCHES)
            branches = (chosen + 2 * rejected).astype(np.int8)
        return ExamplesIndex(
            example_id=ids,
            shard=table["shard"].to_numpy(),
            row=table["row"].to_numpy(),
            num_tokens=table["num_tokens"].to_numpy(),
            num_loss_tokens=table["num_loss_tokens"].to_numpy(),
            token_offset=table["token_offset"].to_numpy(),
            source_code=source.indices.to_numpy(zero_copy_only=False),
            source_names=tuple(source.dictionary.to_pylist()),
            lines=table["line"].to_numpy(),
            order=None if dense else np.argsort(ids, kind="stable"),
            turns=table["turn"].to_numpy() if "turn" in names else None,
            is_eval=_equals(table, "split", "eval") if "split" in names else None,
            domain_code=None if domain is None else domain.indices.to_numpy(zero_copy_only=False),
            domain_names=() if domain is None else tuple(domain.dictionary.to_pylist()),
            repeats=table["repeat"].to_numpy() if "repeat" in names else None,
            branches=branches,
            pair_ids=np.asarray(table["pair_id"].fill_null(-1).to_numpy(), np.int64)
            if "pair_id" in names
            else None,
        )

    @property
    def sources(self) -> list[str]:
        """Each example's source path (one Python string per example: not for hot paths)."""
        names = self.source_names
        return [names[c] for c in self.source_code.tolist()]

    @property
    def dense(self) -> bool:
        """True when ids are ``0 … n-1`` in order, as ``pack`` writes them."""
        return self.order is None

    def lookup(self, example_ids: np.ndarray) -> np.ndarray:
        """Position of each id in the index, -1 where absent."""
        ids = np.asarray(example_ids, dtype=np.int64)
        n = len(self.example_id)
        if self.order is None:
            return np.where((ids >= 0) & (ids < n), ids, -1)
        if n == 0:
            return np.full(len(ids), -1, dtype=np.int64)
        ordered = self.example_id[self.order]
        at = np.minimum(np.searchsorted(ordered, ids), n - 1)
        return np.where(ordered[at] == ids, self.order[at], -1)

    def where(self, example_id: int) -> str | None:
        """``source:line`` of an example id, or None when the index lacks it."""
        i = int(self.lookup(np.array([example_id]))[0])
        if i < 0:
            return None
        return f"{self.source_names[int(self.source_code[i])]}:{int(self.lines[i])}"
