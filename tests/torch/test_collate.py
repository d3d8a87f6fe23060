"""Collators, masks and loss helpers; packed-vs-alone equivalence on a tiny Llama and on SDPA."""

from __future__ import annotations

import itertools
import warnings

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from packshard.errors import UsageError  # noqa: E402
from packshard.records import IGNORE_INDEX  # noqa: E402
from packshard.torch import (  # noqa: E402
    block_causal_mask,
    collate_padded,
    collate_varlen,
    document_mask_mod,
    flash_attn_kwargs,
    flex_block_mask,
    loss_normalizers,
    padded_block_causal_mask,
    segment_mean_loss,
    seq_idx_block_causal_mask,
    seq_idx_from_cu_seqlens,
    token_losses,
)

X = IGNORE_INDEX


def row(segments: list[list[int]], labels: list[list[int]] | None = None, first_id: int = 0):
    """A row dict as the datasets return it; default labels: every token but segment starts."""
    ids = [t for s in segments for t in s]
    if labels is None:
        labels = [[X, *s[1:]] for s in segments]
    cu = [0]
    for s in segments:
        cu.append(cu[-1] + len(s))
    return {
        "input_ids": torch.tensor(ids, dtype=torch.int64),
        "labels": torch.tensor([t for s in labels for t in s], dtype=torch.int64),
        "position_ids": torch.tensor([p for s in segments for p in range(len(s))]),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        "example_ids": torch.arange(first_id, first_id + len(segments)),
    }


ROWS = [
    row([[11, 12, 13], [21, 22]], [[X, X, 13], [X, 22]], first_id=0),
    row([[31, 32, 33, 34]], [[X, 32, 33, 34]], first_id=2),
    row([[41], [51, 52]], [[X], [X, 52]], first_id=3),
]


def test_collate_varlen_flattens_rows_and_pads_with_its_own_segment():
    b = collate_varlen(ROWS, pad_to_multiple_of=8, pad_token_id=0)
    assert b["input_ids"].tolist() == [[11, 12, 13, 21, 22, 31, 32, 33, 34, 41, 51, 52, 0, 0, 0, 0]]
    assert b["labels"].tolist() == [[X, X, 13, X, 22, X, 32, 33, 34, X, X, 52, X, X, X, X]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 0, 1, 0, 1, 2, 3]]
    assert b["seq_idx"].tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 4, 4, 5, 5, 5, 5]]
    assert b["cu_seqlens"].tolist() == [0, 3, 5, 9, 10, 12, 16]
    assert b["cu_seqlens"].dtype == torch.int32
    assert b["seq_idx"].dtype == torch.int32
    assert b["input_ids"].dtype == b["labels"].dtype == b["position_ids"].dtype == torch.int64
    assert b["max_seqlen"] == 4
    assert b["num_loss_tokens_per_segment"].tolist() == [1, 1, 3, 0, 1, 0]
    assert b["num_loss_tokens"] == 6
    assert b["example_ids"].tolist() == [0, 1, 2, 3, 4, -1]
    assert flash_attn_kwargs(b)["cu_seq_lens_q"] is b["cu_seqlens"]
    assert flash_attn_kwargs(b)["max_length_k"] == 4


def test_collate_varlen_without_padding_and_with_static_cu_seqlens():
    b = collate_varlen(ROWS, static_cu_seqlens_len=9)
    assert b["input_ids"].shape == (1, 12)
    assert b["cu_seqlens"].tolist() == [0, 3, 5, 9, 10, 12, 12, 12, 12]
    assert b["num_loss_tokens_per_segment"].tolist() == [1, 1, 3, 0, 1, 0, 0, 0]
    assert b["example_ids"].tolist() == [0, 1, 2, 3, 4, -1, -1, -1]
    assert b["seq_idx"].tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 4, 4]]
    with pytest.raises(UsageError) as err:
        collate_varlen(ROWS, static_cu_seqlens_len=5)
    assert str(err.value) == (
        "batch has 5 segments, more than static_cu_seqlens_len 5 allows "
        "(raise static_cu_seqlens_len)"
    )


