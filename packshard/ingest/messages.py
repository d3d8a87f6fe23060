r"""Message lists: the turns of every chat-shaped record format, read one way.

``read_messages`` reads a list of turns in one of two forms: OpenAI ``role``/``content``
(:data:`MESSAGE_FORM`) or ShareGPT ``from``/``value`` (:data:`SHAREGPT_FORM`, which also reads
``role``/``content`` turns; spellings in :mod:`packshard.ingest.normalize`).  ``with_system``
adds a top-level ``system`` string; ``tools_of`` reads ``tools``.  Chat formats and preference
pairs (:mod:`packshard.ingest.pairs`) build on these, so a turn reads the same everywhere.
"""

from __future__ import annotations

import json
from typing import Any

from packshard.errors import RecordError
from packshard.ingest.fields import read_fields, thinking_parts
from packshard.ingest.media.parts import content_parts
from packshard.ingest.read.jsonparse import a_json_kind, json_kind
from packshard.ingest.types import Message


def require(value: dict[str, Any], key: str, fmt: str) -> Any:
    """Return ``value[key]``; raise ``missing_field`` (naming format ``fmt``) when absent."""
    field = value.get(key)
    if field is None:
        raise RecordError("missing_field", f"missing field '{key}' required by format {fmt}")
    return field


MESSAGE_ROLES = {
    **{r: r for r in ("system", "user", "assistant", "tool")},
    **{"developer": "system", "function": "tool", "ipython": "tool"},
}
SHAREGPT_ROLES = {
    **{"human": "user", "user": "user", "system": "system"},
    **{r: "assistant" for r in ("gpt", "assistant", "chatgpt", "bard", "model", "function_call")},
    **{r: "tool" for r in ("observation", "tool", "function", "ipython")},
}
MESSAGE_FORM = (MESSAGE_ROLES, "role", "content", ", ".join(MESSAGE_ROLES))
SHAREGPT_FORM = (SHAREGPT_ROLES, "from", "value", ", ".join(sorted(SHAREGPT_ROLES)))
TURN_KEYS = frozenset(("role", "content", "from", "value"))


def string_field(field: Any, where: str) -> str:
    """Return ``field`` when it is a string; raise ``invalid_content`` naming ``where``."""
    if type(field) is str:
        return field
    if field is None:
        raise RecordError("invalid_content", f"{where} is missing")
    raise RecordError("invalid_content", f"{where} must be a string, got {json_kind(field)}")


def content_text(content: Any, where: str) -> str:
    """Return a message's content: a string, or text-only content parts joined.

    A part is ``{"type": "text", "text": …}`` (OpenAI) or ``{"type": "text", "value": …}``
    (LLaMA-Factory's v1 format); the parts join with nothing between them.
    """
    if type(content) is str:
        return content
    if type(content) is list:  # OpenAI content parts: text-only lists are joined
        texts = []
        for j, part in enumerate(content):
            if type(part) is not dict or part.get("type") != "text":
                kind = part.get("type") if type(part) is dict else json_kind(part)
                raise RecordError(
                    "invalid_content",
                    f"{where} part {j} is {kind!r}; only text parts are supported",
                )
            key = "value" if "text" not in part and "value" in part else "text"  # LLaMA-Factory v1
            texts.append(string_field(part.get(key), f"{where} part {j} {key}"))
        return "".join(texts)
    return string_field(content, where)


def read_messages(turns: Any, name: str, form: tuple[dict[str, str], str, str, str]) -> list:
    """Read the list ``turns`` (``name`` in errors) as :class:`Message` values in ``form``."""
    roles, role_key, text_key, allowed = form
    if type(turns) is not list:
        raise RecordError("invalid_message", f"'{name}' must be a list, got {json_kind(turns)}")
    if not turns:
        raise RecordError("empty_conversation", f"'{name}' is empty")
    out = []
    for i, turn in enumerate(turns):
        if type(turn) is not dict:
            why = f"{name}[{i}] is {a_json_kind(turn)}, expected an object"
            raise RecordError("invalid_message", f"{why} with '{role_key}' and '{text_key}'")
        raw_role = turn.get(role_key)
        text = turn.get(text_key)
        if raw_role is None and role_key == "from":  # ShareGPT files in role/content form
            raw_role, text = turn.get("role"), turn.get("content")
        role = roles.get(raw_role) if type(raw_role) is str else None
        if role is None:
            what = f"unknown role {raw_role!r}" if raw_role is not None else f"no '{role_key}'"
            raise RecordError("unknown_role", f"{name}[{i}] has {what} (allowed: {allowed})")
        extra: tuple[tuple[str, Any], ...] = ()
        if len(turn) > 2:  # the other fields, for the template; null ones dropped (as transformers)
            extra = tuple((k, v) for k, v in turn.items() if k not in TURN_KEYS and v is not None)
        text, thought = thinking_parts(text, f"{name}[{i}] content", role)
        extra, thought, train = read_fields(role, extra, thought, f"{name}[{i}]")
        if text is None and extra:
            calls = turn.get("tool_calls")
            if calls is not None and type(calls) is not list:
                raise RecordError(
                    "invalid_message",
                    f"{name}[{i}] 'tool_calls' must be a list, got {json_kind(calls)}",
                )
            if calls:  # an OpenAI tool-calling turn: "content": null
                text = ""
        parts = content_parts(text, f"{name}[{i}] content") if type(text) is list else None
        if parts is not None:  # a turn with images: its text parts, and the parts in order
            joined = "".join(t for kind, t in parts if kind == "text")
            out.append(Message(role, joined, extra, thought, train, parts))
            continue
        out.append(Message(role, content_text(text, f"{name}[{i}] content"), extra, thought, train))
    return out


def with_system(value: dict[str, Any], messages: list) -> list:
    """Prepend the record's ``system`` string when the messages have no system message."""
    system = value.get("system")
    if system is None or system == "":
        return messages
    system = string_field(system, "'system'")
    if any(m.role == "system" for m in messages):
        return messages
    return [Message("system", system), *messages]


def tools_of(value: dict[str, Any]) -> tuple[Any, ...] | None:
    """Return the record's ``tools`` (a list, or a JSON string of one); None when none."""
    tools = value.get("tools")
    if type(tools) is str:
        try:
            tools = json.loads(tools) if tools.strip() else None
        except ValueError as exc:
            raise RecordError("invalid_tools", f"'tools' is not valid JSON ({exc})") from None
    if tools is None:
        return None
    if type(tools) is not list:
        raise RecordError(
            "invalid_tools",
            f"'tools' must be a list or a JSON string of one, got {json_kind(tools)}",
        )
    return tuple(tools) or None
