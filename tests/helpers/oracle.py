"""Where each message's content sits: an oracle independent of the labelling tiers."""

from __future__ import annotations

import re
from typing import Any

# --- where each message's content sits: an oracle independent of the labelling tiers ---------


def content_places(template: Any, text: str, messages: list, tools: Any, variables: dict) -> dict:
    """Where each message's content sits in ``text``: ``{index: (lo, hi)}``.

    The conversation is rendered once more with every content replaced by a stand-in
    (``\ue000<i>\ue001``); each stand-in's place, shifted by the length differences before
    it, is the content's place.  When that does not give the text, contents are searched for
    in order (exact, then stripped); a message not found is left out.
    """
    from packshard.errors import TemplateError
    from packshard.ingest.template.render import render_chat

    probe = [
        m if m.get("tool_calls") and not m["content"] else {**m, "content": f"\ue000{i}\ue001"}
        for i, m in enumerate(messages)
    ]
    found: dict[int, tuple[int, int]] = {}
    try:
        probe_text, _ = render_chat(template, probe, tools, variables)
    except TemplateError:
        probe_text = None
    shift = 0
    for match in re.finditer("\ue000([0-9]+)\ue001", probe_text or ""):
        i = int(match.group(1))
        content = messages[i]["content"] if i < len(messages) else None
        lo = match.start() + shift
        if content is None or i in found or text[lo : lo + len(content)] != content:
            probe_text, found = None, {}
            break
        found[i] = (lo, lo + len(content))
        shift += len(content) - len(match.group())
    if probe_text is not None:
        return found
    pos = 0
    for i, message in enumerate(messages):
        for needle in (message["content"], message["content"].strip()):
            if needle and (lo := text.find(needle, pos)) >= 0:
                found[i] = (lo, lo + len(needle))
                pos = lo + len(needle)
                break
    return found
