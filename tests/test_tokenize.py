"""Tokenizer loading and span-to-token labelling."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from packshard.errors import TokenizerError
from packshard.ingest.labels import encode_rendered
from packshard.records import IGNORE_INDEX
from packshard.ingest.templates import Rendered
from packshard.ingest.tokenizer import load_tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, hello tokenizer; héllo wörld 你好",
    "user assistant system tool call result",
    "Sure! Here is the answer: 42.",
] * 20


def build_tokenizer(folder: Path, config: dict | None = None, post_bos: bool = False) -> Path:
    """Train a tiny byte-level BPE with ChatML special tokens and write it to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    if post_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
        )
    tok.save(str(folder / "tokenizer.json"))
    if config is None:
        config = {"eos_token": "<|endoftext|>", "pad_token": {"content": "<|endoftext|>"}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return build_tokenizer(tmp_path / "tok")


def test_load_folder_and_file_give_the_same_bundle(tiny: Path) -> None:
    a = load_tokenizer(str(tiny))
    b = load_tokenizer(str(tiny / "tokenizer.json"))
    assert a.path == str(tiny) and b.path == str(tiny / "tokenizer.json")
    assert a.json_path == b.json_path == tiny / "tokenizer.json"
    assert a.sha256 == hashlib.sha256((tiny / "tokenizer.json").read_bytes()).hexdigest()
    assert a.sha256 == b.sha256
    assert a.eos_token == "<|endoftext|>" and a.eos_token_id == 0
    assert a.pad_token == "<|endoftext|>" and a.pad_token_id == 0  # {"content": ...} form
    assert a.bos_token is None and a.bos_token_id is None and a.add_bos_token is False
    assert a.special_tokens == tuple(SPECIALS)
    assert a.vocab_size == a.tokenizer.get_vocab_size(with_added_tokens=True)
    assert a.chat_template is None


def test_missing_and_broken_tokenizers_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"folder holds no tokenizer\.json .*--tokenizer"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(TokenizerError, match="no such file"):
        load_tokenizer(str(tmp_path / "nope.json"))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"not a valid tokenizer\.json"):
        load_tokenizer(str(tmp_path))


def test_config_template_list_form_and_special_tokens_map_fallback(tmp_path: Path) -> None:
    config = {
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "DEFAULT"},
        ]
    }
    folder = build_tokenizer(tmp_path / "t", config=config)
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": {"content": "<|im_end|>"}, "bos_token": "<|im_start|>"})
    )
    bundle = load_tokenizer(str(folder))
    assert bundle.chat_template == "DEFAULT"
    assert (bundle.eos_token, bundle.eos_token_id) == ("<|im_end|>", 2)
    assert (bundle.bos_token, bundle.bos_token_id) == ("<|im_start|>", 1)


def test_add_bos_token_is_detected_from_the_post_processor(tmp_path: Path) -> None:
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}
    bundle = load_tokenizer(str(build_tokenizer(tmp_path / "t", config, post_bos=True)))
    assert bundle.add_bos_token is True
    config["add_bos_token"] = False  # the config wins when it says so
    bundle = load_tokenizer(str(build_tokenizer(tmp_path / "u", config, post_bos=True)))
    assert bundle.add_bos_token is False


def test_truncation_in_tokenizer_json_is_switched_off(tmp_path: Path) -> None:
    folder = build_tokenizer(tmp_path / "t")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_truncation(max_length=3)
    tok.save(str(folder / "tokenizer.json"))
    bundle = load_tokenizer(str(folder))
    assert len(bundle.tokenizer.encode(CORPUS[0]).ids) > 3
    assert "truncation and padding disabled" in bundle.adjustments


def test_eos_only_in_the_vocabulary_becomes_a_special_token(tmp_path: Path) -> None:
    folder = build_tokenizer(tmp_path / "t", {"eos_token": "he"})
    bundle = load_tokenizer(str(folder))
    he = bundle.tokenizer.token_to_id("he")
    assert he is not None and bundle.eos_token_id == he
    assert bundle.tokenizer.encode("the", add_special_tokens=False).ids[-1] == he
    assert any("eos_token" in note for note in bundle.adjustments)


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


def test_phi3_prefix_space_once_like_transformers(shared_data: Path) -> None:
    bundle = load_tokenizer(str(shared_data / "tokenizers" / "phi-3-mini"))
    assert bundle.adjustments == ("sentencepiece prefix space: first (legacy=false)",)
    assert bundle.tokenizer.encode("Hello world", add_special_tokens=False).ids == [15043, 3186]
    ids = bundle.tokenizer.encode("<|user|>\nHi<|end|>", add_special_tokens=False).ids
    assert ids == [32010, bundle.tokenizer.token_to_id("Hi"), 32007]  # not "▁Hi"
    assert (bundle.vocab_size, bundle.eos_token_id, bundle.bos_token_id) == (32011, 32000, 1)
    assert bundle.add_bos_token is False and bundle.chat_template.startswith("{% for message")
    phi2 = load_tokenizer(str(shared_data / "tokenizers" / "phi-2"))
    assert phi2.adjustments == () and phi2.chat_template is None
    assert phi2.tokenizer.encode("Hello world").ids == [15496, 995]
