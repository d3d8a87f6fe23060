"""The manifest's row-fill spread and trained tokens per optimizer step, checked on the shards."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq

from packshard.pack.plan.shape import quantiles, step_loss_tokens


def test_quantiles_are_nearest_rank_observed_values():
    assert quantiles(np.array([5, 1, 4, 2, 3])) == {
        "min": 1.0, "p10": 1.0, "median": 3.0, "p90": 5.0, "max": 5.0,
    }  # fmt: skip
    assert quantiles(np.array([])) == dict.fromkeys(("min", "p10", "median", "p90", "max"), 0.0)
    steps = step_loss_tokens(np.array([40, 12, 35, 38, 9, 41, 30, 33, 36]), 4)
    assert steps == {"steps": 2, "min": 113, "p10": 113, "median": 113, "p90": 125, "max": 125}


def test_manifest_records_the_row_fill_spread_and_the_steps(marked_pack):
    manifest = json.loads((marked_pack / "manifest.json").read_text())
    tables = [pq.read_table(marked_pack / s["path"]) for s in manifest["shards"]]
    tokens = np.concatenate([t.column("num_tokens").to_numpy() for t in tables])
    loss = np.concatenate([t.column("num_loss_tokens").to_numpy() for t in tables])
    stats = manifest["stats"]
    fill = np.sort(tokens / 48)
    assert stats["row_fill"]["min"] == round(fill[0], 6) < stats["fill_rate"]
    assert stats["row_fill"]["max"] == round(fill[-1], 6) == 1.0
    assert stats["row_fill"]["median"] == round(fill[(len(fill) + 1) // 2 - 1], 6)
    per_row = stats["step_loss_tokens"]["1"]
    assert (per_row["steps"], per_row["min"], per_row["max"]) == (16, loss.min(), loss.max())
    eight = loss.reshape(2, 8).sum(axis=1)  # 16 rows: two full steps of 8, in shard order
    assert stats["step_loss_tokens"]["8"] == {
        "steps": 2, "min": eight.min(), "p10": eight.min(), "median": eight.min(),
        "p90": eight.max(), "max": eight.max(),
    }  # fmt: skip
    assert stats["step_loss_tokens"]["64"]["steps"] == 0  # fewer rows than one step
