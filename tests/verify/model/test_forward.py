"""The model stage of verify: row picking, cropping, the tiny model, and the check's result."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from packshard.errors import UsageError
from packshard.format.examples import ExamplesIndex, read_examples
from packshard.format.shards import SHARD_SCHEMA, read_shard
from packshard.records import PackedRow
from packshard.verify.model.check import check_model
from packshard.verify.model.forward import TINY_VOCAB, crop_row, pick_rows
from packshard.verify.run import VerifyOptions

VOCAB = 64


def shard(segments_per_row: list[int]) -> pa.Table:
    """A shard whose row r has ``segments_per_row[r]`` one-token segments (content unused)."""
    rows = []
    for n in segments_per_row:
        rows.append(
            {
                "input_ids": [1] * n,
                "labels": [-100] * n,
                "position_ids": [0] * n,
                "cu_seqlens": list(range(n + 1)),
                "example_ids": list(range(n)),
                "num_tokens": n,
                "num_loss_tokens": 0,
                "max_seqlen": 1,
            }
        )
    return pa.Table.from_pylist(rows, schema=SHARD_SCHEMA)


def test_pick_rows_prefers_rows_with_a_seam_and_is_seeded():
    tables = {0: shard([1, 3, 1, 2]), 1: shard([2, 1])}
    multi = {(0, 1), (0, 3), (1, 0)}
    picked = pick_rows(tables, 2, seed=0)
    assert len(picked) == 2 and set(picked) <= multi and picked == sorted(picked)
    assert pick_rows(tables, 2, seed=0) == picked
    assert set(pick_rows(tables, 3, seed=5)) == multi
    everything = pick_rows(tables, 10, seed=1)  # then single-segment rows fill up the count
    assert everything == sorted(everything) and set(everything) == {
        (s, r) for s, t in tables.items() for r in range(t.num_rows)
    }
    assert pick_rows({}, 4, seed=0) == []


def row(lengths: list[int]) -> PackedRow:
    total = sum(lengths)
    return PackedRow(
        input_ids=np.arange(total, dtype=np.int32),
        labels=np.arange(total, dtype=np.int32),
        position_ids=np.concatenate([np.arange(n) for n in lengths]).astype(np.int32),
        cu_seqlens=np.cumsum([0, *lengths]).astype(np.int32),
        example_ids=np.arange(len(lengths), dtype=np.int64) + 10,
    )


def test_crop_row_keeps_whole_leading_segments():
    r = row([3, 4, 5])
    assert crop_row(r, 12) is r and crop_row(r, 100) is r
    cut = crop_row(r, 9)  # 3 + 4 fit, the third segment does not
    assert cut.cu_seqlens.tolist() == [0, 3, 7] and cut.example_ids.tolist() == [10, 11]
    assert cut.input_ids.tolist() == list(range(7)) and cut.position_ids.tolist()[-1] == 3
    one = crop_row(r, 2)  # at least one segment, even when it is longer than the limit
    assert one.cu_seqlens.tolist() == [0, 3] and one.num_tokens == 3


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from packshard.verify.model.forward import (  # noqa: E402
    build_tiny_model,
    forward_logits,
    load_model,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread(torch_one_thread):
    """Every test here runs torch on one intra-op thread (see conftest)."""


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(VOCAB, seed=0)


@pytest.mark.torch
def test_tiny_model_depends_only_on_its_seed(model):
    state = torch.random.get_rng_state()
    again = build_tiny_model(VOCAB, seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global generator untouched
    other = build_tiny_model(VOCAB, seed=1)
    ids = np.arange(10) % VOCAB
    with torch.inference_mode():
        a, b, c = (forward_logits(m, ids, None, None) for m in (model, again, other))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert model.config.vocab_size == VOCAB and not model.training


@pytest.mark.torch
def test_load_model_tiny_and_folder(tmp_path, model):
    tiny = load_model("tiny", 50_000)
    assert tiny.config.vocab_size == TINY_VOCAB and not tiny.training
    assert load_model("tiny", 100).config.vocab_size == 100
    with pytest.raises(UsageError, match=r"no config\.json"):
        load_model(str(tmp_path), 100)
    model.save_pretrained(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"), VOCAB)
    ids = np.arange(10) % VOCAB
    with torch.inference_mode():
        a = forward_logits(model, ids, None, None)
        b = forward_logits(loaded, ids, None, None)
    assert torch.equal(a, b)


def opened(out):
    manifest = json.loads((out / "manifest.json").read_text())
    tables = {
        k: read_shard(out / s["path"], manifest["dataset_id"])
        for k, s in enumerate(manifest["shards"])
    }
    index = ExamplesIndex.from_table(
        read_examples(out / "examples.parquet", manifest["dataset_id"])
    )
    return manifest, tables, index


@pytest.mark.torch
def test_check_model_on_a_good_pack(packed_demo):
    manifest, tables, index = opened(packed_demo)
    options = VerifyOptions(model_rows=2)
    result, report, picks = check_model(manifest, tables, index, options)
    assert picks == pick_rows(tables, 2, 0) and len(picks) == 2
    assert result.name == "model" and result.status == "passed" and result.skipped is None
    assert len(report.rows) == 2 and report.ok and report.control_detected
    stored = [tables[s]["num_tokens"][r].as_py() for s, r in picks]
    assert [r.num_tokens for r in report.rows] == stored  # 256-token rows: nothing cropped
    assert [r.name for r in report.rows] == [
        f"{manifest['shards'][s]['path']} row {r}" for s, r in picks
    ]
    summary = result.summary()
    assert summary["status"] == "passed" and summary["findings"] == 0
    assert summary["rows"] == 2 and summary["atol"] == report.atol
    assert summary["control_detected"] is True and summary["notes"] == list(report.notes)


@pytest.mark.torch
def test_check_model_with_no_rows_did_not_run(packed_demo):
    manifest, _, index = opened(packed_demo)
    result, report, picks = check_model(manifest, {}, index, VerifyOptions())
    assert (result.status, result.not_run, report, picks) == (
        "not run",
        "no sound rows to check",
        None,
        [],
    )
    assert result.summary() == {"status": "not run", "detail": "no sound rows to check"}
