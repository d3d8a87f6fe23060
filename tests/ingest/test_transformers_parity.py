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

from packshard.ingest.labels import encode_rendered
from packshard.ingest.locate import locate_contents
from packshard.ingest.normalize import normalize_record
from packshard.ingest.sources import expand_inputs, read_records
from packshard.ingest.spans import render_example
from packshard.ingest.templates import CHATML, load_template
from packshard.ingest.tokenizer import load_tokenizer
from packshard.records import IGNORE_INDEX, Conversation, Message, SourceRef

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
        places = locate_contents(template, rendered.text, messages, tools,
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
