"""Placeholders expanded to their counts; spans moved and cut around vision blocks."""

from __future__ import annotations

import pytest

from packshard.errors import RecordError
from packshard.ingest.media.expand import QWEN_VL, expand_images

V = "<|vision_start|><|image_pad|><|vision_end|>"


def test_spans_move_by_the_inserted_characters() -> None:
    text = f"u:{V}Who?|a:Kane.|u:{V}|a:Yes.|"
    spans = ((text.index("Kane."), text.index("Kane.") + 6), (text.index("Yes."), len(text)))
    out, moved = expand_images(text, spans, [3, 2])
    assert out.count("<|image_pad|>") == 5
    assert [out[lo:hi] for lo, hi in moved] == ["Kane.|", "Yes.|"]


def test_vision_blocks_never_trained() -> None:
    text = f"a:look {V} there"
    out, spans = expand_images(text, ((0, len(text)),), [4])
    assert [out[lo:hi] for lo, hi in spans] == ["a:look ", " there"]
    bare = "x<|image_pad|>y"  # no fence: the pad run alone is cut
    out, spans = expand_images(bare, ((0, len(bare)),), [2])
    assert [out[lo:hi] for lo, hi in spans] == ["x", "y"]


def test_counts_must_match() -> None:
    with pytest.raises(RecordError, match="wrote 1 image placeholder") as err:
        expand_images(f"{V}", (), [1, 1])
    assert err.value.code == "media_mismatch"


def test_the_template_check() -> None:
    assert QWEN_VL.writes("{{ '<|image_pad|>' }}")
    assert not QWEN_VL.writes("{{ message['content'] }}")
