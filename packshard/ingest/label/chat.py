r"""One chat conversation rendered, its trained character spans chosen turn by turn.

Which messages are trained: the loss policy's assistant turns, then each message's own flag
(``"train"``, ``"weight": 0``; :mod:`packshard.ingest.fields`) added or taken away.  How
their characters are found::

    generation_tags  the template's {% generation %} blocks decide; when only some assistant
                     turns are trained, each block goes to the turn whose header it follows
    offsets          each trained turn as rendered: its header's end through its end marker
                     (:mod:`packshard.ingest.label.turns`), plus a final EOS after the last one:
                         <|im_start|>assistant\n<think>\n\n</think>\n\nSure.<|im_end|>\n
                                                [---------------------------------)

Then the reasoning block a trained turn starts with
(:func:`~packshard.ingest.label.reasoning.find_block`) follows ``--reasoning`` (``mask``: cut
out of the spans; ``train``: in them, even where a template's tags leave it out) and, when it is
empty, ``--empty-reasoning``.  A
turn with reasoning that the template renders without it is counted
(``Rendered.reasoning_dropped``) — unless it is the conversation's last message: a template
that drops reasoning there cannot render it at all, and the record is rejected.
"""

from __future__ import annotations

from typing import Any

from packshard.errors import RecordError
from packshard.ingest.label.frame import Frame, template_frame
from packshard.ingest.label.locate import calls_tools
from packshard.ingest.label.reasoning import find_block, reasoning_field, splits_inline
from packshard.ingest.label.turns import Turn, locate_turns, plain_turns
from packshard.ingest.template.render import ChatTemplate
from packshard.ingest.tokens.tokenizer import TokenizerBundle
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


def label_chat(
    ref: Any,
    template: ChatTemplate,
    bundle: TokenizerBundle,
    rendered: tuple[str, list[tuple[int, int]]],
    messages: list[dict[str, Any]],
    trained: list[int],
    tools: list[Any] | None,
    options: IngestOptions,
    has_reasoning: list[bool],
    everything: bool = False,
) -> Rendered:
    """Choose the trained spans of one rendered conversation (``everything``: ``--loss all``)."""
    text, blocks = rendered
    markers = options.reasoning_markers
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    reasoning = True in has_reasoning[: len(messages)]
    # with no reasoning to place, blocks matter only when empty ones are masked
    blocks_matter = reasoning or options.empty_reasoning == "mask"
    if everything and not blocks_matter:
        return Rendered(text, ((0, len(text)),), "none")
    tags = template.has_generation and not everything
    if tags and trained == assistant and not reasoning:
        if not blocks_matter:
            return Rendered(text, tuple(blocks), "generation_tags")
        spans, found = list(blocks), [(lo, hi) for lo, hi in blocks]
        return _apply_reasoning(text, spans, found, options, Rendered(text, (), "generation_tags"))
    if not tags and not everything and not blocks_matter:
        frame = template_frame(template, bundle, markers)
        if (plain := plain_turns(frame, text, messages, trained)) is not None:
            return Rendered(text, tuple(_with_final_eos(text, plain, bundle, frame)), "offsets")
    field = reasoning_field(template) if reasoning else None
    closing_only = splits_inline(template, markers) if reasoning else False
    wanted = sorted(set(trained) | set(assistant)) if tags or everything else trained
    turns = locate_turns(
        template, text, messages, wanted, tools, bundle, markers, closing_only, field
    )
    for i in wanted if tags else trained:  # with tags, every turn's blocks must be placed
        if i not in turns:
            raise RecordError("template_error", _unplaced(messages[i], i), ref.source, ref.line)
    if everything:
        spans = [(0, len(text))]
        bodies = [(turns[i].lo, turns[i].hi) for i in assistant if i in turns]
    elif tags:
        spans = _kept_blocks(blocks, turns, assistant, trained)
        spans += [(turns[i].lo, turns[i].hi) for i in trained if i not in assistant]
        bodies = [(turns[i].lo, turns[i].hi) for i in trained if i in assistant]
    else:
        frame = template_frame(template, bundle, markers)
        spans = _with_final_eos(text, [(turns[i].lo, turns[i].hi) for i in trained], bundle, frame)
        bodies = [(turns[i].lo, turns[i].hi) for i in trained if i in assistant]
    path = "none" if everything else "generation_tags" if tags else "offsets"
    if not blocks_matter:
        return Rendered(text, tuple(spans), path)
    dropped = 0
    for i in trained if not everything else assistant:
        if has_reasoning[i] and i in turns and not _shows_reasoning(text, turns[i], markers):
            if i == len(messages) - 1:
                raise RecordError("reasoning_dropped", _lost(i), ref.source, ref.line)
            dropped += 1
    base = Rendered(text, (), path, reasoning_dropped=dropped)
    return _apply_reasoning(text, spans, bodies, options, base)


def _with_final_eos(text: str, spans: Spans, bundle: TokenizerBundle, frame: Frame) -> Spans:
    """Add the EOS that ends the text after the last trained turn (not the gap before it)."""
    eos = bundle.eos_token
    if eos and (m := frame.final.match(text, spans[-1][1])):
        end = m.end() - (len(m.group()) - len(m.group().rstrip()))
        return [*spans, (end - len(eos), end)]
    return spans


def _shows_reasoning(text: str, turn: Turn, markers: tuple[str, str]) -> bool:
    block = find_block(text, turn.lo, turn.hi, markers)
    return turn.reasoning_shown or (block is not None and not block[2])


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
