r"""Turn every record format into one :class:`Conversation`.

Detection is per record and key based, first match wins (a key holding ``null``, as Parquet
gives for a column a row does not use, counts as absent)::

    key present (not null)   format             other keys read
    chosen + rejected        preference         prompt, conversations, system, tools
    chosen_messages + …      preference         (see :mod:`packshard.ingest.pairs`)
    messages + label         kto                system, tools (a label not boolean is refused)
    prompt + completion +    kto                system, tools (TRL's unpaired layout)
      label
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
joined with no separator; a chat record's images (an ``images`` list with ``<image>``
placeholders, image content parts, LLaVA's ``image``) become image parts and sized files
(:mod:`packshard.ingest.media.parts`); empty strings are kept (templates handle them).  A
turn's other fields (``tool_calls``, ``tool_call_id``, ``name`` …, ``null`` ones dropped) travel in
``Message.extra`` to the template, as ``transformers`` passes them (reasoning and flags aside:
:mod:`packshard.ingest.fields`); ``content: null`` with ``tool_calls`` reads as ``""``.  A
top-level ``system`` string leads when the conversation has none; ``tools`` may be a list or
a JSON string of one.

Alpaca becomes ``[system] + history pairs + user(instruction["\n" + input]) + assistant(output)``.
Prompt/completion strings stay plain (no template); message lists become
``messages = prompt + completion`` with ``completion_start = len(prompt)``.

Whether a conversation has a turn to learn from depends on the loss policy: checked later.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from packshard.errors import RecordError
from packshard.ingest.media.files import record_root
from packshard.ingest.media.parts import attach_media, has_media
from packshard.ingest.messages import (
    MESSAGE_FORM,
    SHAREGPT_FORM,
    read_messages,
    require,
    string_field,
    tools_of,
    with_system,
)
from packshard.ingest.pairs import from_kto, from_preference, is_kto, is_preference
from packshard.ingest.read.jsonparse import a_json_kind, is_encodable, json_kind
from packshard.ingest.types import Conversation, Message, RawRecord
from packshard.options import FORMAT_CHOICES, check_choice


def detect_format(value: dict[str, Any]) -> str:
    """Return the format name of a record from its keys; raise ``unknown_format`` otherwise."""
    get = value.get
    if is_preference(value):
        return "preference"
    if is_kto(value):
        return "kto"
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
        "instruction+output, prompt+completion, text, or chosen+rejected; use --format to "
        "force one)",
    )


def _from_chat(
    key: str,
    form: Any,
    fmt: str,
    value: dict[str, Any],
    ref: Any,
    domain: str,
    media_root: str | None = None,
) -> Conversation:
    msgs = with_system(value, read_messages(require(value, key, fmt), key, form))
    if has_media(value) or any(m.parts for m in msgs):  # images: parts in order, files sized
        msgs, media = attach_media(value, msgs, record_root(ref.source, media_root))
        return Conversation(ref, domain, fmt, tuple(msgs), tools_of(value), media=media)
    return Conversation(ref, domain, fmt, tuple(msgs), tools_of(value))


def _from_alpaca(value: dict[str, Any], ref: Any, domain: str) -> Conversation:
    instruction = string_field(require(value, "instruction", "alpaca"), "'instruction'")
    output = string_field(require(value, "output", "alpaca"), "'output'")
    extra = value.get("input")
    user = instruction + "\n" + string_field(extra, "'input'") if extra else instruction
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
            msgs.append(Message("user", string_field(pair[0], f"history[{i}][0]")))
            msgs.append(Message("assistant", string_field(pair[1], f"history[{i}][1]")))
    msgs += (Message("user", user), Message("assistant", output))
    return Conversation(ref, domain, "alpaca", tuple(with_system(value, msgs)))


def _from_prompt_completion(value: dict[str, Any], ref: Any, domain: str) -> Conversation:
    prompt = require(value, "prompt", "prompt_completion")
    completion = require(value, "completion", "prompt_completion")
    if type(prompt) is str and type(completion) is str:
        return Conversation(ref, domain, "prompt_completion", prompt=prompt, completion=completion)
    if type(prompt) is list and type(completion) is list:
        head = read_messages(prompt, "prompt", MESSAGE_FORM)
        tail = read_messages(completion, "completion", MESSAGE_FORM)
        msgs = tuple(head + tail)
        return Conversation(ref, domain, "prompt_completion", msgs, tools_of(value), len(head))
    raise RecordError(
        "invalid_content",
        "'prompt' and 'completion' must both be strings or both lists of messages "
        f"(got {json_kind(prompt)} and {json_kind(completion)})",
    )


def _from_text(value: dict[str, Any], ref: Any, domain: str) -> Conversation:
    text = string_field(require(value, "text", "text"), "'text'")
    return Conversation(ref, domain, "text", text=text)


_BUILDERS: dict[str, Callable[..., Conversation]] = {
    "messages": partial(_from_chat, "messages", MESSAGE_FORM, "messages"),
    "sharegpt": partial(_from_chat, "conversations", SHAREGPT_FORM, "sharegpt"),
    "alpaca": _from_alpaca,
    "prompt_completion": _from_prompt_completion,
    "text": _from_text,
    "preference": from_preference,
    "kto": from_kto,
}


def normalize_record(
    raw: RawRecord,
    fmt: str = "auto",
    domain_field: str = "domain",
    media_root: str | None = None,
) -> Conversation:
    """Return the record as a :class:`Conversation`; raise :class:`RecordError` at its place.

    ``fmt`` is ``"auto"`` or one of :data:`~packshard.options.FORMATS`; images resolve against
    ``media_root``, else the record's folder.  The domain is ``value[domain_field]`` when a
    non-empty string, else the file's.
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
            fmt = detect_format(value)
        else:
            check_choice("--format", fmt, FORMAT_CHOICES)
        if fmt in ("messages", "sharegpt"):
            return _BUILDERS[fmt](value, ref, domain, media_root)
        if has_media(value):
            raise RecordError("invalid_content", f"images in a {fmt} record are not supported")
        return _BUILDERS[fmt](value, ref, domain)
    except RecordError as err:
        raise err.at(ref.source, ref.line) from None
