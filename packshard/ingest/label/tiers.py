r"""Which characters of one rendered conversation are trained: the tier table, and tiers 1–2.

Which messages are trained: the loss policy's assistant turns, then each message's own flag
(``"train"``, ``"weight": 0``; :mod:`packshard.ingest.fields`) added or taken away.  Where
their characters are, found by the first tier that can (this table is the labelling's one;
``Rendered.label_path`` names the path, ``scripts/check_label_bytes.py`` the tier)::

    tier       label path        how                                            where
    1 tags     generation_tags   the template's {% generation %} blocks decide,  generation_blocks
                                 exactly; each block goes to the trained turn
                                 whose header it follows
    2 search   offsets           each piece of a message (content; or           search_anchors,
                                 reasoning, answer, tool-call arguments) found  plain_turns
                                 once, in order, within one turn; no render
    3 probe    offsets           a second render with stand-ins for the         probe.probe_anchors
                                 assistant pieces says where each lands
    4 prefix   offsets           a turn is what rendering messages[:i + 1] adds  prefix.prefix_turn
                                 to messages[:i] with the generation prompt;
                                 two renders per turn

Tiers 2–4 place turns (:func:`locate_turns`): from the header's end
(:mod:`~packshard.ingest.label.frame`) through the end marker, plus a final EOS::

    <|im_start|>assistant\n<think>\nAdd.\n</think>\n\nIt is 4.<|im_end|>\n
    [header  (frame)      ][------------- the turn -----------------)

**Span** (tiers 2 and 3): from the end of the last header before the first anchor (or the
anchor, for a template without a header) to the end of the first end marker after the last
anchor, unless another message's anchor or a header comes first (then: to the last anchor).
Reasoning found nowhere is reasoning the template dropped.  Plain role/content conversations
take tier 2 without a :class:`Chat` around them (:func:`label_plain`).

On 5,412 real chat records (phi-3 and Qwen3 templates) search places 5,384 in one render
and the probe the other 28; tier 4 (two renders a turn) is the last resort.

Then the reasoning block a trained turn starts with
(:func:`~packshard.ingest.label.reasoning.find_block`) follows ``--reasoning`` and, empty,
``--empty-reasoning``.  Reasoning a template drops is counted (``Rendered.reasoning_dropped``),
or rejected on the last message, which it then cannot render at all.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from packshard.errors import RecordError
from packshard.ingest.label.chat import Chat, Frame, calls_tools, split_inline
from packshard.ingest.label.frame import chat_frame, template_frame
from packshard.ingest.label.prefix import prefix_turn
from packshard.ingest.label.probe import Anchors, probe_anchors
from packshard.ingest.label.reasoning import chat_closing_only, chat_field, find_block
from packshard.ingest.template.sandbox import ChatTemplate
from packshard.ingest.tokens.tokenizer import TokenizerBundle
from packshard.ingest.types import IngestOptions, Message, Rendered
from packshard.records import quick

Spans = list[tuple[int, int]]


def subtract(spans: Spans, cuts: Spans) -> Spans:
    """Return the parts of ``spans`` outside every span of ``cuts`` (both ``[lo, hi)``)."""
    out = []
    for lo, hi in spans:
        for c_lo, c_hi in sorted(cuts):
            if c_hi <= lo or c_lo >= hi:
                continue
            if c_lo > lo:
                out.append((lo, c_lo))
            lo = max(lo, c_hi)
        if hi > lo:
            out.append((lo, hi))
    return out


def generation_blocks(chat: Chat) -> Spans | None:
    """Tier 1: the render's ``{% generation %}`` blocks (``None``: the template has no tags)."""
    return list(chat.blocks) if chat.template.has_generation else None


def label_chat(chat: Chat, trained: list[int]) -> Rendered:
    """Choose the trained spans of one rendered conversation (see the module notes)."""
    text, messages, options, everything = chat.text, chat.messages, chat.options, chat.everything
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    reasoning = chat.reasoning
    # with no reasoning to place, blocks matter only when empty ones are masked
    blocks_matter = reasoning or options.empty_reasoning == "mask"
    if everything and not blocks_matter:
        return Rendered(text, ((0, len(text)),), "none")
    blocks = None if everything else generation_blocks(chat)
    tags = blocks is not None
    if blocks is not None and trained == assistant and not reasoning:
        tagged = Rendered(text, tuple(blocks), "generation_tags")
        return _apply_reasoning(text, blocks, blocks, options, tagged) if blocks_matter else tagged
    wanted = sorted(set(trained) | set(assistant)) if tags or everything else trained
    turns = locate_turns(chat, wanted)
    for i in wanted if tags else trained:  # with tags, every turn's blocks must be placed
        if i not in turns:
            raise RecordError("template_error", _unplaced(messages[i], i), *_at(chat))
    if everything:
        spans = [(0, len(text))]
    elif blocks is not None:
        spans = _kept_blocks(blocks, turns, assistant, trained)
        spans += [(turns[i].lo, turns[i].hi) for i in trained if i not in assistant]
    else:
        found = [(turns[i].lo, turns[i].hi) for i in trained]
        spans = with_final_eos(chat.text, chat_frame(chat), chat.bundle.eos_token, found)
    path = "none" if everything else "generation_tags" if tags else "offsets"
    if not blocks_matter:
        return Rendered(text, tuple(spans), path)
    checked = assistant if everything else trained
    dropped = 0
    for i in checked:  # given reasoning, the turn shows neither it nor a non-empty block
        if chat.has_reasoning[i] and i in turns and not turns[i].reasoning_shown:
            block = find_block(text, turns[i].lo, turns[i].hi, chat.markers)
            if block is None or block[2]:
                if i == len(messages) - 1:
                    raise RecordError("reasoning_dropped", _lost(i), *_at(chat))
                dropped += 1
    bodies = [(turns[i].lo, turns[i].hi) for i in checked if i in assistant and i in turns]
    base = Rendered(text, (), path, reasoning_dropped=dropped)
    return _apply_reasoning(text, spans, bodies, options, base)


