r"""Where each trained turn sits in a rendered conversation.

A trained turn is everything the template renders for a message after its header, through
the end marker that closes it: reasoning block, content, tool-call markup, end marker::

    <|im_start|>assistant\n<think>\nAdd.\n</think>\n\nIt is 4.<|im_end|>\n
    [header  (frame)      ][------------- the turn -----------------)

The header and the end markers come from :mod:`packshard.ingest.label.frame`.

**Anchors**: the places of a message's own pieces (reasoning, content, tool-call arguments)
in the text.  Found by search where every piece occurs exactly once, in order, within one
turn (:func:`_searched`: a plain content, or the cores of reasoning, answer and tool-call
arguments); otherwise by a second render with stand-ins, the probe
(:mod:`packshard.ingest.label.probe`); otherwise the contents are searched for as before and a
tool-calling turn is placed by rendering prefixes
(:func:`~packshard.ingest.label.locate.locate_turn`).  Reasoning found nowhere is reasoning the
template dropped.

**Span**: from the end of the last header before the first anchor (or the anchor, for a
template without a header) to the end of the first end marker after the last anchor, as
long as no other message's anchor and no header come first (else: to the last anchor).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from packshard.ingest.label.frame import Frame, template_frame
from packshard.ingest.label.locate import calls_tools, locate_contents, locate_turn
from packshard.ingest.label.probe import probe_anchors
from packshard.ingest.label.reasoning import Markers, split_inline
from packshard.ingest.template.render import ChatTemplate
from packshard.ingest.tokens.tokenizer import TokenizerBundle


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
        anchors = probe_anchors(
            template, text, messages, tools, bundle, markers, closing_only, field
        )
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
