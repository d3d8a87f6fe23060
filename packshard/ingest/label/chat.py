"""The conversation being labelled: one render of a record with what the record asks for.

:class:`Chat` is what every labelling tier reads (:mod:`packshard.ingest.label.tiers`),
built by keyword once a record is rendered (:func:`~packshard.ingest.label.spans.render_examples`)::

    Chat(ref=…, template=…, bundle=…, text=render, blocks={% generation %} spans,
         messages=as the template saw them, tools=…, options=…, has_reasoning=per message,
         everything=--loss all)

It is a leaf of ``label/``: it imports no other labelling module.  What a tier needs of the
template beside it (header, end markers, reasoning field) comes from the template's caches
and is passed in by :mod:`~packshard.ingest.label.tiers`, never stored per record.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from packshard.ingest.template.sandbox import ChatTemplate
from packshard.ingest.tokens.tokenizer import TokenizerBundle
from packshard.ingest.types import IngestOptions, Markers
from packshard.records import SourceRef, quick


@dataclass(frozen=True)
class Frame:
    """What a template renders around turns: the assistant header and the end markers."""

    header: str
    closers: re.Pattern[str]
    final: re.Pattern[str]  # the EOS that ends the text, with whitespace around it
    specials: tuple[str, ...]  # the tokenizer's special tokens and EOS
    opening: str = ""  # the reasoning marker a turn without a header may start with


@quick
@dataclass(frozen=True, slots=True, kw_only=True)
class Chat:
    """One rendered conversation to label, and what its record asks for."""

    ref: SourceRef
    template: ChatTemplate
    bundle: TokenizerBundle
    text: str
    blocks: list[tuple[int, int]]  # the {% generation %} blocks of the render
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    options: IngestOptions
    has_reasoning: list[bool]  # per message: holds reasoning the template is given
    everything: bool = False  # --loss all

    @property
    def markers(self) -> Markers:
        """The opening and closing reasoning markers."""
        return self.options.reasoning_markers

    # plain properties: each is read once or twice per record, and functools.cached_property
    # takes a lock on first read (Python 3.11), dearer than what it would cache
    @property
    def reasoning(self) -> bool:
        """Whether any message holds reasoning the template is given."""
        return True in self.has_reasoning[: len(self.messages)]


def calls_tools(message: dict[str, Any]) -> bool:
    """Tell whether a message dict calls tools (its turn is placed whole, not by content)."""
    return bool(message.get("tool_calls"))


def common_length(text: str, other: str, specials: Iterable[str]) -> int:
    """How far ``text`` and ``other`` agree, moved back out of any special token of ``text``."""
    k = len(os.path.commonprefix([text, other]))  # noqa: RUF071 (characters, not paths)
    for s in specials:  # never cut inside one (<|end|>\n<|assistant|> vs <|endof…)
        if 0 <= (at := text.find(s, max(0, k - len(s) + 1))) < k:  # the first k can cut
            k = at
    return k


def split_inline(content: str, markers: Markers, closing_only: bool) -> tuple[str, str] | None:
    """Return ``(reasoning, answer)`` of an inline block at the start of ``content``, or None.

    ``closing_only`` also accepts a closing marker with no opening one before it.
    """
    opening, closing = markers
    end = content.find(closing)
    if end < 0:
        return None
    head = content[:end]
    stripped = head.lstrip()
    if stripped.startswith(opening):
        return stripped[len(opening) :], content[end + len(closing) :]
    if closing_only and opening not in head:
        return head, content[end + len(closing) :]
    return None
