r"""Ingest against tokenizers and chat templates shaped like the common model families.

Each family is imitated by a throwaway tokenizer trained here (a few sentences) with the
family's special tokens, ``tokenizer_config.json`` and a chat template written to follow the
structure of the family's public template (not its text):

=================  =========================================================================
family             what it exercises
=================  =========================================================================
llama3             byte-level BPE with ids above 65,535; BOS from ``{{ bos_token }}`` and a
                   TemplateProcessing post-processor; ``content | trim``; ``<|eot_id|>``;
                   tool calls rendered without the content
qwen               ChatML with a default system message, ``tools | tojson`` in ``<tools>``,
                   OpenAI-style ``tool_calls`` with ``content: null``, tool responses; also
                   with the template in ``chat_template.jinja`` (newer Hub folders)
mistral            SentencePiece (Prepend + Replace normalizer, byte fallback), ``legacy``
                   true and false; ``[INST]``; system folded into the first user turn;
                   ``raise_exception`` on bad alternation; ``</s>`` closes each answer
gemma              ``assistant`` shown as ``model``, ``<start_of_turn>``/``<end_of_turn>``,
                   ``<bos>`` in the template, system folded (or refused: gemma-strict)
echo               no generation tags and the answer also occurs inside the user's turn
llama2-metaspace   the newer SentencePiece conversion (Metaspace pre-tokenizer)
=================  =========================================================================

For every family: token ids equal ``transformers``' ``apply_chat_template(..., tokenize=True)``;
labels cover each assistant turn (its content, or its tool calls, plus the closing marker)
and nothing of system/user/tool text; ``pack`` + ``verify --model none`` pass; ``profile``
counts every record.
"""

from __future__ import annotations

import json
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

from packshard.errors import RecordError
from packshard.ingest.chunks import IngestOptions, ingest
from packshard.ingest.labels import encode_rendered
from packshard.ingest.normalize import normalize_record
from packshard.pack.pipeline import PackConfig, pack_dataset
from packshard.profile import profile_inputs
from packshard.records import IGNORE_INDEX, RawRecord, SourceRef
from packshard.format.shards import read_row
from packshard.ingest.sources import expand_inputs
from packshard.ingest.templates import load_template, locate_contents, render_example
from packshard.ingest.tokenizer import load_tokenizer
from packshard.verify.run import VerifyOptions, verify_dataset

transformers = pytest.importorskip("transformers")

CORPUS = [
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


def _byte_level(split: str | None, offset: int = 0) -> Tokenizer:
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
    tok.train_from_iterator(CORPUS, trainer=trainer)
    if offset:
        spec = json.loads(tok.to_str())
        vocab = {f"<unused_{i}>": i for i in range(offset)}
        vocab.update({t: i + offset for t, i in spec["model"]["vocab"].items()})
        spec["model"]["vocab"] = vocab
        tok = Tokenizer.from_str(json.dumps(spec))
    return tok


def _sentencepiece(prefix: str, specials: list[str]) -> Tokenizer:
    """A SentencePiece-style BPE with byte fallback, converted the way transformers does.

    ``prefix``: ``"prepend"`` (``Prepend("▁") + Replace`` normalizer, Llama 2 / Mistral v0.1),
    ``"metaspace"`` (Metaspace pre-tokenizer, newer conversions) or ``"none"`` (Gemma: only
    spaces replaced).  Ids: specials first, then ``<0x00>``…``<0xFF>``, then merges.
    """
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
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


def _bos_processor(tok: Tokenizer, bos: str) -> Any:
    bos_id = tok.token_to_id(bos)
    return processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )


def _save(folder: Path, tok: Tokenizer, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def build_llama3(folder: Path, template_bos: bool = True) -> Path:
    tok = _byte_level(WORD_SPLIT, offset=HIGH_IDS)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]  # fmt: skip
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.post_processor = processors.Sequence(
        [processors.ByteLevel(trim_offsets=False), _bos_processor(tok, "<|begin_of_text|>")]
    )
    template = LLAMA3 if template_bos else LLAMA3.replace("{{- bos_token }}\n", "")
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
              "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
              "model_max_length": 131072}  # fmt: skip
    return _save(folder, tok, config)


