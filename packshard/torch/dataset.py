"""Read packed shards as torch datasets: random access and exact, resumable streaming.

An output folder ``OUT`` holds ``shard-00000.parquet …`` and ``manifest.json``.  Each shard row
is one packed row (``input_ids``, ``labels``, ``position_ids``, ``cu_seqlens``, ``example_ids``).
Opening a folder reads only the manifest: the number of rows, hence the number of steps, is
known before any shard is touched.  A shard is decoded on first use into Arrow buffers (one per
column, never Python lists) and each row is a slice of them::

    input_ids.values  [t t t t t t t t t t t t …]      row i = values[offsets[i]:offsets[i+1]]
    input_ids.offsets [0     5        12    …]

``__getitem__`` copies the slice once, widening ``input_ids``/``labels``/``position_ids`` to
int64 (what Hugging Face models index embeddings and compute losses with); ``cu_seqlens`` stays
int32 (what flash-attention varlen kernels take).  The copy keeps the shard buffers immutable
(Arrow's are read-only; torch tensors over them would not be).  When the manifest records the
position policy ``reset`` (the contract's only one, proven by ``verify``), ``position_ids`` is
computed from ``cu_seqlens`` instead of decoded: Parquet decoding is the slow part of a cold
read (about a third less work).  ``cache_dir`` keeps an uncompressed Arrow IPC copy of each
decoded shard and memory-maps it, so later processes, DataLoader workers and epochs skip the
decode and share one copy through the page cache.

Streaming order (:class:`PackedIterableDataset`), for ``N`` rows, ``world_size`` ranks, epoch
``e``::

    perm    = permutation(N) drawn from (seed, e)              # identity when shuffle=False
    perm    = perm[: N // world_size * world_size]             # drop_remainder=True (default)
            | perm repeated cyclically to ceil(N / world_size) * world_size   # drop_remainder=False
    rank r  = perm[r::world_size]                              # same length on every rank
    worker  = the rank's list from the resume offset, cut into chunks of batch_size,
              chunk c going to DataLoader worker c % num_workers

DataLoader collects worker batches round-robin (worker 0, 1, …, 0, 1, …), so with
``batch_size`` equal to the loader's the training loop sees the rank's list strictly in order,
whatever ``num_workers`` is.  The whole position is therefore ``(epoch, consumed)``: rows this
rank has handed to the loop in this epoch.  ``state_dict()`` stores it and a resumed run starts
at exactly the next row.  With ``num_workers=0`` the dataset counts rows itself; with worker
processes their copies cannot report back, so use :class:`ResumableLoader` (it counts batches
as they arrive) or pass ``consumed=`` to :meth:`PackedIterableDataset.state_dict`.  The dropped
rows under ``drop_remainder`` differ from epoch to epoch because the permutation does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from packshard.errors import ManifestError, UsageError
from packshard.format.manifest import META_FORMAT_VERSION, check_format_version, load_manifest, sha256_path

TOKEN_COLUMNS = ("input_ids", "labels", "position_ids")
LIST_COLUMNS = (*TOKEN_COLUMNS, "cu_seqlens", "example_ids")
STATE_VERSION = 1

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


def _read_table(path: Path, columns: list[str], cache: Path | None) -> pa.Table:
    """Decode a shard's columns, or map its uncompressed Arrow IPC copy from ``cache``."""
    if cache is not None and cache.is_file():
        return pa.ipc.open_file(pa.memory_map(str(cache))).read_all()
    table = pq.read_table(path, columns=columns, memory_map=True).combine_chunks()
    if cache is None:
        return table
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(tmp, cache)  # atomic: concurrent workers may race, each writes a full file
    return pa.ipc.open_file(pa.memory_map(str(cache))).read_all()


class _Shard:
    """One opened shard: per list column, Arrow offsets and values as numpy views."""

    __slots__ = ("columns", "derive_positions")

    def __init__(
        self, path: Path, expected_rows: int, derive_positions: bool, cache: Path | None
    ) -> None:
        names = [c for c in LIST_COLUMNS if not (derive_positions and c == "position_ids")]
        table = _read_table(path, names, cache)
        meta = table.schema.metadata or {}
        if META_FORMAT_VERSION not in meta:
            raise ManifestError(f"{path}: no packshard.format_version in the Parquet metadata")
        check_format_version(int(meta[META_FORMAT_VERSION]), str(path))
        if table.num_rows != expected_rows:
            raise ManifestError(
                f"{path}: {table.num_rows} rows, but the manifest says {expected_rows} "
                "(the folder is incomplete or was modified: run packshard verify)"
            )
        self.derive_positions = derive_positions
        self.columns = [(name, *_column(table, name)) for name in names]

    def row(self, i: int) -> Row:
        out: Row = {}
        for name, offsets, values in self.columns:
            view = values[offsets[i] : offsets[i + 1]]
            wide = np.int32 if name == "cu_seqlens" else np.int64
            out[name] = torch.from_numpy(view.astype(wide))  # astype copies: writable tensor
        if self.derive_positions:  # policy "reset": 0, 1, … from every segment start
            cu = out["cu_seqlens"].numpy()
            starts = np.repeat(cu[:-1].astype(np.int64), np.diff(cu))
            out["position_ids"] = torch.from_numpy(np.arange(len(starts)) - starts)
        return out


