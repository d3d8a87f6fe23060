"""Read packed shards as torch datasets: random access and exact, resumable streaming.

Opening a folder reads only the manifest (the number of rows is known before any shard is
touched).  A shard is decoded on first use into Arrow buffers and each row is a slice::

    input_ids.values  [t t t t t t t t t t t t …]      row i = values[offsets[i]:offsets[i+1]]
    input_ids.offsets [0     5        12    …]

A preference pack's shards also hold ``branch`` and ``kto_label`` (one int8 per segment, parallel
to ``example_ids``); rows then carry them too, and the collators pass them on per segment.

``__getitem__`` copies the slice once (the shard buffers stay immutable), widening
``input_ids``/``labels``/``position_ids`` to int64 (what Hugging Face models index and compute
losses with); ``cu_seqlens`` stays int32 (what varlen kernels take).  Under the position
policy ``reset`` (the contract's only one) ``position_ids`` is computed from ``cu_seqlens``, not
decoded: about a third less work on a cold read.  ``cache_dir`` keeps an uncompressed Arrow IPC
copy of each decoded shard and memory-maps it, shared by processes, workers and epochs.

A folder may come from anyone, so the reader checks what it serves: the manifest's entries
are schema-checked, every shard path must be a regular file inside ``OUT``
(:mod:`packshard.format.folder.paths`), each shard's row count comes from its footer before any
array is sized by it.  A shard opened for reading is read once, hashed as it streams in and
compared with the manifest's SHA-256, and the bytes checked are the bytes decoded; then its
dataset id, row boundaries, token ids (inside ``vocab_size``) and labels (-100 or their own
token) are checked.  Any failure is a :class:`~packshard.errors.FormatError` naming the file
and the fix.

A shard is hashed in full as it is read (it is decoded anyway: about 15% more); a cache entry,
served by a memory map, is hashed in full once, its file status recorded in the cache
folder, and hashed again whenever that status changes (:func:`_stamp`); ``docs/performance.md``
("Reader checks") has the figures.

``out`` may be a store URL (``s3://bucket/out``, :mod:`packshard.store`): the manifest is one
GET, each shard's footer a ranged read at open, a shard read in ranged requests of 8 MiB when
its first row is asked for, hashed and checked like a local one (again at each open, even
with ``cache_dir``: a store object has no file status to trust).

Streaming, shuffled and split over ranks and workers, is :mod:`packshard.torch.stream`.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from packshard.arrays import exclusive_cumsum
from packshard.digests import read_hashed, sha256_bytes, sha256_path
from packshard.errors import FormatError, ManifestError, UsageError
from packshard.format.folder.paths import duplicate_paths, inside_folder, open_inside
from packshard.format.manifest import load_manifest, part_errors
from packshard.format.shards import replaced_shard, rows_problem, tokens_problem
from packshard.format.topology import PADDED_COLUMN, padded_row, padded_rows_wrong
from packshard.format.version import metadata_problem
from packshard.records import PackedRow
from packshard.store import StoreUrl, is_url, open_object, parse_url
from packshard.store.objects import child_object, read_hashed_object
from packshard.torch.steps import STEP_KEY, check_steps, map_step_items, positive_int

LIST_COLUMNS = ("input_ids", "labels", "position_ids", "cu_seqlens", "example_ids")
UNPADDED_KEY = "cu_seqlens_unpadded"
"""An aligned row's real boundaries, beside its padded ``cu_seqlens`` (TE's ``cu_seqlens``)."""
PAIR_COLUMNS = ("branch", "kto_label")
"""Per-segment int8 columns of preference packs (``branch`` 0/1 chosen/2 rejected, ``kto_label``
-1/0/1), read and passed on only where a shard has them."""
WIDTHS = {
    "cu_seqlens": np.int32,
    "branch": np.int8,
    "kto_label": np.int8,
    PADDED_COLUMN: np.int32,
    UNPADDED_KEY: np.int32,
}
"""The dtype of each column in a row; the token columns and ``example_ids`` are int64."""


Row = dict[str, torch.Tensor]


def tokenizer_sha256(tokenizer: str | os.PathLike[str]) -> str:
    """Return the SHA-256 of a ``tokenizer.json`` (given as the file or its folder)."""
    path = Path(tokenizer)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise UsageError(f"{path}: no tokenizer.json to compare with the shards' tokenizer")
    return sha256_path(path)


def _column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Return a list column's (offsets, values) as numpy views of its Arrow buffers."""
    col = table.column(name)
    arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return arr.offsets.to_numpy(), arr.values.to_numpy()


