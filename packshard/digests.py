"""SHA-256 of bytes and files, the one checksum every packshard file and fingerprint uses."""

from __future__ import annotations

import hashlib
import os

CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    """Return the lowercase hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_path(path: str | os.PathLike[str], chunk: int = CHUNK) -> str:
    """Return the lowercase hex SHA-256 of a file, read ``chunk`` bytes at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()
