r"""A record's images, read in every layout, as content parts and files in order.

Four layouts name images; all end as messages whose ``parts`` hold ``("text", …)`` and
``("image", path)`` in order, and the record's :class:`~packshard.ingest.types.MediaFile`
list in the same order (the order the template numbers them)::

    LLaMA-Factory   {"messages": [{"content": "<image>Who?"}…], "images": ["a.jpg"]}
    LLaVA/ShareGPT  {"conversations": [{"value": "Chart?\n<image>"}…], "image": "c.png"}
    LLaMA-Factory   {"content": [{"type": "image_url", "value": "a.jpg"},
      v1 parts                   {"type": "text", "value": "Who?"}]}
    OpenAI parts    {"type": "image_url", "image_url": {"url": "a.jpg"}},
                    {"type": "image", "image": "a.jpg"}   (or no path: the next of "images")

A ``<image>`` placeholder in a string splits it: ``"<image>Who?"`` becomes an image part then
the text ``"Who?"``, which is where LLaMA-Factory's Qwen2-VL plugin writes the vision tokens.
The placeholders must be exactly as many as the images (``media_mismatch`` otherwise),
images sit in user or system turns only, and a video (``videos``, ``<video>``, a video part)
is refused as ``video_unsupported``: records are never packed with a guess.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from packshard.errors import RecordError
from packshard.ingest.media.files import find_media
from packshard.ingest.types import MediaFile, Message

IMAGE_TAG = "<image>"
VIDEO_TAG = "<video>"
IMAGE_KINDS = ("image", "image_url")
VIDEO_KINDS = ("video", "video_url")

Part = tuple[str, str]  # ("text", text) or ("image", path; "" for the next of "images")


def has_media(value: dict[str, Any]) -> bool:
    """Tell whether a record names any image or video by a top-level field."""
    get = value.get
    return any(get(k) is not None for k in ("images", "image", "videos", "video"))


def image_part(part: dict[str, Any], where: str) -> str:
    """Return the path an image part names ('' when it names none, OpenAI ``{"type": "image"}``)."""
    for key in ("value", "image", "path", "url"):
        if key in part and part[key] is not None:
            found = part[key]
            break
    else:
        found = part.get("image_url")
        if type(found) is dict:
            found = found.get("url")
        if found is None:
            return ""
    if type(found) is not str or not found:
        raise RecordError("invalid_content", f"{where} names no image path (got {found!r})")
    return found


def content_parts(content: list[Any], where: str) -> tuple[Part, ...] | None:
    """Return a content-part list as parts when it holds an image; None when text only.

    Raises:
        RecordError: ``video_unsupported`` for a video part.

    """
    if not any(type(p) is dict and p.get("type") in IMAGE_KINDS + VIDEO_KINDS for p in content):
        return None
    out: list[Part] = []
    for j, part in enumerate(content):
        kind = part.get("type") if type(part) is dict else None
        if kind in VIDEO_KINDS:
            raise RecordError("video_unsupported", f"{where} part {j} is a video")
        if kind in IMAGE_KINDS:
            out.append(("image", image_part(part, f"{where} part {j}")))
        elif kind == "text":
            key = "value" if "text" not in part and "value" in part else "text"
            text = part.get(key)
            if type(text) is not str:
                raise RecordError("invalid_content", f"{where} part {j} {key} must be a string")
            out.append(("text", text))
        else:
            raise RecordError(
                "invalid_content", f"{where} part {j} is {kind!r}; only text and image parts"
            )
    return tuple(out)


def split_tags(text: str) -> tuple[Part, ...]:
    """Split a string at its ``<image>`` placeholders into text and image parts."""
    pieces = text.split(IMAGE_TAG)
    out: list[Part] = []
    for k, piece in enumerate(pieces):
        if k:
            out.append(("image", ""))
        if piece:
            out.append(("text", piece))
    return tuple(out)


def _listed(value: dict[str, Any]) -> list[Any]:
    """Return the record's top-level image list (``images``, or LLaVA's ``image``)."""
    for key in ("images", "image"):
        found = value.get(key)
        if found is None:
            continue
        return found if type(found) is list else [found]
    return []


def attach_media(
    value: dict[str, Any], messages: list[Message], root: str
) -> tuple[list[Message], tuple[MediaFile, ...]]:
    """Return the messages with image parts and the record's images, found and sized.

    ``root`` is the folder relative paths resolve against
    (:func:`~packshard.ingest.media.files.record_root`).

    Raises:
        RecordError: ``video_unsupported``, ``media_mismatch``, ``invalid_content`` and what
            :func:`~packshard.ingest.media.files.find_media` raises.

    """
    if value.get("videos") is not None or value.get("video") is not None:
        raise RecordError("video_unsupported", "the record holds a video ('videos')")
    listed = _listed(value)
    tagged = bool(listed) and not any(m.parts for m in messages)
    out: list[Message] = []
    for i, m in enumerate(messages):
        if VIDEO_TAG in m.content:
            raise RecordError("video_unsupported", f"message {i + 1} holds a {VIDEO_TAG} tag")
        parts = m.parts
        if tagged and IMAGE_TAG in m.content:
            parts = split_tags(m.content)
        if parts is not None and any(kind == "image" for kind, _ in parts):
            if m.role not in ("user", "system"):
                raise RecordError(
                    "invalid_content",
                    f"message {i + 1} ({m.role}) holds an image: images go in user turns",
                )
            m = replace(m, content="".join(t for k, t in parts if k == "text"), parts=parts)
        elif parts is not None:
            m = replace(m, parts=None)
        out.append(m)
    named = [p for m in out for k, p in (m.parts or ()) if k == "image"]
    unnamed = sum(1 for p in named if not p)
    if unnamed != len(listed) or (listed and unnamed != len(named)):
        raise RecordError(
            "media_mismatch",
            f"{unnamed} image placeholder(s) for {len(listed)} image(s) listed (each "
            f"{IMAGE_TAG} or image part takes the next image)",
        )
    files: list[MediaFile] = []
    pending = iter(listed)
    for k, path in enumerate(named):
        files.append(find_media(path or next(pending), root, f"image {k + 1}"))
    return out, tuple(files)
