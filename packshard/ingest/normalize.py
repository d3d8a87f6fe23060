r"""Turn every record format into one :class:`Conversation`.

Detection is per record and key based, first match wins (a key holding ``null``, as Parquet
gives for a column a row does not use, counts as absent)::

    key present (not null)   format             other keys read
    messages                 messages           system, tools
    conversations            sharegpt           system, tools
    instruction + output     alpaca             input, system, history
    prompt + completion      prompt_completion  tools (message-list form)
    text                     text               -

Roles end up in :data:`~packshard.options.ROLES`.  ``messages`` also accepts ``developer`` (as
system) and ``function``/``ipython`` (as tool); ShareGPT maps ``human``/``user`` -> user,
``gpt``/``assistant``/``chatgpt``/``bard``/``model`` -> assistant, ``function_call`` -> assistant,
``observation``/``tool``/``function``/``ipython`` -> tool, and also reads ``role``/``content``
turns.  Content is a string; OpenAI content-part lists made only of ``{"type": "text"}`` parts are
joined with no separator; empty strings are kept (templates handle them).  A turn's other fields
(``tool_calls``, ``tool_call_id``, ``name`` …, ``null`` ones dropped) travel in
``Message.extra`` to the template, as ``transformers`` passes them, except the reasoning
fields and training flags :mod:`packshard.ingest.fields` reads; a turn with ``tool_calls``
may have ``content: null`` (OpenAI style), read as ``""``.  A top-level ``system``
string becomes a leading system message when the conversation has none (an empty one is
ignored).  ``tools`` may be a list or a JSON string of one (``"[]"`` counts as no tools).

Alpaca becomes ``[system] + history pairs + user(instruction["\n" + input]) + assistant(output)``.
Prompt/completion strings stay plain (no template); message lists become
``messages = prompt + completion`` with ``completion_start = len(prompt)``.

Whether a conversation has an assistant turn to learn from depends on the loss policy, so it is
checked later, not here.  Normalization is a few dict lookups per message: no copies of values.
"""

from __future__ import annotations

import json
from typing import Any

from packshard.errors import RecordError
from packshard.ingest.fields import read_fields, thinking_parts
from packshard.ingest.read.jsonparse import a_json_kind, json_kind
from packshard.ingest.types import Conversation, Message, RawRecord
from packshard.options import FORMAT_CHOICES, check_choice

_MESSAGE_ROLES = {
    **{r: r for r in ("system", "user", "assistant", "tool")},
    **{"developer": "system", "function": "tool", "ipython": "tool"},
}
_SHAREGPT_ROLES = {
    **{"human": "user", "user": "user", "system": "system"},
    **{r: "assistant" for r in ("gpt", "assistant", "chatgpt", "bard", "model", "function_call")},
    **{r: "tool" for r in ("observation", "tool", "function", "ipython")},
}
_MESSAGE_FORM = (_MESSAGE_ROLES, "role", "content", ", ".join(_MESSAGE_ROLES))
_SHAREGPT_FORM = (_SHAREGPT_ROLES, "from", "value", ", ".join(sorted(_SHAREGPT_ROLES)))


def is_encodable(text: str) -> bool:
    """Tell whether ``text`` can be UTF-8 (JSON can spell lone surrogates; UTF-8 cannot)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def detect_format(value: dict[str, Any]) -> str:
    """Return the format name of a record from its keys; raise ``unknown_format`` otherwise."""
    get = value.get
    if get("messages") is not None:
        return "messages"
    if get("conversations") is not None:
        return "sharegpt"
    if get("instruction") is not None and get("output") is not None:
        return "alpaca"
    if get("prompt") is not None and get("completion") is not None:
        return "prompt_completion"
    if get("text") is not None:
        return "text"
    keys = ", ".join(repr(k) for k in list(value)[:12]) or "none"
    raise RecordError(
        "unknown_format",
        f"unknown record format: keys are {keys} (expected messages, conversations, "
        "instruction+output, prompt+completion or text; use --format to force one)",
    )


def _require(value: dict[str, Any], key: str, fmt: str) -> Any:
    field = value.get(key)
    if field is None:
        raise RecordError("missing_field", f"missing field '{key}' required by format {fmt}")
    return field


def _string(field: Any, where: str) -> str:
    if type(field) is str:
        return field
    if field is None:
        raise RecordError("invalid_content", f"{where} is missing")
    raise RecordError("invalid_content", f"{where} must be a string, got {json_kind(field)}")


def _content(content: Any, where: str) -> str:
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
            texts.append(_string(part.get("text"), f"{where} part {j} text"))
        return "".join(texts)
    return _string(content, where)


def _messages(turns: Any, name: str, form: tuple[dict[str, str], str, str, str]) -> list:
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
        extra = _extra(turn) if len(turn) > 2 else ()
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
        out.append(Message(role, _content(text, f"{name}[{i}] content"), extra, thought, train))
    return out


_TURN_KEYS = frozenset(("role", "content", "from", "value"))


def _extra(turn: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Return the turn's other fields for the template, ``null`` ones dropped (as transformers)."""
    return tuple((k, v) for k, v in turn.items() if k not in _TURN_KEYS and v is not None)


