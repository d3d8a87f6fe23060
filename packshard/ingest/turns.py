r"""Where each trained turn sits in a rendered conversation.

A trained turn is everything the template renders for a message after its header, through
the end marker that closes it: reasoning block, content, tool-call markup, end marker::

    <|im_start|>assistant\n<think>\nAdd.\n</think>\n\nIt is 4.<|im_end|>\n
    [header  (frame)      ][------------- the turn -----------------)

The header and the end markers come from :mod:`packshard.ingest.frame`.

**Anchors**: the places of a message's own pieces (reasoning, content, tool-call names) in
the text.  A content that occurs exactly once, in a message without reasoning or tool calls,
is found by search.  Otherwise the conversation is rendered once more, the *probe*, with the
core of every assistant piece (the text without its surrounding whitespace) replaced by a
stand-in ``\ue000<n>\ue001``; whitespace, markers and emptiness are kept, so the template
makes the same choices (trims, splits on ``</think>``, drops history reasoning) and the
probe with each stand-in put back must give the text exactly — then every stand-in's place is
its piece's place, and a stand-in missing from the probe is a piece the template dropped::

    probe   <|im_start|>assistant\n<think>\n\ue0000\ue001\n</think>\n\n\ue0001\ue001<|im_end|>
    text    <|im_start|>assistant\n<think>\nAdd.\n</think>\n\nIt is 4.<|im_end|>

A first probe also stands in for empty contents (to place an empty turn); where that changes
what the template renders, a second one leaves them alone, then the contents are searched
for, and a tool-calling turn is placed by rendering prefixes (:func:`locate_turn`).

**Span**: from the end of the last header before the first anchor (or the anchor, for a
template without a header) to the end of the first end marker after the last anchor, as
long as no other message's anchor and no header come first (else: to the last anchor).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from packshard.errors import TemplateError
from packshard.ingest.frame import Frame, template_frame
from packshard.ingest.locate import calls_tools, locate_contents, locate_turn
from packshard.ingest.reasoning import Markers, split_inline
from packshard.ingest.templates import ChatTemplate, render_chat
from packshard.ingest.tokenizer import TokenizerBundle


@dataclass(frozen=True, slots=True)
class Turn:
    """A located turn: its header starts at ``head``; ``[lo, hi)`` is what it trains."""

    index: int
    head: int
    lo: int
    hi: int
    reasoning_shown: bool  # the message's reasoning is in the text


def locate_turns(
    template: ChatTemplate,
    text: str,
    messages: list[dict[str, Any]],
    wanted: list[int],
    tools: list[Any] | None,
    bundle: TokenizerBundle,
    markers: Markers,
    closing_only: bool,
    field: str | None,
) -> dict[int, Turn]:
    """Place the turns of ``messages[i]`` for ``i`` in ``wanted``; unplaceable ones are left out."""
    frame = template_frame(template, bundle, markers)
    anchors = _searched(frame, text, messages, wanted, field, markers, closing_only)
    if anchors is None:
        anchors = _probed(template, text, messages, tools, bundle, markers, closing_only, field)
    out: dict[int, Turn] = {}
    order = sorted(anchors) if anchors is not None else []
    chosen = set(wanted)
    for n, i in enumerate(order):
        if i not in chosen or anchors is None:
            continue
        pieces = anchors[i]
        a, b = pieces[0][0], max(p[1] for p in pieces)
        prev = anchors[order[n - 1]][-1][1] if n else 0
        following = anchors[order[n + 1]][0][0] if n + 1 < len(order) else len(text)
        shown = any(p[2] == "r" for p in pieces)
        out[i] = _span(frame, text, i, a, b, prev, following, messages[i]["role"], shown)
    missing = [i for i in wanted if i not in out]
    if missing:
        out.update(_fallback(template, text, messages, missing, tools, bundle, frame))
    return out


def plain_turns(
    frame: Frame, text: str, messages: list[dict[str, Any]], wanted: list[int]
) -> list[tuple[int, int]] | None:
    """Return the spans of ``wanted`` turns if each is plain content found once, else None.

    The common case, without building a :class:`Turn`: what :func:`locate_turns` gives when
    no message carries reasoning.
    """
    found = []
    for i in wanted:
        m = messages[i]
        content = m["content"]
        if not content or m.get("tool_calls") or m["role"] != "assistant":
            return None
        if (lo := text.find(content)) < 0 or text.find(content, lo + 1) >= 0:
            return None
        found.append((lo, lo + len(content)))
    header, closers = frame.header, frame.closers
    spans = []
    for n, (a, b) in enumerate(found):
        prev = found[n - 1][1] if n else 0
        following = found[n + 1][0] if n + 1 < len(found) else len(text)
        if header and (at := text.rfind(header, prev, a)) >= 0:
            a = at + len(header)
        if (close := closers.search(text, b, following)) is not None:
            if not header or text.find(header, b, close.start()) < 0:
                b = close.end()
        spans.append((a, b))
    return spans


def _span(
    frame: Frame,
    text: str,
    i: int,
    a: int,
    b: int,
    prev: int,
    following: int,
    role: str,
    shown: bool,
) -> Turn:
    header = frame.header if role == "assistant" else ""
    head = lo = a
    if header and (at := text.rfind(header, prev, a)) >= 0:
        head, lo = at, at + len(header)
    elif not header and frame.opening and (at := text.rfind(frame.opening, prev, a)) >= 0:
        if not text[at + len(frame.opening) : a].strip():  # a reasoning block opens the turn
            head = lo = at
    hi = b
    if (m := frame.closers.search(text, b, following)) is not None:
        if not header or text.find(header, b, m.start()) < 0:
            hi = m.end()
    return Turn(i, head, lo, hi, shown)


def _searched(
    frame: Frame,
    text: str,
    messages: list[dict[str, Any]],
    wanted: list[int],
    field: str | None,
    markers: Markers,
    closing_only: bool,
) -> dict[int, list[tuple[int, int, str]]] | None:
    """Anchors by search, when every piece of every wanted message occurs exactly once.

    A plain content is searched as it is; otherwise the cores of the message's reasoning
    (absent: the template dropped it), answer and tool-call arguments (as ``tojson`` writes
    them), in that order and within one turn (no header or end marker between them).
    Anything else — a piece found twice, out of order, an empty turn — is left to the
    probe (``None``).
    """
    out = {}
    last = 0
    for i in wanted:
        m = messages[i]
        content = m["content"]
        calls = m.get("tool_calls")
        if not calls and not (field and field in m) and markers[1] not in content:
            if not content or (lo := _once(text, content)) < last:
                return None
            out[i] = [(lo, lo + len(content), "c")]
            last = lo + len(content)
            continue
        thought = m.get(field) if field else None
        inline = split_inline(content, markers, closing_only) if markers[1] in content else None
        if inline is not None:
            thought, content = inline
        needles = [(content.strip(), "c")] + [(_arguments(c), "n") for c in calls or ()]
        pieces = []
        reason = thought.strip() if isinstance(thought, str) else ""
        if reason and (lo := text.find(reason, last)) >= 0:
            pieces.append((lo, lo + len(reason), "r"))
        for needle, kind in needles:
            if needle is None:
                return None
            if needle:
                if (lo := _once(text, needle)) < 0:
                    return None
                pieces.append((lo, lo + len(needle), kind))
        if not pieces or pieces[0][0] < last or not _one_turn(frame, text, pieces):
            return None
        if reason and pieces[0][2] == "r" and text.find(reason, pieces[0][0] + 1) >= 0:
            return None
        out[i] = pieces
        last = pieces[-1][1]
    return out


def _arguments(call: Any) -> str | None:
    """Return a call's arguments as a template's ``tojson`` writes them (None: none given)."""
    function = call.get("function", call) if isinstance(call, dict) else None
    args = function.get("arguments") if isinstance(function, dict) else None
    if isinstance(args, str):
        return args
    return json.dumps(args, ensure_ascii=False) if isinstance(args, dict) and args else None


def _one_turn(frame: Frame, text: str, pieces: list[tuple[int, int, str]]) -> bool:
    """Tell whether pieces follow each other with no header or end marker between them."""
    for (_, end, _), (start, _, _) in pairwise(pieces):
        if start < end or frame.closers.search(text, end, start):
            return False
        if frame.header and text.find(frame.header, end, start) >= 0:
            return False
    return True


def _once(text: str, needle: str) -> int:
    """Where ``needle`` occurs in ``text`` if exactly once, else -1."""
    lo = text.find(needle)
    return lo if lo >= 0 and text.find(needle, lo + 1) < 0 else -1


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


def _probed(
    template: ChatTemplate,
    text: str,
    messages: list[dict[str, Any]],
    tools: list[Any] | None,
    bundle: TokenizerBundle,
    markers: Markers,
    closing_only: bool,
    field: str | None,
) -> dict[int, list[tuple[int, int, str]]] | None:
    """Anchors from a probe render (see the module notes); ``None`` when no probe agrees."""
    free = [c for c in "\ue000\ue001\ue002\ue003\ue004\ue005" if c not in text]
    if len(free) < 2:
        return None
    for empty_too in (True, False):
        probe = _Probe(free[0], free[1], empty_too)
        shown = [
            probe.message(m, i, markers, closing_only, field) if m["role"] == "assistant" else m
            for i, m in enumerate(messages)
        ]
        try:
            rendered, _ = render_chat(template, shown, tools, bundle.special_tokens_map)
        except TemplateError:
            continue
        found = _put_back(rendered, text, probe.pieces, free[0], free[1])
        if found is not None:
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


def _put_back(
    rendered: str, text: str, pieces: list[tuple[int, str, str]], left: str, right: str
) -> dict[int, list[tuple[int, int, str]]] | None:
    """Put each piece back in the probe; its places, or ``None`` unless that gives ``text``."""
    chunks, at, shift = [], 0, 0
    found: dict[int, list[tuple[int, int, str]]] = {}
    seen = set()
    for match in re.finditer(f"{left}([0-9]+){right}", rendered):
        n = int(match.group(1))
        if n >= len(pieces) or n in seen:
            return None
        seen.add(n)
        i, kind, value = pieces[n]
        lo = match.start() + shift
        chunks += [rendered[at : match.start()], value]
        at = match.end()
        shift += len(value) - len(match.group())
        found.setdefault(i, []).append((lo, lo + len(value), kind))
    chunks.append(rendered[at:])
    if "".join(chunks) != text:
        return None
    return {i: sorted(p) for i, p in found.items()}


def _fallback(
    template: ChatTemplate,
    text: str,
    messages: list[dict[str, Any]],
    wanted: list[int],
    tools: list[Any] | None,
    bundle: TokenizerBundle,
    frame: Frame,
) -> dict[int, Turn]:
    """Contents by search, tool-calling turns by prefix renders (templates that rewrite)."""
    variables = bundle.special_tokens_map
    places = locate_contents(template, text, messages, tools, variables)
    out: dict[int, Turn] = {}
    for i in wanted:
        if calls_tools(messages[i]):
            if (turn := locate_turn(template, text, messages, i, tools, variables)) is not None:
                out[i] = Turn(i, turn[0], turn[0], turn[1], False)
        elif i in places:
            a, b = places[i]
            out[i] = _span(frame, text, i, a, b, 0, len(text), messages[i]["role"], False)
    return out
