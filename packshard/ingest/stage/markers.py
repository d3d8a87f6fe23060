r"""The template/tokenizer consistency check: every marker the template emits is one token.

A chat template writes its turn markers (``<|im_start|>``, ``<|user|>``, ``<start_of_turn>``)
as text; only a tokenizer that holds each marker as a token turns it back into the one id the
model was trained on.  A template meant for another tokenizer packs silently otherwise:
``--template chatml`` with the phi-3 tokenizer turns ``<|im_start|>`` into seven ordinary
pieces, and trains them.  So before any record is read, :func:`check_markers` collects the
markers and refuses any the tokenizer splits::

    template source ──► string constants ──┐
    probe render (system/user/assistant) ──┴─► special-looking substrings ──► encode each
                                                                   one id: fine; more: error

Which strings are markers (decided here, documented in docs/mistakes.md):

* ``<|name|>`` — the form of ChatML, Phi, Llama 3, DeepSeek markers (any text but ``<|>``);
* ``<start_of_turn>``, ``<end_of_turn>`` — Gemma's turn markers;
* ``<s>``, ``</s>`` — SentencePiece BOS/EOS written by a template.

Plain tags (``<think>``, ``<tool_call>``) and bracket forms (``[INST]``) are not checked: many
tokenizers rightly treat them as text.  The source's literals catch markers on branches the
probe does not take; the probe catches markers built from pieces (``'<|' + role + '|>'``).

A marker is one token when it is an added token of the tokenizer, or when encoding it alone
gives one id (a leading SentencePiece ``▁`` piece aside).  ``--allow-split-markers`` turns
the error into nothing (the split is intended: a base model learning a new format).
"""

from __future__ import annotations

import re

from jinja2 import nodes

from packshard.errors import TemplateError
from packshard.ingest.template.render import BUILTINS, ChatTemplate, compile_template, render_chat
from packshard.ingest.tokens.tokenizer import TokenizerBundle

MARKER = re.compile(r"<\|[^<>|\s]{1,64}\|>|<(?:start|end)_of_turn>|</?s>")
"""What looks like a special marker (see the module docstring)."""

PROBE = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "A"},
    {"role": "user", "content": "V"},
    {"role": "assistant", "content": "B"},
]


def template_markers(template: ChatTemplate) -> list[str]:
    """Return the special-looking strings ``template`` emits, sorted (literals and probe)."""
    tree = template.compiled.environment.parse(template.text)
    texts = [n.value for n in tree.find_all(nodes.Const) if isinstance(n.value, str)]
    texts += [n.data for n in tree.find_all(nodes.TemplateData)]
    try:
        rendered, _ = render_chat(template, PROBE, None, {}, add_generation_prompt=True)
        texts.append(rendered)
    except TemplateError:
        pass  # a template that refuses the probe (roles, system) is checked on its literals
    return sorted({m for text in texts for m in MARKER.findall(text)})


def split_markers(bundle: TokenizerBundle, template: ChatTemplate) -> dict[str, list[str]]:
    """Return every marker ``template`` emits that ``bundle`` splits, with its pieces."""
    tok = bundle.tokenizer
    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    split = {}
    for marker in template_markers(template):
        if marker in added:
            continue
        pieces: list[str] = tok.encode(marker, add_special_tokens=False).tokens
        if len(pieces) > 1 and pieces[0] in ("▁", "Ġ", " "):  # a prefix space of its own
            pieces = pieces[1:]
        if len(pieces) > 1:
            split[marker] = pieces
    return split


def check_markers(
    bundle: TokenizerBundle, template: ChatTemplate | None, allow: bool = False
) -> None:
    """Refuse a template whose markers the tokenizer splits, unless ``allow``.

    Raises:
        TemplateError: a marker splits; the message names it and the fix.

    """
    if template is None or allow:
        return
    split = split_markers(bundle, template)
    if not split:
        return
    marker, pieces = next(iter(split.items()))
    others = (
        f" (and {len(split) - 1} more: {', '.join(list(split)[1:4])})" if len(split) > 1 else ""
    )
    shown = " ".join(pieces[:8]) + (" …" if len(pieces) > 8 else "")
    raise TemplateError(
        f"{template.source}: the template writes {marker} but tokenizer {bundle.path} splits "
        f"it into {len(pieces)} pieces [{shown}]{others}; they would be trained as text "
        f"({_fix(bundle, template)}, or --allow-split-markers if intended)"
    )


def _fix(bundle: TokenizerBundle, template: ChatTemplate) -> str:
    """Name the fix: the tokenizer's own template, else a built-in that matches it."""
    if bundle.chat_template is not None and bundle.chat_template != template.text:
        return "drop --template to use the tokenizer's own chat template"
    for name, text in BUILTINS.items():
        if not split_markers(bundle, compile_template(text, f"builtin:{name}")):
            return f"use --template {name}"
    return "pass --template with a .jinja file written for this tokenizer"