def _at(chat: Chat) -> tuple[str, int]:
    return chat.ref.source, chat.ref.line


def with_final_eos(text: str, frame: Frame, eos: str | None, spans: Spans) -> Spans:
    """Add the EOS that ends the text after the last trained turn (not the gap before it)."""
    if eos and (m := frame.final.match(text, spans[-1][1])):
        end = m.start() + len(m.group().rstrip())
        return [*spans, (end - len(eos), end)]
    return spans


def _apply_reasoning(
    text: str, spans: Spans, bodies: Spans, options: IngestOptions, base: Rendered
) -> Rendered:
    """Mask or train each body's leading reasoning block as the policies say; list the blocks."""
    cuts: Spans = []
    shown = []
    for lo, hi in bodies:
        block = find_block(text, lo, hi, options.reasoning_markers)
        if block is None:
            continue
        start, end, empty = block
        policy = options.empty_reasoning if empty else options.reasoning
        if not empty:
            shown.append((start, end))
        if policy == "mask":
            cuts.append((start, end))
        elif not any(a <= start and end <= b for a, b in spans):
            spans = [*spans, (start, end)]  # trained with its turn, whatever the tags say
    kept = subtract(sorted(spans), cuts) if cuts else sorted(spans)
    path = "offsets" if base.label_path == "none" and cuts else base.label_path
    return Rendered(
        text, tuple(kept), path, reasoning=tuple(shown), reasoning_dropped=base.reasoning_dropped
    )


def _kept_blocks(
    blocks: list[tuple[int, int]], turns: dict[int, Turn], assistant: list[int], trained: list[int]
) -> Spans:
    """Return the parts of generation blocks in the regions of trained assistant turns.

    Turn ``j``'s region runs from its header to the next assistant turn's header (the first
    from the start of the text, the last to its end), so a block after a turn's end marker
    (a final EOS) still belongs to it.
    """
    placed = sorted((turns[i].head, i) for i in assistant if i in turns)
    out: Spans = []
    for n, (head, i) in enumerate(placed):
        if i not in trained:
            continue
        lo = 0 if n == 0 else head
        hi = placed[n + 1][0] if n + 1 < len(placed) else None
        for b_lo, b_hi in blocks:
            a, b = max(b_lo, lo), b_hi if hi is None else min(b_hi, hi)
            if b > a:
                out.append((a, b))
    return out


def _unplaced(message: dict[str, Any], i: int) -> str:
    if calls_tools(message):
        return (
            f"message {i + 1} (assistant tool call) cannot be located: the conversation "
            "rendered up to it is not a prefix of the whole (use a template with "
            "{% generation %} blocks via --template)"
        )
    return (
        f"message {i + 1} ({message['role']}) does not appear in the rendered text; the "
        "template rewrites it (use a template with {% generation %} blocks via --template)"
    )


def _lost(i: int) -> str:
    return (
        f"message {i + 1} (assistant): the template leaves out its reasoning even as the last "
        "turn, so it cannot be trained (use --reasoning drop to train the answer alone, or a "
        "template that renders reasoning via --template)"
    )


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
        anchors = probe_anchors(chat, chat_closing_only(chat), chat_field(chat)) or {}
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
            head, lo, hi = _span(chat.text, chat_frame(chat), role, a, b, prev, following)
            out[i] = Turn(head, lo, hi, any(p[2] == "r" for p in pieces))
    for i in wanted:
        if i not in out and (placed := prefix_turn(chat, i, chat_frame(chat))) is not None:
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

    What :func:`locate_turns` gives when search places every wanted message by its content
    alone, without a :class:`~packshard.ingest.label.chat.Chat`; ``None`` otherwise.
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

    The cores of the message's reasoning, answer and tool-call arguments (as ``tojson`` writes
    them), in order, within one turn; a piece found twice, out of order or empty is left to
    the probe (``None``).
    """
    text, frame, markers, field = chat.text, chat_frame(chat), chat.markers, chat_field(chat)
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
        if (inline := split_inline(content, markers, chat_closing_only(chat))) is not None:
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


def plain_frame(
    messages: Sequence[Message],
    template: ChatTemplate,
    bundle: TokenizerBundle,
    options: IngestOptions,
    loss: str,
    tools: list[Any] | None,
) -> Frame | None:
    """Return the frame tier 2 reads plain messages with, or None where a ``Chat`` is needed.

    Plain: no tools, no ``--loss all``, no generation tags, no reasoning anywhere (neither a
    field, other fields nor the closing marker in a content), empty reasoning not masked.
    """
    if tools is not None or loss == "all" or template.has_generation:
        return None
    closing = options.reasoning_markers[1]
    if options.empty_reasoning == "mask" or not all(
        m.reasoning is None and not m.extra and closing not in m.content for m in messages
    ):
        return None
    return template_frame(template, bundle, options.reasoning_markers)


def label_plain(
    text: str, frame: Frame, messages: list[dict[str, Any]], wanted: list[int], eos: str | None
) -> Spans | None:
    """Tier 2 on plain messages: the trained spans with the final EOS, or None (every tier)."""
    found = plain_turns(text, frame, messages, wanted)
    return None if found is None else with_final_eos(text, frame, eos, found)
