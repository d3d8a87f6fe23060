"""num_items_in_step: the trained tokens of a whole optimizer step, read from the plan."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from packshard.errors import UsageError  # noqa: E402
from packshard.records import IGNORE_INDEX  # noqa: E402
from packshard.torch import (  # noqa: E402
    PackedDataset,
    PackedIterableDataset,
    ResumableLoader,
    collate_hf,
    collate_padded,
    collate_varlen,
    evaluate,
)


def _batched(items, n):
    items = list(items)
    return [tuple(items[i : i + n]) for i in range(0, len(items), n)]


def _loss_tokens(out):
    m = PackedDataset(out).manifest
    cols = [pq.read_table(out / s["path"], columns=["num_loss_tokens"]) for s in m["shards"]]
    return np.concatenate([c.column(0).to_numpy() for c in cols])


def _batches(out, rank, batch_size, grad_accum, collate=collate_varlen, **options):
    data = PackedIterableDataset(
        out, rank=rank, world_size=2, seed=3, grad_accum=grad_accum, **options
    )
    return list(ResumableLoader(data, batch_size=batch_size, collate_fn=collate))


@pytest.mark.parametrize(("batch_size", "grad_accum"), [(1, 4), (2, 2), (3, 1), (2, 3)])
def test_every_micro_batch_of_a_step_carries_the_whole_steps_trained_tokens(
    marked_pack, batch_size, grad_accum
):
    ranks = [_batches(marked_pack, r, batch_size, grad_accum) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == -(-8 // batch_size)  # 16 rows, 2 ranks
    steps = [list(_batched(r, grad_accum)) for r in ranks]
    for step0, step1 in zip(*steps, strict=True):
        trained = sum(b["num_loss_tokens"] for b in (*step0, *step1))  # the brute force
        assert {b["num_items_in_step"] for b in (*step0, *step1)} == {trained}
        assert all(type(b["num_items_in_step"]) is int for b in step0)
    # per micro-batch counts differ: dividing by them weights micro-batches unequally
    assert len({b["num_loss_tokens"] for b in ranks[0]}) > 1


def test_every_collator_carries_it_and_a_batch_across_two_steps_is_refused(marked_pack):
    rows = list(PackedIterableDataset(marked_pack, rank=0, world_size=1, grad_accum=2, seed=1))
    padded = collate_padded(rows[:2], max_seq_len=48)
    assert padded["num_items_in_step"] == int(padded["labels"].ne(IGNORE_INDEX).sum())
    assert collate_hf(rows[:2])["num_items_in_step"] == padded["num_items_in_step"]
    assert "num_items_in_step" not in collate_varlen(list(PackedDataset(marked_pack))[:2])
    with pytest.raises(UsageError) as err:
        collate_varlen(rows[1:3])  # the loader's batch size is not the dataset's
    assert str(err.value).startswith("a batch holds rows of different optimizer steps")
    with pytest.raises(UsageError, match="grad_accum must be a positive integer, got 0"):
        PackedIterableDataset(marked_pack, grad_accum=0)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_plain_loader_whose_batch_size_the_dataset_was_not_told_is_refused(
    marked_pack, num_workers
):
    """2 explicit ranks, grad_accum=4, DataLoader(batch_size=2): counted with 1, a half step."""
    from torch.utils.data import DataLoader

    def loaded(rank, **told):
        data = PackedIterableDataset(
            marked_pack, rank=rank, world_size=2, seed=3, grad_accum=4, **told
        )
        loader = DataLoader(data, 2, collate_fn=collate_varlen, num_workers=num_workers)
        return list(loader)

    for rank in (0, 1):
        with pytest.raises(UsageError) as err:
            loaded(rank)
        assert (
            "the DataLoader batches 2 rows but PackedIterableDataset was told batch_size=1, so "
            "num_items_in_step would count steps of 1 × grad_accum rows a rank, not the "
            "loader's (pass batch_size=2 to PackedIterableDataset as well, or read it through "
            "ResumableLoader)"
        ) in str(err.value)
    ranks = [loaded(rank, batch_size=2) for rank in (0, 1)]  # told: the whole step, every rank
    same = [_batches(marked_pack, rank, 2, 4) for rank in (0, 1)]  # through ResumableLoader
    for mine, theirs in zip(ranks, same, strict=True):
        assert [b["example_ids"].tolist() for b in mine] == [
            b["example_ids"].tolist() for b in theirs
        ]
    for step0, step1 in zip(*(_batched(r, 4) for r in ranks), strict=True):
        trained = sum(b["num_loss_tokens"] for b in (*step0, *step1))
        assert {b["num_items_in_step"] for b in (*step0, *step1)} == {trained}


def test_a_map_style_loader_batch_size_is_checked_however_it_is_given(marked_pack):
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    tokens = _loss_tokens(marked_pack)  # 16 rows, one rank, grad_accum 2: steps of 6 rows

    def counts(told, **loader):
        data = PackedDataset(marked_pack, grad_accum=2, batch_size=told, world_size=1)
        return [
            b["num_items_in_step"] for b in DataLoader(data, collate_fn=collate_varlen, **loader)
        ]

    sampler = BatchSampler(SequentialSampler(range(16)), 3, drop_last=False)
    for loader in ({"batch_size": 3}, {"batch_sampler": sampler}):
        with pytest.raises(
            UsageError, match=r"^the DataLoader batches 3 rows but PackedDataset was"
        ):
            counts(1, **loader)  # longer than told
        with pytest.raises(UsageError, match="told batch_size=4"):
            counts(4, **loader)  # shorter than told, and not the last batch
        expected = [int(tokens[s * 6 : s * 6 + 6].sum()) for s in range(3)]
        assert counts(3, **loader) == [c for c in expected for _ in range(2)][:6]  # last: 1 row


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda out: PackedIterableDataset(out, batch_size=None), "batch_size"),
        (lambda out: PackedDataset(out, world_size=0), "world_size"),
        (lambda out: evaluate(None, out, batch_size=None), "batch_size"),
        (lambda out: PackedDataset(out, grad_accum=True), "grad_accum"),
    ],
)
def test_each_count_the_reader_takes_is_named_when_it_is_not_a_positive_integer(
    marked_pack, make, message
):
    with pytest.raises(UsageError, match=f"^{message} must be a positive integer, got "):
        make(marked_pack)


def test_map_style_rows_count_their_step_in_index_order(marked_pack):
    from torch.utils.data import DataLoader, DistributedSampler

    tokens = _loss_tokens(marked_pack)
    for world, batch_size, accum in ((2, 2, 2), (1, 3, 2), (2, 1, 4)):
        data = PackedDataset(marked_pack, grad_accum=accum, batch_size=batch_size, world_size=world)
        per_rank = []
        for rank in range(world):
            sampler = DistributedSampler(
                data, num_replicas=world, rank=rank, shuffle=False, drop_last=True
            )
            loader = DataLoader(data, batch_size, sampler=sampler, collate_fn=collate_varlen)
            per_rank.append(list(_batched(loader, accum)))
        for steps in zip(*per_rank, strict=True):
            ids = {int(i) for step in steps for b in step for i in b["example_ids"]}
            trained = sum(b["num_loss_tokens"] for step in steps for b in step)
            assert {b["num_items_in_step"] for step in steps for b in step} == {trained}
            assert ids  # every step reads rows
        assert sum(tokens[: len(tokens) // world * world]) == sum(
            b["num_loss_tokens"] for r in per_rank for step in r for b in step
        )


# --- the acceptance: 2 ranks (gloo), grad accumulation 4, exact step gradients ------------------

ACCUM = 4


def _alone_sum(model, row):
    """The summed token loss and trained tokens of a row's examples, each run alone."""
    import torch.nn.functional as F

    total, count = 0.0, 0
    cu = row["cu_seqlens"].tolist()
    for lo, hi in itertools.pairwise(cu):
        ids, labels = row["input_ids"][lo:hi], row["labels"][lo:hi]
        logits = model(input_ids=ids[None], use_cache=False).logits[0]
        total = total + F.cross_entropy(logits[:-1], labels[1:], reduction="sum")
        count += int((labels[1:] != IGNORE_INDEX).sum())
    return total, count


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()]).clone()