def build_qwen(folder: Path, template_file: bool = False) -> Path:
    """ChatML with tools; ``template_file``: the template in ``chat_template.jinja`` (the
    config keeps a stale one that must lose, as in ``transformers``)."""
    tok = _byte_level(DIGIT_SPLIT)
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
    return _save(folder, tok, config)


def build_sentencepiece(folder: Path, legacy: bool | None, prefix: str = "prepend",
                        template: str = MISTRAL) -> Path:  # fmt: skip
    tok = _sentencepiece(prefix, ["<unk>", "<s>", "</s>"])
    tok.post_processor = _bos_processor(tok, "<s>")
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
    return _save(folder, tok, config)


def build_gemma(folder: Path, strict: bool = False) -> Path:
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    tok = _sentencepiece("none", specials)
    tok.post_processor = _bos_processor(tok, "<bos>")
    template = GEMMA.replace("strict", "true" if strict else "false")
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
              "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
              "tokenizer_class": "GemmaTokenizer", "chat_template": template}  # fmt: skip
    return _save(folder, tok, config)


def build_echo(folder: Path) -> Path:
    tok = _byte_level(None)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in
                            ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>",
                             "<|end|>")])  # fmt: skip
    config = {"eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast",
              "chat_template": ECHO}  # fmt: skip
    return _save(folder, tok, config)


# --- records -----------------------------------------------------------------------------------


