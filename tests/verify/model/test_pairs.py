"""The model stage on preference rows: each pair's log-probabilities and DPO loss, both ways."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from packshard.verify.model import forward as vm  # noqa: E402
from packshard.verify.model.check import check_model  # noqa: E402
from packshard.verify.run import VerifyOptions  # noqa: E402
from tests.helpers import add_branch_column, preference_rows, write_out  # noqa: E402

pytestmark = pytest.mark.torch

LAYOUTS = [
    [(30, 25, 40), (12,)],
    [(20, 30, 18), (25, 22, 35)],
    [(9,), (40, 20, 30)],
    [(15, 40, 25), (10, 12, 30)],
]
"""Four rows, six pairs with answers of 12 to 40 tokens, two plain segments."""


@pytest.fixture(autouse=True, scope="module")
def one_thread(torch_one_thread):
    """Every test here runs torch on one intra-op thread (see conftest)."""


def pack(folder, branches_of=None, layouts=LAYOUTS):
    rows, branches = preference_rows(layouts, seed=11, vocab=500)
    if branches_of is not None:
        branches = branches_of(branches)
    out = write_out(
        folder, [rows[:2], rows[2:]], max_seq_len=256, segment_columns={"branch": branches}
    )
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["tokenizer"]["vocab_size"] = 500
    tables = {k: pq.read_table(out / s["path"]) for k, s in enumerate(manifest["shards"])}
    return manifest, tables


def run_stage(manifest, tables):
    options = VerifyOptions(model="tiny", model_rows=8, seed=0)
    result, report, _ = check_model(manifest, tables, None, options)
    return result, report


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return run_stage(*pack(tmp_path_factory.mktemp("pairs") / "out"))


def test_pairs_packed_equal_alone_and_the_control_moves_them(good):
    result, report = good
    assert result.status == "passed", [str(f) for f in result.findings.items]
    pairs = result.detail["pairs"]
    assert pairs["pairs"] == 6 and len(report.pairs) == 6
    assert pairs["max_pair_logp_delta"] <= 1e-4
    assert pairs["max_pair_loss_delta"] <= 1e-4
    assert pairs["control_pairs_share"] >= 0.95
    assert pairs["control_min_pair_delta"] >= 1e-2
    assert {p["chosen_example_id"] + 1 for p in pairs["per_pair"]} == {
        p["rejected_example_id"] for p in pairs["per_pair"]
    }
    assert pairs["max_token_logp_delta"] <= 1e-4
    print(
        f"pairs {pairs['pairs']}: max |Δ sum logp| {pairs['max_pair_logp_delta']:.2e}, "
        f"max |Δ token logp| {pairs['max_token_logp_delta']:.2e}, "
        f"max |Δ DPO loss| {pairs['max_pair_loss_delta']:.2e}, control moved "
        f"{pairs['control_pairs_moved']}/{pairs['pairs']} "
        f"(min {pairs['control_min_pair_delta']:.3f})"
    )


def test_a_leaking_mask_fails_the_pair_check(tmp_path, monkeypatch):
    """A block mask that lets every token see the whole row: the pairs move and verify fails."""
    monkeypatch.setattr(vm, "build_block_mask", lambda cu, causal_only=False: LEAKY(cu))
    result, _ = run_stage(*pack(tmp_path / "out"))
    assert result.status == "failed"
    text = [f.message for f in result.findings.items]
    assert any("summed log-probabilities differ packed vs alone" in m for m in text)
    assert any("a token log-probability of the pair differs" in m for m in text)
    assert any("DPO loss differs packed vs alone" in m for m in text)


def LEAKY(cu):
    total = int(cu[-1])
    mask = torch.zeros(total, total)
    mask.masked_fill_(
        ~torch.ones(total, total, dtype=torch.bool).tril(), torch.finfo(torch.float32).min
    )
    return mask[None, None]


def test_a_blind_control_fails_the_pair_check(tmp_path, monkeypatch):
    """A control that does not leak proves nothing: the stage fails, never passes."""
    real = vm.build_block_mask
    monkeypatch.setattr(vm, "build_block_mask", lambda cu, causal_only=False: real(cu))
    result, _ = run_stage(*pack(tmp_path / "out"))
    assert result.status == "failed"
    assert any("cannot see leakage" in f.message for f in result.findings.items)
    assert any("control moved only 0 of 6 pairs" in f.message for f in result.findings.items)


def test_a_chosen_without_its_rejected_is_an_issue(tmp_path):
    def break_first(branches):
        branches[0] = [1, 0, 2][: len(branches[0])]  # chosen, plain, rejected
        return branches

    result, _ = run_stage(*pack(tmp_path / "out", break_first))
    text = [f.message for f in result.findings.items]
    assert "a chosen branch is not followed by its rejected" in text
    assert "a rejected branch does not follow its chosen" in text


def test_plain_packs_have_no_pair_detail(tmp_path):
    rows, _ = preference_rows([[(12,), (9,)], [(20,)]], seed=2, vocab=500)
    out = write_out(tmp_path / "out", [rows], max_seq_len=256)
    manifest = json.loads((out / "manifest.json").read_text())
    tables = {0: pq.read_table(out / manifest["shards"][0]["path"])}
    result, report = run_stage(manifest, tables)
    assert "pairs" not in result.detail and report.pair_summary is None and not report.pairs
    assert np.isfinite(result.detail["max_logit_delta"])


def test_verify_proves_the_pairs_of_a_real_pack_with_its_reference_sidecar(packed_demo_copy):
    """The whole run: the sidecar passes integrity, the model stage reports every pair."""
    from packshard.torch.pairs.reference import write_reference_logps
    from packshard.verify.model.forward import build_tiny_model
    from packshard.verify.run import verify_dataset

    add_branch_column(packed_demo_copy)
    write_reference_logps(packed_demo_copy, build_tiny_model(1024, seed=7))
    report = verify_dataset(packed_demo_copy, VerifyOptions(model_rows=4, source=False))
    assert report.checks["integrity"]["status"] == "passed"
    model = report.checks["model"]
    assert model["status"] == "passed", [str(f) for f in report.findings.items]
    assert model["pairs"]["pairs"] >= 4 and model["pairs"]["control_pairs_share"] >= 0.95
    assert model["pairs"]["max_pair_logp_delta"] <= 1e-4


def test_the_crop_keeps_pairs_whole(tmp_path):
    """A crop of 60 tokens would keep only the chosen branch of three rows' first pairs."""
    manifest, tables = pack(tmp_path / "out")
    options = VerifyOptions(model="tiny", model_rows=8, seed=0, model_max_tokens=60)
    result, report, _ = check_model(manifest, tables, None, options)
    assert result.status == "passed", [str(f) for f in result.findings.items]
    assert result.detail["pairs"]["pairs"] == 3
    assert {p.segment for p in report.pairs} == {0}
