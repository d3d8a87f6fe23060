"""Which rows one process reads: its rank, a wrapper that splits for it, its epoch.

A :class:`~packshard.torch.stream.PackedIterableDataset` decides what to yield when a pass
starts, never when it is built::

    rank     torch.distributed's rank and world size, read when a pass starts (a dataset
             built before the process group exists, as Lightning builds it, would read 0 of 1)
    wrapper  accelerate's IterableDatasetShard and DataLoaderDispatcher split the stream
             themselves: the dataset yields the whole epoch cut to whole blocks of
             batch_size × processes rows (split by rank too, most rows would never train)
    epoch    DataLoader workers hold copies that cannot report back: each counts its passes
             in shared memory (:class:`PassCounter`), the first after set_epoch() is that
             epoch, every later one the next

A wrapper is found on the call stack: the dataset's ``__iter__`` and ``__len__`` run inside the
wrapper's (also in worker processes, which iterate the wrapper, and in workers forked by the
dispatcher).  Spawned workers get what the main process found when it pickled the dataset.

A launch whose ranks would not train one model is refused first, with the launch that works.
A launcher starts ``WORLD_SIZE`` processes; they train one model only when a process group
joins them and the model syncs its gradients over it.  Accelerate decides that for itself,
and on a CPU host it decides "one process" unless told otherwise::

    torchrun --nproc_per_node 2 train.py          accelerate: DistributedType.NO, 1 process,
                                                  no group → 2 models, each on its rows
    ACCELERATE_USE_CPU=1 torchrun … train.py      MULTI_CPU, gloo group, DDP: one model
    accelerate launch --cpu --num_processes 2     starts ONE process (--cpu uses the simple
                                                  launcher; nothing to detect from inside)

:func:`check_launch` runs before a pass reads any row: the launch's world size is the larger
of ``WORLD_SIZE`` and the process group's, never accelerate's alone.  When accelerate reads
the rows (one of its loaders on the call stack) and counts fewer processes than the launch
(the plain torchrun line above: each rank trains its half, no gradient synced), that is a
:class:`UsageError` naming the fix; ``WORLD_SIZE`` > 1 without any process group is refused
by :func:`resolve_placement`.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import numpy as np
import torch

from packshard.errors import UsageError
from packshard.format.topology import step_permutation

WRAPPERS = ("IterableDatasetShard", "DataLoaderDispatcher")


@dataclass(frozen=True, slots=True)
class Placement:
    """A process's share of each epoch: rank ``rank`` of ``world_size``, in blocks.

    ``block`` > 1 means a wrapper splits the stream: the epoch is cut to whole blocks of
    ``block`` rows (with ``drop_remainder``) and DataLoader workers take whole blocks.
    """

    rank: int
    world_size: int
    block: int
    split_by: str

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.world_size} ({self.split_by})"


def check_rank(rank: int | None, world_size: int | None) -> Placement | None:
    """Return the placement of explicit ``rank``/``world_size``: both or neither (``None``)."""
    if rank is None and world_size is None:
        return None
    if rank is None or world_size is None:
        raise UsageError("pass both rank and world_size, or neither")
    if not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is not in [0, world_size {world_size})")
    return Placement(rank, world_size, 1, "rank= and world_size=")


def callers() -> Iterator[FrameType]:
    """Yield the frames of the call stack above the caller's, innermost first."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        yield frame
        frame = frame.f_back


def find_wrapper() -> Placement | None:
    """Return the split of an accelerate wrapper on the call stack, or None."""
    for frame in callers():
        owner: Any = frame.f_locals.get("self")
        kind = type(owner)
        if kind.__name__ in WRAPPERS and kind.__module__.startswith("accelerate"):
            if kind.__name__ == "IterableDatasetShard":
                size, processes = int(owner.batch_size), int(owner.num_processes)
            else:
                size, processes = int(owner.batch_size or 1), int(owner.state.num_processes)
            block = size if owner.split_batches else size * processes
            check_launch(processes)
            return Placement(0, 1, max(block, 1), f"accelerate's {kind.__name__}")
    return None


