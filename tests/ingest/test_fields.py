"""A message's reasoning fields and training flags, as normalization reads them."""

from __future__ import annotations

from typing import Any

import pytest

from packshard.errors import RecordError
from packshard.ingest.normalize import normalize_record
from packshard.ingest.types import Message, RawRecord
from packshard.records import SourceRef
from tests.helpers import msg


def _messages(*turns: dict[str, Any], key: str = "messages") -> tuple[Message, ...]:
    return normalize_record(RawRecord(SourceRef("c.jsonl", 3), "c", {key: list(turns)})).messages


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "thinking"])
def test_every_reasoning_field_becomes_the_message_reasoning(field: str) -> None:
    _, reply = _messages(msg("user", "2+2?"), msg("assistant", "4", **{field: "Add."}))
    assert (reply.content, reply.reasoning, reply.extra, reply.train) == ("4", "Add.", (), None)


def test_thinking_content_parts_are_reasoning_and_text_parts_the_content() -> None:
    parts = [
        {"type": "thinking", "thinking": "Add ", "signature": "x"},
        {"type": "thinking", "thinking": "2 and 2."},
        {"type": "text", "text": "It is "},
        {"type": "text", "text": "4."},
    ]
    _, reply = _messages(msg("user", "2+2?"), msg("assistant", parts))
    assert (reply.content, reply.reasoning) == ("It is 4.", "Add 2 and 2.")


def test_sharegpt_turns_carry_reasoning_and_flags() -> None:
    turns = [
        {"from": "human", "value": "hi"},
        {"from": "gpt", "value": "yo", "reasoning": "Greet back.", "weight": 0},
    ]
    _, reply = _messages(*turns, key="conversations")
    assert (reply.role, reply.reasoning, reply.train) == ("assistant", "Greet back.", False)


def test_reasoning_fields_of_other_roles_reach_the_template_untouched() -> None:
    first, _ = _messages(msg("user", "q", reasoning="mine"), msg("assistant", "a"))
    assert (first.reasoning, first.extra) == (None, (("reasoning", "mine"),))


def test_the_same_reasoning_twice_is_fine_and_other_fields_stay() -> None:
    turn = msg("assistant", "4", reasoning_content="Add.", reasoning="Add.", name="bot")
    _, reply = _messages(msg("user", "2+2?"), turn)
    assert (reply.reasoning, reply.extra) == ("Add.", (("name", "bot"),))


@pytest.mark.parametrize(
    ("turn", "code", "reason"),
    [
        (
            msg("assistant", "4", reasoning_content="Add.", reasoning="Sum."),
            "invalid_reasoning",
            "messages[1] has 'reasoning_content' and 'reasoning' with different text (keep one)",
        ),
        (
            msg("assistant", [{"type": "thinking", "thinking": "Add."}], thinking="Sum."),
            "invalid_reasoning",
            "messages[1] has thinking parts and 'thinking' with different text (keep one)",
        ),
        (
            msg("assistant", "4", reasoning_content=["Add."]),
            "invalid_reasoning",
            "messages[1] 'reasoning_content' must be a string, got a list",
        ),
        (
            msg("assistant", [{"type": "redacted_thinking", "data": "…"}]),
            "invalid_reasoning",
            "messages[1] content part 0 is redacted thinking, which cannot be trained on "
            "(remove it, or the record)",
        ),
        (
            msg("assistant", [{"type": "thinking", "thinking": 3}]),
            "invalid_reasoning",
            "messages[1] content part 0 'thinking' must be a string, got the number 3",
        ),
        (
            msg("assistant", "4", weight=0.5),
            "invalid_flag",
            "messages[1] 'weight' must be 0 or 1, got the number 0.5 "
            "(a token is trained or not: use 0 for context, 1 to train)",
        ),
        (
            msg("assistant", "4", weight=True),
            "invalid_flag",
            "messages[1] 'weight' must be 0 or 1, got a boolean "
            "(a token is trained or not: use 0 for context, 1 to train)",
        ),
        (
            msg("assistant", "4", loss_weight="1"),
            "invalid_flag",
            "messages[1] 'loss_weight' must be 0 or 1, got a string "
            "(a token is trained or not: use 0 for context, 1 to train)",
        ),
        (
            msg("assistant", "4", weight=1, loss_weight=0.0),
            "invalid_flag",
            "messages[1] has 'weight' 1 and 'loss_weight' 0 (keep one)",
        ),
        (
            msg("assistant", "4", train="yes"),
            "invalid_flag",
            "messages[1] 'train' must be true or false, got a string",
        ),
    ],
)
def test_bad_reasoning_and_flags_are_placed_rejects(turn: Any, code: str, reason: str) -> None:
    with pytest.raises(RecordError) as err:
        _messages(msg("user", "2+2?"), turn)
    assert (err.value.code, err.value.reason) == (code, reason)
    assert (err.value.source, err.value.line) == ("c.jsonl", 3)


