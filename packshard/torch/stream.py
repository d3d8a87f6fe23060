"""Stream packed rows to one rank: shuffled per epoch, split over workers, exactly resumable.

Streaming order (:class:`PackedIterableDataset`), for ``N`` rows, ``world_size`` ranks, epoch
``e``::

    perm    = permutation(N) drawn from (seed, e)              # identity when shuffle=False
    perm    = perm[: N // world_size * world_size]             # drop_remainder=True (default)
            | perm repeated cyclically to ceil(N / world_size) * world_size   # drop_remainder=False
    rank r  = perm[r::world_size]                              # same length on every rank
    worker  = the rank's list from the resume offset, cut into chunks of batch_size,
              chunk c going to DataLoader worker c % num_workers

DataLoader collects worker batches round-robin, so with ``batch_size`` equal to the loader's
the loop sees the rank's list strictly in order.  The whole position is ``(epoch,
consumed)``: ``state_dict()`` stores it and a resumed run starts at exactly the next row.
Worker processes cannot report back, so use :class:`ResumableLoader` (it counts batches) or
pass ``consumed=`` to :meth:`PackedIterableDataset.state_dict`.

A pack balanced for ``dp`` ranks (:mod:`packshard.format.topology.steps`) read by ``dp`` ranks
keeps its steps: the permutation moves whole steps, so each row reaches the rank the balance
chose.  Read by another world size it warns once and shuffles rows.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from packshard.errors import UsageError
from packshard.format.topology import Topology
from packshard.torch.dataset import PackedDataset, Row
from packshard.torch.placement import (
    PassCounter,
    Placement,
    check_launch,
    check_rank,
    epoch_rows,
    find_wrapper,
    group_placement,
    read_by_accelerate,
    resolve_placement,
)
from packshard.torch.steps import STEP_KEY, check_steps, stream_step_items

STATE_VERSION = 1


class PackedIterableDataset(IterableDataset[Row]):
    """Stream the rows of ``OUT`` to one rank: shuffled per epoch, split over workers, resumable.

    Args:
        out: the folder ``packshard pack`` wrote.
        shuffle: draw a new row permutation every epoch from ``(seed, epoch)``.
        seed: the permutation seed, identical on every rank.
        rank, world_size: this process's place; default: torch.distributed's when a pass
            starts, else 0 of 1 (:mod:`packshard.torch.placement`).
        drop_remainder: ``True`` (default) drops the last ``N % world_size`` rows of each
            epoch's permutation; ``False`` repeats its first rows instead, so no row is skipped.
        batch_size: the DataLoader's batch size; needed for an exact order with worker
            processes (:class:`ResumableLoader` sets it).
        expected_tokenizer_sha256, tokenizer, cache_dir, split: as for :class:`PackedDataset`.
        grad_accum: every row carries ``num_items_in_step`` (:mod:`packshard.torch.steps`;
            set ``batch_size``).

    Without ``set_epoch``, each pass starts the next epoch.

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
        grad_accum: int | None = None,
        split: str | None = "train",
    ) -> None:
        self.grad_accum = check_steps(grad_accum, batch_size)
        self.data = PackedDataset(
            out,
            expected_tokenizer_sha256=expected_tokenizer_sha256,
            tokenizer=tokenizer,
            cache_dir=cache_dir,
            split=split,
        )
        self.shuffle, self.seed, self.drop_remainder = shuffle, seed, drop_remainder
        self.explicit = check_rank(rank, world_size)
        self.batch_size = batch_size
        self.epoch = 0
        self.consumed = 0
        self.placement: Placement | None = None  # how the current epoch is split, once read
        self._carried: Placement | None = None  # what the main process saw, for spawned workers
        self._resume_world: int | None = None
        self._passes = PassCounter()
        config = self.data.manifest.get("config", {})
        self.topology = Topology.from_config(config) if split == "train" else None
        self._warned_topology = False
        if self.explicit is not None:
            self._check_rows(self.explicit)

    def _check_rows(self, placement: Placement) -> None:
        if self.drop_remainder and len(self.data) < placement.world_size:
            where = self.data.url or self.data.out
            raise UsageError(
                f"{where}: {len(self.data)} rows for {placement.world_size} ranks leaves "
                "every rank empty (use drop_remainder=False to repeat rows)"
            )

    def current_placement(self) -> Placement:
        """Return how a pass starting now would be split (see :mod:`packshard.torch.placement`)."""
        carried = self._carried if get_worker_info() is not None else None
        return resolve_placement(self.explicit, carried)

    @property
    def rank(self) -> int:
        """Return this process's rank, as the current epoch (or a pass starting now) reads it."""
        return (self.placement or self.current_placement()).rank

    @property
    def world_size(self) -> int:
        """Return the number of ranks, as the current epoch (or a pass starting now) reads it."""
        return (self.placement or self.current_placement()).world_size

    def __len__(self) -> int:
        if get_worker_info() is None:
            self._passes.adopt(self.epoch, self.consumed)
        return int(self.rank_rows(placement=self.current_placement()).shape[0])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_carried"] = self.placement or find_wrapper() or group_placement()
        return state

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``; a different epoch than the current one restarts at its first row."""
        if read_by_accelerate():  # accelerate's loader calls it before its workers read
            check_launch()
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0
        self._passes.reset(self.epoch, self.consumed)

    def rank_rows(self, epoch: int | None = None, placement: Placement | None = None) -> np.ndarray:
        """Return this rank's row indices for ``epoch`` (default: the current one), in order."""
        where = placement or self.placement or self.current_placement()
        return self.epoch_table(self.epoch if epoch is None else epoch, where)[where.rank]

    def epoch_table(self, epoch: int, where: Placement) -> np.ndarray:
        """Return every rank's rows of ``epoch`` as ``where`` splits it (:func:`epoch_rows`)."""
        self._check_rows(where)
        return epoch_rows(
            len(self.data),
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle,
            world_size=where.world_size,
            drop_remainder=self.drop_remainder,
            block=where.block,
            step_rows=self.balanced_step_rows(where.world_size),
        )

    def balanced_step_rows(self, world_size: int) -> int:
        """Rows of one balanced step when the pack was balanced for ``world_size``, else 0.

        Read with another world size, a balanced pack's steps do not match the ranks: that
        is said once (a ``UserWarning``) and its rows are shuffled one by one.
        """
        topology = self.topology
        if topology is None:
            return 0
        if topology.dp == world_size:
            return topology.step_rows
        if not self._warned_topology:
            self._warned_topology = True
            warnings.warn(
                f"{self.data.out}: its steps were balanced for {topology.dp} data-parallel "
                f"ranks (manifest config.topology) but it is read by {world_size}: rows are "
                f"shuffled one by one and the balance is lost (repack with --dp {world_size})",
                stacklevel=3,
            )
        return 0

    def begin_pass(self) -> None:
        """Start a pass in this process: read the split, move on if the epoch was consumed."""
        where = self.current_placement()
        if self.placement is not None and self.consumed and where != self.placement:
            raise UsageError(
                f"epoch {self.epoch} was read as {self.placement} and would go on as {where} "
                f"after {self.consumed} rows (the process group changed mid-epoch: call "
                "set_epoch() to start an epoch afresh)"
            )
        if self._resume_world is not None and where.world_size != self._resume_world:
            raise UsageError(
                f"cannot resume: the saved state has world_size={self._resume_world} but this "
                f"process reads {where} (resume with the same data and settings)"
            )
        self.placement, self._resume_world = where, None
        if self.consumed >= len(self.rank_rows()):
            self.epoch, self.consumed = self.epoch + 1, 0
        self._passes.reset(self.epoch, self.consumed)

    def __iter__(self) -> Iterator[Row]:
        info = get_worker_info()
        if info is None:
            self.begin_pass()
            where, epoch, consumed = self.placement, self.epoch, self.consumed
        else:
            where = self.current_placement()
            epoch, consumed = self._passes.start_pass(info.id, info.num_workers)
        assert where is not None
        table = self.epoch_table(epoch, where)  # every rank's rows: the steps span ranks
        todo = table[where.rank][consumed:]
        items = stream_step_items(self, table, where)[consumed:]
        if info is not None and info.num_workers > 1:
            unit = where.block if where.block > 1 else self.batch_size
            chunk = np.arange(len(todo)) // max(unit, 1)
            keep = chunk % info.num_workers == info.id
            todo, items = todo[keep], items[keep]
        for index, step in zip(todo.tolist(), items.tolist(), strict=True):
            row = self.data[index]
            if self.grad_accum is not None:
                row[STEP_KEY] = torch.tensor(step)
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
        """Resume at ``state`` (from any rank: every rank consumes the same number of rows).

        The saved world size is checked now when this process knows its own, else when the
        next pass starts (the process group may not exist yet).
        """
        mine = self.state_dict()
        known = self.explicit is not None or group_placement() is not None
        for key in ("version", "dataset_id", "num_rows", "seed", "shuffle", "world_size"):
            if key == "world_size" and not known:
                continue
            if state.get(key) != mine[key]:
                raise UsageError(
                    f"cannot resume: the saved state has {key}={state.get(key)!r} but this "
                    f"dataset has {key}={mine[key]!r} (resume with the same data and settings)"
                )
        if state.get("drop_remainder") != self.drop_remainder:
            raise UsageError("cannot resume: drop_remainder differs from the saved state")
        self._resume_world = None if known else int(state["world_size"])
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        self._passes.reset(self.epoch, self.consumed)


def _count_rows(collate_fn: Callable[[list[Row]], Any], rows: list[Row]) -> tuple[int, Any]:
    """Collate ``rows`` and report how many went into the batch."""
    return len(rows), collate_fn(rows)


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
        self.dataset, self.num_workers = dataset, num_workers
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            collate_fn=partial(_count_rows, collate_fn),
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
