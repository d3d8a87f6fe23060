r"""The fast renderer: ``minijinja`` for the templates it provably renders like the sandbox.

``--backend`` chooses the renderer as it chooses the encoder: the sandbox, or ``minijinja``
(``pip install 'packshard[fast]'``, about 6× faster on Qwen3's template), decided once per
template and backend, in three gates::

    template ──► minijinja installed? ── no ──► sandbox ("not installed")
                   │ yes
                   ▼
    the screen (template.screen) passes it? ── no ──► sandbox (the construct, in one line)
    generation blocks at top level
                   │ yes
                   ▼
    canary conversations (hard strings, tool calls, reasoning, every added token) rendered
    both ways: text and generation spans equal? ── no ──► sandbox (auto only)
                   │ yes
                   ▼
    the first FIRST_RENDERS renders of the input made both ways (auto only); the first
    difference puts the rest of the run on the sandbox

**Each render** is the sandbox's render unless all of these hold; otherwise the sandbox renders
that record (same text, same reject)::

    record (messages, tools, variables) serialises with orjson, and holds none of
    U+001C–U+001F where the template trims or splits (Python's str.strip strips them,
    Rust's does not), nor U+FDD0/U+FDD1 where it has generation tags (the markers)
        ▼
    minijinja renders within fuel = min(MAX_FUEL, FUEL_CHARS // (record + template chars))
    (an output or value grows by at most a record per step: at most FUEL_CHARS characters)
        ▼
    the text is at most the template's max_chars

``{% generation %}`` tags print U+FDD0 and U+FDD1, cut out of the text to give the blocks'
spans where the sandbox's recorder puts them; ``tojson`` is the sandbox's.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import replace
from typing import Any

import orjson

from packshard.errors import TemplateError, UsageError
from packshard.ingest.template.render import ChatTemplate, render_reference
from packshard.ingest.template.sandbox import hf_json, raise_exception, strftime_now
from packshard.ingest.template.screen import CLOSE, OPEN, reads_whitespace, rewrite, screen
from packshard.ingest.tokens.backends import CANARY, installed_version

FAST_RENDER = "minijinja"
INSTALL = "pip install 'packshard[fast]'"
FIRST_RENDERS = 256
"""Renders of the input made both ways before ``auto`` trusts the fast renderer for the run."""
FUEL_CHARS = 64 << 20
"""Fuel times the largest value a step can add: a bound on what one fast render builds."""
MAX_FUEL = 2_000_000
_SEPARATOR = re.compile(rb"\\u001[cdefCDEF]")  # U+001C–U+001F as orjson writes them
_MARKER = re.compile(rb"\xef\xb7[\x90\x91]")  # U+FDD0, U+FDD1 in UTF-8


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    if indent is not None and not (type(indent) is int and 0 <= indent <= 16):
        raise TemplateError("tojson indent the fast renderer leaves to the sandbox")
    return hf_json(x, ensure_ascii, indent, separators, sort_keys)


class FastRenderer:
    """minijinja with transformers' conventions over one screened template."""

    def __init__(self, template: ChatTemplate) -> None:
        import minijinja

        env = minijinja.Environment(
            trim_blocks=True, lstrip_blocks=True, pycompat=True, keep_trailing_newline=False
        )
        env.debug = False
        env.add_global("raise_exception", raise_exception)
        env.add_global("strftime_now", strftime_now)
        env.add_filter("tojson", _tojson)
        env.add_global("packshard_open", OPEN)
        env.add_global("packshard_close", CLOSE)
        env.add_template("chat", rewrite(template.text))
        self._env, self._generation = env, template.has_generation
        self._whitespace = reads_whitespace(template.text)
        self._base = len(template.text)

    def render(
        self,
        template: ChatTemplate,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        variables: dict[str, Any],
        add_generation_prompt: bool,
    ) -> tuple[str, list[tuple[int, int]]] | None:
        """Render like the sandbox; None where the sandbox must render this record."""
        try:
            data = orjson.dumps((messages, tools, variables))
        except (TypeError, orjson.JSONEncodeError):
            return None
        # (each substring test before its search, 5x cheaper; isascii before it, 20x)
        if self._whitespace and b"\\u001" in data and _SEPARATOR.search(data) is not None:
            return None
        if self._generation and not data.isascii() and b"\xef\xb7" in data:
            if _MARKER.search(data) is not None:
                return None
        self._env.fuel = min(MAX_FUEL, FUEL_CHARS // (len(data) + self._base))
        try:
            text = self._env.render_template(
                "chat",
                **variables,
                messages=messages,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
            )
        except Exception:  # raise_exception, fuel, a type minijinja lacks: the sandbox says
            return None
        if len(text) > template.limits.max_chars:
            return None
        return _cut_markers(text) if self._generation else (text, [])


def _cut_markers(text: str) -> tuple[str, list[tuple[int, int]]] | None:
    """Cut the markers out of ``text``: the text and each non-empty block's span."""
    pieces = text.split(OPEN)
    if CLOSE in pieces[0]:  # unbalanced: never from a screened template
        return None
    out, spans, at = [pieces[0]], [], len(pieces[0])
    for piece in pieces[1:]:
        inner, found, rest = piece.partition(CLOSE)
        if not found or CLOSE in rest:
            return None
        if inner:
            spans.append((at, at + len(inner)))
        out += (inner, rest)
        at += len(inner) + len(rest)
    return "".join(out), spans


def canary_calls(variables: dict[str, Any]) -> list[tuple[list[dict[str, Any]], Any, bool]]:
    """Conversations the canary renders: hard strings in every role, tools, reasoning."""
    words = [*CANARY, *(str(v) for v in variables.values() if isinstance(v, str))]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Météo ☀ for a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "unit": {"enum": ["°C", "°F"]}},
                    "required": ["city"],
                },
            },
        }
    ]
    calls: list[tuple[list[dict[str, Any]], Any, bool]] = []
    for w in words:
        chat = [{"role": "user", "content": w}, {"role": "assistant", "content": w}]
        calls += [(chat, None, False), (chat[:1], None, True)]
    every = [{"role": "system", "content": " ".join(words[:4])}]
    for w in words:
        every += [{"role": "user", "content": w}, {"role": "assistant", "content": f" {w} "}]
    calls.append((every, None, False))
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "巴黎"}}}
    tool_chat: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"temp": 21, "unit": "°C"}'},
        {"role": "assistant", "content": "<think>\nwarm\n</think>\n\nIt is 21 °C."},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "Bye", "reasoning_content": "short\n"},
    ]
    calls += [(tool_chat, tools, False), (tool_chat, None, False), (tool_chat[:1], tools, True)]
    return calls


