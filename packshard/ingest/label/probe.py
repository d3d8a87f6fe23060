r"""Tier 3 (:mod:`~packshard.ingest.label.tiers`), the probe: where each assistant piece lands.

The conversation is rendered once more with the *core* of every assistant piece (its text
without the surrounding whitespace: reasoning, answer, tool-call names) replaced by a
stand-in ``\ue000<n>\ue001``.  Whitespace, markers and emptiness are kept, so the template
makes the same choices (trims, splits on ``</think>``, drops history reasoning), and the
probe with each stand-in put back must give the text exactly — then each stand-in's place is
its piece's place, and a stand-in missing from the probe is a piece the template dropped::

    probe   <|im_start|>assistant\n<think>\n\ue0000\ue001\n</think>\n\n\ue0001\ue001<|im_end|>
    text    <|im_start|>assistant\n<think>\nAdd.\n</think>\n\nIt is 4.<|im_end|>

A first probe also stands in for empty contents; where that changes the render, a second one
leaves them alone.
"""

from __future__ import annotations

import re
from typing import Any

from packshard.errors import TemplateError
from packshard.ingest.label.chat import Chat, calls_tools, split_inline
from packshard.ingest.template.render import render_chat
from packshard.ingest.types import Markers

Anchors = dict[int, list[tuple[int, int, str]]]  # message: (lo, hi, kind r|c|n), in order


class _Probe:
    """Stand-ins for the pieces of assistant messages, and what each stands for."""

    def __init__(self, left: str, right: str, empty_too: bool) -> None:
        self.left, self.right, self.empty_too = left, right, empty_too
        self.pieces: list[tuple[int, str, str]] = []  # message, kind, text it stands for

    def stand(self, value: str, i: int, kind: str, blank: bool = False) -> str:
        """Return ``value`` with its core replaced by a stand-in (a blank one only if asked)."""
        core = value.strip()
        lead = value[: len(value) - len(value.lstrip())]
        trail = value[len(lead) + len(core) :]
        if not core and not blank:
            return value
        self.pieces.append((i, kind, core or value))
        mark = f"{self.left}{len(self.pieces) - 1}{self.right}"
        return f"{lead}{mark}{trail}" if core else mark

    def message(
        self, m: dict[str, Any], i: int, markers: Markers, inline_closing: bool, field: str | None
    ) -> dict[str, Any]:
        """Return assistant message ``m`` with stand-ins for its pieces."""
        m = dict(m)
        if field and isinstance(m.get(field), str):
            m[field] = self.stand(m[field], i, "r")
        content = m["content"]
        inline = split_inline(content, markers, inline_closing)
        if inline is not None:
            head = content[: len(content) - len(inline[1]) - len(markers[1])]
            split = len(head) - len(inline[0])
            reasoning = self.stand(inline[0], i, "r")
            m["content"] = head[:split] + reasoning + markers[1] + self.stand(inline[1], i, "c")
        else:
            m["content"] = self.stand(content, i, "c", self.empty_too and not calls_tools(m))
        if calls_tools(m):
            m["tool_calls"] = [_named(call, self, i) for call in m["tool_calls"]]
        return m


def probe_anchors(chat: Chat, closing_only: bool, field: str | None) -> Anchors | None:
    """Return the anchors of a probe render (see the module notes); ``None`` if none agrees.

    ``closing_only`` and ``field`` are the template's
    (:func:`~packshard.ingest.label.reasoning.splits_inline`,
    :func:`~packshard.ingest.label.reasoning.reasoning_field`).
    """
    text, markers = chat.text, chat.markers
    free = [c for c in "\ue000\ue001\ue002\ue003\ue004\ue005" if c not in text]
    if len(free) < 2:
        return None
    for empty_too in (True, False):
        probe = _Probe(free[0], free[1], empty_too)
        shown = [
            probe.message(m, i, markers, closing_only, field) if m["role"] == "assistant" else m
            for i, m in enumerate(chat.messages)
        ]
        try:
            variables = chat.bundle.special_tokens_map
            rendered, _ = render_chat(chat.template, shown, chat.tools, variables)
        except TemplateError:
            continue
        if (found := _put_back(rendered, text, probe)) is not None:
            return found
    return None


def _named(call: Any, probe: _Probe, i: int) -> Any:
    """Return a tool call with a stand-in for its function's name."""
    if not isinstance(call, dict):
        return call
    function = call.get("function")
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        return {**call, "function": {**function, "name": probe.stand(function["name"], i, "n")}}
    if isinstance(call.get("name"), str):
        return {**call, "name": probe.stand(call["name"], i, "n")}
    return call


def _put_back(rendered: str, text: str, probe: _Probe) -> Anchors | None:
    """Put each piece back in the probe; its places, or ``None`` unless that gives ``text``."""
    chunks, at, shift = [], 0, 0
    found: Anchors = {}
    seen = set()
    for match in re.finditer(f"{probe.left}([0-9]+){probe.right}", rendered):
        n = int(match.group(1))
        if n >= len(probe.pieces) or n in seen:
            return None
        seen.add(n)
        i, kind, value = probe.pieces[n]
        lo = match.start() + shift
        chunks += [rendered[at : match.start()], value]
        at = match.end()
        shift += len(value) - len(match.group())
        found.setdefault(i, []).append((lo, lo + len(value), kind))
    chunks.append(rendered[at:])
    if "".join(chunks) != text:
        return None
    return {i: sorted(p) for i, p in found.items()}
