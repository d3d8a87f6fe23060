"""The planning schedule: which examples are planned together, and the order of the rows.

Every pack plans here (:func:`plan_examples`, then :func:`row_order`): one plan over every
example, or one per group (``--group-by-domain``, ``--plan-scope group:N``), or one per
split when there is an eval split; each plan's rows are then shuffled with the seed alone::

    spill ─► [eval split: train | eval] ─► [groups] ─► planner per group ─► joined plan
          ─► row_order: rows shuffled with --seed, train rows and eval rows apart

**The eval split.** ``pack --eval-fraction F`` draws whole records: a record is ``eval`` when a
64-bit hash of (``--seed``, its input path, its line) falls below ``F``, whatever the other
records, the workers or the input order.  ``--eval FILE…`` adds inputs that are all ``eval``::

    key(source)  = first 8 bytes of BLAKE2b(seed, NUL, path)           one per input file
    h(record)    = splitmix64(key(source) XOR line × 0x9E3779B97F4A7C15)   numpy, vectorised
    eval         ⇔ (h >> 11) / 2**53 < F            (about F of the records, e.g. 0.1 → 10 %)

Each split is planned alone (no row ever holds an eval and a train example) and its rows
shuffled alone; the plans are joined train first, so rows ``[0, train_rows)`` are train and
the rest eval, and example ids still number all examples in input order::

    rows    [ train rows … ][ eval rows … ]
    shards   shard-00000 …   eval-shard-00000 …      (manifest entries say "split")

Without either option there is one plan over every example.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise
from typing import Any

import numpy as np

from packshard.errors import UsageError
from packshard.format.topology import padded_lengths
from packshard.ingest import InputFile
from packshard.pack.config import PackConfig
from packshard.pack.plan.pairs import plan_pair_units
from packshard.pack.plan.rows import RowPlan, finalize_plan
from packshard.pack.plan.vision import over_caps, plan_capped
from packshard.pack.spill import Spill, narrow

Vision = tuple[np.ndarray, np.ndarray]
"""Per spilled example: its images and its vision tokens (int64 each)."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _source_key(seed: int, path: str) -> int:
    digest = hashlib.blake2b(f"{seed}\0{path}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def drawn_eval(
    sources: list[str], source_index: np.ndarray, lines: np.ndarray, seed: int, fraction: float
) -> np.ndarray:
    """Return, per record (source code, line), whether the seeded draw puts it in eval."""
    keys = np.array([_source_key(seed, name) for name in sources], dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = keys[source_index.astype(np.int64)] ^ (lines.astype(np.uint64) * _GOLDEN)
    uniform = (_splitmix64(mixed) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return uniform < fraction


def check_eval_files(train: Sequence[InputFile], evals: Sequence[InputFile]) -> None:
    """Refuse an ``--eval`` input that is a training input too."""
    if not evals:
        return
    both = {f.real for f in train} & {f.real for f in evals}
    if both:
        raise UsageError(
            f"{sorted(map(str, both))[0]} is both a training input and an --eval input: "
            "name it once (use --eval-fraction to draw eval records from the inputs)"
        )


def eval_examples(spill: Spill, config: PackConfig, train_files: int) -> np.ndarray | None:
    """Return which spilled examples are eval, or None when the pack has no eval split.

    Sources at ``train_files`` and beyond are the ``--eval`` inputs: all their records are eval.
    """
    if not config.eval_fraction and not config.eval_inputs:
        return None
    source = spill.source_index.astype(np.int64)
    is_eval = source >= train_files
    if config.eval_fraction:
        sources, seed = list(spill.counts.sources), config.plan.seed
        is_eval |= drawn_eval(sources, source, spill.lines, seed, config.eval_fraction)
    return is_eval


def plan_examples(
    spill: Spill,
    config: PackConfig,
    is_eval: np.ndarray | None,
    mixed: np.ndarray | None = None,
    vision: Vision | None = None,
) -> RowPlan:
    """Plan the spill, the train and eval examples apart when there is an eval split.

    ``mixed`` (``--mix``) lists the spilled examples to plan, once per copy.  ``vision`` holds
    each example's images and vision tokens for the row caps (an example over a cap alone is
    left out: :func:`packshard.pack.media.cap_drops`).
    """
    if is_eval is None:
        return _plan(spill, config, None, mixed, vision)
    train = _plan(spill, config, ~is_eval, vision=vision)
    held = _plan(spill, config, is_eval, vision=vision)
    for name, plan, other in (("eval", held, "train"), ("train", train, "eval")):
        if plan.num_rows == 0 and train.num_rows + held.num_rows > 0:
            how = f"--eval-fraction {config.eval_fraction}" if config.eval_fraction else "--eval"
            raise UsageError(
                f"{how} left the {name} split empty (every packed record went to {other}): "
                "change the fraction or the --eval inputs"
            )
    return RowPlan.concatenate([train, held])


def train_rows(spill: Spill, plan: RowPlan, is_eval: np.ndarray | None) -> int:
    """Return how many leading rows of a joined plan are train (all of them without a split)."""
    if is_eval is None:
        return plan.num_rows
    first = plan.seg_example[plan.row_offsets[:-1]]  # a row's split is its first example's
    return int(np.count_nonzero(~is_eval[first]))


def _plan(
    spill: Spill,
    config: PackConfig,
    keep: np.ndarray | None,
    mixed: np.ndarray | None = None,
    vision: Vision | None = None,
) -> RowPlan:
    """Plan the kept examples, each domain alone (``--group-by-domain``) or each group alone.

    With an alignment (``--cp``/``--pad-multiple``) the planner sees every length rounded up
    to the multiple, so the padded rows fit; the plan's segments keep their real lengths.
    """
    multiple = config.plan.alignment()
    lengths = spill.lengths if multiple == 1 else narrow(padded_lengths(spill.lengths, multiple))
    codes = spill.pair_codes if spill.pair_codes is not None and spill.pair_codes.any() else None
    caps = config.plan.vision_caps()
    if vision is not None and caps.active:
        if codes is not None:
            raise UsageError(
                "--max-images-per-row and --max-vision-tokens-per-row do not take preference "
                "or KTO records yet (pack the pairs without the caps)"
            )
        fits = ~over_caps(caps, *vision)
        if not fits.all():  # each alone over a cap: left out (cap_drops rejects them)
            if mixed is not None:
                mixed = mixed[fits[mixed]]
            else:
                keep = fits if keep is None else keep & fits
    else:
        vision = None  # no caps: the plain planners

    every = keep is None and mixed is None  # every example once: no index, no copy of lengths
    group = config.plan.group()
    if every and not config.plan.group_by_domain and group is None:
        raw = _plan_units(config, None, lengths, codes, vision)
        del lengths  # the planner's; the spill's offsets remain
        return _real_lengths(spill, finalize_plan(spill, raw), multiple)
    small = np.int32 if len(lengths) < 2**31 else np.int64
    chosen = np.arange(len(lengths), dtype=small) if keep is None else np.flatnonzero(keep)
    if mixed is not None:
        chosen = mixed
    if not config.plan.group_by_domain and group is None:
        raw = _plan_units(
            config, chosen, lengths[chosen], None if codes is None else codes[chosen], vision
        )
        return _real_lengths(spill, finalize_plan(spill, raw, chosen), multiple)
    if group is not None:  # --plan-scope group:N: N consecutive examples at a time
        cuts = np.arange(0, len(chosen), group)
        if codes is not None:  # a group never ends between a pair's branches
            cuts[(cuts > 0) & (codes[chosen[np.maximum(cuts - 1, 0)]] == 1)] += 1
        bounds = [*cuts.tolist(), len(chosen)]
        indexes = [chosen[lo:hi] for lo, hi in pairwise(bounds) if hi > lo]
    else:
        domains = spill.domain_codes[chosen]
        indexes = [chosen[domains == c] for c in np.unique(domains)]
    plans = []
    for index in indexes or [np.zeros(0, np.int64)]:
        raw = _plan_units(
            config, index, lengths[index], None if codes is None else codes[index], vision
        )
        plans.append(finalize_plan(spill, raw, index))
    return _real_lengths(spill, RowPlan.concatenate(plans), multiple)


def _plan_units(
    config: PackConfig,
    index: np.ndarray | None,
    lengths: np.ndarray,
    codes: np.ndarray | None,
    vision: Vision | None,
) -> RowPlan:
    """Plan ``lengths`` (the spilled examples ``index``, all when None), capped with ``vision``."""
    big, strategy = config.plan.max_seq_len, config.plan.strategy
    if vision is None:
        return plan_pair_units(lengths, codes, big, strategy)
    images, tokens = vision if index is None else (vision[0][index], vision[1][index])
    return plan_capped(lengths, images, tokens, big, strategy, config.plan.vision_caps())


def _real_lengths(spill: Spill, plan: RowPlan, multiple: int) -> RowPlan:
    """Return a plan made over padded lengths with its segments' real lengths (whole examples)."""
    if multiple == 1:
        return plan
    return replace(plan, seg_length=narrow(spill.lengths[plan.seg_example]))


def row_order(plan: RowPlan, config: PackConfig, split_at: int) -> np.ndarray:
    """Shuffle rows with the seed: train rows ``[0, split_at)`` and eval rows apart."""
    bounds = ((0, split_at), (split_at, plan.num_rows))  # no eval rows: all rows are train
    return np.concatenate([lo + _row_order(plan.rows(lo, hi), config) for lo, hi in bounds])


def _row_order(plan: RowPlan, config: PackConfig) -> np.ndarray:
    """Shuffle rows with the seed; with ``group:N`` only within each group's rows."""
    if config.plan.strategy == "sequential":  # rows keep the input order too
        return np.arange(plan.num_rows)
    rng = np.random.default_rng(config.plan.seed)
    group = config.plan.group()
    if group is None or plan.num_rows == 0:
        return rng.permutation(plan.num_rows)
    first = plan.seg_example[plan.row_offsets[:-1]] // group  # a row's group: its first example's
    edges = np.r_[0, np.flatnonzero(np.diff(first)) + 1, plan.num_rows]
    return np.concatenate([lo + rng.permutation(hi - lo) for lo, hi in pairwise(edges.tolist())])


def split_stats(spill: Spill, plan: RowPlan, split_at: int) -> dict[str, Any]:
    """Return the manifest's ``stats.splits``: rows, examples, records, tokens per split."""
    out: dict[str, Any] = {}
    for name, (lo, hi) in (("train", (0, split_at)), ("eval", (split_at, plan.num_rows))):
        sub = plan.rows(lo, hi)
        out[name] = {
            "records_packed": len(np.unique(spill.record_ids[sub.seg_example])),
            "examples": sub.num_segments,
            "rows": sub.num_rows,
            "tokens": sub.num_tokens,
            "loss_tokens": int(sub.seg_targets.sum()),
        }
    return out