def _read_table(data: PackedDataset, k: int, columns: list[str]) -> pa.Table:
    """Decode shard ``k``'s columns, or map its uncompressed Arrow IPC copy from ``cache_dir``.

    The shard is opened once, checked at that moment to be the file inside the folder its
    manifest names (:func:`~packshard.format.folder.paths.open_inside`), and read whole
    through that descriptor, its SHA-256 computed as it is read
    (:func:`~packshard.digests.read_hashed`) and compared with the manifest's.  Those same
    bytes are what is decoded: a shard replaced, rewritten in place or tampered with, before
    the dataset was opened or after, is refused by name, never served.

    With ``cache_dir``, a checked shard's file status is recorded (:func:`_stamp`); a later
    open whose shard has that very status maps the cache entry without reading the shard.
    The entry is named by both SHA-256s and checked when it is mapped (:func:`_mapped`).
    """
    path, cache_dir = data.where(k), data.cache_dir
    expected = data.shard_sha256[k]
    stem = f"{expected}-{'derived' if data.derive_positions else 'stored'}-positions-"
    seen = None if cache_dir is None else cache_dir / f"{expected}.shard.checked"
    stamp = None
    if data.url is not None:  # a store: read in ranges and hashed every time it is opened
        raw, digest = read_hashed_object(child_object(data.url, data.shard_names[k]))
    else:
        try:
            fd = open_inside(data.out, data.shard_names[k])
        except FormatError as exc:
            raise FormatError(path, f"{exc.problem} (run packshard verify)") from None
        with os.fdopen(fd, "rb") as fh:
            stamp = _stamp(os.fstat(fh.fileno()))
            if (
                seen is not None
                and _recorded(seen) == stamp
                and (found := _entry(seen.parent, stem))
            ):
                return found
            raw, digest = read_hashed(fh)
    if digest != expected:
        raise FormatError(path, replaced_shard(data.url or data.out))
    if cache_dir is None or seen is None:
        return pq.read_table(pa.BufferReader(pa.py_buffer(raw)), columns=columns).combine_chunks()
    cache_dir.mkdir(parents=True, exist_ok=True)
    if stamp is not None:
        _record(seen, stamp)
    if found := _entry(cache_dir, stem):
        return found
    table = pq.read_table(pa.BufferReader(pa.py_buffer(raw)), columns=columns).combine_chunks()
    del raw
    tmp = cache_dir / f".{stem}{os.getpid()}.tmp"
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    written = sha256_path(tmp)
    cache = cache_dir / f"{stem}{written}.arrow"
    os.replace(tmp, cache)  # atomic: concurrent workers may race, each writes a full file
    return _mapped(cache, written)


def _entry(cache_dir: Path, stem: str) -> pa.Table | None:
    """Map the cache entry named ``STEM<its own SHA-256>.arrow``, checked, or None if none."""
    for entry in sorted(cache_dir.glob(f"{stem}*.arrow")):
        return _mapped(entry, entry.name[len(stem) : -len(".arrow")])
    return None


def _stamp(st: os.stat_result) -> str:
    """Return a file's status as recorded after a full hash: device, inode, size, times.

    Writing over a file, in place or by a rename, changes its change time (``st_ctime_ns``),
    which no call can set back: an equal stamp is the file that was hashed, unchanged.
    """
    return f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}\n"


def _recorded(record: Path) -> str:
    """Return the stamp ``record`` holds ('' when there is none, or it is not one)."""
    try:
        return record.read_text(encoding="ascii") if record.stat().st_size < 256 else ""
    except (OSError, UnicodeDecodeError):
        return ""


def _record(record: Path, stamp: str) -> None:
    """Write ``stamp`` into ``record`` atomically (concurrent workers write the same)."""
    tmp = record.with_name(f".{record.name}.{os.getpid()}.tmp")
    tmp.write_text(stamp, encoding="ascii")
    os.replace(tmp, record)


