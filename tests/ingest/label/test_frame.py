"""A template's assistant header and end markers, found by rendering a user message twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from packshard.ingest.label.frame import template_frame
from packshard.ingest.template.render import compile_template, load_template
from packshard.ingest.tokens.tokenizer import load_tokenizer
from tests.helpers import BY_NAME, THINK, build_qwen

MARKERS = ("<think>", "</think>")
HEADERS = {
    "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "qwen": "<|im_start|>assistant\n",
    "gemma": "<start_of_turn>model\n",
    "echo": "<|assistant|>\n",
    "mistral": "",  # the template ignores add_generation_prompt: turns start at their content
    "llama2-metaspace": "",
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("frames")
    return {name: BY_NAME[name].build(root / name) for name in HEADERS}


@pytest.mark.parametrize("name", list(HEADERS))
def test_the_header_is_what_the_generation_prompt_adds(folders: dict[str, Path], name: str):
    bundle = load_tokenizer(str(folders[name]))
    template = load_template(None, bundle)
    assert template is not None
    frame = template_frame(template, bundle, MARKERS)
    assert frame.header == HEADERS[name]
    for opener in ("<|start_header_id|>", "<|end_header_id|>", "<|im_start|>"):
        if opener in frame.header:
            assert not frame.closers.search(opener)  # openers never close a turn
    closer = {"llama3": "<|eot_id|>", "qwen": "<|im_end|>", "gemma": "<end_of_turn>"}
    if name in closer:
        assert frame.closers.fullmatch(closer[name])


def test_the_header_never_cuts_a_special_token(shared_data: Path) -> None:
    """phi-3 closes a user turn with <|end|>\\n<|endoftext|> without the prompt and with
    <|end|>\\n<|assistant|>\\n with it: the texts part inside ``<|``."""
    bundle = load_tokenizer(str(shared_data / "tokenizers" / "phi-3-mini"))
    template = load_template(None, bundle)
    assert template is not None
    assert template_frame(template, bundle, MARKERS).header == "<|assistant|>\n"


def test_a_reasoning_marker_in_the_prompt_is_not_header(tmp_path: Path) -> None:
    """DeepSeek-R1 style: the generation prompt ends with <think>\\n; the block is the turn's."""
    bundle = load_tokenizer(str(build_qwen(tmp_path / "q")))
    r1 = compile_template(
        "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}"
        "{% endif %}",
        "r1.jinja",
    )
    assert template_frame(r1, bundle, MARKERS).header == "<|im_start|>assistant\n"
    think = compile_template(THINK, "think.jinja")
    assert template_frame(think, bundle, MARKERS).header == "<|im_start|>assistant\n"


def test_a_template_that_fails_on_one_user_message_has_no_header(tmp_path: Path) -> None:
    bundle = load_tokenizer(str(build_qwen(tmp_path / "q")))
    strict = compile_template(
        "{% if messages|length < 2 %}{{ raise_exception('need two') }}{% endif %}x", "s.jinja"
    )
    frame: Any = template_frame(strict, bundle, MARKERS)
    assert frame.header == "" and frame.closers.search("<|im_start|>")
