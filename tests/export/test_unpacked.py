"""The per-example export: Axolotl's pre-tokenized columns, the same pairs, one row each."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.parquet as pq
import pytest

from packshard.export import export_dataset
from packshard.records import IGNORE_INDEX
from tests.helpers import trained_pairs


def test_every_example_is_one_row_with_its_own_tokens_and_labels(
    packed_demo, tmp_path, monkeypatch
):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    result = export_dataset(packed_demo, "unpacked", tmp_path / "rows")
    manifest = json.loads((packed_demo / "manifest.json").read_text())
    rows = datasets.load_dataset(
        str(tmp_path / "rows"), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert rows.column_names == ["input_ids", "attention_mask", "labels"]  # what Axolotl detects
    assert rows.num_rows == manifest["stats"]["examples"] == result.info["written"]["examples"]
    index = pq.read_table(packed_demo / "examples.parquet").to_pylist()
    order = [
        e
        for s in manifest["shards"]
        for r in pq.read_table(packed_demo / s["path"]).to_pylist()
        for e in r["example_ids"]
    ]
    for k, example_id in enumerate(order):
        assert len(rows[k]["input_ids"]) == index[example_id]["num_tokens"]
        assert rows[k]["attention_mask"] == [1] * len(rows[k]["input_ids"])
    # a per-example trainer shifts each row on its own: the pairs stay packshard's
    pairs: Counter = Counter()
    for row in rows:
        for t in range(1, len(row["input_ids"])):
            if row["labels"][t] != IGNORE_INDEX:
                pairs[(tuple(row["input_ids"][:t]), row["input_ids"][t])] += 1
    assert pairs == trained_pairs(packed_demo)
    assert all(r["labels"][0] == IGNORE_INDEX for r in rows)  # no row starts with a target
