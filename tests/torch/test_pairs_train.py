"""DPO on packed rows: the plain loop's step, its first-batch check, the Trainer subclass."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from packshard.errors import UsageError  # noqa: E402
from packshard.torch import PackedDataset, SeamLeakError, collate_varlen  # noqa: E402
from packshard.torch.pairs.train import (  # noqa: E402
    PackedDPOTrainer,
    check_pair_loss,
    dpo_step_loss,
)
from packshard.verify.model.forward import build_tiny_model  # noqa: E402
from tests.helpers import preference_rows, write_out  # noqa: E402

VOCAB = 120
LAYOUTS = [
    [(9, 5, 3), (4,)],
    [(3, 2, 7), (12, 6, 6), (1, 1, 1)],
    [(5,), (20, 4, 9)],
    [(7, 8, 2)],
    [(6, 6, 6), (4, 9, 3)],
    [(10, 3, 8)],
]


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    rows, branches = preference_rows(LAYOUTS, seed=5, vocab=VOCAB)
    out = tmp_path_factory.mktemp("dpo") / "out"
    return write_out(out, [rows[:3], rows[3:]], segment_columns={"branch": branches})


@pytest.mark.torch
def test_plain_loop_step_passes_its_check_and_trains(pack):
    data = PackedDataset(pack)
    policy = build_tiny_model(VOCAB, seed=0).train()
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    batch = collate_varlen([data[0], data[1], data[2]])
    delta = check_pair_loss(policy, batch, reference)
    assert delta <= 1e-5  # branch sums packed vs alone, in nats
    assert check_pair_loss(policy, batch, None) <= 1e-5  # no reference: the policy's sums
    assert policy.training  # the check restores the mode
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
    losses = []
    for _ in range(3):
        loss = dpo_step_loss(policy, batch, reference, beta=0.5)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert abs(losses[0] - 0.6931472) <= 1e-5  # policy == reference: every margin 0
    assert losses[-1] < losses[0]


def _lost_seams(batch):
    """The batch with positions regenerated over each row: a full causal leak."""
    return dict(batch, position_ids=torch.arange(batch["input_ids"].shape[1])[None])


class DropsPositions(torch.nn.Module):
    """A model wrapper that drops ``position_ids``: the model numbers the row as one sequence."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, position_ids=None, **kwargs):
        return self.inner(input_ids=input_ids, **kwargs)


@pytest.mark.torch
@pytest.mark.parametrize("with_reference", [True, False])
def test_a_leak_at_step_0_is_refused_although_every_loss_is_ln_2(pack, with_reference):
    """Policy = reference: every DPO loss is ln 2 packed or not; the branch sums still move."""
    data = PackedDataset(pack)
    policy = build_tiny_model(VOCAB, seed=0)
    reference = copy.deepcopy(policy) if with_reference else None
    lost = _lost_seams(collate_varlen([data[1], data[4]]))
    with torch.no_grad():
        step_loss = float(dpo_step_loss(policy, lost, copy.deepcopy(policy)))
    assert abs(step_loss - 0.6931472) <= 1e-6
    with pytest.raises(SeamLeakError) as err:
        check_pair_loss(policy, lost, reference)
    assert str(err.value) == (
        "the policy model's summed log-probability of the chosen branch of example 14 differs "
        "packed from the branch run alone by 5.70e-01 > 1e-04: it sees across the seams of a "
        "packed row (feed it position_ids with use_cache=False and no 2-D attention_mask, or a "
        "4-D block-causal mask)"
    )


@pytest.mark.torch
def test_a_reference_model_that_leaks_is_refused_too(pack):
    data = PackedDataset(pack)
    policy = build_tiny_model(VOCAB, seed=0)
    batch = collate_varlen([data[1], data[4]])
    with pytest.raises(SeamLeakError, match=r"^the reference model's summed log-probability"):
        check_pair_loss(policy, batch, DropsPositions(copy.deepcopy(policy)))
    row = data[0]
    no_pair = collate_varlen([dict(row, branch=torch.zeros_like(row["branch"]))])
    with pytest.raises(UsageError, match="without a pair"):
        check_pair_loss(policy, no_pair, None)


@pytest.mark.trainers
def test_packed_dpo_trainer_runs_two_steps(pack, tmp_path):
    from transformers import TrainingArguments

    policy = build_tiny_model(VOCAB, seed=0).train()
    reference = copy.deepcopy(policy)
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        logging_strategy="no",
        learning_rate=1e-2,
        per_device_train_batch_size=2,
        max_steps=2,
        seed=0,
        remove_unused_columns=False,
    )
    trainer = PackedDPOTrainer(
        model=policy, args=args, train_dataset=PackedDataset(pack), reference=reference, beta=0.1
    )
    result = trainer.train()
    assert result.global_step == 2
    assert trainer.pair_check_delta is not None and trainer.pair_check_delta <= 1e-5
    assert 0.0 < result.training_loss < 1.0
    before = dict(reference.named_parameters())
    moved = [n for n, p in policy.named_parameters() if not torch.equal(p, before[n])]
    assert moved  # the policy trained, the reference stayed frozen
    assert not any(p.requires_grad for p in reference.parameters())
    args.remove_unused_columns = True
    with pytest.raises(UsageError, match="remove_unused_columns=False"):
        PackedDPOTrainer(model=policy, args=args, train_dataset=PackedDataset(pack))


@pytest.mark.trainers
def test_packed_dpo_trainer_refuses_a_leaking_first_batch_at_step_0(pack, tmp_path):
    from transformers import TrainingArguments

    policy = build_tiny_model(VOCAB, seed=0).train()
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        per_device_train_batch_size=2,
        max_steps=1,
        remove_unused_columns=False,
    )
    trainer = PackedDPOTrainer(
        model=policy,
        args=args,
        train_dataset=PackedDataset(pack),
        reference=copy.deepcopy(policy),  # step 0: every loss ln 2
        data_collator=lambda rows: _lost_seams(collate_varlen(rows)),
    )
    before = [p.detach().clone() for p in policy.parameters()]
    with pytest.raises(SeamLeakError, match="differs packed from the branch run alone"):
        trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
