"""profile's images: vision tokens, image sizes and a padded VLM batch, on the shared images."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.engine import EngineOptions
from packshard.ingest.media.files import header_size
from packshard.ingest.media.grid import image_grid
from packshard.ingest.read.sources import expand_inputs
from packshard.options import VisionRule
from packshard.profile import ProfileConfig, profile_inputs, report_to_dict
from packshard.profile.vision import vision_profile
from tests.ingest.media.vlm import multimodal

pytestmark = pytest.mark.shared_data


def _inputs(folder: Path) -> list[str]:
    return [str(folder / "mllm_demo.json"), str(folder / "mllm_video_demo.json")]


def _config(shared: Path, folder: Path, **more: object) -> ProfileConfig:
    template = str(folder / "qwen2_5_vl" / "chat_template.jinja")
    return ProfileConfig((), str(shared / "tokenizers" / "qwen3"), 600, template, **more)  # type: ignore[arg-type]


def test_vision_figures_on_the_shared_demo(shared_data: Path) -> None:
    folder = multimodal(shared_data)
    files = expand_inputs(_inputs(folder))
    report = profile_inputs(files, _config(shared_data, folder))
    vision = report_to_dict(report)["vision"]
    # recomputed from the files themselves: header sizes, the rule's grids, the record lists
    records = json.loads((folder / "mllm_demo.json").read_text())
    paths = [folder / p for r in records for p in r["images"]]
    sizes = [header_size(p) for p in paths]
    tokens = [int(np.prod(image_grid(w, h, VisionRule()))) // 4 for w, h in sizes]
    per_example, at = [], 0
    for r in records:
        per_example.append(sum(tokens[at : at + len(r["images"])]))
        at += len(r["images"])
    assert vision["images"] == len(paths) == 8 and vision["examples_with_images"] == 6
    assert vision["vision_tokens"] == sum(tokens) == 550
    assert vision["vision_share"] == round(550 / report.total.tokens, 6)
    assert vision["vision_tokens_per_example"]["max"] == max(per_example) == 132
    assert vision["vision_tokens_per_example"]["p50"] == sorted(per_example)[2]  # rank ⌈0.5·6⌉
    assert vision["bytes"]["total"] == sum(p.stat().st_size for p in paths)
    assert vision["image_size"]["max"] == list(max(sizes, key=lambda s: s[0] * s[1]))
    # one padded batch of the six examples (--batch-size 8): all padded to the longest
    longest = report.total.lengths.max if report.total.lengths else 0
    pad = vision["padded_batch"]
    assert pad["computed_tokens"] == 6 * longest and pad["useful_tokens"] == report.total.tokens
    assert pad["padding_share"] == round(1 - report.total.tokens / (6 * longest), 6) > 0
    assert pad["vision_tokens_max"] == 550


def test_two_workers_give_the_same_figures(shared_data: Path) -> None:
    folder = multimodal(shared_data)
    files = expand_inputs(_inputs(folder))
    one = profile_inputs(files, _config(shared_data, folder))
    two = profile_inputs(files, _config(shared_data, folder, engine=EngineOptions("local", 2)))
    assert report_to_dict(one)["vision"] == report_to_dict(two)["vision"]


def test_text_only_has_no_vision_figures() -> None:
    assert (
        vision_profile(np.array([5, 7]), np.zeros(2), np.zeros(2), np.zeros((0, 3)), 8, 2, 0) == {}
    )


def test_batches_of_the_image_examples_only() -> None:
    lengths = np.array([10, 50, 20, 30])
    images, tokens = np.array([1, 0, 2, 1]), np.array([4, 0, 8, 4])
    sizes = np.array([[28, 28, 100], [56, 28, 200], [28, 56, 300], [112, 112, 400]])
    v = vision_profile(lengths, images, tokens, sizes, 64, 4, 0)
    assert v["vision_share"] == round(16 / 110, 6)
    assert v["padded_batch"]["computed_tokens"] == 3 * 30  # the text example is not in it
    assert v["image_size"] == {"p50": [56, 28], "p90": [112, 112], "max": [112, 112]}
    assert v["images_per_example"] == {"p50": 1, "p90": 2, "max": 2}
    long = vision_profile(np.array([10, 50, 20, 100]), images, tokens, sizes, 64, 4, 0)
    assert long["vision_share"] == round(16 / 180, 6)  # every token counted
    assert long["padded_batch"]["computed_tokens"] == 3 * 64  # clipped to max_seq_len


def test_the_terminal_and_pipe_show_the_images_table(shared_data: Path, tmp_path: Path) -> None:
    folder = multimodal(shared_data)
    page = tmp_path / "p.html"
    args = [*_inputs(folder), "-t", str(shared_data / "tokenizers" / "qwen3")]
    args += ["--template", str(folder / "qwen2_5_vl" / "chat_template.jinja")]
    args += ["--max-seq-len", "600", "--no-progress", "--html", str(page)]
    result = CliRunner().invoke(main, ["profile", *args])
    assert result.exit_code == 0, result.output
    shown = " ".join(result.stdout.split())  # a pipe: plain text, the table's cells padded
    assert "vision tokens (share of all tokens) │ 550 (53.7%) │" in shown
    assert "image size by area, P50 / P90 / max (px) │ 300×168 / 300×199 / 300×199 │" in shown
    assert "\x1b[" not in result.stdout
    html = page.read_text(encoding="utf-8")
    assert "<h2>Images</h2>" in html and "550, 53.7% of all tokens" in html