def _with_system(value: dict[str, Any], messages: list) -> list:
    system = value.get("system")
    if system is None or system == "":
        return messages
    system = _string(system, "'system'")
    if any(m.role == "system" for m in messages):
        return messages
    return [Message("system", system), *messages]


def _tools(value: dict[str, Any]) -> tuple[Any, ...] | None:
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


def _from_messages(value: dict[str, Any], ref: Any, domain: str) -> Conversation:
    turns = _require(value, "messages", "messages")
    msgs = _with_system(value, _messages(turns, "messages", _MESSAGE_FORM))
    return Conversation(ref, domain, "messages", tuple(msgs), _tools(value))


def _from_sharegpt(value: dict[str, Any], ref: Any, domain: str) -> Conversation:
    turns = _require(value, "conversations", "sharegpt")
    msgs = _messages(turns, "conversations", _SHAREGPT_FORM)
    return Conversation(ref, domain, "sharegpt", tuple(_with_system(value, msgs)), _tools(value))


def _from_alpaca(value: dict[str, Any], ref: Any, domain: str) -> Conversation:
    instruction = _string(_require(value, "instruction", "alpaca"), "'instruction'")
    output = _string(_require(value, "output", "alpaca"), "'output'")
    extra = value.get("input")
    user = instruction + "\n" + _string(extra, "'input'") if extra else instruction
    msgs: list[Message] = []
    history = value.get("history")
    if history is not None:
        if type(history) is not list:
            raise RecordError(
                "invalid_content", f"'history' must be a list, got {json_kind(history)}"
            )
        for i, pair in enumerate(history):
            if type(pair) not in (list, tuple) or len(pair) != 2:
                raise RecordError(
                    "invalid_content", f"history[{i}] must be a [user, assistant] pair of strings"
                )
            msgs.append(Message("user", _string(pair[0], f"history[{i}][0]")))
            msgs.append(Message("assistant", _string(pair[1], f"history[{i}][1]")))
    msgs += (Message("user", user), Message("assistant", output))
    return Conversation(ref, domain, "alpaca", tuple(_with_system(value, msgs)))


def _from_prompt_completion(value: dict[str, Any], ref: Any, domain: str) -> Conversation:
    prompt = _require(value, "prompt", "prompt_completion")
    completion = _require(value, "completion", "prompt_completion")
    if type(prompt) is str and type(completion) is str:
        return Conversation(ref, domain, "prompt_completion", prompt=prompt, completion=completion)
    if type(prompt) is list and type(completion) is list:
        head = _messages(prompt, "prompt", _MESSAGE_FORM)
        tail = _messages(completion, "completion", _MESSAGE_FORM)
        msgs = tuple(head + tail)
        return Conversation(ref, domain, "prompt_completion", msgs, _tools(value), len(head))
    raise RecordError(
        "invalid_content",
        "'prompt' and 'completion' must both be strings or both lists of messages "
        f"(got {json_kind(prompt)} and {json_kind(completion)})",
    )


def _from_text(value: dict[str, Any], ref: Any, domain: str) -> Conversation:
    text = _string(_require(value, "text", "text"), "'text'")
    return Conversation(ref, domain, "text", text=text)


_BUILDERS = {
    "messages": _from_messages,
    "sharegpt": _from_sharegpt,
    "alpaca": _from_alpaca,
    "prompt_completion": _from_prompt_completion,
    "text": _from_text,
}


def normalize_record(
    raw: RawRecord, fmt: str = "auto", domain_field: str = "domain"
) -> Conversation:
    """Return the record as a :class:`Conversation`; raise :class:`RecordError` at its place.

    ``fmt`` is ``"auto"`` (detect per record) or one of :data:`~packshard.options.FORMATS`.
    The domain is ``value[domain_field]`` when that is a non-empty string, else the file's.
    A record read with an error re-raises that error.
    """
    if raw.error is not None:
        raise raw.error
    value = raw.value
    ref = raw.ref
    try:
        if type(value) is not dict:
            raise RecordError(
                "not_an_object", f"record is {a_json_kind(value)}, expected a JSON object"
            )
        domain = value.get(domain_field)
        if type(domain) is not str or not domain:
            domain = raw.domain
        elif not is_encodable(domain):
            raise RecordError(
                "invalid_utf8",
                f"'{domain_field}' holds a lone surrogate "
                f"({domain!a}), which no output file can store",
            )
        if fmt == "auto":
            return _BUILDERS[detect_format(value)](value, ref, domain)
        check_choice("--format", fmt, FORMAT_CHOICES)
        return _BUILDERS[fmt](value, ref, domain)
    except RecordError as err:
        raise err.at(ref.source, ref.line) from None
