"""Megatron-Bridge export, read back by the rules of its packed Parquet dataset and collator.

Megatron-Bridge needs CUDA libraries to install, so its reading is reimplemented here from
``GPTSFTPackedDataset.__getitem__`` / ``collate_fn``: segment ``[s, e)`` of ``seq_start_id +
[len(input_ids)]`` gives inputs ``input_ids[s:e-1]``, targets ``input_ids[s+1:e]`` and loss
``loss_mask[s:e-1]``; run-time segments are ``e - s - 1`` long.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packshard.export import export_dataset
from packshard.records import IGNORE_INDEX
from tests.helpers import fixture_rows, trained_pairs, write_out


def megatron_pairs(table) -> Counter:
    """The (context → target) pairs Megatron-Bridge trains on a packed Parquet table."""
    pairs: Counter = Counter()
    for row in table.to_pylist():
        ids, mask = row["input_ids"], row["loss_mask"]
        bounds = [*row["seq_start_id"], len(ids)]
        tokens, targets, loss, cu = [], [], [], [0]
        for s, e in itertools.pairwise(bounds):
            tokens += ids[s : e - 1]
            targets += ids[s + 1 : e]
            loss += mask[s : e - 1]
            cu.append(cu[-1] + e - s - 1)
        for a, b in itertools.pairwise(cu):
            for q in range(a, b):
                if loss[q]:
                    pairs[(tuple(tokens[a : q + 1]), targets[q])] += 1
    return pairs


def test_megatron_export_trains_packshards_pairs_exactly(packed_demo, tmp_path):
    result = export_dataset(packed_demo, "megatron-parquet", tmp_path / "mb")
    manifest = json.loads((packed_demo / "manifest.json").read_text())
    names = {"training_256.idx.parquet", "256_metadata.jsonl", "export.json"}
    assert {p.name for p in (tmp_path / "mb").iterdir()} == names
    table = pq.read_table(tmp_path / "mb" / "training_256.idx.parquet")
    types = [f.type.value_type for f in table.schema]
    assert table.column_names == ["input_ids", "seq_start_id", "loss_mask"]
    assert types == [pa.int32(), pa.int32(), pa.int8()]
    assert table.num_rows == manifest["stats"]["rows"]
    want = trained_pairs(packed_demo)
    assert sum(want.values()) == manifest["stats"]["loss_tokens"]
    assert megatron_pairs(table) == want
    # the control: a mask aligned with the tokens (labels != -100), not shifted, trains wrong pairs
    shards = [pq.read_table(packed_demo / s["path"]) for s in manifest["shards"]]
    unshifted = [
        [int(v != IGNORE_INDEX) for v in r] for s in shards for r in s["labels"].to_pylist()
    ]
    control = table.set_column(2, "loss_mask", [unshifted])
    assert megatron_pairs(control) != want
    # run-time rows fit packed_sequence_size; the metadata describes them
    runtime = [len(r["input_ids"]) - len(r["seq_start_id"]) for r in table.to_pylist()]
    segments = [np.diff([*r["seq_start_id"], len(r["input_ids"])]) for r in table.to_pylist()]
    assert max(runtime) <= 256
    metadata = json.loads((tmp_path / "mb" / "256_metadata.jsonl").read_text())
    assert metadata == [
        {
            "dataset_max_seqlen": int(max(s.max() for s in segments)) - 1,
            "max_samples_per_bin": max(len(s) for s in segments),
            "packing_factor": round(manifest["stats"]["examples"] / len(runtime), 2),
            "packing_efficiency": round(100 * sum(runtime) / len(runtime) / 256, 2),
            "pack_size": 256,
            "min_packed_seqlen": min(runtime),
        }
    ]
    assert result.info["written"]["dropped_one_token_segments"] == 0


def test_one_token_segments_are_dropped_and_nothing_else(tmp_path):
    rows = fixture_rows(20, seed=3)  # segments of 1 to 11 tokens
    out = write_out(tmp_path / "out", [rows[:9], rows[9:]])
    ones = sum(int((np.diff(r.cu_seqlens) == 1).sum()) for r in rows)
    assert ones > 0
    result = export_dataset(out, "megatron-parquet", tmp_path / "mb")
    table = pq.read_table(tmp_path / "mb" / "training_64.idx.parquet")
    assert result.info["written"]["dropped_one_token_segments"] == ones
    for r in table.to_pylist():
        lengths = np.diff([*r["seq_start_id"], len(r["input_ids"])])
        assert lengths.min() >= 2  # no empty sequence at run time
    assert megatron_pairs(table) == trained_pairs(out)
