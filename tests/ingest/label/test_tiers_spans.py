"""One conversation's trained spans, turn by turn: flags, generation blocks, policies."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from packshard.errors import RecordError
from packshard.ingest.label.spans import render_examples
from packshard.ingest.label.tiers import subtract
from packshard.ingest.normalize import normalize_record
from packshard.ingest.template.render import compile_template
from packshard.ingest.tokens.labels import encode_rendered
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import IngestOptions, RawRecord
from packshard.records import SourceRef
from tests.helpers import REASONING_CHAT, THINK, answer, build_qwen, chat, span_texts, user

# THINK with generation tags around each assistant turn's output, header outside, end marker in
TAGGED_THINK = THINK.replace(
    "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant\\n' }}{%- generation %}", 1
).replace(
    "        {{- '<|im_end|>\\n' }}\n    {%- else %}",
    "        {{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}\n    {%- else %}",
)
# ChatML whose final EOS is a generation block of its own after the last turn (phi-3 style)
EOS_BLOCK = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{% if m.role == 'assistant' %}"
    "{% generation %}{{ m.content + '<|im_end|>\\n' }}{% endgeneration %}{% else %}"
    "{{ m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% generation %}{{ eos_token }}{% endgeneration %}"
)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_tokenizer(str(build_qwen(tmp_path_factory.mktemp("qwen"))))


def _render(record: dict[str, Any], template: Any, bundle: Any, **options: Any) -> Any:
    conv = normalize_record(RawRecord(SourceRef("c.jsonl", 1), "c", record))
    return render_examples(conv, template, bundle, IngestOptions(**options))


def test_subtract() -> None:
    assert subtract([(0, 10), (20, 30)], [(2, 4), (8, 22), (29, 40)]) == [
        (0, 2),
        (4, 8),
        (22, 29),
    ]
    assert subtract([(0, 5)], []) == [(0, 5)]
    assert subtract([(0, 5)], [(0, 5)]) == []


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"reasoning": "mask"},
        {"reasoning": "drop"},
        {"empty_reasoning": "mask"},
        {"turns": "expand"},
        {"loss": "last_assistant"},
    ],
)
def test_tags_and_no_tags_give_the_same_labels(bundle: Any, options: dict[str, Any]) -> None:
    tagged = compile_template(TAGGED_THINK, "tagged")
    plain = compile_template(THINK, "plain")
    assert tagged.has_generation and not plain.has_generation
    compared = 0
    for record in REASONING_CHAT:
        try:
            with_tags = _render(record, tagged, bundle, **options)
        except RecordError as err:  # e.g. last_assistant on a last turn of weight 0
            with pytest.raises(RecordError) as same:
                _render(record, plain, bundle, **options)
            assert (same.value.code, same.value.reason) == (err.code, err.reason)
            continue
        without = _render(record, plain, bundle, **options)
        for a, b in zip(with_tags, without, strict=True):
            assert a.text == b.text and a.turn == b.turn
            np.testing.assert_array_equal(
                encode_rendered(bundle, [a])[1], encode_rendered(bundle, [b])[1], err_msg=a.text
            )
            assert a.reasoning == b.reasoning and a.reasoning_dropped == b.reasoning_dropped
            compared += 1
    assert compared >= len(REASONING_CHAT) - 1


def test_blocks_of_untrained_turns_are_left_out(bundle: Any) -> None:
    template = compile_template(EOS_BLOCK, "eos-block")
    record = chat(
        user("a"), answer("one"), user("b"), answer("two", weight=0), user("c"), answer("three")
    )
    (r,) = _render(record, template, bundle)
    assert span_texts(r) == ["one<|im_end|>\n", "three<|im_end|>\n", "<|im_end|>"]
    (last,) = _render(record, template, bundle, loss="last_assistant")
    assert span_texts(last) == ["three<|im_end|>\n", "<|im_end|>"]  # its final EOS block too
    everything = _render(chat(user("a"), answer("one")), template, bundle)[0]
    assert everything.spans == (
        (everything.text.index("one"), len(everything.text) - len("<|im_end|>")),
        (len(everything.text) - len("<|im_end|>"), len(everything.text)),
    )


def test_loss_all_masks_reasoning_when_asked(bundle: Any) -> None:
    template = compile_template(THINK, "think")
    record = chat(user("2+2?"), answer("4", reasoning_content="Add."))
    (plain,) = _render(record, template, bundle, loss="all")
    assert (plain.label_path, plain.spans) == ("none", ((0, len(plain.text)),))
    (masked,) = _render(record, template, bundle, loss="all", reasoning="mask")
    block = "<think>\nAdd.\n</think>\n\n"
    at = masked.text.index(block)
    assert masked.label_path == "offsets"
    assert masked.spans == ((0, at), (at + len(block), len(masked.text)))
