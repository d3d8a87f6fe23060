"""``pack_spill``: from spilled examples to a complete folder, for ``pack`` and ``repack``.

The one route after the spill, whoever made it (``pack`` from its inputs, ``repack`` from a
parent pack's shards)::

    spill ─► eval split ─► [--mix copies] ─► plan_packs ─► mix / wrapped drops ─► rejects closed
      ─► shuffle rows (seed) ─► [--dp balanced steps] ─► stats
      ─► examples index ║ shards (engine tasks) ─► card ─► manifest

A :class:`Provenance` says what made the spill (inputs, tokenizer, template, environment,
engine), for the manifest and the dataset id.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from packshard.arrays import fill_rate
from packshard.digests import sha256_path
from packshard.engine import Engine
from packshard.engine.faults import FAULTS_ENV, parse_faults
from packshard.engine.heap import trim_heap
from packshard.errors import REJECTED, NothingToPackError, UsageError, reject_kind
from packshard.format.card import write_card
from packshard.format.causes import likely_cause
from packshard.format.examples import EXAMPLES_NAME, write_examples
from packshard.format.manifest import build_manifest, compute_dataset_id, write_manifest
from packshard.format.rejects import REJECTS_NAME, RejectsWriter, RejectTally
from packshard.format.topology import padded_lengths
from packshard.format.version import FORMAT_VERSION
from packshard.pack.config import PackConfig
from packshard.pack.counts import (
    examples_tables,
    loss_policies,
    pack_stats,
    pair_stats,
    records_per_input,
    wrapped_drops,
)
from packshard.pack.media import cap_drops, example_vision, media_lists, vision_stats
from packshard.pack.plan.balance import balance_stats, balanced_order, plan_costs
from packshard.pack.plan.mix import example_repeats, mix_drops, mix_examples, mix_stats
from packshard.pack.plan.pairs import plan_pair_units
from packshard.pack.plan.rows import RowPlan, ordering_stats
from packshard.pack.plan.schedule import (
    eval_examples,
    plan_examples,
    row_order,
    split_stats,
    train_rows,
)
from packshard.pack.plan.vision import over_caps
from packshard.pack.spill import Spill, narrow
from packshard.pack.units.columns import release_columns
from packshard.pack.write.shards import shard_entries, split_bounds, write_shards_on
from packshard.records import Reject


@dataclass(frozen=True)
class Provenance:
    """What made a spill, for the manifest: inputs, tokenizer, template, environment, engine.

    ``pack`` knows it from its ingest; ``repack`` from the parent's manifest, whose tokens the
    spill holds (``parent`` names that folder).  ``inputs`` are the manifest's entries without
    ``records`` (counted by :func:`pack_spill`).  ``examples_by_policy``, when given, is the
    packed examples' count per loss policy, for a spill whose examples do not know their record
    format (a repack of a pack of several formats that keeps every example whole).
    """

    inputs: list[dict[str, Any]]
    tokenizer: dict[str, Any]
    template: dict[str, Any]
    environment: dict[str, Any]
    engine: dict[str, Any]
    reasoning_dropped: int = 0
    pairs_read: int = 0
    parent: dict[str, Any] | None = None
    examples_by_policy: dict[str, int] | None = None  # known without per-example formats

    def fingerprints(self) -> dict[str, Any]:
        """Return what the output depends on besides the recorded config (the id's inputs)."""
        return {
            "format_version": FORMAT_VERSION,
            "inputs": [entry["sha256"] for entry in self.inputs],
            "tokenizer": self.tokenizer["sha256"],
            "template": self.template["sha256"],
        }


@dataclass(frozen=True)
class PackResult:
    """What ``pack`` produced: the folder and its manifest."""

    out: Path
    manifest: dict[str, Any]
    seconds: float
    warnings: tuple[str, ...] = field(default=())
    published: str | None = None
    """The store URL the pack was published to (``out`` was its staging folder, now gone)."""

    @property
    def shown(self) -> str:
        """Where the pack is, as a user names it: the URL, or the local folder."""
        return self.published or str(self.out)


def pack_spill(
    tmp: Path,
    config: PackConfig,
    spill: Spill,
    rejects: RejectsWriter,
    made: Provenance,
    train_files: int,
    engine: Engine,
    work: Path,
    note: Callable[[str], None],
    lay_out: Callable[[Spill, RowPlan], Spill] | None = None,
) -> dict[str, Any]:
    """Plan a spill, write its shards, index, card and manifest into ``tmp``; return the manifest.

    The one route from spilled examples to a folder, for ``pack`` and ``repack``.
    ``rejects`` holds every reject so far, in (input, line) order; the policies here add theirs
    and close it.  ``lay_out`` (``repack``) gives the shards' spill its tokens once the plan
    is final: a spill whose files are not written yet is planned from its lengths and targets.
    """
    release_columns(spill)  # each stage's reads of the columns are handed back after it
    with rejects:
        is_eval = eval_examples(spill, config, train_files)
        target = config.plan.mix_target()
        mixing = target is not None and len(spill) > 0  # nothing spilled: nothing to pack
        if mixing and spill.pair_codes is not None and spill.pair_codes.any():
            raise UsageError(
                "--mix does not take preference or KTO records yet (a repeated pair would need "
                "its own pair_id): pack the pairs without --mix, or mix the chat data alone"
            )
        mixed = mix_examples(spill, target, config.plan.seed) if mixing and target else None
        if mixed is not None and mixed.choice.note is not None:
            note(f"--mix-best-effort: {mixed.choice.note}")
        # images: read and hashed once, before planning, which caps rows on their counts
        media = media_lists(spill, config.ingest)  # None without images: the index as before
        vision = example_vision(media, config.ingest.vision_rule()) if media is not None else None
        capped: tuple[Reject, ...] = ()  # examples alone over a cap (--overlong error: stop)
        if vision is not None and (caps := config.plan.vision_caps()).active:
            copies = mixed.choice.copies if mixed is not None else None
            capped = cap_drops(spill, over_caps(caps, *vision), caps, config.plan.overlong, copies)
        plan = plan_examples(spill, config, is_eval, mixed.index if mixed else None, vision)
        if mixed is not None:
            rejects.write(mix_drops(spill, mixed))
        rejects.write(capped)
        rejects.write(wrapped_drops(spill, plan))
        tally = rejects.close()
    if plan.num_rows == 0:
        raise NothingToPackError(_nothing_packed(spill, tally, config, made))
    release_columns(spill)
    ordering = ordering_stats(plan)
    split_at = train_rows(spill, plan, is_eval)
    plan = plan.permute_rows(row_order(plan, config, split_at), consume=True).narrowed()
    balance: dict[str, Any] | None = None
    if (topology := config.plan.topology()) is not None:  # --dp: the train rows into steps
        costs = plan_costs(plan.rows(0, split_at), topology)
        order = balanced_order(costs, topology, config.plan.seed)
        balance = balance_stats(costs, order, topology)
        rest = np.arange(split_at, plan.num_rows, dtype=np.int64)
        plan = plan.permute_rows(np.concatenate([order, rest]), consume=True).narrowed()
    repeats = example_repeats(plan) if mixed is not None else None
    dataset_id = compute_dataset_id(config.recorded(), made.fingerprints())
    bounds, names = split_bounds(
        plan, split_at, config.shards.shard_rows, config.shards.shard_bytes
    )
    resolved, by_policy = loss_policies(spill, plan, config.ingest.loss)
    by_policy = by_policy if made.examples_by_policy is None else made.examples_by_policy
    per_input = records_per_input(spill, tally)
    stats = {
        **pack_stats(spill, plan, tally, ordering),
        **_beside_bfd(spill, plan, config, mixed.index if mixed is not None else None),
        "reasoning_dropped": made.reasoning_dropped,
        **pair_stats(spill, plan, made.pairs_read),
        **({"splits": split_stats(spill, plan, split_at)} if is_eval is not None else {}),
    }
    if balance is not None:
        stats["balance"] = balance
    if (multiple := config.plan.alignment()) > 1:  # --cp / --pad-multiple: what the pads cost
        padded = int(padded_lengths(plan.seg_length, multiple).sum())
        stats["alignment"] = {
            "multiple": multiple,
            "pad_tokens": padded - plan.num_tokens,
            "padded_fill_rate": round(fill_rate(padded, plan.num_rows, plan.max_seq_len), 6),
        }
    if mixed is not None and repeats is not None:
        stats["mix"] = mix_stats(spill, plan, repeats, mixed)
    # each stage frees what no later one reads; the shards read only the token offsets (their
    # rows are known from the bounds), the index the rest
    release_columns(spill)  # before they leave it: what is dropped stays mapped (the caller's)
    spill = spill.without("loss_tokens", "parts", "record_ids", "format_codes")
    plan = plan.compacted("seg_part", "seg_start")
    trim_heap()  # the statistics' temporaries, before the index's chunk
    shard_rows = [hi - lo for lo, hi in bounds]
    if media is not None:
        rule, caps = config.ingest.vision_rule(), config.plan.vision_caps()
        stats["vision"] = vision_stats(media, plan, rule, caps)
    # from here lengths and targets are only copied out (the index, a task's row groups)
    plan = plan.compacted("seg_length", "seg_targets")
    # the shards read only the token offsets (int32 while the tokens fit), the index all but them
    to_shards = spill.without("source_index", "lines", "starts", "domain_codes", "truncated")
    to_shards = replace(to_shards.without("turns"), offsets=narrow(spill.offsets))
    spill = replace(spill, offsets=spill.offsets[:0])
    tables = examples_tables(spill, plan, shard_rows, is_eval, repeats, media)
    faults = parse_faults(os.environ.get(FAULTS_ENV))
    to_write = plan.without("seg_part", "seg_targets")
    if lay_out is not None:
        to_shards = lay_out(to_shards, to_write)
    shards = write_shards_on(
        engine,
        tmp,
        to_shards,
        to_write,
        bounds,
        dataset_id,
        config.shards.compression,
        work,
        faults,
        names,
        # the index is written while the workers write the shards (after them, in process)
        meanwhile=partial(write_examples, tmp / EXAMPLES_NAME, tables, dataset_id),
        multiple=config.plan.alignment(),
    )
    split = is_eval is not None
    del spill, to_shards, plan, is_eval, tables, repeats  # what is left holds no per-example state
    manifest = build_manifest(
        dataset_id=dataset_id,
        config=config.recorded(),
        tokenizer=made.tokenizer,
        template=made.template,
        inputs=[{**entry, "records": n} for entry, n in zip(made.inputs, per_input, strict=True)],
        stats=stats,
        files={
            "examples": {"path": EXAMPLES_NAME, "sha256": sha256_path(tmp / EXAMPLES_NAME)},
            "rejects": {"path": REJECTS_NAME, "sha256": sha256_path(tmp / REJECTS_NAME)},
        },
        shards=shard_entries(shards, split),
        loss={"option": config.ingest.loss, "by_format": resolved, "examples_by_policy": by_policy},
        engine=made.engine,
        environment=made.environment,
    )
    if made.parent is not None:
        manifest["parent"] = made.parent
    manifest["files"]["card"] = write_card(tmp, manifest)  # README.md: load_dataset(OUT) reads it
    write_manifest(tmp, manifest)
    return manifest


def _nothing_packed(spill: Spill, tally: RejectTally, config: PackConfig, made: Provenance) -> str:
    records = sum(spill.counts.records_per_source) + tally.total(REJECTED)
    codes = ", ".join(f"{code} {n}" for code, n in tally.by_code.items()) or "no records"
    fix = "fix the inputs or the options, e.g. --max-seq-len, --overlong"
    top, most = max(tally.by_code.items(), key=lambda kv: kv[1], default=("", 0))
    if most * 2 > sum(tally.by_code.values()) and reject_kind(top) == REJECTED:  # dominates
        cause = likely_cause(top, config.ingest.format, [e["resolved"] for e in made.inputs])
        fix = f"likely cause: {cause}"
    return (
        f"nothing to pack: none of the {records} records read was packed ({codes}); no "
        f"output was written ({fix})"
    )


def _beside_bfd(
    spill: Spill, plan: RowPlan, config: PackConfig, mixed: np.ndarray | None = None
) -> dict[str, Any]:
    """With ``--strategy sequential``: the rows and fill rate BFD gives the same examples.

    ``mixed`` (``--mix``) lists the examples planned, an example once per copy.
    """
    if config.plan.strategy != "sequential":
        return {}
    lengths = spill.lengths if mixed is None else spill.lengths[mixed]
    codes = spill.pair_codes if mixed is None else None  # --mix refuses pairs: no pair units
    rows = plan_pair_units(lengths, codes, config.plan.max_seq_len, "bfd").num_rows
    bfd = fill_rate(plan.num_tokens, rows, plan.max_seq_len)
    return {"bfd_rows": rows, "bfd_fill_rate": round(bfd, 6)}
