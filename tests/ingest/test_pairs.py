"""Preference pairs and KTO records: every layout read into one prompt and two answers."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from packshard.errors import RecordError
from packshard.ingest.label.spans import render_examples
from packshard.ingest.normalize import detect_format, normalize_record
from packshard.ingest.pairs import PAIR_KEYS, is_preference
from packshard.ingest.read.sources import expand_inputs
from packshard.ingest.stream import ingest
from packshard.ingest.template.render import load_template
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import IngestOptions, Message, RawRecord, pair_starts
from packshard.records import SourceRef
from tests.helpers import write_jsonl

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "2+2?"}
GOOD = {"role": "assistant", "content": "4"}
BAD = {"role": "assistant", "content": "5"}

LAYOUTS: dict[str, dict[str, Any]] = {
    "trl_strings": {"prompt": "2+2?", "chosen": "4", "rejected": "5", "system": "Be brief."},
    "trl_lists": {"prompt": [SYSTEM, USER], "chosen": [GOOD], "rejected": [BAD]},
    "trl_implicit": {"chosen": [SYSTEM, USER, GOOD], "rejected": [SYSTEM, USER, BAD]},
    "llamafactory": {
        "system": "Be brief.",
        "conversations": [{"from": "human", "value": "2+2?"}],
        "chosen": {"from": "gpt", "value": "4"},
        "rejected": {"from": "gpt", "value": "5"},
    },
    "branch_messages": {
        "chosen_messages": [SYSTEM, USER, GOOD],
        "rejected_messages": [SYSTEM, USER, BAD],
    },
}


def normalized(value: Any, fmt: str = "auto") -> Any:
    return normalize_record(RawRecord(SourceRef("p.jsonl", 3), "p", value), fmt)


def code_of(value: Any, fmt: str = "auto") -> tuple[str, str]:
    with pytest.raises(RecordError) as info:
        normalized(value, fmt)
    assert (info.value.source, info.value.line) == ("p.jsonl", 3)
    return info.value.code, info.value.reason


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_layout_reads_as_one_prompt_and_two_answers(layout):
    conv = normalized(LAYOUTS[layout])
    assert detect_format(LAYOUTS[layout]) == "preference"
    assert conv.format == "preference"
    assert [(m.role, m.content) for m in conv.messages] == [
        ("system", "Be brief."),
        ("user", "2+2?"),
    ]
    assert conv.answers == (Message("assistant", "4"), Message("assistant", "5"))


def test_the_implicit_prompt_is_the_longest_common_prefix():
    history = [USER, GOOD, {"role": "user", "content": "and 3+3?"}]
    value = {
        "chosen": [*history, {"role": "assistant", "content": "6"}],
        "rejected": [*history, {"role": "assistant", "content": "7"}],
    }
    conv = normalized(value)
    assert [m.content for m in conv.messages] == ["2+2?", "4", "and 3+3?"]
    assert [a.content for a in conv.answers] == ["6", "7"]


def test_flags_are_read_as_for_chat():
    value = {"prompt": [USER], "chosen": [{**GOOD, "weight": 0}], "rejected": [BAD]}
    assert normalized(value).answers[0].train is False


def test_loss_weight_reads_as_weight_in_pairs():
    value = {"prompt": [USER], "chosen": [{**GOOD, "loss_weight": 0}], "rejected": [BAD]}
    assert normalized(value).answers[0].train is False
    value["chosen"] = [{**GOOD, "loss_weight": 2}]
    assert code_of(value)[0] == "invalid_flag"
    kto = {"messages": [USER, {**GOOD, "loss_weight": 1}], "label": True}
    assert normalized(kto).messages[-1].extra == ()


def test_a_kto_record_carries_its_label():
    assert detect_format({"messages": [USER, GOOD], "label": True}) == "kto"
    for label in ("yes", "false", 0, "0"):  # never plain chat: the answer may be a bad one
        assert detect_format({"messages": [USER, GOOD], "label": label}) == "kto"
        assert code_of({"messages": [USER, GOOD], "label": label})[0] == "invalid_content"
    assert detect_format({"messages": [USER, GOOD], "label": None}) == "messages"
    conv = normalized({"messages": [USER, GOOD], "label": False})
    assert (conv.format, conv.kto_label, conv.answers) == ("kto", False, None)


TRL_KTO: dict[str, dict[str, Any]] = {
    "strings": {"prompt": "2+2?", "completion": "4", "label": True, "system": "Be brief."},
    "lists": {"prompt": [SYSTEM, USER], "completion": [GOOD], "label": True},
    "message": {"prompt": [SYSTEM, USER], "completion": GOOD, "label": True},
}


@pytest.mark.parametrize("layout", sorted(TRL_KTO))
def test_trls_unpaired_layout_reads_as_one_kto_example(layout):
    value = TRL_KTO[layout]
    assert detect_format(value) == "kto"
    conv = normalized(value)
    assert (conv.format, conv.kto_label, conv.answers) == ("kto", True, None)
    assert [(m.role, m.content) for m in conv.messages] == [
        ("system", "Be brief."),
        ("user", "2+2?"),
        ("assistant", "4"),
    ]
    assert normalized({**value, "label": False}).kto_label is False
    unlabelled = {k: v for k, v in value.items() if k != "label"}
    assert detect_format(unlabelled) == "prompt_completion"  # no label: SFT as before


def test_trls_unpaired_layout_renders_like_messages_and_label(chatml):
    bundle, template = chatml
    as_messages = {"messages": [SYSTEM, USER, GOOD], "label": False}
    for value in (as_messages, {**TRL_KTO["lists"], "label": False}):
        (rendered,) = render_examples(normalized(value), template, bundle, IngestOptions())
        assert rendered.pair == 3  # KTO undesirable, carried to the shards as kto_label 0
        assert [rendered.text[a:b] for a, b in rendered.spans] == ["4<|im_end|>"]
    plain = normalized(as_messages)
    trl = normalized({**TRL_KTO["lists"], "label": False})
    assert render_examples(plain, template, bundle, IngestOptions()) == render_examples(
        trl, template, bundle, IngestOptions()
    )


@pytest.mark.parametrize(
    ("value", "code", "words"),
    [
        ({"prompt": "q", "completion": [GOOD, GOOD], "label": True}, "invalid_content", "one"),
        ({"prompt": "q", "completion": [USER], "label": True}, "no_assistant_turn", "KTO"),
        ({"prompt": "q", "completion": 4, "label": True}, "invalid_pair", "got number"),
        ({"prompt": [], "completion": "4", "label": False}, "empty_conversation", "empty"),
    ],
)
def test_malformed_trl_kto_records_are_rejected_with_a_code(value, code, words):
    got, reason = code_of(value)
    assert got == code
    assert words in reason


@pytest.mark.parametrize(
    ("value", "code", "words"),
    [
        ({"chosen": "4", "rejected": "5"}, "missing_field", "no prompt"),
        ({"prompt": "q", "chosen": [GOOD, GOOD], "rejected": [BAD]}, "invalid_pair", "exactly one"),
        ({"prompt": "q", "chosen": [USER], "rejected": [BAD]}, "invalid_pair", "got user"),
        ({"prompt": "q", "chosen": 4, "rejected": "5"}, "invalid_pair", "got number"),
        ({"chosen": [USER, GOOD], "rejected": [USER, GOOD]}, "identical_pair", "same"),
        ({"chosen": [GOOD], "rejected": [BAD]}, "invalid_pair", "share no prompt"),
        ({"prompt": [], "chosen": "4", "rejected": "5"}, "empty_conversation", "empty"),
        ({"messages": [USER], "label": True}, "no_assistant_turn", "KTO"),
    ],
)
def test_malformed_pairs_are_rejected_at_their_place_with_a_code(value, code, words):
    got, reason = code_of(value)
    assert got == code
    assert words in reason


def test_forced_formats_name_what_is_missing():
    assert code_of({"messages": [USER, GOOD]}, "preference")[0] == "missing_field"
    assert code_of({"messages": [USER, GOOD], "label": 1}, "kto")[0] == "invalid_content"


def test_pair_starts_need_a_rejected_right_after_a_chosen():
    codes = np.array([1, 2, 0, 1, 2, 3, 4, 1], np.int8)
    assert pair_starts(codes).tolist() == [0, 3]


# --- rendered and tokenized, with the demo tokenizer and ChatML -----------------------------


@pytest.fixture(scope="module")
def chatml(demo_tokenizer):
    bundle = load_tokenizer(str(demo_tokenizer))
    return bundle, load_template("chatml", bundle)


def test_each_branch_renders_alone_and_trains_its_final_turn_only(chatml):
    bundle, template = chatml
    value = {"chosen": [USER, GOOD, USER, GOOD], "rejected": [USER, GOOD, USER, BAD]}
    chosen, rejected = render_examples(normalized(value), template, bundle, IngestOptions())
    assert (chosen.pair, rejected.pair) == (1, 2)
    for rendered, answer in ((chosen, "4"), (rejected, "5")):
        assert rendered.text.count("<|im_start|>assistant") == 2
        assert [rendered.text[a:b] for a, b in rendered.spans] == [answer + "<|im_end|>"]
        assert rendered.text[rendered.spans[0][0] - len("assistant\n") :].startswith("assistant")
        assert rendered.spans[0][0] > rendered.text.rindex("<|im_start|>assistant")


def test_loss_options_do_not_change_what_a_pair_trains(chatml):
    bundle, template = chatml
    value = {"chosen": [USER, GOOD, USER, GOOD], "rejected": [USER, GOOD, USER, BAD]}
    plain = render_examples(normalized(value), template, bundle, IngestOptions())
    for options in (IngestOptions(loss="assistant"), IngestOptions(turns="expand")):
        assert render_examples(normalized(value), template, bundle, options) == plain


def test_kto_examples_carry_their_label_code(chatml):
    bundle, template = chatml
    (good,) = render_examples(
        normalized({"messages": [USER, GOOD], "label": True}), template, bundle, IngestOptions()
    )
    (bad,) = render_examples(
        normalized({"messages": [USER, BAD], "label": False}), template, bundle, IngestOptions()
    )
    assert (good.pair, bad.pair) == (4, 3)


def test_ingest_gives_branches_adjacent_and_rejects_identical_pairs(chatml, tmp_path):
    bundle, template = chatml
    path = write_jsonl(
        tmp_path / "pairs.jsonl",
        [
            LAYOUTS["trl_lists"],
            {"prompt": "same?", "chosen": "yes", "rejected": "yes"},
            {"messages": [USER, GOOD], "text": "chat"},
            "{broken",
            LAYOUTS["llamafactory"],
        ],
    )
    (chunk,) = ingest(expand_inputs([str(path)]), bundle, template, IngestOptions())
    assert chunk.records == 5 and chunk.pairs_read == 3
    assert chunk.batch.pairs.tolist() == [1, 2, 0, 1, 2]
    assert [r.line for r in chunk.batch.refs] == [1, 1, 3, 5, 5]
    assert [(r.ref.line, r.code) for r in chunk.rejects] == [
        (2, "identical_pair"),
        (4, "invalid_json"),
    ]


def test_identical_pair_stops_the_run_with_on_error_fail(chatml, tmp_path):
    bundle, template = chatml
    path = write_jsonl(tmp_path / "same.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "a"}])
    with pytest.raises(RecordError) as info:
        list(ingest(expand_inputs([str(path)]), bundle, template, IngestOptions(on_error="fail")))
    assert (info.value.code, info.value.line) == ("identical_pair", 1)


def test_a_pair_is_detected_by_either_key_pair_both_present_and_not_null() -> None:
    keys = [k for pair in PAIR_KEYS for k in pair]
    absent = object()
    for values in itertools.product((absent, None, "x"), repeat=len(keys)):
        record = {k: v for k, v in zip(keys, values, strict=True) if v is not absent}
        want = any(record.get(a) is not None and record.get(b) is not None for a, b in PAIR_KEYS)
        assert is_preference(record) == want, record
