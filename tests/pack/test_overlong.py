"""Overlong policies (drop, truncate, split, error): on hand-made batches and through pack."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from click.testing import CliRunner

from packshard.errors import RecordError
from packshard.ingest.types import TokenizedBatch
from packshard.pack.overlong import apply_overlong
from packshard.records import IGNORE_INDEX as X
from packshard.records import SourceRef

# ``wN`` has id N and <eos> id 0 (the word_tokenizer fixture); a text record is its words + eos.
RECORDS = [
    {"text": "w2 w3"},  # 3 tokens
    {"text": "w4 w5 w6 w7 w8 w9 w10 w11 w12 w13"},  # 11 tokens: over L = 4
    {"prompt": "w20 w21 w22 w23 ", "completion": "w24"},  # 6 tokens, targets only at 4..5
    {"text": "w30"},  # 2 tokens
]


def inputs(tmp_path, make_jsonl):
    return [make_jsonl(tmp_path / "data.jsonl", RECORDS)]


# --- apply_overlong on hand-made batches -----------------------------------------------------


def batch(examples: list[tuple[list[int], list[int]]]) -> TokenizedBatch:
    ids = np.array([t for e in examples for t in e[0]], dtype=np.int32)
    labels = np.array([t for e in examples for t in e[1]], dtype=np.int32)
    offsets = np.concatenate(([0], np.cumsum([len(e[0]) for e in examples]))).astype(np.int64)
    refs = tuple(SourceRef("s.jsonl", k + 1) for k in range(len(examples)))
    n = len(examples)
    return TokenizedBatch(ids, labels, offsets, refs, ("d",) * n, ("messages",) * n)


# example 0 fits, example 1 is 7 tokens (over L = 3), example 2 is 4 tokens all prompt but one
EXAMPLES = [
    ([1, 2], [X, 2]),
    ([3, 4, 5, 6, 7, 8, 9], [X, 4, 5, 6, 7, 8, 9]),
    ([10, 11, 12, 13], [X, X, X, 13]),
]


def kept(policed) -> list[list[int]]:
    o = policed.offsets.tolist()
    return [policed.ids[a:b].tolist() for a, b in pairwise(o)]


def test_nothing_overlong_passes_through_unchanged() -> None:
    b = batch(EXAMPLES[:1])
    for policy in ("drop", "truncate", "split", "error"):
        out = apply_overlong(b, 3, policy)
        assert kept(out) == [[1, 2]] and out.rejects == ()
        assert (out.index.tolist(), out.parts.tolist()) == ([0], [0])
        assert out.truncated.tolist() == [False]
        assert (out.tokens_truncated, out.records_split, out.parts_dropped) == (0, 0, 0)


def test_drop_turns_each_overlong_example_into_areject_record() -> None:
    out = apply_overlong(batch(EXAMPLES), 3, "drop")
    assert kept(out) == [[1, 2]] and out.index.tolist() == [0]
    assert [(str(r.ref), r.code, r.kind) for r in out.rejects] == [
        ("s.jsonl:2", "too_long", "dropped"),
        ("s.jsonl:3", "too_long", "dropped"),
    ]
    assert out.rejects[0].reason == (
        "example is 7 tokens > max_seq_len 3 (dropped; use --overlong truncate|split to keep it)"
    )


def test_truncate_keeps_the_head_and_counts_what_it_cut() -> None:
    out = apply_overlong(batch(EXAMPLES), 3, "truncate")
    # example 2 keeps [10, 11, 12], whose labels after the first are masked: dropped
    assert kept(out) == [[1, 2], [3, 4, 5]]
    assert out.labels.tolist() == [X, 2, X, 4, 5]
    assert (out.index.tolist(), out.truncated.tolist()) == ([0, 1], [False, True])
    assert [(str(r.ref), r.code) for r in out.rejects] == [("s.jsonl:3", "truncated_no_targets")]
    assert out.tokens_truncated == (7 - 3) + (4 - 3)
    assert (out.records_split, out.parts_dropped) == (0, 0)


def test_split_numbers_parts_and_drops_the_targetless_ones() -> None:
    out = apply_overlong(batch(EXAMPLES), 3, "split")
    # example 1: [3 4 5] [6 7 8] [9] (the last part's one label is masked once packed)
    # example 2: [10 11 12] (no target) [13] (ditto): nothing left, the record is dropped
    assert kept(out) == [[1, 2], [3, 4, 5], [6, 7, 8]]
    assert (out.index.tolist(), out.parts.tolist()) == ([0, 1, 1], [0, 0, 1])
    assert not out.truncated.any()
    assert [(str(r.ref), r.code) for r in out.rejects] == [("s.jsonl:3", "split_no_targets")]
    assert (out.records_split, out.parts_dropped, out.tokens_truncated) == (2, 3, 0)


def test_error_names_the_first_overlong_record() -> None:
    with pytest.raises(RecordError) as info:
        apply_overlong(batch(EXAMPLES), 3, "error")
    assert info.value.code == "too_long"
    assert str(info.value) == (
        "s.jsonl:2: example is 7 tokens > max_seq_len 3 (use --overlong truncate|split|drop)"
    )


@pytest.mark.parametrize("policy", ["drop", "truncate", "split", "error"])
def test_no_cut_keeps_every_example_whole(policy) -> None:
    b = batch(EXAMPLES)
    out = apply_overlong(b, 3, policy, cut=False)  # the wrapped strategy splits at row ends
    assert kept(out) == [e[0] for e in EXAMPLES] and out.rejects == ()
    assert out.index.tolist() == [0, 1, 2]


# --- through pack, on a word-level tokenizer ---------------------------------------------------


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
    from packshard.errors import NothingToPackError

    data = make_jsonl(tmp_path / "d.jsonl", [{"prompt": "w2 w3 w4 w5 ", "completion": ""}])
    other = make_jsonl(tmp_path / "e.jsonl", [{"text": "w2 w3"}])
    packed = run_pack([data, other], word_tokenizer, max_seq_len=4, overlong="split")
    [reject] = packed.rejects
    assert (reject["line"], reject["code"]) == (1, "split_no_targets")
    assert reject["reason"] == "no part kept a target token after splitting (dropped)"
    stats = packed.manifest["stats"]
    assert (stats["records"], stats["dropped"], stats["rows"], stats["parts_dropped"]) == (
        2,
        1,
        1,
        2,
    )
    with pytest.raises(NothingToPackError, match=r"^nothing to pack: .*split_no_targets 1"):
        run_pack([data], word_tokenizer, tmp_path / "alone", max_seq_len=4, overlong="split")


def test_error_stops_at_the_first_overlong_record(tmp_path, make_jsonl, word_tokenizer):
    from packshard.pack import PackConfig, pack_dataset

    [data] = inputs(tmp_path, make_jsonl)
    out = tmp_path / "out"
    config = PackConfig.build(
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


# --- --turns expand: each turn example on its own -----------------------------------------


def expanded() -> TokenizedBatch:
    """Record 1 gives two examples (turns 2 and 4), record 2 one; L = 3 in the tests."""
    examples = [([1, 2], [X, 2]), ([3, 4, 5, 6, 7], [X, X, X, X, 7]), ([8, 9], [X, 9])]
    b = batch(examples)
    refs = (SourceRef("s.jsonl", 1), SourceRef("s.jsonl", 1), SourceRef("s.jsonl", 2))
    turns = np.array([2, 4, 2], dtype=np.int32)
    return TokenizedBatch(b.input_ids, b.labels, b.offsets, refs, b.domains, b.formats, turns)


def test_drop_keeps_the_turn_examples_that_fit() -> None:
    out = apply_overlong(expanded(), 3, "drop", records=np.array([0, 0, 1]))
    assert kept(out) == [[1, 2], [8, 9]] and out.index.tolist() == [0, 2]
    assert out.rejects == () and out.parts_dropped == 1  # record 1 keeps its turn 2
    out = apply_overlong(expanded(), 1, "drop", records=np.array([0, 0, 1]))
    assert kept(out) == [] and out.parts_dropped == 0
    assert [(r.ref.line, r.code) for r in out.rejects] == [(1, "too_long"), (2, "too_long")]
    assert out.rejects[0].reason == (
        "example for message 2 is 2 tokens > max_seq_len 1 (dropped; use --overlong "
        "truncate|split to keep it)"
    )


def test_truncate_loses_an_example_but_keeps_its_record() -> None:
    out = apply_overlong(expanded(), 3, "truncate", records=np.array([0, 0, 1]))
    assert kept(out) == [[1, 2], [8, 9]] and out.rejects == ()
    assert out.parts_dropped == 1  # the example of message 4 kept no target
    alone = apply_overlong(expanded(), 3, "truncate", records=np.array([0, 1, 2]))
    assert [r.ref.line for r in alone.rejects] == [1] and alone.parts_dropped == 0
