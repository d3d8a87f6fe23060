r"""Chat templates: load them, compile them in the sandbox, render conversations.

A chat template is untrusted code, so it runs in the sandbox as ``transformers`` runs it,
except that an unsafe attribute raises (:mod:`packshard.ingest.template.sandbox`).  Message
content is passed as data: ``{{name}}`` inside a message renders literally.

A template comes from the tokenizer folder (``chat_template.jinja``, else the config's
``chat_template``), a ``.jinja`` file, or a built-in name (``chatml``).  :func:`render_chat`
returns the text and, for templates with ``{% generation %}`` blocks, where each block's output
landed; which characters are trained is decided in :mod:`packshard.ingest.label.spans`.

Each render runs under its template's :class:`~packshard.ingest.template.budget.RenderLimits`;
going over them is a :class:`TemplateError` for that record.  A template over
``MAX_TEMPLATE_BYTES``, or too deeply nested to compile, is refused before any record is read.
"""

from __future__ import annotations

import hashlib
import traceback
from itertools import islice
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes

from packshard.errors import InputError, TemplateError
from packshard.ingest.read.regular import open_regular
from packshard.ingest.template.budget import BUDGET, Budget, RenderLimits, TemplateBudgetError
from packshard.ingest.template.sandbox import (
    RECORDER,
    ChatTemplate,
    Recorder,
    SecurityError,
    TemplateSecurityError,
    is_generation,
    make_environment,
)
from packshard.ingest.tokens.tokenizer import TokenizerBundle

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
MAX_TEMPLATE_BYTES = 4 << 20
"""Largest chat template text accepted (real ones are a few kilobytes)."""


def compile_template(text: str, source: str) -> ChatTemplate:
    """Compile ``text`` in the sandbox; ``source`` names it in errors and the manifest."""
    env = make_environment()
    if len(text) > MAX_TEMPLATE_BYTES:
        raise TemplateError(
            f"{source}: template is {len(text):,} characters, more than {MAX_TEMPLATE_BYTES:,} "
            "(not a chat template? choose another with --template)"
        )
    token = BUDGET.set(Budget.start(RenderLimits()))
    try:
        tree = env.parse(text)
        compiled = env.from_string(tree)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"{source}:{exc.lineno}: template syntax error: {exc.message} "
            "(fix the template or choose another with --template)"
        ) from exc
    except (RecursionError, MemoryError, TemplateError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc) or "too large"
        raise TemplateError(
            f"{source}: template cannot be compiled: {why} (fix the template or choose "
            "another with --template)"
        ) from None
    finally:
        BUDGET.reset(token)
    has_generation = any(map(is_generation, tree.find_all(nodes.CallBlock)))
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
    try:
        with open_regular(Path(spec), spec) as fh:  # never a FIFO or a device
            data = fh.read(MAX_TEMPLATE_BYTES + 1)
        if len(data) > MAX_TEMPLATE_BYTES:
            raise TemplateError(
                f"{spec}: template is more than {MAX_TEMPLATE_BYTES:,} bytes (not a chat "
                "template? choose another with --template)"
            )
        text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as text mode
    except InputError as exc:
        why = str(exc).removeprefix(f"{spec}: ")
        raise TemplateError(
            f"{spec}: cannot read chat template: {why} (pass a .jinja file or --template chatml)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(
            f"{spec}: cannot read chat template: {exc} (pass a .jinja file or --template chatml)"
        ) from exc
    return compile_template(text, spec)


def _template_line(exc: BaseException) -> str:
    walk = traceback.walk_tb(exc.__traceback__)
    lines = [n for frame, n in walk if frame.f_code.co_filename == "<template>"]
    return f" (template line {lines[-1]})" if lines else ""


def render_chat(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    tools: list[Any] | None,
    variables: dict[str, Any],
    add_generation_prompt: bool = False,
) -> tuple[str, list[tuple[int, int]]]:
    """Render one conversation; return the text and the ``{% generation %}`` spans.

    The template's fast renderer renders first where it has one; where it declines (a
    record it cannot prove, an error, a limit) the sandbox renders, so every reject is the
    sandbox's (:func:`render_reference`).
    """
    if template.fast is not None:
        got = template.fast.render(template, messages, tools, variables, add_generation_prompt)
        if got is not None:
            return got
    return render_reference(template, messages, tools, variables, add_generation_prompt)


def render_reference(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    tools: list[Any] | None,
    variables: dict[str, Any],
    add_generation_prompt: bool = False,
) -> tuple[str, list[tuple[int, int]]]:
    """Render one conversation in the sandbox; return the text and the generation spans.

    Raises:
        TemplateSecurityError: the template reached outside the sandbox.
        TemplateError: the template raised (``raise_exception``) or failed.

    """
    compiled = template.compiled
    env = compiled.environment
    # Template.render would copy the globals (a ChainMap, slow to walk) on every call.
    context = env.context_class(
        env,
        {
            **template.flat_globals,
            **variables,
            "messages": messages,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        },
        compiled.name,
        compiled.blocks,
    )
    recorder, budget = Recorder(), Budget.start(template.limits)
    token, limit = RECORDER.set(recorder), BUDGET.set(budget)
    try:
        try:
            parts: list[str] = []
            total, most, pieces = 0, budget.limits.max_chars, compiled.root_render_func(context)
            if not template.has_generation:  # a few pieces at a time: bounded, and cheap
                while chunk := list(islice(pieces, 8)):
                    total += sum(map(len, chunk))
                    if total > most:
                        budget.size(total, "rendered text")
                    parts += chunk
                return "".join(parts), []
            for piece in pieces:  # {% generation %} blocks need to know where each piece lands
                total += len(piece)
                if total > most:  # the output is bounded while it is made
                    budget.size(total, "rendered text")
                recorder.emitted = total
                parts.append(piece)
        except Exception:
            env.handle_exception()  # re-raises with template line numbers
    except SecurityError as exc:
        raise TemplateSecurityError(
            f"{template.source}: template tried to leave the sandbox: {exc}{_template_line(exc)}"
        ) from exc
    except TemplateBudgetError as exc:  # its kind kept: a runaway stops the run early
        raise type(exc)(f"{exc}{_template_line(exc)}") from None
    except TemplateError as exc:
        raise TemplateError(f"template raised: {exc}{_template_line(exc)}") from exc
    except Exception as exc:  # a template may fail in many ways; all are the template's
        raise TemplateError(f"template failed: {type(exc).__name__}: {exc}") from exc
    finally:
        RECORDER.reset(token)
        BUDGET.reset(limit)
    text = "".join(parts)
    blocks = [(lo, out) for lo, out in recorder.blocks if out]
    if any(text[lo : lo + len(out)] != out for lo, out in blocks):
        raise TemplateError(
            f"{template.source}: a {{% generation %}} block inside a macro, filter or set "
            "block cannot be located in the output (move it to the top level)"
        )
    return text, [(lo, lo + len(out)) for lo, out in blocks]
