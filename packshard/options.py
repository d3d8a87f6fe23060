"""Every option vocabulary and resource limit, defined once, with the one check of each.

**Vocabularies**: the choices the command line offers (``--format``, ``--loss`` and what
``auto`` resolves to, ``--strategy`` …), the label paths and roles; every stage validates its
options against them with :func:`check_choice`.

**Limits** ingest honours (:data:`LIMIT_DEFAULTS`, docs/limits.md):

    max_record_bytes        a JSONL line, JSON array element or Parquet row (and any string a
                            template builds) at most; larger: a ``too_large`` reject
    max_decompressed_bytes  what one ``.gz``/``.zst`` input may decompress to; more: exit 2
    max_expansion           decompressed / compressed bytes, checked past 16 MiB; more: exit 2
    template_timeout        seconds one render of one record may take; more: ``template_error``
    max_expanded_tokens     tokens all the turn examples of one record may hold together under
                            ``--turns expand`` (each renders the conversation up to its turn:
                            n turns cost O(n²)); more: a ``too_large`` reject.  Rendering
                            stops early once the examples' text passes
                            ``EXPANDED_CHARS_PER_TOKEN`` characters a token

Every option with a numeric range is checked with :func:`check_range` before any work starts,
so a wrong value is one line and exit 2, never a traceback after a long ingest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from packshard.errors import UsageError

FORMATS = ("messages", "sharegpt", "alpaca", "prompt_completion", "text", "preference", "kto")
"""Record formats (``--format`` also takes ``auto``: detect per record)."""
FORMAT_CHOICES = ("auto", *FORMATS)
ROLES = ("system", "user", "assistant", "tool")
LOSS_POLICIES = ("auto", "assistant", "last_assistant", "all", "completion")
"""``--loss``: ``auto`` resolves per record format (:data:`AUTO_LOSS`)."""
AUTO_LOSS = {
    "messages": "assistant",
    "sharegpt": "assistant",
    "alpaca": "assistant",
    "prompt_completion": "completion",
    "text": "all",
    "preference": "last_assistant",
    "kto": "last_assistant",
}
"""What ``--loss auto`` means for each record format (recorded in the manifest)."""
FINAL_TURN_FORMATS = ("preference", "kto")
"""Formats trained on their final assistant turn under every ``--loss``."""
ON_ERROR = ("skip", "fail")
STRATEGIES = ("bfd", "ffd", "sequential", "wrapped")
"""``--strategy``: best-fit or first-fit decreasing, next-fit in input order, or a stream cut
into rows."""
MIX_BY = ("tokens", "trained_tokens", "examples")
"""What ``--mix`` shares are counted in (:mod:`packshard.format.mixture`)."""
OVERLONG_POLICIES = ("drop", "truncate", "split", "error")
COMPRESSIONS = ("zstd", "snappy", "none")
EXPORT_TARGETS = (
    "megatron",
    "megatron-npy",
    "megatron-parquet",
    "torchtune",
    "mds",
    "unpacked",
)
"""``packshard export --to``: each a module of :mod:`packshard.export`."""
CHECKS = ("integrity", "structure", "source", "model", "vision")
"""The checks ``verify`` runs, in order (:mod:`packshard.verify.run`); ``vision`` on packs
with images only."""
LABEL_PATHS = ("generation_tags", "offsets", "none")
"""How a record's trained characters are found (see :mod:`packshard.ingest.template.render`)."""
REASONING_POLICIES = ("train", "mask", "drop")
"""``--reasoning``: train it with the answer, keep it untrained, or remove it before rendering."""
EMPTY_REASONING = ("train", "mask")
"""``--empty-reasoning``: what to do with an empty reasoning block a template renders."""
TURN_POLICIES = ("as_rendered", "expand")
"""``--turns``: the conversation once as rendered, or one example per trained turn."""
REASONING_MARKERS = ("<think>", "</think>")
"""Default ``--reasoning-markers``: the opening and closing marker of an inline block."""
BACKENDS = ("auto", "fast", "reference")
"""``--backend``: which libraries render and encode (:mod:`packshard.ingest.template.fast`,
:mod:`packshard.ingest.tokens.backends`); auto proves the fast ones on a canary and the first
records before it trusts them."""


def check_choice(option: str, value: str, allowed: Sequence[str]) -> None:
    """Raise :class:`UsageError` unless ``value`` is one of ``allowed`` (named as ``option``)."""
    if value not in allowed:
        raise UsageError(f"{option} {value!r} is not one of {', '.join(allowed)}")


def resolve_loss(loss: str, fmt: str) -> str:
    """Return the loss policy a record of format ``fmt`` is labelled with under ``--loss``.

    Preference pairs and KTO records always train their final assistant turn, whatever
    ``--loss`` says (a pair compares one final answer).
    """
    if fmt in FINAL_TURN_FORMATS:
        return "last_assistant"
    return AUTO_LOSS[fmt] if loss == "auto" else loss


