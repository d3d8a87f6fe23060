"""verify's vision stage: images re-hashed, packed rows proven, a changed image a finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from packshard.verify.run import VerifyOptions, verify_dataset
from tests.ingest.media.vlm import pack_images

pytestmark = [pytest.mark.torch, pytest.mark.shared_data, pytest.mark.slow]


def test_vision_stage(shared_data: Path, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = pack_images(shared_data, tmp_path, max_seq_len=600)
    report = verify_dataset(out, VerifyOptions(source=False, model="none"))
    vision = report.checks["vision"]
    assert vision["status"] == "passed" and vision["images_checked"] == 3  # distinct files
    assert report.ok
    full = verify_dataset(out, VerifyOptions(source=False))
    vision = full.checks["vision"]
    assert vision["status"] == "passed", full.findings.items
    assert vision["rows"] >= 1 and vision["max_logit_delta"] <= 1e-4
    assert set(vision["controls_moved"].values()) == {vision["rows"]}
    image = out.parent / "data" / "mllm_demo_data" / "2.jpg"
    image.write_bytes(image.read_bytes() + b"\0")
    broken = verify_dataset(out, VerifyOptions(source=False, model="none"))
    assert not broken.ok and broken.checks["vision"]["status"] == "failed"
    (finding,) = [f for f in broken.findings.items if f.check == "vision"]
    assert "2.jpg: image of example" in finding.message and "changed" in finding.message
    assert finding.source is not None and finding.source.endswith("mllm_demo.json:2")


def test_text_packs_have_no_vision_stage(packed_demo: Path) -> None:
    report = verify_dataset(packed_demo, VerifyOptions(source=False, model="none"))
    assert "vision" not in report.checks


def test_a_capped_pack_verifies(shared_data: Path, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = pack_images(shared_data, tmp_path, max_images_per_row=2)  # 4 rows of 2 segments
    report = verify_dataset(out, VerifyOptions(source=False))
    vision = report.checks["vision"]
    assert report.ok and vision["status"] == "passed", report.findings.items
    assert vision["rows"] >= 1 and vision["images"] <= 2 * vision["rows"]
    assert vision["max_logit_delta"] <= 1e-4


def test_a_qwen3_vl_pack_verifies(shared_data: Path, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    template = shared_data / "multimodal" / "qwen3_vl" / "chat_template.jinja"
    out = pack_images(
        shared_data, tmp_path, max_seq_len=600, vision_family="qwen3_vl", template=str(template)
    )
    report = verify_dataset(out, VerifyOptions(source=False))
    vision = report.checks["vision"]
    assert report.ok and vision["status"] == "passed", report.findings.items
    assert vision["rows"] >= 1 and vision["max_logit_delta"] <= 1e-4
    assert set(vision["controls_moved"].values()) == {vision["rows"]}  # the controls still leak
