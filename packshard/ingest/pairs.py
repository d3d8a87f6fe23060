r"""Preference pairs and unpaired (KTO) records, read into one :class:`Conversation` each.

A preference record names a prompt and two answers; every layout becomes
``Conversation(messages=prompt, answers=(chosen, rejected))``, each answer one assistant
message, so that each branch renders as its own conversation ``prompt + [answer]``::

    layout (keys, not null)                   prompt                         answers
    prompt + chosen + rejected (TRL)          prompt: a string (one user     strings (one assistant
                                              turn) or a message list        turn each), a message
                                                                             or a one-message list
    chosen + rejected, both message lists     the longest common prefix      what follows it
      (TRL's implicit prompt)                 of the two conversations
    conversations + chosen + rejected         conversations (from/value)     message objects
      (LLaMA-Factory)                                                        (from/value) or strings
    chosen_messages + rejected_messages       as the implicit prompt (or ``prompt`` when given)

``system``, ``tools`` and per-message flags apply as for chat.  What follows the prompt must
be exactly one assistant message (``invalid_pair``); two identical conversations are an
``identical_pair``.

An unpaired record (a boolean ``label`` with ``messages``, or with ``prompt`` and
``completion`` as in TRL's unpaired layout, read as a pair's prompt and one answer) becomes
``Conversation(messages, kto_label=label)``: one example, its label carried to the reader::

    {"prompt": "Capital of France?", "completion": "Paris.", "label": true}
    -> [user "Capital of France?", assistant "Paris."], kto_label True

Rendered, each example carries a pair code (``Rendered.pair``: 0 plain, 1 chosen, 2 rejected,
3 KTO undesirable, 4 KTO desirable); shards carry it as ``branch`` (0, 1, 2) and ``kto_label``
(−1 none, 0, 1).  Packed, a pair is a unit, chosen then rejected in one row
(:mod:`packshard.pack.plan.pairs`).
"""

from __future__ import annotations

import json
from typing import Any

from packshard.errors import RecordError
from packshard.ingest.messages import (
    MESSAGE_FORM,
    SHAREGPT_FORM,
    read_messages,
    tools_of,
    with_system,
)
from packshard.ingest.read.jsonparse import a_json_kind, json_kind
from packshard.ingest.types import Conversation, Message

PAIR_KEYS = (("chosen", "rejected"), ("chosen_messages", "rejected_messages"))
"""The key pairs a preference record is detected by (both present and not null)."""


def is_preference(value: dict[str, Any]) -> bool:
    """Tell whether a record is a preference pair (its keys; see the module notes)."""
    get = value.get
    for a, b in PAIR_KEYS:  # a loop, not any(<generator>): this runs on every record read
        if get(a) is not None and get(b) is not None:
            return True
    return False


def is_kto(value: dict[str, Any]) -> bool:
    """Tell whether a record is an unpaired KTO one (see the module notes).

    A ``label`` with ``messages``, or with ``prompt`` and ``completion``.  Any label that is not
    null counts: a ``"false"`` is refused by :func:`from_kto`, never trained as an answer.
    """
    get = value.get
    if get("label") is None:
        return False
    return get("messages") is not None or (
        get("prompt") is not None and get("completion") is not None
    )


def _invalid(reason: str) -> RecordError:
    return RecordError("invalid_pair", reason)


def _answer(value: Any, name: str, form: tuple[dict[str, str], str, str, str]) -> list[Message]:
    """Read one answer: a string, one message object, or a list of messages."""
    if type(value) is str:
        return [Message("assistant", value)]
    if type(value) in (dict, list):
        return read_messages([value] if type(value) is dict else value, name, form)
    raise _invalid(
        f"'{name}' must be a string, a message or a message list, got {json_kind(value)}"
    )


def _prompt(value: Any, form: tuple[dict[str, str], str, str, str]) -> list[Message]:
    if type(value) is str:
        return [Message("user", value)]
    return read_messages(value, "prompt", form)


