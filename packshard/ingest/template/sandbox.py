"""The sandbox chat templates run in: Jinja's immutable sandbox, the way transformers sets it up.

A chat template is untrusted code.  It runs in ``ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True)`` with the globals and filters Hugging Face templates expect, and one
stricter rule: an unsafe attribute (``__class__``, ``mro`` …) or an underscore name of a
``namespace()`` raises :class:`TemplateSecurityError` instead of rendering as empty.

``{% generation %}…{% endgeneration %}`` blocks (the Hugging Face convention for the assistant
tokens to train) are compiled by :class:`GenerationExtension`, which records where each
block's output lands in the rendered text through the context-local :data:`RECORDER`.

These conventions together are named :data:`CONVENTIONS_ID` and listed in
:data:`CONVENTION_RULES`; ``pack`` records both in the manifest's environment, and ``verify``
reports a pack made under other conventions.  Any change of a rule (another ``tojson``, other
whitespace control, a new global) bumps the number in the id.

Every render is also bounded in time and size (:mod:`packshard.ingest.template.budget`); the
generated code differs from Jinja's in two places only (:class:`_CheckedCode`): loops iterate
through the ``packshard_loop`` filter and ``a ~ b`` joins through ``environment.checked_join``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.ext import Extension, loopcontrols
from jinja2.runtime import markup_join
from jinja2.sandbox import (
    ImmutableSandboxedEnvironment,
    SandboxedEscapeFormatter,
    SandboxedFormatter,
    SecurityError,
)
from jinja2.utils import generate_lorem_ipsum
from markupsafe import Markup

from packshard.errors import TemplateError
from packshard.ingest.template import budget
from packshard.ingest.template.budget import RenderLimits

__all__ = [
    "CONVENTIONS_ID",
    "CONVENTION_RULES",
    "RECORDER",
    "ChatTemplate",
    "GenerationExtension",
    "Recorder",
    "SecurityError",
    "TemplateSecurityError",
    "is_generation",
    "make_environment",
    "template_conventions",
]

CONVENTIONS_ID = "hf-chat-template/1"
CONVENTION_RULES = (
    "jinja2 ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks",
    "tojson: ensure_ascii=False, keys in given order, no HTML escaping",
    "globals: raise_exception, strftime_now, namespace (no underscore names), dict",
    "extensions: loopcontrols and {% generation %} blocks",
    "an unsafe attribute raises instead of rendering empty",
)


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template and where it came from (recorded in the manifest)."""

    source: str
    text: str
    sha256: str
    has_generation: bool
    compiled: jinja2.Template = field(repr=False, compare=False)
    flat_globals: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    limits: RenderLimits = field(default=RenderLimits(), compare=False)
    fast: Any = field(default=None, repr=False, compare=False)
    """The run's fast renderer (:mod:`packshard.ingest.template.fast`), None for the sandbox."""

    @property
    def label_spans(self) -> str:
        """The label path chat records take: ``generation_tags`` or ``offsets``."""
        return "generation_tags" if self.has_generation else "offsets"

    def bounded(self, max_chars: int, seconds: float) -> ChatTemplate:
        """Return this template rendering under the given size and time budget."""
        return dataclasses.replace(self, limits=RenderLimits(max_chars, seconds))


def template_conventions() -> dict[str, object]:
    """Return the manifest's record of these conventions: their id and rules."""
    return {"id": CONVENTIONS_ID, "rules": list(CONVENTION_RULES)}


class TemplateSecurityError(TemplateError):
    """The template tried to leave the sandbox; nothing it asked for was executed."""


@dataclass(slots=True)
class Recorder:
    """Characters emitted so far and the ``{% generation %}`` blocks seen, in order."""

    emitted: int = 0
    blocks: list[tuple[int, str]] = field(default_factory=list)


RECORDER: ContextVar[Recorder | None] = ContextVar("packshard_generation", default=None)


class GenerationExtension(Extension):
    """``{% generation %}…{% endgeneration %}``: record where the block's output lands."""

    tags = {"generation"}  # noqa: RUF012 (jinja reads this class attribute)

    def parse(self, parser: Any) -> nodes.Node:
        """Compile the block into a call that records its output."""
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_generation")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation(self, caller: Any) -> str:
        out = str(caller())
        if (recorder := RECORDER.get()) is not None:
            recorder.blocks.append((recorder.emitted, out))
        return out


def is_generation(node: nodes.Node) -> bool:
    """Tell whether ``node`` is a ``{% generation %}`` block of a parse tree."""
    return (
        isinstance(node, nodes.CallBlock)
        and isinstance(node.call.node, nodes.ExtensionAttribute)
        and node.call.node.name == "_generation"
    )


