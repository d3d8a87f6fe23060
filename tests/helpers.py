"""Helpers shared by test modules (no fixtures: those live in ``conftest.py``).

* paths: :data:`REPO`, :data:`SHARED_DATA`;
* in-memory data: :func:`make_spill`, :func:`write_jsonl`, :func:`conversation` (at
  :data:`CHAT_REF`), :func:`span_texts` and :func:`small_profile`;
* packing and reading back a finished output folder: :class:`PackOutput`,
  :func:`check_pack_output`, :func:`pack_demo_into`;
* the pinned fixture packs: :data:`FIXTURE_PACKS`, :func:`pack_fixture`, :func:`decoded_pins`,
  :func:`compare_decoded`, :func:`compare_files`, :func:`pin_failure` (``tests/test_contract.py``,
  re-pinned by ``scripts/repin_fixtures.py``);
* hermetic tokenizers: :func:`build_tokenizer` (a tiny byte-level BPE with ChatML specials),
  :data:`WORD_VOCAB` (the word-level tokenizer's vocabulary), and the model-family imitations
  (:data:`FAMILIES`, :func:`byte_level_bpe`, :func:`sentencepiece_bpe`) described in
  ``tests/ingest/test_families.py``;
* preference packs: :func:`preference_rows` (hand-made rows of pairs and their ``branch``
  lists, for :func:`write_out`'s ``segment_columns``), :func:`add_branch_column` (a real pack
  turned into one with pairs);
* hostile inputs: :func:`run_capped` (a command in a fresh process under a memory, time and
  file-size cap), :func:`tree_state` (what a folder holds, to prove nothing outside OUT was
  written) and :class:`Canary` (a file outside OUT whose reading would show in its atime).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import platform
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
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

from packshard.ingest.types import Conversation, Message, Rendered
from packshard.pack.spill import Spill, SpillCounts
from packshard.records import IGNORE_INDEX, PackedRow, SourceRef

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("PACKSHARD_SHARED_DATA") or REPO.parent / "shared" / "data")
"""The real tokenizers and datasets (outside the repository); PACKSHARD_SHARED_DATA moves it."""
SHARED_SKIP = "real third-party data not found at"
"""How a test that needs :data:`SHARED_DATA` starts its skip reason (counted at the end)."""


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
    # first position of each example id and of each (shard, row), built on the first lookup: a
    # list.index per example made checking a pack of n examples O(n^2)
    _where: dict[Any, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _first(self, values: list[Any], value: Any) -> int:
        if not self._where:
            for key, column in (("example", self.examples["example_id"]), ("row", self.row_place)):
                for i, v in enumerate(column):
                    self._where.setdefault((key, v), i)
        key = "example" if values is self.examples["example_id"] else "row"
        i = self._where.get((key, value))
        if i is None or i >= len(values) or values[i] != value:  # changed since: look again
            return values.index(value)
        return i

    def segment(self, example_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(input_ids, labels, position_ids)`` of one example, found via the index."""
        i = self._first(self.examples["example_id"], example_id)
        shard, row = self.examples["shard"][i], self.examples["row"][i]
        packed = self.rows[self._first(self.row_place, (shard, row))]
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
    names = {"manifest.json", "examples.parquet", "rejects.jsonl", "README.md"}
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
    config = PackConfig.build(
        inputs=(str(data),), tokenizer=str(tokenizer), out=str(root / "out"), **settings
    )  # type: ignore[arg-type]
    pack_dataset(config)
    return root / "out"


