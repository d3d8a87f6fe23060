r"""Render one normalized record and choose the characters to train on.

Each example becomes a :class:`~packshard.ingest.types.Rendered`: the text plus the character
spans to train on, found on one of three label paths::

    generation_tags  the template wraps assistant output in {% generation %} blocks; the
                     blocks decide, character for character (transformers' assistant mask)
    offsets          no blocks: each trained turn as the template renders it, from the end of
                     its header through the end marker that closes it (reasoning block and
                     tool-call markup included), plus a final EOS, so the model learns to stop:
                         <|assistant|>\nSure.<|end|>\n<|endoftext|>
                                        [-----------)  [------------)
    none             every token is trained (plain text, or --loss all)

Chat records are labelled turn by turn by the tiers of :mod:`packshard.ingest.label.tiers`;
reasoning is given to the template as :mod:`packshard.ingest.label.reasoning` says. ``--turns
expand`` makes one example per trained turn, the conversation up to and including it, that turn
alone trained (``Rendered.turn``).  Plain records skip the template: prompt/completion
renders ``prompt + completion + EOS`` and trains ``completion + EOS``; text renders ``[BOS] +
text + EOS``.  Trained turns follow the loss policy (:data:`packshard.options.AUTO_LOSS`),
then the messages' own flags.
"""

from __future__ import annotations

from dataclasses import replace

from packshard.errors import RecordError, TemplateError
from packshard.ingest.label.chat import Chat
from packshard.ingest.label.reasoning import template_messages
from packshard.ingest.label.tiers import label_chat, label_plain, plain_frame
from packshard.ingest.media.expand import QWEN_VL, expand_images
from packshard.ingest.media.grid import image_grid, vision_tokens
from packshard.ingest.read.jsonparse import is_encodable
from packshard.ingest.template.render import ChatTemplate, render_chat
from packshard.ingest.template.sandbox import TemplateSecurityError
from packshard.ingest.tokens.tokenizer import TokenizerBundle
from packshard.ingest.types import Conversation, IngestOptions, Rendered
from packshard.options import EXPANDED_CHARS_PER_TOKEN, resolve_loss


def _own_bos(bundle: TokenizerBundle) -> str:
    """Return the BOS a plain record starts with: the tokenizer's, when it adds one."""
    if bundle.add_bos_token and bundle.bos_token and bundle.bos_token_id is not None:
        return bundle.bos_token
    return ""


def _trained_messages(conv: Conversation, loss: str) -> list[int]:
    """Return the indices of the messages trained: the policy's, then each message's flag."""
    picked = [i for i, m in enumerate(conv.messages) if m.role == "assistant"]
    if loss == "last_assistant":
        picked = picked[-1:]
    elif loss == "completion" and conv.completion_start is not None:
        picked = [i for i in picked if i >= conv.completion_start]
    chosen = set(picked)
    return [i for i, m in enumerate(conv.messages) if m.train or (m.train is None and i in chosen)]


def render_example(
    conv: Conversation,
    template: ChatTemplate | None,
    bundle: TokenizerBundle,
    loss: str,
    options: IngestOptions | None = None,
) -> Rendered:
    r"""Render one normalized record as one example and choose its trained character spans.

    ``options`` gives the reasoning policies (default: :class:`IngestOptions`'s); ``loss``
    replaces its loss policy, and ``--turns`` is taken as ``as_rendered``.

    Raises:
        RecordError: ``template_error`` (the template raised, or a trained turn is missing
            from its output), ``no_assistant_turn`` (the loss policy needs one),
            ``no_trainable_tokens`` (every turn flagged untrained), ``invalid_reasoning``,
            ``reasoning_dropped`` or ``invalid_utf8`` (the text holds a lone surrogate, which
            JSON can spell as ``"\ud800"`` with an escape but no tokenizer can encode),
            placed at ``conv.ref``.
        TemplateError: a chat record but no template, or a sandbox escape (fatal).

    """
    chosen = options or _DEFAULT
    if chosen.loss != loss or chosen.turns != "as_rendered":
        chosen = replace(chosen, loss=loss, turns="as_rendered")
    return render_examples(conv, template, bundle, chosen)[0]


_DEFAULT = IngestOptions()


def expanded_reason(limit: int, turns: int) -> str:
    """Say why a record's ``--turns expand`` examples, over ``limit`` tokens, are rejected."""
    return (
        f"its {turns} turn examples (--turns expand) hold more than {limit:,} tokens together "
        "(use --max-expanded-tokens to allow more, or --turns as_rendered)"
    )


