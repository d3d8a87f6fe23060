"""Token ids and assistant masks equal Hugging Face transformers' on the real shared data.

For every shared tokenizer and chat dataset: ``apply_chat_template(..., tokenize=True)`` ids
equal ours; where the template has ``{% generation %}`` blocks, our labels equal its
``return_assistant_tokens_mask``; no label falls on system/user/tool text; and decoding each
run of labelled tokens gives back an assistant message's content and its end marker.
The default run samples records (the first ``SAMPLE`` of each file plus the odd ones the data
README names); ``-m slow`` checks every record.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from packshard.ingest.label.spans import render_example, render_examples
from packshard.ingest.normalize import normalize_record
from packshard.ingest.read.sources import expand_inputs, read_records
from packshard.ingest.template.render import CHATML, compile_template, load_template
from packshard.ingest.tokens.labels import encode_rendered
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import Conversation, IngestOptions, Message, RawRecord
from packshard.records import IGNORE_INDEX, SourceRef
from tests.helpers import REASONING_CHAT, content_places

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.shared_data, pytest.mark.torch]
SAMPLE = 30


def _conversations(shared: Path, everything: bool) -> list[Conversation]:
    convs: list[Conversation] = []
    for f in expand_inputs([str(shared / "chat")]):
        records = list(read_records(f))
        if not everything:
            keep = set(range(SAMPLE))
            if "glaive" in f.path:  # the 11.6k-token record and some tool turns
                sizes = [len(json.dumps(r.value)) for r in records]
                keep.add(int(np.argmax(sizes)))
            if "openai" in f.path:  # no system message, no user turn, 26,000 characters
                keep.update(range(len(records)))
            records = [records[i] for i in sorted(keep) if i < len(records)]
        convs += [normalize_record(r) for r in records]
    return convs


@pytest.fixture(scope="module")
def tokenizers_(shared_data: Path):
    folder = shared_data / "tokenizers"
    out = {}
    for name in ("phi-3-mini", "phi-2"):
        path = str(folder / name)
        out[name] = (load_tokenizer(path), transformers.AutoTokenizer.from_pretrained(path))
    return out


def _ids(result) -> list[int]:
    ids = result["input_ids"] if not isinstance(result, list) else result
    return list(ids)


def _runs(labels: np.ndarray) -> list[tuple[int, int]]:
    trained = np.concatenate([[False], labels != IGNORE_INDEX, [False]])
    edges = np.flatnonzero(np.diff(trained.astype(np.int8)))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def _squash(text: str) -> str:
    return "".join(text.split())


def _check(name, template_spec, convs, tokenizers_) -> int:
    bundle, hf = tokenizers_[name]
    template = load_template(template_spec, bundle)
    hf_template = template.text
    end = "<|end|>" if name == "phi-3-mini" else "<|im_end|>"
    checked = 0
    for conv in convs:
        if not any(m.role == "assistant" for m in conv.messages):
            continue  # rejected as no_assistant_turn; nothing to compare
        messages = [{"role": m.role, "content": m.content} for m in conv.messages]
        tools = list(conv.tools) if conv.tools else None
        rendered = render_example(conv, template, bundle, "assistant")
        ids, labels, _ = encode_rendered(bundle, [rendered])
        out = hf.apply_chat_template(
            messages, tools=tools, chat_template=hf_template, tokenize=True,
            add_generation_prompt=False, return_dict=True,
            return_assistant_tokens_mask=template.has_generation,
        )  # fmt: skip
        where = f"{name} {template.source} {conv.ref}"
        assert ids.tolist() == _ids(out), where
        if template.has_generation:
            mask = np.asarray(out["assistant_masks"], dtype=bool)
            np.testing.assert_array_equal(labels != IGNORE_INDEX, mask, err_msg=where)
        enc = bundle.tokenizer.encode(rendered.text, add_special_tokens=False)
        offs = np.asarray(enc.offsets).reshape(-1, 2)
        trained = labels != IGNORE_INDEX
        places = content_places(template, rendered.text, messages, tools,
                                 bundle.special_tokens_map)  # fmt: skip
        for i, m in enumerate(messages):
            if m["role"] != "assistant" and i in places and m["content"].strip():
                lo, hi = places[i]
                hit = trained & (offs[:, 1] > lo) & (offs[:, 0] < hi)
                assert not hit.any(), f"{where}: label on {m['role']} message {i + 1}"
        runs = [bundle.tokenizer.decode(ids[a:b].tolist(), skip_special_tokens=False)
                for a, b in _runs(labels)]  # fmt: skip
        shown = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i in places]
        expected = [_squash(messages[i]["content"]) + end for i in shown]
        if expected and messages[-1]["role"] == "assistant" and name == "phi-3-mini":
            expected[-1] += "<|endoftext|>"
        got = [_squash(r).removeprefix("<|assistant|>") for r in runs]
        assert got == expected, where
        checked += 1
    return checked


CASES = [
    ("phi-3-mini", None),  # the config's template: offsets path
    ("phi-3-mini", "chat_template.training.jinja"),  # generation tags
    ("phi-2", "chatml"),  # no template of its own: the built-in ChatML
]


@pytest.mark.parametrize(("name", "spec"), CASES)
def test_parity_on_a_sample(shared_data, tokenizers_, name, spec) -> None:
    if spec and spec.endswith(".jinja"):
        spec = str(shared_data / "tokenizers" / name / spec)
    assert _check(name, spec, _conversations(shared_data, False), tokenizers_) > 200


@pytest.mark.slow
@pytest.mark.parametrize(("name", "spec"), CASES)
def test_parity_on_every_record(shared_data, tokenizers_, name, spec) -> None:
    if spec and spec.endswith(".jinja"):
        spec = str(shared_data / "tokenizers" / name / spec)
    assert _check(name, spec, _conversations(shared_data, True), tokenizers_) > 5000


def test_text_path_matches_plain_encoding(shared_data, tokenizers_) -> None:
    bundle, hf = tokenizers_["phi-2"]
    for conv in _conversations(shared_data, False)[:120]:
        text = "\n\n".join(m.content for m in conv.messages)
        plain = Conversation(conv.ref, conv.domain, "text", text=text)
        ids, labels, _ = encode_rendered(bundle, [render_example(plain, None, bundle, "auto")])
        expected = hf(text, add_special_tokens=True)["input_ids"] + [hf.eos_token_id]
        assert ids.tolist() == expected and (labels == ids).all()


def test_builtin_chatml_is_what_transformers_renders(tokenizers_) -> None:
    bundle, hf = tokenizers_["phi-2"]
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    text = hf.apply_chat_template(msgs, chat_template=CHATML, tokenize=False)
    conv = Conversation(SourceRef("x", 1), "d", "messages",
                        tuple(Message(m["role"], m["content"]) for m in msgs))  # fmt: skip
    assert render_example(conv, load_template("chatml", bundle), bundle, "auto").text == text


# --- reasoning: the shared Qwen3 tokenizer, its release template and TRL's training one -------


@pytest.fixture(scope="module")
def qwen3(shared_data):
    """The Qwen3 bundle, transformers on the same files (offline), and the three templates."""
    folder = shared_data / "tokenizers" / "qwen3"
    bundle = load_tokenizer(str(folder))
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    texts = {
        "release": config["chat_template"],
        "later": (folder / "chat_template.later_revision.jinja").read_text(encoding="utf-8"),
        "training": (folder / "chat_template.training.jinja").read_text(encoding="utf-8"),
    }
    return bundle, hf, texts


def _as_given(messages: list[dict]) -> list[dict]:
    """The record's messages as transformers takes them (a null content is an empty one)."""
    return [{**m, "content": "" if m["content"] is None else m["content"]} for m in messages]


