r"""One placeholder token per merged patch: the rendered text expanded, its spans moved.

The chat template writes one ``<|image_pad|>`` per image; the processor replaces the ``k``-th
with as many as image ``k`` has merged patches (``grid.prod() // merge_size**2``) before
tokenizing, and so does this module, on the rendered text, moving every trained character
span by the characters inserted before it::

    rendered   …user\n<|vision_start|><|image_pad|><|vision_end|>Who?<|im_end|>…They're…
    expanded   …user\n<|vision_start|><|image_pad|>×66<|vision_end|>Who?<|im_end|>…They're…
    spans      [lo, hi) of "They're…" + 65 * len("<|image_pad|>")

Each placeholder is one added token of the tokenizer, so the ids equal
``processor(text=…, images=…)``'s.  Vision tokens are never trained: every span is cut
around each ``<|vision_start|> … <|vision_end|>`` block (the pad run alone where the template
writes no fence), so an image in a trained turn keeps its text trained and its patches not.
"""

from __future__ import annotations

from dataclasses import dataclass

from packshard.errors import RecordError

Spans = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class VisionTokens:
    """The placeholder strings a family's template and processor use."""

    image_pad: str = "<|image_pad|>"
    vision_start: str = "<|vision_start|>"
    vision_end: str = "<|vision_end|>"

    def writes(self, template_text: str) -> bool:
        """Tell whether a chat template's source writes this family's image placeholder."""
        return self.image_pad in template_text


QWEN_VL = VisionTokens()


def _find_all(text: str, needle: str) -> list[int]:
    out, at = [], text.find(needle)
    while at >= 0:
        out.append(at)
        at = text.find(needle, at + len(needle))
    return out


def _cut(spans: Spans, holes: list[tuple[int, int]]) -> Spans:
    """Return ``spans`` without the characters of ``holes`` (sorted, disjoint)."""
    out: list[tuple[int, int]] = []
    for lo, hi in spans:
        for a, b in holes:
            if b <= lo or a >= hi:
                continue
            if a > lo:
                out.append((lo, a))
            lo = max(lo, b)
        if lo < hi:
            out.append((lo, hi))
    return tuple(out)


def expand_images(
    text: str, spans: Spans, counts: list[int], tokens: VisionTokens = QWEN_VL
) -> tuple[str, Spans]:
    """Return ``text`` with the ``k``-th image placeholder repeated ``counts[k]`` times.

    The spans move with the text, and every vision block is cut out of them.

    Raises:
        RecordError: ``media_mismatch`` when the text holds another number of placeholders
            than ``counts`` has images (the template dropped or added one).

    """
    pad = tokens.image_pad
    found = _find_all(text, pad)
    if len(found) != len(counts):
        raise RecordError(
            "media_mismatch",
            f"the template wrote {len(found)} image placeholder(s) {pad} for "
            f"{len(counts)} image(s)",
        )
    pieces: list[str] = []
    moved: list[int] = []  # new position of each old placeholder
    shift, last = 0, 0
    for at, n in zip(found, counts, strict=True):
        pieces += (text[last:at], pad * n)
        moved.append(at + shift)
        shift += (n - 1) * len(pad)
        last = at + len(pad)
    pieces.append(text[last:])
    out = "".join(pieces)

    def move(p: int) -> int:
        k = sum(1 for at in found if at < p)  # placeholders wholly before p (spans never split one)
        return p + sum((n - 1) * len(pad) for n in counts[:k])

    holes = []
    for at, n in zip(moved, counts, strict=True):
        lo, hi = at, at + n * len(pad)
        start, end = tokens.vision_start, tokens.vision_end
        if out.startswith(start, lo - len(start)) and out.startswith(end, hi):
            lo, hi = lo - len(start), hi + len(end)
        holes.append((lo, hi))
    return out, _cut(tuple((move(lo), move(hi)) for lo, hi in spans), holes)