def _one_answer(rest: list[Message], name: str) -> Message:
    if len(rest) != 1 or rest[0].role != "assistant":
        roles = ", ".join(m.role for m in rest) or "nothing"
        raise _invalid(
            f"'{name}' must end the prompt with exactly one assistant message, got {roles} "
            "(a pair compares one final answer)"
        )
    return rest[0]


def from_preference(value: dict[str, Any], ref: Any, domain: str) -> Conversation:
    """Return a preference record as a prompt and its two answers (see the module notes)."""
    get = value.get
    keys = next((k for k in PAIR_KEYS if get(k[0]) is not None and get(k[1]) is not None), None)
    if keys is None:
        raise RecordError(
            "missing_field",
            "a preference record needs 'chosen' and 'rejected' (or 'chosen_messages' and "
            "'rejected_messages')",
        )
    shared = get("conversations")
    form = SHAREGPT_FORM if shared is not None else MESSAGE_FORM
    head = next((h for h in (shared, get("prompt"), get("messages")) if h is not None), None)
    chosen = _answer(get(keys[0]), keys[0], form)
    rejected = _answer(get(keys[1]), keys[1], form)
    if head is not None:
        prompt = _prompt(head, form)
    else:  # the implicit prompt: the longest common prefix of two whole conversations
        if type(get(keys[0])) is not list or type(get(keys[1])) is not list:
            raise RecordError(
                "missing_field",
                f"no prompt: '{keys[0]}' and '{keys[1]}' are not conversations and there is "
                "no 'prompt' or 'conversations' (give the prompt, or whole conversations)",
            )
        pairs = zip(chosen, rejected, strict=False)
        n = next((n for n, (a, b) in enumerate(pairs) if a != b), min(len(chosen), len(rejected)))
        if n == len(chosen) and n == len(rejected):
            raise RecordError(
                "identical_pair", f"'{keys[0]}' and '{keys[1]}' are the same conversation"
            )
        if n == 0:
            raise _invalid(
                f"'{keys[0]}' and '{keys[1]}' share no prompt (their first messages differ)"
            )
        prompt, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
    answers = (_one_answer(chosen, keys[0]), _one_answer(rejected, keys[1]))
    msgs = tuple(with_system(value, prompt))
    return Conversation(ref, domain, "preference", msgs, tools_of(value), answers=answers)


def _shown(value: Any) -> str:
    """Spell a scalar label as JSON (cut at 40 characters), in parentheses; '' for others."""
    if not isinstance(value, str | int | float):
        return ""
    return f"({json.dumps(value, ensure_ascii=True)[:40]})"


def from_kto(value: dict[str, Any], ref: Any, domain: str) -> Conversation:
    """Return an unpaired KTO record: its conversation and its boolean ``label``."""
    label = value.get("label")
    if type(label) is not bool:
        raise RecordError(
            "invalid_content",
            f"'label' must be true or false, got {a_json_kind(label)} {_shown(label)} (write the "
            "KTO label as a JSON boolean, or rename the field if it is not one)",
        )
    turns = value.get("messages")
    if turns is not None:
        msgs = tuple(with_system(value, read_messages(turns, "messages", MESSAGE_FORM)))
    elif value.get("prompt") is not None and value.get("completion") is not None:
        completion = _answer(value["completion"], "completion", MESSAGE_FORM)  # TRL's layout
        if len(completion) != 1:
            raise RecordError(
                "invalid_content",
                f"'completion' must be one assistant message, got {len(completion)} messages "
                "(a KTO label judges one answer)",
            )
        prompt = _prompt(value["prompt"], MESSAGE_FORM)
        msgs = tuple(with_system(value, [*prompt, *completion]))
    else:
        raise RecordError(
            "missing_field",
            "missing field 'messages' (or 'prompt' and 'completion') required by format kto",
        )
    if msgs[-1].role != "assistant":
        raise RecordError(
            "no_assistant_turn", "a KTO record must end with the assistant message it labels"
        )
    return Conversation(ref, domain, "kto", msgs, tools_of(value), kto_label=label)
