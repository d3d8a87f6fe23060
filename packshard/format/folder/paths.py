"""Paths a manifest names, contained: every file read from an output folder lies inside it.

A path from a manifest is used only when it is relative without ``..``, resolves (links
followed) inside the folder, and names a regular file (never a device, FIFO or folder).
Readers go through :func:`inside_folder`; a path that fails is a
:class:`~packshard.errors.FormatError` naming it, and nothing behind it is opened.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any

from packshard.errors import FormatError

MISSING = "listed in the manifest but missing"


def inside_folder(folder: str | os.PathLike[str], rel: Any) -> Path:
    """Return ``folder/rel`` when it is a regular file inside ``folder``.

    Raises:
        FormatError: the path is not a relative path inside the folder, leaves it through a
            link, is missing (:data:`MISSING`), or is not a regular file.

    """
    shown = rel if isinstance(rel, str) else repr(rel)
    if (
        not isinstance(rel, str)
        or not rel
        or "\\" in rel
        or "\0" in rel
        or PurePosixPath(rel).is_absolute()
        or ".." in PurePosixPath(rel).parts
    ):
        raise FormatError(shown, "path is not a relative path inside the folder (not read)")
    base = Path(folder)
    path = base / rel
    real, root = os.path.realpath(path), os.path.realpath(base)
    if not real.startswith(root.rstrip(os.sep) + os.sep):
        raise FormatError(rel, "is a link to a place outside the folder (not read)")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FormatError(rel, MISSING) from None
    except OSError as exc:
        raise FormatError(rel, f"cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        raise FormatError(rel, "is not a regular file (not read)")
    return path


def open_inside(folder: str | os.PathLike[str], rel: Any) -> int:
    """Open ``folder/rel`` for reading and return the descriptor of what was checked.

    The path is checked (:func:`inside_folder`), opened without blocking, then checked again
    and compared by device and inode, so a file swapped in between is refused, not read.

    Raises:
        FormatError: as :func:`inside_folder`, or the file changed while it was opened.

    """
    path = inside_folder(folder, rel)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise FormatError(rel, f"cannot be read ({exc.strerror})") from None
    try:
        opened = os.fstat(fd)
        now = os.stat(os.path.realpath(inside_folder(folder, rel)))
        if not stat.S_ISREG(opened.st_mode) or not os.path.samestat(opened, now):
            raise FormatError(rel, "changed while it was being opened (not read)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def duplicate_paths(manifest: Any) -> str | None:
    """Say which path a manifest lists more than once (each file is listed once), or None.

    Checked before anything reads the entries (one shard named 200,000 times would be opened
    200,000 times); entries of the wrong type are left to the schema.
    """
    if not isinstance(manifest, dict):
        return None
    shards, files = manifest.get("shards"), manifest.get("files")
    entries = list(shards) if isinstance(shards, list) else []
    entries += list(files.values()) if isinstance(files, dict) else []
    paths = [e.get("path") for e in entries if isinstance(e, dict)]
    seen = Counter(rel for rel in paths if isinstance(rel, str))
    repeated = [(rel, n) for rel, n in seen.items() if n > 1]
    if not repeated:
        return None
    rel, n = repeated[0]
    more = f" (and {len(repeated) - 1} more paths)" if len(repeated) > 1 else ""
    return f"manifest.json lists {rel!r} {n:,} times{more}; every file is listed once"
