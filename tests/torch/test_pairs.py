"""Preference pairs on packed rows: per-pair log-probabilities equal the pairs run alone."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402

from packshard.errors import FormatError, UsageError  # noqa: E402
from packshard.records import IGNORE_INDEX  # noqa: E402
from packshard.torch import (  # noqa: E402
    PackedDataset,
    PackedIterableDataset,
    ResumableLoader,
    collate_padded,
    collate_varlen,
    padded_block_causal_mask,
    seq_idx_block_causal_mask,
)
from packshard.torch.pairs import PairLogps, dpo_loss, pair_logps  # noqa: E402
from packshard.verify.model.forward import build_tiny_model  # noqa: E402
from tests.helpers import preference_rows, write_out  # noqa: E402

VOCAB = 120
LAYOUTS = [
    [(9, 5, 3), (4,)],
    [(3, 2, 7), (12, 6, 6), (1, 1, 1)],
    [(5,), (20, 4, 9)],
    [(7, 8, 2)],
]
"""Rows of pairs (prompt, chosen, rejected) and plain segments (n,): 6 pairs in 4 rows."""


def as_reader_rows(rows, branches) -> list[dict]:
    out = []
    for r, branch in zip(rows, branches, strict=True):
        row = {
            name: torch.from_numpy(getattr(r, name).astype(np.int64))
            for name in ("input_ids", "labels", "position_ids", "example_ids")
        }
        row["cu_seqlens"] = torch.from_numpy(r.cu_seqlens.astype(np.int32))
        row["branch"] = torch.tensor(branch, dtype=torch.int8)
        out.append(row)
    return out


@pytest.fixture(scope="module")
def models():
    return build_tiny_model(VOCAB, seed=0), build_tiny_model(VOCAB, seed=1)


@pytest.fixture(scope="module")
def pairs():
    rows, branches = preference_rows(LAYOUTS, seed=3, vocab=VOCAB)
    return rows, branches, as_reader_rows(rows, branches)


def alone_logp(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of log p(label t | tokens < t) for one segment run alone, unpadded."""
    logits = model(input_ids=ids[None], use_cache=False).logits[0].float()
    target = labels[1:]
    keep = target != IGNORE_INDEX
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, target.clamp(min=0)[:, None])[:, 0]
    return (logp.double() * keep).sum()


