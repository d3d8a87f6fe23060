"""Readers keep every readable record, and a run that packs nothing still shows its rejects.

A truncated ``.jsonl.gz`` keeps every complete line before the break (then one reject for
the break); a Parquet file with one unreadable row group loses only that group (one reject
naming its rows), on one process and on workers; when nothing is packed the rejects are kept
beside OUT (no folder is published) and the error says where.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packshard.errors import NothingToPackError
from packshard.ingest.read.inputs import InputFile
from packshard.ingest.read.sources import read_records
from packshard.ingest.types import IngestOptions
from packshard.pack import PackConfig, pack_dataset


def input_file(path: Path) -> InputFile:
    return InputFile(str(path), path.resolve())


def test_a_truncated_gzip_keeps_every_complete_line_before_the_break(tmp_path):
    data = "".join(json.dumps({"text": f"record {i} " + "x" * 40}) + "\n" for i in range(200))
    packed = gzip.compress(data.encode())
    cut = packed[: len(packed) * 2 // 3]
    complete = zlib.decompressobj(wbits=31).decompress(cut).count(b"\n")
    assert complete > 100
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(cut)
    records = list(read_records(input_file(path), options=IngestOptions()))
    assert [r.value["text"].split()[1] for r in records[:-1]] == [str(i) for i in range(complete)]
    assert records[-1].ref.line == complete + 1
    assert records[-1].error is not None and records[-1].error.code == "unreadable"


def broken_parquet(path: Path, groups: int = 4, rows: int = 500, bad: int = 1) -> Path:
    """A Parquet file of ``groups`` row groups whose group ``bad`` cannot be decoded."""
    texts = [f"w{i % 9 + 2} w3" for i in range(groups * rows)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=rows, compression="zstd")
    column = pq.ParquetFile(path).metadata.row_group(bad).column(0)
    start = column.dictionary_page_offset or column.data_page_offset
    raw = bytearray(path.read_bytes())
    raw[start : start + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    path.write_bytes(bytes(raw))
    return path


def test_a_bad_parquet_row_group_rejects_only_itself(tmp_path):
    path = broken_parquet(tmp_path / "rows.parquet")
    records = list(read_records(input_file(path), options=IngestOptions()))
    good = [r for r in records if r.error is None]
    bad = [r for r in records if r.error is not None]
    assert len(good) == 1500
    assert [r.ref.line for r in good] == [*range(1, 501), *range(1001, 2001)]
    assert len(bad) == 1 and bad[0].ref.line == 501
    assert bad[0].error.code == "unreadable"
    assert "rows 501–1000 of row group 1 (500 rows) are not read" in bad[0].error.reason


@pytest.mark.parametrize("workers", [1, 2])
def test_a_pack_keeps_the_readable_row_groups(tmp_path, word_tokenizer, workers):
    path = broken_parquet(tmp_path / "rows.parquet")
    config = PackConfig.build(
        inputs=(str(path),),
        tokenizer=str(word_tokenizer),
        out=str(tmp_path / "out"),
        max_seq_len=64,
        workers=workers,
        split_bytes=1 if workers > 1 else 0,  # one unit per row group
    )
    manifest = pack_dataset(config).manifest
    assert manifest["stats"]["records_packed"] == 1500
    assert manifest["stats"]["rejected"] == 1
    rejects = (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()
    assert [json.loads(line)["line"] for line in rejects] == [501]


def test_rejects_are_kept_when_nothing_is_packed(tmp_path, word_tokenizer):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"x": 1}\n[1]\n')
    config = PackConfig.build(
        inputs=(str(data),), tokenizer=str(word_tokenizer), out=str(tmp_path / "out"), max_seq_len=8
    )
    with pytest.raises(NothingToPackError) as err:
        pack_dataset(config)
    kept = tmp_path / ".out.rejects.jsonl"
    assert str(err.value).endswith(f"; its rejects are in {kept}")
    assert not (tmp_path / "out").exists()
    assert [json.loads(line)["line"] for line in kept.read_text().splitlines()] == [1, 2]
    data.write_text('{"text": "w2 w3"}\n')
    pack_dataset(config)
    assert not kept.exists()  # out of date once a run publishes