def pack_rows(
    root: Path, rows: list[Any], tokenizer: Path, name: str = "in.jsonl", **options: object
) -> Path:
    """Write ``rows`` to ``root/name`` and pack them into ``root/out`` (ChatML, 256 tokens)."""
    from packshard.pack import PackConfig, pack_dataset

    data = write_jsonl(root / name, rows)
    settings: dict[str, object] = {"max_seq_len": 256, "template": "chatml", **options}
    config = PackConfig.build(
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


# --- work units and engines --------------------------------------------------------------------


def scale_inputs(folder: Path) -> list[Path]:
    """Inputs that exercise every kind of unit: a JSONL cut into many byte ranges (with blank
    lines, broken lines, an overlong record and a BOM on its first line), a Parquet file of
    several row groups and a JSON array read whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packshard.demo import demo_data_path

    folder.mkdir(parents=True, exist_ok=True)
    demo = [line for line in demo_data_path().read_text(encoding="utf-8").splitlines() if line]
    long = {"messages": [msg("user", "hi " * 300), msg("assistant", "ok " * 300)]}
    lines = [*demo, "", "{broken", json.dumps(long), "", *demo, "[1, 2]", *demo]
    chat = folder / "chat.jsonl"
    chat.write_bytes(b"\xef\xbb\xbf" + "".join(x + "\n" for x in lines).encode())
    values = [json.loads(x) for x in demo if x.startswith("{") and _is_json(x)]
    rows = folder / "rows.parquet"
    table = pa.table({"messages": [v.get("messages") for v in values if "messages" in v]})
    pq.write_table(table, rows, row_group_size=4)
    array = folder / "array.json"
    array.write_text(json.dumps(values[:10]), encoding="utf-8")
    return [chat, rows, array]


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def output_digests(out: Path) -> dict[str, str]:
    """SHA-256 of every file of a packed folder except the manifest (which has a timestamp)."""
    import hashlib

    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.iterdir())
        if p.name != "manifest.json"
    }


def cores_task(_: object) -> int:
    """An engine task returning the cores its worker may use."""
    from packshard.engine import worker_cores

    return worker_cores()


def slow_square(value: int) -> int:
    """An engine task that finishes later the smaller its argument (completion order reversed)."""
    import time

    time.sleep(0.05 * (4 - value))
    return value * value


def flaky_task(arg: tuple[str, int, str]) -> str:
    """An engine task that fails its first ``times`` attempts (``kind``: crash, raise, usage).

    Attempts are counted in files under ``folder``, so the count holds across processes.
    """
    import os

    from packshard.errors import UsageError

    folder, times, kind = arg
    attempt = len(os.listdir(folder))
    Path(folder, f"attempt-{attempt}").touch()
    if attempt < times:
        if kind == "crash":
            os._exit(3)
        if kind == "usage":
            raise UsageError("bad option (use --good)")
        raise OSError(f"flaky disk, attempt {attempt + 1}")
    return f"done after {attempt + 1}"


# --- trainers: a pack whose examples can be told apart, a tiny Llama, the fed-loss probe ------

MARKER = 300
"""Every example of :func:`pack_marked_examples` starts with its own token ``w{MARKER + k}``."""


def pack_marked_examples(
    root: Path, tokenizer: Path, examples: int = 58, **options: object
) -> Path:
    """Pack prompt/completion examples (word tokenizer) whose first token names them.

    Example ``k`` is ``w{300 + k}`` and 2-9 prompt words (no loss), then 2-8 completion words
    and EOS (trained).  58 examples pack into 16 rows of at most 48 tokens, 3 shards.
    """
    from packshard.pack import PackConfig, pack_dataset

    rng = np.random.default_rng(0)
    records = []
    for k in range(examples):
        prompt = [f"w{MARKER + k}"] + [
            f"w{w}" for w in rng.integers(2, MARKER, rng.integers(2, 10))
        ]
        answer = [f"w{w}" for w in rng.integers(2, MARKER, rng.integers(2, 9))]
        records.append({"prompt": " ".join(prompt), "completion": " " + " ".join(answer)})
    data = write_jsonl(root / "marked.jsonl", records)
    config = PackConfig.build(
        inputs=(str(data),),
        tokenizer=str(tokenizer),
        out=str(root / "out"),
        max_seq_len=48,
        shard_rows=6,
        **options,
    )  # type: ignore[arg-type]
    pack_dataset(config)
    return root / "out"


def tiny_llama(seed: int = 0) -> Any:
    """A random 2-layer Llama (hidden 32, SDPA, fp32, no KV cache) over the word vocabulary."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        use_cache=False,
        attn_implementation="sdpa",
    )
    return transformers.LlamaForCausalLM(config)


def marked_examples(out: Path) -> dict[int, tuple[Any, Any]]:
    """``marker -> (input_ids, labels)`` of every example of a marked pack, read from its rows."""
    from packshard.torch import PackedDataset

    data, found = PackedDataset(out), {}
    for i in range(len(data)):
        row = data[i]
        cu = row["cu_seqlens"].tolist()
        for lo, hi in itertools.pairwise(cu):
            found[int(row["input_ids"][lo])] = (row["input_ids"][lo:hi], row["labels"][lo:hi])
    return found


