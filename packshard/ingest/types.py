"""The values ingest makes and hands on, stage by stage.

:class:`RawRecord` (read) ─► :class:`Conversation` (normalized) ─► :class:`Rendered` ─►
:class:`TokenizedBatch` (flat int32 tokens and labels with offsets) ─► :class:`IngestChunk`;
:class:`IngestOptions` says how records are read, labelled and batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from packshard.errors import UsageError
from packshard.options import (
    BACKENDS,
    EMPTY_REASONING,
    FORMAT_CHOICES,
    LIMIT_DEFAULTS,
    LOSS_POLICIES,
    MAX_DECOMPRESSED_BYTES,
    MAX_EXPANDED_TOKENS,
    MAX_EXPANSION,
    MAX_RECORD_BYTES,
    ON_ERROR,
    REASONING_MARKERS,
    REASONING_POLICIES,
    TEMPLATE_SECONDS,
    TURN_POLICIES,
    VISION_RULES,
    VisionRule,
    check_choice,
    check_range,
)
from packshard.records import Reject, SourceRef, quick


@quick
@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record as read from a file: a JSON value, or the error that stopped parsing it.

    ``domain`` is the file's default domain (its name without extensions); normalization
    replaces it with the record's ``--domain-field`` value when there is one.
    """

    ref: SourceRef
    domain: str
    value: Any = None
    error: Any = None  # RecordError | None (kept loose to avoid an import cycle)


@quick
@dataclass(frozen=True, slots=True)
class Message:
    """One chat turn: a ``role`` and its ``content`` (plain text, data).

    ``role`` is one of :data:`~packshard.options.ROLES`.

    ``extra`` holds the turn's other fields as ``(key, value)`` pairs, in record order
    (``tool_calls``, ``tool_call_id``, ``name`` …); the template sees them beside ``role`` and
    ``content``.  ``reasoning`` and ``train`` come from :mod:`packshard.ingest.fields`.
    """

    role: str
    content: str
    extra: tuple[tuple[str, Any], ...] = ()
    reasoning: str | None = None  # from a reasoning field (inline blocks stay in content)
    train: bool | None = None  # the turn's own flag ('train', or a weight), None: the policy
    parts: tuple[tuple[str, str], ...] | None = None  # ("text", s) / ("image", path): a VLM turn


@quick
@dataclass(frozen=True, slots=True)
class Conversation:
    """A normalized record, ready to be rendered.

    Exactly one shape is used:

    * chat: ``messages`` (rendered through the chat template); ``completion_start`` is the
      index of the first message that belongs to a prompt/completion record's completion;
    * plain prompt/completion: ``prompt`` and ``completion`` strings (no template);
    * plain text: ``text`` (no template, every token a target).

    A preference pair is chat whose ``messages`` are the prompt and ``answers`` the chosen and
    rejected final messages (each branch renders as ``messages + (answer,)``); a KTO record
    is chat with ``kto_label`` set (:mod:`packshard.ingest.pairs`).
    """

    ref: SourceRef
    domain: str
    format: str
    messages: tuple[Message, ...] = ()
    tools: tuple[Any, ...] | None = None
    completion_start: int | None = None
    prompt: str | None = None
    completion: str | None = None
    text: str | None = None
    answers: tuple[Message, Message] | None = None  # a preference pair: (chosen, rejected)
    kto_label: bool | None = None  # an unpaired (KTO) record's label
    media: tuple[MediaFile, ...] = ()  # the record's images, in the order the template meets them

    @property
    def is_chat(self) -> bool:
        """True when the record goes through the chat template."""
        return self.text is None and self.prompt is None


@quick
@dataclass(frozen=True, slots=True)
class Rendered:
    """One rendered example: its text and the character spans ``[lo, hi)`` to train on.

    ``label_path`` is one of :data:`~packshard.options.LABEL_PATHS`.  ``bos_chars`` > 0: the text
    starts with the BOS, encoded as ``add_special_tokens=True`` gives it.  ``reasoning`` lists
    the rendered reasoning blocks; ``turn`` is set on ``--turns expand`` examples.
    """

    text: str
    spans: tuple[tuple[int, int], ...]
    label_path: str
    bos_chars: int = 0
    reasoning: tuple[tuple[int, int], ...] = ()  # rendered non-empty reasoning blocks
    turn: int = 0  # --turns expand: the 1-based message the example trains (0: all)
    reasoning_dropped: int = 0  # trained turns whose reasoning the template left out
    pair: int = 0  # PAIR_CODES: 0 plain, 1 chosen, 2 rejected, 3/4 KTO undesirable/desirable
    images: int = 0  # images in the example (their placeholders expanded in ``text``)
    vision_tokens: int = 0  # their placeholder tokens, all images together
    image_sizes: tuple[tuple[int, int, int], ...] = ()  # per image: width, height, bytes


