"""What ``profile`` is asked to do: :class:`ProfileConfig`, composed like ``pack``'s.

::

    ProfileConfig ─ inputs, tokenizer, template, max_seq_len, overlong, batch_size, seed,
      │             split_bytes, mix, mix_by, max_repeat, mix_best_effort (as pack's: the
      │             predicted mixture; --overlong: what the advice says pack would do)
      ├─ ingest: IngestOptions   (format, loss, reasoning, turns, limits …)
      └─ engine: EngineOptions   (engine, workers, address)

``batch_size`` here is the training batch size the batching estimates assume; the records
per ingest chunk stay ``ingest.batch_size`` (not an option of ``profile``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from packshard.engine import EngineOptions
from packshard.ingest.types import IngestOptions
from packshard.options import MAX_SEED, check_max_seq_len, check_range
from packshard.pack.plan.mix import MixTarget, mix_target


@dataclass(frozen=True, slots=True)
class ProfileConfig:
    """Everything ``profile`` needs; :meth:`build` takes the command line's flat keywords."""

    inputs: tuple[str, ...]
    tokenizer: str
    max_seq_len: int
    template: str | None = None
    overlong: str = "drop"  # the policy pack would apply: what the advice describes
    batch_size: int = 8
    seed: int = 0
    split_bytes: int = 0  # 0: packshard.ingest.read.units.auto_split_bytes
    mix: str = ""  # --mix: predict the mixture pack would make (packshard.profile.mixture)
    mix_by: str = "trained_tokens"
    max_repeat: int = 1
    mix_best_effort: bool = False
    ingest: IngestOptions = field(default_factory=IngestOptions)
    engine: EngineOptions = field(default_factory=EngineOptions)

    @classmethod
    def build(cls, **flat: Any) -> ProfileConfig:
        """Build from flat keywords: the config's own first, then each part's by field name.

        ``ray_address`` is :class:`EngineOptions`' ``address``; ``fmt`` is ``format``;
        ``backend`` defaults to ``auto``, as on the command line.
        """
        renames = {"ray_address": "address", "fmt": "format"}
        flat = {renames.get(k, k): v for k, v in flat.items()}
        flat.setdefault("backend", "auto")
        own = {f.name for f in fields(cls)} - {"ingest", "engine"}
        mine = {k: flat.pop(k) for k in own & set(flat)}
        parts: dict[str, Any] = {}
        for name, kind in (("ingest", IngestOptions), ("engine", EngineOptions)):
            names = {f.name for f in fields(kind)} & set(flat)
            parts[name] = kind(**{k: flat.pop(k) for k in names})
        if flat:
            raise TypeError(f"ProfileConfig has no option {', '.join(sorted(flat))}")
        return cls(**mine, **parts)

    def check(self) -> None:
        """Raise :class:`~packshard.errors.UsageError` for options out of range."""
        self.ingest.check()
        check_max_seq_len(self.max_seq_len)
        check_range("--batch-size", self.batch_size, 1, 1 << 24)
        check_range("--seed", self.seed, 0, MAX_SEED)
        self.engine.check()
        self.mix_target()

    def mix_target(self) -> MixTarget | None:
        """``--mix`` and its options, checked and parsed; None without ``--mix``."""
        return mix_target(self.mix, self.mix_by, self.max_repeat, self.mix_best_effort)
