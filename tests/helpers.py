"""Helpers shared by test modules (no fixtures: those live in ``conftest.py``).

* paths: :data:`REPO`, :data:`SHARED_DATA`;
* in-memory data: :func:`make_spill`, :func:`write_jsonl`, :func:`conversation` (at
  :data:`CHAT_REF`), :func:`span_texts` and :func:`small_profile`;
* packing and reading back a finished output folder: :class:`PackOutput`,
  :func:`check_pack_output`, :func:`pack_demo_into`;
* hermetic tokenizers: :func:`build_tokenizer` (a tiny byte-level BPE with ChatML specials),
  :data:`WORD_VOCAB` (the word-level tokenizer's vocabulary), and the model-family imitations
  (:data:`FAMILIES`, :func:`byte_level_bpe`, :func:`sentencepiece_bpe`) described in
  ``tests/ingest/test_families.py``;
* hostile inputs: :func:`run_capped` (a command in a fresh process under a memory, time and
  file-size cap), :func:`tree_state` (what a folder holds, to prove nothing outside OUT was
  written) and :class:`Canary` (a file outside OUT whose reading would show in its atime).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
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

from packshard.pack.spill import Spill, SpillCounts
from packshard.records import IGNORE_INDEX, Conversation, Message, Rendered, SourceRef

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


# --- in-memory data ----------------------------------------------------------------------------


def make_spill(labels: list[list[int]]) -> Spill:
    """An in-memory spill whose example i has tokens 100*i + k and the given labels."""
    n = len(labels)
    lengths = [len(lab) for lab in labels]
    tokens = np.concatenate([[], *(100 * i + np.arange(k) for i, k in enumerate(lengths))])
    flat = np.array([v for lab in labels for v in lab], dtype=np.int32)
    trained = [sum(v != IGNORE_INDEX for v in lab[1:]) for lab in labels]
    zeros = np.zeros(n, dtype=np.int32)
    return Spill(
        tokens=tokens.astype(np.int32),
        labels=flat,
        offsets=np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
        loss_tokens=np.array(trained, dtype=np.int32),
        source_index=zeros,
        lines=np.arange(1, n + 1, dtype=np.int64),
        parts=zeros,
        starts=np.zeros(n, dtype=np.int64),
        domain_codes=zeros,
        truncated=np.zeros(n, dtype=bool),
        record_ids=np.arange(n, dtype=np.int64),
        format_codes=np.zeros(n, dtype=np.int8),
        counts=SpillCounts(
            sources=("mem.jsonl",),
            domains=("mem",),
            formats=("text",),
            records_per_source=(n,),
            records_per_domain=(n,),
            tokens_in_per_domain=(sum(lengths),),
        ),
    )


CHAT_REF = SourceRef("chat.jsonl", 7)


def conversation(
    *turns: tuple[str, str], fmt: str = "messages", start: int | None = None, tools: Any = None
) -> Conversation:
    """A chat :class:`Conversation` at :data:`CHAT_REF` from ``(role, content)`` turns."""
    msgs = tuple(Message(role, content) for role, content in turns)
    return Conversation(CHAT_REF, "d", fmt, msgs, tools, start)


def span_texts(rendered: Rendered) -> list[str]:
    """The text of each trained span of a rendered example."""
    return [rendered.text[a:b] for a, b in rendered.spans]


def small_profile() -> Any:
    """A hand-checkable profile: chat [5 2 1], code [12 3], "<script>" only rejects; L = 8."""
    from packshard.profile import profile_lengths

    lengths = np.array([5, 12, 2, 3, 1])
    codes = np.array([0, 1, 0, 1, 0])
    loss = np.array([2, 6, 1, 1, 0])
    return profile_lengths(
        lengths, loss, codes, ["chat", "code"], {"<script>": 2, "chat": 1}, 8, batch_size=3
    )


def write_jsonl(path: Path, records: list[Any]) -> Path:
    """Write one JSON value per line (strings are written verbatim, for broken lines)."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# --- a finished pack, read back and checked ----------------------------------------------------


