r"""Ingest against tokenizers and chat templates shaped like the common model families.

Each family is imitated by a throwaway tokenizer (built in :mod:`tests.helpers` from a few
sentences) with the family's special tokens, ``tokenizer_config.json`` and a chat template
written to follow the structure of the family's public template (not its text):

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

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packshard.errors import RecordError
from packshard.format.shards import read_row
from packshard.ingest.label.spans import render_example
from packshard.ingest.normalize import normalize_record
from packshard.ingest.read.sources import expand_inputs
from packshard.ingest.stream import ingest
from packshard.ingest.template.render import load_template
from packshard.ingest.tokens.labels import encode_rendered
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import IngestOptions, RawRecord
from packshard.pack import PackConfig, pack_dataset
from packshard.profile import ProfileConfig, profile_inputs
from packshard.records import IGNORE_INDEX, SourceRef
from packshard.verify.run import VerifyOptions, verify_dataset
from tests.helpers import (
    BY_NAME,
    CHAT,
    FAMILIES,
    HIGH_IDS,
    TOOL_CHAT,
    WEATHER_TOOL,
    content_places,
    msg,
)

transformers = pytest.importorskip("transformers")


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
        places = content_places(template, rendered.text, messages, tools,
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
    config = PackConfig.build(
        inputs=(str(data),), tokenizer=folder, out=str(out), max_seq_len=1000, shard_rows=1
    )
    pack_dataset(config)
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
    files = expand_inputs([str(data)])
    profile = profile_inputs(files, ProfileConfig((), str(folder), 1000))
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
    pack_dataset(PackConfig.build(inputs=(str(data),), tokenizer=str(folder), out=str(out),
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
        (msg("assistant", None), "invalid_content", "messages[1] content is missing"),
        (msg("assistant", None, tool_calls=[]), "invalid_content",
         "messages[1] content is missing"),
        (msg("assistant", None, tool_calls="get_weather()"), "invalid_message",
         "messages[1] 'tool_calls' must be a list, got string"),
    ],
)  # fmt: skip
def test_null_content_needs_tool_calls(turn: dict[str, Any], code: str, reason: str) -> None:
    with pytest.raises(RecordError) as err:
        _normalize({"messages": [msg("user", "hi"), turn]})
    assert (err.value.code, err.value.reason) == (code, reason)


def test_tool_call_turn_a_template_cannot_place_is_rejected(folders: dict[str, Path]) -> None:
    """A template that renders the tool call only once the turn after it exists."""
    bundle = load_tokenizer(str(folders["qwen"]))
    lookahead = (
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content }}"
        "{% if not loop.last and messages[loop.index0 + 1].role == 'tool' %}<tool_call>x"
        "</tool_call>{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    )
    from packshard.ingest.template.render import compile_template

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
    pack_dataset(PackConfig.build(inputs=(str(data),), tokenizer=str(folders["qwen"]), out=str(out),
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
