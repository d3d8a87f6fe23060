r"""Where each trained turn sits in a rendered conversation: tiers 2–4 of the labelling.

A trained turn is everything the template renders for a message after its header, through
the end marker that closes it: reasoning block, content, tool-call markup, end marker::

    <|im_start|>assistant\n<think>\nAdd.\n</think>\n\nIt is 4.<|im_end|>\n
    [header  (frame)      ][------------- the turn -----------------)

The header and the end markers come from :mod:`packshard.ingest.label.frame`.  The turns are
placed by the first tier that can (tier 1, ``{% generation %}`` tags, is in
:mod:`packshard.ingest.label.chat`):

2. **search** (:func:`search_anchors`): every piece of every wanted message — a plain
   content, or the cores of reasoning, answer and tool-call arguments — occurs exactly once,
   in order, within one turn; no render.  A conversation of plain role/content messages
   (most records) takes :func:`plain_turns`, the same search without the ``Chat`` around it.
3. **probe** (:func:`~packshard.ingest.label.probe.probe_anchors`): one more render with stand-ins
   for the assistant pieces, which says where each lands.
4. **prefix difference** (:func:`~packshard.ingest.label.locate.prefix_turn`): each turn still
   missing is what rendering ``messages[:i + 1]`` adds to ``messages[:i]`` with the
   generation prompt; two renders per turn.

**Span** (tiers 2 and 3): from the end of the last header before the first anchor (or the
anchor, for a template without a header) to the end of the first end marker after the last
anchor, as long as no other message's anchor and no header come first (else: to the last
anchor).  Reasoning found nowhere is reasoning the template dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from packshard.ingest.label.frame import Chat, Frame
from packshard.ingest.label.locate import prefix_turn
from packshard.ingest.label.probe import Anchors, probe_anchors
from packshard.ingest.label.reasoning import split_inline
from packshard.records import quick


@quick
@dataclass(frozen=True, slots=True)
class Turn:
    """A located turn: its header starts at ``head``; ``[lo, hi)`` is what it trains."""

    head: int
    lo: int
    hi: int
    reasoning_shown: bool  # the message's reasoning is in the text


def locate_turns(chat: Chat, wanted: list[int]) -> dict[int, Turn]:
    """Place the turns of ``messages[i]`` for ``i`` in ``wanted``; unplaceable ones are left out."""
    anchors = search_anchors(chat, wanted)
    if anchors is None:
        anchors = probe_anchors(chat) or {}
    out: dict[int, Turn] = {}
    order = sorted(anchors)
    chosen = set(wanted)
    for n, i in enumerate(order):
        if i in chosen:
            pieces = anchors[i]
            prev = anchors[order[n - 1]][-1][1] if n else 0
            following = anchors[order[n + 1]][0][0] if n + 1 < len(order) else len(chat.text)
            a, b = pieces[0][0], max(p[1] for p in pieces)
            role = chat.messages[i]["role"]
            head, lo, hi = _span(chat.text, chat.frame, role, a, b, prev, following)
            out[i] = Turn(head, lo, hi, any(p[2] == "r" for p in pieces))
    for i in wanted:
        if i not in out and (placed := prefix_turn(chat, i)) is not None:
            out[i] = Turn(*placed, False)
    return out


def _span(
    text: str, frame: Frame, role: str, a: int, b: int, prev: int, following: int
) -> tuple[int, int, int]:
    """Return ``(head, lo, hi)`` of the turn whose anchors span ``[a, b)``.

    The turn is looked for between ``prev`` (the end of the anchors before) and
    ``following`` (the start of those after).
    """
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
    return head, lo, hi


def plain_turns(
    text: str, frame: Frame, messages: list[dict[str, Any]], wanted: list[int]
) -> list[tuple[int, int]] | None:
    """Tier 2 for a conversation of plain messages: the ``[lo, hi)`` of each wanted turn.

    What :func:`locate_turns` gives when :func:`search_anchors` places every wanted message
    by its content alone (no reasoning, tool calls or other fields anywhere), without the
    :class:`~packshard.ingest.label.frame.Chat` around it, which takes about a third off the
    per-record cost of labelling the shared chat data (phi-3: 23.5–26.1 µs a record against
    33.6–35.0, render included).  ``None`` where search cannot place them; the record then
    goes through every tier.
    """
    found = []
    last = 0
    for i in wanted:
        content = messages[i]["content"]
        if not content or (lo := _once(text, content)) < last:
            return None
        last = lo + len(content)
        found.append((lo, last))
    out = []
    for n, i in enumerate(wanted):
        prev = found[n - 1][1] if n else 0
        following = found[n + 1][0] if n + 1 < len(found) else len(text)
        _, lo, hi = _span(text, frame, messages[i]["role"], *found[n], prev, following)
        out.append((lo, hi))
    return out


def search_anchors(chat: Chat, wanted: list[int]) -> Anchors | None:
    """Anchors by search, when every piece of every wanted message occurs exactly once.

    A plain content is searched as it is; otherwise the cores of the message's reasoning
    (absent: the template dropped it), answer and tool-call arguments (as ``tojson`` writes
    them), in that order and within one turn (no header or end marker between them).
    Anything else — a piece found twice, out of order, an empty turn — is left to the
    probe (``None``).
    """
    text, frame, markers, field = chat.text, chat.frame, chat.markers, chat.field
    messages = chat.messages
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
        if (inline := split_inline(content, markers, chat.closing_only)) is not None:
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
