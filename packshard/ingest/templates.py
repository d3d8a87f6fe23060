r"""Render conversations through sandboxed chat templates and find the characters to train on.

A chat template is untrusted code (it ships with a downloaded tokenizer), so it runs exactly
as Hugging Face ``transformers`` runs it — ``ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True)``, the ``raise_exception``/``strftime_now`` globals, a ``tojson`` filter
that neither escapes HTML nor sorts keys — with one difference: reaching for an unsafe
attribute (``__class__``, ``__globals__``, ``mro`` …) raises instead of rendering as empty, and
that becomes a :class:`TemplateError` before anything runs.  Message content is passed as
data: ``{{name}}`` inside a message renders literally.

Each example becomes a :class:`Rendered`: the text plus the character spans to train on,
found on one of three label paths::

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
one; no EOS when the tokenizer has none).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes

from packshard.errors import RecordError, TemplateError
from packshard.records import Conversation
from packshard.ingest.sandbox import (
    RECORDER,
    GenerationExtension,
    Recorder,
    SecurityError,
    TemplateSecurityError,
    make_environment,
)
from packshard.ingest.tokenizer import TokenizerBundle

__all__ = [
    "BUILTINS",
    "CHATML",
    "LABEL_PATHS",
    "ChatTemplate",
    "GenerationExtension",
    "Rendered",
    "TemplateSecurityError",
    "compile_template",
    "load_template",
    "locate_contents",
    "render_chat",
    "render_example",
    "search_contents",
]

LABEL_PATHS = ("generation_tags", "offsets", "none")
CHATML = r"""{%- set ns = namespace(start=0) %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages and messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] + '\n\n' }}
        {%- set ns.start = 1 %}
    {%- endif %}
    {{- '# Tools\n\nYou may call these functions:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools><|im_end|>\n' }}
{%- endif %}
{%- for message in messages[ns.start:] %}
    {{- '<|im_start|>' + message['role'] + '\n' }}
    {%- if message['role'] == 'assistant' %}
        {%- generation %}
        {{- message['content'] + '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\n' }}
    {%- else %}
        {{- message['content'] + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
BUILTINS = {"chatml": CHATML}


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template and where it came from (recorded in the manifest)."""

    source: str
    text: str
    sha256: str
    has_generation: bool
    compiled: jinja2.Template = field(repr=False, compare=False)
    flat_globals: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def label_spans(self) -> str:
        """The label path chat records take: ``generation_tags`` or ``offsets``."""
        return "generation_tags" if self.has_generation else "offsets"


@dataclass(frozen=True, slots=True)
class Rendered:
    """One rendered example: its text and the character spans ``[lo, hi)`` to train on.

    ``bos_chars`` > 0: the text starts with the tokenizer's BOS, put there for the tokenizer
    (plain records), so it becomes the BOS id and the rest is encoded as if alone — what
    ``add_special_tokens=True`` gives; a SentencePiece "first" prefix then lands on the text.
    """

    text: str
    spans: tuple[tuple[int, int], ...]
    label_path: str
    bos_chars: int = 0


def compile_template(text: str, source: str) -> ChatTemplate:
    """Compile ``text`` in the sandbox; ``source`` names it in errors and the manifest."""
    env = make_environment()
    try:
        tree = env.parse(text)
        compiled = env.from_string(tree)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"{source}:{exc.lineno}: template syntax error: {exc.message} "
            "(fix the template or choose another with --template)"
        ) from exc
    has_generation = any(
        isinstance(n.call, nodes.Call)
        and isinstance(n.call.node, nodes.ExtensionAttribute)
        and n.call.node.name == "_generation"
        for n in tree.find_all(nodes.CallBlock)
    )
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return ChatTemplate(source, text, digest, has_generation, compiled, dict(compiled.globals))


def load_template(spec: str | None, bundle: TokenizerBundle) -> ChatTemplate | None:
    """Load the chat template named by ``spec``.

    ``None`` takes the tokenizer's template (``None`` when it has none): its folder's
    ``chat_template.jinja``, recorded by path, else its config's; ``"chatml"`` or
    ``"builtin:chatml"`` the built-in ChatML; anything else is a path to a Jinja file.
    """
    if spec is None:
        if bundle.chat_template is None:
            return None
        source = bundle.chat_template_path or "tokenizer_config.json"
        return compile_template(bundle.chat_template, source)
    name = spec.removeprefix("builtin:")
    if name in BUILTINS:
        return compile_template(BUILTINS[name], f"builtin:{name}")
    if spec.startswith("builtin:"):
        known = ", ".join(sorted(BUILTINS))
        raise TemplateError(f"{spec}: unknown built-in template (known: {known})")
    path = Path(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(
            f"{spec}: cannot read chat template: {exc} (pass a .jinja file or --template chatml)"
        ) from exc
    return compile_template(text, spec)


def _template_line(exc: BaseException) -> str:
    line = ""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = f" (template line {tb.tb_lineno})"
        tb = tb.tb_next
    return line


def render_chat(
    template: ChatTemplate, messages: list[dict[str, Any]], tools: list[Any] | None,
    variables: dict[str, Any],
) -> tuple[str, list[tuple[int, int]]]:  # fmt: skip
    """Render one conversation; return the text and the ``{% generation %}`` spans.

    Raises:
        TemplateSecurityError: the template reached outside the sandbox.
        TemplateError: the template raised (``raise_exception``) or failed.

    """
    compiled = template.compiled
    env = compiled.environment
    # Template.render would copy the globals (a ChainMap, slow to walk) on every call.
    context = env.context_class(
        env,
        {**template.flat_globals, **variables, "messages": messages, "tools": tools,
         "documents": None, "add_generation_prompt": False},
        compiled.name,
        compiled.blocks,
    )  # fmt: skip
    recorder = Recorder()
    token = RECORDER.set(recorder)
    try:
        try:
            if not template.has_generation:
                return "".join(compiled.root_render_func(context)), []
            parts: list[str] = []
            for piece in compiled.root_render_func(context):
                recorder.emitted += len(piece)
                parts.append(piece)
        except Exception:
            env.handle_exception()  # re-raises with template line numbers
    except SecurityError as exc:
        raise TemplateSecurityError(
            f"{template.source}: template tried to leave the sandbox: {exc}{_template_line(exc)}"
        ) from exc
    except TemplateError as exc:
        raise TemplateError(f"template raised: {exc}{_template_line(exc)}") from exc
    except Exception as exc:  # a template may fail in many ways; all are the template's
        raise TemplateError(f"template failed: {type(exc).__name__}: {exc}") from exc
    finally:
        RECORDER.reset(token)
    text = "".join(parts)
    blocks = [(lo, out) for lo, out in recorder.blocks if out]
    if any(text[lo : lo + len(out)] != out for lo, out in blocks):
        raise TemplateError(
            f"{template.source}: a {{% generation %}} block inside a macro, filter or set "
            "block cannot be located in the output (move it to the top level)"
        )
    return text, [(lo, lo + len(out)) for lo, out in blocks]


@lru_cache(maxsize=16)
def _closer(markers: tuple[str, ...], eos: str | None) -> tuple[re.Pattern[str], re.Pattern[str]]:
    unique = sorted({m for m in markers if m}, key=lambda m: (-len(m), m))
    alternatives = "|".join(re.escape(m) for m in unique)
    marker = re.compile(rf"\s*(?:{alternatives})" if alternatives else r"(?!)")
    final = re.compile(rf"\s*{re.escape(eos)}\s*\Z" if eos else r"(?!)")
    return marker, final


def search_contents(text: str, messages: list[dict[str, Any]]) -> dict[int, tuple[int, int]]:
    """Find each message's content in ``text`` by search, in order: ``{index: (lo, hi)}``.

    The fallback of :func:`locate_contents`.  A message not found (a template may drop roles
    it does not know) is left out and does not move the cursor; stripped content is tried
    when the exact content is missing.
    """
    found: dict[int, tuple[int, int]] = {}
    pos = 0
    for i, message in enumerate(messages):
        content = message["content"]
        for needle in (content, content.strip()):
            if needle and (lo := text.find(needle, pos)) >= 0:
                found[i] = (lo, lo + len(needle))
                pos = lo + len(needle)
                break
    return found


_STAND_IN = re.compile("\ue000([0-9]+)\ue001")


def locate_contents(
    template: ChatTemplate, text: str, messages: list[dict[str, Any]], tools: list[Any] | None,
    variables: dict[str, Any],
) -> dict[int, tuple[int, int]]:  # fmt: skip
    """Find where each message's content sits in ``text``: ``{index: (lo, hi)}``.

    The conversation is rendered once more with every content replaced by a stand-in
    (``\ue000<i>\ue001``).  The template text around the stand-ins is the same as around the
    real contents, so each stand-in's place, shifted by the length differences before it,
    is the content's place — even for an empty content, or one that also occurs in a role
    header (``a`` in ``assistant``).  When the template rewrites content, renders it twice
    or fails on the stand-ins, the contents are searched for instead.
    """
    probe = [m if _calls(m) and not m["content"] else {**m, "content": f"\ue000{i}\ue001"}
             for i, m in enumerate(messages)]  # fmt: skip
    try:
        probe_text, _ = render_chat(template, probe, tools, variables)
    except TemplateError:
        return search_contents(text, messages)
    found: dict[int, tuple[int, int]] = {}
    shift = 0
    for match in _STAND_IN.finditer(probe_text):
        i = int(match.group(1))
        content = messages[i]["content"] if i < len(messages) else None
        lo = match.start() + shift
        if content is None or i in found or text[lo : lo + len(content)] != content:
            return search_contents(text, messages)
        found[i] = (lo, lo + len(content))
        shift += len(content) - len(match.group())
    return found


def _locate_trained(
    template: ChatTemplate, text: str, messages: list[dict[str, Any]], trained: list[int],
    tools: list[Any] | None, bundle: TokenizerBundle,
) -> dict[int, tuple[int, int]]:  # fmt: skip
    """Place the trained messages; a content occurring exactly once needs no second render.

    A tool-calling turn is placed as a whole (:func:`locate_turn`), not by its content.
    """
    variables = bundle.special_tokens_map
    where: dict[int, tuple[int, int]] = {}
    for i in trained:
        if _calls(messages[i]):
            if (turn := locate_turn(template, text, messages, i, tools, variables)) is not None:
                where[i] = turn
            continue
        content = messages[i]["content"]
        if not content or (lo := text.find(content)) < 0 or text.find(content, lo + 1) >= 0:
            found = locate_contents(template, text, messages, tools, variables)
            return {**{i: found[i] for i in trained if i in found}, **where}
        where[i] = (lo, lo + len(content))
    return where


def _calls(message: dict[str, Any]) -> bool:
    return bool(message.get("tool_calls"))


def locate_turn(
    template: ChatTemplate, text: str, messages: list[dict[str, Any]], i: int,
    tools: list[Any] | None, variables: dict[str, Any],
) -> tuple[int, int] | None:  # fmt: skip
    r"""Place all that message ``i`` renders after its role header: ``(lo, hi)``, or ``None``.

        For a turn whose content is not all the model writes (tool calls, rendered from message
        fields, often with no content at all).  The turn is what rendering ``messages[:i + 1]``
        adds to rendering ``messages[:i]``, both prefixes of ``text``; trailing whitespace is left
        out, the closing marker kept.  Its header ends where a plain assistant message in its
        place would start its content (a stand-in says where), or earlier where the two renders
        part::

            before   <|im_start|>user
    Weather?<|im_end|>

            turn     <|im_start|>assistant
    <tool_call>{...}</tool_call><|im_end|>

                                              [--------------------------------)
    """
    try:
        before, _ = render_chat(template, messages[:i], tools, variables)
        upto, _ = render_chat(template, messages[: i + 1], tools, variables)
        plain = [*messages[:i], {"role": messages[i]["role"], "content": "\ue000\ue001"}]
        probe, _ = render_chat(template, plain, tools, variables)
    except TemplateError:
        return None
    if not (upto.startswith(before) and text.startswith(upto)):
        return None
    head = probe.find("\ue000\ue001", len(before))
    if head < 0:
        return None
    parted = len(before)
    while parted < min(head, len(upto)) and probe[parted] == upto[parted]:
        parted += 1
    lo, hi = parted, len(upto.rstrip())
    return (lo, hi) if hi > lo else None


def _own_bos(bundle: TokenizerBundle) -> str:
    """Return the BOS a plain record starts with: the tokenizer's, when it adds one."""
    if bundle.add_bos_token and bundle.bos_token and bundle.bos_token_id is not None:
        return bundle.bos_token
    return ""


def _resolve_loss(conv: Conversation, loss: str) -> str:
    if loss != "auto":
        return loss
    if conv.text is not None:
        return "all"
    return "completion" if conv.format == "prompt_completion" else "assistant"


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
            raise RecordError("invalid_utf8", f"rendered text holds a lone surrogate {where} "
                              "(a JSON escape that is not a Unicode character; fix the record)",
                              conv.ref.source, conv.ref.line) from None  # fmt: skip
    return rendered


def _render_example(
    conv: Conversation, template: ChatTemplate | None, bundle: TokenizerBundle, loss: str
) -> Rendered:
    loss = _resolve_loss(conv, loss)
    eos = bundle.eos_token or ""

    def reject(code: str, reason: str) -> RecordError:
        return RecordError(code, reason, conv.ref.source, conv.ref.line)

    if conv.text is not None:
        if loss != "all":
            raise reject("no_assistant_turn", f"plain text record has no assistant turn to "
                         f"train with --loss {loss} (use --loss all or auto)")  # fmt: skip
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
    messages = [{"role": m.role, "content": m.content, **dict(m.extra)} if m.extra
                else {"role": m.role, "content": m.content} for m in conv.messages]  # fmt: skip
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
    where = _locate_trained(template, text, messages, trained, tools, bundle)
    if template.has_generation:  # keep the blocks from the first trained message on
        first = where.get(trained[0])
        kept = blocks[-1:] if first is None else [b for b in blocks if b[1] > first[0]]
        return Rendered(text, tuple(kept), "generation_tags")
    marker, final = _closer((*bundle.special_tokens, eos), bundle.eos_token)
    spans = []
    for i in trained:
        if i not in where and _calls(messages[i]):
            raise reject(
                "template_error",
                f"message {i + 1} (assistant tool call) cannot be "
                "located: the conversation rendered up to it is not a prefix of the "
                "whole (use a template with {% generation %} blocks via --template)",
            )
        if i not in where:
            raise reject("template_error", f"message {i + 1} (assistant) does not appear in the "
                         "rendered text; the template rewrites it (use a template with "
                         "{% generation %} blocks via --template)")  # fmt: skip
        lo, hi = where[i]
        if not _calls(messages[i]) and (m := marker.match(text, hi)):
            hi = m.end()
        spans.append((lo, hi))
        if (m := final.match(text, hi)) and eos:  # the final EOS, not the gap before it
            end = m.end() - (len(m.group()) - len(m.group().rstrip()))
            spans.append((end - len(eos), end))
    return Rendered(text, tuple(spans), "offsets")