def _reasoning_examples(bundle, template, options):
    """``(record, rendered)`` for every example of the reasoning test set."""
    out = []
    for line, record in enumerate(REASONING_CHAT, 1):
        conv = normalize_record(RawRecord(SourceRef("r.jsonl", line), "r", record))
        out += [(record, r) for r in render_examples(conv, template, bundle, options)]
    return out


@pytest.mark.parametrize("turns", ["as_rendered", "expand"])
@pytest.mark.parametrize("name", ["release", "later", "training"])
def test_qwen3_ids_equal_apply_chat_template(qwen3, name, turns) -> None:
    bundle, hf, texts = qwen3
    template = compile_template(texts[name], name)
    examples = _reasoning_examples(bundle, template, IngestOptions(turns=turns))
    assert len(examples) >= len(REASONING_CHAT)
    for record, rendered in examples:
        messages = record["messages"][: rendered.turn] if rendered.turn else record["messages"]
        out = hf.apply_chat_template(
            _as_given(messages),
            tools=record.get("tools"),
            chat_template=texts[name],
            tokenize=True,
            return_dict=True,
        )
        want = out["input_ids"]
        ids, _, _ = encode_rendered(bundle, [rendered])
        assert ids.tolist() == list(want), (name, turns, rendered.turn, rendered.text)


