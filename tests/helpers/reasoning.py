"""Reasoning: a template shaped like Qwen3's, and records that exercise it."""

from __future__ import annotations

from typing import Any

from tests.helpers.records import WEATHER_TOOL, msg

# --- reasoning: a template shaped like Qwen3's, and records that exercise it ----------------

# Same structure as the Qwen3 release template (own wording): reasoning from a field or an
# inline block, rendered only for turns after the last user message (and an empty block on a
# last turn that has none), tool calls after the answer, the header outside the turn.
THINK = r"""{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {%- set ns.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for m in messages %}
    {%- if m.role == 'assistant' %}
        {%- set answer = m.content %}
        {%- set thought = m.reasoning_content if m.reasoning_content is string else '' %}
        {%- if '</think>' in answer %}
            {%- set thought = answer.split('</think>')[0].split('<think>')[-1] %}
            {%- set answer = answer.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' }}
        {%- if loop.index0 > ns.last_user and (loop.last or thought) %}
            {{- '<think>\n' + thought.strip('\n') + '\n</think>\n\n' }}
        {%- endif %}
        {{- answer }}
        {%- for call in m.tool_calls or [] %}
            {{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' }}
            {{- (call.function.arguments | tojson) + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def call(city: str, ident: str = "c1") -> list[dict[str, Any]]:
    """An OpenAI ``tool_calls`` list asking get_weather for ``city``."""
    function = {"name": "get_weather", "arguments": {"city": city}}
    return [{"id": ident, "type": "function", "function": function}]


def user(text: str, **fields: Any) -> dict[str, Any]:
    return msg("user", text, **fields)


def answer(text: str | None, **fields: Any) -> dict[str, Any]:
    return msg("assistant", text, **fields)


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"messages": list(messages), **fields}


TOOL = msg("tool", '{"temp": 21}', tool_call_id="c1")
# Single and multi turn, reasoning fields and inline blocks, tool calls, empty reasoning,
# weight 0 and train flags, history reasoning a template drops, pieces found twice (the probe).
REASONING_CHAT = [
    chat(user("2+2?"), answer("It is 4.", reasoning_content="Add 2 and 2.")),
    chat(user("2+2?"), answer("<think>\nAdd 2 and 2.\n</think>\n\nIt is 4.")),
    chat(
        msg("system", "Be brief."),
        user("2+2?"),
        answer("It is 4.", reasoning_content="Add."),
        user("3+3?"),
        answer("It is 6.", reasoning_content="Add again."),
    ),
    chat(
        user("2+2?"),
        answer("<think>\nAdd.\n</think>\n\nIt is 4."),
        user("3+3?"),
        answer("<think>\nAdd again.\n</think>\n\nIt is 6."),
    ),
    chat(
        user("Weather in Paris?"),
        answer(None, reasoning_content="Call the tool.", tool_calls=call("Paris")),
        TOOL,
        answer("It is 21 degrees.", reasoning_content="The tool says 21."),
        tools=[WEATHER_TOOL],
    ),
    chat(
        user("Weather in Paris?"),
        answer("Let me check.", reasoning_content="Call it.", tool_calls=call("Paris")),
        TOOL,
        answer("21 degrees."),
        tools=[WEATHER_TOOL],
    ),
    chat(
        user("Paris?"),
        answer(None, reasoning_content="Call.", tool_calls=call("Paris")),
        TOOL,
        answer("21.", reasoning_content="Read."),
        user("And Rome?"),
        answer(None, tool_calls=call("Rome", "c2")),
        msg("tool", '{"temp": 25}', tool_call_id="c2"),
        answer("25.", reasoning_content="Read again."),
        tools=[WEATHER_TOOL],
    ),
    chat(user("Hi"), answer("Hello!", reasoning_content="")),
    chat(user("Hi"), answer("Hello!")),
    chat(user("Hi"), answer("Hello!"), user("Bye"), answer("Bye!")),
    chat(
        user("2+2?"),
        answer("It is 4.", reasoning_content="Add.", weight=0),
        user("3+3?"),
        answer("It is 6.", reasoning_content="Add again."),
    ),
    chat(
        user("2+2?"),
        answer("<think>\nAdd.\n</think>\n\nIt is 4.", weight=1),
        user("3+3?"),
        answer("<think>Add again.</think>It is 6.", weight=0),
        user("4+4?"),
        answer("<think>\n\nDouble.\n\n</think>\n\n\nIt is 8."),
    ),
    chat(user("2+2?"), answer("\n\nIt is 4.", reasoning_content="\nAdd.\n")),
    chat(user("2+2?"), answer("It is 4.", reasoning_content="Add."), user("thanks")),
    chat(
        user("2+2?"),
        answer("4", reasoning_content="Add."),
        user("3+3?"),
        answer("6", reasoning_content="Add again.", weight=0),
    ),
    chat(
        user("Say ok twice."),
        answer("ok", reasoning_content="Say ok."),
        user("again: ok"),
        answer("ok", reasoning_content="Say ok."),
    ),
    chat(user("Think: Add."), answer("It is 4.", reasoning_content="Add.")),
]


def rendered_spans(record: dict[str, Any], template: Any, bundle: Any, **options: Any) -> list:
    """Render ``record`` as ingest does: per example its text, trained spans and reasoning."""
    from packshard.ingest.label.spans import render_examples
    from packshard.ingest.normalize import normalize_record
    from packshard.ingest.types import IngestOptions, RawRecord
    from packshard.records import SourceRef

    conv = normalize_record(RawRecord(SourceRef("t.jsonl", 2), "t", record))
    rendered = render_examples(conv, template, bundle, IngestOptions(**options))
    return [(r.text, r.spans, r.reasoning, r.reasoning_dropped) for r in rendered]
