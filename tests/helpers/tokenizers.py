"""Hermetic tokenizers: the tiny ChatML BPE, the word-level vocabulary, the family imitations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from tests.helpers.templates import ECHO, GEMMA, LLAMA3, MISTRAL, QWEN

# --- hermetic tokenizers -----------------------------------------------------------------------

WORD_VOCAB = {"<eos>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, 500)}}
"""The word-level tokenizer's vocabulary: token ``wN`` has id N, ``<eos>`` id 0."""

TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_CORPUS = [
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
        special_tokens=TINY_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TINY_CORPUS, trainer=trainer)
    if post_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
        )
    tok.save(str(folder / "tokenizer.json"))
    if config is None:
        config = {"eos_token": "<|endoftext|>", "pad_token": {"content": "<|endoftext|>"}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


# --- model-family imitations (see tests/ingest/test_families.py) -------------------------------

FAMILY_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "say yes please, yes or no? Sure, here it is.",
    "What is the weather in Paris today? It is sunny and 21 degrees.",
    "hello world user assistant system tool model",
    "get_weather city Paris temperature unit celsius",
    "You are a helpful assistant. Answer briefly.",
] * 5
# The split expression of GPT-4-style byte-level tokenizers (Llama 3 uses it).
WORD_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's splits digits one by one (transformers 5 rebuilds its pre-tokenizer with it).
DIGIT_SPLIT = WORD_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
HIGH_IDS = 70_000  # every learned token of the llama3 imitation sits above this id


# --- tokenizers --------------------------------------------------------------------------------


def byte_level_bpe(split: str | None, offset: int = 0) -> Tokenizer:
    """A byte-level BPE (``split``: a pre-split expression); learned ids start at ``offset``."""
    tok = Tokenizer(models.BPE())
    if split:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])  # fmt: skip
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(FAMILY_CORPUS, trainer=trainer)
    if offset:
        spec = json.loads(tok.to_str())
        vocab = {f"<unused_{i}>": i for i in range(offset)}
        vocab.update({t: i + offset for t, i in spec["model"]["vocab"].items()})
        spec["model"]["vocab"] = vocab
        tok = Tokenizer.from_str(json.dumps(spec))
    return tok


def sentencepiece_bpe(prefix: str, specials: list[str]) -> Tokenizer:
    """A SentencePiece-style BPE with byte fallback, converted the way transformers does.

    ``prefix``: ``"prepend"`` (``Prepend("▁") + Replace`` normalizer, Llama 2 / Mistral v0.1),
    ``"metaspace"`` (Metaspace pre-tokenizer, newer conversions) or ``"none"`` (Gemma: only
    spaces replaced).  Ids: specials first, then ``<0x00>``…``<0xFF>``, then merges.
    """
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False)
    tok.train_from_iterator(FAMILY_CORPUS, trainer=trainer)
    spec = json.loads(tok.to_str())
    learned = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {s: i for i, s in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in learned:
        vocab.setdefault(piece, len(vocab))
    spec["model"]["vocab"] = vocab
    spec["added_tokens"] = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, s in enumerate(specials)
    ]  # fmt: skip
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    if prefix == "prepend":
        spec["normalizer"] = {
            "type": "Sequence",
            "normalizers": [{"type": "Prepend", "prepend": "▁"}, replace],
        }
        spec["pre_tokenizer"] = None
    elif prefix == "metaspace":
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {
            "type": "Metaspace",
            "replacement": "▁",
            "prepend_scheme": "first",
            "split": False,
        }
    else:
        spec["normalizer"] = replace
        spec["pre_tokenizer"] = None  # fmt: skip
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        *([{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix != "none" else []),
    ]}  # fmt: skip
    return Tokenizer.from_str(json.dumps(spec))


def bos_processor(tok: Tokenizer, bos: str) -> Any:
    bos_id = tok.token_to_id(bos)
    return processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )


def save_tokenizer(folder: Path, tok: Tokenizer, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def build_llama3(folder: Path, template_bos: bool = True) -> Path:
    tok = byte_level_bpe(WORD_SPLIT, offset=HIGH_IDS)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]  # fmt: skip
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.post_processor = processors.Sequence(
        [processors.ByteLevel(trim_offsets=False), bos_processor(tok, "<|begin_of_text|>")]
    )
    template = LLAMA3 if template_bos else LLAMA3.replace("{{- bos_token }}\n", "")
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
              "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
              "model_max_length": 131072}  # fmt: skip
    return save_tokenizer(folder, tok, config)


def build_qwen(folder: Path, template_file: bool = False) -> Path:
    """ChatML with tools; ``template_file``: the template in ``chat_template.jinja`` (the
    config keeps a stale one that must lose, as in ``transformers``)."""
    tok = byte_level_bpe(DIGIT_SPLIT)
    tok.add_special_tokens(
        [AddedToken(s, special=True, normalized=False)
         for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    )  # fmt: skip
    tok.add_tokens([AddedToken(s, special=False, normalized=False)
                    for s in ("<tool_call>", "</tool_call>")])  # fmt: skip
    config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "add_prefix_space": False, "tokenizer_class": "Qwen2Tokenizer",
              "chat_template": QWEN}  # fmt: skip
    if template_file:
        config["chat_template"] = "{{ raise_exception('stale template') }}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "chat_template.jinja").write_text(QWEN, encoding="utf-8")
    return save_tokenizer(folder, tok, config)


def build_sentencepiece(folder: Path, legacy: bool | None, prefix: str = "prepend",
                        template: str = MISTRAL) -> Path:  # fmt: skip
    tok = sentencepiece_bpe(prefix, ["<unk>", "<s>", "</s>"])
    tok.post_processor = bos_processor(tok, "<s>")
    config: dict[str, Any] = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "tokenizer_class": "LlamaTokenizer",
        "chat_template": template,
    }
    if legacy is not None:
        config["legacy"] = legacy  # fmt: skip
    return save_tokenizer(folder, tok, config)


def build_gemma(folder: Path, strict: bool = False) -> Path:
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    tok = sentencepiece_bpe("none", specials)
    tok.post_processor = bos_processor(tok, "<bos>")
    template = GEMMA.replace("strict", "true" if strict else "false")
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
              "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
              "tokenizer_class": "GemmaTokenizer", "chat_template": template}  # fmt: skip
    return save_tokenizer(folder, tok, config)


def build_echo(folder: Path) -> Path:
    tok = byte_level_bpe(None)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in
                            ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>",
                             "<|end|>")])  # fmt: skip
    config = {"eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast",
              "chat_template": ECHO}  # fmt: skip
    return save_tokenizer(folder, tok, config)
