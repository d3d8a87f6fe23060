"""Images found by path, sized from the header; URLs, missing and broken files refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from packshard.errors import RecordError
from packshard.ingest.media.files import find_media, header_size, record_root


def _png(path: Path, width: int, height: int) -> Path:
    from PIL import Image

    Image.new("RGB", (width, height), (10, 20, 30)).save(path)
    return path


def test_found_and_sized_from_the_header(tmp_path: Path) -> None:
    (tmp_path / "imgs").mkdir()
    file = _png(tmp_path / "imgs" / "a.png", 40, 30)
    got = find_media("imgs/a.png", str(tmp_path), "image 1")
    assert (got.width, got.height, got.size) == (40, 30, file.stat().st_size)
    assert got.file == file and got.path == "imgs/a.png" and got.root == str(tmp_path)


def test_header_only(tmp_path: Path) -> None:
    # a PNG whose pixel data is cut off: the header still gives its size, nothing is decoded
    whole = _png(tmp_path / "whole.png", 64, 48).read_bytes()
    cut = tmp_path / "cut.png"
    cut.write_bytes(whole[:60])
    assert header_size(cut) == (64, 48)


@pytest.mark.parametrize(
    ("path", "code", "words"),
    [
        ("https://example.com/a.png", "media_url", "is a URL"),
        ("data:image/png;base64,AAAA", "media_url", "nothing is downloaded"),
        ("nowhere.png", "missing_media", "use --media-root"),
        ("bad.png", "bad_media", "not a readable image"),
        ("", "invalid_content", "must be a file path"),
    ],
)
def test_refused(tmp_path: Path, path: str, code: str, words: str) -> None:
    (tmp_path / "bad.png").write_bytes(b"not an image at all")
    with pytest.raises(RecordError, match=words) as err:
        find_media(path, str(tmp_path), "image 1")
    assert err.value.code == code


def test_a_folder_is_not_an_image(tmp_path: Path) -> None:
    (tmp_path / "d.png").mkdir()
    with pytest.raises(RecordError) as err:
        find_media("d.png", str(tmp_path), "image 1")
    assert err.value.code == "missing_media"


def test_record_root() -> None:
    assert record_root("data/chat.jsonl", None) == "data"
    assert record_root("chat.jsonl", None) == "."
    assert record_root("data/chat.jsonl", "/media") == "/media"
