"""Normalization: every record format by hand, every reject code with its exact text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from packshard.errors import REJECT_CODES, REJECTED, RecordError, UsageError
from packshard.ingest.normalize import detect_format, normalize_record
from packshard.ingest.read.sources import expand_inputs, read_records
from packshard.ingest.types import Conversation, Message, RawRecord
from packshard.records import SourceRef

REF = SourceRef("data/chat.jsonl", 7)


def norm(value: Any, fmt: str = "auto", domain_field: str = "domain") -> Conversation:
    return normalize_record(RawRecord(REF, "chat", value), fmt, domain_field)


def reject(value: Any, fmt: str = "auto") -> tuple[str, str]:
    with pytest.raises(RecordError) as err:
        norm(value, fmt)
    assert (err.value.source, err.value.line) == ("data/chat.jsonl", 7)
    assert str(err.value) == f"data/chat.jsonl:7: {err.value.reason}"
    return err.value.code, err.value.reason


def msgs(*pairs: tuple[str, str]) -> tuple[Message, ...]:
    return tuple(Message(role, content) for role, content in pairs)


# --- formats, by hand ------------------------------------------------------------------------


def test_messages_with_top_level_system_tools_and_role_aliases() -> None:
    conv = norm(
        {
            "system": "Be brief.",
            "tools": [{"name": "f"}],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": ""},
                {"role": "function", "content": "42"},
                {"role": "ipython", "content": "43"},
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
        }
    )
    assert conv == Conversation(
        REF,
        "chat",
        "messages",
        msgs(
            ("system", "Be brief."),
            ("user", "hi"),
            ("assistant", ""),
            ("tool", "42"),
            ("tool", "43"),
            ("assistant", "ab"),
        ),
        ({"name": "f"},),
    )
    assert conv.is_chat


def test_top_level_system_is_not_added_twice_and_developer_is_system() -> None:
    conv = norm({"system": "outer", "messages": [{"role": "developer", "content": "inner"}]})
    assert conv.messages == msgs(("system", "inner"))
    conv = norm({"system": "", "messages": [{"role": "user", "content": "q"}]})
    assert conv.messages == msgs(("user", "q"))


def test_sharegpt_maps_every_speaker() -> None:
    names = ["system", "human", "user", "gpt", "assistant", "chatgpt", "bard", "model"]
    names += ["function_call", "observation", "tool", "function", "ipython"]
    turns = [{"from": name, "value": str(i)} for i, name in enumerate(names)]
    conv = norm({"conversations": turns, "tools": '[{"name": "g"}]'})
    assert conv.format == "sharegpt"
    assert [m.role for m in conv.messages] == [
        "system", "user", "user", "assistant", "assistant", "assistant", "assistant",
        "assistant", "assistant", "tool", "tool", "tool", "tool",
    ]  # fmt: skip
    assert [m.content for m in conv.messages] == [str(i) for i in range(len(names))]
    assert conv.tools == ({"name": "g"},)


def test_sharegpt_system_tools_string_and_role_content_turns() -> None:
    conv = norm(
        {
            "system": "S",
            "tools": "[]",
            "conversations": [{"role": "user", "content": "q"}, {"from": "gpt", "value": "a"}],
        }
    )
    assert conv.messages == msgs(("system", "S"), ("user", "q"), ("assistant", "a"))
    assert conv.tools is None
    assert norm({"conversations": [{"from": "human", "value": "q"}], "tools": []}).tools is None
    assert norm({"conversations": [{"from": "human", "value": "q"}], "tools": " "}).tools is None


def test_alpaca_with_and_without_input_system_and_history() -> None:
    assert norm({"instruction": "Add", "input": "", "output": "3"}) == Conversation(
        REF, "chat", "alpaca", msgs(("user", "Add"), ("assistant", "3"))
    )
    conv = norm(
        {
            "instruction": "Add",
            "input": "1 2",
            "output": "3",
            "system": "Math.",
            "history": [["hi", "hello"], ["and?", "yes"]],
        }
    )
    assert conv.messages == msgs(
        ("system", "Math."),
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "and?"),
        ("assistant", "yes"),
        ("user", "Add\n1 2"),
        ("assistant", "3"),
    )
    assert norm({"instruction": "I", "input": None, "output": "O"}).messages[0].content == "I"


def test_prompt_completion_plain_strings_skip_the_template() -> None:
    conv = norm({"prompt": "2+2=", "completion": "4"})
    assert conv == Conversation(REF, "chat", "prompt_completion", prompt="2+2=", completion="4")
    assert not conv.is_chat


def test_prompt_completion_message_lists_record_where_the_completion_starts() -> None:
    conv = norm(
        {
            "prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}],
            "completion": [{"role": "assistant", "content": "a"}],
        }
    )
    assert conv.messages == msgs(("system", "S"), ("user", "q"), ("assistant", "a"))
    assert conv.completion_start == 2 and conv.prompt is None and conv.is_chat


def test_text() -> None:
    conv = norm({"text": "once upon a time"})
    assert conv == Conversation(REF, "chat", "text", text="once upon a time")
    assert not conv.is_chat


# --- detection, forcing, domain --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fmt"),
    [
        ({"messages": [], "conversations": [], "text": "t"}, "messages"),
        ({"messages": None, "conversations": [], "text": "t"}, "sharegpt"),
        ({"instruction": "i", "output": "o", "prompt": "p", "completion": "c"}, "alpaca"),
        ({"instruction": "i", "prompt": "p", "completion": "c", "text": "t"}, "prompt_completion"),
        ({"instruction": "i", "text": "t"}, "text"),
    ],
)
def test_detection_order(value: dict[str, Any], fmt: str) -> None:
    assert detect_format(value) == fmt


def test_unknown_format_lists_the_keys() -> None:
    assert reject({"question": "q", "answer": "a"}) == (
        "unknown_format",
        "unknown record format: keys are 'question', 'answer' (expected messages, conversations, "
        "instruction+output, prompt+completion, text, or chosen+rejected; use --format to "
        "force one)",
    )
    assert reject({})[1].startswith("unknown record format: keys are none (")


def test_forced_format_names_the_missing_key() -> None:
    value = {"messages": [{"role": "user", "content": "q"}], "text": "t"}
    assert norm(value, "text").text == "t"
    assert reject(value, "alpaca") == (
        "missing_field",
        "missing field 'instruction' required by format alpaca",
    )
    assert reject({"instruction": "i"}, "alpaca") == (
        "missing_field",
        "missing field 'output' required by format alpaca",
    )
    assert reject({"text": "t"}, "sharegpt") == (
        "missing_field",
        "missing field 'conversations' required by format sharegpt",
    )
    with pytest.raises(UsageError, match=r"^--format 'csv' is not one of auto, messages, "):
        norm(value, "csv")


def test_domain_comes_from_the_field_else_the_file() -> None:
    base = {"text": "t"}
    assert norm({**base, "domain": "math"}).domain == "math"
    assert norm({**base, "domain": ""}).domain == "chat"
    assert norm({**base, "domain": 3}).domain == "chat"
    assert norm({**base, "src": "code", "domain": "x"}, domain_field="src").domain == "code"


# --- rejects ---------------------------------------------------------------------------------

ALLOWED_MESSAGES = "system, user, assistant, tool, developer, function, ipython"
ALLOWED_SHAREGPT = (
    "assistant, bard, chatgpt, function, function_call, gpt, human, ipython, model, "
    "observation, system, tool, user"
)
USER = {"role": "user", "content": "q"}

REJECTS = [
    ({"messages": []}, "empty_conversation", "'messages' is empty"),
    ({"conversations": []}, "empty_conversation", "'conversations' is empty"),
    ({"messages": "hi"}, "invalid_message", "'messages' must be a list, got string"),
    (
        {"messages": [USER, "hi"]},
        "invalid_message",
        "messages[1] is a string, expected an object with 'role' and 'content'",
    ),
    (
        {"messages": [USER, {"role": "narrator", "content": "x"}]},
        "unknown_role",
        f"messages[1] has unknown role 'narrator' (allowed: {ALLOWED_MESSAGES})",
    ),
    (
        {"messages": [{"content": "x"}]},
        "unknown_role",
        f"messages[0] has no 'role' (allowed: {ALLOWED_MESSAGES})",
    ),
    (
        {"conversations": [{"from": "human", "value": "q"}, {"from": "narrator", "value": "x"}]},
        "unknown_role",
        f"conversations[1] has unknown role 'narrator' (allowed: {ALLOWED_SHAREGPT})",
    ),
    (
        {"messages": [USER, {"role": "assistant"}]},
        "invalid_content",
        "messages[1] content is missing",
    ),
    (
        {"messages": [{"role": "user", "content": 5}]},
        "invalid_content",
        "messages[0] content must be a string, got number",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "media_mismatch",  # an image part naming no file takes the next of "images": none
        "1 image placeholder(s) for 0 image(s) listed (each <image> or image part takes the "
        "next image)",
    ),
    (
        {"conversations": [{"from": "gpt", "value": None}]},
        "invalid_content",
        "conversations[0] content is missing",
    ),
    (
        {"messages": [USER], "system": ["s"]},
        "invalid_content",
        "'system' must be a string, got list",
    ),
    (
        {"instruction": 1, "output": "o"},
        "invalid_content",
        "'instruction' must be a string, got number",
    ),
    (
        {"instruction": "i", "output": "o", "input": 2},
        "invalid_content",
        "'input' must be a string, got number",
    ),
    (
        {"instruction": "i", "output": "o", "history": [["only one"]]},
        "invalid_content",
        "history[0] must be a [user, assistant] pair of strings",
    ),
    (
        {"prompt": "p", "completion": [USER]},
        "invalid_content",
        "'prompt' and 'completion' must both be strings or both lists of messages "
        "(got string and list)",
    ),
    (
        {"prompt": [USER], "completion": [{"role": "bot", "content": "a"}]},
        "unknown_role",
        f"completion[0] has unknown role 'bot' (allowed: {ALLOWED_MESSAGES})",
    ),
    ({"text": 3}, "invalid_content", "'text' must be a string, got number"),
    (
        {"conversations": [{"from": "human", "value": "q"}], "tools": "[{"},
        "invalid_tools",
        "'tools' is not valid JSON (Expecting property name enclosed in double quotes: "
        "line 1 column 3 (char 2))",
    ),
    (
        {"conversations": [{"from": "human", "value": "q"}], "tools": {"name": "f"}},
        "invalid_tools",
        "'tools' must be a list or a JSON string of one, got object",
    ),
    (
        {"messages": [USER], "tools": '{"name": "f"}'},
        "invalid_tools",
        "'tools' must be a list or a JSON string of one, got object",
    ),
    (["a", "list"], "not_an_object", "record is a list, expected a JSON object"),
]


@pytest.mark.parametrize(("value", "code", "reason"), REJECTS)
def test_reject_codes_and_exact_messages(value: Any, code: str, reason: str) -> None:
    assert reject(value) == (code, reason)
    assert code in REJECT_CODES


def test_read_errors_are_raised_again() -> None:
    error = RecordError("invalid_json", "invalid JSON: Expecting value at column 1", "a.jsonl", 3)
    with pytest.raises(RecordError) as err:
        normalize_record(RawRecord(SourceRef("a.jsonl", 3), "a", None, error))
    assert err.value is error


def test_reading_and_normalizing_codes_are_registered_rejections() -> None:
    read_codes = {"invalid_json", "invalid_utf8", "not_an_object", "unreadable"}
    emitted = {code for _, code, _ in REJECTS} | read_codes | {"unknown_format", "missing_field"}
    assert emitted <= set(REJECT_CODES)
    assert {REJECT_CODES[code].kind for code in emitted} == {REJECTED}  # bad input, no policy


# --- the real third-party files --------------------------------------------------------------


def normalize_file(path: Path) -> list[Conversation]:
    (f,) = expand_inputs([str(path)])
    return [normalize_record(raw) for raw in read_records(f)]


@pytest.mark.shared_data
@pytest.mark.parametrize(
    ("name", "count", "fmt"),
    [
        ("llamafactory_alpaca_en_demo.json", 999, "alpaca"),
        ("llamafactory_alpaca_zh_demo.json", 1000, "alpaca"),
        ("codealpaca_code_alpaca_2k.json", 2017, "alpaca"),
        ("llamafactory_identity.json", 91, "alpaca"),
        ("llamafactory_glaive_toolcall_en_demo.json", 300, "sharegpt"),
        ("fastchat_dummy_conversation.json", 500, "sharegpt"),
        ("openai_cookbook_toy_chat_fine_tuning.jsonl", 5, "messages"),
        ("anthropic_cookbook_json_mode_dataset.jsonl", 500, "messages"),
    ],
)
def test_shared_chat_files_normalize_without_rejects(
    shared_data: Path, name: str, count: int, fmt: str
) -> None:
    convs = normalize_file(shared_data / "chat" / name)
    assert len(convs) == count
    assert {c.format for c in convs} == {fmt}
    assert {c.domain for c in convs} == {name.rsplit(".", 1)[0]}
    assert all(c.messages and c.is_chat for c in convs)


@pytest.mark.shared_data
def test_glaive_tools_strings_are_parsed(shared_data: Path) -> None:
    path = shared_data / "chat" / "llamafactory_glaive_toolcall_en_demo.json"
    convs = normalize_file(path)
    raw = json.loads(path.read_text())
    with_tools = [c for c in convs if c.tools is not None]
    assert len(with_tools) == 191
    for conv, record in zip(convs, raw, strict=True):
        assert conv.tools == (tuple(json.loads(record["tools"])) or None)
    assert all(isinstance(t, dict) and "name" in t for c in with_tools for t in c.tools or ())
    roles = {m.role for c in convs for m in c.messages}
    assert roles == {"user", "assistant", "tool"}


@pytest.mark.shared_data
def test_anthropic_system_becomes_the_first_message(shared_data: Path) -> None:
    path = shared_data / "chat" / "anthropic_cookbook_json_mode_dataset.jsonl"
    convs = normalize_file(path)
    first = json.loads(path.read_text().splitlines()[0])
    assert convs[0].messages[0] == Message("system", first["system"])
    assert [m.role for m in convs[0].messages] == ["system", "user", "assistant"]
    assert all(c.messages[0].role == "system" for c in convs)


@pytest.mark.shared_data
def test_openai_toy_record_4_has_no_user_turn_and_still_normalizes(shared_data: Path) -> None:
    convs = normalize_file(shared_data / "chat" / "openai_cookbook_toy_chat_fine_tuning.jsonl")
    assert convs[3].ref.line == 4
    assert convs[3].messages == msgs(
        ("system", "You are a happy assistant that puts a positive spin on everything."),
        ("assistant", "You're great!"),
    )
    assert len(convs[4].messages[-1].content) == 26_000
