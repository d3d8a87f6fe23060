"""Overlong policies (drop, truncate, split, error) and the on-disk spill."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import packshard.pack.spill as spill_module
from packshard.errors import RecordError
from packshard.records import IGNORE_INDEX as X
from packshard.records import SourceRef, TokenizedBatch
from packshard.pack.spill import SpillWriter, count_targets

# ``wN`` has id N and <eos> id 0 (tests/conftest.py); a text record is its words + eos.
RECORDS = [
    {"text": "w2 w3"},  # 3 tokens
    {"text": "w4 w5 w6 w7 w8 w9 w10 w11 w12 w13"},  # 11 tokens: over L = 4
    {"prompt": "w20 w21 w22 w23 ", "completion": "w24"},  # 6 tokens, targets only at 4..5
    {"text": "w30"},  # 2 tokens
]


def inputs(tmp_path, make_jsonl):
    return [make_jsonl(tmp_path / "data.jsonl", RECORDS)]


def test_drop_rejects_too_long_with_its_place(tmp_path, make_jsonl, word_tokenizer, run_pack):
    packed = run_pack(inputs(tmp_path, make_jsonl), word_tokenizer, max_seq_len=4)
    rejects = {r["line"]: r for r in packed.rejects}
    assert sorted(rejects) == [2, 3]
    assert rejects[2]["code"] == "too_long"
    assert rejects[2]["reason"] == (
        "example is 11 tokens > max_seq_len 4 (dropped; use --overlong truncate|split to keep it)"
    )
    assert rejects[3]["reason"].startswith("example is 6 tokens > max_seq_len 4")
    assert rejects[2]["domain"] == "data" and rejects[2]["source"].endswith("data.jsonl")
    stats = packed.manifest["stats"]
    assert (stats["records"], stats["records_packed"], stats["dropped"]) == (4, 2, 2)
    assert stats["rejects_by_code"] == {"too_long": 2}
    assert stats["tokens_in"] == 3 + 11 + 6 + 2 and stats["tokens"] == 5
    assert packed.examples["line"] == [1, 4]


def test_truncate_keeps_the_head_and_drops_targetless(
    tmp_path, make_jsonl, word_tokenizer, run_pack
):
    packed = run_pack(
        inputs(tmp_path, make_jsonl), word_tokenizer, max_seq_len=4, overlong="truncate"
    )
    ex = packed.examples
    assert ex["line"] == [1, 2, 4]
    assert ex["truncated"] == [False, True, False]
    assert ex["num_tokens"] == [3, 4, 2]
    ids, labels, _ = packed.segment(1)
    assert ids.tolist() == [4, 5, 6, 7] and labels.tolist() == [X, 5, 6, 7]
    # the prompt fills all 4 kept tokens: nothing left to train on
    [reject] = packed.rejects
    assert (reject["line"], reject["code"]) == (3, "truncated_no_targets")
    assert reject["reason"] == "no target token left after truncation (dropped)"
    stats = packed.manifest["stats"]
    assert (stats["records_packed"], stats["dropped"], stats["truncated"]) == (3, 1, 1)
    # tokens cut from every truncated example, including the one dropped afterwards
    assert stats["tokens_truncated"] == (11 - 4) + (6 - 4)


def test_split_makes_parts_that_rebuild_the_record(tmp_path, make_jsonl, word_tokenizer, run_pack):
    packed = run_pack(inputs(tmp_path, make_jsonl), word_tokenizer, max_seq_len=4, overlong="split")
    ex = packed.examples
    assert ex["line"] == [1, 2, 2, 2, 3, 4]
    assert ex["part"] == [0, 0, 1, 2, 1, 0]
    assert ex["token_offset"] == [0, 0, 4, 8, 4, 0]
    assert ex["num_tokens"] == [3, 4, 4, 3, 2, 2]
    assert max(ex["num_tokens"]) <= 4
    parts = [packed.segment(k) for k in (1, 2, 3)]
    assert np.concatenate([p[0] for p in parts]).tolist() == [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 0]
    assert [p[1].tolist() for p in parts] == [[X, 5, 6, 7], [X, 9, 10, 11], [X, 13, 0]]
    assert all(p[2].tolist() == list(range(len(p[2]))) for p in parts)
    # record 3: part 0 is all prompt (no target) and is dropped; part 1 keeps "w24 <eos>"
    ids, labels, _ = packed.segment(4)
    assert ids.tolist() == [24, 0] and labels.tolist() == [X, 0]
    stats = packed.manifest["stats"]
    assert (stats["records_packed"], stats["split"], stats["examples"]) == (4, 2, 6)
    assert (stats["parts_dropped"], stats["dropped"]) == (1, 0)


def test_split_drops_a_record_none_of_whose_parts_trains(
    tmp_path, make_jsonl, word_tokenizer, run_pack
):
    # 5 tokens, only <eos> trained; L = 4 leaves it alone in part 1 where it is masked.
    data = make_jsonl(tmp_path / "d.jsonl", [{"prompt": "w2 w3 w4 w5 ", "completion": ""}])
    packed = run_pack([data], word_tokenizer, max_seq_len=4, overlong="split")
    [reject] = packed.rejects
    assert (reject["line"], reject["code"]) == (1, "split_no_targets")
    assert reject["reason"] == "no part kept a target token after splitting (dropped)"
    stats = packed.manifest["stats"]
    assert (stats["records"], stats["dropped"], stats["rows"], stats["parts_dropped"]) == (
        1,
        1,
        0,
        2,
    )
    assert packed.manifest["shards"][0]["rows"] == 0


def test_error_stops_at_the_first_overlong_record(tmp_path, make_jsonl, word_tokenizer):
    from packshard.pack.pipeline import PackConfig, pack_dataset

    [data] = inputs(tmp_path, make_jsonl)
    out = tmp_path / "out"
    config = PackConfig(
        inputs=(str(data),), tokenizer=str(word_tokenizer), out=str(out), max_seq_len=4,
        overlong="error",
    )  # fmt: skip
    with pytest.raises(RecordError) as info:
        pack_dataset(config)
    assert info.value.code == "too_long"
    assert str(info.value) == (
        f"{data}:2: example is 11 tokens > max_seq_len 4 (use --overlong truncate|split|drop)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl"]


def test_error_exits_1_on_the_command_line(tmp_path, make_jsonl, word_tokenizer):
    from packshard.cli.commands import main

    [data] = inputs(tmp_path, make_jsonl)
    args = ["pack", str(data), "-t", str(word_tokenizer), "--max-seq-len", "4"]
    args += ["-o", str(tmp_path / "out"), "--overlong", "error", "--no-progress"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert f"{data}:2: example is 11 tokens > max_seq_len 4" in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()


# --- SpillWriter on hand-made batches ---------------------------------------------------------


def batch(examples: list[tuple[list[int], list[int]]]) -> TokenizedBatch:
    ids = np.array([t for e in examples for t in e[0]], dtype=np.int32)
    labels = np.array([t for e in examples for t in e[1]], dtype=np.int32)
    offsets = np.concatenate(([0], np.cumsum([len(e[0]) for e in examples]))).astype(np.int64)
    refs = tuple(SourceRef("s.jsonl", k + 1) for k in range(len(examples)))
    return TokenizedBatch(ids, labels, offsets, refs, tuple("d" for _ in examples))


def test_count_targets_skips_each_first_label():
    labels = np.array([7, 8, X, 9, X, X, 5], dtype=np.int32)
    offsets = np.array([0, 2, 4, 4, 7], dtype=np.int64)
    assert count_targets(labels, offsets).tolist() == [1, 1, 0, 1]


def test_spill_writer_splits_across_chunks(tmp_path):
    writer = SpillWriter(tmp_path, max_seq_len=3, overlong="split", split_at_rows=False)
    first = batch([([1, 2, 3, 4, 5, 6, 7], [X, 2, 3, 4, 5, 6, 7]), ([8, 9], [8, 9])])
    second = batch([([10, 11, 12, 13], [X, X, 12, 13])])
    assert writer.add(first, np.zeros(2, np.int32), np.zeros(2, np.int32), np.arange(2)) == []
    assert writer.add(second, np.zeros(1, np.int32), np.ones(1, np.int32), np.arange(2, 3)) == []
    spill = writer.finish()
    # the one-token parts [7] and [13] have only a (masked) first label: dropped
    assert spill.lengths.tolist() == [3, 3, 2, 3]
    assert spill.tokens.tolist() == [1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12]
    assert spill.labels.tolist() == [X, 2, 3, 4, 5, 6, 8, 9, X, X, 12]
    assert spill.parts.tolist() == [0, 1, 0, 0]
    assert spill.starts.tolist() == [0, 3, 0, 0]
    assert spill.record_ids.tolist() == [0, 0, 1, 2]
    assert spill.lines.tolist() == [1, 1, 2, 1]
    assert spill.domain_codes.tolist() == [0, 0, 0, 1]
    assert spill.loss_tokens.tolist() == [2, 2, 1, 1]
    assert (writer.records_split, writer.parts_dropped) == (2, 2)


def test_spill_writer_rejects_a_record_left_with_no_part(tmp_path):
    writer = SpillWriter(tmp_path, max_seq_len=3, overlong="split", split_at_rows=False)
    b = batch([([1, 2], [1, 2]), ([3, 4, 5, 6], [X, X, X, 6])])
    [reject] = writer.add(b, np.zeros(2, np.int32), np.zeros(2, np.int32), np.arange(2))
    assert (str(reject.ref), reject.code) == ("s.jsonl:2", "split_no_targets")
    assert writer.finish().lengths.tolist() == [2]


def test_spill_writer_keeps_overlong_whole_for_wrapped(tmp_path):
    writer = SpillWriter(tmp_path, max_seq_len=2, overlong="drop", split_at_rows=True)
    b = batch([([1, 2, 3, 4, 5], [1, 2, 3, 4, 5])])
    assert writer.add(b, np.zeros(1, np.int32), np.zeros(1, np.int32), np.arange(1)) == []
    spill = writer.finish()
    assert spill.lengths.tolist() == [5] and spill.loss_tokens.tolist() == [4]


@pytest.mark.parametrize("in_memory", [True, False], ids=["read-back-whole", "file-backed"])
def test_read_ranges_gathers_the_ranges_in_order(tmp_path, monkeypatch, in_memory):
    if not in_memory:
        monkeypatch.setattr(spill_module, "IN_MEMORY_BYTES", 0)
    writer = SpillWriter(tmp_path, max_seq_len=10, overlong="drop", split_at_rows=False)
    b = batch([([1, 2, 3], [X, 2, 3]), ([4, 5], [4, 5]), ([6, 7, 8, 9], [X, X, 8, 9])])
    writer.add(b, np.zeros(3, np.int32), np.zeros(3, np.int32), np.arange(3))
    spill = writer.finish()
    assert (spill.folder is None) == in_memory
    starts, lengths = np.array([5, 0, 3, 7, 2]), np.array([4, 2, 1, 0, 1])
    ids, labels = spill.read_ranges(starts, lengths)
    assert ids.tolist() == [6, 7, 8, 9, 1, 2, 4, 3]
    assert labels.tolist() == [X, X, 8, 9, X, 2, 4, 3]
    assert ids.dtype == labels.dtype == np.int32
    spill.release_pages()  # dropping mapped pages leaves the data readable
    assert spill.tokens.tolist() == list(range(1, 10))
