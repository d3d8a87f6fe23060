r"""Render one normalized record and choose the characters to train on.

Each example becomes a :class:`~packshard.records.Rendered`: the text plus the character
spans to train on, found on one of three label paths::

    generation_tags  the template wraps assistant output in {% generation %} blocks; the
                     blocks decide, character for character (transformers' assistant mask)
    offsets          no blocks: each assistant message's content is found in the text (a
                     second render with stand-in contents says where), then the span runs on
                     over whitespace and the special token that closes the turn, plus a
                     final EOS, so the model learns to stop:
                         <|assistant|>\nSure.<|end|>\n<|endoftext|>
                                        [-----------)  [------------)
    none             every token is trained (plain text, or --loss all)

Plain records skip the template: prompt/completion renders ``prompt + completion + EOS`` and
trains ``completion + EOS``; text renders ``[BOS] + text + EOS`` (BOS when the tokenizer adds
one; no EOS when the tokenizer has none).  Which assistant turns are trained follows the loss
policy, ``--loss auto`` resolved per record format (:data:`packshard.records.AUTO_LOSS`).
"""

from __future__ import annotations

import re
from functools import lru_cache

from packshard.errors import RecordError, TemplateError
from packshard.ingest.locate import calls_tools, locate_trained
from packshard.ingest.sandbox import TemplateSecurityError
from packshard.ingest.templates import ChatTemplate, render_chat
from packshard.ingest.tokenizer import TokenizerBundle
from packshard.records import Conversation, Rendered, resolve_loss


@lru_cache(maxsize=16)
def _closer(markers: tuple[str, ...], eos: str | None) -> tuple[re.Pattern[str], re.Pattern[str]]:
    unique = sorted({m for m in markers if m}, key=lambda m: (-len(m), m))
    alternatives = "|".join(re.escape(m) for m in unique)
    marker = re.compile(rf"\s*(?:{alternatives})" if alternatives else r"(?!)")
    final = re.compile(rf"\s*{re.escape(eos)}\s*\Z" if eos else r"(?!)")
    return marker, final


def _own_bos(bundle: TokenizerBundle) -> str:
    """Return the BOS a plain record starts with: the tokenizer's, when it adds one."""
    if bundle.add_bos_token and bundle.bos_token and bundle.bos_token_id is not None:
        return bundle.bos_token
    return ""


def _trained_messages(conv: Conversation, loss: str) -> list[int]:
    """Return the indices of the assistant messages the loss policy trains (maybe none)."""
    picked = [i for i, m in enumerate(conv.messages) if m.role == "assistant"]
    if loss == "last_assistant":
        return picked[-1:]
    if loss == "completion" and conv.completion_start is not None:
        return [i for i in picked if i >= conv.completion_start]
    return picked


def render_example(
    conv: Conversation, template: ChatTemplate | None, bundle: TokenizerBundle, loss: str
) -> Rendered:
    r"""Render one normalized record and choose its trained character spans.

    Raises:
        RecordError: ``template_error`` (the template raised, or an assistant message is
            missing from its output), ``no_assistant_turn`` (the loss policy needs one) or
            ``invalid_utf8`` (the text holds a lone surrogate, which JSON can spell as
            ``"\ud800"`` with an escape but no tokenizer can encode), placed at ``conv.ref``.
        TemplateError: a chat record but no template, or a sandbox escape (fatal).

    """
    rendered = _render_example(conv, template, bundle, loss)
    text = rendered.text
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            where = f"\\u{ord(text[exc.start]):04x} at character {exc.start}"
            raise RecordError(
                "invalid_utf8",
                f"rendered text holds a lone surrogate {where} "
                "(a JSON escape that is not a Unicode character; fix the record)",
                conv.ref.source,
                conv.ref.line,
            ) from None
    return rendered


def _render_example(
    conv: Conversation, template: ChatTemplate | None, bundle: TokenizerBundle, loss: str
) -> Rendered:
    loss = resolve_loss(loss, conv.format)
    eos = bundle.eos_token or ""

    def reject(code: str, reason: str) -> RecordError:
        return RecordError(code, reason, conv.ref.source, conv.ref.line)

    if conv.text is not None:
        if loss != "all":
            raise reject(
                "no_assistant_turn",
                f"plain text record has no assistant turn to "
                f"train with --loss {loss} (use --loss all or auto)",
            )
        bos = _own_bos(bundle)
        text = bos + conv.text + eos
        return Rendered(text, ((0, len(text)),), "none", len(bos))
    if not conv.is_chat:
        bos = _own_bos(bundle)
        head = bos + (conv.prompt or "")
        text = head + (conv.completion or "") + eos
        if loss == "all":
            return Rendered(text, ((0, len(text)),), "none", len(bos))
        return Rendered(text, ((len(head), len(text)),), "offsets", len(bos))
    if template is None:
        raise TemplateError(
            f"{bundle.path}: the tokenizer has no chat template (use --template chatml or "
            "--template FILE.jinja)"
        )
    messages = [
        {"role": m.role, "content": m.content, **dict(m.extra)}
        if m.extra
        else {"role": m.role, "content": m.content}
        for m in conv.messages
    ]
    trained = _trained_messages(conv, loss)
    if loss != "all" and not trained:
        raise reject("no_assistant_turn", f"no assistant message to train with --loss {loss}")
    tools = list(conv.tools) if conv.tools is not None else None
    try:
        text, blocks = render_chat(template, messages, tools, bundle.special_tokens_map)
    except TemplateSecurityError:
        raise
    except TemplateError as exc:
        raise reject("template_error", str(exc)) from exc
    if loss == "all":
        return Rendered(text, ((0, len(text)),), "none")
    every = len(trained) == sum(m.role == "assistant" for m in conv.messages)
    if template.has_generation and every:
        return Rendered(text, tuple(blocks), "generation_tags")
    where = locate_trained(template, text, messages, trained, tools, bundle)
    if template.has_generation:  # keep the blocks from the first trained message on
        first = where.get(trained[0])
        kept = blocks[-1:] if first is None else [b for b in blocks if b[1] > first[0]]
        return Rendered(text, tuple(kept), "generation_tags")
    marker, final = _closer((*bundle.special_tokens, eos), bundle.eos_token)
    spans = []
    for i in trained:
        if i not in where and calls_tools(messages[i]):
            raise reject(
                "template_error",
                f"message {i + 1} (assistant tool call) cannot be "
                "located: the conversation rendered up to it is not a prefix of the "
                "whole (use a template with {% generation %} blocks via --template)",
            )
        if i not in where:
            raise reject(
                "template_error",
                f"message {i + 1} (assistant) does not appear in the "
                "rendered text; the template rewrites it (use a template with "
                "{% generation %} blocks via --template)",
            )
        lo, hi = where[i]
        if not calls_tools(messages[i]) and (m := marker.match(text, hi)):
            hi = m.end()
        spans.append((lo, hi))
        if (m := final.match(text, hi)) and eos:  # the final EOS, not the gap before it
            end = m.end() - (len(m.group()) - len(m.group().rstrip()))
            spans.append((end - len(eos), end))
    return Rendered(text, tuple(spans), "offsets")
