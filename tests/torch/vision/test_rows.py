"""Rows with their pixels, grids and four-row positions; missing and changed images named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from packshard.errors import FormatError
from tests.ingest.media.vlm import pack_images

pytestmark = [pytest.mark.torch, pytest.mark.shared_data]


@pytest.fixture(scope="module")
def packed(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    return pack_images(shared_data, tmp_path_factory.mktemp("vlm"))


def test_rows_carry_pixels_grids_and_positions(packed: Path) -> None:
    from packshard.torch.vision import PackedVisionDataset, collate_vision
    from packshard.torch.vision.rope import mrope_positions

    rows = PackedVisionDataset(packed)
    seen_images = 0
    for i in range(len(rows)):
        row = rows[i]
        grids = row["image_grid_thw"].tolist()
        seen_images += len(grids)
        assert row["pixel_values"].shape == (sum(t * h * w for t, h, w in grids), 1176)
        ids, cu, pos = row["input_ids"].numpy(), row["cu_seqlens"].numpy(), row["position_ids"]
        assert pos.shape == (4, len(ids))
        at = 0
        for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            assert pos[0, lo:hi].tolist() == list(range(hi - lo))
            n = int(np.count_nonzero(np.diff(np.r_[0, (ids[lo:hi] == 151655).view(np.int8)]) == 1))
            want = mrope_positions(ids[lo:hi], grids[at : at + n], 151655)
            assert pos[1:, lo:hi].tolist() == want.tolist()
            at += n
    assert seen_images == 8  # six records, two of them with two images
    batch = collate_vision([rows[0], rows[1]])
    assert batch["position_ids"].shape[:2] == (4, 1) and batch["input_ids"].shape[0] == 1


def test_a_changed_or_missing_image_is_named(packed: Path, tmp_path: Path) -> None:
    import shutil

    from packshard.torch.vision import PackedVisionDataset

    moved = tmp_path / "moved"
    shutil.copytree(packed.parent / "data", moved)
    rows = PackedVisionDataset(packed, media_root=moved)
    rows[0]  # the copy serves: same bytes
    image = moved / "mllm_demo_data" / "1.jpg"
    image.write_bytes(image.read_bytes()[:-1] + b"\0")
    with pytest.raises(
        FormatError, match=r"1\.jpg: image of example 0 \(.*mllm_demo.json:1\) changed"
    ):
        PackedVisionDataset(packed, media_root=moved)[0]
    image.unlink()
    with pytest.raises(FormatError, match=r"1\.jpg: image of example 0 .* cannot be read"):
        PackedVisionDataset(packed, media_root=moved)[0]
