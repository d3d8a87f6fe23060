"""evaluate: every example's own loss from packed rows, equal to the example run alone."""

from __future__ import annotations

import itertools
import json
import shutil
from collections import Counter

import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from packshard.errors import UsageError  # noqa: E402
from packshard.records import IGNORE_INDEX  # noqa: E402
from packshard.torch import PackedDataset, evaluate  # noqa: E402


def _alone(model, out, split="train"):
    """example_id -> (loss_sum, trained tokens) with every example of ``split`` run by itself."""
    import torch.nn.functional as F

    data, found = PackedDataset(out, split=split), {}
    with torch.no_grad():
        for i in range(len(data)):
            row = data[i]
            cu = row["cu_seqlens"].tolist()
            for k, (lo, hi) in zip(
                row["example_ids"].tolist(), itertools.pairwise(cu), strict=True
            ):
                ids, labels = row["input_ids"][lo:hi], row["labels"][lo:hi]
                logits = model(input_ids=ids[None], use_cache=False).logits[0]
                loss = F.cross_entropy(logits[:-1], labels[1:], reduction="sum")
                found[k] = (float(loss), int((labels[1:] != IGNORE_INDEX).sum()))
    return found


def test_every_examples_packed_loss_is_its_loss_alone(marked_pack):
    from tests.helpers import tiny_llama

    model = tiny_llama()
    model.train()
    records = evaluate(model, marked_pack, split="train", batch_size=3)
    assert model.training  # restored
    alone = _alone(model.eval(), marked_pack)
    assert [r["example_id"] for r in records] == sorted(alone) == list(range(58))
    index = pq.read_table(marked_pack / "examples.parquet").to_pylist()
    worst = 0.0
    for r in records:
        loss_sum, tokens = alone[r["example_id"]]
        assert r["num_tokens"] == tokens == index[r["example_id"]]["num_loss_tokens"]
        assert (r["source"], r["line"]) == (
            index[r["example_id"]]["source"],
            index[r["example_id"]]["line"],
        )
        assert r["loss_mean"] == pytest.approx(r["loss_sum"] / tokens)
        worst = max(worst, abs(r["loss_mean"] - loss_sum / tokens))
    assert worst <= 1e-5, worst


def test_a_stock_llama_is_evaluated_with_its_default_settings(marked_pack):
    """LlamaForCausalLM(config) as built: use_cache=True in its config, default attention."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    assert model.config.use_cache
    records = evaluate(model, marked_pack, split="train", batch_size=4)
    alone = _alone(model.eval(), marked_pack)
    assert [r["example_id"] for r in records] == sorted(alone)
    worst = max(abs(r["loss_sum"] - alone[r["example_id"]][0]) for r in records)
    assert worst <= 1e-4, worst


def test_split_selects_the_shards_that_name_it(marked_pack, tmp_path):
    from tests.helpers import tiny_llama

    with pytest.raises(UsageError) as err:
        evaluate(tiny_llama(), marked_pack, split="eval")
    assert str(err.value) == (
        f"{marked_pack} has no 'eval' split (its shards are ['train']): evaluate one of those, "
        "or pack with --eval-fraction or --eval"
    )
    out = shutil.copytree(marked_pack, tmp_path / "out")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][-1]["split"] = "eval"
    (out / "manifest.json").write_text(json.dumps(manifest))
    last = pq.read_table(out / manifest["shards"][-1]["path"], columns=["example_ids"])
    expected = sorted(k for ids in last.column(0).to_pylist() for k in ids)
    records = evaluate(tiny_llama(), out, split="eval", batch_size=2)
    assert [r["example_id"] for r in records] == expected


def test_a_leaking_model_is_refused_before_any_number(marked_pack):
    import transformers

    from packshard.torch import SeamLeakError
    from tests.helpers import tiny_llama

    class SelfMasking(transformers.LlamaForCausalLM):
        def forward(self, input_ids=None, **kwargs):
            kwargs.setdefault("attention_mask", torch.ones_like(input_ids))
            return super().forward(input_ids=input_ids, **kwargs)

    leaking = SelfMasking(tiny_llama().config)
    with pytest.raises(SeamLeakError):
        evaluate(leaking, marked_pack, split="train")


@pytest.mark.shared_data
def test_packed_evaluation_on_real_chat_data(shared_data, run_pack):
    import transformers

    chat = shared_data / "chat"
    inputs = [
        chat / "openai_cookbook_toy_chat_fine_tuning.jsonl",
        chat / "llamafactory_identity.json",
    ]
    packed = run_pack(inputs, shared_data / "tokenizers" / "phi-3-mini", max_seq_len=256)
    vocab = int(packed.manifest["tokenizer"]["vocab_size"])
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    records = evaluate(model, packed.out, split="train", batch_size=4)
    alone = _alone(model, packed.out)
    assert len(records) == len(alone) == packed.manifest["stats"]["examples"] > 1
    assert packed.manifest["stats"]["rows"] < len(records)  # several examples share rows
    worst = 0.0
    for r in records:
        loss_sum, tokens = alone[r["example_id"]]
        assert r["num_tokens"] == tokens > 0 and r["source"].endswith(tuple(p.name for p in inputs))
        worst = max(worst, abs(r["loss_mean"] - loss_sum / tokens))
    print(f"{len(records)} examples in {packed.manifest['stats']['rows']} rows: worst {worst:.2e}")
    assert worst <= 1e-5


@pytest.mark.shared_data
def test_eval_fraction_split_on_real_chat_data(shared_data, run_pack, tmp_path):
    """--eval-fraction 0.1: same seed same bytes, another seed another split, records once."""
    import transformers

    from tests.helpers import output_digests

    chat = shared_data / "chat"
    inputs = [
        chat / "openai_cookbook_toy_chat_fine_tuning.jsonl",
        chat / "llamafactory_identity.json",
    ]
    tok = shared_data / "tokenizers" / "phi-3-mini"
    options = {"max_seq_len": 256, "eval_fraction": 0.1}
    packed = run_pack(inputs, tok, out=tmp_path / "a", **options)
    again = run_pack(inputs, tok, out=tmp_path / "b", **options)
    other = run_pack(inputs, tok, out=tmp_path / "c", seed=1, **options)
    assert output_digests(packed.out) == output_digests(again.out)

    def records(out, split):
        index = pq.read_table(out / "examples.parquet").to_pydict()
        where = zip(index["source"], index["line"], index["split"], strict=True)
        return Counter((src, line) for src, line, s in where if s == split)

    train, held = records(packed.out, "train"), records(packed.out, "eval")
    assert held and not set(train) & set(held)  # disjoint by record
    assert len(train) + len(held) == packed.manifest["stats"]["records_packed"]
    assert sum(train.values()) + sum(held.values()) == packed.manifest["stats"]["examples"]
    assert set(records(other.out, "eval")) != set(held)
    assert set(records(other.out, "eval")) | set(records(other.out, "train")) == set(train) | set(
        held
    )
    vocab = int(packed.manifest["tokenizer"]["vocab_size"])
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        attn_implementation="sdpa", use_cache=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    found = evaluate(model, packed.out, split="eval", batch_size=2)
    alone = _alone(model, packed.out, split="eval")
    assert [r["example_id"] for r in found] == sorted(alone)
    assert Counter((r["source"], r["line"]) for r in found) == held
    worst = max(abs(r["loss_mean"] - alone[r["example_id"]][0] / r["num_tokens"]) for r in found)
    print(
        f"{len(found)} eval examples of {packed.manifest['stats']['examples']}: worst {worst:.2e}"
    )
    assert worst <= 1e-5
