"""A message's reasoning and its training flags: the fields read beside role and content.

Reasoning (the chain of thought an assistant message carries) arrives under several names,
all read, in this order of precedence, and kept as ``Message.reasoning``::

    reasoning_content   DeepSeek API, Qwen3 / GLM / Nemotron templates, vLLM <= 0.10
    reasoning           vLLM >= 0.11, OpenRouter
    thinking            gpt-oss and LFM templates, Ollama
    content parts       [{"type": "thinking", "thinking": "…"}, {"type": "text", …}]

Two sources that disagree, or a value that is not a string, are a reject
(``invalid_reasoning``); an inline block stays in the content
(:mod:`packshard.ingest.label.reasoning`).  On other roles than assistant these fields travel
to the template untouched.

Training flags override the loss policy for one message (``Message.train``), in every
per-message convention of the formats read::

    "train": true | false      any role: train this message, or never train it
    "weight": 0 | 1            OpenAI's fine-tuning format
    "loss_weight": 0.0 | 1.0   LLaMA-Factory's v1 format (on every message), preference sets

A weight reads the same under either name, on any role: 0 = context only; 1 = the default on
an assistant message, trained on another role.  ``train`` wins over a weight; disagreeing
weights, or any other value (a token is trained or not: 0.5 cannot be honoured), are a reject
(``invalid_flag``).
"""

from __future__ import annotations

from typing import Any

from packshard.errors import RecordError
from packshard.ingest.read.jsonparse import a_json_kind

REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
WEIGHT_FIELDS = ("weight", "loss_weight")
_READ = frozenset((*REASONING_FIELDS, "train", *WEIGHT_FIELDS))


def _kind(value: Any) -> str:
    """Name a JSON value for a message; a number by its value (``the number 2``)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"the number {value}"
    return a_json_kind(value)


def thinking_parts(content: Any, where: str, role: str) -> tuple[Any, str | None]:
    """Split ``{"type": "thinking"}`` parts off a content-part list: ``(content, reasoning)``.

    Content that is not a list, a list without thinking parts, or the content of a message
    that is not the assistant's (its parts must be text) comes back unchanged.
    """
    if role != "assistant" or type(content) is not list:
        return content, None
    thoughts, rest = [], []
    for j, part in enumerate(content):
        kind = part.get("type") if type(part) is dict else None
        if kind == "redacted_thinking":
            raise RecordError(
                "invalid_reasoning",
                f"{where} part {j} is redacted thinking, which cannot be trained on "
                "(remove it, or the record)",
            )
        if kind != "thinking":
            rest.append(part)
            continue
        text = part.get("thinking")
        if type(text) is not str:
            raise RecordError(
                "invalid_reasoning",
                f"{where} part {j} 'thinking' must be a string, got {_kind(text)}",
            )
        thoughts.append(text)
    return (rest, "".join(thoughts)) if thoughts else (content, None)


def read_fields(
    role: str,
    extra: tuple[tuple[str, Any], ...],
    reasoning: str | None,
    where: str,
) -> tuple[tuple[tuple[str, Any], ...], str | None, bool | None]:
    """Return ``(extra without the fields read, reasoning, train flag)`` of one message.

    ``reasoning`` is what the content parts already gave (or ``None``); ``where`` names the
    message in errors (``messages[3]``).
    """
    if not any(k in _READ for k, _ in extra):
        return extra, reasoning, None
    rest = []
    train: bool | None = None
    weights: dict[str, Any] = {}
    source = "thinking parts" if reasoning is not None else None
    for key, value in extra:
        if key in REASONING_FIELDS and role == "assistant":
            if type(value) is not str:
                raise RecordError(
                    "invalid_reasoning", f"{where} '{key}' must be a string, got {_kind(value)}"
                )
            if reasoning is not None and value != reasoning:
                raise RecordError(
                    "invalid_reasoning",
                    f"{where} has {source} and '{key}' with different text (keep one)",
                )
            reasoning, source = value, source or f"'{key}'"
        elif key == "train":
            if type(value) is not bool:
                raise RecordError(
                    "invalid_flag", f"{where} 'train' must be true or false, got {_kind(value)}"
                )
            train = value
        elif key in WEIGHT_FIELDS:
            weights[key] = value
        else:
            rest.append((key, value))
    if weights:
        weighted = _weight_flag(role, weights, where)
        train = weighted if train is None else train
    return tuple(rest), reasoning, train


def _weight_flag(role: str, weights: dict[str, Any], where: str) -> bool | None:
    """Return the train flag a message's ``weight``/``loss_weight`` asks for (module docstring)."""
    for key, value in weights.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value not in (0, 1):
            raise RecordError(
                "invalid_flag",
                f"{where} '{key}' must be 0 or 1, got {_kind(value)} "
                "(a token is trained or not: use 0 for context, 1 to train)",
            )
    if len(set(weights.values())) > 1:
        raise RecordError(
            "invalid_flag",
            f"{where} has 'weight' {weights['weight']:g} and 'loss_weight' "
            f"{weights['loss_weight']:g} (keep one)",
        )
    if next(iter(weights.values())) == 0:
        return False
    return None if role == "assistant" else True