MAX_RECORD_BYTES = 16 << 20
MAX_DECOMPRESSED_BYTES = 64 << 30
MAX_EXPANSION = 200
TEMPLATE_SECONDS = 5.0
MAX_EXPANDED_TOKENS = 1 << 22
EXPANDED_CHARS_PER_TOKEN = 16
"""Rendered characters a token may stand for before tokenizing (an early, generous bound)."""
LIMIT_DEFAULTS = {
    "max_record_bytes": MAX_RECORD_BYTES,
    "max_decompressed_bytes": MAX_DECOMPRESSED_BYTES,
    "max_expansion": MAX_EXPANSION,
    "template_timeout": TEMPLATE_SECONDS,
    "max_expanded_tokens": MAX_EXPANDED_TOKENS,
}
"""The resource limits, by ``IngestOptions`` field, with their defaults."""
MAX_SEQ_LEN = 1 << 24
"""Largest ``--max-seq-len``: planning allocates per possible row length."""
MAX_SEED = (1 << 63) - 1


def check_range(option: str, value: Any, low: float, high: float | None = None) -> None:
    """Raise :class:`UsageError` unless ``low <= value <= high`` (a number, not a bool)."""
    if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
        raise UsageError(f"{option} must be a number, got {value!r}")
    if value < low:
        raise UsageError(f"{option} must be at least {_shown(low)}, got {value!r}")
    if high is not None and value > high:
        raise UsageError(f"{option} must be at most {_shown(high)}, got {value!r}")


def _shown(bound: float) -> str:
    return f"{bound:,}" if isinstance(bound, int) else f"{bound:g}"


def check_max_seq_len(value: Any) -> None:
    """Raise :class:`UsageError` unless ``value`` is a usable ``--max-seq-len``."""
    if isinstance(value, int) and not isinstance(value, bool) and value < 2:
        raise UsageError(f"--max-seq-len {value} is too small (need at least 2)")
    check_range("--max-seq-len", value, 2, MAX_SEQ_LEN)


NO_CAP = 0
"""``--max-images-per-row`` and ``--max-vision-tokens-per-row`` left unset: rows are not capped."""
CAPPED_STRATEGIES = ("bfd", "sequential")
"""The strategies that take vision caps (:mod:`packshard.pack.plan.vision`)."""


@dataclass(frozen=True, slots=True)
class VisionCaps:
    """The most images and vision tokens a row may hold (:data:`NO_CAP`: no cap)."""

    images: int = NO_CAP
    tokens: int = NO_CAP

    @property
    def active(self) -> bool:
        """Tell whether any cap is set."""
        return self.images != NO_CAP or self.tokens != NO_CAP

    def check(self, strategy: str) -> None:
        """Raise :class:`UsageError` for a negative cap or a strategy that takes none."""
        for flag, value in (
            ("--max-images-per-row", self.images),
            ("--max-vision-tokens-per-row", self.tokens),
        ):
            if type(value) is not int or value < 0:
                raise UsageError(f"{flag} must be a positive integer (0: no cap), got {value!r}")
        if self.active and strategy not in CAPPED_STRATEGIES:
            raise UsageError(
                f"--strategy {strategy} does not take --max-images-per-row or "
                "--max-vision-tokens-per-row (use --strategy bfd or sequential)"
            )

    def as_dict(self) -> dict[str, int]:
        """Return the caps set, as a manifest records them."""
        caps = {"max_images_per_row": self.images, "max_vision_tokens_per_row": self.tokens}
        return {k: v for k, v in caps.items() if v != NO_CAP}


@dataclass(frozen=True, slots=True)
class VisionRule:
    """How a model family sizes an image: patch and merge sizes, pixel bounds.

    The defaults are Qwen2-VL's image processor's (``Qwen2VLImageProcessor()``), which
    Qwen2.5-VL shares; ``name`` is what a manifest records.
    """

    name: str = "qwen2_vl"
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280

    def check(self) -> None:
        """Raise :class:`UsageError` for bounds no image could meet."""
        factor = self.patch_size * self.merge_size
        if self.min_pixels < 1 or self.max_pixels < factor * factor:
            raise UsageError(
                f"--max-pixels must be at least {factor * factor} (one {factor}x{factor} "
                f"block) and --min-pixels at least 1, got {self.max_pixels} and {self.min_pixels}"
            )
        if self.min_pixels > self.max_pixels:
            raise UsageError(
                f"--min-pixels {self.min_pixels} is over --max-pixels {self.max_pixels}"
            )

    def as_dict(self) -> dict[str, int | str]:
        """Return the rule as a manifest records it."""
        return {
            "name": self.name,
            "patch_size": self.patch_size,
            "merge_size": self.merge_size,
            "temporal_patch_size": self.temporal_patch_size,
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
        }

    def processor_options(self) -> dict[str, Any]:
        """Return the keywords that make transformers' Qwen2-VL image processor this rule's.

        Qwen3-VL's processor is that class with its checkpoints' settings (patch 16, mean and
        std 0.5 instead of CLIP's); the grids depend on the sizes only.
        """
        options: dict[str, Any] = {
            "patch_size": self.patch_size,
            "merge_size": self.merge_size,
            "temporal_patch_size": self.temporal_patch_size,
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
        }
        if self.name == "qwen3_vl":
            options.update(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
        return options


VISION_RULES = {
    "qwen2_vl": VisionRule(),
    "qwen3_vl": VisionRule("qwen3_vl", 16, 2, 2, 256 * 256, 4096 * 4096),
}
"""``--vision-family``: each family's rule.  Qwen2-VL's is Qwen2.5-VL's too; Qwen3-VL's is the
``preprocessor_config.json`` of its checkpoints (``size`` shortest edge 65,536 and longest
edge 16,777,216 pixels, patch 16, merge 2) read by the same image processor class, which
transformers' auto mapping gives Qwen3-VL."""