@pytest.mark.parametrize(
    ("role", "fields", "train"),
    [
        ("user", {"weight": 0}, False),  # not trained anyway: says what holds
        ("user", {"loss_weight": 0.0}, False),  # LLaMA-Factory v1 on every message
        ("system", {"loss_weight": 0}, False),
        ("user", {"weight": 1}, True),  # asks to train a turn the policy would not
        ("user", {"loss_weight": 1.0, "train": False}, False),  # train wins
        ("assistant", {"loss_weight": 1.0}, None),  # the default: the policy decides
        ("assistant", {"loss_weight": 0.0}, False),
        ("assistant", {"weight": 0, "loss_weight": 0.0}, False),  # agreeing spellings
    ],
)
def test_weights_on_any_role(role: str, fields: dict[str, Any], train: bool | None) -> None:
    turns = [msg("user", "q"), msg(role, "q", **fields), msg("assistant", "a")]
    weighted = _messages(*turns)[1]
    assert (weighted.train, weighted.extra) == (train, ())


@pytest.mark.parametrize(
    ("fields", "train"),
    [
        ({"weight": 0}, False),
        ({"weight": 1}, None),  # OpenAI's default: the loss policy decides
        ({"train": True}, True),
        ({"train": False}, False),
        ({"train": True, "weight": 0}, True),  # train overrides weight
        ({"weight": 0, "train": True}, True),
        ({"train": False, "weight": 1}, False),
    ],
)
def test_train_flag_from_weight_and_train(fields: dict[str, Any], train: bool | None) -> None:
    _, reply = _messages(msg("user", "q"), msg("assistant", "a", **fields))
    assert (reply.train, reply.extra) == (train, ())


def test_train_on_any_role() -> None:
    first, _ = _messages(msg("user", "q", train=True), msg("assistant", "a"))
    assert first.train is True


def test_thinking_parts_belong_to_assistant_messages() -> None:
    with pytest.raises(RecordError) as err:
        _messages(msg("user", [{"type": "thinking", "thinking": "hm"}]), msg("assistant", "a"))
    assert (err.value.code, err.value.reason) == (
        "invalid_content",
        "messages[0] content part 0 is 'thinking'; only text parts are supported",
    )


def test_llamafactory_v1_text_parts_under_value_join() -> None:
    parts = [{"type": "text", "value": "It is "}, {"type": "text", "value": "4."}]
    user, reply = _messages(
        msg("user", [{"type": "text", "value": "2+2?"}], loss_weight=0.0),
        msg("assistant", parts, loss_weight=1.0),
    )
    assert (user.content, user.train, reply.content, reply.train) == (
        "2+2?",
        False,
        "It is 4.",
        None,
    )


def test_a_text_part_without_text_names_the_field() -> None:
    with pytest.raises(RecordError) as err:
        _messages(msg("user", [{"type": "text", "value": 3}]), msg("assistant", "a"))
    assert err.value.reason == "messages[0] content part 0 value must be a string, got number"
