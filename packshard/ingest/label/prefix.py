r"""Tier 4 (:mod:`~packshard.ingest.label.tiers`), prefix: a turn is what rendering it adds.

The last tier, for the turns the search and the probe could not place (a template that
rewrites what the stand-ins stand for, a content found twice).  Two renders per turn: the
conversation before it, with the generation prompt for an assistant turn, and the
conversation through it.  The first must be a prefix of the text (less the EOS a template
ends a conversation with); the turn starts where it ends, after the generation prompt, and
runs to where the second parts from the text, never inside a special token::

    before     <|user|>\nWeather?<|end|>\n<|assistant|>\n
    through    <|user|>\nWeather?<|end|>\n<|assistant|>\n{"city": "Paris"}<|end|>\n<|endoftext|>
    text       <|user|>\nWeather?<|end|>\n<|assistant|>\n{"city": "Paris"}<|end|>\n<|user|>\n…
    turn                                                 [-----------------------)

It ends through the first end marker of the special tokens and whitespace it ends with;
one that ends in none must be all of the second render.  A template that renders a turn
otherwise when it is the last (Qwen3's empty reasoning block, missing from a turn in the
history) is read on: through the message after it, to the first end marker after its
content.  A message with no header before it (another role, a template that ignores the
generation prompt) starts at its content, which must be in the turn; one with neither is
left unplaced.
"""

from __future__ import annotations

from packshard.errors import TemplateError
from packshard.ingest.label.chat import Chat, Frame, calls_tools, common_length
from packshard.ingest.template.render import render_chat


def prefix_turn(chat: Chat, i: int, frame: Frame) -> tuple[int, int, int] | None:
    """Place message ``i`` by prefix renders: ``(head, lo, hi)`` as in a turn, or ``None``.

    ``frame`` is the template's (:func:`~packshard.ingest.label.frame.template_frame`).
    """
    message, text = chat.messages[i], chat.text
    header = frame.header if message["role"] == "assistant" else ""
    variables = chat.bundle.special_tokens_map
    try:
        before, _ = render_chat(
            chat.template, chat.messages[:i], chat.tools, variables, bool(header)
        )
        through, _ = render_chat(chat.template, chat.messages[: i + 1], chat.tools, variables)
    except TemplateError:
        return None
    if not text.startswith(before) and (eos := frame.final.search(before)) is not None:
        before = before[: eos.start()]
    if not text.startswith(before):
        return None
    start, end = len(before), common_length(text, through, frame.specials)
    content = message["content"] if isinstance(message["content"], str) else ""
    needle = content.rsplit(chat.markers[1], 1)[-1].strip()
    body, hi = _body_end(chat.text, frame, start, end)
    if hi is None and end < len(through):  # no end marker, and not all of ``through``
        if not header or (hi := _read_on(chat, frame, i, start, needle)) is None:
            return None
    hi = body if hi is None else hi
    if header:
        lo = start
        head = lo - len(header) if text.startswith(header, lo - len(header)) else lo
    elif needle:
        head = lo = text.rfind(needle, start, body)
    else:
        head = lo = -1 if calls_tools(message) else body
    if lo < 0 or hi <= lo or (needle and needle not in text[lo:hi]):
        return None  # no header and no content to start at, or the template rewrites it
    return head, lo, hi


def _read_on(chat: Chat, frame: Frame, i: int, start: int, needle: str) -> int | None:
    """Where turn ``i`` ends, read from the conversation through the message after it.

    For a template that renders a turn otherwise once a message follows it (Qwen3 gives the
    last turn an empty reasoning block, not a turn in the history): the turn ends with the
    first end marker after its content.
    """
    if i + 2 > len(chat.messages):
        return None
    try:
        through, _ = render_chat(
            chat.template, chat.messages[: i + 2], chat.tools, chat.bundle.special_tokens_map
        )
    except TemplateError:
        return None
    text, end = chat.text, common_length(chat.text, through, frame.specials)
    at = text.find(needle, start, end) + len(needle) if needle else start
    closer = frame.closers.search(text, at, end) if at >= len(needle) else None
    return closer.end() if closer is not None else None


def _body_end(text: str, frame: Frame, start: int, end: int) -> tuple[int, int | None]:
    """Return where the turn's trailing end markers start, and where the first of them ends.

    The turn ``text[start:end]`` may end in end markers and whitespace (``<|end|>\n`` and a
    final ``<|endoftext|>``): the turn runs through the first of them (``None``: there is none).
    """
    closers = frame.closers
    body, first = end, None
    while True:
        body = start + len(text[start:body].rstrip())
        for k in range(body - 1, max(start, body - 64) - 1, -1):
            if (m := closers.match(text, k, body)) is not None and m.end() == body:
                body, first = k, body
                break
        else:
            return body, first
