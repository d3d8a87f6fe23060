r"""The labels of every rendered assistant turn, checked against the recorded policies.

This check does not reuse the spans ingest chose: it reads each re-tokenized example back,
token by token, finds the assistant turns in the decoded text by the template's header and
end markers (:mod:`packshard.ingest.label.frame`) and their leading reasoning block by the
recorded markers, and asks of the labels what the policies promise::

    <|im_start|>assistant\n<think>\nAdd.\n</think>\n\nIt is 4.<|im_end|>
                           [reasoning block      ][answer + end marker)
    --reasoning train      block trained exactly when the answer is
    --reasoning mask       no block token trained
    offsets label path     every answer token of a trained turn trained, end marker included

An empty block follows ``--empty-reasoning`` the same way.  A turn counts as trained when a
token of it outside its block is.  Tokens are placed by decoding each one alone (markers and
headers are ASCII in every known template).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from packshard.ingest import ChatTemplate, Frame, TokenizerBundle, find_block, template_frame
from packshard.ingest.types import IngestOptions
from packshard.options import LIMIT_DEFAULTS, REASONING_MARKERS
from packshard.records import IGNORE_INDEX
from packshard.verify.findings import Finding, FindingList


def recorded_options(config: dict[str, Any]) -> IngestOptions:
    """Return the ingest options a manifest's ``config`` records (defaults for older packs).

    The ingest limits are recorded only when moved from their defaults (``limits``); so are
    the images' root and pixel bounds (``media``).
    """
    markers = config.get("reasoning_markers") or REASONING_MARKERS
    limits = config.get("limits") or {}
    media = config.get("media") or {}  # a pack with images: where their paths start, bounds
    rule = media.get("vision_rule") or {}
    return IngestOptions(
        media_root=media.get("media_root"),
        max_pixels=rule.get("max_pixels"),
        min_pixels=rule.get("min_pixels"),
        vision_family=rule.get("name", "qwen2_vl"),
        format=config["format"],
        domain_field=config["domain_field"],
        loss=config["loss"],
        reasoning=config.get("reasoning", "train"),
        empty_reasoning=config.get("empty_reasoning", "train"),
        turns=config.get("turns", "as_rendered"),
        reasoning_markers=(str(markers[0]), str(markers[1])),
        **{k: v for k, v in limits.items() if k in LIMIT_DEFAULTS},
    )


def turn_check(
    template: ChatTemplate | None,
    bundle: TokenizerBundle,
    options: IngestOptions,
    label_spans: str | None,
) -> TurnCheck | None:
    """Return the check for packs of chat records (``None`` without a template)."""
    if template is None:
        return None
    frame = template_frame(template, bundle, options.reasoning_markers)
    return TurnCheck(frame, options, label_spans == "offsets")


@dataclass(slots=True)
class TurnCheck:
    """The check of one pack: the template's frame, the policies, what has been checked."""

    frame: Frame
    options: IngestOptions
    whole_turns: bool  # the offsets path: a trained turn is trained from header to end marker
    turns: int = 0
    blocks: int = 0

    def example(
        self,
        tokenizer: Any,
        ids: np.ndarray,
        labels: np.ndarray,
        where: str,
        turn: int,
        findings: FindingList,
    ) -> None:
        """Check one re-ingested example; a broken promise becomes a finding."""
        turns, blocks, problem = self.problems(decode_pieces(tokenizer, ids), labels)
        self.turns += turns
        self.blocks += blocks
        if problem is not None:
            place = f"{where} message {turn}" if turn else where
            findings.add(Finding("source", problem, source=place), "turn_labels")

    def counts(self) -> dict[str, int]:
        """Return the turns and reasoning blocks checked, for the report."""
        return {"turns_checked": self.turns, "reasoning_blocks_checked": self.blocks}

    def problems(self, pieces: list[str], labels: np.ndarray) -> tuple[int, int, str | None]:
        """Check one example (its tokens decoded one by one, and its labels).

        Returns the turns and reasoning blocks checked, and the first problem found (``None``
        when the labels keep every promise).
        """
        header = self.frame.header.rstrip()  # a special token may swallow its line break
        if not header or not pieces:
            return 0, 0, None
        ends = np.cumsum([len(p) for p in pieces])
        starts = ends - np.array([len(p) for p in pieces])
        text = "".join(pieces)
        trained = labels != IGNORE_INDEX
        turns = blocks = 0
        at = text.find(header)
        while at >= 0:
            lo = at + len(header)
            while lo < len(text) and text[lo].isspace():
                lo += 1
            following = text.find(header, lo)
            stop = following if following >= 0 else len(text)
            closer = self.frame.closers.search(text, lo, stop)
            at = following
            if closer is None:
                continue
            hi = closer.end()
            body = _tokens(starts, ends, lo, hi)
            block = find_block(text, lo, hi, self.options.reasoning_markers)
            inside = np.zeros(body[1] - body[0], dtype=bool)
            policy = None
            if block is not None:
                b0, b1 = _tokens(starts, ends, block[0], block[1])
                full = (starts[b0:b1] >= block[0]) & (ends[b0:b1] <= block[1])
                inside[b0 - body[0] : b1 - body[0]] = full
                empty = block[2]
                policy = self.options.empty_reasoning if empty else self.options.reasoning
                blocks += 1
            turns += 1
            got = trained[body[0] : body[1]]
            on = bool(got[~inside].any())
            opening = self.options.reasoning_markers[0]
            if block is None and text.startswith(opening, lo) and got.any():
                return turns, blocks, f"a reasoning block opened with {opening!r} and never closed"

            what = "empty reasoning block" if block is not None and block[2] else "reasoning"
            option = "--empty-reasoning" if what != "reasoning" else "--reasoning"
            if inside.any() and policy == "mask" and got[inside].any():
                return turns, blocks, f"{what} trained although {option} mask"
            if inside.any() and policy != "mask" and on and not got[inside].all():
                return turns, blocks, f"{what} of a trained turn untrained although {option} train"
            if self.whole_turns and on and not got[~inside].all():
                return turns, blocks, "assistant text of a trained turn left untrained"
        return turns, blocks, None


def _tokens(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> tuple[int, int]:
    """Token range overlapping characters ``[lo, hi)``."""
    t0 = int(np.searchsorted(ends, lo, side="right"))
    t1 = int(np.searchsorted(starts, hi, side="left"))
    return t0, max(t0, t1)


def decode_pieces(tokenizer: Any, ids: np.ndarray) -> list[str]:
    """Decode every token alone (special tokens kept), in one batched call."""
    return list(tokenizer.decode_batch([[i] for i in ids.tolist()], skip_special_tokens=False))
