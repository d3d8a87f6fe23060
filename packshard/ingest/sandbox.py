"""The sandbox chat templates run in: Jinja's immutable sandbox, the way transformers sets it up.

A chat template ships with a downloaded tokenizer, so it is untrusted code.  It runs in
``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with the globals and
filters Hugging Face templates expect (``raise_exception``, ``strftime_now``, ``namespace``, a
``tojson`` that neither escapes HTML nor sorts keys) and one stricter rule: touching an unsafe
attribute (``__class__``, ``__globals__``, ``mro`` …) or an underscore name of a
``namespace()`` raises :class:`TemplateSecurityError` instead of rendering as empty.

``{% generation %}…{% endgeneration %}`` blocks (the Hugging Face convention for the assistant
tokens to train) are compiled by :class:`GenerationExtension`, which records where each
block's output lands in the rendered text through the context-local :data:`RECORDER`.

These conventions together are named :data:`CONVENTIONS_ID` and listed in
:data:`CONVENTION_RULES`; ``pack`` records both in the manifest's environment, and ``verify``
reports a pack made under other conventions.  Any change of a rule (another ``tojson``, other
whitespace control, a new global) bumps the number in the id.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from packshard.errors import TemplateError

__all__ = [
    "CONVENTIONS_ID",
    "CONVENTION_RULES",
    "RECORDER",
    "GenerationExtension",
    "Recorder",
    "SecurityError",
    "TemplateSecurityError",
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


class _Sandbox(ImmutableSandboxedEnvironment):
    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )


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


def _raise_exception(message: str) -> None:
    raise TemplateError(str(message))


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def make_environment() -> _Sandbox:
    """Create a sandboxed environment with transformers' template conventions."""
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationExtension, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        namespace=_Namespace,
        dict=dict,
    )
    return env
