"""The index's media column: each example's images by reference; cut examples refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from packshard.errors import RecordError, UsageError
from packshard.format.examples import has_media
from packshard.format.manifest import schema_errors
from packshard.ingest.media.files import header_size
from packshard.ingest.media.grid import image_grid
from packshard.options import VisionRule
from packshard.repack import RepackConfig, repack_dataset
from tests.ingest.media.vlm import multimodal, pack_images

pytestmark = pytest.mark.shared_data


@pytest.fixture(scope="module")
def packed(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack_images(shared_data, tmp_path_factory.mktemp("vlm"))


def test_every_example_records_its_images(packed: Path) -> None:
    index = pq.read_table(packed / "examples.parquet").to_pylist()
    assert len(index) == 6 and has_media(packed)
    data = packed.parent / "data"
    for example in index:
        assert example["source"].endswith("mllm_demo.json")
        assert len(example["media"]) in (1, 2)
        for entry in example["media"]:
            file = Path(entry["root"]) / entry["path"]
            assert Path(entry["root"]) == data and entry["path"].startswith("mllm_demo_data/")
            blob = file.read_bytes()
            assert entry["bytes"] == len(blob)
            assert entry["sha256"] == hashlib.sha256(blob).hexdigest()
            assert (entry["width"], entry["height"]) == header_size(file)
            grid = (entry["grid_t"], entry["grid_h"], entry["grid_w"])
            assert grid == image_grid(entry["width"], entry["height"], VisionRule())
    assert index[0]["media"][0]["sha256"].startswith("95d292cbe8e7")  # 1.jpg (provenance)


def test_counts_add_up(packed: Path) -> None:
    manifest = json.loads((packed / "manifest.json").read_text())
    rejects = [json.loads(x) for x in (packed / "rejects.jsonl").read_text().splitlines()]
    assert [r["code"] for r in rejects] == ["video_unsupported"] * 3
    assert [r["line"] for r in rejects] == [1, 2, 3]
    assert sum(i["records"] for i in manifest["inputs"]) == 9
    vision = manifest["stats"]["vision"]
    index = pq.read_table(packed / "examples.parquet").to_pylist()
    per_example = [sum(e["grid_h"] * e["grid_w"] // 4 for e in x["media"]) for x in index]
    assert vision["images"] == 8 and vision["vision_tokens"] == sum(per_example)
    per_row: dict[int, int] = {}
    for x, n in zip(index, per_example, strict=True):
        per_row[x["row"]] = per_row.get(x["row"], 0) + n
    rows = manifest["stats"]["rows"]
    assert vision["per_row_vision_tokens"] == {
        "max": max(per_row.values()),
        "mean": round(sum(per_row.values()) / rows, 3),
    }
    assert vision["rule"]["max_pixels"] == 28 * 28 * 1280


def test_an_example_with_images_is_never_cut(shared_data: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"mllm_demo.json:\d+: an example with images is \d+ "):
        pack_images(shared_data, tmp_path / "a", max_seq_len=128, overlong="truncate")
    with pytest.raises(UsageError, match="--strategy wrapped cuts examples"):
        pack_images(shared_data, tmp_path / "b", strategy="wrapped")
    dropped = pack_images(shared_data, tmp_path / "c", max_seq_len=190, overlong="drop")
    kept = pq.read_table(dropped / "examples.parquet")["num_tokens"].to_pylist()
    assert sorted(kept) == [140, 142, 174, 181]  # 193 and 195 tokens: dropped whole, as too_long


def test_repack_refuses_images(packed: Path, tmp_path: Path) -> None:
    config = RepackConfig.build(str(packed), str(tmp_path / "re"), max_seq_len=2048)
    with pytest.raises(UsageError, match="holds images, which repack does not carry"):
        repack_dataset(config)


def _per_row(out: Path) -> dict[int, tuple[int, int]]:
    """Each row's images and vision tokens, counted from the examples index."""
    rows: dict[int, tuple[int, int]] = {}
    for x in pq.read_table(out / "examples.parquet").to_pylist():
        images, tokens = rows.get(x["row"], (0, 0))
        tokens += sum(e["grid_t"] * e["grid_h"] * e["grid_w"] // 4 for e in x["media"])
        rows[x["row"]] = (images + len(x["media"]), tokens)
    return rows


def _check_caps(out: Path, images: int, tokens: int, control: Path) -> dict[str, Any]:
    """The caps hold in every row of ``out`` and not in ``control`` (packed without them)."""
    manifest = json.loads((out / "manifest.json").read_text())
    assert schema_errors(manifest) == []
    rows = _per_row(out)
    assert all(i <= images and t <= tokens for i, t in rows.values())
    uncapped = _per_row(control).values()
    assert any(i > images or t > tokens for i, t in uncapped)  # the caps bind: a control
    vision = manifest["stats"]["vision"]
    assert vision["per_row_images"]["max"] == max(i for i, _ in rows.values())
    assert vision["per_row_vision_tokens"]["max"] == max(t for _, t in rows.values())
    stats = manifest["stats"]
    assert stats["records"] == stats["records_packed"] + stats["rejected"] + stats["dropped"]
    return manifest


@pytest.mark.parametrize(
    ("caps", "rows"),
    [
        ({"max_images_per_row": 2}, 4),
        ({"max_vision_tokens_per_row": 200}, 3),
        ({"max_images_per_row": 3, "max_vision_tokens_per_row": 150, "strategy": "sequential"}, 4),
    ],
)
def test_caps_hold_on_the_shared_data(
    shared_data: Path, tmp_path: Path, packed: Path, caps: dict[str, Any], rows: int
) -> None:
    out = pack_images(shared_data, tmp_path, **caps)
    limits = (caps.get("max_images_per_row", 99), caps.get("max_vision_tokens_per_row", 10**6))
    manifest = _check_caps(out, *limits, control=packed)
    recorded = {k: v for k, v in caps.items() if k != "strategy"}
    assert manifest["config"]["vision_caps"] == recorded
    assert manifest["stats"]["vision"]["caps"] == recorded
    assert manifest["stats"]["records_packed"] == 6 and manifest["stats"]["rows"] == rows
    assert json.loads((packed / "manifest.json").read_text())["stats"]["rows"] == 2


def test_caps_hold_on_the_v1_layout(shared_data: Path, tmp_path: Path) -> None:
    from packshard.pack import PackConfig, pack_dataset

    folder = multimodal(shared_data)
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "data").symlink_to(folder)  # its paths start at data/
    outs = {}
    for name, caps in (("plain", {}), ("capped", {"max_images_per_row": 2})):
        config = PackConfig.build(
            inputs=(str(folder / "v1_multimodal_demo.jsonl"),),
            tokenizer=str(shared_data / "tokenizers" / "qwen3"),
            out=str(tmp_path / name),
            max_seq_len=2048,
            template=str(folder / "qwen2_5_vl" / "chat_template.jinja"),
            media_root=str(tmp_path / "root"),
            **caps,
        )
        pack_dataset(config)
        outs[name] = tmp_path / name
    manifest = _check_caps(outs["capped"], 2, 10**6, control=outs["plain"])
    assert manifest["stats"]["records_packed"] == 24


