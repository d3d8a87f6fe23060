"""Chat records and the model families they are rendered for (tests/ingest/test_families.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.templates import LLAMA2
from tests.helpers.tokenizers import (
    build_echo,
    build_gemma,
    build_llama3,
    build_qwen,
    build_sentencepiece,
)

# --- records -----------------------------------------------------------------------------------


def msg(role: str, content: Any, **fields: Any) -> dict[str, Any]:
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
    {"messages": [msg("user", "What is the weather in Paris today?"),
                  msg("assistant", "It is sunny and 21 degrees.")]},
    {"messages": [msg("system", "You are a helpful assistant. Answer briefly."),
                  msg("user", "say yes"), msg("assistant", "yes"),
                  msg("user", "and no?"), msg("assistant", "no")]},
    {"conversations": [{"from": "human", "value": "hello world"},
                       {"from": "gpt", "value": "Sure, here it is."}],
     "system": "Answer briefly."},
    {"instruction": "say yes", "input": "please", "output": "yes"},
    {"messages": [msg("user", "  the quick brown fox  "),
                  msg("assistant", " jumps over\nthe dog \n")]},
    {"messages": [msg("user", "héllo wörld 你好"), msg("assistant", "你好! ✓ 🦊")]},
    {"messages": [msg("user", "yes"), msg("assistant", "yes")]},
]  # fmt: skip
TOOL_CHAT = [
    {"messages": [
        msg("user", "What is the weather in Paris?"),
        msg("assistant", None, tool_calls=[{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]),
        msg("tool", '{"temperature": 21}', tool_call_id="call_1", name="get_weather"),
        msg("assistant", "It is sunny and 21 degrees."),
    ], "tools": [WEATHER_TOOL]},
    {"messages": [msg("system", "Answer briefly."), msg("user", "hello world"),
                  msg("assistant", "hello")], "tools": [WEATHER_TOOL]},
]  # fmt: skip
BAD_ALTERNATION = {
    "messages": [msg("user", "hello"), msg("user", "world"), msg("assistant", "yes")]
}
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