def _m(role: str, content: Any, **fields: Any) -> dict[str, Any]:
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
    {"messages": [_m("user", "What is the weather in Paris today?"),
                  _m("assistant", "It is sunny and 21 degrees.")]},
    {"messages": [_m("system", "You are a helpful assistant. Answer briefly."),
                  _m("user", "say yes"), _m("assistant", "yes"),
                  _m("user", "and no?"), _m("assistant", "no")]},
    {"conversations": [{"from": "human", "value": "hello world"},
                       {"from": "gpt", "value": "Sure, here it is."}],
     "system": "Answer briefly."},
    {"instruction": "say yes", "input": "please", "output": "yes"},
    {"messages": [_m("user", "  the quick brown fox  "),
                  _m("assistant", " jumps over\nthe dog \n")]},
    {"messages": [_m("user", "héllo wörld 你好"), _m("assistant", "你好! ✓ 🦊")]},
    {"messages": [_m("user", "yes"), _m("assistant", "yes")]},
]  # fmt: skip
TOOL_CHAT = [
    {"messages": [
        _m("user", "What is the weather in Paris?"),
        _m("assistant", None, tool_calls=[{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]),
        _m("tool", '{"temperature": 21}', tool_call_id="call_1", name="get_weather"),
        _m("assistant", "It is sunny and 21 degrees."),
    ], "tools": [WEATHER_TOOL]},
    {"messages": [_m("system", "Answer briefly."), _m("user", "hello world"),
                  _m("assistant", "hello")], "tools": [WEATHER_TOOL]},
]  # fmt: skip
BAD_ALTERNATION = {"messages": [_m("user", "hello"), _m("user", "world"), _m("assistant", "yes")]}
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


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {f.name: f.build(root / f.name) for f in FAMILIES}


def _squash(text: str) -> str:
    return "".join(text.split())


def _runs(labels: np.ndarray) -> list[tuple[int, int]]:
    trained = np.concatenate([[False], labels != IGNORE_INDEX, [False]])
    edges = np.flatnonzero(np.diff(trained.astype(np.int8)))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def _hf_ids(hf: Any, messages: list[dict[str, Any]], tools: Any) -> list[int]:
    out = hf.apply_chat_template(messages, tools=tools, tokenize=True,
                                 add_generation_prompt=False)  # fmt: skip
    if not isinstance(out, list):
        out = out["input_ids"]
    return [int(i) for i in out]


@pytest.mark.parametrize("name", list(BY_NAME))
def test_ids_and_labels_match_transformers(folders: dict[str, Path], name: str) -> None:
    family = BY_NAME[name]
    folder = folders[name]
    bundle = load_tokenizer(str(folder))
    template = load_template(None, bundle)
    assert template is not None
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    for line, record in enumerate(family.records, 1):
        conv = normalize_record(RawRecord(SourceRef("x.jsonl", line), "x", record))
        messages = [{"role": m.role, "content": m.content, **dict(m.extra)}
                    for m in conv.messages]  # fmt: skip
        given = record.get("messages", messages)
        rendered = render_example(conv, template, bundle, "auto")
        ids, labels, _ = encode_rendered(bundle, [rendered])
        where = f"{name} record {line}: {rendered.text!r}"
        assert ids.tolist() == _hf_ids(hf, given, record.get("tools")), where
        # labels: each assistant turn, then its closing marker; nothing else
        runs = [bundle.tokenizer.decode(ids[a:b].tolist(), skip_special_tokens=False)
                for a, b in _runs(labels)]  # fmt: skip
        expected = []
        for m in messages:
            if m["role"] != "assistant":
                continue
            if m.get("tool_calls"):
                call = m["tool_calls"][0]["function"]
                expected.append(("call", call["name"]))
            else:
                expected.append(("text", _squash(m["content"])))
        assert len(runs) == len(expected), where
        for run, (kind, what) in zip(runs, expected, strict=True):
            got = _squash(run)
            assert got.endswith(family.marker), where
            if kind == "text":
                assert got == what + family.marker, where
            else:
                assert what in got and got.startswith(("{", "<tool_call>")), where
        tools = list(conv.tools) if conv.tools else None
        places = locate_contents(template, rendered.text, messages, tools,
                                 bundle.special_tokens_map)  # fmt: skip
        enc = bundle.tokenizer.encode(rendered.text, add_special_tokens=False)
        offs = np.asarray(enc.offsets).reshape(-1, 2)
        for i, m in enumerate(messages):
            if m["role"] != "assistant" and i in places and m["content"].strip():
                lo, hi = places[i]
                hit = (labels != IGNORE_INDEX) & (offs[:, 1] > lo) & (offs[:, 0] < hi)
                assert not hit.any(), f"{where}: label on {m['role']} message {i + 1}"


def _shard_examples(packed: Any) -> dict[tuple[str, int], tuple[list[int], list[int]]]:
    """``(input_ids, labels)`` of every packed example, by ``(source, line)``."""
    out = {}
    ex = packed.examples
    for k in range(len(ex["example_id"])):
        ids, labels, _ = packed.segment(ex["example_id"][k])
        out[(ex["source"][k], ex["line"][k])] = (ids.tolist(), labels.tolist())
    return out


@pytest.mark.parametrize("name", list(BY_NAME))
def test_pack_verify_and_profile(folders: dict[str, Path], name: str, tmp_path: Path,
                                 make_jsonl: Any, check_pack: Any) -> None:  # fmt: skip
    family = BY_NAME[name]
    folder = str(folders[name])
    bad = [record for record, _, _ in family.rejected]
    data = make_jsonl(tmp_path / f"{name}.jsonl", [*family.records, *bad])
    out = tmp_path / "out"
    pack_dataset(PackConfig(inputs=(str(data),), tokenizer=folder, out=str(out), max_seq_len=1000,
                            shard_rows=1))  # fmt: skip
    packed = check_pack(out)
    stats = packed.manifest["stats"]
    assert (stats["records_packed"], stats["rejected"]) == (len(family.records), len(bad))
    for reject, (_, code, reason) in zip(packed.rejects, family.rejected, strict=True):
        assert reject["code"] == code and reason in reject["reason"], reject
    # what was packed is what ingest tokenized, ids of any size, labels unshifted
    bundle = load_tokenizer(folder)
    template = load_template(None, bundle)
    chunks = list(ingest(expand_inputs([str(data)]), bundle, template, IngestOptions()))
    shards = _shard_examples(packed)
    for chunk in chunks:
        for i, ref in enumerate(chunk.batch.refs):
            ids, labels = chunk.batch.example(i)
            got_ids, got_labels = shards[(ref.source, ref.line)]
            assert got_ids == ids.tolist()
            assert got_labels[1:] == labels[1:].tolist() and got_labels[0] == IGNORE_INDEX
    report = verify_dataset(out, VerifyOptions(model="none"))
    assert report.ok, [f.to_dict() for f in report.findings.items]
    expected_source = (
        str(folders[name] / "chat_template.jinja") if "file" in name else ("tokenizer_config.json")
    )
    assert packed.manifest["template"]["source"] == expected_source
    source = report.checks["source"]
    assert source["status"] == "passed" and source["examples_compared"] == len(family.records)
    profile = profile_inputs(expand_inputs([str(data)]), bundle, template, IngestOptions(), 1000)
    assert profile.total.records == len(family.records) + len(bad)
    assert profile.total.examples == len(family.records)


def test_llama3_ids_above_int16_survive_into_shards(
    folders: dict[str, Path], tmp_path: Path, make_jsonl: Any, check_pack: Any
) -> None:
    import pyarrow.parquet as pq

    folder = folders["llama3"]
    bundle = load_tokenizer(str(folder))
    assert bundle.vocab_size > 70_000 and bundle.eos_token_id > 65_535
    data = make_jsonl(tmp_path / "chat.jsonl", list(CHAT))
    out = tmp_path / "out"
    pack_dataset(PackConfig(inputs=(str(data),), tokenizer=str(folder), out=str(out),
                            max_seq_len=512))  # fmt: skip
    packed = check_pack(out)
    table = pq.read_table(out / packed.manifest["shards"][0]["path"])
    assert str(table.schema.field("input_ids").type) == "list<element: int32>"
    row = read_row(table, 0)
    assert row.input_ids.dtype == np.int32 and row.input_ids.min() >= HIGH_IDS
    assert bundle.tokenizer.token_to_id("<|begin_of_text|>") in row.input_ids.tolist()
    assert packed.manifest["tokenizer"]["eos_token_id"] == bundle.eos_token_id


# --- record shapes ------------------------------------------------------------------------------


def _normalize(record: dict[str, Any]) -> Any:
    return normalize_record(RawRecord(SourceRef("c.jsonl", 4), "c", record))


def test_openai_tool_turns_keep_their_fields() -> None:
    conv = _normalize(TOOL_CHAT[0])
    call, result = conv.messages[1], conv.messages[2]
    assert (call.role, call.content) == ("assistant", "")
    assert call.extra == (("tool_calls", TOOL_CHAT[0]["messages"][1]["tool_calls"]),)
    assert result.extra == (("tool_call_id", "call_1"), ("name", "get_weather"))
    assert conv.messages[0].extra == ()  # role and content only
    assert conv.tools == (WEATHER_TOOL,)


@pytest.mark.parametrize(
    ("turn", "code", "reason"),
    [
        (_m("assistant", None), "invalid_content", "messages[1] content is missing"),
        (_m("assistant", None, tool_calls=[]), "invalid_content", "messages[1] content is missing"),
        (_m("assistant", None, tool_calls="get_weather()"), "invalid_message",
         "messages[1] 'tool_calls' must be a list, got string"),
    ],
)  # fmt: skip
def test_null_content_needs_tool_calls(turn: dict[str, Any], code: str, reason: str) -> None:
    with pytest.raises(RecordError) as err:
        _normalize({"messages": [_m("user", "hi"), turn]})
    assert (err.value.code, err.value.reason) == (code, reason)


def test_tool_call_turn_a_template_cannot_place_is_rejected(folders: dict[str, Path]) -> None:
    """A template that renders the tool call only once the turn after it exists."""
    bundle = load_tokenizer(str(folders["qwen"]))
    lookahead = (
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content }}"
        "{% if not loop.last and messages[loop.index0 + 1].role == 'tool' %}<tool_call>x"
        "</tool_call>{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    )
    from packshard.ingest.templates import compile_template

    template = compile_template(lookahead, "lookahead.jinja")
    with pytest.raises(RecordError) as err:
        render_example(_normalize(TOOL_CHAT[0]), template, bundle, "auto")
    assert err.value.code == "template_error"
    assert err.value.reason.startswith("message 2 (assistant tool call) cannot be located")