def _both(
    template: ChatTemplate, fast: FastRenderer, call: tuple[Any, ...], variables: dict[str, Any]
) -> str | None:
    messages, tools, prompt = call
    got = fast.render(template, messages, tools, variables, prompt)
    try:
        want = render_reference(template, messages, tools, variables, prompt)
    except TemplateError:
        want = None
    if got is not None and got != want:
        return f"{messages[-1]['content'][:24]!r}… renders differently"
    return None


class Renderer:
    """The renderer one run uses for one template: decided once, then fixed."""

    def __init__(self, template: ChatTemplate, variables: dict[str, Any], requested: str) -> None:
        self.requested, self.variables = requested, variables
        self.fast: FastRenderer | None = None
        self.reason = "reference requested" if requested == "reference" else ""
        self._unproven = FIRST_RENDERS if requested == "auto" else 0  # renders left to check
        self._lock = threading.Lock()
        if requested != "reference":
            self._try_fast(template)

    def _refuse(self, why: str) -> None:
        if self.requested == "fast" and why.endswith(f"({INSTALL})"):
            raise UsageError(f"--backend fast: {why} (use --backend auto or reference)")
        self.fast, self.reason = None, why

    def _try_fast(self, template: ChatTemplate) -> None:
        if installed_version(FAST_RENDER) is None:
            return self._refuse(f"{FAST_RENDER} is not installed ({INSTALL})")
        if (why := screen(template.text)) is not None:
            return self._refuse(f"{FAST_RENDER} is not used for this template: {why}")
        try:
            self.fast = FastRenderer(template)
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return self._refuse(f"{FAST_RENDER} cannot compile this template: {first}")
        if self.requested == "auto":
            for call in canary_calls(self.variables):
                if (where := _both(template, self.fast, call, self.variables)) is not None:
                    return self._refuse(f"{FAST_RENDER} differs on the canary: {where}")
            self.reason = "canary equal"
        else:
            self.reason = "fast requested"

    def render(
        self,
        template: ChatTemplate,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        variables: dict[str, Any],
        add_generation_prompt: bool,
    ) -> tuple[str, list[tuple[int, int]]] | None:
        """Render fast where proven; None where the sandbox renders."""
        fast = self.fast
        if fast is None:
            return None
        got = fast.render(template, messages, tools, variables, add_generation_prompt)
        if got is None or not self._unproven:
            return got
        with self._lock:
            call = (messages, tools, add_generation_prompt)
            if self.fast is not None and (where := _both(template, fast, call, variables)):
                self._refuse(f"{FAST_RENDER} differs on the input: {where}")
            self._unproven = max(self._unproven - 1, 0)
        return got if self.fast is not None else None

    @property
    def name(self) -> str:
        """The library that renders (``minijinja`` or ``jinja2``)."""
        return FAST_RENDER if self.fast is not None else "jinja2"

    def entry(self) -> dict[str, Any]:
        """Return what the manifest's ``environment.backends`` records about rendering."""
        return {
            "name": self.name,
            "version": installed_version(self.name),
            "requested": self.requested,
            "reason": self.reason,
        }


_RENDERERS: dict[tuple[int, str, str], tuple[Any, Renderer]] = {}
_CHOOSING = threading.Lock()


def renderer_for(template: ChatTemplate, variables: dict[str, Any], backend: str) -> Renderer:
    """Return the run's renderer for ``template`` under ``--backend backend`` (decided once).

    Keyed by the compiled template (a loaded template and its bounded copies share it; each
    load decides anew, as each loaded tokenizer does for its encoder), which the cache holds
    so that its id is not reused.
    """
    key = (id(template.compiled), json.dumps(variables, sort_keys=True, default=str), backend)
    with _CHOOSING:
        found = _RENDERERS.get(key)
        if found is None:
            found = _RENDERERS[key] = (template.compiled, Renderer(template, variables, backend))
        return found[1]


def with_renderer(
    template: ChatTemplate | None, variables: dict[str, Any], backend: str
) -> ChatTemplate | None:
    """Return ``template`` rendering through the run's renderer (itself for the reference)."""
    if template is None or backend == "reference":
        return template
    renderer = renderer_for(template, variables, backend)
    return replace(template, fast=renderer) if renderer.fast is not None else template


def render_entry(template: ChatTemplate | None, variables: dict[str, Any], backend: str) -> Any:
    """Return the manifest's ``environment.backends.render`` for this run.

    Without a template nothing is rendered: the entry names the sandbox and nothing was
    requested of it (no line is said about it).
    """
    if template is None:
        return {"name": "jinja2", "version": installed_version("jinja2")}
    if backend == "reference":  # nothing to decide, nothing to keep
        return Renderer(template, variables, backend).entry()
    return renderer_for(template, variables, backend).entry()
