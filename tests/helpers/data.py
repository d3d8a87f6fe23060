"""In-memory values: spills, conversations, rendered spans, a small profile, JSONL files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from packshard.ingest.types import Conversation, Message, Rendered
from packshard.pack.spill import Spill, SpillCounts
from packshard.records import IGNORE_INDEX, SourceRef

# --- in-memory data ----------------------------------------------------------------------------


def make_spill(labels: list[list[int]]) -> Spill:
    """An in-memory spill whose example i has tokens 100*i + k and the given labels."""
    n = len(labels)
    lengths = [len(lab) for lab in labels]
    tokens = np.concatenate([[], *(100 * i + np.arange(k) for i, k in enumerate(lengths))])
    flat = np.array([v for lab in labels for v in lab], dtype=np.int32)
    trained = [sum(v != IGNORE_INDEX for v in lab[1:]) for lab in labels]
    zeros = np.zeros(n, dtype=np.int32)
    return Spill(
        tokens=tokens.astype(np.int32),
        labels=flat,
        offsets=np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
        loss_tokens=np.array(trained, dtype=np.int32),
        source_index=zeros,
        lines=np.arange(1, n + 1, dtype=np.int64),
        parts=zeros,
        starts=np.zeros(n, dtype=np.int64),
        domain_codes=zeros,
        truncated=np.zeros(n, dtype=bool),
        record_ids=np.arange(n, dtype=np.int64),
        format_codes=np.zeros(n, dtype=np.int8),
        counts=SpillCounts(
            sources=("mem.jsonl",),
            domains=("mem",),
            formats=("text",),
            records_per_source=(n,),
            records_per_domain=(n,),
            tokens_in_per_domain=(sum(lengths),),
        ),
    )


CHAT_REF = SourceRef("chat.jsonl", 7)


def conversation(
    *turns: tuple[str, str], fmt: str = "messages", start: int | None = None, tools: Any = None
) -> Conversation:
    """A chat :class:`Conversation` at :data:`CHAT_REF` from ``(role, content)`` turns."""
    msgs = tuple(Message(role, content) for role, content in turns)
    return Conversation(CHAT_REF, "d", fmt, msgs, tools, start)


def span_texts(rendered: Rendered) -> list[str]:
    """The text of each trained span of a rendered example."""
    return [rendered.text[a:b] for a, b in rendered.spans]


def small_profile() -> Any:
    """A hand-checkable profile: chat [5 2 1], code [12 3], "<script>" only rejects; L = 8."""
    from packshard.profile import profile_lengths

    lengths = np.array([5, 12, 2, 3, 1])
    codes = np.array([0, 1, 0, 1, 0])
    loss = np.array([2, 6, 1, 1, 0])
    return profile_lengths(
        lengths, loss, codes, ["chat", "code"], {"<script>": 2, "chat": 1}, 8, batch_size=3
    )


def write_jsonl(path: Path, records: list[Any]) -> Path:
    """Write one JSON value per line (strings are written verbatim, for broken lines)."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path
