"""Write tasks are made one at a time, when an engine takes them, and not kept."""

from __future__ import annotations

import pytest

from packshard.pack.write.shards import Made


def test_tasks_are_made_when_taken_and_every_index_rule_holds():
    made: list[int] = []

    def make(k: int):
        made.append(k)
        return f"task {k}"

    tasks = Made(make, 3)  # type: ignore[arg-type]
    assert len(tasks) == 3 and made == []  # nothing is made up front
    assert tasks[1] == "task 1" and tasks[-1] == "task 2" and made == [1, 2]
    assert tasks[1] == "task 1" and made == [1, 2, 1]  # a retry makes it again: no cache
    assert list(tasks) == ["task 0", "task 1", "task 2"]
    assert tasks[0:3:2] == ["task 0", "task 2"]
    with pytest.raises(IndexError):
        tasks[3]
    with pytest.raises(IndexError):
        tasks[-4]


def test_row_groups_assembled_in_pieces_are_the_same_bytes(tmp_path, monkeypatch):
    from packshard.demo import build_demo_tokenizer
    from packshard.pack.write import shards
    from tests.helpers import output_digests, pack_demo_into

    tok = build_demo_tokenizer(tmp_path / "tok")
    whole = output_digests(pack_demo_into(tmp_path / "whole", tok, shard_rows=64, workers=1))
    cuts: list[list[int]] = []
    real = shards.piece_cuts

    def spied(offsets, start, stop):
        cuts.append(real(offsets, start, stop))
        return cuts[-1]

    monkeypatch.setattr(shards, "PIECE_SEGMENTS", 3)  # a few rows a piece, or one long row
    monkeypatch.setattr(shards, "piece_cuts", spied)
    pieces = output_digests(pack_demo_into(tmp_path / "pieces", tok, shard_rows=64, workers=1))
    assert max(len(c) for c in cuts) > 2  # the control: row groups were really cut in pieces

    def shards_of(digests: dict[str, str]) -> dict[str, str]:  # the rest names the input
        return {k: v for k, v in digests.items() if k.startswith("shard-")}

    assert shards_of(pieces) == shards_of(whole) and shards_of(whole)


def test_piece_cuts_never_cut_a_row_and_cover_the_rows(monkeypatch):
    import numpy as np

    from packshard.pack.write import shards

    monkeypatch.setattr(shards, "PIECE_SEGMENTS", 4)
    offsets = np.array([0, 1, 3, 9, 10, 11, 12, 13, 14], np.int64)  # row 2 alone has 6
    assert shards.piece_cuts(offsets, 0, 8) == [0, 2, 3, 7, 8]
    assert shards.piece_cuts(offsets, 3, 5) == [3, 5]
    assert shards.piece_cuts(offsets, 0, 0) == [0, 0]  # an empty shard: one empty piece