class _CheckedCode(CodeGenerator):
    """Jinja's code generator, with loops and ``~`` joins run through the budget."""

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        """Route every loop's iterable through the ``packshard_loop`` filter, then compile."""
        for loop in node.find_all(nodes.For):
            wrapped = nodes.Filter(loop.iter, LOOP_FILTER, [], [], None, None)
            loop.iter = wrapped.set_lineno(loop.lineno)
        super().visit_Template(node, frame)

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        """Join ``a ~ b`` through ``environment.checked_join`` (its size checked first)."""
        markup = "context.eval_ctx.volatile" if frame.eval_ctx.volatile else "False"
        if frame.eval_ctx.autoescape:
            markup = "True"
        self.write(f"environment.checked_join({markup}, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _CheckedFormatter(SandboxedFormatter):
    def format_field(self, value: Any, format_spec: str) -> Any:
        budget.check_format_spec(format_spec)
        return super().format_field(budget.check_printed(value), format_spec)


class _CheckedEscapeFormatter(_CheckedFormatter, SandboxedEscapeFormatter):
    """The same checks, then Markup's escaping (``SandboxedEscapeFormatter`` is next in line)."""


class _Sandbox(ImmutableSandboxedEnvironment):
    code_generator_class = _CheckedCode
    intercepted_binops = frozenset(("+", "*", "**", "%"))

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "+" and type(left) is str and type(right) is str:  # most of them
            if len(left) + len(right) > budget.BIG:
                budget.check_binop(operator, left, right)
            return left + right
        budget.check_binop(operator, left, right)
        return self.binop_table[operator](left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        budget.check_call(__obj, args, kwargs)
        if __obj is generate_lorem_ipsum:  # lipsum(n=5, html=True, min=20, max=100)
            n = kwargs.get("n", args[0] if args else 5)
            most = kwargs.get("max", args[3] if len(args) > 3 else 100)
            if type(n) is int and type(most) is int:
                budget.current().size(n * max(most, 1) * 12, "lorem ipsum text")
        return budget.check_result(super().call(__context, __obj, *args, **kwargs))

    def checked_join(self, markup: bool, parts: tuple[Any, ...]) -> Any:
        """Join ``a ~ b ~ …`` as Jinja's ``str_join`` (``markup_join``) does, size checked."""
        if markup:
            budget.current().size(sum(len(str(p)) for p in parts), "string")
            return markup_join(parts)
        return budget.checked_join(parts)

    def concat(self, seq: Iterable[Any]) -> str:
        """Every join of buffered output ({% set %} blocks, macros, caller()), size-checked."""
        return budget.checked_join(seq)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``str.format`` as Jinja sandboxes it, with field widths checked."""
        methods = (types.MethodType, types.BuiltinMethodType)
        if not isinstance(value, methods) or value.__name__ not in ("format", "format_map"):
            return None
        f_self = value.__self__
        if not isinstance(f_self, str):
            return None
        formatter: SandboxedFormatter
        if isinstance(f_self, Markup):
            formatter = _CheckedEscapeFormatter(self, escape=f_self.escape)
        else:
            formatter = _CheckedFormatter(self)
        format_map = value.__name__ == "format_map"

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if format_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one positional argument")
                kwargs, args = args[0], ()
            return type(f_self)(formatter.vformat(f_self, args, kwargs))

        return functools.update_wrapper(wrapper, value)


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore names (no reaching into internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # same signature trick as jinja's
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"namespace attribute {name!r} starts with an underscore")


LOOP_FILTER = "packshard_loop"


@jinja2.pass_context  # never folded at compile time: a loop's iterable is made per render
def _loop_filter(_context: Any, iterable: Any) -> Any:
    return budget.checked_loop(iterable)


def raise_exception(message: Any) -> None:
    """Reject the record with a template's ``raise_exception(message)``."""
    raise TemplateError(str(message))


def strftime_now(fmt: str) -> str:
    """Return the local time formatted, a template's ``strftime_now(fmt)``."""
    return datetime.now().strftime(fmt)


def hf_json(
    x: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """``tojson`` as transformers defines it: ``json.dumps``, non-ASCII kept, keys in order."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    unit = indent if type(indent) is int else len(str(indent or ""))
    budget.current().size(unit * 1024, "tojson indent")  # deeper indents than any real one
    budget.check_printed(x, "tojson input")
    return hf_json(x, ensure_ascii, indent, separators, sort_keys)


def make_environment() -> _Sandbox:
    """Create a sandboxed environment with transformers' template conventions."""
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationExtension, loopcontrols],
        finalize=budget.check_printed,
    )
    env.filters["tojson"] = _tojson
    env.filters[LOOP_FILTER] = _loop_filter
    budget.check_filters(env.filters)
    env.globals.update(
        raise_exception=raise_exception,
        strftime_now=strftime_now,
        namespace=_Namespace,
        dict=dict,
    )
    return env