@dataclass
class PackOutput:
    """A finished pack, read back: manifest, rows per shard, examples index, rejects."""

    out: Path
    manifest: dict[str, Any]
    rows: list[Any]  # PackedRow, in shard order then row order
    row_place: list[tuple[int, int]]  # (shard, row) of each entry of ``rows``
    examples: dict[str, list[Any]]  # examples.parquet as columns
    rejects: list[dict[str, Any]]

    def segment(self, example_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(input_ids, labels, position_ids)`` of one example, found via the index."""
        i = self.examples["example_id"].index(example_id)
        shard, row = self.examples["shard"][i], self.examples["row"][i]
        packed = self.rows[self.row_place.index((shard, row))]
        j = int(np.flatnonzero(packed.example_ids == example_id)[0])
        lo, hi = int(packed.cu_seqlens[j]), int(packed.cu_seqlens[j + 1])
        return packed.input_ids[lo:hi], packed.labels[lo:hi], packed.position_ids[lo:hi]

    def records(self) -> dict[tuple[str, int], list[int]]:
        """Example ids per record ``(source, line)``, in part order."""
        out: dict[tuple[str, int], list[tuple[int, int]]] = {}
        ex = self.examples
        for k, eid in enumerate(ex["example_id"]):
            out.setdefault((ex["source"][k], ex["line"][k]), []).append((ex["part"][k], eid))
        return {key: [eid for _, eid in sorted(parts)] for key, parts in out.items()}


def check_pack_output(out: Path) -> PackOutput:
    """Read ``out`` and check every property of the shard contract that needs no source."""
    import pyarrow.parquet as pq

    from packshard.digests import sha256_path
    from packshard.format.manifest import schema_errors
    from packshard.format.shards import read_row
    from packshard.records import PackedRow

    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert schema_errors(manifest) == []
    stats = manifest["stats"]
    max_seq_len = manifest["config"]["max_seq_len"]
    dataset_meta = {
        b"packshard.format_version": b"1",
        b"packshard.dataset_id": manifest["dataset_id"].encode(),
    }
    # counting rule, in total and per domain
    assert stats["records"] == stats["records_packed"] + stats["rejected"] + stats["dropped"]
    assert stats["records"] == sum(i["records"] for i in manifest["inputs"])
    for key in ("records", "records_packed", "rejected", "dropped", "examples", "tokens"):
        assert sum(d[key] for d in stats["domains"].values()) == stats[key], key
    for d in stats["domains"].values():
        assert d["records"] == d["records_packed"] + d["rejected"] + d["dropped"]
    rejects_text = (out / "rejects.jsonl").read_text(encoding="utf-8")
    rejects = [json.loads(line) for line in rejects_text.splitlines()]
    assert len(rejects) == stats["rejected"] + stats["dropped"]
    assert Counter(r["code"] for r in rejects) == Counter(stats["rejects_by_code"])
    for reject in rejects:
        assert sorted(reject) == ["code", "domain", "line", "reason", "source"]
    # files and shards against the manifest
    names = {"manifest.json", "examples.parquet", "rejects.jsonl"}
    names |= {s["path"] for s in manifest["shards"]}
    assert {p.name for p in out.iterdir()} == names
    for entry in manifest["files"].values():
        assert sha256_path(out / entry["path"]) == entry["sha256"]
    rows: list[PackedRow] = []
    place: list[tuple[int, int]] = []
    for k, entry in enumerate(manifest["shards"]):
        path = out / entry["path"]
        assert sha256_path(path) == entry["sha256"]
        assert path.stat().st_size == entry["bytes"]
        table = pq.read_table(path)
        meta = table.schema.metadata
        assert {key: meta[key] for key in dataset_meta} == dataset_meta
        assert table.num_rows == entry["rows"]
        assert sum(table["num_tokens"].to_pylist()) == entry["tokens"]
        assert sum(table["num_loss_tokens"].to_pylist()) == entry["loss_tokens"]
        for r in range(table.num_rows):
            row = read_row(table, r)
            cu = row.cu_seqlens
            assert cu[0] == 0 and cu[-1] == row.num_tokens <= max_seq_len
            assert np.all(np.diff(cu) > 0)
            assert len(row.example_ids) == row.num_segments
            assert np.all(row.labels[cu[:-1]] == IGNORE_INDEX)
            trained = row.labels != IGNORE_INDEX
            assert np.array_equal(row.labels[trained], row.input_ids[trained])
            seg_len = np.diff(cu)
            expect_pos = np.arange(row.num_tokens) - np.repeat(cu[:-1], seg_len)
            assert np.array_equal(row.position_ids, expect_pos)
            assert table["num_tokens"][r].as_py() == row.num_tokens
            assert table["num_loss_tokens"][r].as_py() == int(trained.sum())
            assert table["max_seqlen"][r].as_py() == int(seg_len.max())
            rows.append(row)
            place.append((k, r))
    assert stats["rows"] == len(rows)
    assert stats["tokens"] == sum(r.num_tokens for r in rows)
    assert stats["loss_tokens"] == sum(int((r.labels != IGNORE_INDEX).sum()) for r in rows)
    assert stats["lower_bound_rows"] == -(-stats["tokens"] // max_seq_len)
    if rows:
        assert stats["fill_rate"] == pytest.approx(
            stats["tokens"] / (len(rows) * max_seq_len), abs=5e-7
        )
    else:
        assert stats["fill_rate"] == 0.0
    # the examples index: one row per segment, ids 0..n-1, pointing at the right row, and
    # the same packshard metadata as the shards
    examples_table = pq.read_table(out / "examples.parquet")
    meta = examples_table.schema.metadata
    assert {key: meta[key] for key in dataset_meta} == dataset_meta
    examples = examples_table.to_pydict()
    n = stats["examples"]
    assert examples["example_id"] == list(range(n))
    assert sorted(int(e) for r in rows for e in r.example_ids) == list(range(n))
    # the loss block: what --loss resolved to, and every packed example under one policy
    loss = manifest["loss"]
    assert loss["option"] == manifest["config"]["loss"]
    assert sum(loss["examples_by_policy"].values()) == n
    assert set(loss["examples_by_policy"]) <= set(loss["by_format"].values())
    output = PackOutput(out, manifest, rows, place, examples, rejects)
    for k in range(n):
        ids, labels, _ = output.segment(k)
        assert len(ids) == examples["num_tokens"][k]
        assert int((labels != IGNORE_INDEX).sum()) == examples["num_loss_tokens"][k]
    return output


def pack_demo_into(root: Path, tokenizer: Path, **options: object) -> Path:
    """Pack a private copy of the embedded demo chats into ``root/out`` and return it.

    The data file is copied under ``root`` so the manifest records an absolute path that
    stays valid (and private to the caller) for the source check.
    """
    from packshard.demo import demo_data_path
    from packshard.pack import PackConfig, pack_dataset

    data = root / "data" / "demo_chat.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(demo_data_path(), data)
    settings: dict[str, object] = {"max_seq_len": 256, "template": "chatml", "shard_rows": 4}
    settings.update(options)
    config = PackConfig(
        inputs=(str(data),), tokenizer=str(tokenizer), out=str(root / "out"), **settings
    )  # type: ignore[arg-type]
    pack_dataset(config)
    return root / "out"


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

# --- templates (same structure as each family's, own wording) --------------------------------

LLAMA3 = r"""{{- bos_token }}
{%- for message in messages %}
    {%- if message.tool_calls is defined %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
        {%- set call = message.tool_calls[0].function %}
        {{- '{"name": "' + call.name + '", "parameters": ' + (call.arguments | tojson) + '}' }}
        {{- '<|eot_id|>' }}
    {%- elif message.role == 'tool' %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
    {%- else %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' }}
        {{- message.content | trim }}
        {{- '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

QWEN = r"""{%- set default_system = 'You are a helpful assistant.' %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {{- messages[0].content if messages[0].role == 'system' else default_system }}
    {{- '\n\n# Tools\n\nThe functions you may call are listed in <tools></tools>:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nReply to call one with <tool_call></tool_call> holding '
        '{"name": ..., "arguments": ...}.<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\n' + default_system + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first)
          or (message.role == 'assistant' and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for call in message.tool_calls %}
            {%- if call.function is defined %}
                {%- set call = call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' + call.name + '", "arguments": ' }}
            {{- call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

MISTRAL = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system = messages[0]['content'] %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set system = '' %}
    {%- set turns = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in turns %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate '
                            'user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system %}
            {{- '[INST] ' + system + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- else %}
        {{- ' ' + message['content'] + eos_token }}
    {%- endif %}
{%- endfor %}
"""

GEMMA = r"""{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- if strict %}
        {{- raise_exception('System role not supported') }}
    {%- endif %}
    {%- set preamble = messages[0]['content'] + '\n\n' %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set preamble = '' %}
    {%- set turns = messages %}
{%- endif %}
{%- for message in turns %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate '
                            'user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}
    {{- '<start_of_turn>' + role + '\n' + (preamble if loop.first else '') }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<start_of_turn>model\n' }}
{%- endif %}
"""

ECHO = r"""{%- for message in messages %}
    {{- '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|assistant|>\n' }}
{%- endif %}
"""

LLAMA2 = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system = '<<SYS>>\n' + messages[0]['content'] + '\n<</SYS>>\n\n' %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set system = '' %}
    {%- set turns = messages %}
{%- endif %}
{%- for message in turns %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate '
                            'user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {{- bos_token + '[INST] ' + (system if loop.first else '') }}
        {{- message['content'] | trim }}
        {{- ' [/INST]' }}
    {%- else %}
        {{- ' ' + message['content'] | trim + ' ' + eos_token }}
    {%- endif %}
{%- endfor %}
"""

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


# --- records -----------------------------------------------------------------------------------


def msg(role: str, content: Any, **fields: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **fields}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}  # fmt: skip
CHAT = [
    {"messages": [msg("user", "What is the weather in Paris today?"),
                  msg("assistant", "It is sunny and 21 degrees.")]},
    {"messages": [msg("system", "You are a helpful assistant. Answer briefly."),
                  msg("user", "say yes"), msg("assistant", "yes"),
                  msg("user", "and no?"), msg("assistant", "no")]},
    {"conversations": [{"from": "human", "value": "hello world"},
                       {"from": "gpt", "value": "Sure, here it is."}],
     "system": "Answer briefly."},
    {"instruction": "say yes", "input": "please", "output": "yes"},
    {"messages": [msg("user", "  the quick brown fox  "),
                  msg("assistant", " jumps over\nthe dog \n")]},
    {"messages": [msg("user", "héllo wörld 你好"), msg("assistant", "你好! ✓ 🦊")]},
    {"messages": [msg("user", "yes"), msg("assistant", "yes")]},
]  # fmt: skip
TOOL_CHAT = [
    {"messages": [
        msg("user", "What is the weather in Paris?"),
        msg("assistant", None, tool_calls=[{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]),
        msg("tool", '{"temperature": 21}', tool_call_id="call_1", name="get_weather"),
        msg("assistant", "It is sunny and 21 degrees."),
    ], "tools": [WEATHER_TOOL]},
    {"messages": [msg("system", "Answer briefly."), msg("user", "hello world"),
                  msg("assistant", "hello")], "tools": [WEATHER_TOOL]},
]  # fmt: skip
BAD_ALTERNATION = {
    "messages": [msg("user", "hello"), msg("user", "world"), msg("assistant", "yes")]
}
ALTERNATION = "Conversation roles must alternate user/assistant/user/assistant/..."


@dataclass(frozen=True)
class Family:
    """A tokenizer imitation, the records it must handle, and how its turns close."""

    name: str
    build: Any
    marker: str  # what closes an assistant turn (its last trained token)
    records: tuple[dict[str, Any], ...]
    rejected: tuple[tuple[dict[str, Any], str, str], ...] = ()  # record, code, reason part
    options: dict[str, Any] = field(default_factory=dict)


FAMILIES = [
    Family("llama3", build_llama3, "<|eot_id|>", (*CHAT, *TOOL_CHAT)),
    Family("llama3-postprocessor-bos", lambda p: build_llama3(p, template_bos=False),
           "<|eot_id|>", tuple(CHAT)),
    Family("qwen", build_qwen, "<|im_end|>", (*CHAT, *TOOL_CHAT)),
    Family("qwen-template-file", lambda p: build_qwen(p, template_file=True), "<|im_end|>",
           (*CHAT, *TOOL_CHAT)),
    Family("mistral-legacy", lambda p: build_sentencepiece(p, legacy=True), "</s>", tuple(CHAT),
           ((BAD_ALTERNATION, "template_error", ALTERNATION),)),
    Family("mistral", lambda p: build_sentencepiece(p, legacy=False), "</s>", tuple(CHAT),
           ((BAD_ALTERNATION, "template_error", ALTERNATION),)),
    Family("llama2-metaspace",
           lambda p: build_sentencepiece(p, legacy=False, prefix="metaspace", template=LLAMA2),
           "</s>", tuple(CHAT), ((BAD_ALTERNATION, "template_error", ALTERNATION),)),
    Family("gemma", build_gemma, "<end_of_turn>", tuple(CHAT),
           ((BAD_ALTERNATION, "template_error", ALTERNATION),)),
    Family("gemma-strict", lambda p: build_gemma(p, strict=True), "<end_of_turn>",
           tuple(r for r in CHAT if "system" not in json.dumps(r)),
           ((CHAT[1], "template_error", "System role not supported"),)),
    Family("echo", build_echo, "<|end|>", tuple(CHAT)),
]  # fmt: skip
BY_NAME = {f.name: f for f in FAMILIES}


# --- hostile inputs: capped runs, untouched trees, canaries ------------------------------------

CAPPED_MEMORY = 3 << 30
"""Address space a capped run may use: enough for packshard, far too little for any bomb."""
CLI = "import sys; from packshard.cli.commands import main; sys.argv[0] = 'packshard'; main()"


def run_capped(
    args: list[Any],
    cwd: Path,
    *,
    code: str = CLI,
    memory: int = CAPPED_MEMORY,
    seconds: float = 120,
    file_size: int | None = None,
) -> Any:
    """Run ``python -c code ARGS`` (the CLI by default) in a fresh process, capped.

    The address space is capped with ``RLIMIT_AS`` (a bomb fails with MemoryError instead of
    taking the machine), the run with a timeout (``subprocess.TimeoutExpired`` fails the test
    instead of hanging CI) and, with ``file_size``, every file written (``RLIMIT_FSIZE``: a
    write past it fails as on a full disk).
    """
    import os
    import resource
    import signal
    import subprocess
    import sys

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        if file_size is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    env = {**os.environ, "RAYON_NUM_THREADS": "2", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", code, *(str(a) for a in args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds,
        preexec_fn=cap,
        check=False,
    )


def tree_state(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every entry below ``root`` (hidden ones too): kind, size and mtime in nanoseconds."""
    import os
    import stat

    state = {}
    for path in sorted(root.rglob("*")):
        info = os.lstat(path)
        kind = "dir" if stat.S_ISDIR(info.st_mode) else "file"
        size = 0 if kind == "dir" else info.st_size
        state[str(path.relative_to(root))] = (kind, size, info.st_mtime_ns)
    return state


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Paths added, removed or modified between two :func:`tree_state` snapshots."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


class Canary:
    """A file outside OUT that nothing may read: its atime is set far in the past.

    ``read`` tells whether it was read since (file systems mounted ``noatime`` cannot tell:
    :attr:`works` is False there and the check is a no-op).
    """

    def __init__(self, path: Path, text: str = "canary\n") -> None:
        import os

        self.path = path
        path.write_text(text)
        os.utime(path, (0, path.stat().st_mtime))
        probe = path.with_name(path.name + ".probe")
        probe.write_text("probe")
        os.utime(probe, (0, probe.stat().st_mtime))
        probe.read_text()
        self.works = probe.stat().st_atime > 0
        probe.unlink()

    @property
    def read(self) -> bool:
        """True when the canary was read since it was made."""
        return self.works and self.path.stat().st_atime > 0