class LossProbe:
    """Compares the loss of every batch a trainer feeds with its examples' loss, each alone.

    As a forward hook (``hook=True``) it reads the batch and the loss the model computed; a
    loop of its own calls :meth:`compare` with the batch's real tokens and its loss.  A record
    holds the examples found (by their marker tokens, each checked equal to the packed
    example), ``fed`` (the batch's token-mean loss as the trainer computed it), ``alone``
    (the token mean of the same examples run one by one) and ``naive`` (the same tokens run as
    one sequence: the leak a lost seam causes, the live control).
    """

    def __init__(self, model: Any, examples: dict[int, tuple[Any, Any]], hook: bool = True):
        self.model, self.examples, self.records, self.busy = model, examples, [], False
        if hook:
            model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if self.busy or not module.training:
            return
        ids, labels, mask = kwargs["input_ids"], kwargs["labels"], kwargs.get("attention_mask")
        keep = mask.bool() if mask is not None and mask.dim() == 2 else ids >= 0
        count = int((labels[..., 1:] != IGNORE_INDEX).sum())
        items = kwargs.get("num_items_in_batch")  # the trainer divides the sum by it
        fed = float(output.loss.detach()) * (float(items) / count if items is not None else 1.0)
        self.compare(ids[keep], labels[keep], fed)

    def compare(self, ids: Any, labels: Any, fed: float) -> dict[str, Any]:
        """Record one batch: its real tokens (flat), labels, and the loss the trainer got."""
        import torch

        self.busy = True
        try:
            with torch.no_grad():
                starts = [*(ids >= MARKER).nonzero().flatten().tolist(), len(ids)]
                markers, total, count = [], 0.0, 0
                for lo, hi in itertools.pairwise(starts):
                    marker = int(ids[lo])
                    tokens, targets = self.examples[marker]
                    assert torch.equal(ids[lo:hi].cpu(), tokens), f"example {marker} was altered"
                    s, c = self._loss_sum(tokens, targets)
                    markers, total, count = [*markers, marker], total + s, count + c
                naive_sum, naive_count = self._loss_sum(ids, labels, positions=True)
        finally:
            self.busy = False
        record = {
            "markers": markers,
            "fed": fed,
            "alone": total / count,
            "naive": naive_sum / naive_count,
        }
        self.records.append(record)
        return record

    def _loss_sum(self, ids: Any, labels: Any, positions: bool = False) -> tuple[float, int]:
        import torch
        import torch.nn.functional as F

        extra = {"position_ids": torch.arange(len(ids))[None]} if positions else {}
        logits = self.model(input_ids=ids[None], use_cache=False, **extra).logits[0].float()
        targets = labels[1:]
        loss = F.cross_entropy(logits[:-1], targets, ignore_index=IGNORE_INDEX, reduction="sum")
        return float(loss), int((targets != IGNORE_INDEX).sum())


def epochs_of(records: list[dict[str, Any]], epochs: int) -> list[list[int]]:
    """The example markers of each epoch of a run's records (equal steps per epoch)."""
    steps = len(records) // epochs
    return [
        [m for r in records[e * steps : (e + 1) * steps] for m in r["markers"]]
        for e in range(epochs)
    ]


def run_two_processes(fn: Any, *args: Any) -> None:
    """Run ``fn(rank, *args)`` in two forked processes set up for a gloo process group.

    Forking keeps the imports already made (trainers take seconds to import); each process
    gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and a free ``MASTER_PORT``, as torchrun
    gives them.  A failure in either is raised here with its traceback.
    """
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(_ranked, args=(port, fn, args), nprocs=2, start_method="fork")


def _ranked(rank: int, port: int, fn: Any, args: tuple[Any, ...]) -> None:
    import os
    import sys

    import torch

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    state = sys.modules.get("accelerate.state")
    if state is not None:  # forked: an accelerate state of the parent would be stale here
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()
    fn(rank, *args)


# --- hand-made output folders for the reader ---------------------------------------------------

TOKENIZER_BYTES = b'{"model": "fixture tokenizer"}'
TOKENIZER_SHA = hashlib.sha256(TOKENIZER_BYTES).hexdigest()


