"""The spill writer: overlong policy on the way, interned codes, its counts, the read-back."""

from __future__ import annotations

import numpy as np

from packshard.ingest.types import TokenizedBatch
from packshard.pack.spill import Spill, SpillCounts, SpillWriter, smallest
from packshard.records import IGNORE_INDEX as X
from packshard.records import SourceRef


def batch(
    examples: list[tuple[list[int], list[int]]],
    domain: str = "d",
    source: str = "s.jsonl",
    formats: tuple[str, ...] | None = None,
) -> TokenizedBatch:
    ids = np.array([t for e in examples for t in e[0]], dtype=np.int32)
    labels = np.array([t for e in examples for t in e[1]], dtype=np.int32)
    offsets = np.concatenate(([0], np.cumsum([len(e[0]) for e in examples]))).astype(np.int64)
    refs = tuple(SourceRef(source, k + 1) for k in range(len(examples)))
    return TokenizedBatch(
        ids,
        labels,
        offsets,
        refs,
        tuple(domain for _ in examples),
        formats or ("messages",) * len(examples),
    )


def everything(spill: Spill) -> tuple[np.ndarray, np.ndarray]:
    """The spill's tokens and labels, all of them, read from its part."""
    return spill.read_ranges(np.zeros(1, np.int64), np.array([int(spill.offsets[-1])]))


def test_spill_writer_splits_across_chunks(tmp_path):
    writer = SpillWriter(
        tmp_path, max_seq_len=3, overlong="split", split_at_rows=False, sources=("s.jsonl",)
    )
    first = batch([([1, 2, 3, 4, 5, 6, 7], [X, 2, 3, 4, 5, 6, 7]), ([8, 9], [8, 9])])
    second = batch([([10, 11, 12, 13], [X, X, 12, 13])], domain="e")
    assert writer.add(first) == ()
    assert writer.add(second) == ()
    spill = writer.finish()
    # the one-token parts [7] and [13] have only a (masked) first label: dropped
    assert spill.lengths.tolist() == [3, 3, 2, 3]
    tokens, labels = everything(spill)
    assert tokens.tolist() == [1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12]
    assert labels.tolist() == [X, 2, 3, 4, 5, 6, 8, 9, X, X, 12]
    assert spill.parts.tolist() == [0, 1, 0, 0]
    assert spill.starts.tolist() == [0, 3, 0, 0]
    assert spill.record_ids.tolist() == [0, 0, 1, 2]
    assert spill.lines.tolist() == [1, 1, 2, 1]
    assert spill.domain_codes.tolist() == [0, 0, 0, 1]
    assert spill.loss_tokens.tolist() == [2, 2, 1, 1]
    assert spill.source_index.tolist() == [0, 0, 0, 0]
    assert spill.format_codes.tolist() == [0, 0, 0, 0]  # no formats given: "messages"
    assert spill.counts == SpillCounts(
        sources=("s.jsonl",),
        domains=("d", "e"),
        formats=("messages",),
        records_per_source=(3,),
        records_per_domain=(2, 1),
        tokens_in_per_domain=(9, 4),  # before the overlong policy
        tokens_truncated=0,
        records_split=2,
        parts_dropped=2,
    )


def test_spill_writer_interns_sources_domains_and_formats(tmp_path):
    writer = SpillWriter(
        tmp_path, max_seq_len=8, overlong="truncate", split_at_rows=False, sources=("a", "b")
    )
    ex = ([1, 2, 3], [X, 2, 3])
    writer.add(batch([ex, ex], domain="web", source="b", formats=("text", "messages")))
    writer.add(batch([ex], domain="chat", source="a", formats=("text",)))
    writer.add(batch([([4] * 10, [X] + [4] * 9)], domain="web", source="b", formats=("alpaca",)))
    spill = writer.finish()
    assert spill.source_index.tolist() == [1, 1, 0, 1]  # codes index the given sources
    assert spill.domain_codes.tolist() == [0, 0, 1, 0]  # in order of first appearance
    assert spill.format_codes.tolist() == [0, 1, 0, 2]
    assert spill.truncated.tolist() == [False, False, False, True]
    counts = spill.counts
    assert (counts.sources, counts.domains, counts.formats) == (
        ("a", "b"),
        ("web", "chat"),
        ("text", "messages", "alpaca"),
    )
    assert counts.records_per_source == (1, 3)
    assert counts.records_per_domain == (3, 1)
    assert counts.tokens_in_per_domain == (16, 3)
    assert (counts.tokens_truncated, counts.records_split, counts.parts_dropped) == (2, 0, 0)


def test_an_empty_spill_counts_its_sources(tmp_path):
    spill = SpillWriter(
        tmp_path, max_seq_len=8, overlong="drop", split_at_rows=False, sources=("a", "b")
    ).finish()
    assert len(spill) == 0 and spill.lengths.tolist() == []
    assert spill.counts == SpillCounts(sources=("a", "b"), records_per_source=(0, 0))


def test_spill_writer_rejects_a_record_left_with_no_part(tmp_path):
    writer = SpillWriter(tmp_path, max_seq_len=3, overlong="split", split_at_rows=False)
    b = batch([([1, 2], [1, 2]), ([3, 4, 5, 6], [X, X, X, 6])])
    [reject] = writer.add(b)
    assert (str(reject.ref), reject.code) == ("s.jsonl:2", "split_no_targets")
    spill = writer.finish()
    assert spill.lengths.tolist() == [2]
    assert spill.counts.records_per_domain == (2,)  # what ingest handed over, drops included
    assert (spill.counts.records_split, spill.counts.parts_dropped) == (1, 2)


def test_spill_writer_keeps_overlong_whole_for_wrapped(tmp_path):
    writer = SpillWriter(tmp_path, max_seq_len=2, overlong="drop", split_at_rows=True)
    b = batch([([1, 2, 3, 4, 5], [1, 2, 3, 4, 5])])
    assert writer.add(b) == ()
    spill = writer.finish()
    assert spill.lengths.tolist() == [5] and spill.loss_tokens.tolist() == [4]


def test_read_ranges_gathers_the_ranges_in_order(tmp_path):
    writer = SpillWriter(tmp_path, max_seq_len=10, overlong="drop", split_at_rows=False)
    b = batch([([1, 2, 3], [X, 2, 3]), ([4, 5], [4, 5]), ([6, 7, 8, 9], [X, X, 8, 9])])
    writer.add(b)
    spill = writer.finish()
    assert spill.tokens.size == 0  # the tokens stay on disk: never read back here
    starts, lengths = np.array([5, 0, 3, 7, 2]), np.array([4, 2, 1, 0, 1])
    ids, labels = spill.read_ranges(starts, lengths)
    assert ids.tolist() == [6, 7, 8, 9, 1, 2, 4, 3]
    assert labels.tolist() == [X, X, 8, 9, X, 2, 4, 3]
    assert ids.dtype == labels.dtype == np.int32
    assert everything(spill)[0].tolist() == list(range(1, 10))


def test_smallest_picks_the_narrowest_signed_type_that_holds_every_value():
    cases = [([0, 1, -128, 127], np.int8), ([0, 128], np.int16), ([-32769], np.int32)]
    for values, kind in cases:
        out = smallest(np.array(values, dtype=np.int64))
        assert out.dtype == kind and out.tolist() == values
    wide = np.array([2**31], dtype=np.int64)
    assert smallest(wide) is wide
    flags = np.array([True, False])
    assert smallest(flags) is flags  # not an integer array: unchanged
    assert smallest(np.zeros(0, np.int32)).dtype == np.int32