def test_collate_padded_keeps_padding_out_of_every_segment():
    b = collate_padded(ROWS, max_seq_len=5, pad_token_id=9)
    assert b["input_ids"].tolist() == [
        [11, 12, 13, 21, 22],
        [31, 32, 33, 34, 9],
        [41, 51, 52, 9, 9],
    ]
    assert b["labels"].tolist() == [[X, X, 13, X, 22], [X, 32, 33, 34, X], [X, X, 52, X, X]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0], [0, 0, 1, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]
    assert b["seq_idx"].tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, -1], [0, 1, 1, -1, -1]]
    assert b["cu_seqlens"].tolist() == [[0, 3, 5], [0, 4, 4], [0, 1, 3]]
    assert b["num_loss_tokens_per_segment"].tolist() == [[1, 1], [3, 0], [0, 1]]
    assert b["num_tokens"].tolist() == [5, 4, 3]
    with pytest.raises(UsageError, match="row 0 has 4 tokens > max_seq_len 3"):
        collate_padded(ROWS[1:], max_seq_len=3)


def test_block_causal_mask_matches_the_hand_drawn_one():
    cu = torch.tensor([0, 3, 5, 6], dtype=torch.int32)
    assert seq_idx_from_cu_seqlens(cu, 8).tolist() == [0, 0, 0, 1, 1, 2, -1, -1]
    got = block_causal_mask(cu, total_len=8).int().tolist()
    assert got == [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 0, 1],
    ]
    padded = padded_block_causal_mask(torch.tensor([[0, 3, 5, 6], [0, 2, 2, 2]]), 8)
    assert padded.shape == (2, 1, 8, 8)
    assert torch.equal(padded[0, 0], block_causal_mask(cu, total_len=8))
    assert torch.equal(padded[1, 0], block_causal_mask(torch.tensor([0, 2]), total_len=8))
    b = collate_padded(ROWS, max_seq_len=6)
    assert torch.equal(
        seq_idx_block_causal_mask(b["seq_idx"]), padded_block_causal_mask(b["cu_seqlens"], 6)
    )


