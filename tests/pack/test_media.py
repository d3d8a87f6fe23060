"""The index's media column: each example's images by reference; cut examples refused."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from packshard.errors import UsageError
from packshard.format.examples import has_media
from packshard.ingest.media.files import header_size
from packshard.ingest.media.grid import image_grid
from packshard.options import VisionRule
from packshard.repack import RepackConfig, repack_dataset
from tests.ingest.media.vlm import pack_images

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
    import json

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
