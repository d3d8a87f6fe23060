"""Exports read only sound folders and publish atomically."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packshard.digests import sha256_path
from packshard.errors import FormatError, UsageError
from packshard.export import export_dataset
from packshard.export.common import read_rows


def test_rows_read_back_as_the_shards_hold_them(packed_demo):
    manifest = json.loads((packed_demo / "manifest.json").read_text())
    shards = list(read_rows(packed_demo))
    assert [s.num_rows for s in shards] == [e["rows"] for e in manifest["shards"]]
    first = pq.read_table(packed_demo / manifest["shards"][0]["path"]).to_pylist()
    rows = shards[0]
    assert rows.ids[rows.tok_off[1] : rows.tok_off[2]].tolist() == first[1]["input_ids"]
    segs = rows.seg_len[rows.seg_off[1] : rows.seg_off[2]].tolist()
    assert segs == first[1]["seq_lengths"]
    assert rows.seg_starts()[rows.seg_off[1]] == rows.tok_off[1]


def test_a_damaged_folder_is_refused_and_nothing_is_written(packed_demo_copy, tmp_path):
    out = packed_demo_copy
    manifest = json.loads((out / "manifest.json").read_text())
    shard = out / manifest["shards"][1]["path"]
    table = pq.read_table(shard)
    labels = table["labels"].to_pylist()
    labels[0][0] = table["input_ids"].to_pylist()[0][0]  # a target across the row's first seam
    pq.write_table(table.set_column(1, "labels", pa.array(labels, pa.list_(pa.int32()))), shard)
    with pytest.raises(FormatError) as err:
        export_dataset(out, "megatron", tmp_path / "mb")
    assert str(err.value) == (
        f"{shard}: SHA-256 differs from the manifest: the shard was replaced or modified after "
        f"it was packed (run packshard verify {out}, and pack again)"
    )
    manifest["shards"][1]["sha256"] = sha256_path(shard)
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FormatError) as err:
        export_dataset(out, "unpacked", tmp_path / "rows")
    assert err.value.problem == "a segment's first label is not -100 (run packshard verify)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no export, no partial folder


def test_an_existing_folder_is_replaced_only_when_asked_and_complete(packed_demo, tmp_path):
    dest = tmp_path / "mds"
    dest.mkdir()
    (dest / "old.txt").write_text("keep me")
    for overwrite in (False, True):  # a folder packshard did not write is never replaced
        with pytest.raises(UsageError) as err:
            export_dataset(packed_demo, "mds", dest, overwrite=overwrite)
        assert str(err.value) == (
            f"{dest}: output folder holds 'old.txt' but no packshard manifest; --overwrite only "
            "replaces a folder packshard wrote (choose another -o, or empty it)"
        )
    (dest / "old.txt").unlink()
    assert export_dataset(packed_demo, "unpacked", dest).info["target"] == "unpacked"
    broken = tmp_path / "broken"
    shutil.copytree(packed_demo, broken)
    (broken / "shard-00002.parquet").unlink()
    with pytest.raises(FormatError, match="listed in the manifest but missing"):
        export_dataset(broken, "mds", dest, overwrite=True)
    assert sorted(p.name for p in dest.iterdir()) == [  # the failed export changed nothing
        "export.json",
        "train-00000-of-00004.parquet",
        "train-00001-of-00004.parquet",
        "train-00002-of-00004.parquet",
        "train-00003-of-00004.parquet",
    ]
    result = export_dataset(packed_demo, "mds", dest, overwrite=True)
    assert sorted(p.name for p in dest.iterdir()) == [
        "export.json",
        "index.json",
        "shard.00000.mds",
    ]
    info = json.loads((dest / "export.json").read_text())
    assert info == result.info
    assert (
        info["source"]["dataset_id"]
        == json.loads((packed_demo / "manifest.json").read_text())["dataset_id"]
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_rows_by_row_group_are_the_shards_rows_in_pieces(packed_demo_copy):
    from packshard.export.common import COLUMNS

    out = packed_demo_copy
    whole = list(read_rows(out, ("train",), COLUMNS))
    pieces = list(read_rows(out, ("train",), COLUMNS, by_group=True))
    groups = sum(pq.ParquetFile(out / p).num_row_groups for p in sorted(out.glob("shard-*")))
    assert len(pieces) == groups
    for name in ("ids", "labels", "seg_len", "example_ids"):
        joined = np.concatenate([getattr(r, name) for r in pieces])
        assert np.array_equal(joined, np.concatenate([getattr(r, name) for r in whole])), name
    # the same checks, named with the row group: a target across a seam is refused
    manifest = json.loads((out / "manifest.json").read_text())
    shard = out / manifest["shards"][0]["path"]
    table = pq.read_table(shard)
    labels = table["labels"].to_pylist()
    labels[0][0] = table["input_ids"].to_pylist()[0][0]
    changed = table.set_column(1, "labels", pa.array(labels, pa.list_(pa.int32())))
    pq.write_table(changed, shard, row_group_size=2)
    manifest["shards"][0]["sha256"] = sha256_path(shard)
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FormatError, match="first label is not -100"):
        list(read_rows(out, ("train",), COLUMNS, by_group=True))