def test_document_mask_mod_and_flex_block_mask_on_cpu():
    seq = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1]], dtype=torch.int32)
    mod = document_mask_mod(seq)
    q = torch.arange(8).view(8, 1)
    kv = torch.arange(8).view(1, 8)
    zero = torch.zeros((), dtype=torch.int64)
    dense = mod(zero, zero, q, kv)
    assert torch.equal(dense, seq_idx_block_causal_mask(seq)[0, 0])

    # A real BlockMask over 3 blocks of 128: segments 0..199 and 200..383; block (2, 0) is empty.
    cu = torch.tensor([0, 200, 384])
    seq_long = seq_idx_from_cu_seqlens(cu, 384).unsqueeze(0)
    block_mask = flex_block_mask(seq_long, device="cpu")
    assert block_mask.to_dense()[0, 0].tolist() == [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    from torch.nn.attention.flex_attention import flex_attention

    torch.manual_seed(0)
    qkv = torch.randn(3, 1, 2, 384, 16)
    want = F.scaled_dot_product_attention(*qkv, attn_mask=block_causal_mask(cu))
    with warnings.catch_warnings():  # eager flex attention warns once per process
        warnings.simplefilter("ignore", UserWarning)
        got = flex_attention(*qkv, block_mask=block_mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_loss_helpers_count_and_average_per_segment():
    b = collate_varlen(ROWS, pad_to_multiple_of=8)
    norm = loss_normalizers(b)
    assert norm["num_loss_tokens"].item() == 6
    assert norm["num_examples"].item() == 4  # segment 3 (a lone first token) has no target
    torch.manual_seed(0)
    logits = torch.randn(1, 16, 60)
    labels = b["labels"].clamp(max=59).masked_fill(b["labels"] == X, X)
    per_token = token_losses(logits, labels)
    assert per_token.shape == (1, 16)
    hf_mean = F.cross_entropy(logits[0, :-1], labels[0, 1:], ignore_index=X)
    torch.testing.assert_close(per_token.sum() / norm["num_loss_tokens"], hf_mean)
    means = segment_mean_loss(logits, labels, b["cu_seqlens"])
    assert means.shape == (6,)
    seg2 = F.cross_entropy(logits[0, 5:8], labels[0, 6:9])  # tokens 6..8 predicted by 5..7
    torch.testing.assert_close(means[2], seg2)
    assert means[3].item() == 0.0 and means[5].item() == 0.0


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        attn_implementation="sdpa",
        dtype="float32",
    )
    return transformers.LlamaForCausalLM(config).eval()


def random_rows(seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    rows, next_id = [], 0
    for lengths in ([7, 3, 12], [20], [1, 9, 5, 2]):
        segs = [torch.randint(0, 128, (n,), generator=g).tolist() for n in lengths]
        rows.append(row(segs, first_id=next_id))
        next_id += len(segs)
    return rows


def alone(model, ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = model(input_ids=ids[None], labels=labels[None])
    return out.logits[0], out.loss


@pytest.mark.torch
@pytest.mark.parametrize("path", ["4d_block_causal_mask", "position_ids_use_cache_false"])
def test_tiny_llama_packed_varlen_batch_equals_each_example_alone(path):
    """The two ways to feed a varlen batch to a Hugging Face sdpa model on CPU.

    4-D mask: transformers uses a 4-D ``attention_mask`` unchanged.  Position ids only:
    transformers 5 detects packing from position restarts, but only when no cache is in play;
    with the default ``use_cache=True`` it builds a cache and attends across segments.
    """
    model = tiny_llama()
    rows = random_rows(1)
    b = collate_varlen(rows, pad_to_multiple_of=16)
    kwargs = {"input_ids": b["input_ids"], "position_ids": b["position_ids"]}
    if path == "4d_block_causal_mask":
        kwargs["attention_mask"] = seq_idx_block_causal_mask(b["seq_idx"])
    else:
        kwargs["use_cache"] = False
    with torch.no_grad():
        out = model(**kwargs, labels=b["labels"])
    cu = b["cu_seqlens"].tolist()
    per_segment = segment_mean_loss(out.logits, b["labels"], b["cu_seqlens"])
    flat_rows = [(r, j) for r in rows for j in range(r["cu_seqlens"].shape[0] - 1)]
    for s, (r, j) in enumerate(flat_rows):
        lo, hi = int(r["cu_seqlens"][j]), int(r["cu_seqlens"][j + 1])
        logits, loss = alone(model, r["input_ids"][lo:hi], r["labels"][lo:hi])
        torch.testing.assert_close(out.logits[0, cu[s] : cu[s + 1]], logits, atol=2e-5, rtol=1e-4)
        if hi - lo > 1:
            torch.testing.assert_close(per_segment[s], loss, atol=2e-5, rtol=1e-4)
    # The model's own loss is the token mean over the whole packed batch.
    total = token_losses(out.logits, b["labels"]).sum() / loss_normalizers(b)["num_loss_tokens"]
    torch.testing.assert_close(out.loss, total, atol=1e-5, rtol=1e-5)


@pytest.mark.torch
def test_sdpa_with_block_causal_mask_on_padded_batch_equals_each_example_alone():
    torch.manual_seed(0)
    rows = random_rows(2)
    b = collate_padded(rows, max_seq_len=24)
    mask = padded_block_causal_mask(b["cu_seqlens"], 24)
    heads, dim = 2, 8
    embed = torch.randn(128, heads * dim)

    def attend(ids: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        x = embed[ids].view(*ids.shape, heads, dim).transpose(-2, -3)  # [B, H, L, D]
        return F.scaled_dot_product_attention(
            x, x * 0.5, x, attn_mask=attn_mask, is_causal=attn_mask is None
        )

    packed = attend(b["input_ids"], mask)
    assert not torch.isnan(packed).any()  # padding rows attend to themselves
    for bi, r in enumerate(rows):
        cu = r["cu_seqlens"].tolist()
        for lo, hi in itertools.pairwise(cu):
            single = attend(r["input_ids"][lo:hi][None], None)[0]
            torch.testing.assert_close(packed[bi, :, lo:hi], single, atol=1e-6, rtol=1e-5)
    # The naive causal mask over the same rows leaks: a later segment sees an earlier one.
    naive = attend(b["input_ids"], None)
    assert not torch.allclose(naive[0, :, 7:10], packed[0, :, 7:10])
