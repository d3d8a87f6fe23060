"""A ``--mix`` pack's examples: the spill's records repeated or left out, then planned as usual.

Between the spill and the planner (in the driver, once every length is known, whatever the
engine and its workers)::

    spill (records r0 r1 r2 …, each 1+ examples)
      ─► choose_copies (packshard.pack.plan.mix)   copies per record: r0×2, r1×0, r2×1 …
      ─► index = spill examples, each repeated its record's copies, in input order
             [e0 e0 e2 e3 …]          (r0 = e0, r1 = e1 dropped, r2 = e2 e3)
      ─► plan_examples(…, index)  ─► ids in input order; copies of one example adjacent
      ─► repeat per segment: 0 for the first copy, 1, 2 … for the next (examples index)

Records kept 0 times become ``mix_subsampled`` rejects (dropped), so ``records =
records_packed + rejected + dropped`` still holds.  :func:`mix_stats` is the manifest's
``stats.mix``: per domain the target, what the input had, the realised shares
(:func:`packshard.pack.plan.mix.mixture_stats`), repeats and drops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from packshard.pack.plan.mix import MixChoice, MixTarget, choose_records, mixture_stats
from packshard.pack.plan.rows import RowPlan, invert
from packshard.pack.spill import Spill
from packshard.records import Reject

MIX_DROP_CODE = "mix_subsampled"


@dataclass(frozen=True, slots=True)
class Mixed:
    """The mixture chosen for a spill: the examples to plan and each record's copies."""

    target: MixTarget
    index: np.ndarray  # int64, spilled examples to plan (repeated), ascending
    choice: MixChoice  # per record (the spill's records in input order)
    first_example: np.ndarray  # int64 [records], each record's first spilled example


def mix_examples(spill: Spill, target: MixTarget, seed: int) -> Mixed:
    """Choose the copies of every record and return the examples to plan."""
    choice, first, record = choose_records(
        spill.record_ids,
        spill.domain_codes,
        spill.lengths,
        spill.loss_tokens,
        spill.counts.domains,
        target,
        seed,
    )
    index = np.repeat(np.arange(len(spill), dtype=np.int64), choice.copies[record])
    return Mixed(target, index, choice, first.astype(np.int64))


def mix_drops(spill: Spill, mixed: Mixed) -> tuple[Reject, ...]:
    """One ``mix_subsampled`` reject per record the mixture left out, in input order."""
    why = "left out by --mix (a seeded choice: its domain is above its share)"
    return spill.rejects(mixed.first_example[mixed.choice.copies == 0], MIX_DROP_CODE, why)


def example_repeats(plan: RowPlan) -> np.ndarray:
    """Per segment, which copy of its example it is: 0, then 1, 2 … (int32).

    Copies of one example (same spilled example, same start) have consecutive ids
    (:func:`packshard.pack.plan.rows.number_examples`), so a copy's repeat is its id minus
    the first copy's.
    """
    order = invert(plan.example_id)  # the segments in example id order
    ex, start = plan.seg_example[order], plan.seg_start[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (ex[1:] != ex[:-1]) | (start[1:] != start[:-1])
    position = np.arange(len(order), dtype=np.int64)
    first = np.maximum.accumulate(np.where(new, position, 0))
    repeats = np.empty(len(order), dtype=np.int32)
    repeats[order] = position - first
    return repeats


def mix_stats(spill: Spill, plan: RowPlan, repeats: np.ndarray, mixed: Mixed) -> dict[str, Any]:
    """Return the manifest's ``stats.mix``: per domain target, input, realised, drops."""
    ex = plan.seg_example
    packed = (spill.domain_codes[ex], plan.seg_length, plan.seg_targets, repeats)
    record_domain = spill.domain_codes[mixed.first_example]
    names = spill.counts.domains
    return mixture_stats(mixed.target, mixed.choice, names, record_domain, packed)
