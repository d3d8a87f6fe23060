r"""An image's width and height from its first bytes: PNG, JPEG, GIF, WebP, BMP.

Planning needs only each image's size.  Pillow's ``Image.open`` builds an image object and
tries its plugins to find it (about 0.3 ms a file); reading it where each format stores it
costs a ``read`` of a few hundred bytes::

    PNG   \x89PNG…  IHDR at byte 16: width, height (big-endian u32)
    GIF   GIF8?a    bytes 6-9: width, height (little-endian u16)
    BMP   BM        bytes 18-25: width, height (little-endian i32; negative: top-down)
    WebP  RIFF…WEBP VP8 / VP8L / VP8X chunk header
    JPEG  \xff\xd8  markers walked to the first SOFn (EXIF and ICC segments skipped by length)

Any other format, or a header these rules cannot read, goes to Pillow; the sizes agree with
Pillow's ``.size`` on every shared image.  EXIF orientation is not applied (neither Pillow's
``.size`` nor transformers' processor applies it).
"""

from __future__ import annotations

import struct
from typing import BinaryIO

HEAD = 512
"""Bytes read first: every format's size is in them, except a JPEG with large segments."""
SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
"""JPEG start-of-frame markers (not DHT C4, JPG C8, DAC CC)."""
MAX_JPEG_SCAN = 1 << 20
"""How far into a JPEG its first frame header is looked for before Pillow decides."""


def _jpeg(fh: BinaryIO, head: bytes) -> tuple[int, int] | None:
    at, data = 2, head
    while at < MAX_JPEG_SCAN:
        if at + 9 > len(data):
            more = fh.read(max(4096, at + 9 - len(data)))
            if not more:
                return None
            data += more
            continue
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in SOF:
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        at += 2 + length
    return None


def _webp(head: bytes) -> tuple[int, int] | None:
    kind = head[12:16]
    if kind == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", head[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if kind == b"VP8L" and head[20] == 0x2F:
        b = int.from_bytes(head[21:25], "little")
        return (b & 0x3FFF) + 1, ((b >> 14) & 0x3FFF) + 1
    if kind == b"VP8X":
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    return None


def quick_size(fh: BinaryIO) -> tuple[int, int] | None:
    """Return ``(width, height)`` read from the header of an open file, or None (ask Pillow)."""
    head = fh.read(HEAD)
    if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR" and len(head) >= 24:
        return struct.unpack(">II", head[16:24])
    if head[:2] == b"\xff\xd8":
        return _jpeg(fh, head)
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return struct.unpack("<HH", head[6:10])
    if head[:2] == b"BM" and len(head) >= 26:
        w, h = struct.unpack("<ii", head[18:26])
        return w, abs(h)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP" and len(head) >= 30:
        return _webp(head)
    return None
