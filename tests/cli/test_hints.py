"""The hints a new user's first mistakes get: a hub name for -t, a JSON array as .jsonl."""

from __future__ import annotations

import json

from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.demo import demo_data_path


def run(*args: object) -> object:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_a_hub_name_says_download_and_point_t_at_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("pack", demo_data_path(), "-t", "Qwen/Qwen3-8B", "--max-seq-len", "64",
                 "-o", tmp_path / "out")  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "Qwen/Qwen3-8B: no such file or folder; a Hugging Face Hub name?" in result.stderr
    assert "huggingface-cli download Qwen/Qwen3-8B tokenizer.json" in result.stderr
    assert "-t Qwen3-8B" in result.stderr
    missing = run("pack", demo_data_path(), "-t", "tok/tokenizer.json", "--max-seq-len", "64",
                  "-o", tmp_path / "o2")  # fmt: skip
    assert "Hub name" not in missing.stderr and "no such file" in missing.stderr


def _records() -> list[dict]:
    lines = demo_data_path().read_text(encoding="utf-8").splitlines()[:8]
    return [r for r in (json.loads(x) for x in lines if x.startswith("{")) if isinstance(r, dict)]


def test_a_json_array_saved_as_jsonl_is_named(tmp_path, packed_demo_tokenizer):
    for name, text in {
        "pretty.jsonl": json.dumps(_records(), indent=2),
        "compact.jsonl": json.dumps(_records()),
    }.items():
        data = tmp_path / name
        data.write_text(text, encoding="utf-8")
        out = tmp_path / f"out-{name}"
        result = run("pack", data, "-t", packed_demo_tokenizer, "--template", "chatml",
                     "--max-seq-len", "256", "-o", out, "--no-progress")  # fmt: skip
        assert result.exit_code == 1, result.output
        assert (
            f"likely cause: {data} looks like a JSON array, not JSON Lines (rename it to .json)"
            in result.stderr
        )