def test_an_example_over_a_cap_is_dropped_and_counted(shared_data: Path, tmp_path: Path) -> None:
    # records 1 and 4 of mllm_demo.json hold two images, 132 vision tokens: over 100 alone
    out = pack_images(shared_data, tmp_path / "a", max_vision_tokens_per_row=100)
    manifest = json.loads((out / "manifest.json").read_text())
    rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    over = [r for r in rejects if r["code"] == "over_vision_cap"]
    assert [r["line"] for r in over] == [1, 4]
    assert "--max-vision-tokens-per-row 100" in over[0]["reason"]
    stats = manifest["stats"]
    assert (stats["records"], stats["records_packed"], stats["rejected"], stats["dropped"]) == (
        9,
        4,
        3,
        2,
    )
    assert all(t <= 100 for _, t in _per_row(out).values())
    with pytest.raises(RecordError, match=r"mllm_demo.json:1: an example with more images"):
        pack_images(shared_data, tmp_path / "b", max_vision_tokens_per_row=100, overlong="error")


def test_caps_need_a_strategy_that_takes_them(shared_data: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--strategy ffd does not take --max-images-per-row"):
        pack_images(shared_data, tmp_path, max_images_per_row=2, strategy="ffd")


def test_a_qwen3_vl_pack_counts_by_its_rule(shared_data: Path, tmp_path: Path) -> None:
    from packshard.options import VISION_RULES

    folder = multimodal(shared_data)
    template = str(folder / "qwen3_vl" / "chat_template.jinja")
    out = pack_images(shared_data, tmp_path, vision_family="qwen3_vl", template=template)
    manifest = json.loads((out / "manifest.json").read_text())
    rule = VISION_RULES["qwen3_vl"]
    assert manifest["config"]["media"]["vision_rule"] == rule.as_dict()
    assert manifest["stats"]["vision"]["rule"]["patch_size"] == 16
    index = pq.read_table(out / "examples.parquet").to_pylist()
    pads = 0
    for shard in manifest["shards"]:
        for row in pq.read_table(out / shard["path"]).to_pylist():
            pads += row["input_ids"].count(151655)  # <|image_pad|>
    grids = [image_grid(e["width"], e["height"], rule) for x in index for e in x["media"]]
    assert [(e["grid_t"], e["grid_h"], e["grid_w"]) for x in index for e in x["media"]] == grids
    assert (
        pads
        == sum(t * h * w // 4 for t, h, w in grids)
        == manifest["stats"]["vision"]["vision_tokens"]
    )