def test_lone_surrogates_are_rejected_not_fatal(folders: dict[str, Path], tmp_path: Path,
                                                check_pack: Any) -> None:  # fmt: skip
    lines = [
        '{"messages": [{"role": "user", "content": "bad \\ud800"}, '
        '{"role": "assistant", "content": "ok"}]}',
        '{"text": "lone \\udfff"}',
        '{"domain": "d\\ud800", "messages": [{"role": "user", "content": "hi"}, '
        '{"role": "assistant", "content": "ok"}]}',
        '{"messages": [{"role": "user", "content": "fox \\ud83e\\udd8a"}, '
        '{"role": "assistant", "content": "ok"}]}',  # a surrogate pair is one character
    ]
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    pack_dataset(PackConfig(inputs=(str(data),), tokenizer=str(folders["qwen"]), out=str(out),
                            max_seq_len=256))  # fmt: skip
    packed = check_pack(out)
    assert packed.manifest["stats"]["records_packed"] == 1
    got = [(r["line"], r["domain"], r["code"], r["reason"]) for r in packed.rejects]
    assert got == [
        (1, "chat", "invalid_utf8", "rendered text holds a lone surrogate \\ud800 at character "
         "79 (a JSON escape that is not a Unicode character; fix the record)"),
        (2, "chat", "invalid_utf8", "rendered text holds a lone surrogate \\udfff at character "
         "5 (a JSON escape that is not a Unicode character; fix the record)"),
        (3, "chat", "invalid_utf8",
         "'domain' holds a lone surrogate ('d\\ud800'), which no output file can store"),
    ]  # fmt: skip