def make_row(lengths: list[int], first_example: int, rng: np.random.Generator) -> PackedRow:
    """A contract row: random tokens, prompt half unlabelled, first label of a segment -100."""
    n = sum(lengths)
    ids = rng.integers(5, 1000, size=n, dtype=np.int32)
    labels = ids.copy()
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    positions = np.concatenate([np.arange(k, dtype=np.int32) for k in lengths])
    for lo, k in zip(cu[:-1], lengths, strict=True):
        labels[lo : lo + max(1, k // 2)] = IGNORE_INDEX
    return PackedRow(
        input_ids=ids,
        labels=labels,
        position_ids=positions,
        cu_seqlens=cu,
        example_ids=np.arange(first_example, first_example + len(lengths), dtype=np.int64),
    )


def write_out(
    out: Path,
    shards: list[list[PackedRow]],
    *,
    max_seq_len: int = 64,
    version: int = 1,
    position_policy: str | None = None,
    segment_columns: dict[str, list[list[int]]] | None = None,
    vocab_size: int = 1 << 20,
) -> Path:
    """Write a contract-compliant OUT folder (shards + manifest) from hand-made rows.

    ``segment_columns`` adds per-segment int8 list columns (``branch``, ``kto_label``), one
    list per row over all shards in order.
    """
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    first = 0
    for k, rows in enumerate(shards):
        extra = {
            name: pa.array(values[first : first + len(rows)], type=pa.list_(pa.int8()))
            for name, values in (segment_columns or {}).items()
        }
        first += len(rows)
        cols = {
            name: pa.array(
                [getattr(r, name).tolist() for r in rows],
                type=pa.list_(pa.int64() if name == "example_ids" else pa.int32()),
            )
            for name in ("input_ids", "labels", "position_ids", "cu_seqlens", "example_ids")
        }
        cols["num_tokens"] = pa.array([r.num_tokens for r in rows], pa.int32())
        cols["num_loss_tokens"] = pa.array(
            [int((r.labels != IGNORE_INDEX).sum()) for r in rows], pa.int32()
        )
        cols["max_seqlen"] = pa.array([int(np.diff(r.cu_seqlens).max()) for r in rows], pa.int32())
        cols |= extra
        meta = {
            b"packshard.format_version": str(version).encode(),
            b"packshard.dataset_id": b"f0f0f0f0f0f0f0f0",
        }
        table = pa.table(cols).replace_schema_metadata(meta)
        name = f"shard-{k:05d}.parquet"
        pq.write_table(table, out / name, row_group_size=3, compression="zstd")
        entries.append(
            {
                "path": name,
                "rows": len(rows),
                "tokens": sum(r.num_tokens for r in rows),
                "loss_tokens": int(sum(cols["num_loss_tokens"].to_pylist())),
                "bytes": (out / name).stat().st_size,
                "sha256": hashlib.sha256((out / name).read_bytes()).hexdigest(),
            }
        )
    manifest = {
        "format_version": version,
        "dataset_id": "f0f0f0f0f0f0f0f0",
        "config": {"max_seq_len": max_seq_len}
        | ({"position_ids": position_policy} if position_policy else {}),
        "tokenizer": {
            "path": "tokenizer.json",
            "sha256": TOKENIZER_SHA,
            "vocab_size": vocab_size,
            "bos_token_id": None,
            "eos_token_id": None,
            "pad_token_id": None,
        },
        "shards": entries,
        "stats": {"rows": sum(e["rows"] for e in entries)},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2))
    return out


def fixture_rows(num_rows: int, seed: int = 0) -> list[PackedRow]:
    rng = np.random.default_rng(seed)
    rows, next_id = [], 0
    for _ in range(num_rows):
        lengths = rng.integers(1, 12, size=int(rng.integers(1, 5))).tolist()
        rows.append(make_row(lengths, next_id, rng))
        next_id += len(lengths)
    return rows


# --- exports: the (context -> target) pairs a trainer trains on --------------------------------


def trained_pairs(out: Path) -> Counter:
    """Every trained pair of a packed folder: (the segment's tokens before t, token t).

    Label ``t`` of a segment ``[s, e)`` trains the prediction of ``input_ids[t]`` from
    ``input_ids[s:t]`` (attention inside the segment, positions from 0).
    """
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    pairs: Counter = Counter()
    for entry in manifest["shards"]:
        for row in pq.read_table(out / entry["path"]).to_pylist():
            ids, labels, cu = row["input_ids"], row["labels"], row["cu_seqlens"]
            for s, e in itertools.pairwise(cu):
                for t in range(s + 1, e):
                    if labels[t] != IGNORE_INDEX:
                        pairs[(tuple(ids[s:t]), ids[t])] += 1
    return pairs


# --- fixture packs and their pins (see tests/test_contract.py and tests/fixtures/contract) ------

FIXTURES = REPO / "tests" / "fixtures" / "contract"
PINS = FIXTURES / "pins.json"
FIXTURE_FILES = (
    "demo_chat.jsonl",
    "edge.jsonl",
    "tokenizer/tokenizer.json",
    "tokenizer/tokenizer_config.json",
)
FIXTURE_INPUTS = ("demo_chat.jsonl", "edge.jsonl")
FIXTURE_OPTIONS: dict[str, Any] = {"max_seq_len": 128, "shard_rows": 8, "template": "chatml"}
FIXTURE_PACKS: dict[str, dict[str, Any]] = {
    "bfd-drop": {"strategy": "bfd", "overlong": "drop"},
    "bfd-truncate": {"strategy": "bfd", "overlong": "truncate"},
    "bfd-split": {"strategy": "bfd", "overlong": "split"},
    "ffd-drop": {"strategy": "ffd", "overlong": "drop"},
    "ffd-truncate": {"strategy": "ffd", "overlong": "truncate"},
    "ffd-split": {"strategy": "ffd", "overlong": "split"},
    # wrapped cuts every example at row ends: --overlong does not apply (recorded as split)
    "wrapped": {"strategy": "wrapped", "overlong": "split"},
    # the template of tokenizer_config.json: no generation blocks, labels from character spans
    "bfd-split-config-template": {"strategy": "bfd", "overlong": "split", "template": None},
}
SEGMENT_COLUMNS = ("input_ids", "labels", "position_ids")  # one digest per segment
ROW_COLUMNS = ("cu_seqlens", "example_ids")  # kept as they are: they name the segments
REPIN = "make repin"


def pack_fixture(name: str, out: Path) -> Path:
    """Pack the fixture inputs with pack ``name``'s options into ``out``.

    Runs from the fixture folder with relative paths, so the examples index (which records
    each input as given) is the same bytes wherever the repository lies.
    """
    from packshard.pack import PackConfig, pack_dataset

    options = {**FIXTURE_OPTIONS, **FIXTURE_PACKS[name]}
    config = PackConfig.build(inputs=FIXTURE_INPUTS, tokenizer="tokenizer", out=str(out), **options)
    before = Path.cwd()
    os.chdir(FIXTURES)
    try:
        pack_dataset(config)
    finally:
        os.chdir(before)
    return out


def segment_digest(values: np.ndarray) -> str:
    """Eight hex digits of SHA-256 over the values as little-endian int64 (any stored dtype)."""
    return hashlib.sha256(np.asarray(values, dtype="<i8").tobytes()).hexdigest()[:8]


def decoded_pins(out: Path) -> dict[str, Any]:
    """What the pins hold of a pack: per row the segment map and per-segment digests.

    ``rows``: one entry per stored row in shard order, ``at`` (``shard-00000.parquet row 3``),
    ``cu_seqlens`` and ``example_ids`` as stored, and for each of :data:`SEGMENT_COLUMNS` the
    space-separated digests of its segments; ``rejects``: ``source:line code`` of each line of
    rejects.jsonl; ``files``: SHA-256 of the shards and the examples index.
    """
    import pyarrow.parquet as pq

    from packshard.digests import sha256_path

    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    rows: list[dict[str, Any]] = []
    for entry in manifest["shards"]:
        table = pq.read_table(out / entry["path"])
        cells = {}
        for column in (*ROW_COLUMNS, *SEGMENT_COLUMNS):
            lists = table[column].combine_chunks()
            offsets = np.asarray(lists.offsets, dtype=np.int64)
            values = np.asarray(lists.values, dtype=np.int64)
            cells[column] = [values[a:b] for a, b in itertools.pairwise(offsets)]
        for r in range(table.num_rows):
            cu = cells["cu_seqlens"][r]
            row: dict[str, Any] = {"at": f"{entry['path']} row {r}"}
            row.update({c: [int(v) for v in cells[c][r]] for c in ROW_COLUMNS})
            for column in SEGMENT_COLUMNS:
                values = cells[column][r]
                digests = (segment_digest(values[a:b]) for a, b in itertools.pairwise(cu))
                row[column] = " ".join(digests)
            rows.append(row)
    rejects = [
        f"{r['source']}:{r['line']} {r['code']}"
        for r in map(json.loads, (out / "rejects.jsonl").read_text(encoding="utf-8").splitlines())
    ]
    files = {s["path"]: s["sha256"] for s in manifest["shards"]}
    files["examples.parquet"] = sha256_path(out / "examples.parquet")
    return {"rows": rows, "rejects": rejects, "files": files}


def example_places(out: Path) -> dict[int, str]:
    """``example_id`` → ``source:line part P`` from a pack's examples index."""
    import pyarrow.parquet as pq

    index = pq.read_table(out / "examples.parquet").to_pydict()
    return {
        eid: f"{src}:{line} part {part}"
        for eid, src, line, part in zip(
            index["example_id"], index["source"], index["line"], index["part"], strict=True
        )
    }


def compare_decoded(
    pinned: dict[str, Any], got: dict[str, Any], places: dict[int, str]
) -> list[str]:
    """One line per difference of the decoded columns, naming column, row and segment."""
    problems: list[str] = []
    if len(got["rows"]) != len(pinned["rows"]):
        problems.append(f"rows: {len(got['rows'])} stored, pinned {len(pinned['rows'])}")
    for want, have in zip(pinned["rows"], got["rows"], strict=False):
        where = have["at"]
        if want["at"] != where:
            problems.append(f"rows: {where} holds what was pinned at {want['at']}")
        cu, cu_pinned = have["cu_seqlens"], want["cu_seqlens"]
        same = len(cu) - 1
        if cu != cu_pinned:
            k = next(
                (i for i, (a, b) in enumerate(zip(cu, cu_pinned, strict=False)) if a != b),
                min(len(cu), len(cu_pinned)),
            )
            end = cu[k] if k < len(cu) else "nowhere"
            end_pinned = cu_pinned[k] if k < len(cu_pinned) else "nowhere"
            problems.append(
                f"cu_seqlens: {where} segment {k - 1} ends at {end}, pinned {end_pinned} "
                f"(cu_seqlens {cu}, pinned {cu_pinned})"
            )
            same = k - 1
        ids, ids_pinned = have["example_ids"], want["example_ids"]
        for s, (a, b) in enumerate(zip(ids, ids_pinned, strict=False)):
            if a != b:
                problems.append(f"example_ids: {where} segment {s} holds example {a}, pinned {b}")
                break
        for column in SEGMENT_COLUMNS:
            digests, digests_pinned = have[column].split(), want[column].split()
            for s in range(min(same, len(digests), len(digests_pinned))):
                if digests[s] != digests_pinned[s]:
                    eid = ids[s]
                    problems.append(
                        f"{column}: {where} segment {s} (example {eid}, "
                        f"{places.get(eid, 'not in the index')}, tokens {cu[s]}..{cu[s + 1] - 1}"
                        f"): digest {digests[s]}, pinned {digests_pinned[s]}"
                    )
    if got["rejects"] != pinned["rejects"]:
        gone = [r for r in pinned["rejects"] if r not in got["rejects"]]
        new = [r for r in got["rejects"] if r not in pinned["rejects"]]
        problems.append(f"rejects: new {new or 'none'}, no longer {gone or 'none'}")
    return problems


def compare_files(pinned: dict[str, str], got: dict[str, str]) -> list[str]:
    """One line per file whose SHA-256 differs from the pinned one."""
    return [
        f"{name}: SHA-256 {str(got.get(name, 'absent'))[:16]}, pinned "
        f"{str(pinned.get(name, 'absent'))[:16]}"
        for name in sorted(set(pinned) | set(got))
        if pinned.get(name) != got.get(name)
    ]


def pins_environment() -> dict[str, Any]:
    """The versions pins are made (and compared) with: packshard, Python and the libraries."""
    from packshard import __version__
    from packshard.format.environment import CONTENT_LIBRARIES, library_versions

    return {
        "packshard": __version__,
        "python": platform.python_version(),
        "libraries": library_versions((*CONTENT_LIBRARIES, "transformers")),
    }


def moved_versions(made_with: dict[str, Any]) -> list[str]:
    """``name pinned → now`` for each version that differs from the pins' (empty: none)."""
    now = pins_environment()
    moved = [
        f"{name} {made_with['libraries'].get(name)} → {version}"
        for name, version in now["libraries"].items()
        if made_with["libraries"].get(name) != version
    ]
    for key in ("packshard", "python"):
        if made_with.get(key) != now[key]:
            moved.append(f"{key} {made_with.get(key)} → {now[key]}")
    return moved


def pin_failure(
    what: str, name: str, problems: list[str], made_with: dict[str, Any], note: str = ""
) -> str:
    """The message of a moved pin: what moved, the versions that changed, how to re-pin.

    ``note`` (a line on what the differences mean) comes before the differences.
    """
    moved = moved_versions(made_with)
    versions = ", ".join(moved) if moved else "none (the code or the fixtures changed)"
    shown = problems[:20] + ([f"… and {len(problems) - 20} more"] if len(problems) > 20 else [])
    count = f"{len(problems)} difference{'' if len(problems) == 1 else 's'}"
    return (
        f"fixture pack {name}: {what} moved ({count}); versions changed since pinning: "
        f"{versions}. If the change is intended, run `{REPIN}` and say why in the commit.\n  "
        + "\n  ".join([note] * bool(note) + shown)
    )


def format_pins(pins: dict[str, Any]) -> str:
    """The pin file's text: indented JSON with one line per row, so diffs show rows."""
    packs = {}
    for name, pack in pins["packs"].items():
        packs[name] = {**pack, "rows": f"@rows:{name}@"}
    text = json.dumps({**pins, "packs": packs}, indent=2, ensure_ascii=False)
    for name, pack in pins["packs"].items():
        lines = ",\n".join("        " + json.dumps(row, ensure_ascii=False) for row in pack["rows"])
        text = text.replace(f'"@rows:{name}@"', "[\n" + lines + "\n      ]")
    return text + "\n"


# --- reasoning: a template shaped like Qwen3's, and records that exercise it ----------------

# Same structure as the Qwen3 release template (own wording): reasoning from a field or an
# inline block, rendered only for turns after the last user message (and an empty block on a
# last turn that has none), tool calls after the answer, the header outside the turn.
THINK = r"""{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {%- set ns.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for m in messages %}
    {%- if m.role == 'assistant' %}
        {%- set answer = m.content %}
        {%- set thought = m.reasoning_content if m.reasoning_content is string else '' %}
        {%- if '</think>' in answer %}
            {%- set thought = answer.split('</think>')[0].split('<think>')[-1] %}
            {%- set answer = answer.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' }}
        {%- if loop.index0 > ns.last_user and (loop.last or thought) %}
            {{- '<think>\n' + thought.strip('\n') + '\n</think>\n\n' }}
        {%- endif %}
        {{- answer }}
        {%- for call in m.tool_calls or [] %}
            {{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' }}
            {{- (call.function.arguments | tojson) + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def call(city: str, ident: str = "c1") -> list[dict[str, Any]]:
    """An OpenAI ``tool_calls`` list asking get_weather for ``city``."""
    function = {"name": "get_weather", "arguments": {"city": city}}
    return [{"id": ident, "type": "function", "function": function}]


def user(text: str, **fields: Any) -> dict[str, Any]:
    return msg("user", text, **fields)


def answer(text: str | None, **fields: Any) -> dict[str, Any]:
    return msg("assistant", text, **fields)


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"messages": list(messages), **fields}


TOOL = msg("tool", '{"temp": 21}', tool_call_id="c1")
# Single and multi turn, reasoning fields and inline blocks, tool calls, empty reasoning,
# weight 0 and train flags, history reasoning a template drops, pieces found twice (the probe).
REASONING_CHAT = [
    chat(user("2+2?"), answer("It is 4.", reasoning_content="Add 2 and 2.")),
    chat(user("2+2?"), answer("<think>\nAdd 2 and 2.\n</think>\n\nIt is 4.")),
    chat(
        msg("system", "Be brief."),
        user("2+2?"),
        answer("It is 4.", reasoning_content="Add."),
        user("3+3?"),
        answer("It is 6.", reasoning_content="Add again."),
    ),
    chat(
        user("2+2?"),
        answer("<think>\nAdd.\n</think>\n\nIt is 4."),
        user("3+3?"),
        answer("<think>\nAdd again.\n</think>\n\nIt is 6."),
    ),
    chat(
        user("Weather in Paris?"),
        answer(None, reasoning_content="Call the tool.", tool_calls=call("Paris")),
        TOOL,
        answer("It is 21 degrees.", reasoning_content="The tool says 21."),
        tools=[WEATHER_TOOL],
    ),
    chat(
        user("Weather in Paris?"),
        answer("Let me check.", reasoning_content="Call it.", tool_calls=call("Paris")),
        TOOL,
        answer("21 degrees."),
        tools=[WEATHER_TOOL],
    ),
    chat(
        user("Paris?"),
        answer(None, reasoning_content="Call.", tool_calls=call("Paris")),
        TOOL,
        answer("21.", reasoning_content="Read."),
        user("And Rome?"),
        answer(None, tool_calls=call("Rome", "c2")),
        msg("tool", '{"temp": 25}', tool_call_id="c2"),
        answer("25.", reasoning_content="Read again."),
        tools=[WEATHER_TOOL],
    ),
    chat(user("Hi"), answer("Hello!", reasoning_content="")),
    chat(user("Hi"), answer("Hello!")),
    chat(user("Hi"), answer("Hello!"), user("Bye"), answer("Bye!")),
    chat(
        user("2+2?"),
        answer("It is 4.", reasoning_content="Add.", weight=0),
        user("3+3?"),
        answer("It is 6.", reasoning_content="Add again."),
    ),
    chat(
        user("2+2?"),
        answer("<think>\nAdd.\n</think>\n\nIt is 4.", weight=1),
        user("3+3?"),
        answer("<think>Add again.</think>It is 6.", weight=0),
        user("4+4?"),
        answer("<think>\n\nDouble.\n\n</think>\n\n\nIt is 8."),
    ),
    chat(user("2+2?"), answer("\n\nIt is 4.", reasoning_content="\nAdd.\n")),
    chat(user("2+2?"), answer("It is 4.", reasoning_content="Add."), user("thanks")),
    chat(
        user("2+2?"),
        answer("4", reasoning_content="Add."),
        user("3+3?"),
        answer("6", reasoning_content="Add again.", weight=0),
    ),
    chat(
        user("Say ok twice."),
        answer("ok", reasoning_content="Say ok."),
        user("again: ok"),
        answer("ok", reasoning_content="Say ok."),
    ),
    chat(user("Think: Add."), answer("It is 4.", reasoning_content="Add.")),
]


def rendered_spans(record: dict[str, Any], template: Any, bundle: Any, **options: Any) -> list:
    """Render ``record`` as ingest does: per example its text, trained spans and reasoning."""
    from packshard.ingest.label.spans import render_examples
    from packshard.ingest.normalize import normalize_record
    from packshard.ingest.types import IngestOptions, RawRecord
    from packshard.records import SourceRef

    conv = normalize_record(RawRecord(SourceRef("t.jsonl", 2), "t", record))
    rendered = render_examples(conv, template, bundle, IngestOptions(**options))
    return [(r.text, r.spans, r.reasoning, r.reasoning_dropped) for r in rendered]


# --- where each message's content sits: an oracle independent of the labelling tiers ---------


def content_places(template: Any, text: str, messages: list, tools: Any, variables: dict) -> dict:
    """Where each message's content sits in ``text``: ``{index: (lo, hi)}``.

    The conversation is rendered once more with every content replaced by a stand-in
    (``\ue000<i>\ue001``); each stand-in's place, shifted by the length differences before
    it, is the content's place.  When that does not give the text, contents are searched for
    in order (exact, then stripped); a message not found is left out.
    """
    from packshard.errors import TemplateError
    from packshard.ingest.template.render import render_chat

    probe = [
        m if m.get("tool_calls") and not m["content"] else {**m, "content": f"\ue000{i}\ue001"}
        for i, m in enumerate(messages)
    ]
    found: dict[int, tuple[int, int]] = {}
    try:
        probe_text, _ = render_chat(template, probe, tools, variables)
    except TemplateError:
        probe_text = None
    shift = 0
    for match in re.finditer("\ue000([0-9]+)\ue001", probe_text or ""):
        i = int(match.group(1))
        content = messages[i]["content"] if i < len(messages) else None
        lo = match.start() + shift
        if content is None or i in found or text[lo : lo + len(content)] != content:
            probe_text, found = None, {}
            break
        found[i] = (lo, lo + len(content))
        shift += len(content) - len(match.group())
    if probe_text is not None:
        return found
    pos = 0
    for i, message in enumerate(messages):
        for needle in (message["content"], message["content"].strip()):
            if needle and (lo := text.find(needle, pos)) >= 0:
                found[i] = (lo, lo + len(needle))
                pos = lo + len(needle)
                break
    return found


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


# --- preference pairs: rows as a preference pack holds them ------------------------------------


def preference_rows(
    layouts: list[list[tuple[int, ...]]], seed: int = 0, vocab: int = 120
) -> tuple[list[PackedRow], list[list[int]]]:
    """Hand-made preference rows and their per-segment ``branch`` lists.

    Each row is a list of items: ``(prompt, chosen, rejected)`` token counts make a pair (two
    adjacent segments sharing the prompt, chosen first, labels only on the answer), ``(n,)``
    a plain segment (first half unlabelled).  Token ids are random in ``[5, vocab)``.
    """
    rng = np.random.default_rng(seed)
    rows, branches, next_id = [], [], 0
    for layout in layouts:
        segs: list[tuple[np.ndarray, np.ndarray]] = []
        branch: list[int] = []
        for item in layout:
            if len(item) == 1:
                ids = rng.integers(5, vocab, size=item[0])
                labels = ids.copy()
                labels[: max(1, item[0] // 2)] = IGNORE_INDEX
                segs.append((ids, labels))
                branch.append(0)
                continue
            prompt = rng.integers(5, vocab, size=item[0])
            for code, length in ((1, item[1]), (2, item[2])):
                answer = rng.integers(5, vocab, size=length)
                ids = np.concatenate([prompt, answer])
                labels = np.concatenate([np.full(len(prompt), IGNORE_INDEX), answer])
                segs.append((ids, labels))
                branch.append(code)
        lengths = [len(ids) for ids, _ in segs]
        rows.append(
            PackedRow(
                input_ids=np.concatenate([i for i, _ in segs]).astype(np.int32),
                labels=np.concatenate([lab for _, lab in segs]).astype(np.int32),
                position_ids=np.concatenate([np.arange(k) for k in lengths]).astype(np.int32),
                cu_seqlens=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
                example_ids=np.arange(next_id, next_id + len(segs), dtype=np.int64),
            )
        )
        branches.append(branch)
        next_id += len(segs)
    return rows, branches


def pair_branches(segments: int) -> list[int]:
    """Segments paired in order (1, 2, 1, 2, …), a last odd one plain."""
    return [1 + (j % 2) if j < segments - segments % 2 else 0 for j in range(segments)]


def add_branch_column(out: Path) -> None:
    """Turn a real pack into one with pairs: a branch column in every shard, manifest updated."""
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["shards"]:
        path = out / entry["path"]
        table = pq.read_table(path)
        branches = [pair_branches(len(e)) for e in table["example_ids"].to_pylist()]
        table = table.append_column("branch", pa.array(branches, pa.list_(pa.int8())))
        pq.write_table(table, path)
        entry["bytes"] = path.stat().st_size
        entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2))


def rehash(out: Path, name: str) -> None:
    """Record ``out/name``'s new SHA-256 and size in the manifest, as a forger would."""
    from packshard.digests import sha256_path

    manifest = json.loads((out / "manifest.json").read_text())
    path = out / name
    for entry in [*manifest["shards"], *manifest.get("files", {}).values()]:
        if entry.get("path") == name:
            entry.update(sha256=sha256_path(path), bytes=path.stat().st_size)
    (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2))


def pack_from(root: Path, tokenizer: Path, *args: Any) -> Any:
    """Run ``packshard pack`` in-process from ``root`` (paths in ``args`` relative to it).

    Reference backends, so that stderr holds only what the run itself says.
    """
    from click.testing import CliRunner

    from packshard.cli.commands import main

    argv = ["pack", "-t", str(tokenizer), "--max-seq-len", "16", "--no-progress", *map(str, args)]
    argv += ["--backend", "reference"]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        return CliRunner().invoke(main, argv, prog_name="packshard", catch_exceptions=False)
    finally:
        os.chdir(cwd)


def reject_lines(out: Path) -> list[tuple[int, str, str]]:
    """Return ``(line, code, reason)`` of every line of ``out/rejects.jsonl``."""
    lines = (out / "rejects.jsonl").read_text(encoding="utf-8").splitlines()
    return [(r["line"], r["code"], r["reason"]) for r in map(json.loads, lines)]
