"""Typed values that flow between the pipeline stages.

``read_records`` yields :class:`RawRecord` (a parsed JSON value, or the reason it could not be
parsed, with its place).  ``normalize_record`` turns a value into a :class:`Conversation`.
Rendering and tokenization produce :class:`TokenizedBatch`: flat int32 token and label arrays
with an offsets array, never Python lists of ints.  Records that cannot be used become
:class:`Reject` values, each with a stable ``code``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

IGNORE_INDEX = -100
"""Label value meaning "no loss here" (the Hugging Face / PyTorch convention)."""

FORMATS = ("messages", "sharegpt", "alpaca", "prompt_completion", "text")
ROLES = ("system", "user", "assistant", "tool")
LOSS_POLICIES = ("auto", "assistant", "last_assistant", "all", "completion")


@dataclass(frozen=True, slots=True)
class SourceRef:
    """Where a record came from: the input path as given and its 1-based line (or row)."""

    source: str
    line: int

    def __str__(self) -> str:
        return f"{self.source}:{self.line}"


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


@dataclass(frozen=True, slots=True)
class Message:
    """One chat turn.  ``role`` is one of :data:`ROLES`; ``content`` is plain text (data).

    ``extra`` holds the turn's other fields as ``(key, value)`` pairs, in record order
    (``tool_calls``, ``tool_call_id``, ``name`` …); the template sees them beside ``role`` and
    ``content``, as ``transformers`` shows a message dict.  Values may be lists or dicts, so a
    message is not hashable when it has them.
    """

    role: str
    content: str
    extra: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Conversation:
    """A normalized record, ready to be rendered.

    Exactly one shape is used:

    * chat: ``messages`` (rendered through the chat template); ``completion_start`` is the
      index of the first message that belongs to a prompt/completion record's completion;
    * plain prompt/completion: ``prompt`` and ``completion`` strings (no template);
    * plain text: ``text`` (no template, every token a target).
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

    @property
    def is_chat(self) -> bool:
        """True when the record goes through the chat template."""
        return self.text is None and self.prompt is None


@dataclass(frozen=True, slots=True)
class Reject:
    """A record that was not packed: rejected at ingest or dropped by a policy."""

    ref: SourceRef
    domain: str
    code: str
    reason: str

    def to_json(self) -> str:
        """Return the ``rejects.jsonl`` line for this record (no trailing newline)."""
        return json.dumps(
            {
                "source": self.ref.source,
                "line": self.ref.line,
                "domain": self.domain,
                "code": self.code,
                "reason": self.reason,
            },
            ensure_ascii=False,
            sort_keys=True,
        )


@dataclass(frozen=True, slots=True)
class TokenizedBatch:
    """Tokenized examples in columnar form.

    Example ``i`` owns ``input_ids[offsets[i]:offsets[i+1]]`` and the same slice of
    ``labels`` (unshifted; ``IGNORE_INDEX`` where no loss).  ``refs`` and ``domains`` hold
    one entry per example.
    """

    input_ids: np.ndarray  # int32, flat
    labels: np.ndarray  # int32, flat
    offsets: np.ndarray  # int64, len == n + 1
    refs: tuple[SourceRef, ...]
    domains: tuple[str, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.refs)

    @property
    def lengths(self) -> np.ndarray:
        """Token count of each example (int64)."""
        return np.diff(self.offsets)

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Return example ``i``'s ``(input_ids, labels)`` views."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.input_ids[lo:hi], self.labels[lo:hi]


@dataclass(frozen=True, slots=True)
class PackedRow:
    """One packed row as stored in a shard (the contract's per-row columns).

    ``cu_seqlens`` is ``[0, end_1, …, num_tokens]``; segment ``j`` spans
    ``cu_seqlens[j]:cu_seqlens[j+1]`` and belongs to ``example_ids[j]``.
    """

    input_ids: np.ndarray  # int32 [num_tokens]
    labels: np.ndarray  # int32 [num_tokens]
    position_ids: np.ndarray  # int32 [num_tokens]
    cu_seqlens: np.ndarray  # int32 [num_segments + 1]
    example_ids: np.ndarray  # int64 [num_segments]

    @property
    def num_tokens(self) -> int:
        """Number of tokens in the row."""
        return int(self.input_ids.shape[0])

    @property
    def num_segments(self) -> int:
        """Number of segments (examples or example parts) in the row."""
        return int(self.cu_seqlens.shape[0]) - 1
