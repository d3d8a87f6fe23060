"""Spill parts read back, mapped or read in place: the ranges asked for, in their order."""

from __future__ import annotations

import numpy as np
import pytest

from packshard.pack.units import parts
from packshard.pack.units.parts import PartFiles, PartReader, read_part_ranges


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


@pytest.mark.parametrize("max_maps", [parts.MAX_MAPS, 0], ids=["mapped", "read"])
def test_ranges_come_back_in_their_order_from_any_part(tmp_path, monkeypatch, max_maps):
    monkeypatch.setattr(parts, "MAX_MAPS", max_maps)
    spill = make_parts(tmp_path, [5, 0, 7, 3])  # an empty part too
    starts = np.array([12, 0, 5, 3, 9, 13, 7])
    lengths = np.array([3, 2, 4, 0, 1, 2, 0])  # empty ranges take no token
    ids, labels = read_part_ranges(spill, starts, lengths)
    expected = [12, 13, 14, 0, 1, 5, 6, 7, 8, 9, 13, 14]
    assert ids.tolist() == expected and labels.tolist() == [-t for t in expected]
    assert ids.dtype == labels.dtype == np.int32
    none = read_part_ranges(spill, np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert none[0].size == none[1].size == 0


@pytest.mark.parametrize("max_maps", [parts.MAX_MAPS, 0], ids=["mapped", "read"])
def test_a_part_cut_short_is_an_error_not_garbage(tmp_path, monkeypatch, max_maps):
    monkeypatch.setattr(parts, "MAX_MAPS", max_maps)
    spill = make_parts(tmp_path, [4, 6])
    with open(tmp_path / "part1" / "labels.bin", "r+b") as fh:
        fh.truncate(12)
    with pytest.raises(EOFError, match=r"labels\.bin: spill part ends early at byte 12"):
        read_part_ranges(spill, np.array([7]), np.array([2]))


@pytest.mark.parametrize("max_maps", [parts.MAX_MAPS, 7], ids=["mapped", "read"])
def test_a_reader_reads_row_group_after_row_group_the_same(tmp_path, monkeypatch, max_maps):
    """One reader for many reads (a write task's row groups): each read equals a fresh one.

    Four parts make eight files: mapped (each once, kept) under the limit, read in place over it.
    """
    monkeypatch.setattr(parts, "MAX_MAPS", max_maps)
    spill = make_parts(tmp_path, [6, 4, 9, 5])
    reader = PartReader(spill)
    rng = np.random.default_rng(5)
    for _ in range(6):
        starts = rng.integers(0, 24, 8)
        part = np.searchsorted(spill.bases, starts, side="right") - 1
        lengths = np.minimum(rng.integers(0, 4, 8), spill.bases[part + 1] - starts)  # in a part
        ids, labels = reader.read(starts, lengths)
        expected = [t for s, n in zip(starts, lengths, strict=True) for t in range(s, s + n)]
        assert ids.tolist() == expected and labels.tolist() == [-t for t in expected]
    maps = list(reader._maps.values())
    assert len(maps) == (8 if max_maps >= 8 else 0)
    assert all(isinstance(m, np.memmap) for m in maps)  # maps of the files, not copies
