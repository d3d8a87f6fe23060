"""Paths a manifest names, contained: every file read from an output folder lies inside it.

An output folder may come from anyone, so a path from its manifest is used only when it is
a relative path without ``..``, resolves (links followed) to a place inside the folder, and
names a regular file — never a device, FIFO or folder, which could block a reader or feed it
endless bytes.  Readers (``verify``, ``inspect``, the torch reader) go through
:func:`inside_folder`; a path that fails is a :class:`~packshard.errors.FormatError` naming
it, and nothing behind it is opened.
"""

from __future__ import annotations

import os
import stat
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
