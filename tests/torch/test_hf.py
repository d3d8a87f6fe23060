"""collate_hf: a Hugging Face model fed only what its forward accepts keeps examples apart."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from packshard.records import IGNORE_INDEX  # noqa: E402
from packshard.torch import collate_hf  # noqa: E402

X = IGNORE_INDEX


def _row(segments):
    ids = [t for s in segments for t in s]
    cu = [0]
    for s in segments:
        cu.append(cu[-1] + len(s))
    return {
        "input_ids": torch.tensor(ids),
        "labels": torch.tensor([t if i else X for s in segments for i, t in enumerate(s)]),
        "position_ids": torch.tensor([p for s in segments for p in range(len(s))]),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        "example_ids": torch.arange(len(segments)),
    }


def _model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def test_collate_hf_has_only_forward_keys():
    batch = collate_hf([_row([[1, 2, 3], [4, 5]])])
    assert sorted(batch) == ["input_ids", "labels", "position_ids"]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    flash = collate_hf([_row([[1, 2, 3], [4, 5]])], flash=True)
    assert flash["cu_seq_lens_q"].tolist() == [0, 3, 5]
    assert flash["max_length_q"] == 3


def test_hf_forward_on_collate_hf_batch_equals_each_example_alone():
    segments = [[5, 9, 3, 7, 2], [8, 1, 6], [4, 4, 10, 11]]
    model = _model()
    batch = collate_hf([_row(segments[:2]), _row(segments[2:])])
    with torch.no_grad():
        packed = model(**batch)
        start = 0
        for seg in segments:
            alone = model(input_ids=torch.tensor([seg])).logits[0]
            got = packed.logits[0, start : start + len(seg)]
            assert torch.allclose(got, alone, atol=1e-5), (seg, (got - alone).abs().max())
            start += len(seg)
    # The model's own loss is the token mean over every segment's targets (seams excluded).
    targets = sum(len(s) - 1 for s in segments)
    logits, labels = packed.logits[0], batch["labels"][0]
    manual = torch.nn.functional.cross_entropy(
        logits[:-1], labels[1:], ignore_index=X, reduction="sum"
    )
    assert torch.allclose(packed.loss, manual / targets, atol=1e-5)


# --- rows that lost columns, lists from datasets, and what the model separates ----------------


def test_collate_hf_finds_the_seams_in_what_a_trainer_leaves_of_a_row():
    row = _row([[1, 2, 3], [4, 5], [6]])
    full = collate_hf([row], flash=True)
    kept = {k: row[k] for k in ("input_ids", "labels", "position_ids")}  # remove_unused_columns
    as_lists = {k: v.tolist() for k, v in kept.items()}  # what load_dataset(OUT) rows hold
    by_lengths = {**as_lists, "seq_lengths": [3, 2, 1]}
    for variant in (kept, as_lists, by_lengths):
        got = collate_hf([variant], flash=True)
        assert got["cu_seq_lens_q"].tolist() == full["cu_seq_lens_q"].tolist() == [0, 3, 5, 6]
        assert torch.equal(got["position_ids"], full["position_ids"])
        assert torch.equal(got["labels"], full["labels"])


def test_collators_refuse_rows_whose_seams_cannot_be_found():
    from packshard.errors import UsageError
    from packshard.torch import collate_varlen

    row = _row([[1, 2, 3], [4, 5]])
    with pytest.raises(UsageError) as err:
        collate_hf([{"input_ids": row["input_ids"], "labels": row["labels"]}])
    assert str(err.value) == (
        "a row reached the collator without cu_seqlens, seq_lengths or position_ids, so its "
        "seams cannot be found (keep position_ids: a trainer that removes unused columns keeps "
        "them; or pass remove_unused_columns=False)"
    )
    rows = {k: v.tolist() for k, v in row.items()}  # as load_dataset(OUT) gives them
    regenerated = {**rows, "position_ids": list(range(5))}  # positions no longer restart
    with pytest.raises(UsageError) as err:
        collate_varlen([regenerated])
    assert str(err.value) == (
        "a row's position_ids do not restart at 0 where its segments start (they were "
        "regenerated, or the row is not a packshard row: run packshard verify)"
    )


def test_fed_segments_follow_what_transformers_separates():
    from packshard.torch.hf import fed_segments, seams_problem

    ids = torch.arange(1, 8)[None]
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1]])
    assert fed_segments({"input_ids": ids, "position_ids": positions}) == [3, 2, 2]
    # a KV cache, no positions, or a 2-D mask switch the detection off: one sequence a row
    assert fed_segments({"input_ids": ids, "position_ids": positions}, use_cache=True) == [7]
    assert fed_segments({"input_ids": ids}) == [7]
    padded = {
        "input_ids": torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
        "position_ids": torch.tensor([[0, 1, 0, 0], [0, 1, 0, 0]]),
    }
    assert fed_segments(padded) == [3, 2]
    # a 4-D mask is used as given: additive float (0 = attend) or bool
    seg = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    allowed = (seg[:, None] == seg[None, :]) & torch.ones(7, 7, dtype=torch.bool).tril()
    additive = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None]
    assert fed_segments({"input_ids": ids, "attention_mask": additive}) == [3, 2, 2]
    assert fed_segments({"input_ids": ids, "attention_mask": allowed[None, None]}) == [3, 2, 2]
    assert seams_problem([3, 2, 2], [3, 2, 2, 4]) is None  # a trailing padding segment
    assert seams_problem([3, 2, 2], [7]) == (
        "2 of 2 seams lost, 0 invented (segments fed [7], in the rows [3, 2, 2])"
    )
    assert seams_problem([3, 4], [3, 2, 2]) == (
        "0 of 1 seams lost, 1 invented (segments fed [3, 2, 2], in the rows [3, 4])"
    )


# --- the real trainers: the loss of every fed batch equals its examples' alone ----------------

TOLERANCE = 1e-5
LEAK = 1e-3  # a lost seam moves the loss by more than this (measured: 2e-3 to 3e-2)


def _hf_trainer(model, dataset, collator, out, **options):
    from transformers import Trainer, TrainingArguments

    settings = {"per_device_train_batch_size": 2, "max_steps": 4} | options
    args = TrainingArguments(
        output_dir=str(out),
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        logging_strategy="no",
        learning_rate=1e-2,
        **settings,
    )
    return Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)


def _deltas(probe):
    return [abs(r["fed"] - r["alone"]) for r in probe.records]


def _leaks(probe):
    return [abs(r["naive"] - r["alone"]) for r in probe.records]


@pytest.mark.trainers
def test_trainer_feeds_every_example_as_if_it_were_alone(marked_pack, tmp_path, torch_one_thread):
    from datasets import load_dataset
    from transformers import DataCollatorWithFlattening

    from packshard.errors import UsageError
    from packshard.torch import PackedDataset, check_trainer
    from tests.helpers import LossProbe, marked_examples, tiny_llama

    examples = marked_examples(marked_pack)
    rows = load_dataset(str(marked_pack), split="train", cache_dir=str(tmp_path / "hf"))
    for dataset in (PackedDataset(marked_pack), rows):  # default remove_unused_columns=True
        model = tiny_llama()
        probe = LossProbe(model, examples)
        trainer = _hf_trainer(model, dataset, collate_hf, tmp_path)
        check_trainer(trainer)
        trainer.train()
        assert len(probe.records) == 4 and sum(len(r["markers"]) for r in probe.records) > 16
        assert max(_deltas(probe)) < TOLERANCE, _deltas(probe)
        assert max(_leaks(probe)) > LEAK  # the live control: without seams the loss moves
    # the trap: DataCollatorWithFlattening takes each packed row for one sequence
    model = tiny_llama()
    probe = LossProbe(model, examples)
    trap = _hf_trainer(model, PackedDataset(marked_pack), DataCollatorWithFlattening(), tmp_path)
    with pytest.raises(UsageError) as err:
        check_trainer(trap)
    assert str(err.value).startswith("Trainer's batches would mix examples: ")
    assert str(err.value).endswith(
        "(DataCollatorWithFlattening treats each packed row as one sequence: use "
        "data_collator=packshard.torch.collate_hf)"
    )
    trap.train()
    assert min(_deltas(probe)) > TOLERANCE * 10 and max(_deltas(probe)) > LEAK


@pytest.mark.trainers
def test_trl_sft_trains_padding_free_on_seq_lengths(
    marked_pack, word_tokenizer, tmp_path, monkeypatch, torch_one_thread
):
    from datasets import load_dataset
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    from packshard.errors import UsageError
    from packshard.torch import check_trainer
    from tests.helpers import LossProbe, marked_examples, tiny_llama

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    examples = marked_examples(marked_pack)
    rows = load_dataset(str(marked_pack), split="train", cache_dir=str(tmp_path / "hf"))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(word_tokenizer / "tokenizer.json"), eos_token="<eos>", pad_token="<eos>"
    )

    def sft(dataset, **options):
        model = tiny_llama()
        probe = LossProbe(model, examples)
        args = SFTConfig(
            output_dir=str(tmp_path / "trl"),
            per_device_train_batch_size=2,
            max_steps=3,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            logging_strategy="no",
            learning_rate=1e-2,
            bf16=False,
            activation_checkpointing=False,
            **options,
        )
        return SFTTrainer(
            model=model, args=args, train_dataset=dataset, processing_class=tokenizer
        ), probe

    recipe = {"padding_free": True, "packing": False, "max_length": None}
    trainer, probe = sft(rows, **recipe)
    check_trainer(trainer)
    trainer.train()
    assert len(probe.records) == 3
    assert max(_deltas(probe)) < TOLERANCE, _deltas(probe)
    assert max(_leaks(probe)) > LEAK
    # packing=True re-packs: refused before it trains
    trainer, _ = sft(rows, packing=True, max_length=64)
    with pytest.raises(UsageError) as err:
        check_trainer(trainer)
    assert str(err.value) == (
        "TRL's packing=True packs the packed rows again: each becomes one sequence and examples "
        "attend to each other (use SFTConfig(padding_free=True, packing=False, max_length=None) "
        "and no data_collator)"
    )
    # padded batches, or padding-free without seq_lengths: every row is one sequence
    trainer, _ = sft(rows, max_length=None)
    with pytest.raises(UsageError, match=r"\(TRL pads rows and masks only the padding: use SFT"):
        check_trainer(trainer)
    trainer, probe = sft(rows.remove_columns(["seq_lengths"]), **recipe)
    with pytest.raises(UsageError, match="finds segments only in a seq_lengths column"):
        check_trainer(trainer)
    trainer.train()
    assert max(_deltas(probe)) > LEAK  # what TRL would have trained without the column


def _two_process_runs(rank, out, results):
    """One process of a pair: HF Trainer (map-style, iterable) and accelerate (both modes)."""
    import json

    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader

    from packshard.torch import (
        PackedDataset,
        PackedIterableDataset,
        collate_padded,
        collate_varlen,
        seq_idx_block_causal_mask,
    )
    from tests.helpers import LossProbe, marked_examples, tiny_llama

    examples, runs = marked_examples(out), {}
    for name, dataset, accelerate in (
        ("trainer_map", PackedDataset(out), {}),
        ("trainer_iterable", PackedIterableDataset(out, seed=3), {"dispatch_batches": False}),
    ):
        model = tiny_llama()
        probe = LossProbe(model, examples)
        trainer = _hf_trainer(
            model,
            dataset,
            collate_hf,
            results / f"hf{rank}",
            max_steps=-1,
            num_train_epochs=2,
            accelerator_config=accelerate,
            ddp_backend="gloo",
        )
        trainer.train()
        runs[name] = probe.records

    def padded(rows):  # fixed shapes, as accelerate's default dispatching needs
        batch = collate_padded(rows, max_seq_len=48)
        return {k: batch[k] for k in ("input_ids", "labels", "position_ids", "seq_idx")}

    for name, config, collate in (
        ("accelerate_shard", DataLoaderConfiguration(dispatch_batches=False), collate_varlen),
        ("accelerate_dispatch", DataLoaderConfiguration(), padded),
    ):
        accelerator = Accelerator(cpu=True, dataloader_config=config)
        model = tiny_llama()
        probe = LossProbe(model, examples, hook=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        loader = DataLoader(PackedIterableDataset(out, seed=3), batch_size=2, collate_fn=collate)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for _ in range(2):  # two epochs, no set_epoch
            for batch in loader:
                kwargs = {"position_ids": batch["position_ids"], "use_cache": False}
                if "seq_idx" in batch:  # padded rows: a 4-D block-causal mask
                    kwargs = {"attention_mask": seq_idx_block_causal_mask(batch["seq_idx"])}
                loss = model(input_ids=batch["input_ids"], labels=batch["labels"], **kwargs).loss
                keep = batch["seq_idx"] >= 0 if "seq_idx" in batch else batch["input_ids"] >= 0
                probe.compare(batch["input_ids"][keep], batch["labels"][keep], float(loss.detach()))
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
        runs[name] = probe.records
    (results / f"rank{rank}.json").write_text(json.dumps(runs))


@pytest.mark.trainers
def test_two_processes_train_every_row_once_per_epoch(marked_pack, tmp_path):
    """HF Trainer (gloo) and accelerate, 2 processes each: no row lost, none twice, no leak."""
    import json

    from tests.helpers import epochs_of, run_two_processes

    run_two_processes(_two_process_runs, marked_pack, tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    examples = list(range(300, 358))
    for name in ("trainer_map", "trainer_iterable", "accelerate_shard", "accelerate_dispatch"):
        records = [rank[name] for rank in ranks]
        assert len(records[0]) == len(records[1]) == 8, name  # 16 rows / (2 × 2) × 2 epochs
        by_rank = [epochs_of(r, 2) for r in records]
        per_epoch = [by_rank[0][e] + by_rank[1][e] for e in range(2)]
        for seen in per_epoch:
            assert sorted(seen) == examples, name  # every example (so every row) exactly once
        assert per_epoch[0] != per_epoch[1], name  # a new order each epoch
        fed = [r for rank in records for r in rank]
        assert max(abs(r["fed"] - r["alone"]) for r in fed) < TOLERANCE, name
        assert max(abs(r["naive"] - r["alone"]) for r in fed) > LEAK, name
