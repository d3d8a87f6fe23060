"""SHA-256 of bytes and files, the one checksum every packshard file and fingerprint uses."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable

CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    """Return the lowercase hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_path(
    path: str | os.PathLike[str], chunk: int = CHUNK, until: Callable[[], bool] | None = None
) -> str:
    """Return the lowercase hex SHA-256 of a file, read ``chunk`` bytes at a time.

    Only a regular file is read: a FIFO or a device (endless, or blocking) raises
    :class:`OSError` without a byte read.  ``until``, asked after each chunk, stops the read
    with :class:`InterruptedError` once it answers True (a hash someone else will finish).
    """
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
            if until is not None and until():
                raise InterruptedError(f"{os.fspath(path)}: hashing stopped")
    return digest.hexdigest()
