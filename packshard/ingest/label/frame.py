r"""What a template renders around every turn: the assistant header and the end markers.

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

One cache holds each template's frame, keyed by the template and tokenizer objects a process
loaded (their identities) and the reasoning markers: a record asks for it in one dict lookup.
"""

from __future__ import annotations

import re

from packshard.errors import TemplateError
from packshard.ingest.label.chat import Chat, Frame, common_length
from packshard.ingest.template.render import ChatTemplate, render_chat
from packshard.ingest.tokens.tokenizer import TokenizerBundle
from packshard.ingest.types import Markers

_PROBE_USER = "\ue010\ue011"


_FRAMES: dict[tuple[int, int, Markers], tuple[ChatTemplate, TokenizerBundle, Frame]] = {}
"""The one cache: (template, tokenizer, markers) -> frame; the objects kept, so ids stay theirs."""


def template_frame(template: ChatTemplate, bundle: TokenizerBundle, markers: Markers) -> Frame:
    """Return (and cache) the header and end markers of ``template`` with ``bundle``."""
    key = (id(template), id(bundle), markers)
    if (hit := _FRAMES.get(key)) is not None:
        return hit[2]
    variables = bundle.special_tokens_map
    specials = tuple(s for s in (*bundle.special_tokens, bundle.eos_token or "") if s)
    header = _header(template, variables, specials, markers[0])
    closers = sorted({s for s in specials if s not in header}, key=lambda s: (-len(s), s))
    alternatives = "|".join(re.escape(s) for s in closers) or "(?!)"
    eos = bundle.eos_token
    final = re.compile(rf"\s*{re.escape(eos)}\s*\Z" if eos else "(?!)")
    frame = Frame(header, re.compile(alternatives), final, specials, markers[0])
    if len(_FRAMES) > 64:
        _FRAMES.clear()
    _FRAMES[key] = (template, bundle, frame)
    return frame


def chat_frame(chat: Chat) -> Frame:
    """Return the header and end markers of ``chat``'s template (cached per template)."""
    return template_frame(chat.template, chat.bundle, chat.markers)


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
