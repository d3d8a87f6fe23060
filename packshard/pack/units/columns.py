"""The merged per-example columns kept in files, resident only while a stage reads them.

After the merge, every per-example column of the spill is written once to ``NAME.npy`` in the
work folder's ``_columns`` and mapped read-only; :func:`release_columns` hands a stage's pages
back (``MADV_DONTNEED`` on the clean mapping: nothing is written)::

    merge ─► columns ─► write NAME.npy, map read-only          resident: none of them
    plan        reads offsets, parts, loss tokens, pair codes (10 bytes an example)
    release_columns ────────────────────────────────────────── back to none
    statistics  reads offsets, domains, record ids, flags     (12 bytes)
    release_columns
    shards      each write task's offsets, released once its segments' starts are made
    index       reads a chunk's rows of its columns, released after each chunk

So the columns cost the driver what the stage at hand reads, not all of them at once.  The
values and types are the merge's, so the output's bytes do not change; a spill made
elsewhere (``repack``, tests) keeps its columns in memory.
"""

from __future__ import annotations

import mmap
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from packshard.pack.spill import PER_EXAMPLE, Spill

COLUMNS = "_columns"
"""The folder, inside the work folder, that holds the mapped columns."""
MAPPED = ("offsets", *PER_EXAMPLE)
"""The spill's arrays kept in files: the token offsets and every per-example column."""


def map_columns(spill: Spill, folder: Path) -> Spill:
    """Return ``spill`` with its per-example columns written to ``folder`` and mapped from there.

    ``folder`` is made afresh (what an earlier run left there is removed).
    """
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    mapped: dict[str, Any] = {}
    for name in MAPPED:
        values = getattr(spill, name)
        if values is None or not values.size:  # nothing to map (an empty map is refused)
            continue
        path = folder / f"{name}.npy"
        np.save(path, values, allow_pickle=False)
        mapped[name] = np.load(path, mmap_mode="r", allow_pickle=False)
    return replace(spill, **mapped)


def release_columns(spill: Spill) -> None:
    """Hand back the pages of the spill's mapped columns that a stage read (see above)."""
    for name in MAPPED:
        region = getattr(getattr(spill, name), "_mmap", None)
        if region is not None and not region.closed:
            region.madvise(mmap.MADV_DONTNEED)
