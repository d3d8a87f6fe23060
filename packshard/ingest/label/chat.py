r"""Which characters of one rendered conversation are trained: labelling in named tiers.

Which messages are trained: the loss policy's assistant turns, then each message's own flag
(``"train"``, ``"weight": 0``; :mod:`packshard.ingest.fields`) added or taken away.  Where
their characters are, found by the first tier that can::

    1 generation tags   the template's {% generation %} blocks decide, exactly; when only
                        some assistant turns are trained, each block goes to the turn whose
                        header it follows (:func:`generation_blocks`)
    2 search            each piece of a message (content; or reasoning, answer, tool-call
                        arguments) found once, in order, within one turn; no render
                        (:func:`~packshard.ingest.label.turns.search_anchors`)
    3 probe             a second render with stand-ins for the assistant pieces says where
                        each lands (:func:`~packshard.ingest.label.probe.probe_anchors`)
    4 prefix difference a turn is what rendering messages[:i + 1] adds to messages[:i] with
                        the generation prompt; two renders per turn
                        (:func:`~packshard.ingest.label.locate.prefix_turn`)

Tiers 2–4 place turns (:mod:`packshard.ingest.label.turns`): a trained turn is its header's end
through its end marker, plus a final EOS after the last one (label path ``offsets``)::

    <|im_start|>assistant\n<think>\n\n</think>\n\nSure.<|im_end|>\n
                           [---------------------------------)

On 5,412 real chat records (phi-3 and Qwen3 templates) search places 5,384 in one render
and the probe the other 28 in two.  Tier 4 alone gives the same spans on all
5,412 and phi-3's generation masks, at two renders per trained turn (three for a Qwen3 turn
in the history): the last resort, for templates the others cannot read.

Then the reasoning block a trained turn starts with
(:func:`~packshard.ingest.label.reasoning.find_block`) follows ``--reasoning`` (``mask``: cut
out of the spans; ``train``: in them, even where a template's tags leave it out) and, when it
is empty, ``--empty-reasoning``.  A turn with reasoning that the template renders without it
is counted (``Rendered.reasoning_dropped``) — unless it is the conversation's last message: a
template that drops reasoning there cannot render it at all, and the record is rejected.
"""

from __future__ import annotations

from typing import Any

from packshard.errors import RecordError
from packshard.ingest.label.frame import Chat, Frame
from packshard.ingest.label.locate import calls_tools
from packshard.ingest.label.reasoning import find_block
from packshard.ingest.label.turns import Turn, locate_turns
from packshard.ingest.types import IngestOptions, Rendered

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
        spans = with_final_eos(chat.text, chat.frame, chat.bundle.eos_token, found)
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