def render_examples(
    conv: Conversation,
    template: ChatTemplate | None,
    bundle: TokenizerBundle,
    options: IngestOptions,
) -> tuple[Rendered, ...]:
    """Render one record as its examples: one, or one per trained turn (``--turns expand``).

    A preference pair gives two, chosen then rejected, each ``prompt + [answer]`` with its
    final turn trained; ``Rendered.pair`` tells them apart.

    Raises what :func:`render_example` raises.
    """
    if conv.answers is not None or conv.kto_label is not None:
        out = _render_branches(conv, template, bundle, options)
    else:
        out = _render_examples(conv, template, bundle, options)
    for rendered in out:
        if not is_encodable(text := rendered.text):
            at = next(i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff")
            raise RecordError(
                "invalid_utf8",
                f"rendered text holds a lone surrogate \\u{ord(text[at]):04x} at character {at} "
                "(a JSON escape that is not a Unicode character; fix the record)",
                conv.ref.source,
                conv.ref.line,
            )
    return out


def _render_branches(
    conv: Conversation,
    template: ChatTemplate | None,
    bundle: TokenizerBundle,
    options: IngestOptions,
) -> tuple[Rendered, ...]:
    """Render a pair's branches (or a KTO record) as chat trained on its final turn alone."""
    final = options
    if options.loss != "last_assistant" or options.turns != "as_rendered":
        final = replace(options, loss="last_assistant", turns="as_rendered")
    if conv.answers is None:  # KTO: the whole conversation, its label carried
        (rendered,) = _render_examples(replace(conv, kto_label=None), template, bundle, final)
        return (replace(rendered, pair=4 if conv.kto_label else 3),)
    out = []
    for code, answer in enumerate(conv.answers, start=1):
        branch = replace(conv, messages=(*conv.messages, answer), answers=None)
        (rendered,) = _render_examples(branch, template, bundle, final)
        out.append(replace(rendered, pair=code))
    return tuple(out)


def _render_examples(
    conv: Conversation,
    template: ChatTemplate | None,
    bundle: TokenizerBundle,
    options: IngestOptions,
) -> tuple[Rendered, ...]:
    loss = resolve_loss(options.loss, conv.format)
    eos = bundle.eos_token or ""

    def reject(code: str, reason: str) -> RecordError:
        return RecordError(code, reason, conv.ref.source, conv.ref.line)

    if conv.text is not None and loss != "all":
        raise reject(
            "no_assistant_turn",
            f"plain text record has no assistant turn to "
            f"train with --loss {loss} (use --loss all or auto)",
        )
    if not conv.is_chat:  # prompt/completion, or text (no prompt, and --loss all)
        bos = _own_bos(bundle)
        head = bos + (conv.prompt or "")
        text = head + (conv.completion or conv.text or "") + eos
        lo, path = (0, "none") if loss == "all" else (len(head), "offsets")
        return (Rendered(text, ((lo, len(text)),), path, len(bos)),)
    if template is None:
        raise TemplateError(
            f"{bundle.path}: the tokenizer has no chat template (use --template chatml or "
            "--template FILE.jinja)"
        )
    trained = _trained_messages(conv, loss)
    if loss == "all":
        if (i := next((i for i, m in enumerate(conv.messages) if m.train is False), -1)) >= 0:
            raise reject(
                "invalid_flag",
                f"message {i + 1} is flagged untrained, but --loss all trains every token "
                "(use --loss assistant to honour per-message flags)",
            )
    elif not trained:
        if not any(m.role == "assistant" for m in conv.messages):
            raise reject("no_assistant_turn", f"no assistant message to train with --loss {loss}")
        raise reject(
            "no_trainable_tokens",
            f"every turn --loss {loss} trains is flagged untrained "
            "(a weight of 0 or 'train': false)",
        )
    messages, has = template_messages(
        conv.messages, template, options.reasoning, options.reasoning_markers, conv.ref
    )
    tools = list(conv.tools) if conv.tools is not None else None
    frame = plain_frame(conv.messages, template, bundle, options, loss, tools)  # tier 2, no Chat
    if options.turns == "expand":
        groups = [(messages[: i + 1], [i], i + 1) for i in trained]
    else:
        groups = [(messages, trained, 0)]
    counts = image_counts(conv, template, options)
    out = []
    budget, spent = options.max_expanded_tokens * EXPANDED_CHARS_PER_TOKEN, 0
    for msgs, chosen, turn in groups:
        try:
            text, blocks = render_chat(template, msgs, tools, bundle.special_tokens_map)
        except TemplateSecurityError:
            raise
        except TemplateError as exc:
            raise reject("template_error", str(exc)) from exc
        spent += len(text) if turn else 0
        if spent > budget:  # O(turns²) text: stop before rendering the rest
            raise reject("too_large", expanded_reason(options.max_expanded_tokens, len(groups)))
        if (
            frame is not None
            and (spans := label_plain(text, frame, msgs, chosen, bundle.eos_token)) is not None
        ):
            out.append(Rendered(text, tuple(spans), "offsets", turn=turn))
        else:
            chat = Chat(
                ref=conv.ref,
                template=template,
                bundle=bundle,
                text=text,
                blocks=blocks,
                messages=msgs,
                tools=tools,
                options=options,
                has_reasoning=has,
                everything=loss == "all",
            )
            labelled = label_chat(chat, chosen)
            out.append(replace(labelled, turn=turn) if turn else labelled)
        if conv.media:  # one placeholder per merged patch; vision tokens never trained
            last = out[-1]
            try:
                shown = counts[: last.text.count(PAD)] if turn else counts  # expand: a prefix
                text, moved = expand_images(last.text, last.spans, shown)
            except RecordError as err:
                raise reject(err.code, err.reason) from None
            sizes = tuple((m.width, m.height, m.size) for m in conv.media[: len(shown)])
            out[-1] = replace(
                last,
                text=text,
                spans=moved,
                images=len(shown),
                vision_tokens=sum(shown),
                image_sizes=sizes,
            )
    return tuple(out)


PAD = QWEN_VL.image_pad


def image_counts(conv: Conversation, template: ChatTemplate, options: IngestOptions) -> list[int]:
    """Return each image's placeholder tokens, by the rule of the template's family.

    Raises:
        RecordError: ``media_mismatch`` when the template writes no vision placeholder,
            ``bad_media`` for a size the processor refuses.

    """
    if not conv.media:
        return []
    if not QWEN_VL.writes(template.text):
        raise RecordError(
            "media_mismatch",
            f"the record has {len(conv.media)} image(s) but the template {template.source} writes "
            f"no {PAD} placeholder (use a vision-language template, e.g. Qwen2.5-VL's)",
            conv.ref.source,
            conv.ref.line,
        )
    rule = options.vision_rule()
    try:
        return [vision_tokens(image_grid(m.width, m.height, rule), rule) for m in conv.media]
    except RecordError as err:
        raise err.at(conv.ref.source, conv.ref.line) from None
