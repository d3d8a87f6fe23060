"""Sandboxed chat templates: loading, the built-in ChatML, the sandbox, generation blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from packshard.errors import TemplateError
from packshard.ingest.label.spans import render_example
from packshard.ingest.template.render import compile_template, load_template, render_chat
from packshard.ingest.template.sandbox import TemplateSecurityError
from packshard.ingest.tokens.tokenizer import load_tokenizer
from tests.helpers import build_tokenizer, conversation, span_texts


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return load_tokenizer(str(build_tokenizer(tmp_path_factory.mktemp("tok"))))


def test_builtin_chatml_renders_exactly(bundle) -> None:
    t = load_template("chatml", bundle)
    assert t.source == "builtin:chatml" and t.has_generation and t.label_spans == "generation_tags"
    assert load_template("builtin:chatml", bundle).sha256 == t.sha256
    r = render_example(
        conversation(("system", "S"), ("user", "U"), ("assistant", "A")), t, bundle, "auto"
    )
    assert r.text == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\nA<|im_end|>\n"
    )
    assert span_texts(r) == ["A<|im_end|>"] and r.label_path == "generation_tags"


def test_builtin_chatml_tools_use_transformers_tojson(bundle) -> None:
    t = load_template("chatml", bundle)
    tools = ({"name": "f", "z": 1, "a": "<&> é"},)
    conv = conversation(("system", "S"), ("user", "U"), ("assistant", "A"), tools=tools)
    r = render_example(conv, t, bundle, "auto")
    assert r.text.startswith(
        "<|im_start|>system\nS\n\n# Tools\n\nYou may call these functions:\n<tools>\n"
        '{"name": "f", "z": 1, "a": "<&> é"}\n</tools><|im_end|>\n<|im_start|>user\nU'
    )


@pytest.mark.parametrize(
    "payload",
    [
        "{{ ''.__class__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.popen('touch {target}') }}",
        "{{ lipsum.__globals__['os'].popen('touch {target}').read() }}",
        "{{ raise_exception.__globals__ }}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ messages.append(1) }}",
        "{{ messages.__class__.mro() }}",
    ],
)
def test_sandbox_escapes_fail_and_run_nothing(bundle, tmp_path: Path, payload: str) -> None:
    target = tmp_path / "pwned"
    t = compile_template(payload.replace("{target}", str(target)), "evil.jinja")
    with pytest.raises(TemplateSecurityError, match=r"evil\.jinja: template tried to leave"):
        render_example(conversation(("user", "u"), ("assistant", "a")), t, bundle, "auto")
    assert not target.exists()
    assert issubclass(TemplateSecurityError, TemplateError)


def test_syntax_error_names_file_and_line(bundle, tmp_path: Path) -> None:
    path = tmp_path / "bad.jinja"
    path.write_text("line one\n{% for m in messages %}\n{{ m }\n")
    with pytest.raises(TemplateError, match=rf"^{path}:3: template syntax error: .*--template"):
        load_template(str(path), bundle)
    with pytest.raises(TemplateError, match="cannot read chat template"):
        load_template(str(tmp_path / "missing.jinja"), bundle)
    with pytest.raises(TemplateError, match="unknown built-in template"):
        load_template("builtin:nope", bundle)
    assert load_template(None, bundle) is None  # the tiny tokenizer has no template


def test_generation_blocks_record_their_spans(bundle) -> None:
    t = compile_template(
        "{% for m in messages %}[{{ m['role'] }}]{% if m['role'] == 'assistant' %}"
        "{% generation %}{{ m['content'] }}!{% endgeneration %}{% else %}{{ m['content'] }}"
        "{% endif %}{% endfor %}",
        "g",
    )
    text, spans = render_chat(t, [{"role": "user", "content": "u"},
                                  {"role": "assistant", "content": "a1"},
                                  {"role": "assistant", "content": ""}], None, {})  # fmt: skip
    assert text == "[user]u[assistant]a1![assistant]!"
    assert [text[a:b] for a, b in spans] == ["a1!", "!"]
    assert spans == [(18, 21), (32, 33)]


def test_generation_block_captured_by_set_is_refused(bundle) -> None:
    t = compile_template(
        "{% set x %}{% generation %}A{% endgeneration %}{% endset %}pre{{ x }}", "set.jinja"
    )
    with pytest.raises(TemplateError, match="inside a macro"):
        render_chat(t, [{"role": "assistant", "content": "a"}], None, {})
