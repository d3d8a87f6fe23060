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