def _mapped(cache: Path, expected: str) -> pa.Table:
    """Memory-map a cache entry, check it is the one named ``expected``, read it from the map.

    The entry is hashed in full (through the mapping the table is then read from) unless its
    status (:func:`_stamp`) is the one recorded in ``ENTRY.checked`` when it was last hashed
    and found equal to its name: a forged entry is always hashed, and refused.
    """
    fd = os.open(cache, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        mapped = mmap.mmap(fd, st.st_size, access=mmap.ACCESS_READ) if st.st_size else b""
    finally:
        os.close(fd)
    stamp, record = _stamp(st), cache.with_name(f"{cache.name}.checked")
    if _recorded(record) != stamp:
        if sha256_bytes(mapped) != expected:
            raise FormatError(
                str(cache),
                "SHA-256 differs from the one this cache entry was written with: it was "
                "modified (delete it: it is rebuilt from the shard)",
            )
        _record(record, stamp)
    return pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapped))).read_all()


Columns = list[tuple[str, np.ndarray, np.ndarray]]
"""An opened shard: per list column read, its name and Arrow offsets and values as numpy views."""


def _open_shard(data: PackedDataset, k: int) -> Columns:
    """Decode shard ``k`` and check it against its manifest entry and the row invariants."""
    extra = data.shard_extra[k]
    names = [c for c in LIST_COLUMNS if not (data.derive_positions and c == "position_ids")]
    names += extra
    path = data.where(k)
    try:
        table = _read_table(data, k, names)
    except (OSError, pa.ArrowException) as exc:
        raise FormatError(path, f"unreadable shard: {exc} (run packshard verify)") from None
    problem = metadata_problem(table.schema.metadata, data.dataset_id) or rows_problem(table)
    if problem is None:
        problem = tokens_problem(table, data.vocab_size)
    if problem is None:
        problem = segment_columns_problem(table, tuple(c for c in extra if c in PAIR_COLUMNS))
    if problem is None and PADDED_COLUMN in extra:
        problem = _padded_problem(data, table)
    if problem is not None:
        raise FormatError(path, f"{problem} (run packshard verify)")
    if table.num_rows != data.shard_rows[k]:
        raise ManifestError(
            f"{path}: {table.num_rows} rows, but the manifest says {data.shard_rows[k]} "
            "(the folder is incomplete or was modified: run packshard verify)"
        )
    return [(name, *_column(table, name)) for name in names]


def _padded_problem(data: PackedDataset, table: pa.Table) -> str | None:
    """Say which row's ``cu_seqlens_padded`` is not its segments rounded up, or None."""
    cu_off, cu = _column(table, "cu_seqlens")
    padded_off, padded = _column(table, PADDED_COLUMN)
    wrong = padded_rows_wrong(cu, cu_off, padded, padded_off, data.alignment, data.max_seq_len)
    if wrong.size:
        padded_to = f"each segment padded to {data.alignment}"
        return f"row {int(wrong[0])}: {PADDED_COLUMN} is not {padded_to}"
    return None


def segment_columns_problem(table: pa.Table, names: tuple[str, ...]) -> str | None:
    """Say which row's per-segment column (``branch``, ``kto_label``) breaks its row, or None.

    Each must have one entry per segment (``example_ids``' length); ``branch`` holds 0, 1, 2
    and ``kto_label`` -1, 0, 1.
    """
    segments = np.diff(_column(table, "example_ids")[0])
    allowed = {"branch": (0, 2), "kto_label": (-1, 1)}
    for name in names:
        offsets, values = _column(table, name)
        low, high = allowed[name]
        bad = np.diff(offsets) != segments
        wrong = np.flatnonzero((values < low) | (values > high))
        bad[np.searchsorted(offsets, wrong, side="right") - 1] = True
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            return f"row {row}: {name} has a value out of range or not one entry per segment"
    return None


def split_shards(
    shards: list[dict[str, Any]], split: str, lead: str, verb: str, empty_ok: bool = False
) -> list[int]:
    """Return the indices of the manifest's shard entries of ``split`` (absent ``split``: train).

    Finding none, unless ``empty_ok``, is a :class:`UsageError` that starts with ``lead`` and
    asks to ``verb`` a split the shards hold.
    """
    chosen = [k for k, s in enumerate(shards) if s.get("split", "train") == split]
    if not chosen and not empty_ok:
        found = sorted({str(s.get("split", "train")) for s in shards})
        raise UsageError(
            f"{lead} no {split!r} split (its shards are {found}): {verb} one of those, or "
            "pack with --eval-fraction or --eval"
        )
    return chosen


