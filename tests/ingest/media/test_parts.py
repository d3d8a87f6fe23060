"""Every layout's images read as content parts in order; mismatches and videos refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from packshard.errors import RecordError
from packshard.ingest.normalize import normalize_record
from packshard.ingest.types import RawRecord
from packshard.records import SourceRef


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    from PIL import Image

    for name, size in (("a.png", (30, 20)), ("b.png", (50, 40))):
        Image.new("RGB", size).save(tmp_path / name)
    return tmp_path


def _norm(value: dict[str, Any], folder: Path, root: str | None = None) -> Any:
    raw = RawRecord(SourceRef(str(folder / "chat.jsonl"), 3), "chat", value)
    return normalize_record(raw, media_root=root)


def _parts(conv: Any) -> list[Any]:
    return [m.parts for m in conv.messages]


def test_llamafactory_tags(folder: Path) -> None:
    conv = _norm(
        {
            "messages": [
                {"role": "user", "content": "<image>Who?<image>"},
                {"role": "assistant", "content": "Two."},
            ],
            "images": ["a.png", "b.png"],
        },
        folder,
    )
    assert _parts(conv) == [(("image", ""), ("text", "Who?"), ("image", "")), None]
    assert conv.messages[0].content == "Who?"
    assert [(m.path, m.width, m.height) for m in conv.media] == [
        ("a.png", 30, 20),
        ("b.png", 50, 40),
    ]


def test_llava_single_image(folder: Path) -> None:
    conv = _norm(
        {
            "image": "b.png",
            "conversations": [
                {"from": "human", "value": "Chart?\n<image>"},
                {"from": "gpt", "value": "Yes"},
            ],
        },
        folder,
    )
    assert _parts(conv)[0] == (("text", "Chart?\n"), ("image", ""))
    assert [m.path for m in conv.media] == ["b.png"]


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "value": "a.png"},  # LLaMA-Factory v1
        {"type": "image_url", "image_url": {"url": "a.png"}},  # OpenAI
        {"type": "image", "image": "a.png"},
    ],
)
def test_content_parts(folder: Path, part: dict[str, Any]) -> None:
    conv = _norm(
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "value": "Who?"}, part]},
                {"role": "assistant", "content": [{"type": "text", "value": "Kane."}]},
            ]
        },
        folder,
    )
    assert _parts(conv) == [(("text", "Who?"), ("image", "a.png")), None]
    assert conv.messages[1].content == "Kane."
    assert [m.path for m in conv.media] == ["a.png"]


def test_pathless_parts_take_the_list(folder: Path) -> None:
    conv = _norm(
        {
            "messages": [
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]},
                {"role": "assistant", "content": "b"},
            ],
            "images": ["b.png"],
        },
        folder,
    )
    assert [m.path for m in conv.media] == ["b.png"]


def test_media_root(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("records")
    value = {
        "messages": [{"role": "user", "content": "<image>"}, {"role": "assistant", "content": "x"}],
        "images": ["a.png"],
    }
    with pytest.raises(RecordError) as err:
        _norm(value, elsewhere)
    assert err.value.code == "missing_media"
    assert err.value.line == 3 and err.value.source.endswith("chat.jsonl")
    assert _norm(value, elsewhere, str(folder)).media[0].root == str(folder)


@pytest.mark.parametrize(
    ("value", "code", "words"),
    [
        (
            {"messages": [{"role": "user", "content": "<image><image>"}], "images": ["a.png"]},
            "media_mismatch",
            "2 image placeholder",
        ),
        (
            {"messages": [{"role": "user", "content": "<video>"}], "videos": ["v.mp4"]},
            "video_unsupported",
            "video",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "video", "video": "v.mp4"}]}]},
            "video_unsupported",
            "video",
        ),
        (
            {"messages": [{"role": "user", "content": "<image>"}], "images": ["http://x/a.png"]},
            "media_url",
            "URL",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [{"type": "image", "image": "a.png"}]},
                ]
            },
            "invalid_content",
            "images go in user turns",
        ),
    ],
)
def test_refused(folder: Path, value: dict[str, Any], code: str, words: str) -> None:
    with pytest.raises(RecordError, match=words) as err:
        _norm(value, folder)
    assert err.value.code == code


def test_text_records_unchanged(folder: Path) -> None:
    conv = _norm({"messages": [{"role": "user", "content": "<image> is text here"}]}, folder)
    assert conv.media == () and conv.messages[0].parts is None
    assert conv.messages[0].content == "<image> is text here"
