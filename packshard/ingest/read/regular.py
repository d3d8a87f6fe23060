"""Opening an input without blocking: anything but a regular file is refused first.

A FIFO, socket or device named as an input could block a reader forever, so every input
(and a template file) is opened ``O_NONBLOCK`` and checked with ``fstat`` before a byte is
read::

    os.open(path, O_RDONLY | O_NONBLOCK) ─► fstat: regular? ─► descriptor (or file object)
                                                   └─ no: InputError "a FIFO, not a regular file"

It imports nothing of the package but the errors, so the template loader opens its file
without importing the input listing (and the object store behind it).
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from packshard.errors import InputError

_SPECIAL = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


def special_file(path: str, mode: int) -> InputError:
    """Return the error for ``path``, whose ``mode`` is not a regular file's."""
    kind = _SPECIAL.get(stat.S_IFMT(mode), "not a regular file")
    return InputError(
        f"{path}: {kind}, not a regular file (reading it could block forever; "
        "remove it from the inputs)"
    )


def open_regular(path: str | os.PathLike[str], shown: str) -> BinaryIO:
    """Open ``path`` for reading, refusing (without blocking) anything but a regular file.

    Raises:
        InputError: it cannot be opened, or is a FIFO, socket, device or folder.

    """
    return os.fdopen(open_regular_fd(path, shown), "rb")


def open_regular_fd(path: str | os.PathLike[str], shown: str) -> int:
    """Return a descriptor of ``path`` open for reading, as :func:`open_regular` checks it.

    For readers of a byte range (``os.pread``); the caller closes it.  ``O_NONBLOCK`` keeps
    the open from hanging on a FIFO.

    Raises:
        InputError: it cannot be opened, or is a FIFO, socket, device or folder.

    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"{shown}: cannot open ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise special_file(shown, mode)
    return fd