def _step_loop(rank, out, results, explicit):
    import json

    import torch.distributed as dist
    import torch.nn.functional as F

    from packshard.torch.placement import epoch_rows
    from tests.helpers import tiny_llama

    dist.init_process_group("gloo")
    where = {"rank": rank, "world_size": 2} if explicit else {}
    data = PackedIterableDataset(out, seed=5, grad_accum=ACCUM, **where)
    loader = ResumableLoader(data, batch_size=1, collate_fn=collate_hf)
    model, reference = tiny_llama(), tiny_llama()
    everyone = epoch_rows(len(data.data), seed=5, epoch=0, shuffle=True, world_size=2,
                          drop_remainder=True)  # fmt: skip
    record = {"exact": [], "control": [], "items": []}
    for step, micro in enumerate(_batched(loader, ACCUM)):
        for normaliser in ("exact", "control"):
            model.zero_grad()
            for batch in micro:
                logits = model(
                    input_ids=batch["input_ids"], position_ids=batch["position_ids"]
                ).logits[0]
                labels = batch["labels"][0]
                loss_sum = F.cross_entropy(logits[:-1], labels[1:], reduction="sum")
                if normaliser == "exact":
                    loss = loss_sum / batch["num_items_in_step"]
                else:  # the usual loop: each micro-batch's own mean, averaged over all
                    count = int((labels[1:] != IGNORE_INDEX).sum())
                    loss = loss_sum / count / (ACCUM * 2)
                loss.backward()
            grads = _grads(model)
            dist.all_reduce(grads)  # summed over ranks (DDP would average: scale by 2)
            # the unpacked token mean of the same examples, every row of the step on both ranks
            reference.zero_grad()
            rows = everyone[:, step * ACCUM : (step + 1) * ACCUM].flatten().tolist()
            sums = [_alone_sum(reference, data.data[i]) for i in rows]
            (sum(s for s, _ in sums) / sum(c for _, c in sums)).backward()
            delta = float((grads - _grads(reference)).abs().max())
            record[normaliser].append(delta)
        record["items"].append([b["num_items_in_step"] for b in micro])
        record["tokens"] = [*record.get("tokens", []), sum(c for _, c in sums)]
    (results / f"rank{rank}-{explicit}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


@pytest.mark.parametrize("explicit", [False, True])
def test_two_ranks_with_grad_accumulation_get_the_unpacked_token_mean_gradient(
    marked_pack, tmp_path, explicit
):
    import json

    from tests.helpers import run_two_processes

    run_two_processes(_step_loop, marked_pack, tmp_path, explicit)
    records = [json.loads((tmp_path / f"rank{r}-{explicit}.json").read_text()) for r in (0, 1)]
    assert records[0]["items"] == records[1]["items"]  # every micro-batch, every rank
    assert len(records[0]["items"]) == 2  # 16 rows / 2 ranks / 4 micro-batches of 1 row
    for items, tokens in zip(records[0]["items"], records[0]["tokens"], strict=True):
        assert items == [tokens] * ACCUM
    for record in records:
        assert max(record["exact"]) <= 1e-6, record["exact"]
        assert min(record["control"]) > 1e-4, record["control"]  # per-micro-batch mean differs


@pytest.mark.trainers
def test_it_is_what_the_hf_trainer_computes_as_num_items_in_batch(
    marked_pack, tmp_path, torch_one_thread
):
    from transformers import Trainer, TrainingArguments

    from tests.helpers import tiny_llama

    model, seen = tiny_llama(), []

    def hook(module, args, kwargs):
        seen.append((int(kwargs["num_items_in_batch"]), kwargs["num_items_in_step"]))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    args = TrainingArguments(
        output_dir=str(tmp_path), report_to="none", save_strategy="no", use_cpu=True,
        disable_tqdm=True, logging_strategy="no", per_device_train_batch_size=2,
        gradient_accumulation_steps=2, max_steps=4, remove_unused_columns=False,
    )  # fmt: skip
    data = PackedIterableDataset(marked_pack, grad_accum=2, batch_size=2)
    Trainer(model=model, args=args, train_dataset=data, data_collator=collate_hf).train()
    assert len(seen) == 8  # 16 rows: 4 steps of 2 micro-batches of 2 rows
    assert all(ours == theirs for theirs, ours in seen), seen
    assert len({ours for _, ours in seen}) > 1


def _accelerate_loop(rank, out, results):
    import json

    import torch.distributed as dist
    import torch.nn.functional as F
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.state import AcceleratorState, GradientState
    from torch.utils.data import DataLoader

    from tests.helpers import tiny_llama

    AcceleratorState._reset_state(reset_partial_state=True)  # forked: drop the parent's state
    GradientState._reset_state()

    # the docs/trainers.md recipe: accelerate splits the stream (IterableDatasetShard), DDP
    accelerator = Accelerator(
        cpu=True,
        gradient_accumulation_steps=ACCUM,
        dataloader_config=DataLoaderConfiguration(dispatch_batches=False),
    )
    data = PackedIterableDataset(out, seed=5, grad_accum=ACCUM, batch_size=1)
    loader = DataLoader(data, batch_size=1, collate_fn=collate_varlen)
    model, reference = tiny_llama(), tiny_llama()
    model, loader = accelerator.prepare(model, loader)
    world, deltas, counts, local = accelerator.num_processes, [], [], []
    for batch in loader:
        with accelerator.accumulate(model):
            logits = model(
                input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
            ).logits[0]
            labels = batch["labels"][0]
            loss_sum = F.cross_entropy(logits[:-1], labels[1:], reduction="sum")
            accelerator.backward(loss_sum / batch["num_items_in_step"] * ACCUM * world)
            row = {k: batch[k][0] for k in ("input_ids", "labels")}
            local.append((row, batch["cu_seqlens"], batch["num_items_in_step"]))
            if accelerator.sync_gradients:
                reference.zero_grad()
                sums = [_alone_sum(reference, {**r, "cu_seqlens": cu}) for r, cu, _ in local]
                trained = torch.tensor(sum(c for _, c in sums))
                dist.all_reduce(trained)
                assert {n for *_, n in local} == {int(trained)}  # the step, every rank
                (sum(s for s, _ in sums) / int(trained)).backward()
                grads = _grads(reference)
                dist.all_reduce(grads)
                fed = _grads(model.module if hasattr(model, "module") else model)
                deltas.append(float((fed - grads).abs().max()))
                counts.append(int(trained))
                model.zero_grad()
                local = []
    (results / f"acc{rank}.json").write_text(json.dumps({"deltas": deltas, "steps": counts}))


@pytest.mark.trainers
def test_the_accelerate_recipe_gets_the_unpacked_token_mean_gradient(marked_pack, tmp_path):
    import json

    from tests.helpers import run_two_processes

    run_two_processes(_accelerate_loop, marked_pack, tmp_path)
    records = [json.loads((tmp_path / f"acc{r}.json").read_text()) for r in (0, 1)]
    assert records[0]["steps"] == records[1]["steps"] and len(records[0]["steps"]) == 2
    for record in records:
        assert max(record["deltas"]) <= 1e-6, record["deltas"]
