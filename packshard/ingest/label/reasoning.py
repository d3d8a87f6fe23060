r"""Reasoning blocks: what the template is given, and where the rendered blocks are.

An assistant message's reasoning comes from a field (``Message.reasoning``, see
:mod:`packshard.ingest.fields`) or inline, as a block at the start of its content::

    <think>\nFirst add 2 and 2.\n</think>\n\nIt is 4.
    [open ][ reasoning           ][close ]  [answer]

The markers are ``--reasoning-markers`` (default ``<think>,</think>``).  A closing marker with
no opening one (what a model prompted with ``<think>\n`` writes) counts as inline reasoning
only for a template that splits content on that marker itself (DeepSeek-R1, Qwen3).

What the template is given (:func:`template_messages`), per ``--reasoning``:

* ``train`` / ``mask``: the message as the record has it, the field under the name the
  template reads (``reasoning_content``, ``thinking`` or ``reasoning``: whichever its source
  mentions first in that order); a template that reads none gets the reasoning inline, in
  the markers, before the content; inline blocks stay where they are;
* ``drop``: no reasoning field, and the inline block cut from the content.

Ambiguous reasoning is rejected (``invalid_reasoning``): a field together with an inline
block, reasoning that holds the closing marker, an answer that opens a block it never closes,
or, under ``mask`` and ``drop``, a closing marker alone that the template does not split on.
Which tokens are reasoning is decided on the rendered text: the block a rendered assistant
turn starts with (:func:`find_block`), so a template that injects or drops one is seen.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from jinja2 import nodes

from packshard.errors import RecordError
from packshard.ingest.fields import REASONING_FIELDS
from packshard.ingest.label.chat import Chat, split_inline
from packshard.ingest.template.sandbox import ChatTemplate, make_environment
from packshard.ingest.types import Markers, Message


@lru_cache(maxsize=32)
def _template_reads(text: str) -> tuple[str | None, frozenset[str]]:
    """Return the reasoning field a template reads, and the string constants it uses."""
    try:
        tree = make_environment().parse(text)
    except Exception:  # compile_template already reported it; nothing is read then
        return None, frozenset()
    names = {n.attr for n in tree.find_all(nodes.Getattr)}
    names |= {n.arg.value for n in tree.find_all(nodes.Getitem) if isinstance(n.arg, nodes.Const)}
    consts = frozenset(n.value for n in tree.find_all(nodes.Const) if isinstance(n.value, str))
    field = next((f for f in REASONING_FIELDS if f in names), None)
    return field, consts


def reasoning_field(template: ChatTemplate) -> str | None:
    """Return the message field ``template`` reads reasoning from (``None``: none)."""
    return _template_reads(template.text)[0]


def splits_inline(template: ChatTemplate, markers: Markers) -> bool:
    """Tell whether ``template`` itself looks for the closing marker in a message's content."""
    return _splits(template.text, markers[1])


@lru_cache(maxsize=32)
def _splits(text: str, closing: str) -> bool:
    return any(closing in c for c in _template_reads(text)[1])


def chat_field(chat: Chat) -> str | None:
    """Return the field ``chat``'s template reads reasoning from (when there is reasoning)."""
    return reasoning_field(chat.template) if chat.reasoning else None


def chat_closing_only(chat: Chat) -> bool:
    """Tell whether ``chat``'s template splits content on the closing marker itself."""
    return splits_inline(chat.template, chat.markers) if chat.reasoning else False


def template_content(m: Message) -> Any:
    """Return what the template sees as a message's content: its text, or its parts in order.

    An image part is ``{"type": "image", "image": path}``, a text part ``{"type": "text",
    "text": …}``: the form transformers' processors give a chat template.
    """
    if m.parts is None:
        return m.content
    return [
        {"type": "image", "image": value} if kind == "image" else {"type": "text", "text": value}
        for kind, value in m.parts
    ]


