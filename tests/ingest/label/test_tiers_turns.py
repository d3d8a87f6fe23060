"""Where each trained turn sits: search, the probe render, and the fallbacks agree."""

from __future__ import annotations

from typing import Any

import pytest

import packshard.ingest.label.tiers as turns
from packshard.errors import RecordError
from packshard.ingest.label.spans import render_examples
from packshard.ingest.normalize import normalize_record
from packshard.ingest.read.sources import expand_inputs, read_records
from packshard.ingest.template.render import compile_template, load_template
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import IngestOptions, RawRecord
from packshard.records import SourceRef
from tests.helpers import (
    REASONING_CHAT,
    THINK,
    TOOL,
    answer,
    build_qwen,
    call,
    chat,
    rendered_spans,
    user,
)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_tokenizer(str(build_qwen(tmp_path_factory.mktemp("qwen"))))


@pytest.fixture(scope="module")
def think() -> Any:
    return compile_template(THINK, "think.jinja")


def test_pieces_found_twice_go_to_the_probe(think, bundle, monkeypatch) -> None:
    calls: list[Any] = []
    real = turns.probe_anchors
    monkeypatch.setattr(turns, "probe_anchors", lambda *a: calls.append(1) or real(*a))
    # the reasoning also occurs in the user's message, the answer in both turns
    record = chat(
        user("Think: Add."),
        answer("ok", reasoning_content="Add."),
        user("ok?"),
        answer("ok", reasoning_content="Add."),
    )
    ((text, spans, reasoning, dropped),) = rendered_spans(record, think, bundle)
    assert calls
    assert [text[a:b] for a, b in spans] == [
        "ok<|im_end|>",
        "<think>\nAdd.\n</think>\n\nok<|im_end|>",
    ]
    assert [text[a:b] for a, b in reasoning] == ["<think>\nAdd.\n</think>\n\n"]
    assert dropped == 1


def test_a_tool_calling_turn_is_trained_whole(think, bundle) -> None:
    record = chat(
        user("Weather?"),
        answer(None, reasoning_content="Ask the tool.", tool_calls=call("Paris")),
        TOOL,
        answer("21.", reasoning_content="Read it."),
    )
    ((text, spans, _, dropped),) = rendered_spans(record, think, bundle)
    assert [text[a:b] for a, b in spans] == [
        '<think>\nAsk the tool.\n</think>\n\n\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        "<think>\nRead it.\n</think>\n\n21.<|im_end|>",
    ]
    assert dropped == 0  # both after the last user message: the template keeps them


def test_a_template_that_rewrites_the_answer_is_rejected(bundle) -> None:
    upper = compile_template(
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content | upper + "
        "'<|im_end|>\\n' }}{% endfor %}",
        "upper.jinja",
    )
    with pytest.raises(RecordError) as err:
        render_examples(
            normalize_record(
                RawRecord(SourceRef("t.jsonl", 2), "t", chat(user("q"), answer("ok")))
            ),
            upper,
            bundle,
            IngestOptions(),
        )
    assert err.value.code == "template_error"
    assert err.value.reason == (
        "message 2 (assistant) does not appear in the rendered text; the template rewrites it "
        "(use a template with {% generation %} blocks via --template)"
    )


def test_empty_and_whitespace_turns_train_their_end_marker(think, bundle) -> None:
    for content in ("", "  "):
        record = chat(user("q"), answer(content), user("r"), answer("fine"))
        ((text, spans, _, _),) = rendered_spans(record, think, bundle)
        assert text[spans[0][0] : spans[0][1]] == f"{content}<|im_end|>"


def test_a_trained_user_message_trains_its_content_and_end_marker(think, bundle) -> None:
    record = chat(user("Repeat after me.", train=True), answer("Repeat after me."))
    ((text, spans, _, _),) = rendered_spans(record, think, bundle)
    assert [text[a:b] for a, b in spans] == [
        "Repeat after me.<|im_end|>",
        "<think>\n\n</think>\n\nRepeat after me.<|im_end|>",
    ]


def test_expanded_examples_are_prefixes_each_training_its_last_turn(think, bundle) -> None:
    record = REASONING_CHAT[2]
    examples = rendered_spans(record, think, bundle, turns="expand")
    assert len(examples) == 2
    (first, spans1, _, _), (second, spans2, _, _) = examples
    assert second.startswith(first.split("<|im_start|>assistant")[0])
    assert [first[a:b] for a, b in spans1] == ["<think>\nAdd.\n</think>\n\nIt is 4.<|im_end|>"]
    assert [second[a:b] for a, b in spans2] == [
        "<think>\nAdd again.\n</think>\n\nIt is 6.<|im_end|>"
    ]


@pytest.mark.parametrize("name", ["phi-3-mini", "qwen3"])
@pytest.mark.parametrize(
    "options",
    [IngestOptions(), IngestOptions(turns="expand"), IngestOptions(loss="last_assistant")],
    ids=["as_rendered", "expand", "last_assistant"],
)
def test_plain_turns_label_as_the_full_search(shared_data, monkeypatch, name, options):
    """The shortcut for plain conversations gives what every tier gives, on the shared chats."""
    folder = shared_data / "tokenizers" / name
    bundle = load_tokenizer(str(folder))
    chat_template = load_template(None, bundle)  # the tokenizer's own
    files = sorted((shared_data / "chat").glob("*.json*"))
    records = [
        normalize_record(raw)
        for f in expand_inputs([str(p) for p in files])
        for raw in read_records(f, options=options)
    ]
    used: list[bool] = []
    real = turns.plain_turns

    def counted(*args: Any) -> Any:
        found = real(*args)
        used.append(found is not None)
        return found

    def labels() -> list[Any]:
        out: list[Any] = []
        for record in records:
            try:
                out.append(render_examples(record, chat_template, bundle, options))
            except RecordError as err:
                out.append(err.code)
        return out

    monkeypatch.setattr(turns, "plain_turns", counted)
    shortcut = labels()
    monkeypatch.setattr(turns, "plain_turns", lambda *args: None)
    assert shortcut == labels()
    assert sum(used) > len(records) * 9 // 10  # the shortcut placed most of them
