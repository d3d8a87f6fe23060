"""The conversation being labelled: one render of a record with what the record asks for.

:class:`Chat` is what every labelling tier reads (:mod:`packshard.ingest.label.tiers`),
built by keyword once a record is rendered (:func:`~packshard.ingest.label.spans.render_examples`)::

    Chat(ref=…, template=…, bundle=…, text=render, blocks={% generation %} spans,
         messages=as the template saw them, tools=…, options=…, has_reasoning=per message,
         everything=--loss all)

Its template's header and end markers (``frame``), the field the template reads reasoning
from (``field``) and whether it splits content on the closing marker (``closing_only``) are
read from the template's caches, never stored per record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packshard.ingest.label.frame import Frame, template_frame
from packshard.ingest.label.reasoning import Markers, reasoning_field, splits_inline
from packshard.ingest.template.render import ChatTemplate
from packshard.ingest.tokens.tokenizer import TokenizerBundle
from packshard.ingest.types import IngestOptions
from packshard.records import SourceRef, quick


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

    @property
    def field(self) -> str | None:
        """The message field the template reads reasoning from (when there is reasoning)."""
        return reasoning_field(self.template) if self.reasoning else None

    @property
    def closing_only(self) -> bool:
        """Whether the template splits content on the closing marker itself."""
        return splits_inline(self.template, self.markers) if self.reasoning else False

    @property
    def frame(self) -> Frame:
        """The template's header and end markers (cached per template)."""
        return template_frame(self.template, self.bundle, self.markers)


def calls_tools(message: dict[str, Any]) -> bool:
    """Tell whether a message dict calls tools (its turn is placed whole, not by content)."""
    return bool(message.get("tool_calls"))
