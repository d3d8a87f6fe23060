"""Streaming epochs: worker passes without set_epoch, Lightning DDP, the plain training loop."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from packshard.errors import UsageError  # noqa: E402
from packshard.torch import PackedIterableDataset, collate_varlen  # noqa: E402
from tests.helpers import fixture_rows, write_out  # noqa: E402

TOLERANCE = 1e-5
LEAK = 1e-3


@pytest.fixture
def out_12(tmp_path):
    rows = fixture_rows(12, seed=6)
    return write_out(tmp_path / "out", [rows[:5], rows[5:]])


def one_pass(loader):
    return [int(b["example_ids"][0]) for b in loader]


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_passes_without_set_epoch_do_not_replay_an_epoch(out_12, persistent):
    ds = PackedIterableDataset(out_12, seed=9)
    loader = DataLoader(
        ds,
        batch_size=None,
        collate_fn=lambda r: collate_varlen([r]),
        num_workers=2,
        persistent_workers=persistent,
    )
    passes = [one_pass(loader) for _ in range(3)]
    firsts = {int(ds.data[i]["example_ids"][0]) for i in range(12)}
    for epoch, seen in enumerate(passes):
        assert sorted(seen) == sorted(firsts), epoch  # every row once
        expected = {int(ds.data[i]["example_ids"][0]) for i in ds.rank_rows(epoch)}
        assert set(seen) == expected
    assert passes[0] != passes[1] != passes[2]  # epochs 0, 1, 2: new orders
    ds.set_epoch(0)  # asked for explicitly, an epoch replays
    assert sorted(one_pass(loader)) == sorted(passes[0])


def test_workers_that_cannot_agree_on_the_epoch_raise(out_12):
    ds = PackedIterableDataset(out_12, seed=9)
    one_pass(DataLoader(ds, batch_size=None, collate_fn=lambda r: r, num_workers=1))
    with pytest.raises(UsageError, match="DataLoader workers disagree on the epoch"):
        one_pass(
            DataLoader(ds, batch_size=None, collate_fn=lambda r: collate_varlen([r]), num_workers=2)
        )


@pytest.mark.trainers
def test_plain_loop_with_workers_trains_each_example_alone(marked_pack, torch_one_thread):
    """The README loop: DataLoader(num_workers=2), no set_epoch, model(..., use_cache=False)."""
    from tests.helpers import LossProbe, epochs_of, marked_examples, tiny_llama

    model = tiny_llama()
    probe = LossProbe(model, marked_examples(marked_pack), hook=False)
    ds = PackedIterableDataset(marked_pack, seed=3)
    loader = DataLoader(ds, batch_size=2, collate_fn=collate_varlen, num_workers=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(2):
        for batch in loader:
            loss = model(
                input_ids=batch["input_ids"],
                labels=batch["labels"],
                position_ids=batch["position_ids"],
                use_cache=False,
            ).loss
            probe.compare(batch["input_ids"][0], batch["labels"][0], float(loss.detach()))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    epochs = epochs_of(probe.records, 2)
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(300, 358))
    assert epochs[0] != epochs[1]
    assert max(abs(r["fed"] - r["alone"]) for r in probe.records) < TOLERANCE
    assert max(abs(r["naive"] - r["alone"]) for r in probe.records) > LEAK


@pytest.mark.trainers
def test_lightning_ddp_trains_every_row_once_per_epoch(marked_pack, tmp_path):
    """Lightning DDP, 2 CPU processes; the dataset is built in the DataModule's __init__."""
    import lightning as L

    from tests.helpers import LossProbe, epochs_of, marked_examples, tiny_llama

    class Rows(L.LightningDataModule):
        def __init__(self):
            super().__init__()
            self.rows = PackedIterableDataset(marked_pack, seed=3)  # no process group yet

        def train_dataloader(self):
            return DataLoader(self.rows, batch_size=2, collate_fn=collate_varlen)

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model, self.probe = tiny_llama(), None

        def training_step(self, batch, index):
            if self.probe is None:
                self.probe = LossProbe(self.model, marked_examples(marked_pack), hook=False)
            loss = self.model(
                input_ids=batch["input_ids"],
                labels=batch["labels"],
                position_ids=batch["position_ids"],
                use_cache=False,
            ).loss
            self.probe.compare(batch["input_ids"][0], batch["labels"][0], float(loss.detach()))
            return loss

        def on_train_end(self):
            path = tmp_path / f"rank{self.global_rank}.json"
            path.write_text(json.dumps(self.probe.records))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-2)

    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_notebook",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), Rows())
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 8  # 16 rows / 2 ranks / 2 per batch × 2 epochs
    by_rank = [epochs_of(r, 2) for r in ranks]
    per_epoch = [by_rank[0][e] + by_rank[1][e] for e in range(2)]
    for seen in per_epoch:
        assert sorted(seen) == list(range(300, 358))  # every row once, none on both ranks
    assert per_epoch[0] != per_epoch[1]  # Lightning never calls set_epoch: epochs still move
    fed = ranks[0] + ranks[1]
    assert max(abs(r["fed"] - r["alone"]) for r in fed) < TOLERANCE
    assert max(abs(r["naive"] - r["alone"]) for r in fed) > LEAK


@pytest.fixture(scope="module")
def balanced(tmp_path_factory, packed_demo_tokenizer):
    from tests.helpers import pack_demo_into

    root = tmp_path_factory.mktemp("balanced")
    return pack_demo_into(root, packed_demo_tokenizer, max_seq_len=128, dp=2, grad_accum=2)


def test_a_balanced_pack_keeps_its_steps_for_its_world_size(balanced):
    import numpy as np

    n = len(PackedIterableDataset(balanced, rank=0, world_size=2).data)
    assert n >= 16
    steps = [  # each step's rows, rank by rank, as the pack wrote them
        [frozenset(range(s, s + 4, 2)), frozenset(range(s + 1, s + 4, 2))]
        for s in range(0, n - n % 4, 4)
    ]
    for epoch in (0, 1):
        ranks = []
        for rank in (0, 1):
            data = PackedIterableDataset(balanced, rank=rank, world_size=2, seed=5)
            data.set_epoch(epoch)
            ranks.append(data.rank_rows())
        pairs = np.stack(ranks)[:, : 2 * (ranks[0].size // 2)].reshape(2, -1, 2)
        got = [[frozenset(pairs[r, k].tolist()) for r in (0, 1)] for k in range(pairs.shape[1])]
        assert all(step in steps for step in got)  # whole steps moved, each rank its own rows
    unbalanced = PackedIterableDataset(balanced, rank=0, world_size=2, shuffle=True, seed=5)
    unbalanced.topology = None  # the control: a row shuffle breaks the steps
    rows = unbalanced.rank_rows()
    got = {frozenset(rows[k : k + 2].tolist()) for k in range(0, len(rows) - 1, 2)}
    assert not got <= {s[0] for s in steps}


def test_a_balanced_pack_read_by_another_world_size_says_so(balanced):
    data = PackedIterableDataset(balanced, rank=0, world_size=3)
    with pytest.warns(UserWarning, match=r"balanced for 2 data-parallel ranks .* read by 3"):
        data.rank_rows()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = data.rank_rows()  # said once
    assert len(rows) == len(data.data) // 3
