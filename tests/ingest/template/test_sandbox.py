"""The rendering conventions the manifest records are the ones the sandbox applies.

Each rule of ``CONVENTION_RULES`` is checked against :func:`make_environment`, so a change of
the sandbox that leaves the recorded id alone fails here: bump ``CONVENTIONS_ID`` with it.
"""

from __future__ import annotations

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from packshard.errors import TemplateError
from packshard.ingest.template.sandbox import (
    CONVENTION_RULES,
    CONVENTIONS_ID,
    GenerationExtension,
    make_environment,
    template_conventions,
)


def render(source: str, **values: object) -> str:
    return make_environment().from_string(source).render(**values)


def test_the_recorded_conventions_are_the_id_and_the_rules():
    assert CONVENTIONS_ID == "hf-chat-template/1"
    assert template_conventions() == {"id": CONVENTIONS_ID, "rules": list(CONVENTION_RULES)}
    assert len(CONVENTION_RULES) == 5


def test_rule_immutable_sandbox_with_trim_and_lstrip_blocks():
    env = make_environment()
    assert isinstance(env, ImmutableSandboxedEnvironment)
    assert env.trim_blocks and env.lstrip_blocks
    assert render("  {% if x %}\nyes\n  {% endif %}\n", x=True) == "yes\n"


def test_rule_tojson_keeps_unicode_order_and_html():
    assert render("{{ v | tojson }}", v={"b": "é<&>", "a": 1}) == '{"b": "é<&>", "a": 1}'


def test_rule_the_globals():
    env = make_environment()
    assert {"raise_exception", "strftime_now", "namespace", "dict"} <= set(env.globals)
    with pytest.raises(TemplateError, match=r"^stop here$"):
        render("{{ raise_exception('stop here') }}")
    with pytest.raises(SecurityError, match="starts with an underscore"):
        render("{% set ns = namespace(_x=1) %}")


def test_rule_the_extensions():
    env = make_environment()
    names = {type(ext) for ext in env.extensions.values()}
    assert names == {GenerationExtension, loopcontrols}
    text = "{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"
    assert render(text) == "1"
    assert render("{% generation %}ok{% endgeneration %}") == "ok"


def test_rule_unsafe_attributes_raise():
    with pytest.raises(SecurityError, match="unsafe"):
        render("{{ x.__class__ }}", x="a")
