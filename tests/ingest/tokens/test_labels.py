"""Span-to-token labelling: character spans of a rendered example become trained labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packshard.ingest.tokens.labels import encode_rendered
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import Rendered
from packshard.records import IGNORE_INDEX
from tests.helpers import build_tokenizer


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return build_tokenizer(tmp_path / "tok")


def _reference_labels(bundle, rendered: Rendered) -> np.ndarray:
    """Per-token reference: a token is trained when its offsets overlap a span."""
    enc = bundle.tokenizer.encode(rendered.text, add_special_tokens=False)
    out = np.full(len(enc.ids), IGNORE_INDEX, dtype=np.int32)
    for t, (a, b) in enumerate(enc.offsets):
        if rendered.label_path == "none" or any(
            b > lo and a < hi and b > a for lo, hi in rendered.spans
        ):
            out[t] = enc.ids[t]
    return out


def test_encode_rendered_hand_checked(tiny: Path) -> None:
    bundle = load_tokenizer(str(tiny))
    text = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nworld<|im_end|>\n"
    lo = text.index("world")
    hi = text.index("<|im_end|>", lo) + len("<|im_end|>")
    batch = [Rendered(text, ((lo, hi),), "offsets"), Rendered("hello", (), "none")]
    ids, labels, offsets = encode_rendered(bundle, batch)
    assert ids.dtype == np.int32 and labels.dtype == np.int32 and offsets.dtype == np.int64
    first = bundle.tokenizer.encode(text, add_special_tokens=False)
    second = bundle.tokenizer.encode("hello", add_special_tokens=False)
    assert offsets.tolist() == [0, len(first.ids), len(first.ids) + len(second.ids)]
    assert ids.tolist() == first.ids + second.ids
    tokens = first.tokens
    trained = [tokens[i] for i in np.flatnonzero(labels[: len(tokens)] != IGNORE_INDEX)]
    assert "".join(trained).replace("Ġ", " ") == "world<|im_end|>"
    assert (labels[offsets[1] :] == ids[offsets[1] :]).all()  # "none": every token


def test_encode_rendered_empty_batch(tiny: Path) -> None:
    ids, labels, offsets = encode_rendered(load_tokenizer(str(tiny)), [])
    assert ids.size == labels.size == 0 and offsets.tolist() == [0]


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(alphabet="ab 你é\n<|im_end|>", min_size=1, max_size=40),
    cuts=st.lists(st.integers(0, 40), min_size=0, max_size=6),
)
def test_span_edges_match_the_per_token_overlap_rule(tmp_path_factory, text: str, cuts) -> None:
    bundle = _tiny_bundle(tmp_path_factory)
    edges = sorted({min(c, len(text)) for c in cuts})
    spans = tuple((a, b) for a, b in zip(edges[::2], edges[1::2], strict=False) if b > a)
    rendered = Rendered(text, spans, "offsets")
    _, labels, _ = encode_rendered(bundle, [rendered])
    np.testing.assert_array_equal(labels, _reference_labels(bundle, rendered))


_CACHE: dict[str, object] = {}


def _tiny_bundle(factory):
    if "tiny" not in _CACHE:
        _CACHE["tiny"] = load_tokenizer(str(build_tokenizer(factory.mktemp("tok"))))
    return _CACHE["tiny"]
