"""check_model: the user's own model on a packed row against each of its segments alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from packshard.errors import PackshardError, UsageError  # noqa: E402
from packshard.torch import (  # noqa: E402
    PackedDataset,
    SeamLeakError,
    check_model,
    check_trainer,
    collate_hf,
    collate_padded,
    collate_varlen,
    padded_block_causal_mask,
)


def _llama(impl="sdpa", cls=None):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        attn_implementation=impl, use_cache=False,
    )  # fmt: skip
    return (cls or transformers.LlamaForCausalLM)(config)


class SelfMaskingLlama(transformers.LlamaForCausalLM):
    """A model that builds its own all-ones mask when none is given (as some wrappers do)."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None, **kw):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            labels=labels,
            **kw,
        )


@pytest.fixture(scope="module")
def rows(marked_pack):
    data = PackedDataset(marked_pack)
    return [data[i] for i in range(3)]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_the_recipes_pass(rows, impl):
    model = _llama(impl)
    model.train()
    assert check_model(model, collate_hf(rows)) < 1e-5
    assert check_model(model, collate_varlen(rows)) < 1e-5  # bookkeeping keys are dropped
    padded = collate_padded(rows[::-1], max_seq_len=64)  # row 0 padded from token 48 on
    mask = padded_block_causal_mask(padded["cu_seqlens"], 64)
    feed = {k: padded[k] for k in ("input_ids", "position_ids", "cu_seqlens")}
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    assert check_model(model, {**feed, "attention_mask": additive}) < 1e-5
    if impl == "sdpa":
        assert check_model(model, {**feed, "attention_mask": mask}) < 1e-5
    else:  # eager adds the mask to the scores: a boolean one bars nothing
        with pytest.raises(SeamLeakError, match="mask: attn_implementation 'eager' does not "):
            check_model(model, {**feed, "attention_mask": mask})
    assert model.training  # the mode is restored


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_a_2d_all_ones_mask_leaks_and_is_named(rows, impl):
    batch = collate_hf(rows)
    leaking = {**batch, "attention_mask": torch.ones_like(batch["input_ids"])}
    with pytest.raises(SeamLeakError) as err:
        check_model(_llama(impl), leaking)
    assert isinstance(err.value, PackshardError) and isinstance(err.value, UsageError)
    message = str(err.value)
    assert message.startswith("the model mixes the segments of a packed row: logits differ")
    assert "mask: a 2-D attention_mask switches off transformers' packed-sequence detection" in (
        message
    )
    no_positions = {k: v for k, v in batch.items() if k != "position_ids"}
    no_positions["cu_seqlens"] = collate_varlen(rows)["cu_seqlens"]
    with pytest.raises(SeamLeakError, match="positions: the batch has no position_ids"):
        check_model(_llama(impl), no_positions)


def test_check_trainer_catches_a_model_the_batch_check_cannot_see(marked_pack, tmp_path):
    from transformers import Trainer, TrainingArguments

    from packshard.torch.hf import fed_segments, row_segments, seams_problem

    data = PackedDataset(marked_pack)
    args = TrainingArguments(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, per_device_train_batch_size=2
    )
    batch = collate_hf([data[0], data[1]])
    expected = [n for i in (0, 1) for n in row_segments(data[i])]
    assert seams_problem(expected, fed_segments(batch)) is None  # the batch is right
    good = Trainer(model=_llama(), args=args, train_dataset=data, data_collator=collate_hf)
    check_trainer(good)
    model = _llama(cls=SelfMaskingLlama)
    bad = Trainer(model=model, args=args, train_dataset=data, data_collator=collate_hf)
    with pytest.raises(SeamLeakError) as err:
        check_trainer(bad)
    assert "attention implementation: SelfMaskingLlama (attn_implementation 'sdpa') does not " in (
        str(err.value)
    )


def test_a_stock_llama_config_passes_and_an_explicit_cache_is_named(rows):
    """A stock config says use_cache=True; the check runs as the loops do, use_cache=False."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    assert config.use_cache
    model = transformers.LlamaForCausalLM(config)
    batch = collate_hf(rows)
    assert check_model(model, batch) < 1e-5
    assert check_model(model, collate_varlen(rows)) < 1e-5
    for cache in (True, None):  # None: the config's True
        with pytest.raises(SeamLeakError) as err:
            check_model(model, {**batch, "use_cache": cache})
        assert str(err.value).endswith(
            "positions: a KV cache is built, which turns off segment detection (use_cache=False)"
        )
    model.train()  # a cache is built in train mode too: the loop's forward leaks
    with torch.no_grad():
        packed = model(**batch).logits[0]
        lo, hi = collate_varlen(rows)["cu_seqlens"][1:3].tolist()
        alone = model(input_ids=batch["input_ids"][:, lo:hi], use_cache=False).logits[0]
    assert float((packed[lo:hi] - alone).abs().max()) > 1e-2
