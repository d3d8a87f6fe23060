"""Sandboxed chat templates, generation spans and loss policies."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tokenize import build_tokenizer

from packshard.errors import RecordError, TemplateError
from packshard.records import Conversation, Message, SourceRef
from packshard.ingest.templates import (
    TemplateSecurityError,
    compile_template,
    load_template,
    render_chat,
    render_example,
)
from packshard.ingest.tokenizer import load_tokenizer

REF = SourceRef("chat.jsonl", 7)
# ChatML without generation tags: labels come from the offsets path.
PLAIN_CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{{ eos_token }}"
)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return load_tokenizer(str(build_tokenizer(tmp_path_factory.mktemp("tok"))))


def chat(*turns: tuple[str, str], fmt: str = "messages", start: int | None = None, tools=None):
    msgs = tuple(Message(role, content) for role, content in turns)
    return Conversation(REF, "d", fmt, msgs, tools, start)


def spans_text(r) -> list[str]:
    return [r.text[a:b] for a, b in r.spans]


def test_builtin_chatml_renders_exactly(bundle) -> None:
    t = load_template("chatml", bundle)
    assert t.source == "builtin:chatml" and t.has_generation and t.label_spans == "generation_tags"
    assert load_template("builtin:chatml", bundle).sha256 == t.sha256
    r = render_example(chat(("system", "S"), ("user", "U"), ("assistant", "A")), t, bundle, "auto")
    assert r.text == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\nA<|im_end|>\n"
    )
    assert spans_text(r) == ["A<|im_end|>"] and r.label_path == "generation_tags"


def test_builtin_chatml_tools_use_transformers_tojson(bundle) -> None:
    t = load_template("chatml", bundle)
    tools = ({"name": "f", "z": 1, "a": "<&> é"},)
    r = render_example(chat(("system", "S"), ("user", "U"), ("assistant", "A"), tools=tools), t,
                       bundle, "auto")  # fmt: skip
    assert r.text.startswith(
        "<|im_start|>system\nS\n\n# Tools\n\nYou may call these functions:\n<tools>\n"
        '{"name": "f", "z": 1, "a": "<&> é"}\n</tools><|im_end|>\n<|im_start|>user\nU'
    )


def test_content_is_data_not_template_source(bundle) -> None:
    t = load_template("chatml", bundle)
    conv = chat(("user", "Hi {{name}} {% if x %}"), ("assistant", "I am {{name}} by {{author}}"))
    r = render_example(conv, t, bundle, "auto")
    assert "Hi {{name}} {% if x %}" in r.text
    assert spans_text(r) == ["I am {{name}} by {{author}}<|im_end|>"]


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
        render_example(chat(("user", "u"), ("assistant", "a")), t, bundle, "auto")
    assert not target.exists()
    assert issubclass(TemplateSecurityError, TemplateError)


def test_raise_exception_message_becomes_a_placed_reject(bundle) -> None:
    t = compile_template("{{ raise_exception('Roles must alternate user/assistant') }}", "x")
    with pytest.raises(RecordError) as info:
        render_example(chat(("user", "u"), ("assistant", "a")), t, bundle, "auto")
    err = info.value
    assert err.code == "template_error"
    assert (err.source, err.line) == ("chat.jsonl", 7)
    assert "template raised: Roles must alternate user/assistant" in str(err)


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


def test_offsets_path_extends_over_end_marker_and_final_eos(bundle) -> None:
    t = compile_template(PLAIN_CHATML, "plain")
    conv = chat(("user", "yes"), ("assistant", "yes"), ("user", "no"), ("assistant", "ok"))
    r = render_example(conv, t, bundle, "assistant")
    assert r.label_path == "offsets"
    assert spans_text(r) == ["yes<|im_end|>", "ok<|im_end|>", "<|endoftext|>"]
    assert r.spans[0][0] == r.text.index("assistant\nyes") + len("assistant\n")  # not the user's
    last = render_example(conv, t, bundle, "last_assistant")
    assert spans_text(last) == ["ok<|im_end|>", "<|endoftext|>"]
    everything = render_example(conv, t, bundle, "all")
    assert everything.spans == ((0, len(everything.text)),) and everything.label_path == "none"


def test_offsets_and_generation_paths_agree(bundle) -> None:
    gen = compile_template(
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
        "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}"
        "{% endgeneration %}{{ '\\n' }}{% else %}{{ m['content'] + '<|im_end|>\\n' }}{% endif %}"
        "{% endfor %}{% generation %}{{ eos_token }}{% endgeneration %}",
        "gen",
    )
    off = compile_template(PLAIN_CHATML, "plain")
    conv = chat(("system", "s"), ("user", "q"), ("assistant", "a"), ("user", "q2"),
                ("assistant", "  "))  # fmt: skip
    for loss in ("assistant", "last_assistant", "all"):
        a = render_example(conv, gen, bundle, loss)
        b = render_example(conv, off, bundle, loss)
        assert a.text == b.text
        from packshard.ingest.labels import encode_rendered

        assert (encode_rendered(bundle, [a])[1] == encode_rendered(bundle, [b])[1]).all(), loss


def test_empty_assistant_content_trains_the_end_marker(bundle) -> None:
    t = compile_template(PLAIN_CHATML, "plain")
    r = render_example(chat(("user", "q"), ("assistant", "")), t, bundle, "assistant")
    assert spans_text(r) == ["<|im_end|>", "<|endoftext|>"]
    assert r.spans[0][0] == r.text.index("assistant\n") + len("assistant\n")


def test_rewritten_assistant_content_is_a_template_error(bundle) -> None:
    t = compile_template(
        "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}", "upper.jinja"
    )
    with pytest.raises(RecordError, match=r"chat\.jsonl:7: message 2 \(assistant\) does not"):
        render_example(chat(("user", "q"), ("assistant", "ok")), t, bundle, "assistant")


def test_loss_policies_and_missing_assistant(bundle) -> None:
    t = load_template("chatml", bundle)
    with pytest.raises(RecordError) as info:
        render_example(chat(("system", "s"), ("user", "u")), t, bundle, "auto")
    assert info.value.code == "no_assistant_turn" and "--loss assistant" in info.value.reason
    r = render_example(chat(("system", "s"), ("user", "u")), t, bundle, "all")
    assert r.label_path == "none"
    pc = chat(("user", "u"), ("assistant", "early"), ("user", "v"), ("assistant", "late"),
              fmt="prompt_completion", start=2)  # fmt: skip
    assert spans_text(render_example(pc, t, bundle, "auto")) == ["late<|im_end|>"]
    assert spans_text(render_example(pc, t, bundle, "assistant")) == [
        "early<|im_end|>",
        "late<|im_end|>",
    ]


def test_plain_prompt_completion_and_text(bundle, tmp_path: Path) -> None:
    pc = Conversation(REF, "d", "prompt_completion", prompt="2+2=", completion="4")
    r = render_example(pc, None, bundle, "auto")
    assert r.text == "2+2=4<|endoftext|>" and spans_text(r) == ["4<|endoftext|>"]
    assert spans_text(render_example(pc, None, bundle, "all")) == ["2+2=4<|endoftext|>"]
    text = Conversation(REF, "d", "text", text="hello")
    r = render_example(text, None, bundle, "auto")
    assert (r.text, r.label_path) == ("hello<|endoftext|>", "none")
    with pytest.raises(RecordError, match="no assistant turn"):
        render_example(text, None, bundle, "assistant")
    with pytest.raises(TemplateError, match=r"no chat template .*--template chatml"):
        render_example(chat(("user", "u"), ("assistant", "a")), None, bundle, "auto")
    config = {"bos_token": "<|im_start|>", "add_bos_token": True}  # no eos token at all
    other = load_tokenizer(str(build_tokenizer(tmp_path / "b", config)))
    assert render_example(text, None, other, "auto").text == "<|im_start|>hello"


def test_phi3_training_template_masks_like_transformers_describes(shared_data: Path) -> None:
    folder = shared_data / "tokenizers" / "phi-3-mini"
    bundle = load_tokenizer(str(folder))
    training = load_template(str(folder / "chat_template.training.jinja"), bundle)
    config = load_template(None, bundle)
    assert training.has_generation and not config.has_generation
    assert config.source == "tokenizer_config.json"
    conv = chat(("system", "s"), ("user", "u"), ("assistant", "a"))
    r = render_example(conv, training, bundle, "auto")
    assert spans_text(r) == ["a<|end|>\n", "<|endoftext|>"]
    assert spans_text(render_example(conv, config, bundle, "auto")) == ["a<|end|>", "<|endoftext|>"]
