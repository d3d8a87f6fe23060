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


@pytest.mark.parametrize("window", [1, 3, 8, 64])
def test_windowed_read_equals_slicing(tmp_path, window):
    """Ranges in any order, repeated, empty or longer than a window: the slices, in place."""
    rng = np.random.default_rng(window)
    flat = rng.integers(-(2**31), 2**31, size=200, dtype=np.int64).astype(np.int32)
    flat.tofile(tmp_path / "tokens.bin")
    starts = rng.integers(0, 190, size=60)
    lengths = np.minimum(rng.integers(0, 12, size=60), 200 - starts)
    starts[5], lengths[5] = starts[4], lengths[4]  # one range twice (--mix copies)
    at = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    out = np.full(int(lengths.sum()), 7, np.int32)
    parts.read_window_ranges(str(tmp_path / "tokens.bin"), starts, lengths, at, out, window)
    want = np.concatenate([flat[s : s + n] for s, n in zip(starts, lengths, strict=True)])
    assert np.array_equal(out, want)


def test_a_part_past_the_window_reads_the_same(tmp_path, monkeypatch):
    spill = make_parts(tmp_path, [40, 25])
    starts, lengths = np.array([30, 2, 41, 0, 60]), np.array([9, 5, 20, 1, 5])
    whole = read_part_ranges(spill, starts, lengths)
    monkeypatch.setattr(parts, "WINDOW", 4)
    windowed = read_part_ranges(spill, starts, lengths)
    assert all(np.array_equal(a, b) for a, b in zip(whole, windowed, strict=True))
    with open(tmp_path / "part1" / "labels.bin", "r+b") as fh:
        fh.truncate(12)
    with pytest.raises(EOFError, match=r"labels\.bin: spill part ends early at byte 12"):
        read_part_ranges(spill, np.array([41]), np.array([2]))


@pytest.mark.parametrize("whole_bytes", [parts.WHOLE_BYTES, 0], ids=["whole", "read"])
def test_folded_parts_read_as_tokens_and_labels(tmp_path, monkeypatch, whole_bytes):
    monkeypatch.setattr(parts, "WHOLE_BYTES", whole_bytes)
    tokens = np.arange(10, dtype=np.int32)
    trains = np.array([0, 1, 1, 0, 1, 0, 0, 1, 1, 1], bool)
    np.where(trains, tokens, ~tokens).astype(np.int32).tofile(tmp_path / "tokens.bin")
    folded = PartFiles((str(tmp_path),), np.array([0, 10], np.int64), folded=True)
    for starts, lengths in (([0], [10]), ([6, 0, 3], [3, 2, 1])):  # one run, and ranges
        ids, labels = read_part_ranges(folded, np.array(starts), np.array(lengths))
        want = np.concatenate([tokens[a : a + n] for a, n in zip(starts, lengths, strict=True)])
        flags = np.concatenate([trains[a : a + n] for a, n in zip(starts, lengths, strict=True)])
        assert ids.tolist() == want.tolist()
        assert labels.tolist() == np.where(flags, want, -100).tolist()
