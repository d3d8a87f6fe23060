"""The patch grid from a header's size equals transformers' ``image_grid_thw``."""

from __future__ import annotations

from pathlib import Path

import pytest

from packshard.errors import RecordError, UsageError
from packshard.ingest.media.files import header_size
from packshard.ingest.media.grid import image_grid, smart_resize, vision_tokens
from packshard.options import VISION_RULES, VisionRule
from tests.ingest.media.vlm import multimodal, qwen_processor, shared_images

RULE = VisionRule()


def test_hand_computed_grids() -> None:
    # 300x168: round(168/28)=6 -> 168, round(300/28)=11 -> 308: grid 12 x 22, 66 tokens
    assert image_grid(300, 168, RULE) == (1, 12, 22)
    assert vision_tokens((1, 12, 22), RULE) == 66
    # 1411x1411 is over 28*28*1280 pixels: beta = 1411/sqrt(1003520), floor to 28s -> 980
    assert smart_resize(1411, 1411, RULE) == (980, 980)
    # 102x102 rounds to 112x112 = 12544 >= 56*56: no growth
    assert image_grid(102, 102, RULE) == (1, 8, 8)
    # 20x20 rounds to 28x28 < 56*56: grown to ceil(20*2.8/28)*28 = 56
    assert image_grid(20, 20, RULE) == (1, 4, 4)


def test_round_half_to_even_as_python() -> None:
    # 42/28 = 1.5 rounds to 2 (even), 70/28 = 2.5 rounds to 2 (even): as transformers' round
    assert smart_resize(42, 70, RULE) == (56, 56)


def test_refused_sizes() -> None:
    with pytest.raises(RecordError, match="aspect ratio over 200"):
        smart_resize(1, 201, RULE)
    with pytest.raises(RecordError, match="empty"):
        smart_resize(0, 10, RULE)
    with pytest.raises(UsageError, match="--max-pixels must be at least 784"):
        VisionRule(max_pixels=100).check()
    with pytest.raises(UsageError, match="over --max-pixels"):
        VisionRule(min_pixels=10_000, max_pixels=5_000).check()


@pytest.mark.torch
@pytest.mark.shared_data
@pytest.mark.parametrize("bounds", [{}, {"min_pixels": 128 * 28 * 28, "max_pixels": 256 * 28 * 28}])
def test_every_shared_image_matches_the_processor(shared_data: Path, bounds: dict) -> None:
    from PIL import Image

    folder = multimodal(shared_data)
    proc = qwen_processor(
        shared_data / "tokenizers" / "qwen3",
        folder / "qwen2_5_vl" / "chat_template.jinja",
        **bounds,
    )
    rule = VisionRule(**bounds)
    images = shared_images(folder)
    assert len(images) == 22
    for path in images:
        width, height = header_size(path)
        with Image.open(path) as image:
            got = proc.image_processor(images=[image.convert("RGB")], return_tensors="np")
        assert [list(image_grid(width, height, rule))] == got["image_grid_thw"].tolist(), path.name
        patches = got["pixel_values"].shape[0]
        assert vision_tokens(image_grid(width, height, rule), rule) * 4 == patches


QWEN3 = VISION_RULES["qwen3_vl"]


def test_qwen3_vl_hand_computed_grid() -> None:
    # 300x168 rounds to 288x160 < 256*256: grown by sqrt(65536 / 50400), ceil to 32s: 352x192
    assert smart_resize(168, 300, QWEN3) == (192, 352)
    assert image_grid(300, 168, QWEN3) == (1, 12, 22) and vision_tokens((1, 12, 22), QWEN3) == 66
    # 1411x1411 rounds to 1408 (44 blocks of 32), within the bounds: 88 x 88 patches of 16
    assert image_grid(1411, 1411, QWEN3) == (1, 88, 88)  # Qwen2-VL's rule: (1, 70, 70)
    assert image_grid(1411, 1411, RULE) == (1, 70, 70)


@pytest.mark.torch
@pytest.mark.shared_data
def test_every_shared_image_matches_the_qwen3_vl_processor(shared_data: Path) -> None:
    """transformers gives Qwen3-VL the Qwen2-VL image processor class, set by its checkpoints."""
    pytest.importorskip("transformers")
    from PIL import Image
    from transformers import Qwen3VLConfig
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    assert IMAGE_PROCESSOR_MAPPING_NAMES["qwen3_vl"]["pil"] == "Qwen2VLImageProcessorPil"
    vision = Qwen3VLConfig().vision_config  # the model's own patch and merge sizes
    assert (vision.patch_size, vision.spatial_merge_size) == (QWEN3.patch_size, QWEN3.merge_size)
    checkpoint = Qwen2VLImageProcessorPil(  # a Qwen3-VL checkpoint's preprocessor_config.json
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": 65536, "longest_edge": 16777216},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    reader = Qwen2VLImageProcessorPil(**QWEN3.processor_options())  # what the reader builds
    images = shared_images(multimodal(shared_data))
    assert len(images) == 22
    differ = 0
    for path in images:
        width, height = header_size(path)
        grid = image_grid(width, height, QWEN3)
        with Image.open(path) as image:
            rgb = image.convert("RGB")
            got = checkpoint(images=[rgb], return_tensors="np")
            mine = reader(images=[rgb], return_tensors="np")
        assert [list(grid)] == got["image_grid_thw"].tolist(), path.name
        assert mine["image_grid_thw"].tolist() == got["image_grid_thw"].tolist()
        assert (mine["pixel_values"] == got["pixel_values"]).all(), path.name
        assert vision_tokens(grid, QWEN3) * 4 == got["pixel_values"].shape[0]
        differ += grid != image_grid(width, height, RULE)
    assert differ == 20  # the Qwen2-VL rule miscounts all but 1.jpg and 3.jpg