def one_by_one(model, reader_rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every pair's chosen and rejected sums and token counts, each branch run alone."""
    chosen, rejected, n_c, n_r = [], [], [], []
    with torch.no_grad():
        for r in reader_rows:
            cu = r["cu_seqlens"].tolist()
            for j, code in enumerate(r["branch"].tolist()):
                lo, hi = cu[j], cu[j + 1]
                if code == 0:
                    continue
                value = alone_logp(model, r["input_ids"][lo:hi], r["labels"][lo:hi])
                count = int((r["labels"][lo + 1 : hi] != IGNORE_INDEX).sum())
                (chosen if code == 1 else rejected).append(value)
                (n_c if code == 1 else n_r).append(count)
    return torch.stack(chosen), torch.stack(rejected), torch.tensor(n_c), torch.tensor(n_r)


def packed_varlen(model, batch, leak: bool = False):
    if leak:  # naive concatenation: one causal mask over the row, positions 0..T-1
        length = batch["input_ids"].shape[1]
        return model(
            input_ids=batch["input_ids"],
            position_ids=torch.arange(length)[None],
            attention_mask=torch.ones(1, 1, length, length, dtype=torch.bool).tril(),
        ).logits
    return model(
        input_ids=batch["input_ids"],
        position_ids=batch["position_ids"],
        attention_mask=seq_idx_block_causal_mask(batch["seq_idx"]),
    ).logits


def test_pair_logps_and_dpo_loss_equal_the_pairs_run_alone(models, pairs):
    policy, reference = models
    _, _, reader_rows = pairs
    batch = collate_varlen(reader_rows, pad_to_multiple_of=16)
    assert batch["branch"].dtype == torch.int8 and batch["branch"][-1] == 0  # padding segment
    with torch.no_grad():
        got = pair_logps(packed_varlen(policy, batch), batch)
        ref = pair_logps(packed_varlen(reference, batch), batch)
    want_c, want_r, n_c, n_r = one_by_one(policy, reader_rows)
    ref_c, ref_r, _, _ = one_by_one(reference, reader_rows)
    assert len(got) == 6
    assert (
        got.chosen_tokens.tolist() == n_c.tolist() and got.rejected_tokens.tolist() == n_r.tolist()
    )
    assert float((got.chosen - want_c).abs().max()) <= 1e-4
    assert float((got.rejected - want_r).abs().max()) <= 1e-4
    assert (got.rejected_example_ids == got.chosen_example_ids + 1).all()
    alone = PairLogps(want_c, want_r, n_c, n_r, got.chosen_example_ids, got.rejected_example_ids)
    for loss_type in ("sigmoid", "ipo"):
        packed_loss = dpo_loss(got, ref, beta=0.1, loss_type=loss_type)
        alone_loss = dpo_loss(alone, (ref_c, ref_r), beta=0.1, loss_type=loss_type)
        assert abs(float(packed_loss - alone_loss)) <= 1e-5, loss_type
    assert abs(float(dpo_loss(got, loss_type="simpo") - dpo_loss(alone, loss_type="simpo"))) <= 1e-5
    # The leaking control: one causal mask over each row moves the per-pair losses.
    with torch.no_grad():
        leaked = pair_logps(packed_varlen(policy, batch, leak=True), batch)
        leaked_ref = pair_logps(packed_varlen(reference, batch, leak=True), batch)
    per_pair = dpo_loss(got, ref, reduction="none")
    per_pair_leak = dpo_loss(leaked, leaked_ref, reduction="none")
    moved = (per_pair - per_pair_leak).abs()
    # every rejected branch sees its chosen under the leak: each pair moves
    assert float((leaked.rejected - want_r).abs().min()) > 1e-3
    assert float(moved.min()) > 1e-5 and float(moved.max()) > 1e-3


def test_padded_batch_gives_the_same_pairs(models, pairs):
    policy, _ = models
    _, _, reader_rows = pairs
    varlen = collate_varlen(reader_rows)
    padded = collate_padded(reader_rows, max_seq_len=64)
    assert padded["branch"].shape == padded["example_ids"].shape == (4, 6)
    with torch.no_grad():
        flat = pair_logps(packed_varlen(policy, varlen), varlen)
        mask = padded_block_causal_mask(padded["cu_seqlens"], 64)
        logits = policy(
            input_ids=padded["input_ids"],
            position_ids=padded["position_ids"],
            attention_mask=mask,
        ).logits
        grid = pair_logps(logits, padded)
    torch.testing.assert_close(grid.chosen, flat.chosen, atol=1e-4, rtol=0)
    torch.testing.assert_close(grid.rejected, flat.rejected, atol=1e-4, rtol=0)
    assert grid.chosen_example_ids.tolist() == flat.chosen_example_ids.tolist()


def test_pair_logps_is_differentiable_and_matches_token_losses(models, pairs):
    policy, reference = models
    _, _, reader_rows = pairs
    batch = collate_varlen(reader_rows[:2])
    logits = packed_varlen(policy, batch)
    with torch.no_grad():
        ref = pair_logps(packed_varlen(reference, batch), batch)
    got = pair_logps(logits, batch)
    loss = dpo_loss(got, ref)
    loss.backward()
    grads = [p.grad for p in policy.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    policy.zero_grad(set_to_none=True)
    # the sums are the negated cross-entropy sums over each pair branch's labels
    labels = batch["labels"][0]
    lo, hi = batch["cu_seqlens"][:2].tolist()
    ce = F.cross_entropy(logits[0, lo : hi - 1], labels[lo + 1 : hi], reduction="sum")
    torch.testing.assert_close(got.chosen[0], -ce.double(), atol=1e-4, rtol=0)


def test_a_batch_that_cuts_a_pair_is_refused(pairs):
    _, _, reader_rows = pairs
    batch = collate_varlen(reader_rows[:1])
    logits = torch.zeros(1, batch["input_ids"].shape[1], VOCAB)
    cut = dict(batch, branch=torch.tensor([1, 0, 0], dtype=torch.int8))  # rejected lost
    with pytest.raises(UsageError, match="does not pair every chosen segment"):
        pair_logps(logits, cut)
    swapped = dict(batch, branch=torch.tensor([2, 1, 0], dtype=torch.int8))
    with pytest.raises(UsageError, match="does not pair every chosen segment"):
        pair_logps(logits, swapped)
    no_branch = {k: v for k, v in batch.items() if k != "branch"}
    with pytest.raises(UsageError, match="per-segment branch column"):
        pair_logps(logits, no_branch)
    # across rows of a padded batch: chosen last in row 0, its rejected first in row 1
    padded = collate_padded(reader_rows[:2], max_seq_len=64)
    across = dict(padded, branch=torch.tensor([[0, 0, 1, 0, 0, 0], [2, 1, 2, 1, 2, 0]]))
    with pytest.raises(UsageError, match="same row"):
        pair_logps(torch.zeros(2, 64, VOCAB), across)
    p = pair_logps(logits, batch)
    with pytest.raises(UsageError, match="needs the reference"):
        dpo_loss(p)
    with pytest.raises(UsageError, match="loss_type"):
        dpo_loss(p, loss_type="orpo")


def test_dpo_loss_formulas():
    p = PairLogps(
        torch.tensor([-4.0, -10.0]),
        torch.tensor([-6.0, -9.0]),
        torch.tensor([2, 5]),
        torch.tensor([3, 3]),
        torch.tensor([0, 2]),
        torch.tensor([1, 3]),
    )
    ref = (torch.tensor([-5.0, -10.0]), torch.tensor([-5.0, -10.0]))
    margin = torch.tensor([(-4 + 5) - (-6 + 5), (-10 + 10) - (-9 + 10)], dtype=torch.float32)
    want = -F.logsigmoid(0.5 * margin)
    torch.testing.assert_close(dpo_loss(p, ref, beta=0.5, reduction="none"), want)
    ipo = (torch.tensor([1 / 2 + 1 / 3, 0 / 5 - 1 / 3]) - 1 / (2 * 0.5)) ** 2
    torch.testing.assert_close(dpo_loss(p, ref, beta=0.5, loss_type="ipo", reduction="none"), ipo)
    simpo = -F.logsigmoid(2.0 * torch.tensor([-2 + 2, -2 + 3.0]) - 0.5)
    got = dpo_loss(p, beta=2.0, loss_type="simpo", reduction="none")
    torch.testing.assert_close(got, simpo)
    torch.testing.assert_close(dpo_loss(p, ref, beta=0.5, reduction="sum"), want.sum())


@pytest.fixture(scope="module")
def pair_pack(tmp_path_factory, pairs):
    rows, branches, _ = pairs
    more, more_branches = preference_rows(LAYOUTS, seed=4, vocab=VOCAB)
    for r in more:  # example ids continue after the first rows'
        r.example_ids[:] += 100
    rows, branches = rows + more, branches + more_branches
    out = tmp_path_factory.mktemp("pairs") / "out"
    write_out(out, [rows[:3], rows[3:6], rows[6:]], segment_columns={"branch": branches})
    return out, rows, branches


def test_reader_rows_carry_branch_and_plain_packs_do_not(pair_pack, tmp_path):
    out, rows, branches = pair_pack
    ds = PackedDataset(out)
    for i in range(len(ds)):
        assert ds[i]["branch"].dtype == torch.int8
        assert ds[i]["branch"].tolist() == branches[i]
        assert "kto_label" not in ds[i]
    plain = PackedDataset(write_out(tmp_path / "plain", [rows[:2]]))
    assert "branch" not in plain[0]
    assert "branch" not in collate_varlen([plain[0], plain[1]])
    assert "branch" not in collate_padded([plain[0]], max_seq_len=64)


def test_broken_branch_column_is_refused(pairs, tmp_path):
    rows, branches, _ = pairs
    short = [b[:-1] for b in branches]
    out = write_out(tmp_path / "short", [rows], segment_columns={"branch": short})
    with pytest.raises(FormatError, match="row 0: branch has a value out of range"):
        PackedDataset(out)[0]
    wrong = [[5] * len(b) for b in branches]
    out = write_out(tmp_path / "wrong", [rows], segment_columns={"branch": wrong})
    with pytest.raises(FormatError, match="branch has a value out of range"):
        PackedDataset(out)[0]


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("collate", ["varlen", "padded"])
def test_every_batch_on_every_rank_holds_whole_pairs(pair_pack, world_size, collate):
    """Rows are the unit of every placement path: no batch, micro-batch or rank splits one."""
    out, rows, branches = pair_pack
    total_pairs = sum(b.count(1) for b in branches)
    seen: list[int] = []
    for rank in range(world_size):
        ds = PackedIterableDataset(
            out, rank=rank, world_size=world_size, seed=5, drop_remainder=False
        )

        def fn(batch_rows):
            if collate == "varlen":
                return collate_varlen(batch_rows, pad_to_multiple_of=8)
            return collate_padded(batch_rows, max_seq_len=64)

        for batch in ResumableLoader(ds, batch_size=3, collate_fn=fn):
            logits = torch.zeros(*batch["input_ids"].shape, VOCAB)
            got = pair_logps(logits, batch)  # refuses a batch with half a pair
            seen += got.chosen_example_ids.tolist()
            assert (got.rejected_example_ids == got.chosen_example_ids + 1).all()
    assert set(seen) == {
        int(r.example_ids[j])
        for r, b in zip(rows, branches, strict=True)
        for j in range(len(b))
        if b[j] == 1
    }
    assert len(seen) >= total_pairs


def test_long_answers_sum_without_float32_rounding():
    """2,000 trained tokens sum to about -16,000: float32 would round it by ~1e-3."""
    from packshard.torch.collate import token_losses
    from packshard.torch.pairs import segment_logps

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 2001, 4096, generator=g) * 3
    labels = torch.randint(0, 4096, (1, 2001), generator=g)
    labels[0, 0] = IGNORE_INDEX
    sums, counts = segment_logps(logits, labels, torch.tensor([0, 2001]))
    exact = (-token_losses(logits, labels)).double().sum()
    assert sums.dtype == torch.float64 and int(counts[0]) == 2000
    assert abs(float(sums[0] - exact)) <= 1e-9


def test_kto_labels_and_static_boundaries_pass_through_the_collators(pairs):
    _, branches, reader_rows = pairs
    lists = []
    for r, branch in zip(reader_rows, branches, strict=True):  # load_dataset's form: lists
        row = {k: v.tolist() for k, v in r.items()}
        row["kto_label"] = [1 if b == 0 else -1 for b in branch]
        lists.append(row)
    flat = collate_varlen(lists, pad_to_multiple_of=8, static_cu_seqlens_len=20)
    segments = sum(len(b) for b in branches)
    assert flat["kto_label"].dtype == torch.int8 and flat["kto_label"].shape == (19,)
    assert flat["kto_label"][:segments].tolist() == [x for row in lists for x in row["kto_label"]]
    assert (flat["kto_label"][segments:] == -1).all() and (flat["branch"][segments:] == 0).all()
    logits = torch.zeros(1, flat["input_ids"].shape[1], VOCAB)
    assert len(pair_logps(logits, flat)) == 6
    grid = collate_padded(lists, max_seq_len=64)
    assert grid["kto_label"].shape == grid["branch"].shape == (4, 6)
    assert grid["kto_label"][0].tolist() == [-1, -1, 1, -1, -1, -1]
