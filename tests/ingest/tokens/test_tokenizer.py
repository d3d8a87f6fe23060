"""Tokenizer loading: special tokens, config fallbacks and the adjustments made on load."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from packshard.errors import TokenizerError
from packshard.ingest.tokens.tokenizer import load_tokenizer
from tests.helpers import FIXTURES, TINY_CORPUS, TINY_SPECIALS, build_tokenizer


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
    assert a.special_tokens == tuple(TINY_SPECIALS)
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
    assert len(bundle.tokenizer.encode(TINY_CORPUS[0]).ids) > 3
    assert "truncation and padding disabled" in bundle.adjustments


def test_eos_only_in_the_vocabulary_becomes_a_special_token(tmp_path: Path) -> None:
    folder = build_tokenizer(tmp_path / "t", {"eos_token": "he"})
    bundle = load_tokenizer(str(folder))
    he = bundle.tokenizer.token_to_id("he")
    assert he is not None and bundle.eos_token_id == he
    assert bundle.tokenizer.encode("the", add_special_tokens=False).ids[-1] == he
    assert any("eos_token" in note for note in bundle.adjustments)


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


def test_vocab_size_covers_ids_above_the_entry_count() -> None:
    """The fixture tokenizer skips ids: 1,027 entries, the largest id 100,002."""
    bundle = load_tokenizer(str(FIXTURES / "tokenizer"))
    assert bundle.tokenizer.get_vocab_size(with_added_tokens=True) == 1027
    assert bundle.tokenizer.token_to_id("<|im_end|>") == 100_002 == bundle.eos_token_id
    assert bundle.vocab_size == 100_003
    assert bundle.manifest_entry()["vocab_size"] == 100_003