class PackedDataset(Dataset[Row]):
    """Map-style access to the packed rows of ``OUT``, in manifest order.

    Args:
        out: the folder ``packshard pack`` wrote.
        expected_tokenizer_sha256: refuse the folder unless it was packed with this tokenizer.
        tokenizer: a ``tokenizer.json`` or its folder; its SHA-256 is compared the same way.
        cache_dir: keep an uncompressed Arrow IPC copy of every shard here (about 12 bytes a
            token) and memory-map it: decoded once, shared by workers, epochs and runs.
        grad_accum, batch_size, world_size: every row carries ``num_items_in_step``, the
            trained tokens of its whole optimizer step, read in index order
            (:mod:`packshard.torch.steps`).
        split: read the shards of this split only (``train``, the default, or ``eval``);
            None reads every shard.
        padded: serve each segment padded to the pack's alignment
            (:mod:`packshard.format.topology.aligned`), ``cu_seqlens_unpadded`` beside;
            default: padded when the pack records an alignment; ``False`` serves the real
            tokens with ``cu_seqlens_padded`` beside them.

    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        *,
        expected_tokenizer_sha256: str | None = None,
        tokenizer: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        grad_accum: int | None = None,
        batch_size: int = 1,
        world_size: int | None = None,
        split: str | None = "train",
        padded: bool | None = None,
    ) -> None:
        self.grad_accum, self.batch_size = check_steps(grad_accum, batch_size), batch_size
        self.world_size = None if world_size is None else positive_int("world_size", world_size)
        self.url = parse_url(os.fspath(out)) if is_url(os.fspath(out)) else None
        self.out = Path(out)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.manifest = load_manifest(os.fspath(out), validate=False)  # a folder's or a store's
        where = str(self.url.child("manifest.json") if self.url else self.out / "manifest.json")
        repeated = duplicate_paths(self.manifest)
        if repeated is not None:  # before the schema walks every entry
            raise ManifestError(f"{where}: {repeated} (run packshard verify)")
        problems = part_errors(self.manifest, ("shards", "tokenizer"))  # before any value is used
        if not isinstance(self.manifest.get("dataset_id"), str):
            problems.append("manifest.json: dataset_id: not a string")
        config = self.manifest.get("config", {})
        if not isinstance(config, dict) or type(config.get("max_seq_len", 0)) is not int:
            problems.append("manifest.json: config/max_seq_len: not an integer")
        if problems:
            raise ManifestError(f"{where}: {'; '.join(problems[:3])} (run packshard verify)")
        packed_sha = str(self.manifest["tokenizer"]["sha256"])
        self.vocab_size = int(self.manifest["tokenizer"]["vocab_size"])
        checks = []
        if expected_tokenizer_sha256 is not None:
            checks.append((expected_tokenizer_sha256.lower(), "expected_tokenizer_sha256"))
        if tokenizer is not None:
            checks.append((tokenizer_sha256(tokenizer), str(tokenizer)))
        for expected, source in checks:
            if expected != packed_sha:
                raise ManifestError(
                    f"{where}: shards were packed with tokenizer sha256 {packed_sha}, but "
                    f"{source} has sha256 {expected} (train with the tokenizer the data was "
                    "packed with, or pack again with this one)"
                )
        alignment = config.get("alignment") or {}
        self.alignment = int(alignment.get("multiple", 1)) if isinstance(alignment, dict) else 1
        if padded and self.alignment == 1:
            raise UsageError(
                f"{where}: padded=True, but the pack records no alignment (pack or repack "
                "with --cp N or --pad-multiple N)"
            )
        self.padded = self.alignment > 1 if padded is None else bool(padded)
        tokenizer_entry = self.manifest["tokenizer"]
        self.pad_id = int(tokenizer_entry.get("eos_token_id") or 0)
        shards = self.manifest["shards"]
        if split is not None:
            chosen = split_shards(shards, split, f"{where}:", "read", empty_ok=split == "train")
            shards = [shards[k] for k in chosen]
        self.shard_paths: list[Path | StoreUrl] = [
            child_object(self.url, s["path"]) if self.url else inside_folder(self.out, s["path"])
            for s in shards
        ]
        self.shard_extra: list[tuple[str, ...]] = []
        for path, entry in zip(self.shard_paths, shards, strict=True):
            try:  # a store: the footer in ranged reads, not the shard
                if isinstance(path, StoreUrl):
                    with open_object(path) as handle:
                        footer = pq.read_metadata(handle)
                else:
                    footer = pq.read_metadata(path)
                rows = footer.num_rows  # the footer, not the manifest's word
                names = footer.schema.to_arrow_schema().names
            except (OSError, pa.ArrowException) as exc:
                raise FormatError(str(path), f"unreadable Parquet: {exc}") from None
            aligned = (PADDED_COLUMN,) if self.alignment > 1 else ()
            if aligned and PADDED_COLUMN not in names:
                raise FormatError(
                    str(path),
                    f"the manifest records an alignment of {self.alignment} but the shard has "
                    f"no {PADDED_COLUMN} (run packshard verify)",
                )
            self.shard_extra.append(tuple(c for c in PAIR_COLUMNS if c in names) + aligned)
            if rows != entry["rows"]:
                raise ManifestError(
                    f"{path}: {rows} rows, but the manifest says {entry['rows']} (the folder "
                    "is incomplete or was modified: run packshard verify)"
                )
        self.shard_rows = np.array([int(s["rows"]) for s in shards], dtype=np.int64)
        self.starts = exclusive_cumsum(self.shard_rows)
        self.max_seq_len = int(self.manifest.get("config", {}).get("max_seq_len", 0))
        self.dataset_id = str(self.manifest.get("dataset_id", ""))
        self.derive_positions = self.manifest.get("config", {}).get("position_ids") == "reset"
        self.shard_sha256 = [str(s["sha256"]) for s in shards]
        self.shard_names = [str(s["path"]) for s in shards]  # this split's, in order
        self._shards: dict[int, Columns] = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def where(self, k: int) -> str:
        """Shard ``k``'s path or URL, as messages name it."""
        return str(
            self.url.child(self.shard_names[k]) if self.url else self.out / self.shard_names[k]
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_shards"] = {}  # decoded buffers are rebuilt in each worker, never pickled
        return state

    def _shard(self, k: int) -> Columns:
        if k not in self._shards:
            self._shards[k] = _open_shard(self, k)
        return self._shards[k]

    def locate(self, index: int) -> tuple[int, int]:
        """Return ``(shard, row within shard)`` of global row ``index``."""
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"row {index} out of range for {n} rows")
        k = int(np.searchsorted(self.starts, index, side="right")) - 1
        return k, index - int(self.starts[k])

    def __getitem__(self, index: int) -> Row:
        k, i = self.locate(int(index))
        row: Row = {}
        for name, offsets, values in self._shard(k):
            view = values[offsets[i] : offsets[i + 1]]
            wide = WIDTHS.get(name, np.int64)
            row[name] = torch.from_numpy(view.astype(wide))  # astype copies: writable tensor
        if self.derive_positions:  # policy "reset": 0, 1, … from every segment start
            cu = row["cu_seqlens"].numpy()
            starts = np.repeat(cu[:-1].astype(np.int64), np.diff(cu))
            row["position_ids"] = torch.from_numpy(np.arange(len(starts)) - starts)
        if self.padded:
            row = self._padded(row)
        if self.grad_accum is not None:
            row[STEP_KEY] = map_step_items(self, int(self.starts[k]) + i)
        return row

    def _padded(self, row: Row) -> Row:
        """Return ``row`` with its pads in (:func:`~packshard.format.topology.padded_row`)."""
        packed = PackedRow(
            input_ids=row["input_ids"].numpy(),
            labels=row["labels"].numpy(),
            position_ids=row["position_ids"].numpy(),
            cu_seqlens=row["cu_seqlens"].numpy(),
            example_ids=row["example_ids"].numpy(),
        )
        served, real = padded_row(packed, row.pop(PADDED_COLUMN).numpy(), self.pad_id)
        row["input_ids"] = torch.from_numpy(served.input_ids)
        row["labels"] = torch.from_numpy(served.labels)
        row["position_ids"] = torch.from_numpy(served.position_ids)
        row["cu_seqlens"] = torch.from_numpy(served.cu_seqlens)
        row[UNPADDED_KEY] = torch.from_numpy(real)
        return row
