"""Spill parts read back: read whole or range by range, the same ranges in the same order."""

from __future__ import annotations

import numpy as np
import pytest

from packshard.pack.units import parts
from packshard.pack.units.parts import PartFiles, read_part_ranges


def make_parts(tmp_path, sizes: list[int]) -> PartFiles:
    """Parts of ``sizes`` tokens; token ``t`` of the flat space is ``t``, its label ``-t``."""
    folders, base = [], 0
    for k, size in enumerate(sizes):
        folder = tmp_path / f"part{k}"
        folder.mkdir()
        flat = np.arange(base, base + size, dtype=np.int32)
        flat.tofile(folder / "tokens.bin")
        (-flat).tofile(folder / "labels.bin")
        folders.append(str(folder))
        base += size
    bounds = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    return PartFiles(tuple(folders), bounds)


@pytest.mark.parametrize("whole_bytes", [parts.WHOLE_BYTES, 0], ids=["whole", "read"])
def test_ranges_come_back_in_their_order_from_any_part(tmp_path, monkeypatch, whole_bytes):
    monkeypatch.setattr(parts, "WHOLE_BYTES", whole_bytes)
    spill = make_parts(tmp_path, [5, 0, 7, 3])  # an empty part too
    starts = np.array([12, 0, 5, 3, 9, 13, 7])
    lengths = np.array([3, 2, 4, 0, 1, 2, 0])  # empty ranges take no token
    ids, labels = read_part_ranges(spill, starts, lengths)
    expected = [12, 13, 14, 0, 1, 5, 6, 7, 8, 9, 13, 14]
    assert ids.tolist() == expected and labels.tolist() == [-t for t in expected]
    assert ids.dtype == labels.dtype == np.int32
    none = read_part_ranges(spill, np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert none[0].size == none[1].size == 0


@pytest.mark.parametrize("whole_bytes", [parts.WHOLE_BYTES, 0], ids=["whole", "read"])
def test_a_part_cut_short_is_an_error_not_garbage(tmp_path, monkeypatch, whole_bytes):
    monkeypatch.setattr(parts, "WHOLE_BYTES", whole_bytes)
    spill = make_parts(tmp_path, [4, 6])
    with open(tmp_path / "part1" / "labels.bin", "r+b") as fh:
        fh.truncate(12)
    with pytest.raises(EOFError, match=r"labels\.bin: spill part ends early at byte 12"):
        read_part_ranges(spill, np.array([7]), np.array([2]))


def test_one_run_of_one_part_is_read_as_one_slice(tmp_path, monkeypatch):
    spill = make_parts(tmp_path, [20])
    calls = []
    real = parts._read_ranges
    monkeypatch.setattr(parts, "_read_ranges", lambda *a: calls.append(a[3]) or real(*a))
    ids, labels = read_part_ranges(spill, np.array([4, 7, 7, 12]), np.array([3, 0, 5, 2]))
    assert ids.tolist() == list(range(4, 14)) and labels.tolist() == [-t for t in range(4, 14)]
    assert calls == [[40], [40]]  # one read of 10 tokens a file
    # the control: ranges that are not one run are gathered, each in its place
    ids, _ = read_part_ranges(spill, np.array([4, 8]), np.array([3, 2]))
    assert ids.tolist() == [4, 5, 6, 8, 9] and len(calls) == 2
    with open(tmp_path / "part0" / "labels.bin", "r+b") as fh:
        fh.truncate(24)
    with pytest.raises(EOFError, match=r"labels\.bin: spill part ends early at byte 24"):
        read_part_ranges(spill, np.array([4, 7]), np.array([3, 5]))
