"""The values that cross stages: a record's place, a reject, a packed row, ``IGNORE_INDEX``.

Ingest, pack, verify, the reader and the exporters all speak of records by
:class:`SourceRef` (``file:line``) and of unusable ones as :class:`Reject` values, each with a
registered ``code`` (:data:`packshard.errors.REJECT_CODES`); a shard row is a
:class:`PackedRow`.  The values only ingest makes are in :mod:`packshard.ingest.types`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packshard.errors import REJECT_CODES

IGNORE_INDEX = -100
"""Label value meaning "no loss here" (the Hugging Face / PyTorch convention)."""


@dataclass(frozen=True, slots=True)
class SourceRef:
    """Where a record came from: the input path as given and its 1-based line (or row)."""

    source: str
    line: int

    def __str__(self) -> str:
        return f"{self.source}:{self.line}"


@dataclass(frozen=True, slots=True)
class Reject:
    """A record that was not packed: rejected at ingest or dropped by a policy.

    ``code`` is registered in :data:`packshard.errors.REJECT_CODES`, which also says whether it
    is a rejection (bad input) or a drop (a policy).
    """

    ref: SourceRef
    domain: str
    code: str
    reason: str

    def __post_init__(self) -> None:
        assert self.code in REJECT_CODES, f"unregistered reject code {self.code!r}"

    @property
    def kind(self) -> str:
        """``rejected`` or ``dropped``, from the code's registry entry."""
        return REJECT_CODES[self.code].kind


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
