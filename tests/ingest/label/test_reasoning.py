"""Reasoning: what the template is given under each policy, and which rendered tokens train.

Hermetic: the Qwen-family imitation tokenizer and :data:`tests.helpers.THINK`, a template
shaped like Qwen3's (history reasoning dropped, an empty block on a last turn without any).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from packshard.errors import RecordError
from packshard.ingest.label.chat import split_inline
from packshard.ingest.label.reasoning import (
    find_block,
    reasoning_field,
    splits_inline,
    template_messages,
)
from packshard.ingest.label.spans import render_examples
from packshard.ingest.normalize import normalize_record
from packshard.ingest.template.render import compile_template, load_template
from packshard.ingest.tokens.labels import Labelled, encode_and_label, encode_texts, label_batch
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import IngestOptions, RawRecord
from packshard.records import SourceRef
from tests.helpers import THINK, answer, build_qwen, chat, span_texts, user

MARKERS = ("<think>", "</think>")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_tokenizer(str(build_qwen(tmp_path_factory.mktemp("qwen"))))


@pytest.fixture(scope="module")
def think() -> Any:
    return compile_template(THINK, "think.jinja")


def _conv(record: dict[str, Any]) -> Any:
    return normalize_record(RawRecord(SourceRef("r.jsonl", 5), "r", record))


def _render(record: dict[str, Any], template: Any, bundle: Any, **options: Any) -> Any:
    return render_examples(_conv(record), template, bundle, IngestOptions(**options))


@pytest.mark.parametrize(
    ("content", "closing_only", "expected"),
    [
        ("<think>\nAdd.\n</think>\n\n4", False, ("\nAdd.\n", "\n\n4")),
        ("  \n<think>Add.</think>4", False, ("Add.", "4")),
        ("Add.\n</think>\n\n4", True, ("Add.\n", "\n\n4")),  # a model prompted with <think>
        ("Add.\n</think>\n\n4", False, None),
        ("Sure: <think>Add.</think>4", False, None),  # not at the start
        ("<think>Add. no end", False, None),
        ("plain", True, None),
    ],
)
def test_split_inline(content: str, closing_only: bool, expected: Any) -> None:
    assert split_inline(content, MARKERS, closing_only) == expected


def test_what_a_template_reads(bundle: Any, think: Any) -> None:
    assert reasoning_field(think) == "reasoning_content" and splits_inline(think, MARKERS)
    gptoss = compile_template("{% for m in messages %}{{ m.thinking }}{% endfor %}", "g")
    assert reasoning_field(gptoss) == "thinking" and not splits_inline(gptoss, MARKERS)
    chatml = load_template("chatml", bundle)
    assert reasoning_field(chatml) is None and not splits_inline(chatml, MARKERS)


def test_the_field_is_given_under_the_name_the_template_reads(bundle: Any, think: Any) -> None:
    conv = _conv(chat(user("2+2?"), answer("4", thinking="Add.")))
    given, has = template_messages(conv.messages, think, "train", MARKERS, conv.ref)
    assert given[1] == {"role": "assistant", "content": "4", "reasoning_content": "Add."}
    assert has == [False, True]
    chatml = load_template("chatml", bundle)
    given, _ = template_messages(conv.messages, chatml, "mask", MARKERS, conv.ref)
    assert given[1] == {"role": "assistant", "content": "<think>\nAdd.\n</think>\n\n4"}


def test_drop_removes_fields_and_inline_blocks(think: Any) -> None:
    conv = _conv(
        chat(
            user("q"),
            answer("4", reasoning_content="Add."),
            user("r"),
            answer("<think>x</think>\n6"),
        )
    )
    given, has = template_messages(conv.messages, think, "drop", MARKERS, conv.ref)
    assert [m["content"] for m in given] == ["q", "4", "r", "6"]
    assert "reasoning_content" not in given[1] and has == [False] * 4


@pytest.mark.parametrize(
    ("turn", "reason"),
    [
        (
            answer("<think>a</think>4", reasoning_content="b"),
            "message 2 (assistant) has a reasoning field and an inline block (keep one)",
        ),
        (
            answer("4", reasoning_content="a </think> b"),
            "message 2 (assistant) reasoning holds the closing marker '</think>'",
        ),
        (
            answer("<think>a</think>4</think>"),
            "message 2 (assistant) content holds '</think>' after its inline block",
        ),
    ],
)
def test_ambiguous_reasoning_is_rejected(think: Any, bundle: Any, turn: Any, reason: str) -> None:
    with pytest.raises(RecordError) as err:
        _render(chat(user("q"), turn), think, bundle)
    assert (err.value.code, err.value.reason) == ("invalid_reasoning", reason)
    assert str(err.value).startswith("r.jsonl:5: ")


def test_find_block() -> None:
    text = "<|im_start|>assistant\n<think>\nAdd.\n</think>\n\nIt is 4.<|im_end|>"
    lo = text.index("<think>")
    start, end, empty = find_block(text, lo, len(text), MARKERS)  # type: ignore[misc]
    assert (text[start:end], empty) == ("<think>\nAdd.\n</think>\n\n", False)
    empty_text = "x\n<think>\n\n</think>\n\nok"
    assert find_block(empty_text, 1, len(empty_text), MARKERS) == (2, 21, True)
    assert find_block(text, text.index("It"), len(text), MARKERS) is None
    assert find_block(text, lo, text.index("</think>"), MARKERS) is None  # not closed in time


RECORD = chat(
    user("2+2?"),
    answer("It is 4.", reasoning_content="Add 2 and 2."),
    user("3+3?"),
    answer("<think>\nAdd 3 and 3.\n</think>\n\nIt is 6."),
)


def test_train_trains_each_turn_as_rendered(think: Any, bundle: Any) -> None:
    (r,) = _render(RECORD, think, bundle)
    # the first turn's reasoning is dropped by the template: trained as rendered, counted
    assert span_texts(r) == [
        "It is 4.<|im_end|>",
        "<think>\nAdd 3 and 3.\n</think>\n\nIt is 6.<|im_end|>",
    ]
    assert [r.text[a:b] for a, b in r.reasoning] == ["<think>\nAdd 3 and 3.\n</think>\n\n"]
    assert (r.reasoning_dropped, r.label_path, r.turn) == (1, "offsets", 0)


def test_mask_keeps_the_reasoning_as_context(think: Any, bundle: Any) -> None:
    (r,) = _render(RECORD, think, bundle, reasoning="mask")
    assert span_texts(r) == ["It is 4.<|im_end|>", "It is 6.<|im_end|>"]
    assert "<think>\nAdd 3 and 3.\n</think>" in r.text and len(r.reasoning) == 1


def test_drop_renders_without_it_and_the_empty_block_follows_its_option(think, bundle) -> None:
    (r,) = _render(RECORD, think, bundle, reasoning="drop")
    assert "Add" not in r.text and r.reasoning == () and r.reasoning_dropped == 0
    assert span_texts(r)[-1] == "<think>\n\n</think>\n\nIt is 6.<|im_end|>"  # as TRL trains it
    (masked,) = _render(RECORD, think, bundle, reasoning="drop", empty_reasoning="mask")
    assert span_texts(masked) == ["It is 4.<|im_end|>", "It is 6.<|im_end|>"]


def test_expand_trains_every_turn_with_its_reasoning(think: Any, bundle: Any) -> None:
    first, second = _render(RECORD, think, bundle, turns="expand")
    assert (first.turn, second.turn) == (2, 4)
    assert span_texts(first) == ["<think>\nAdd 2 and 2.\n</think>\n\nIt is 4.<|im_end|>"]
    assert first.text.endswith("It is 4.<|im_end|>\n") and "3+3" not in first.text
    assert span_texts(second) == ["<think>\nAdd 3 and 3.\n</think>\n\nIt is 6.<|im_end|>"]
    assert first.reasoning_dropped == second.reasoning_dropped == 0


def test_a_template_that_drops_reasoning_everywhere_rejects_the_last_turn(bundle) -> None:
    r1 = compile_template(
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
        "{{ m.content.split('</think>')[-1] }}{{ '<|im_end|>\\n' }}{% endfor %}",
        "r1-like.jinja",
    )
    with pytest.raises(RecordError) as err:
        _render(RECORD, r1, bundle)
    assert err.value.code == "reasoning_dropped"
    assert err.value.reason == (
        "message 4 (assistant): the template leaves out its reasoning even as the last turn, "
        "so it cannot be trained (use --reasoning drop to train the answer alone, or a "
        "template that renders reasoning via --template)"
    )
    (r,) = _render(RECORD, r1, bundle, reasoning="drop")
    assert span_texts(r) == ["It is 4.<|im_end|>", "It is 6.<|im_end|>"]


def test_a_template_without_reasoning_support_gets_it_inline(bundle: Any) -> None:
    plain = compile_template(
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + "
        "'<|im_end|>\\n' }}{% endfor %}",
        "plain.jinja",
    )
    (r,) = _render(chat(user("2+2?"), answer("It is 4.", reasoning="Add.")), plain, bundle)
    assert span_texts(r) == ["<think>\nAdd.\n</think>\n\nIt is 4.<|im_end|>"]
    (masked,) = _render(
        chat(user("2+2?"), answer("It is 4.", reasoning="Add.")), plain, bundle, reasoning="mask"
    )
    assert span_texts(masked) == ["It is 4.<|im_end|>"]


def test_custom_markers(bundle: Any) -> None:
    chatml = load_template("chatml", bundle)
    record = chat(user("q"), answer("<|begin_of_thought|>Add.<|end_of_thought|>\n4"))
    markers = ("<|begin_of_thought|>", "<|end_of_thought|>")
    (r,) = _render(record, chatml, bundle, reasoning="mask", reasoning_markers=markers)
    assert span_texts(r) == ["4<|im_end|>"] and len(r.reasoning) == 1
    (default,) = _render(record, chatml, bundle, reasoning="mask")
    assert span_texts(default) == ["<|begin_of_thought|>Add.<|end_of_thought|>\n4<|im_end|>"]


def test_generation_tags_follow_the_reasoning_policy(bundle: Any) -> None:
    """Tags decide the turn; --reasoning mask still cuts the block out of it."""
    tagged = compile_template(
        THINK.replace(
            "{{- '<|im_start|>assistant\\n' }}",
            "{{- '<|im_start|>assistant\\n' }}{%- generation %}",
            1,
        ).replace(
            "        {{- '<|im_end|>\\n' }}\n    {%- else %}",
            "        {{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}\n    {%- else %}",
        ),
        "think-tagged.jinja",
    )
    assert tagged.has_generation
    for options in ({}, {"reasoning": "mask"}, {"turns": "expand"}, {"empty_reasoning": "mask"}):
        with_tags = _render(RECORD, tagged, bundle, **options)
        without = _render(RECORD, compile_template(THINK, "think.jinja"), bundle, **options)
        for a, b in zip(with_tags, without, strict=True):
            assert a.label_path == "generation_tags" and b.label_path == "offsets"
            assert span_texts(a) == span_texts(b), options


def test_label_batch_counts_reasoning_tokens(think: Any, bundle: Any) -> None:
    rendered = [*_render(RECORD, think, bundle), *_render(RECORD, think, bundle, reasoning="mask")]
    done = label_batch(bundle, rendered, encode_texts(bundle, rendered))
    assert done.reasoning is not None
    tokens, trained = done.reasoning
    block = bundle.tokenizer.encode("<think>\nAdd 3 and 3.\n</think>\n\n", add_special_tokens=False)
    assert tokens[0] == tokens[1] >= len(block.ids) - 2  # merges at the edges may differ
    assert (trained[0], trained[1]) == (tokens[0], 0)
    plain = _render(chat(user("q"), answer("a")), think, bundle)
    assert label_batch(bundle, plain, encode_texts(bundle, plain)).reasoning is None


def test_labelling_in_pieces_joins_to_the_whole_batch(think: Any, bundle: Any) -> None:
    # the ingest labels its first chunk piece by piece on the tokenize thread; pieces with
    # and without reasoning blocks must join to what the whole chunk labels at once
    plain = _render(chat(user("q"), answer("a")), think, bundle)
    thinking = _render(RECORD, think, bundle, reasoning="mask")
    rendered = [*plain, *thinking, *plain, *_render(RECORD, think, bundle)]
    whole = label_batch(bundle, rendered, encode_texts(bundle, rendered))
    cuts = [0, len(plain), len(plain) + len(thinking), len(rendered) - 1, len(rendered)]
    pieces = [encode_and_label(bundle, rendered[a:b]) for a, b in itertools.pairwise(cuts)]
    assert pieces[0].reasoning is None and pieces[1].reasoning is not None
    joined = Labelled.join(pieces)
    for name in ("input_ids", "labels", "offsets"):
        np.testing.assert_array_equal(getattr(joined, name), getattr(whole, name))
        assert getattr(joined, name).dtype == getattr(whole, name).dtype
    assert whole.reasoning is not None and joined.reasoning is not None
    for a, b in zip(joined.reasoning, whole.reasoning, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(Labelled.join([]).offsets) == 1


def test_records_left_with_no_trained_turn(think: Any, bundle: Any) -> None:
    with pytest.raises(RecordError) as err:
        _render(chat(user("q"), answer("a", weight=0)), think, bundle)
    assert (err.value.code, err.value.reason) == (
        "no_trainable_tokens",
        "every turn --loss assistant trains is flagged untrained (a weight of 0 or 'train': false)",
    )
    with pytest.raises(RecordError) as err:
        _render(chat(user("q"), answer("a", train=False)), think, bundle, loss="all")
    assert err.value.code == "invalid_flag"
    (trained_user,) = _render(chat(user("q", train=True), answer("a", weight=0)), think, bundle)
    assert span_texts(trained_user) == ["q<|im_end|>"]
