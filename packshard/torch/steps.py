"""The trained tokens of a whole optimizer step, read from the plan: ``num_items_in_step``.

The token-mean loss of one optimizer step divides the summed token losses of every micro-batch
on every rank by the trained tokens of the whole step (packed micro-batches are unequal).  The
reader knows every rank's rows in advance (:func:`~packshard.torch.placement.epoch_rows`) and
each row stores ``num_loss_tokens``, so the count needs no collective.  With
``world_size`` 2, ``batch_size`` 1 and ``grad_accum`` 2 (unit = 2 rows a rank)::

    rank 0 rows   r7 r2 | r4 r0        num_loss_tokens  r7=9 r2=4 | r4=6 r0=3
    rank 1 rows   r5 r1 | r6 r3                         r5=2 r1=8 | r6=7 r3=5
    step          0     | 1
    num_items     9+4+2+8 = 23 | 6+3+7+5 = 21      (every micro-batch of the step, both ranks)

A row at position ``p`` of its rank's list belongs to step ``p // unit``, ``unit =
batch_size × grad_accum`` (under accelerate's blocks, ``block × grad_accum`` positions of the
whole stream); a short last step counts its own.  Map-style access reads rows in index order,
as ``DistributedSampler(shuffle=False)`` does: step ``s`` is rows ``[s·W·B·K, (s+1)·W·B·K)``.

The unit is only right if ``batch_size`` is the DataLoader's, so the count checks it where it
reaches the rows: a fetching DataLoader has the batch's indices on the call stack (its
fetcher's ``possibly_batched_index``), and another batch size is refused with the fix
(map-style: longer than told, or short anywhere but at the end).  Under accelerate's
wrappers the block decides.

Labels are unshifted and the first label of every segment is -100, so ``num_loss_tokens`` is
also what transformers counts (``labels[..., 1:] != -100``) as ``num_items_in_batch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

from packshard.errors import UsageError
from packshard.torch.placement import Placement, callers, group_placement

STEP_KEY = "num_items_in_step"
FETCHERS = ("_IterableDatasetFetcher", "_MapDatasetFetcher")


def positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is a positive ``int`` (not a bool); else a UsageError naming it."""
    if type(value) is not int or value < 1:
        raise UsageError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_steps(grad_accum: int | None, batch_size: int) -> int | None:
    """Validate ``grad_accum`` (None: no step counts) and the loader's ``batch_size``."""
    positive_int("batch_size", batch_size)
    return None if grad_accum is None else positive_int("grad_accum", grad_accum)


def loader_batch() -> list[Any] | None:
    """Return the indices a torch DataLoader on the call stack is fetching, or None.

    None outside a DataLoader, or in one without automatic batching (``batch_size=None``).
    """
    for frame in callers():
        owner: Any = frame.f_locals.get("self")
        kind = type(owner)
        fetching = frame.f_code.co_name == "fetch"  # not a comprehension inside it
        if fetching and kind.__name__ in FETCHERS and kind.__module__.startswith("torch.utils"):
            if not owner.auto_collation:
                return None
            return list(frame.f_locals["possibly_batched_index"])
    return None


def batch_size_problem(fetched: int, told: int, name: str) -> UsageError:
    """Return the refusal of a loader whose batch size is not the one ``name`` was told."""
    also = ", or read it through ResumableLoader" if name == "PackedIterableDataset" else ""
    return UsageError(
        f"the DataLoader batches {fetched} rows but {name} was told batch_size={told}, so "
        f"{STEP_KEY} would count steps of {told} × grad_accum rows a rank, not the loader's "
        f"(pass batch_size={fetched} to {name} as well{also})"
    )


def row_loss_tokens(data: Any) -> np.ndarray:
    """Return every row's ``num_loss_tokens`` (int64, manifest order), read once per dataset."""
    cached = data.__dict__.get("_loss_tokens")
    if cached is None:
        parts = [
            pq.read_table(path, columns=["num_loss_tokens"]).column(0).to_numpy()
            for path in data.shard_paths
        ]
        cached = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        data.__dict__["_loss_tokens"] = cached
    return cached


def step_totals(loss_tokens: np.ndarray, rows: np.ndarray, unit: int) -> np.ndarray:
    """Return the trained tokens of each step, for ``rows`` ``[world_size, rows_per_rank]``."""
    width, per_rank = rows.shape
    steps = -(-per_rank // unit)
    padded = np.zeros((width, steps * unit), dtype=np.int64)
    padded[:, :per_rank] = loss_tokens[rows]
    return padded.reshape(width, steps, unit).sum(axis=(0, 2))


def stream_step_items(dataset: Any, rows: np.ndarray, where: Placement) -> np.ndarray:
    """Return ``num_items_in_step`` for each row of a rank's list (int64).

    ``rows`` is the epoch's table of every rank's rows (``dataset.epoch_table``).
    """
    if dataset.grad_accum is None:
        return np.zeros(rows.shape[1], dtype=np.int64)
    fetched = loader_batch() if where.block == 1 else None
    if fetched is not None and len(fetched) != dataset.batch_size:
        raise batch_size_problem(len(fetched), dataset.batch_size, type(dataset).__name__)
    unit = (where.block if where.block > 1 else dataset.batch_size) * dataset.grad_accum
    totals = step_totals(row_loss_tokens(dataset.data), rows, unit)
    return totals[np.arange(rows.shape[1]) // unit]


def map_step_items(data: Any, index: int) -> torch.Tensor:
    """Return ``num_items_in_step`` of map-style row ``index`` (a 0-dim int64 tensor)."""
    assert data.grad_accum is not None
    world = data.world_size
    if world is None:
        group = group_placement()
        world = group.world_size if group is not None else 1
    unit = world * data.batch_size * data.grad_accum
    cache = data.__dict__.setdefault("_step_totals", {})
    if (world, unit) not in cache:
        tokens = row_loss_tokens(data)
        kept = len(tokens) // world * world  # DistributedSampler(drop_last=True) keeps these
        cache[world, unit] = step_totals(tokens, np.arange(kept)[None], unit)
    totals = cache[world, unit]
    fetched = loader_batch()
    if fetched is not None and len(fetched) != data.batch_size:
        kept = len(row_loss_tokens(data)) // world * world
        last = min(int(i) for i in fetched) >= kept - world * data.batch_size
        if len(fetched) > data.batch_size or not last:  # a short batch only at the end
            raise batch_size_problem(len(fetched), data.batch_size, type(data).__name__)
    step = min(index // unit, len(totals) - 1)
    return torch.tensor(int(totals[step]) if len(totals) else 0, dtype=torch.int64)


def with_step(batch: dict[str, Any], rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Add the rows' common ``num_items_in_step`` (an int) to ``batch``, when they carry one.

    Raises:
        UsageError: the rows belong to different steps (the loader's batch size is not the
            dataset's ``batch_size``).

    """
    values = {int(r[STEP_KEY]) if STEP_KEY in r else None for r in rows}
    if len(values) > 1:
        raise UsageError(
            f"a batch holds rows of different optimizer steps ({STEP_KEY} {sorted(values, key=str)}"
            "): give the dataset the DataLoader's batch_size (ResumableLoader does)"
        )
    step = values.pop() if values else None
    if step is not None:
        batch[STEP_KEY] = step
    return batch
