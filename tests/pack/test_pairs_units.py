"""A pair pack cut into units: two workers and ``--resume`` write the bytes of one process,
and ``verify --model tiny`` proves the pairs of a real pack (not hand-made rows).

The input is the mixed records of :mod:`tests.pack.test_pairs` (every preference layout,
KTO, plain chat, bad lines) three times over, cut into byte ranges so that pairs, rejects and
KTO records fall in different units.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from packshard.engine import TaskFailed
from packshard.pack import PackConfig, pack_dataset
from packshard.pack.units.scale import work_folder
from packshard.verify.run import VerifyOptions, verify_dataset
from tests.helpers import output_digests, write_jsonl
from tests.pack.test_pairs import records

SPLIT = 3000  # bytes per unit: six byte ranges of the pairs file


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("pair_units") / "pairs.jsonl", records() * 3)


def pack(inputs: Path, tokenizer: Path, out: Path, **options: Any) -> dict[str, Any]:
    settings = {"max_seq_len": 256, "template": "chatml", "shard_rows": 3, **options}
    config = PackConfig.build(
        inputs=(str(inputs),), tokenizer=str(tokenizer), out=str(out), **settings
    )  # type: ignore[arg-type]
    pack_dataset(config)
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def whole(inputs, demo_tokenizer, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pair_whole") / "out"
    pack(inputs, demo_tokenizer, out)
    return out


def units(inputs: Path) -> list:
    from packshard.ingest.read.sources import expand_inputs
    from packshard.ingest.read.units import plan_units

    return plan_units(expand_inputs([str(inputs)]), SPLIT)


def test_two_workers_write_the_bytes_of_one_process(inputs, demo_tokenizer, whole, tmp_path):
    one = json.loads((whole / "manifest.json").read_text())
    two = pack(inputs, demo_tokenizer, tmp_path / "two", workers=2, split_bytes=SPLIT)
    assert one["engine"]["workers"] == 1 and two["engine"]["workers"] == 2
    assert two["engine"]["units"] == len(units(inputs)) >= 4
    assert output_digests(tmp_path / "two") == output_digests(whole)
    assert (
        two["stats"]["pairs"]
        == one["stats"]["pairs"]
        == {
            "seen": 42,
            "packed": 36,
            "rejected": 6,
            "truncated": 0,
        }
    )
    assert two["stats"]["kto"] == {"desirable": 3, "undesirable": 3}


def test_resume_after_a_failed_unit_writes_the_same_bytes(
    inputs, demo_tokenizer, whole, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    second = units(inputs)[1].ranges[0]
    assert second.kind == "bytes"
    monkeypatch.setenv("PACKSHARD_FAULTS", f"raise:bytes {second.start}–:9")
    with pytest.raises(TaskFailed):
        pack(inputs, demo_tokenizer, out, workers=2, split_bytes=SPLIT)
    assert not out.exists()
    assert len(list(work_folder(out).glob("*/unit.json"))) == len(units(inputs)) - 1
    monkeypatch.delenv("PACKSHARD_FAULTS")
    resumed = pack(inputs, demo_tokenizer, out, workers=2, split_bytes=SPLIT, resume=True)
    assert resumed["engine"]["units_reused"] == len(units(inputs)) - 1
    assert output_digests(out) == output_digests(whole)


@pytest.mark.torch
def test_verify_model_tiny_proves_the_pairs_of_a_real_pack(whole, torch_one_thread):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    report = verify_dataset(whole, VerifyOptions(model="tiny", model_rows=8, seed=0))
    assert report.ok, [str(f) for f in report.findings.items]
    model = report.checks["model"]
    assert model["status"] == "passed"
    pairs = model["pairs"]
    assert pairs["pairs"] > 0
    assert pairs["max_pair_logp_delta"] <= 1e-4 and pairs["max_pair_loss_delta"] <= 1e-4
    assert pairs["control_pairs_share"] >= 0.95 and pairs["control_min_pair_delta"] >= 1e-2
    print(
        f"pairs {pairs['pairs']}: max |Δ sum logp| {pairs['max_pair_logp_delta']:.2e}, "
        f"max |Δ DPO loss| {pairs['max_pair_loss_delta']:.2e}, control share "
        f"{pairs['control_pairs_share']:.2f} (min {pairs['control_min_pair_delta']:.3f})"
    )
