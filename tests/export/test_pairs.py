"""Exporting a pack with preference pairs and KTO records: carried whole, or refused in one line.

``unpacked`` keeps every example's ``example_id``/``pair_id``/``branch``/``kto_label`` (as in
``examples.parquet``), a pair's rows adjacent, chosen first; ``mds`` keeps rows whole and adds
the shards' per-segment ``branch`` and ``kto_label``; the SFT layouts (megatron,
megatron-npy, megatron-parquet, torchtune) refuse with exit 2 rather than train every branch as SFT.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.errors import UsageError
from packshard.export import export_dataset
from tests.export.test_mds import read_mds, shard_rows
from tests.helpers import pack_rows
from tests.pack.test_pairs import records


@pytest.fixture(scope="module")
def pair_pack(tmp_path_factory, demo_tokenizer) -> Path:
    return pack_rows(
        tmp_path_factory.mktemp("export_pairs"), records(), demo_tokenizer, shard_rows=3
    )


def test_unpacked_keeps_every_examples_pair_columns(pair_pack, tmp_path):
    result = export_dataset(pair_pack, "unpacked", tmp_path / "rows")
    files = sorted((tmp_path / "rows").glob("train-*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    assert pq.read_schema(files[0]).names == [
        "input_ids",
        "attention_mask",
        "labels",
        "example_id",
        "pair_id",
        "branch",
        "kto_label",
    ]
    assert result.info["written"]["pair_columns"] == [
        "example_id",
        "pair_id",
        "branch",
        "kto_label",
    ]
    index = {e["example_id"]: e for e in pq.read_table(pair_pack / "examples.parquet").to_pylist()}
    order = [e for r in shard_rows(pair_pack) for e in r["example_ids"]]
    assert [r["example_id"] for r in rows] == order and len(rows) == len(index)
    for row in rows:
        e = index[row["example_id"]]
        assert (row["pair_id"], row["branch"], row["kto_label"]) == (
            e["pair_id"],
            e["branch"],
            e["kto_label"],
        )
        assert len(row["input_ids"]) == e["num_tokens"]
    for k, row in enumerate(rows):  # a chosen row is followed by the rejected row of its pair
        if row["branch"] == "chosen":
            after = rows[k + 1]
            assert after["branch"] == "rejected" and after["pair_id"] == row["pair_id"]
    assert sum(r["branch"] == "chosen" for r in rows) == 12
    assert [r["kto_label"] for r in rows if r["kto_label"] is not None] == [True, False]


def test_mds_keeps_rows_whole_with_branch_and_kto_label(pair_pack, tmp_path):
    export_dataset(pair_pack, "mds", tmp_path / "mds")
    index, samples = read_mds(tmp_path / "mds")
    assert index["shards"][0]["column_names"][:2] == ["branch", "cu_seqlens"]
    assert "kto_label" in index["shards"][0]["column_names"]
    rows = shard_rows(pair_pack)
    assert len(samples) == len(rows)
    for sample, row in zip(samples, rows, strict=True):
        assert {k: np.asarray(v).tolist() for k, v in sample.items()} == row
        assert sample["branch"].dtype == np.int8


def test_mds_of_a_pack_without_pairs_has_no_pair_columns(packed_demo, tmp_path):
    export_dataset(packed_demo, "mds", tmp_path / "mds")
    index, _ = read_mds(tmp_path / "mds")
    assert "branch" not in index["shards"][0]["column_names"]


@pytest.mark.parametrize("target", ["megatron", "megatron-npy", "megatron-parquet", "torchtune"])
def test_sft_layouts_refuse_a_pair_pack_in_one_line(pair_pack, tmp_path, target):
    result = CliRunner().invoke(
        main,
        ["export", str(pair_pack), "--to", target, "-o", str(tmp_path / "x")],
        prog_name="packshard",
        catch_exceptions=False,
    )
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {pair_pack}: this pack holds 12 preference pairs; --to {target} feeds an SFT "
        "recipe that would train every branch as a plain answer and has no column for branch "
        "or kto_label (export --to unpacked or mds, which carry them, or train with "
        "packshard.torch.pairs: see docs/preference-training.md)\n"
    )
    assert not (tmp_path / "x").exists()


def test_a_kto_pack_is_refused_too_and_carried_by_unpacked(tmp_path, demo_tokenizer):
    out = pack_rows(
        tmp_path, records()[-3:], demo_tokenizer, shard_rows=3
    )  # two KTO records, one chat
    with pytest.raises(UsageError, match="this pack holds KTO records; --to torchtune"):
        export_dataset(out, "torchtune", tmp_path / "tt")
    export_dataset(out, "unpacked", tmp_path / "rows")
    (path,) = (tmp_path / "rows").glob("train-*.parquet")
    labels = pq.read_table(path).column("kto_label").to_pylist()
    assert sorted(labels, key=str) == [False, None, True]


def test_unpacked_pair_export_loads_with_datasets(pair_pack, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    export_dataset(pair_pack, "unpacked", tmp_path / "rows")
    rows = datasets.load_dataset(
        str(tmp_path / "rows"), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert rows.column_names[3:] == ["example_id", "pair_id", "branch", "kto_label"]
    chosen = [k for k, b in enumerate(rows["branch"]) if b == "chosen"]
    assert len(chosen) == 12 and all(rows[k + 1]["branch"] == "rejected" for k in chosen)