def template_messages(
    messages: tuple[Message, ...],
    template: ChatTemplate,
    policy: str,
    markers: Markers,
    where: Any,
) -> tuple[list[dict[str, Any]], list[bool]]:
    """Return the message dicts ``template`` renders, and which assistant turns hold reasoning.

    ``where`` is the record's :class:`~packshard.records.SourceRef` (for rejects).
    """
    opening, closing = markers
    for i, m in enumerate(messages):
        if m.role == "assistant" and _unclosed(m.content, markers):
            why = f"opens a reasoning block with {opening!r} but never closes it with {closing!r}"
            raise _ambiguous(where, i, f"{why} (close it, or cut it)")
    if all(m.reasoning is None and closing not in m.content for m in messages):
        plain = [
            {"role": m.role, "content": template_content(m), **dict(m.extra)}
            if m.extra
            else {"role": m.role, "content": template_content(m)}
            for m in messages
        ]
        return plain, [False] * len(messages)
    field = reasoning_field(template)
    closing_only = splits_inline(template, markers)
    out: list[dict[str, Any]] = []
    has: list[bool] = []
    for i, m in enumerate(messages):
        d = {"role": m.role, "content": template_content(m), **dict(m.extra)}
        inline = split_inline(m.content, markers, closing_only) if m.role == "assistant" else None
        reasoning = m.reasoning if inline is None else inline[0]
        if m.reasoning is not None and inline is not None:
            raise _ambiguous(where, i, "has a reasoning field and an inline block (keep one)")
        if reasoning is not None and markers[1] in reasoning:
            raise _ambiguous(where, i, f"reasoning holds the closing marker {markers[1]!r}")
        if inline is not None and markers[1] in inline[1]:
            raise _ambiguous(where, i, f"content holds {markers[1]!r} after its inline block")
        if inline is None and policy != "train" and _stray(m, markers):
            raise _ambiguous(
                where,
                i,
                f"holds {closing!r} with no {opening!r} before it: under --reasoning {policy} "
                f"its reasoning cannot be told from its answer (open the block with {opening!r}, "
                "or cut the marker)",
            )
        has.append(bool(reasoning and reasoning.strip()) and policy != "drop")
        if policy == "drop":
            if inline is not None:
                d["content"] = inline[1].lstrip()
        elif m.reasoning is not None:
            if field is not None:
                d[field] = m.reasoning
            else:
                d["content"] = f"{markers[0]}\n{m.reasoning}\n{markers[1]}\n\n{m.content}"
        out.append(d)
    return out, has


def _stray(m: Message, markers: Markers) -> bool:
    """Whether an assistant turn holds the closing marker with no opening one before it."""
    at = m.content.find(markers[1])
    return m.role == "assistant" and at >= 0 and markers[0] not in m.content[:at]


def _unclosed(content: str, markers: Markers) -> bool:
    """Whether ``content`` starts with the opening marker and never holds the closing one."""
    opening = markers[0]
    return opening in content and content.lstrip().startswith(opening) and markers[1] not in content


def _ambiguous(where: Any, i: int, why: str) -> RecordError:
    source, line = (where.source, where.line) if where is not None else ("<unknown>", 0)
    return RecordError("invalid_reasoning", f"message {i + 1} (assistant) {why}", source, line)


_SPACE = re.compile(r"\s*")
r"""Whitespace as ``str.isspace`` has it (``\s`` of a str pattern), matched without a copy."""


def find_block(text: str, lo: int, hi: int, markers: Markers) -> tuple[int, int, bool] | None:
    """Find the reasoning block a turn body ``text[lo:hi]`` starts with.

    Returns ``(start, end, empty)``: the block from its opening marker through its closing
    marker and the whitespace after it, and whether it holds only whitespace; ``None`` when
    the body does not start (after whitespace) with a complete block.
    """
    opening, closing = markers
    start = _SPACE.match(text, lo, hi).end()  # type: ignore[union-attr]
    if not text.startswith(opening, start):
        return None
    close = text.find(closing, start + len(opening), hi)
    if close < 0:
        return None
    end = _SPACE.match(text, close + len(closing), hi).end()  # type: ignore[union-attr]
    return start, end, not text[start + len(opening) : close].strip()
