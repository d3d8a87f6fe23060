"""MDS export, read back by MDS's published layout (mosaicml-streaming pulls a CUDA torchvision).

The reader below follows ``streaming``'s format: ``index.json``; per shard ``uint32 samples``,
``uint32 offsets[samples + 1]``, the config JSON, the samples; per sample the ``uint32`` sizes
of the variable-size columns, then the columns in name order.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from packshard.export import export_dataset
from packshard.export.mds import mds_config, write_mds

SHAPE_TYPES = {0: np.uint8, 1: np.uint16, 2: np.uint32, 3: np.uint64}


def decode(encoding: str, data: bytes):
    if encoding.startswith("ndarray:"):
        dtype = np.dtype(encoding.split(":")[1])
        ndim, shape_type = data[0] >> 2, SHAPE_TYPES[data[0] & 3]
        width = np.dtype(shape_type).itemsize
        shape = np.frombuffer(data[1 : 1 + ndim * width], shape_type)
        return np.frombuffer(data[1 + ndim * width :], dtype).reshape(shape)
    return np.frombuffer(data, np.dtype(encoding))[0]


def read_mds(folder):
    index = json.loads((folder / "index.json").read_text())
    assert index["version"] == 2
    samples = []
    for shard in index["shards"]:
        data = (folder / shard["raw_data"]["basename"]).read_bytes()
        assert len(data) == shard["raw_data"]["bytes"] and shard["zip_data"] is None
        n = int(np.frombuffer(data[:4], np.uint32)[0])
        offsets = np.frombuffer(data[4 : 8 + 4 * n], np.uint32)
        config = json.loads(data[8 + 4 * n : offsets[0]])
        assert config == {k: shard[k] for k in config}  # the index repeats the embedded config
        assert shard["samples"] == n
        names, encodings, sizes = (
            shard["column_names"],
            shard["column_encodings"],
            shard["column_sizes"],
        )
        for lo, hi in itertools.pairwise(offsets):
            blob = data[lo:hi]
            variable = iter(np.frombuffer(blob, np.uint32, count=sizes.count(None)).tolist())
            at, sample = 4 * sizes.count(None), {}
            for name, encoding, size in zip(names, encodings, sizes, strict=True):
                size = next(variable) if size is None else size
                sample[name] = decode(encoding, blob[at : at + size])
                at += size
            assert at == len(blob)
            samples.append(sample)
    return index, samples


def shard_rows(out):
    manifest = json.loads((out / "manifest.json").read_text())
    return [r for s in manifest["shards"] for r in pq.read_table(out / s["path"]).to_pylist()]


@pytest.mark.parametrize("size_limit", [1 << 26, 3000])
def test_mds_samples_are_the_shard_rows(packed_demo, tmp_path, size_limit):
    folder = tmp_path / "mds"
    folder.mkdir()
    written = write_mds(packed_demo, folder, size_limit=size_limit)
    index, samples = read_mds(folder)
    rows = shard_rows(packed_demo)
    assert len(samples) == len(rows) == written["rows"]
    for sample, row in zip(samples, rows, strict=True):
        assert {k: np.asarray(v).tolist() for k, v in sample.items()} == row
        assert sample["input_ids"].dtype == np.int32 and sample["example_ids"].dtype == np.int64
    if size_limit == 3000:
        assert len(index["shards"]) > 1  # closed before a sample would pass the limit
        for shard in index["shards"]:
            assert shard["raw_data"]["bytes"] <= size_limit or shard["samples"] == 1
    assert index["shards"][0]["column_names"] == sorted(row)


def test_mds_config_is_streamings(tmp_path):
    config = mds_config(1 << 26)
    assert config["column_sizes"] == [None, None, None, None, 4, 4, 4, None, None]
    assert (config["format"], config["version"], config["compression"]) == ("mds", 2, None)


def test_mds_export_through_export_dataset(packed_demo, tmp_path):
    result = export_dataset(packed_demo, "mds", tmp_path / "mds")
    assert sorted(result.info["files"]) == ["index.json", "shard.00000.mds"]
    assert result.info["written"] == {"index": "index.json", "shards": 1, "rows": 15}
