"""An image a record names: found on disk, sized from its header, recorded by reference.

A record names an image by a path.  A relative path resolves against ``--media-root`` when
one is given, else against the folder of the record's file (LLaMA-Factory's ``media_dir``
default); the root it resolved against is recorded beside the path, so the pair finds the
file again::

    chat/train.jsonl:7  "images": ["imgs/cat.png"]
        root  chat/             (the record's folder; or --media-root)
        path  imgs/cat.png      (relative to root, as written)
        file  chat/imgs/cat.png  512 x 384, 48,213 bytes  ─► grid by the family's rule

Only the header is read (:mod:`packshard.ingest.media.headers`, else Pillow's lazy
``Image.open``), whatever the image's size.  A URL is refused: nothing is downloaded.  The
SHA-256 is taken when the examples index is written, checked by ``verify`` and the reader.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from stat import S_ISREG

from packshard.errors import RecordError
from packshard.ingest.media.headers import quick_size
from packshard.ingest.types import MediaFile

URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:(//|[^\\/])")
"""A scheme (``http://``, ``s3://``, ``data:``): a URL, not a path (``C:\\`` is a path)."""


def record_root(source: str, media_root: str | None) -> str:
    """Return the folder a record's relative media paths resolve against."""
    if media_root is not None:
        return media_root
    return os.path.dirname(source) or "."


def header_size(file: Path | str) -> tuple[int, int]:
    """Return ``(width, height)`` from an image file's header, its pixels never decoded.

    (:mod:`packshard.ingest.media.headers`, else Pillow's lazy ``Image.open``).

    Raises:
        RecordError: ``bad_media`` when neither can identify the file as an image.

    """
    try:
        with open(file, "rb") as fh:
            found = quick_size(fh)
    except OSError as exc:
        raise RecordError("bad_media", f"{file}: cannot be read ({exc.strerror})") from None
    if found is not None and found[0] > 0 and found[1] > 0:
        return int(found[0]), int(found[1])
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(file) as image:
            width, height = image.size
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise RecordError("bad_media", f"{file}: not a readable image ({exc})") from None
    return int(width), int(height)


def find_media(path: object, root: str, where: str) -> MediaFile:
    """Return the :class:`MediaFile` the record's ``path`` names, sized from its header.

    ``where`` names the field in errors (``images[1]``).

    Raises:
        RecordError: ``invalid_content`` (not a string), ``media_url``, ``missing_media``,
            ``bad_media``.

    """
    if type(path) is not str or not path:
        raise RecordError("invalid_content", f"{where} must be a file path, got {path!r}")
    if URL.match(path):
        raise RecordError(
            "media_url",
            f"{where} is a URL ({path[:80]}); nothing is downloaded (fetch it and name the file)",
        )
    file = os.path.join(root, path)
    try:
        mode = os.stat(file)
    except OSError:
        mode = None
    if mode is None or not S_ISREG(mode.st_mode):
        raise RecordError(
            "missing_media",
            f"{where} {path!r} is not a file under {root!r} (use --media-root to name the "
            "folder its paths start from)",
        )
    width, height = header_size(file)
    return MediaFile(root, path, width, height, int(mode.st_size))
