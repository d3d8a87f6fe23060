"""An examples index of several row groups: the same rows, every reader takes it.

``pack`` writes ``examples.parquet`` in chunks of ``EXAMPLE_GROUP_ROWS`` rows, one row group
each, so that the driver holds one chunk at a time.  A pack with more examples than that has
several row groups; these tests make the chunk tiny, so the demo's examples span many.
"""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import packshard.pack.counts as counts
from packshard.cli.inspect import inspect_row
from packshard.format.examples import EXAMPLE_GROUP_ROWS
from packshard.torch.evaluate import INDEX_COLUMNS
from packshard.verify.run import VerifyOptions, verify_dataset
from tests.helpers import pack_demo_into

CHUNK = 5


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory, demo_tokenizer: Path) -> tuple[Path, Path]:
    """The demo packed with the real chunk (one row group) and with a chunk of 5 rows."""
    root = tmp_path_factory.mktemp("chunks")  # the same input path: the same dataset id
    whole = pack_demo_into(root, demo_tokenizer).rename(root / "whole")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(counts, "EXAMPLE_GROUP_ROWS", CHUNK)
        chunked = pack_demo_into(root, demo_tokenizer)
    return whole, chunked


def test_the_demo_index_is_one_row_group_below_the_chunk(packs):
    whole, _ = packs
    meta = pq.ParquetFile(whole / "examples.parquet").metadata
    assert meta.num_rows < EXAMPLE_GROUP_ROWS
    assert meta.num_row_groups == 1


def test_chunks_are_row_groups_of_the_same_rows(packs):
    whole, chunked = packs
    meta = pq.ParquetFile(chunked / "examples.parquet").metadata
    assert meta.num_rows > 2 * CHUNK
    assert meta.num_row_groups == math.ceil(meta.num_rows / CHUNK)
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups - 1)] == [CHUNK] * (
        meta.num_row_groups - 1
    )
    a, b = pq.read_table(whole / "examples.parquet"), pq.read_table(chunked / "examples.parquet")
    assert a.combine_chunks().equals(b.combine_chunks())
    assert a.schema.metadata == b.schema.metadata
    shards = sorted(p.name for p in whole.glob("shard-*.parquet"))
    assert shards and shards == sorted(p.name for p in chunked.glob("shard-*.parquet"))
    for name in shards:  # the shards do not depend on the index's chunks
        assert (whole / name).read_bytes() == (chunked / name).read_bytes(), name


def test_verify_and_inspect_read_an_index_of_many_row_groups(packs):
    whole, chunked = packs
    report = verify_dataset(chunked, VerifyOptions(model="none"))
    assert report.ok, [f.message for f in report.findings]
    assert report.checks["source"]["status"] == "passed"
    for shard in range(2):
        for row in range(2):
            a, b = inspect_row(whole, row, shard), inspect_row(chunked, row, shard)
            assert [(s.example_id, s.source, s.part) for s in a.segments] == [
                (s.example_id, s.source, s.part) for s in b.segments
            ]
            assert all(":" in s.source for s in b.segments)
    assert set(INDEX_COLUMNS) <= set(pq.read_schema(chunked / "examples.parquet").names)