class PackedDataset(Dataset[Row]):
    """Map-style access to the packed rows of ``OUT``, in manifest order.

    Args:
        out: the folder ``packshard pack`` wrote.
        expected_tokenizer_sha256: refuse the folder unless it was packed with this tokenizer.
        tokenizer: a ``tokenizer.json`` or its folder; its SHA-256 is compared the same way.
        cache_dir: keep an uncompressed Arrow IPC copy of every shard here (about 12 bytes a
            token, named by the shard's SHA-256) and memory-map it: decoded once, then shared
            through the page cache by all workers, epochs and runs.

    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        *,
        expected_tokenizer_sha256: str | None = None,
        tokenizer: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.out = Path(out)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.manifest = load_manifest(self.out, validate=False)
        where = str(self.out / "manifest.json")
        packed_sha = str(self.manifest.get("tokenizer", {}).get("sha256", ""))
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
        shards = self.manifest.get("shards")
        if not isinstance(shards, list):
            raise ManifestError(f"{where}: no 'shards' list")
        self.shard_paths = [self.out / str(s["path"]) for s in shards]
        self.shard_rows = np.array([int(s["rows"]) for s in shards], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.shard_rows)]).astype(np.int64)
        self.max_seq_len = int(self.manifest.get("config", {}).get("max_seq_len", 0))
        self.dataset_id = str(self.manifest.get("dataset_id", ""))
        self.derive_positions = self.manifest.get("config", {}).get("position_ids") == "reset"
        self.shard_keys = [
            str(s.get("sha256") or f"{self.dataset_id}-{k}") for k, s in enumerate(shards)
        ]
        self._shards: dict[int, _Shard] = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_shards"] = {}  # decoded buffers are rebuilt in each worker, never pickled
        return state

    def _shard(self, k: int) -> _Shard:
        shard = self._shards.get(k)
        if shard is None:
            cache = None
            if self.cache_dir is not None:
                kind = "derived" if self.derive_positions else "stored"
                cache = self.cache_dir / f"{self.shard_keys[k]}-{kind}-positions.arrow"
            rows = int(self.shard_rows[k])
            shard = _Shard(self.shard_paths[k], rows, self.derive_positions, cache)
            self._shards[k] = shard
        return shard

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
        return self._shard(k).row(i)


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Return ``(rank, world_size)``: explicit values, else torch.distributed's, else (0, 1)."""
    if rank is None and world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if rank is None or world_size is None:
        raise UsageError("pass both rank and world_size, or neither")
    if not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not in [0, world_size {world_size})")
    return rank, world_size


def epoch_rows(
    num_rows: int, *, seed: int, epoch: int, shuffle: bool, world_size: int, drop_remainder: bool
) -> np.ndarray:
    """Return the ``[world_size, rows_per_rank]`` row indices of one epoch (see module doc)."""
    if shuffle:
        perm = np.random.Generator(np.random.PCG64([seed, epoch])).permutation(num_rows)
    else:
        perm = np.arange(num_rows, dtype=np.int64)
    per_rank = num_rows // world_size if drop_remainder else -(-num_rows // world_size)
    perm = np.resize(perm, per_rank * world_size)  # truncates, or repeats cyclically
    return perm.reshape(per_rank, world_size).T.copy()