@pytest.mark.parametrize("name", list(BY_NAME))
def test_plain_records_match_plain_encoding(folders: dict[str, Path], name: str) -> None:
    """``text`` and plain prompt/completion records: what the tokenizer adds itself (BOS or
    not), the text, then EOS; the SentencePiece prefix space lands on the text, not the BOS."""
    bundle = load_tokenizer(str(folders[name]))
    hf = transformers.AutoTokenizer.from_pretrained(str(folders[name]))
    for text in ("hello world", " the lazy dog\n", "你好 🦊 yes"):
        conv = _normalize({"text": text})
        ids, labels, _ = encode_rendered(bundle, [render_example(conv, None, bundle, "auto")])
        expected = hf(text, add_special_tokens=True)["input_ids"] + [hf.eos_token_id]
        assert ids.tolist() == expected, (name, text)
        assert (labels == ids).all()
    conv = _normalize({"prompt": "say yes", "completion": " yes"})
    ids, labels, _ = encode_rendered(bundle, [render_example(conv, None, bundle, "auto")])
    expected = hf("say yes yes", add_special_tokens=True)["input_ids"] + [hf.eos_token_id]
    assert ids.tolist() == expected, name
    trained = bundle.tokenizer.decode(ids[labels != IGNORE_INDEX].tolist())
    assert trained.strip() == "yes" and labels[-1] == hf.eos_token_id
    assert labels[0] == IGNORE_INDEX
