"""Packed-vs-unpacked equivalence on hand-built rows with a tiny random Llama."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from packshard.errors import UsageError
from packshard.records import IGNORE_INDEX, PackedRow

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from packshard.verify.findings import Issue  # noqa: E402
from packshard.verify.model import equivalence as eq  # noqa: E402
from packshard.verify.model import forward as vm  # noqa: E402
from packshard.verify.model.forward import build_tiny_model  # noqa: E402

pytestmark = pytest.mark.torch

VOCAB = 64


def messages(rep) -> list[str]:
    """The report's issues in their string form, ``NAME segment J: msg`` or ``NAME: msg``."""
    return [str(issue) for issue in rep.issues]


def make_row(lengths, seed=0, reset=True, cu=None, vocab=VOCAB):
    """A row of random tokens; labels are the tokens with -100 at each segment start."""
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    true_cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = rng.integers(0, vocab, total).astype(np.int32)
    labels = ids.copy()
    labels[true_cu[:-1]] = IGNORE_INDEX
    if reset:
        positions = np.concatenate([np.arange(n) for n in lengths])
    else:
        positions = np.arange(total)
    stored_cu = true_cu if cu is None else np.asarray(cu, dtype=np.int32)
    return PackedRow(
        input_ids=ids,
        labels=labels,
        position_ids=positions.astype(np.int32),
        cu_seqlens=stored_cu,
        example_ids=np.arange(stored_cu.size - 1, dtype=np.int64) + 100,
    )


@pytest.fixture(autouse=True, scope="module")
def one_thread(torch_one_thread):
    """Every test here runs torch on one intra-op thread (see conftest)."""


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(VOCAB, seed=0)


@pytest.fixture(scope="module")
def good_report(model):
    rows = [make_row([5, 7, 4], seed=1), make_row([16], seed=2), make_row([3, 3, 3, 3], seed=3)]
    return eq.check_rows(model, rows)


