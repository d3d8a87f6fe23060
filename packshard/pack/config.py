"""What ``pack`` is asked to do: :class:`PackConfig`, checked before any work starts."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from packshard.engine import EngineOptions
from packshard.errors import UsageError
from packshard.format.folder.outdir import check_out
from packshard.format.topology import ATTENTION_C, Topology, alignment_multiple
from packshard.ingest.types import IngestOptions
from packshard.options import (
    COMPRESSIONS,
    MAX_SEED,
    NO_CAP,
    ON_ERROR,
    OVERLONG_POLICIES,
    STRATEGIES,
    VisionCaps,
    check_choice,
    check_max_seq_len,
    check_range,
)
from packshard.pack.plan.mix import MixTarget, mix_target
from packshard.store import is_url, parse_url


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """How examples become rows: ``--max-seq-len``, ``--strategy``, ``--overlong``, the seed."""

    max_seq_len: int
    strategy: str = "bfd"
    overlong: str = "drop"
    seed: int = 0
    group_by_domain: bool = False
    plan_scope: str = "global"
    mix: str = ""  # --mix DOMAIN=SHARE,… (packshard.pack.plan.mix); "" packs every record once
    mix_by: str = "trained_tokens"
    max_repeat: int = 1
    mix_best_effort: bool = False
    pad_multiple: int = 1  # --pad-multiple, --cp, --tp: packshard.format.topology.aligned
    cp: int = 1
    tp: int = 1
    dp: int = 0  # --dp …: rank-balanced steps (packshard.pack.plan.balance); 0 leaves the order
    micro_batch: int = 1
    grad_accum: int = 1
    balance_cost: str = "attention"
    attention_c: float = ATTENTION_C
    max_images_per_row: int = NO_CAP  # rows capped in images (packshard.pack.plan.vision)
    max_vision_tokens_per_row: int = NO_CAP

    def vision_caps(self) -> VisionCaps:
        """Return ``--max-images-per-row`` and ``--max-vision-tokens-per-row``, checked."""
        caps = VisionCaps(self.max_images_per_row, self.max_vision_tokens_per_row)
        caps.check(self.strategy)
        return caps

    def alignment(self) -> int:
        """Return the multiple every segment is padded to (1: none), checked."""
        return alignment_multiple(self.pad_multiple, self.cp, self.tp)

    def topology(self) -> Topology | None:
        """Return the steps the rows are balanced for, checked; None without ``--dp``."""
        if not self.dp:
            return None
        cost, c = self.balance_cost, self.attention_c
        return Topology(self.dp, self.micro_batch, self.grad_accum, cost, c)

    def group(self) -> int | None:
        """Examples per planning group of ``--plan-scope group:N``; None for ``global``."""
        return None if self.plan_scope == "global" else int(self.plan_scope.split(":", 1)[1])

    def mix_target(self) -> MixTarget | None:
        """``--mix`` and its options, checked and parsed; None without ``--mix``."""
        return mix_target(self.mix, self.mix_by, self.max_repeat, self.mix_best_effort)


@dataclass(frozen=True, slots=True)
class ShardOptions:
    """How rows become files: rows and bytes per shard, the Parquet compression."""

    shard_rows: int = 8192
    shard_bytes: int = 256 * 1024 * 1024
    compression: str = "zstd"


@dataclass(frozen=True, slots=True)
class PackConfig:
    """Everything ``pack`` needs, each field spelled once, in the part that owns it.

    ::

        PackConfig ─ inputs, tokenizer, template, out, overwrite, resume, split_bytes, num_workers
          ├─ ingest: IngestOptions   (format, loss, reasoning, turns, limits, batch_size …)
          ├─ plan:   PlanOptions     (max_seq_len, strategy, overlong, seed, scope …)
          ├─ shards: ShardOptions    (shard_rows, shard_bytes, compression)
          └─ engine: EngineOptions   (engine, workers, address)

    The manifest's ``config`` block is derived from them (:meth:`recorded`).
    :meth:`build` takes the flat keywords of the command line.
    """

    inputs: tuple[str, ...]
    tokenizer: str
    out: str
    plan: PlanOptions
    template: str | None = None
    ingest: IngestOptions = field(default_factory=IngestOptions)
    shards: ShardOptions = field(default_factory=ShardOptions)
    engine: EngineOptions = field(default_factory=EngineOptions)
    overwrite: bool = False
    resume: bool = False
    split_bytes: int = 0  # 0: packshard.ingest.read.units.auto_split_bytes
    num_workers: int | None = None
    allow_split_markers: bool = False  # not recorded: it changes no output, only a check
    eval_fraction: float = 0.0  # records drawn into the eval split (packshard.pack.plan.schedule)
    eval_inputs: tuple[str, ...] = ()  # inputs whose records are all eval

    @classmethod
    def build(
        cls, inputs: tuple[str, ...], tokenizer: str, out: str, max_seq_len: int, **flat: Any
    ) -> PackConfig:
        """Build from flat keywords: each goes to the part that has a field of its name.

        ``ray_address`` is :class:`EngineOptions`' ``address``; an unknown keyword is a
        ``TypeError``, as for any constructor.  ``backend`` defaults to ``auto`` here, as on the
        command line (every backend makes the same bytes; it is not recorded in ``config``).
        """
        flat.update(inputs=inputs, tokenizer=tokenizer, out=out, max_seq_len=max_seq_len)
        flat.setdefault("backend", "auto")
        if "ray_address" in flat:
            flat["address"] = flat.pop("ray_address")
        parts: dict[str, Any] = {}
        for name, kind in (
            ("ingest", IngestOptions),
            ("plan", PlanOptions),
            ("shards", ShardOptions),
            ("engine", EngineOptions),
        ):
            own = {f.name for f in fields(kind)} & set(flat)
            parts[name] = kind(**{k: flat.pop(k) for k in own})
        return cls(**flat, **parts)

    def recorded(self) -> dict[str, Any]:
        """Return the manifest's ``config`` block (what determines the output's content).

        ``limits`` is there only when a limit was moved from its default, so packs made with
        the defaults keep their dataset ids.
        """
        plan, ingest, shards = self.plan, self.ingest, self.shards
        recorded: dict[str, Any] = {
            "max_seq_len": plan.max_seq_len,
            "strategy": plan.strategy,
            "overlong": "split" if plan.strategy == "wrapped" else plan.overlong,
            "loss": ingest.loss,
            "position_ids": "reset",
            "seed": plan.seed,
            "group_by_domain": plan.group_by_domain,
            "format": ingest.format,
            "domain_field": ingest.domain_field,
            "compression": shards.compression,
            "shard_rows": shards.shard_rows,
            "shard_bytes": shards.shard_bytes,
            "plan_scope": plan.plan_scope,
            "reasoning": ingest.reasoning,
            "empty_reasoning": ingest.empty_reasoning,
            "turns": ingest.turns,
            "reasoning_markers": list(ingest.reasoning_markers),
            **({"limits": limits} if (limits := ingest.limits()) else {}),
        }
        if (multiple := plan.alignment()) > 1:
            recorded["alignment"] = {
                "multiple": multiple,
                "pad_multiple": plan.pad_multiple,
                "cp": plan.cp,
                "tp": plan.tp,
            }
        if (topology := plan.topology()) is not None:
            recorded["topology"] = topology.recorded()
        moved = ingest.max_pixels or ingest.min_pixels or ingest.vision_family != "qwen2_vl"
        if ingest.media_root is not None or moved:
            recorded["media"] = {  # images: where their paths start, how they are sized
                "media_root": ingest.media_root,
                "vision_rule": ingest.vision_rule().as_dict(),
            }
        if (caps := plan.vision_caps()).active:  # recorded only when asked: ids stay as they were
            recorded["vision_caps"] = caps.as_dict()
        if self.eval_fraction or self.eval_inputs:
            recorded["eval"] = {"fraction": self.eval_fraction, "inputs": list(self.eval_inputs)}
        if (mix := plan.mix_target()) is not None:
            recorded["mix"] = {  # spelled out: these keys are part of the dataset id
                "shares": dict(mix.shares),
                "by": mix.by,
                "max_repeat": mix.max_repeat,
                "best_effort": mix.best_effort,
            }
        return recorded


def _check_topology(config: PackConfig) -> None:
    """Refuse an alignment the rows cannot hold, and balanced steps without rows to order."""
    plan = config.plan
    multiple = plan.alignment()
    if multiple > 1 and plan.max_seq_len % multiple:
        raise UsageError(
            f"--max-seq-len {plan.max_seq_len} is not a multiple of the segment alignment "
            f"{multiple} (a padded row must fit: use --max-seq-len "
            f"{plan.max_seq_len // multiple * multiple or multiple})"
        )
    if multiple > 1 and plan.strategy == "wrapped":
        raise UsageError(
            "--strategy wrapped cuts rows full to the token; padded segments would overflow "
            "them (use --strategy bfd, ffd or sequential with --cp/--pad-multiple)"
        )
    if plan.dp < 0 or type(plan.dp) is not int:
        raise UsageError(f"--dp must be a positive integer (0: no balancing), got {plan.dp!r}")
    if plan.topology() is not None and plan.strategy == "sequential":
        raise UsageError(
            "--strategy sequential keeps the input order; --dp would reorder the rows into "
            "balanced steps (drop one of them)"
        )


def check_config(config: PackConfig) -> list[str]:
    """Refuse impossible options up front; return warnings for questionable ones."""
    plan, shards = config.plan, config.shards
    check_max_seq_len(plan.max_seq_len)
    check_range("--seed", plan.seed, 0, MAX_SEED)
    check_choice("--strategy", plan.strategy, STRATEGIES)
    check_choice("--overlong", plan.overlong, OVERLONG_POLICIES)
    check_choice("--compression", shards.compression, COMPRESSIONS)
    check_choice("--on-error", config.ingest.on_error, ON_ERROR)
    config.ingest.check()
    check_range("--shard-rows", shards.shard_rows, -(1 << 63), (1 << 31) - 1)
    check_range("--shard-bytes", shards.shard_bytes, -(1 << 63), 1 << 50)
    if shards.shard_rows < 1 or shards.shard_bytes < 1:
        raise UsageError("--shard-rows and --shard-bytes must be positive")
    _check_scale(config)
    _check_mix(config)
    _check_topology(config)
    plan.vision_caps()
    fraction = config.eval_fraction
    if type(fraction) not in (int, float) or not 0 <= fraction < 1:
        raise UsageError(f"--eval-fraction must be in [0, 1), got {fraction!r}")
    if config.num_workers is not None:
        check_range("--num-workers", config.num_workers, 1, 4096)
    if not is_url(config.out):  # a store's OUT is checked when it is claimed
        check_out(config.out, config.overwrite)
    else:
        parse_url(config.out)
    warnings: list[str] = []
    if plan.strategy == "wrapped" and config.ingest.turns == "expand":
        raise UsageError(
            "--turns expand builds one example per turn; --strategy wrapped would cut them "
            "into a stream (use --strategy bfd|ffd)"
        )
    if plan.strategy == "sequential" and plan.group_by_domain:
        raise UsageError(
            "--strategy sequential keeps the input order; --group-by-domain would regroup the "
            "rows by domain (drop one of them)"
        )
    if plan.strategy == "wrapped" and plan.overlong not in ("drop", "split"):
        warnings.append(
            f"--strategy wrapped splits every example at row ends; --overlong {plan.overlong} "
            "does not apply (the manifest records overlong=split)"
        )
    split_like = plan.overlong == "split" or plan.strategy == "wrapped"
    if split_like and config.ingest.loss in ("auto", "assistant", "last_assistant"):
        warnings.append(
            "splitting chat examples: parts after the first lose their prompt (their targets "
            "are trained without the conversation that led to them)"
        )
    return warnings


def _check_scale(config: PackConfig) -> None:
    """Refuse engine, unit and plan-scope options that cannot work."""
    config.engine.check()
    if config.split_bytes < 0:
        raise UsageError(
            f"--split-bytes must be positive (0: chosen from the inputs), got {config.split_bytes}"
        )
    scope = config.plan.plan_scope
    if scope != "global":
        size = scope.removeprefix("group:")
        if not scope.startswith("group:") or not size.isdigit() or int(size) < 1:
            raise UsageError(f"--plan-scope {scope!r} is not global or group:N (N examples >= 1)")
        if config.plan.group_by_domain:
            raise UsageError("--plan-scope group:N and --group-by-domain cannot be combined")


def _check_mix(config: PackConfig) -> None:
    """Refuse ``--mix`` options that cannot work, and mixture options without ``--mix``."""
    plan = config.plan
    if plan.mix_target() is None:  # --mix-by and --max-repeat checked, --mix parsed
        moved = [
            name
            for name, value, default in (
                ("--mix-by", plan.mix_by, "trained_tokens"),
                ("--max-repeat", plan.max_repeat, 1),
                ("--mix-best-effort", plan.mix_best_effort, False),
            )
            if value != default
        ]
        if moved:
            raise UsageError(f"{moved[0]} applies to a mixture: add --mix DOMAIN=SHARE,…")
        return
    if plan.strategy == "wrapped":
        raise UsageError(
            "--mix keeps whole examples; --strategy wrapped cuts them into a stream "
            "(use --strategy bfd|ffd|sequential)"
        )
    if config.eval_fraction or config.eval_inputs:
        raise UsageError(
            "--mix and an eval split cannot be combined yet: pack the mixture, then draw "
            "the eval set from separate inputs with another pack"
        )