PAIR_CODES = ("plain", "chosen", "rejected", "kto_undesirable", "kto_desirable")
"""What ``Rendered.pair`` and ``TokenizedBatch.pairs`` hold, by code (int8)."""
NOT_A_BRANCH, CHOSEN, REJECTED = 0, 1, 2
"""The ``branch`` codes of a segment (shards) and of an example (ingest)."""


def pair_starts(codes: np.ndarray) -> np.ndarray:
    """Return the positions of the chosen branches whose rejected branch follows them."""
    if codes.size < 2:
        return np.zeros(0, np.int64)
    return np.flatnonzero((codes[:-1] == CHOSEN) & (codes[1:] == REJECTED))


Markers = tuple[str, str]
"""The opening and closing reasoning markers (``--reasoning-markers``)."""


@dataclass(frozen=True, slots=True)
class MediaFile:
    """One image of a record: where it is, how large, in pixels and bytes.

    ``root`` is the folder the path resolved against (``--media-root`` or the record's
    folder, as given); ``path`` the record's own spelling, relative to ``root`` (or absolute).
    """

    root: str
    path: str
    width: int
    height: int
    size: int  # bytes

    @property
    def file(self) -> Path:
        """The file on disk: ``root / path``."""
        return Path(self.root) / self.path


@dataclass(frozen=True, slots=True)
class TokenizedBatch:
    """Tokenized examples in columnar form.

    Example ``i`` owns ``input_ids[offsets[i]:offsets[i+1]]`` and the same slice of
    ``labels`` (unshifted).  ``refs``, ``domains`` and ``formats`` hold one entry per example;
    examples of one record are told apart by ``turns`` and ``pairs``.
    """

    input_ids: np.ndarray  # int32, flat
    labels: np.ndarray  # int32, flat
    offsets: np.ndarray  # int64, len == n + 1
    refs: Sequence[SourceRef]  # a tuple, or SourceRefs (columns) for many examples
    domains: tuple[str, ...]
    formats: tuple[str, ...]
    turns: np.ndarray | None = None  # int32 per example (--turns expand), None: all 0
    pairs: np.ndarray | None = None  # int8 per example (PAIR_CODES), None: all 0
    images: np.ndarray | None = None  # int32 per example: its images, None: all 0
    vision_tokens: np.ndarray | None = None  # int32 per example: its images' placeholders
    image_sizes: np.ndarray | None = None  # int64 [images, 3]: width, height, bytes, in order

    def __post_init__(self) -> None:
        n = len(self.refs)
        assert len(self.domains) == n and len(self.formats) == n, "one domain, format per example"
        assert self.offsets.shape == (n + 1,), "offsets has one entry per example, plus one"

    def __len__(self) -> int:
        return len(self.refs)

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Return example ``i``'s ``(input_ids, labels)`` views."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.input_ids[lo:hi], self.labels[lo:hi]


SMALL_JOB_BYTES = 32 << 20
"""Input bytes under which a job tries the fast library that builds soonest first.

gigatoken builds Qwen3's encoder sooner (0.71 CPU-s against fastokens' 1.85), fastokens
then encodes a little faster: a 2.04M-token pack took 4.39 CPU-s with gigatoken first against
7.04, a 17.1M-token one 19.8 against 17.1 (``docs/performance.md``, "Which fast library
first").  The line is decided from the input's bytes before anything starts
(:func:`packshard.pack.units.early.sized_config`), so every process of the job tries the same
library first (:func:`packshard.ingest.tokens.backends.libraries`).
"""