def tag_release(text: str) -> str:
    """A copy of the Qwen3 release template with each assistant turn's output tagged.

    The header ``<|im_start|>assistant\\n`` stays outside; the tags close after
    ``<|im_end|>`` (the line break after it is the next turn's).  Built from the shared
    template text at run time; each replacement must apply exactly as often as expected.
    """
    replacements = [
        (
            "{%- if loop.index0 > ns.last_query_index %}",
            "{{- '<|im_start|>' + message.role + '\\n' }}{%- generation %}"
            "{%- if loop.index0 > ns.last_query_index %}",
            1,
        ),
        (
            "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + ",
            "{{- '<think>\\n' + ",
            1,
        ),
        ("{{- '<|im_start|>' + message.role + '\\n' + content }}", "{{- content }}", 2),
        (
            "{{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}",
            "{{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}\n"
            '    {%- elif message.role == "tool" %}',
            1,
        ),
    ]
    for old, new, count in replacements:
        assert text.count(old) == count, old
        text = text.replace(old, new)
    return text


def _trained_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    return _runs(np.where(mask, 0, IGNORE_INDEX))


@pytest.mark.parametrize("turns", ["as_rendered", "expand"])
def test_qwen3_release_labels_equal_a_tagged_copy(qwen3, turns) -> None:
    """The reference: transformers' assistant mask of a tagged copy, trained turns only."""
    bundle, hf, texts = qwen3
    tagged = tag_release(texts["release"])
    release = compile_template(texts["release"], "release")
    compared = 0
    for record, rendered in _reasoning_examples(bundle, release, IngestOptions(turns=turns)):
        messages = record["messages"][: rendered.turn] if rendered.turn else record["messages"]
        out = hf.apply_chat_template(
            _as_given(messages),
            tools=record.get("tools"),
            chat_template=tagged,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        ids, labels, _ = encode_rendered(bundle, [rendered])
        assert ids.tolist() == list(out["input_ids"])  # the tagged copy renders the same
        blocks = _trained_runs(np.asarray(out["assistant_masks"], dtype=bool))
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        assert len(blocks) == len(assistant)
        chosen = {assistant[-1]} if rendered.turn else set(assistant)
        chosen -= {i for i in assistant if messages[i].get("weight") == 0}
        reference = np.zeros(len(ids), dtype=bool)
        for (lo, hi), i in zip(blocks, assistant, strict=True):
            reference[lo:hi] = i in chosen
        np.testing.assert_array_equal(labels != IGNORE_INDEX, reference, err_msg=rendered.text)
        compared += 1
    assert compared >= len(REASONING_CHAT)


def _untagged(text: str) -> str:
    return text.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")


@pytest.mark.parametrize("reasoning", ["train", "mask", "drop"])
@pytest.mark.parametrize("empty", ["train", "mask"])
@pytest.mark.parametrize("turns", ["as_rendered", "expand"])
def test_qwen3_training_template_labels_with_and_without_tags(qwen3, reasoning, empty, turns):
    """Tags or no tags, the same labels: TRL's tags also train the line break after each
    ``<|im_end|>``, which the tagless rule (through the end marker) leaves out — that is the
    only difference, token for token."""
    bundle, _, texts = qwen3
    tagged = compile_template(texts["training"], "training")
    plain = compile_template(_untagged(texts["training"]), "training-untagged")
    assert tagged.has_generation and not plain.has_generation
    options = IngestOptions(reasoning=reasoning, empty_reasoning=empty, turns=turns)
    end, newline = bundle.tokenizer.token_to_id("<|im_end|>"), bundle.tokenizer.token_to_id("Ċ")
    with_tags = _reasoning_examples(bundle, tagged, options)
    without = _reasoning_examples(bundle, plain, options)
    assert len(with_tags) == len(without) >= len(REASONING_CHAT)
    for (_, a), (_, b) in zip(with_tags, without, strict=True):
        assert a.text == b.text and (a.label_path, b.label_path) == ("generation_tags", "offsets")
        ids, tagged_labels, _ = encode_rendered(bundle, [a])
        _, plain_labels, _ = encode_rendered(bundle, [b])
        differ = np.flatnonzero(tagged_labels != plain_labels)
        assert all(ids[j] == newline and ids[j - 1] == end for j in differ), a.text
        assert (tagged_labels[differ] == newline).all() and (plain_labels[differ] < 0).all()
        turns_trained = int(((ids == end) & (tagged_labels != IGNORE_INDEX)).sum())
        assert len(differ) == turns_trained  # exactly one line break per trained turn