def group_placement() -> Placement | None:
    """Return torch.distributed's rank and world size, or None outside a process group."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return Placement(dist.get_rank(), dist.get_world_size(), 1, "torch.distributed")
    return None


def resolve_placement(explicit: Placement | None, carried: Placement | None) -> Placement:
    """Return where this process reads now: a wrapper, explicit values, the process group.

    ``carried`` is what the main process found (for spawned DataLoader workers).
    """
    wrapper = find_wrapper() or (carried if carried is not None and carried.block > 1 else None)
    if wrapper is not None:
        if explicit is not None:
            raise UsageError(
                f"rank={explicit.rank} and world_size={explicit.world_size} were given, and "
                f"{wrapper.split_by} splits the rows again (each rank would keep a share of its "
                "share, and most rows would never be read): drop rank= and world_size= and let "
                "accelerate split"
            )
        return wrapper
    if explicit is not None:
        return explicit
    group = group_placement() or carried
    if group is not None:
        if read_by_accelerate():  # its loader, its model: its count must be the group's
            check_launch()
        return group
    check_launch()  # accelerate counting one process of a launcher's several
    if (world := launcher_world_size()) > 1:
        raise UsageError(
            f"WORLD_SIZE={world} but torch.distributed is not initialised where the rows are "
            "read, so this process cannot know its share (iterate after "
            "init_process_group, or pass rank= and world_size=)"
        )
    return Placement(0, 1, 1, "one process")


def epoch_rows(
    num_rows: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    world_size: int,
    drop_remainder: bool,
    block: int = 1,
    step_rows: int = 0,
) -> np.ndarray:
    """Return the ``[world_size, rows_per_rank]`` row indices of one epoch.

    The order is :mod:`packshard.torch.stream`'s.  ``step_rows`` > 0 shuffles whole steps
    (:func:`~packshard.format.topology.step_permutation`); with ``block`` > 1
    ``drop_remainder`` cuts the epoch to whole blocks of ``world_size × block`` rows.
    """
    if shuffle:
        rng = np.random.Generator(np.random.PCG64([seed, epoch]))
        steps = step_rows > 0
        perm = step_permutation(num_rows, step_rows, rng) if steps else rng.permutation(num_rows)
    else:
        perm = np.arange(num_rows, dtype=np.int64)
    unit = world_size * (block if drop_remainder else 1)
    kept = num_rows // unit * unit if drop_remainder else -(-num_rows // unit) * unit
    perm = np.resize(perm, kept)  # truncates, or repeats cyclically
    return perm.reshape(kept // world_size, world_size).T.copy()


SLOTS = 256
"""DataLoader workers per process whose passes :class:`PassCounter` can count."""


class PassCounter:
    """The epoch of each DataLoader worker's pass, in memory the workers share.

    Layout (int64): ``[epoch, consumed, workers, passes of worker 0, …]``.  The owner writes
    the first two and zeroes the rest whenever it sets the position; a worker's ``k``-th pass
    since then reads epoch ``epoch + k`` (a changed number of workers is refused).
    """

    def __init__(self) -> None:
        self._own(0, 0)

    def _own(self, epoch: int, consumed: int) -> None:
        self.owner = os.getpid()
        self.shared = torch.zeros(3 + SLOTS, dtype=torch.int64).share_memory_()
        self.shared[0], self.shared[1] = epoch, consumed

    def adopt(self, epoch: int, consumed: int) -> None:
        """Own the counts in this process (a copy made in another one has its own)."""
        if self.owner != os.getpid() or not self.shared.is_shared():
            self._own(epoch, consumed)

    def reset(self, epoch: int, consumed: int) -> None:
        """Set the position the workers' next pass starts at (owning process only)."""
        self.adopt(epoch, consumed)
        self.shared[0], self.shared[1] = epoch, consumed
        self.shared[2:] = 0

    def start_pass(self, worker: int, num_workers: int) -> tuple[int, int]:
        """Count a worker's new pass; return its ``(epoch, consumed)``."""
        parent = multiprocessing.parent_process()
        creator = parent.pid if parent is not None else os.getppid()
        if self.owner != creator or not self.shared.is_shared() or num_workers > SLOTS:
            raise UsageError(
                "DataLoader workers cannot tell which epoch this pass is (the dataset was "
                "copied from another process, or more than 256 workers): call "
                "dataset.set_epoch(epoch) before each epoch"
            )
        recorded = int(self.shared[2])
        if recorded == 0:
            self.shared[2] = recorded = num_workers  # workers of one pass all write the same
        k = int(self.shared[3 + worker])
        if recorded != num_workers:
            raise UsageError(
                "DataLoader workers disagree on the epoch (num_workers changed between "
                "passes): call dataset.set_epoch(epoch) before each epoch"
            )
        self.shared[3 + worker] = k + 1
        epoch, consumed = int(self.shared[0]), int(self.shared[1])
        return (epoch, consumed) if k == 0 else (epoch + k, 0)


FIX = (
    "on a CPU host set ACCELERATE_USE_CPU=1 for torchrun (accelerate launch --cpu starts one "
    "process); on GPUs launch with accelerate launch --multi_gpu or torchrun"
)


def accelerate_processes() -> int | None:
    """Return the processes an initialised accelerate state counts (None: no state)."""
    state = sys.modules.get("accelerate.state")
    shared = getattr(state.PartialState, "_shared_state", None) if state is not None else None
    return int(shared.get("num_processes", 1)) if shared else None


def launcher_world_size() -> int:
    """``WORLD_SIZE`` a launcher set (1 when unset or not a number)."""
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() else 1


def read_by_accelerate() -> bool:
    """Return whether an accelerate data loader is on the call stack, reading these rows.

    A process group with an accelerate state beside it is not accelerate's run unless
    accelerate reads the rows: Lightning or a plain DDP loop forked from a process that once
    made an accelerate state inherits that state, stale, and syncs its gradients itself.
    """
    return any(
        type(frame.f_locals.get("self")).__module__.startswith("accelerate.") for frame in callers()
    )


def launch_world() -> tuple[int, str]:
    """Return the processes the launch started and where that was read.

    The larger of ``WORLD_SIZE`` and the process group's size: a group may exist that the
    environment does not name, and accelerate's own count is what is being checked.
    """
    world = launcher_world_size()
    group = group_placement()
    if group is not None and group.world_size > world:
        return group.world_size, f"torch.distributed has {group.world_size} ranks"
    return world, f"WORLD_SIZE={world}"


def check_launch(wrapper_processes: int | None = None) -> None:
    """Refuse ranks of a launcher that accelerate runs as separate single processes.

    ``wrapper_processes``: the processes the accelerate wrapper on the stack splits for.
    """
    world, source = launch_world()
    if world <= 1:
        return
    processes = wrapper_processes if wrapper_processes is not None else accelerate_processes()
    if processes is not None and processes < world:
        raise UsageError(
            f"{source} but accelerate runs {processes} process(es) and syncs no gradients: "
            f"each rank would train its own copy of the model ({FIX})"
        )
