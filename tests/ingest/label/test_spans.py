"""Rendering a record and choosing its trained spans: label paths and loss policies."""

from __future__ import annotations

from pathlib import Path

import pytest

from packshard.errors import RecordError, TemplateError
from packshard.ingest.label.spans import render_example
from packshard.ingest.template.render import compile_template, load_template
from packshard.ingest.tokens.labels import encode_rendered
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import Conversation
from tests.helpers import CHAT_REF, build_tokenizer, conversation, span_texts

# ChatML without generation tags: labels come from the offsets path.
PLAIN_CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{{ eos_token }}"
)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return load_tokenizer(str(build_tokenizer(tmp_path_factory.mktemp("tok"))))


def test_content_is_data_not_template_source(bundle) -> None:
    t = load_template("chatml", bundle)
    conv = conversation(
        ("user", "Hi {{name}} {% if x %}"), ("assistant", "I am {{name}} by {{author}}")
    )
    r = render_example(conv, t, bundle, "auto")
    assert "Hi {{name}} {% if x %}" in r.text
    assert span_texts(r) == ["I am {{name}} by {{author}}<|im_end|>"]


def test_raise_exception_message_becomes_a_placed_reject(bundle) -> None:
    t = compile_template("{{ raise_exception('Roles must alternate user/assistant') }}", "x")
    with pytest.raises(RecordError) as info:
        render_example(conversation(("user", "u"), ("assistant", "a")), t, bundle, "auto")
    err = info.value
    assert err.code == "template_error"
    assert (err.source, err.line) == ("chat.jsonl", 7)
    assert "template raised: Roles must alternate user/assistant" in str(err)


def test_offsets_path_extends_over_end_marker_and_final_eos(bundle) -> None:
    t = compile_template(PLAIN_CHATML, "plain")
    conv = conversation(("user", "yes"), ("assistant", "yes"), ("user", "no"), ("assistant", "ok"))
    r = render_example(conv, t, bundle, "assistant")
    assert r.label_path == "offsets"
    assert span_texts(r) == ["yes<|im_end|>", "ok<|im_end|>", "<|endoftext|>"]
    assert r.spans[0][0] == r.text.index("assistant\nyes") + len("assistant\n")  # not the user's
    last = render_example(conv, t, bundle, "last_assistant")
    assert span_texts(last) == ["ok<|im_end|>", "<|endoftext|>"]
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
    conv = conversation(("system", "s"), ("user", "q"), ("assistant", "a"), ("user", "q2"),
                ("assistant", "  "))  # fmt: skip
    for loss in ("assistant", "last_assistant", "all"):
        a = render_example(conv, gen, bundle, loss)
        b = render_example(conv, off, bundle, loss)
        assert a.text == b.text
        assert (encode_rendered(bundle, [a])[1] == encode_rendered(bundle, [b])[1]).all(), loss


def test_empty_assistant_content_trains_the_end_marker(bundle) -> None:
    t = compile_template(PLAIN_CHATML, "plain")
    r = render_example(conversation(("user", "q"), ("assistant", "")), t, bundle, "assistant")
    assert span_texts(r) == ["<|im_end|>", "<|endoftext|>"]
    assert r.spans[0][0] == r.text.index("assistant\n") + len("assistant\n")


def test_rewritten_assistant_content_is_a_template_error(bundle) -> None:
    t = compile_template(
        "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}", "upper.jinja"
    )
    with pytest.raises(RecordError, match=r"chat\.jsonl:7: message 2 \(assistant\) does not"):
        render_example(conversation(("user", "q"), ("assistant", "ok")), t, bundle, "assistant")


def test_loss_policies_and_missing_assistant(bundle) -> None:
    t = load_template("chatml", bundle)
    with pytest.raises(RecordError) as info:
        render_example(conversation(("system", "s"), ("user", "u")), t, bundle, "auto")
    assert info.value.code == "no_assistant_turn" and "--loss assistant" in info.value.reason
    r = render_example(conversation(("system", "s"), ("user", "u")), t, bundle, "all")
    assert r.label_path == "none"
    pc = conversation(("user", "u"), ("assistant", "early"), ("user", "v"), ("assistant", "late"),
              fmt="prompt_completion", start=2)  # fmt: skip
    assert span_texts(render_example(pc, t, bundle, "auto")) == ["late<|im_end|>"]
    assert span_texts(render_example(pc, t, bundle, "assistant")) == [
        "early<|im_end|>",
        "late<|im_end|>",
    ]


def test_plain_prompt_completion_and_text(bundle, tmp_path: Path) -> None:
    pc = Conversation(CHAT_REF, "d", "prompt_completion", prompt="2+2=", completion="4")
    r = render_example(pc, None, bundle, "auto")
    assert r.text == "2+2=4<|endoftext|>" and span_texts(r) == ["4<|endoftext|>"]
    assert span_texts(render_example(pc, None, bundle, "all")) == ["2+2=4<|endoftext|>"]
    text = Conversation(CHAT_REF, "d", "text", text="hello")
    r = render_example(text, None, bundle, "auto")
    assert (r.text, r.label_path) == ("hello<|endoftext|>", "none")
    with pytest.raises(RecordError, match="no assistant turn"):
        render_example(text, None, bundle, "assistant")
    with pytest.raises(TemplateError, match=r"no chat template .*--template chatml"):
        render_example(conversation(("user", "u"), ("assistant", "a")), None, bundle, "auto")
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
    conv = conversation(("system", "s"), ("user", "u"), ("assistant", "a"))
    r = render_example(conv, training, bundle, "auto")
    assert span_texts(r) == ["a<|end|>\n", "<|endoftext|>"]
    assert span_texts(render_example(conv, config, bundle, "auto")) == ["a<|end|>", "<|endoftext|>"]
