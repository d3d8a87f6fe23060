"""The merged columns mapped from files: the same values and types, pages handed back."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from packshard.pack.units.columns import MAPPED, map_columns, release_columns
from tests.helpers import make_spill


def _resident_kib(path: str) -> int:
    """KiB of ``path``'s mapping resident in this process (``Rss`` in ``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's first line
                inside = head[-1] == path
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


def test_mapped_columns_hold_the_same_values_and_types(tmp_path):
    spill = make_spill([[-100, 5, 6], [-100, 7], [-100, 8, 9, 10]])
    (tmp_path / "_columns").mkdir()
    (tmp_path / "_columns" / "stale.npy").write_bytes(b"left by an earlier run")
    mapped = map_columns(spill, tmp_path / "_columns")
    assert not (tmp_path / "_columns" / "stale.npy").exists()  # the folder is made afresh
    for name in MAPPED:  # the token offsets too: resident only where read
        before, after = getattr(spill, name), getattr(mapped, name)
        if before is None:
            assert after is None
            continue
        assert isinstance(after, np.memmap) and after.dtype == before.dtype
        np.testing.assert_array_equal(after, before)
    release_columns(mapped)
    np.testing.assert_array_equal(mapped.lines, spill.lines)  # read again after a release
    release_columns(spill)  # a spill held in memory: nothing to hand back


def test_release_hands_back_the_pages_a_stage_read(tmp_path):
    n = 1 << 20
    spill = replace(make_spill([[-100, 1]]), lines=np.arange(n, dtype=np.int64))
    mapped = map_columns(spill, tmp_path / "_columns")
    path = str((tmp_path / "_columns" / "lines.npy").resolve())
    assert int(mapped.lines.sum()) == n * (n - 1) // 2  # every page read
    assert _resident_kib(path) >= 8 * n // 1024 * 9 // 10  # the control: they are resident
    release_columns(mapped)
    assert _resident_kib(path) == 0
    assert int(mapped.lines[-1]) == n - 1  # and read again on demand
