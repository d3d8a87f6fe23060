"""A packed row equals its examples alone on a tiny Qwen2.5-VL; each wrong form does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ingest.media.vlm import pack_images

pytestmark = [pytest.mark.torch, pytest.mark.shared_data, pytest.mark.slow]


def test_packed_equals_alone_and_the_controls_fail(shared_data: Path, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from packshard.torch.vision import PackedVisionDataset
    from packshard.torch.vision.tiny import compare_row, tiny_qwen25_vl

    # 600 tokens a row: the six examples (140-195 tokens) pack three or four to a row
    rows = PackedVisionDataset(pack_images(shared_data, tmp_path, max_seq_len=600))
    model = tiny_qwen25_vl()
    several = [i for i in range(len(rows)) if len(rows[i]["cu_seqlens"]) > 2]
    assert several
    for i in several:
        got = compare_row(model, rows[i])
        assert got["packed"] <= 1e-4
        assert min(got["one_row"], got["three_rows"], got["not_restarted"]) >= 1e-2
