"""What ``repack`` is asked to do, and the parent packs it can re-plan without their inputs.

A :class:`RepackConfig` names the parent folder, the new one, and the planning and shard
options that change (``--max-seq-len``, ``--strategy``, ``--seed`` …, each spelled once, in
:class:`~packshard.pack.config.PlanOptions` and :class:`~packshard.pack.config.ShardOptions`).
:meth:`RepackConfig.pack_config` composes the :class:`~packshard.pack.config.PackConfig` a fresh
``pack`` would have run with: the parent's recorded ``config`` block, its inputs, tokenizer and
template, then the changes::

    parent manifest config  ─┐
    parent inputs, tokenizer ├─► PackConfig ─► recorded() ─► the same dataset id as a fresh pack
    changes (--max-seq-len …)┘

:func:`parent_problem` says why a parent cannot be re-planned from its tokens alone, before any
shard is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packshard.errors import UsageError
from packshard.format.topology import ATTENTION_C
from packshard.pack.config import PackConfig

LOST_TOKENS = ("truncated_no_targets", "split_no_targets")
"""Reject codes of records whose tokens the parent cut away: they cannot be re-planned."""

_INGEST = ("format", "domain_field", "loss", "reasoning", "empty_reasoning", "turns")
_PLAN = ("max_seq_len", "strategy", "overlong", "seed", "group_by_domain", "plan_scope")
_SHARDS = ("shard_rows", "shard_bytes", "compression")
_ALIGNMENT = ("pad_multiple", "cp", "tp")
_TOPOLOGY = ("dp", "micro_batch", "grad_accum", "balance_cost", "attention_c")
CHANGES = (*_PLAN, "eval_fraction", *_SHARDS, *_ALIGNMENT, *_TOPOLOGY)
"""The :meth:`PackConfig.build` keywords a repack may change: planning and shards, no ingest."""


@dataclass(frozen=True, slots=True)
class RepackConfig:
    """``repack PARENT -o OUT`` and the options that differ from the parent's."""

    parent: str
    out: str
    changes: tuple[tuple[str, Any], ...] = ()  # (PackConfig.build keyword, value), CHANGES only
    overwrite: bool = False

    @classmethod
    def build(cls, parent: str, out: str, overwrite: bool = False, **changes: Any) -> RepackConfig:
        """Build from flat keywords; a ``None`` value keeps the parent's setting."""
        unknown = sorted(set(changes) - set(CHANGES))
        if unknown:
            raise UsageError(
                f"repack cannot change {unknown[0]!r}: it re-plans the parent's tokens "
                f"(it changes {', '.join(CHANGES)}; pack from the inputs for the rest)"
            )
        given = tuple((k, changes[k]) for k in CHANGES if changes.get(k) is not None)
        return cls(parent, out, given, overwrite)

    def pack_config(self, manifest: dict[str, Any]) -> PackConfig:
        """Return the configuration a fresh ``pack`` of the parent's inputs would run with."""
        recorded = manifest["config"]
        flat: dict[str, Any] = {k: recorded[k] for k in (*_INGEST, *_PLAN, *_SHARDS)}
        flat["reasoning_markers"] = tuple(recorded["reasoning_markers"])
        flat.update(recorded.get("limits", {}))
        flat["eval_fraction"] = recorded.get("eval", {}).get("fraction", 0.0)
        flat.update({k: recorded["alignment"][k] for k in _ALIGNMENT if "alignment" in recorded})
        if topology := recorded.get("topology"):
            flat.update(dp=topology["dp"], micro_batch=topology["micro_batch"])
            flat.update(grad_accum=topology["grad_accum"], balance_cost=topology["cost"])
            flat["attention_c"] = topology["c"] if topology["cost"] == "attention" else ATTENTION_C
        flat.update(self.changes)
        template = manifest["template"]["source"]
        return PackConfig.build(
            inputs=tuple(entry["path"] for entry in manifest["inputs"]),
            tokenizer=manifest["tokenizer"]["path"],
            out=self.out,
            template=template,
            overwrite=self.overwrite,
            **flat,
        )


def parent_problem(manifest: dict[str, Any]) -> str | None:
    """Return why the parent cannot be re-planned from its own tokens, or None.

    Every refusal names what was lost and the fix (pack from the inputs).
    """
    config, stats = manifest["config"], manifest["stats"]
    fix = "pack from the inputs with the new options"
    if "mix" in config:
        return f"it was made with --mix, whose repeated copies are drawn per record ({fix})"
    if (stats.get("pairs") or {}).get("packed") or any((stats.get("kto") or {}).values()):
        return f"it holds preference pairs or KTO records; repack re-plans plain examples ({fix})"
    if config.get("turns") == "expand":
        return f"it was made with --turns expand, several examples per record ({fix})"
    if config.get("eval", {}).get("inputs"):
        return f"its eval split comes from --eval inputs; repack re-draws --eval-fraction ({fix})"
    cut = {k: stats.get(k, 0) for k in ("split", "truncated", "parts_dropped")}
    lost = sum(stats.get("rejects_by_code", {}).get(code, 0) for code in LOST_TOKENS)
    if any(cut.values()) or lost:
        counts = ", ".join(f"{k} {v}" for k, v in cut.items() if v)
        counts = counts or f"records cut to no target {lost}"
        return (
            f"its overlong policy cut examples at max_seq_len {config['max_seq_len']} ({counts}): "
            "the tokens past a cut are not in it and a part's first label is masked there, so "
            f"the whole examples cannot be re-made ({fix})"
        )
    return None