def test_import_does_not_load_torch():
    code = (
        "import sys, packshard, packshard.verify.model.equivalence, "
        "packshard.verify.model.forward; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_block_mask_is_block_causal():
    mask = vm.build_block_mask(np.array([0, 2, 3, 5]))
    allowed = (mask[0, 0] == 0).to(torch.int64).tolist()
    assert allowed == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    naive = vm.build_block_mask(np.array([0, 2, 3, 5]), causal_only=True)
    assert torch.equal(naive[0, 0] == 0, torch.ones(5, 5, dtype=torch.bool).tril())
    assert mask.shape == (1, 1, 5, 5) and mask.dtype == torch.float32
    assert float(mask.min()) == torch.finfo(torch.float32).min


def test_mutate_tokens_changes_only_the_other_parity():
    ids = np.arange(10) % 7
    cu = np.array([0, 3, 5, 10])
    out = vm.mutate_tokens(ids, cu, keep=0, vocab=7, rng=np.random.default_rng(0))
    assert np.array_equal(out[0:3], ids[0:3]) and np.array_equal(out[5:10], ids[5:10])
    assert np.all(out[3:5] != ids[3:5]) and np.all((out >= 0) & (out < 7))
    out = vm.mutate_tokens(ids, cu, keep=1, vocab=7, rng=np.random.default_rng(0))
    assert np.array_equal(out[3:5], ids[3:5])
    assert np.all(out[0:3] != ids[0:3]) and np.all(out[5:10] != ids[5:10])


def test_score_loss_is_shifted_and_ignores_minus_100():
    logits = torch.zeros(4, 8)  # uniform: every target costs ln 8
    total, count = vm.score_loss(logits, np.array([IGNORE_INDEX, 3, IGNORE_INDEX, 5]))
    assert count == 2 and total == pytest.approx(2 * math.log(8), rel=1e-6)
    assert vm.score_loss(logits, np.array([1, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX])) == (
        0.0,
        0,
    )


def test_equivalence_holds_and_control_leaks(good_report):
    rep = good_report
    assert rep.ok and rep.issues == ()
    assert rep.max_logit_delta < 1e-5 and rep.max_loss_delta < 1e-5
    assert rep.max_mutation_delta is not None and rep.max_mutation_delta < 1e-6
    assert rep.control_detected
    assert rep.control_min_delta > 100 * rep.atol
    assert rep.control_threshold == pytest.approx(1e-2)
    assert [r.control for r in rep.rows] == ["detected", "not applicable", "detected"]
    first = rep.rows[0]
    assert [s.example_id for s in first.segments] == [100, 101, 102]
    assert [s.num_tokens for s in first.segments] == [5, 7, 4]
    assert first.segments[0].control_delta is None  # nothing precedes the first segment
    assert all(s.control_delta > 1e-2 for s in first.segments[1:])
    assert first.loss_tokens == 4 + 6 + 3


def test_single_segment_row_cannot_show_leakage(model):
    rep = eq.check_rows(model, [make_row([9], seed=4), make_row([12], seed=5)])
    assert rep.ok and not rep.control_detected
    assert rep.control_min_delta is None and rep.max_mutation_delta is None
    assert [r.control for r in rep.rows] == ["not applicable", "not applicable"]
    assert rep.rows[0].loss_naive == rep.rows[0].loss_true
    assert any("no checked row has two or more segments" in n for n in rep.notes)


def test_loss_totals_are_token_weighted(good_report):
    rep = good_report
    rows = [r for r in rep.rows if r.loss_tokens]
    want = sum(r.loss_true * r.loss_tokens for r in rows) / sum(r.loss_tokens for r in rows)
    assert rep.loss_true == pytest.approx(want)
    assert rep.loss_naive != rep.loss_true  # the naive concat reports another loss


def test_positions_not_reset_are_named(model):
    rep = eq.check_rows(model, [make_row([5, 7, 4], seed=1, reset=False)])
    assert not rep.ok
    assert messages(rep) == [
        "row 0 segment 1: position_ids start at 5 and are not 0..6 as the example has alone"
        " (rotary models cannot see a constant shift)",
        "row 0 segment 2: position_ids start at 12 and are not 0..3 as the example has alone"
        " (rotary models cannot see a constant shift)",
    ]
    assert [(i.row, i.name, i.segment) for i in rep.issues] == [(0, "row 0", 1), (0, "row 0", 2)]
    # rotary attention is shift invariant: the logits alone could not have shown it
    assert rep.max_logit_delta < 1e-4


def test_cu_seqlens_off_by_one_is_named(model):
    # token 5 is the first of segment 1 (position 0) but cu_seqlens gives it to segment 0
    rep = eq.check_rows(model, [make_row([5, 7, 4], seed=1, cu=[0, 6, 12, 16])], names=["s0 r3"])
    assert not rep.ok
    text = "\n".join(messages(rep))
    assert "s0 r3 segment 0: packed logits differ from alone by" in text
    assert "s0 r3 segment 0: position_ids start at 0 and are not 0..5" in text
    assert rep.rows[0].segments[0].logit_delta > 1e-3


def test_injected_mask_bug_is_caught(model, monkeypatch):
    build = vm.build_block_mask
    monkeypatch.setattr(vm, "build_block_mask", lambda cu, causal_only=False: build(cu, True))
    rep = eq.check_rows(model, [make_row([5, 7, 4], seed=1)])
    assert not rep.ok
    for seg in (1, 2):
        assert any(
            f.startswith(f"row 0 segment {seg}: packed logits differ") for f in messages(rep)
        )
        assert any(
            f.startswith(f"row 0 segment {seg}: logits move by")
            and "attention crosses the seam" in f
            for f in messages(rep)
        )
    assert not any(f.startswith("row 0 segment 0") for f in messages(rep))
    assert {i.segment for i in rep.issues} == {1, 2}
    assert rep.max_mutation_delta > 1e-3


def test_control_that_cannot_leak_is_a_finding(model, monkeypatch):
    build = vm.build_block_mask
    monkeypatch.setattr(vm, "build_block_mask", lambda cu, causal_only=False: build(cu))
    rep = eq.check_rows(model, [make_row([5, 7, 4], seed=1)])
    assert not rep.ok and not rep.control_detected
    assert rep.rows[0].control == "not detected"
    assert messages(rep)[0].startswith("row 0: the naive causal control differs from alone by only")
    assert (rep.issues[0].row, rep.issues[0].segment) == (0, None)  # the whole row


def test_malformed_row_is_reported_not_crashed(model):
    bad = make_row([5, 7, 4], seed=1, cu=[0, 5, 12])
    rep = eq.check_rows(model, [bad, make_row([4, 4], seed=2)])
    assert rep.issues == (
        Issue(
            0,
            "row 0",
            None,
            "cu_seqlens [0, 5, 12] is not [0, …, 16] strictly increasing; row not checked",
        ),
    )
    assert messages(rep) == [
        "row 0: cu_seqlens [0, 5, 12] is not [0, …, 16] strictly increasing; row not checked"
    ]
    assert [r.row for r in rep.rows] == [1]


def test_large_ids_are_folded(model):
    rep = eq.check_rows(model, [make_row([6, 6], seed=7, vocab=1000)])
    assert rep.ok and rep.vocab_folded
    assert "token ids >= 64 were folded modulo the model's vocabulary" in rep.notes


def test_names_must_match_rows(model):
    with pytest.raises(UsageError, match="2 names for 1 rows"):
        eq.check_rows(model, [make_row([4])], names=["a", "b"])


def test_report_is_deterministic_and_json_ready(model, good_report):
    rows = [make_row([5, 7, 4], seed=1), make_row([16], seed=2), make_row([3, 3, 3, 3], seed=3)]
    again = eq.check_rows(build_tiny_model(VOCAB, seed=0), rows)
    assert again.to_dict() == good_report.to_dict()
    data = json.loads(json.dumps(good_report.to_dict()))
    assert data["rows"][0]["segments"][1]["segment"] == 1
    assert data["issues"] == [] and data["notes"] == []


def test_issues_travel_to_json_as_strings(model):
    rep = eq.check_rows(model, [make_row([5, 7, 4], seed=1, reset=False)], names=["s1 r0"])
    data = json.loads(json.dumps(rep.to_dict()))
    assert data["issues"] == messages(rep)
    assert data["issues"][0].startswith("s1 r0 segment 1: position_ids start at 5")
    assert data["ok"] is False


def test_no_row_checked_is_an_issue_of_its_own(model):
    bad = make_row([5, 7, 4], seed=1, cu=[0, 5, 12])
    rep = eq.check_rows(model, [bad])
    assert rep.rows == () and not rep.ok
    assert rep.issues[-1] == Issue(-1, "rows", None, "no row could be checked")
    assert str(rep.issues[-1]) == "rows: no row could be checked"
