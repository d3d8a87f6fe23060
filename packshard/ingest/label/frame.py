r"""The conversation being labelled, and what its template renders around every turn.

:class:`Chat` is one rendered conversation with its record's choices.  Around every turn:
the assistant header and the end markers.

**Header**: what ``add_generation_prompt`` adds after a user turn — what the model is
prompted with at inference, so never trained — cut before a reasoning marker it may hold.
It is found once per template, by rendering one user message with and without the prompt
and keeping what the prompted render adds (never cutting a special token in two)::

    without   <|user|>\n\ue010\ue011<|end|>\n<|endoftext|>
    with      <|user|>\n\ue010\ue011<|end|>\n<|assistant|>\n
    header                           <|assistant|>\n

A template that ignores ``add_generation_prompt`` has no header; its turns then start where
their first piece does.  **End markers**: the tokenizer's special tokens and EOS, except
those the header holds (openers such as ``<|im_start|>``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from packshard.errors import TemplateError
from packshard.ingest.label.reasoning import Markers, reasoning_field, splits_inline
from packshard.ingest.template.render import ChatTemplate, render_chat
from packshard.ingest.tokens.tokenizer import TokenizerBundle
from packshard.ingest.types import IngestOptions
from packshard.records import SourceRef, quick

_PROBE_USER = "\ue010\ue011"


@dataclass(frozen=True)
class Frame:
    """What a template renders around turns: the assistant header and the end markers."""

    header: str
    closers: re.Pattern[str]
    final: re.Pattern[str]  # the EOS that ends the text, with whitespace around it
    specials: tuple[str, ...]  # the tokenizer's special tokens and EOS
    opening: str = ""  # the reasoning marker a turn without a header may start with


@quick
@dataclass(frozen=True, slots=True)
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


_FRAMES: dict[tuple[Any, ...], Frame] = {}
_LAST: list[Any] = [None, None, None, None]  # the last (template, bundle, markers, frame)


def template_frame(template: ChatTemplate, bundle: TokenizerBundle, markers: Markers) -> Frame:
    """Return (and cache) the header and end markers of ``template`` with ``bundle``."""
    last = _LAST
    if last[0] is template and last[1] is bundle and last[2] == markers:
        cached: Frame = last[3]
        return cached
    variables = bundle.special_tokens_map
    specials = tuple(s for s in (*bundle.special_tokens, bundle.eos_token or "") if s)
    key = (template.sha256, template.source, tuple(sorted(variables.items())), specials, markers)
    if (frame := _FRAMES.get(key)) is None:
        header = _header(template, variables, specials, markers[0])
        if len(_FRAMES) > 64:
            _FRAMES.clear()
        closers = sorted({s for s in specials if s not in header}, key=lambda s: (-len(s), s))
        alternatives = "|".join(re.escape(s) for s in closers) or "(?!)"
        eos = bundle.eos_token
        final = re.compile(rf"\s*{re.escape(eos)}\s*\Z" if eos else "(?!)")
        frame = _FRAMES[key] = Frame(header, re.compile(alternatives), final, specials, markers[0])
    last[:] = [template, bundle, markers, frame]
    return frame


def _header(
    template: ChatTemplate, variables: dict[str, str], specials: tuple, opening: str
) -> str:
    user = [{"role": "user", "content": _PROBE_USER}]
    try:
        prompted, _ = render_chat(template, user, None, variables, add_generation_prompt=True)
        plain, _ = render_chat(template, user, None, variables)
    except TemplateError:
        return ""
    i, j = prompted.rfind(_PROBE_USER), plain.rfind(_PROBE_USER)
    if i < 0 or j < 0:
        return ""
    after, before = prompted[i + len(_PROBE_USER) :], plain[j + len(_PROBE_USER) :]
    header = after[common_length(after, before, specials) :]
    if opening in header:
        header = header[: header.index(opening)]
    return header if header.strip() else ""


def common_length(text: str, other: str, specials: Iterable[str]) -> int:
    """How far ``text`` and ``other`` agree, moved back out of any special token of ``text``."""
    k = len(os.path.commonprefix([text, other]))  # noqa: RUF071 (characters, not paths)
    for s in specials:  # never cut inside one (<|end|>\n<|assistant|> vs <|endof…)
        if 0 <= (at := text.find(s, max(0, k - len(s) + 1))) < k:  # the first k can cut
            k = at
    return k
