r"""Where each message sits in a rendered conversation, for templates without generation tags.

The trained characters of an assistant turn start where its content starts.  A content that
occurs exactly once in the text is found by search.  Otherwise the conversation is rendered
once more with every content replaced by a stand-in (``\ue000<i>\ue001``): the template text
around the stand-ins is the same as around the real contents, so each stand-in's place, shifted
by the length differences before it, is the content's place (:func:`locate_contents`).  A
tool-calling turn, whose content is not all the model writes, is placed as a whole: what
rendering ``messages[:i + 1]`` adds to rendering ``messages[:i]`` (:func:`locate_turn`).
"""

from __future__ import annotations

import re
from typing import Any

from packshard.errors import TemplateError
from packshard.ingest.template.render import ChatTemplate, render_chat


def search_contents(text: str, messages: list[dict[str, Any]]) -> dict[int, tuple[int, int]]:
    """Find each message's content in ``text`` by search, in order: ``{index: (lo, hi)}``.

    The fallback of :func:`locate_contents`.  A message not found (a template may drop roles
    it does not know) is left out and does not move the cursor; stripped content is tried
    when the exact content is missing.
    """
    found: dict[int, tuple[int, int]] = {}
    pos = 0
    for i, message in enumerate(messages):
        content = message["content"]
        for needle in (content, content.strip()):
            if needle and (lo := text.find(needle, pos)) >= 0:
                found[i] = (lo, lo + len(needle))
                pos = lo + len(needle)
                break
    return found


_STAND_IN = re.compile("\ue000([0-9]+)\ue001")


def locate_contents(
    template: ChatTemplate,
    text: str,
    messages: list[dict[str, Any]],
    tools: list[Any] | None,
    variables: dict[str, Any],
) -> dict[int, tuple[int, int]]:
    """Find where each message's content sits in ``text``: ``{index: (lo, hi)}``.

    The conversation is rendered once more with every content replaced by a stand-in
    (``\ue000<i>\ue001``).  The template text around the stand-ins is the same as around the
    real contents, so each stand-in's place, shifted by the length differences before it,
    is the content's place — even for an empty content, or one that also occurs in a role
    header (``a`` in ``assistant``).  When the template rewrites content, renders it twice
    or fails on the stand-ins, the contents are searched for instead.
    """
    probe = [
        m if calls_tools(m) and not m["content"] else {**m, "content": f"\ue000{i}\ue001"}
        for i, m in enumerate(messages)
    ]
    try:
        probe_text, _ = render_chat(template, probe, tools, variables)
    except TemplateError:
        return search_contents(text, messages)
    found: dict[int, tuple[int, int]] = {}
    shift = 0
    for match in _STAND_IN.finditer(probe_text):
        i = int(match.group(1))
        content = messages[i]["content"] if i < len(messages) else None
        lo = match.start() + shift
        if content is None or i in found or text[lo : lo + len(content)] != content:
            return search_contents(text, messages)
        found[i] = (lo, lo + len(content))
        shift += len(content) - len(match.group())
    return found


def calls_tools(message: dict[str, Any]) -> bool:
    """Tell whether a message dict calls tools (its turn is placed whole, not by content)."""
    return bool(message.get("tool_calls"))


def locate_turn(
    template: ChatTemplate,
    text: str,
    messages: list[dict[str, Any]],
    i: int,
    tools: list[Any] | None,
    variables: dict[str, Any],
) -> tuple[int, int] | None:
    r"""Place all that message ``i`` renders after its role header: ``(lo, hi)``, or ``None``.

        For a turn whose content is not all the model writes (tool calls, rendered from message
        fields, often with no content at all).  The turn is what rendering ``messages[:i + 1]``
        adds to rendering ``messages[:i]``, both prefixes of ``text``; trailing whitespace is left
        out, the closing marker kept.  Its header ends where a plain assistant message in its
        place would start its content (a stand-in says where), or earlier where the two renders
        part::

            before   <|im_start|>user
    Weather?<|im_end|>

            turn     <|im_start|>assistant
    <tool_call>{...}</tool_call><|im_end|>

                                              [--------------------------------)
    """
    try:
        before, _ = render_chat(template, messages[:i], tools, variables)
        upto, _ = render_chat(template, messages[: i + 1], tools, variables)
        plain = [*messages[:i], {"role": messages[i]["role"], "content": "\ue000\ue001"}]
        probe, _ = render_chat(template, plain, tools, variables)
    except TemplateError:
        return None
    if not (upto.startswith(before) and text.startswith(upto)):
        return None
    head = probe.find("\ue000\ue001", len(before))
    if head < 0:
        return None
    parted = len(before)
    while parted < min(head, len(upto)) and probe[parted] == upto[parted]:
        parted += 1
    lo, hi = parted, len(upto.rstrip())
    return (lo, hi) if hi > lo else None
