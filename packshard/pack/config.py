"""What ``pack`` is asked to do: :class:`PackConfig`, checked before any work starts."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from packshard.engine import EngineOptions
from packshard.errors import UsageError
from packshard.ingest.types import IngestOptions
from packshard.options import (
    COMPRESSIONS,
    MAX_DECOMPRESSED_BYTES,
    MAX_EXPANDED_TOKENS,
    MAX_EXPANSION,
    MAX_RECORD_BYTES,
    MAX_SEED,
    ON_ERROR,
    OVERLONG_POLICIES,
    REASONING_MARKERS,
    STRATEGIES,
    TEMPLATE_SECONDS,
    check_choice,
    check_max_seq_len,
    check_range,
)
from packshard.pack.write.outdir import check_out


@dataclass(frozen=True, slots=True)
class PackConfig:
    """Everything ``pack`` needs; the recorded part goes into the manifest's ``config``."""

    inputs: tuple[str, ...]
    tokenizer: str
    out: str
    max_seq_len: int
    template: str | None = None
    strategy: str = "bfd"
    overlong: str = "drop"
    loss: str = "auto"
    seed: int = 0
    group_by_domain: bool = False
    format: str = "auto"
    domain_field: str = "domain"
    on_error: str = "skip"
    shard_rows: int = 8192
    shard_bytes: int = 256 * 1024 * 1024
    compression: str = "zstd"
    overwrite: bool = False
    num_workers: int | None = None
    batch_size: int = 1024
    engine: str = "local"
    workers: int = 1
    ray_address: str | None = None
    resume: bool = False
    plan_scope: str = "global"
    split_bytes: int = 0  # 0: packshard.ingest.read.splits.auto_split_bytes
    reasoning: str = "train"
    empty_reasoning: str = "train"
    turns: str = "as_rendered"
    reasoning_markers: tuple[str, str] = REASONING_MARKERS
    max_record_bytes: int = MAX_RECORD_BYTES
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES
    max_expansion: int = MAX_EXPANSION
    template_timeout: float = TEMPLATE_SECONDS
    max_expanded_tokens: int = MAX_EXPANDED_TOKENS
    allow_split_markers: bool = False  # not recorded: it changes no output, only a check
    backend: str = "auto"  # not recorded in config: every backend makes the same bytes

    def ingest_options(self) -> IngestOptions:
        """Return the options ingest runs with."""
        # every ingest option is a PackConfig field of the same name
        return IngestOptions(**{f.name: getattr(self, f.name) for f in fields(IngestOptions)})

    def recorded(self) -> dict[str, Any]:
        """Return the manifest's ``config`` block (what determines the output's content).

        ``limits`` is there only when a limit was moved from its default, so packs made with
        the defaults keep their dataset ids.
        """
        return {
            "max_seq_len": self.max_seq_len,
            "strategy": self.strategy,
            "overlong": "split" if self.strategy == "wrapped" else self.overlong,
            "loss": self.loss,
            "position_ids": "reset",
            "seed": self.seed,
            "group_by_domain": self.group_by_domain,
            "format": self.format,
            "domain_field": self.domain_field,
            "compression": self.compression,
            "shard_rows": self.shard_rows,
            "shard_bytes": self.shard_bytes,
            "plan_scope": self.plan_scope,
            "reasoning": self.reasoning,
            "empty_reasoning": self.empty_reasoning,
            "turns": self.turns,
            "reasoning_markers": list(self.reasoning_markers),
            **({"limits": limits} if (limits := self.ingest_options().limits()) else {}),
        }

    def plan_group(self) -> int | None:
        """Examples per planning group of ``--plan-scope group:N``; None for ``global``."""
        return None if self.plan_scope == "global" else int(self.plan_scope.split(":", 1)[1])


def check_config(config: PackConfig) -> list[str]:
    """Refuse impossible options up front; return warnings for questionable ones."""
    check_max_seq_len(config.max_seq_len)
    check_range("--seed", config.seed, 0, MAX_SEED)
    check_choice("--strategy", config.strategy, STRATEGIES)
    check_choice("--overlong", config.overlong, OVERLONG_POLICIES)
    check_choice("--compression", config.compression, COMPRESSIONS)
    check_choice("--on-error", config.on_error, ON_ERROR)
    config.ingest_options().check()
    check_range("--shard-rows", config.shard_rows, -(1 << 63), (1 << 31) - 1)
    check_range("--shard-bytes", config.shard_bytes, -(1 << 63), 1 << 50)
    if config.shard_rows < 1 or config.shard_bytes < 1:
        raise UsageError("--shard-rows and --shard-bytes must be positive")
    _check_scale(config)
    if config.num_workers is not None:
        check_range("--num-workers", config.num_workers, 1, 4096)
    check_out(config.out, config.overwrite)
    warnings: list[str] = []
    if config.strategy == "wrapped" and config.turns == "expand":
        raise UsageError(
            "--turns expand builds one example per turn; --strategy wrapped would cut them "
            "into a stream (use --strategy bfd|ffd)"
        )
    if config.strategy == "sequential" and config.group_by_domain:
        raise UsageError(
            "--strategy sequential keeps the input order; --group-by-domain would regroup the "
            "rows by domain (drop one of them)"
        )
    if config.strategy == "wrapped" and config.overlong not in ("drop", "split"):
        warnings.append(
            f"--strategy wrapped splits every example at row ends; --overlong {config.overlong} "
            "does not apply (the manifest records overlong=split)"
        )
    split_like = config.overlong == "split" or config.strategy == "wrapped"
    if split_like and config.loss in ("auto", "assistant", "last_assistant"):
        warnings.append(
            "splitting chat examples: parts after the first lose their prompt (their targets "
            "are trained without the conversation that led to them)"
        )
    return warnings


def _check_scale(config: PackConfig) -> None:
    """Refuse engine, unit and plan-scope options that cannot work."""
    EngineOptions(config.engine, config.workers, config.ray_address).check()
    if config.split_bytes < 0:
        raise UsageError(
            f"--split-bytes must be positive (0: chosen from the inputs), got {config.split_bytes}"
        )
    scope = config.plan_scope
    if scope != "global":
        size = scope.removeprefix("group:")
        if not scope.startswith("group:") or not size.isdigit() or int(size) < 1:
            raise UsageError(f"--plan-scope {scope!r} is not global or group:N (N examples >= 1)")
        if config.group_by_domain:
            raise UsageError("--plan-scope group:N and --group-by-domain cannot be combined")
