"""Sizes read where each format stores them equal Pillow's, on real and written files."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from packshard.ingest.media.headers import quick_size
from tests.ingest.media.vlm import multimodal, shared_images


@pytest.mark.parametrize(
    ("fmt", "mode", "size"),
    [
        ("PNG", "RGB", (37, 21)),
        ("PNG", "L", (1, 300)),
        ("JPEG", "RGB", (640, 427)),
        ("GIF", "P", (17, 9)),
        ("BMP", "RGB", (33, 44)),
        ("WEBP", "RGB", (123, 77)),  # lossy: VP8
    ],
)
def test_written_files(fmt: str, mode: str, size: tuple[int, int]) -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, size).save(buf, fmt)
    buf.seek(0)
    assert quick_size(buf) == size


def test_webp_lossless_and_extended() -> None:
    from PIL import Image

    for options in ({"lossless": True}, {"exif": b"Exif\0\0" + b"\0" * 40}):
        buf = io.BytesIO()
        Image.new("RGB", (201, 57)).save(buf, "WEBP", **options)
        buf.seek(0)
        assert quick_size(buf) == (201, 57)


def test_jpeg_with_a_large_segment_first() -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (90, 60)).save(buf, "JPEG", icc_profile=b"\0" * 20000)
    buf.seek(0)
    assert quick_size(buf) == (90, 60)


def test_unknown_goes_to_pillow() -> None:
    assert quick_size(io.BytesIO(b"II*\0" + b"\0" * 100)) is None  # TIFF: Pillow decides
    assert quick_size(io.BytesIO(b"\xff\xd8\xff")) is None  # a JPEG cut short
    assert quick_size(io.BytesIO(b"")) is None
    assert quick_size(io.BytesIO(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0")) is None  # cut in IHDR
    assert quick_size(io.BytesIO(b"GIF89a\x01")) is None


@pytest.mark.shared_data
def test_every_shared_image(shared_data: Path) -> None:
    from PIL import Image

    for path in shared_images(multimodal(shared_data)):
        with open(path, "rb") as fh, Image.open(path) as image:
            assert quick_size(fh) == image.size, path.name