@dataclass(frozen=True, slots=True)
class IngestOptions:
    """How records are read, labelled and batched (the ``--format``/``--loss``… flags).

    The limits (:data:`LIMIT_DEFAULTS`) bound what one record may cost (docs/limits.md).
    """

    format: str = "auto"
    domain_field: str = "domain"
    loss: str = "auto"
    on_error: str = "skip"
    batch_size: int = 1024
    reasoning: str = "train"
    empty_reasoning: str = "train"
    turns: str = "as_rendered"
    reasoning_markers: tuple[str, str] = REASONING_MARKERS
    max_record_bytes: int = MAX_RECORD_BYTES
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES
    max_expansion: int = MAX_EXPANSION
    template_timeout: float = TEMPLATE_SECONDS
    max_expanded_tokens: int = MAX_EXPANDED_TOKENS
    backend: str = "reference"  # the library API's default; the command line's is auto
    small_job: bool = False  # under SMALL_JOB_BYTES of input: the fast encoder built soonest
    media_root: str | None = None  # where relative image paths start (None: the record's folder)
    max_pixels: int | None = None  # the vision rule's pixel bounds (None: the family's default)
    min_pixels: int | None = None
    vision_family: str = "qwen2_vl"  # whose processor sizes images (VISION_RULES)

    def check(self) -> None:
        """Raise :class:`UsageError` for a value ingest cannot honour."""
        check_choice("--backend", self.backend, BACKENDS)
        check_choice("--format", self.format, FORMAT_CHOICES)
        check_choice("--loss", self.loss, LOSS_POLICIES)
        check_choice("--on-error", self.on_error, ON_ERROR)
        check_choice("--reasoning", self.reasoning, REASONING_POLICIES)
        check_choice("--empty-reasoning", self.empty_reasoning, EMPTY_REASONING)
        check_choice("--turns", self.turns, TURN_POLICIES)
        check_range("--batch-size", self.batch_size, 1, 1 << 24)
        check_range("--max-record-bytes", self.max_record_bytes, 1, 1 << 40)
        check_range("--max-decompressed-bytes", self.max_decompressed_bytes, 1, 1 << 50)
        check_range("--max-expansion", self.max_expansion, 1, 1 << 30)
        check_range("--template-timeout", self.template_timeout, 0.001, 86400)
        check_range("--max-expanded-tokens", self.max_expanded_tokens, 1, 1 << 40)
        opening, closing = self.reasoning_markers
        if not opening.strip() or not closing.strip() or opening == closing:
            why = f"two different non-blank markers, got {opening!r} and {closing!r}"
            raise UsageError(f"--reasoning-markers needs {why} (e.g. '<think>,</think>')")
        check_choice("--vision-family", self.vision_family, tuple(VISION_RULES))
        self.vision_rule().check()
        if self.turns == "expand" and self.loss == "all":
            raise UsageError("--turns expand trains one turn per example (use --loss assistant)")

    def vision_rule(self) -> VisionRule:
        """Return the rule that sizes images: the family's, with the bounds the options set."""
        rule = VISION_RULES.get(self.vision_family, VisionRule())
        if self.max_pixels is not None:
            rule = replace(rule, max_pixels=self.max_pixels)
        if self.min_pixels is not None:
            rule = replace(rule, min_pixels=self.min_pixels)
        return rule

    def limits(self) -> dict[str, Any]:
        """Return the limits that differ from their defaults (what a manifest records)."""
        return {k: getattr(self, k) for k, v in LIMIT_DEFAULTS.items() if getattr(self, k) != v}


@dataclass(frozen=True)
class IngestChunk:
    """The examples and rejects of ``records`` consecutive input records.

    ``label_paths`` counts the examples per label path.  ``loss_tokens`` holds, per example,
    its trained labels after the first (:func:`packshard.arrays.count_trained`);
    ``reasoning_tokens`` and ``reasoning_loss`` count inside reasoning blocks.
    """

    batch: TokenizedBatch
    rejects: tuple[Reject, ...]
    records: int
    loss_tokens: np.ndarray
    label_paths: dict[str, int] = field(default_factory=dict)
    reasoning_tokens: np.ndarray | None = None  # per example: tokens in reasoning blocks
    reasoning_loss: np.ndarray | None = None  # per example: trained ones (None: no reasoning)
    reasoning_dropped: int = 0  # trained turns the template rendered without their reasoning
    pairs_read: int = 0  # preference records among ``records`` (packed or rejected)


@dataclass(frozen=True, slots=True)
class StageSpec:
    """What names a stage: a worker loads the same tokenizer and template from it."""

    tokenizer: str
    template: str | None
    options: IngestOptions
