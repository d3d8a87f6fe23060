"""A template whose markers the tokenizer splits is refused before the run (issue: silent)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.demo import demo_data_path
from packshard.errors import TemplateError
from packshard.ingest.stage.markers import check_markers, split_markers, template_markers
from packshard.ingest.template.render import compile_template, load_template
from packshard.ingest.tokens.tokenizer import load_tokenizer


def run(*args: object) -> object:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_chatml_with_phi3_is_refused_naming_marker_and_fix(shared_data: Path, tmp_path) -> None:
    phi3 = shared_data / "tokenizers" / "phi-3-mini"
    args = ["pack", demo_data_path(), "-t", phi3, "--template", "chatml", "--max-seq-len", "256"]
    result = run(*args, "-o", tmp_path / "out", "--no-progress")
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert "\n" not in line
    assert "writes <|im_end|>" in line and "splits it into 7 pieces" in line
    assert "drop --template to use the tokenizer's own chat template" in line
    assert "--allow-split-markers" in line
    assert not (tmp_path / "out").exists()
    allowed = run(*args, "-o", tmp_path / "ok", "--no-progress", "--allow-split-markers")
    assert allowed.exit_code == 0, allowed.output


def test_profile_refuses_too(shared_data: Path) -> None:
    phi2 = shared_data / "tokenizers" / "phi-2"
    result = run("profile", demo_data_path(), "-t", phi2, "--template", "chatml",
                 "--max-seq-len", "256", "--no-progress")  # fmt: skip
    assert result.exit_code == 2
    assert "pass --template with a .jinja file written for this tokenizer" in result.stderr


def test_own_templates_of_the_real_tokenizers_pass(shared_data: Path) -> None:
    for name in ("phi-3-mini", "qwen3"):
        bundle = load_tokenizer(str(shared_data / "tokenizers" / name))
        for spec in [None, *map(str, (shared_data / "tokenizers" / name).glob("*.jinja"))]:
            template = load_template(spec, bundle)
            assert template is not None and template_markers(template)
            check_markers(bundle, template)
    qwen = load_tokenizer(str(shared_data / "tokenizers" / "qwen3"))
    check_markers(qwen, load_template("chatml", qwen))


def test_markers_from_literals_and_from_the_probe(demo_tokenizer: Path) -> None:
    bundle = load_tokenizer(str(demo_tokenizer))
    built = compile_template(
        "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endfor %}"
        "{% if tools %}<|tool_list|>{% endif %}<end_of_turn></s>",
        "t.jinja",
    )
    found = template_markers(built)
    assert {"<|user|>", "<|assistant|>", "<|tool_list|>", "<end_of_turn>", "</s>"} <= set(found)
    plain = compile_template("<think>{{ 1 }}</think><tool_call>[INST]", "x.jinja")
    assert template_markers(plain) == []
    assert "<|tool_list|>" in split_markers(bundle, built)  # on a branch the probe skips
    with pytest.raises(TemplateError, match=r"use --template chatml"):
        check_markers(bundle, built)  # the demo tokenizer has ChatML's tokens
    check_markers(bundle, built, allow=True)
    check_markers(bundle, load_template("chatml", bundle))


def test_on_workers_the_refusal_leaves_no_work_folder(tmp_path, demo_tokenizer: Path) -> None:
    template = tmp_path / "phi.jinja"
    template.write_text(
        "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}"
        "{% endfor %}",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    result = run("pack", demo_data_path(), "-t", demo_tokenizer, "--template", template,
                 "--max-seq-len", "256", "-o", out, "--no-progress", "--workers", "2",
                 "--split-bytes", "4096")  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "the template writes <|assistant|>" in result.stderr
    assert "use --template chatml" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["phi.jinja"]