class PackedIterableDataset(IterableDataset[Row]):
    """Stream the rows of ``OUT`` to one rank: shuffled per epoch, split over workers, resumable.

    Args:
        out: the folder ``packshard pack`` wrote.
        shuffle: draw a new row permutation every epoch from ``(seed, epoch)``.
        seed: the permutation seed, identical on every rank.
        rank, world_size: this process's place; default: torch.distributed's, else 0 of 1.
        drop_remainder: ``True`` (default) drops the last ``N % world_size`` rows of each
            epoch's permutation; ``False`` repeats its first rows instead, so no row is skipped.
        batch_size: the DataLoader's batch size; needed for an exact order with worker
            processes (:class:`ResumableLoader` sets it).
        expected_tokenizer_sha256, tokenizer, cache_dir: as for :class:`PackedDataset`.

    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_remainder: bool = True,
        batch_size: int = 1,
        expected_tokenizer_sha256: str | None = None,
        tokenizer: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.data = PackedDataset(
            out,
            expected_tokenizer_sha256=expected_tokenizer_sha256,
            tokenizer=tokenizer,
            cache_dir=cache_dir,
        )
        self.shuffle, self.seed, self.drop_remainder = shuffle, seed, drop_remainder
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.batch_size = batch_size
        n = len(self.data)
        if drop_remainder and n < self.world_size:
            raise UsageError(
                f"{out}: {n} rows for {self.world_size} ranks leaves every rank empty "
                "(use drop_remainder=False to repeat rows)"
            )
        self.epoch = 0
        self.consumed = 0

    def __len__(self) -> int:
        n, w = len(self.data), self.world_size
        return n // w if self.drop_remainder else -(-n // w)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``; a different epoch than the current one restarts at its first row."""
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0

    def rank_rows(self, epoch: int | None = None) -> np.ndarray:
        """Return this rank's row indices for ``epoch`` (default: the current one), in order."""
        rows = epoch_rows(
            len(self.data),
            seed=self.seed,
            epoch=self.epoch if epoch is None else epoch,
            shuffle=self.shuffle,
            world_size=self.world_size,
            drop_remainder=self.drop_remainder,
        )
        return rows[self.rank]

    def begin_pass(self) -> None:
        """Move to the next epoch when the current one was fully consumed."""
        if self.consumed >= len(self):
            self.epoch, self.consumed = self.epoch + 1, 0

    def __iter__(self) -> Iterator[Row]:
        info = get_worker_info()
        if info is None:
            self.begin_pass()
        todo = self.rank_rows()[self.consumed :]
        if info is not None and info.num_workers > 1:
            chunk = np.arange(len(todo)) // max(self.batch_size, 1)
            todo = todo[chunk % info.num_workers == info.id]
        for index in todo.tolist():
            row = self.data[index]
            if info is None:
                self.consumed += 1
            yield row

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Return the resume point; ``consumed`` overrides the rows counted so far this epoch."""
        return {
            "version": STATE_VERSION,
            "dataset_id": self.data.dataset_id,
            "num_rows": len(self.data),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "world_size": self.world_size,
            "drop_remainder": self.drop_remainder,
            "epoch": self.epoch,
            "consumed": self.consumed if consumed is None else int(consumed),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (from any rank: every rank consumes the same number of rows)."""
        mine = self.state_dict()
        for key in ("version", "dataset_id", "num_rows", "seed", "shuffle", "world_size"):
            if state.get(key) != mine[key]:
                raise UsageError(
                    f"cannot resume: the saved state has {key}={state.get(key)!r} but this "
                    f"dataset has {key}={mine[key]!r} (resume with the same data and settings)"
                )
        if state.get("drop_remainder") != self.drop_remainder:
            raise UsageError("cannot resume: drop_remainder differs from the saved state")
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])


class _CountRows:
    """Collate wrapper that also reports how many rows went into the batch."""

    def __init__(self, collate_fn: Callable[[list[Row]], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, rows: list[Row]) -> tuple[int, Any]:
        return len(rows), self.collate_fn(rows)


class ResumableLoader:
    """A DataLoader over a :class:`PackedIterableDataset` that knows how far the loop got.

    It counts the rows of every batch it hands out, so ``state_dict()`` is exact with any
    ``num_workers``; extra keyword arguments go to :class:`torch.utils.data.DataLoader`.
    """

    def __init__(
        self,
        dataset: PackedIterableDataset,
        *,
        batch_size: int,
        collate_fn: Callable[[list[Row]], Any],
        num_workers: int = 0,
        **kwargs: Any,
    ) -> None:
        dataset.batch_size = batch_size
        self.dataset = dataset
        self.num_workers = num_workers
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            collate_fn=_CountRows(collate_fn),
            num_workers=num_workers,
            **kwargs,
        )

    def __len__(self) -> int:
        return -(-len(self.dataset) // self.dataset.batch_size)

    def __iter__(self) -> Iterator[Any]:
        self.dataset.begin_pass()
        for count, batch in self.loader:
            if self.num_workers > 0:  # with workers=0 the dataset counted the rows itself
                self.dataset.consumed += count
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """Forward to :meth:`PackedIterableDataset.set_epoch`."""
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Return the dataset's resume point."""
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the dataset at ``state``."""
        self.dataset.load_state_dict(state)
