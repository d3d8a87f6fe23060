"""Output in a pipe keeps its meaning: no table wrapped at 80 columns, trained text marked."""

from __future__ import annotations

import json

from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.demo import demo_data_path

LONG = "a-very-long-domain-name-that-a-table-would-wrap-over-several-lines-at-80-columns"


def run(*args: object) -> object:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_profile_in_a_pipe_keeps_long_domain_names_on_one_line(tmp_path, packed_demo_tokenizer):
    records = []
    for line in demo_data_path().read_text().splitlines()[:20]:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # the demo's one invalid line
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({**r, "domain": LONG}) + "\n" for r in records))
    result = run("profile", data, "-t", packed_demo_tokenizer, "--template", "chatml",
                 "--max-seq-len", "256", "--no-progress")  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if LONG in line]
    assert len(rows) >= 3  # counts, lengths, utilization: the whole name on each row
    assert "\x1b[" not in result.stdout
    packed = run("pack", data, "-t", packed_demo_tokenizer, "--template", "chatml",
                 "--max-seq-len", "256", "-o", tmp_path / "out", "--no-progress")  # fmt: skip
    assert (
        f"(see {tmp_path / 'out'}/rejects.jsonl)" in packed.stdout or "rejects" not in packed.stdout
    )
    assert any(line.startswith("counts add up: ") for line in packed.stdout.splitlines())


def test_inspect_in_a_pipe_brackets_trained_text(packed_demo):
    result = run("inspect", packed_demo, "--row", "0")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "⟦" in out and "⟧" in out and out.count("⟦") == out.count("⟧")
    assert "══ seam ══" in out.splitlines()
    assert out.splitlines()[-1] == "legend: trained tokens between ⟦ ⟧, context unmarked"
    trained = out.split("⟦", 1)[1].split("⟧", 1)[0]
    assert trained and "<|im_start|>assistant" not in trained  # the prompt is not trained
