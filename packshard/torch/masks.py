"""Attention masks that keep packed segments apart: dense SDPA masks and FlexAttention masks.

A query may attend to a key when both are in the same segment and the key is not later
(block-causal).  For segments of 3, 2 and 1 tokens plus 2 padding tokens (``seq_idx``
``[0 0 0 1 1 2 -1 -1]``), ``True`` = attend::

          k: 0 1 2 3 4 5 6 7
    q 0      1 . . . . . . .
    q 1      1 1 . . . . . .
    q 2      1 1 1 . . . . .
    q 3      . . . 1 . . . .
    q 4      . . . 1 1 . . .
    q 5      . . . . . 1 . .
    q 6      . . . . . . 1 .     padding attends only to itself: no all-False row, no NaN
    q 7      . . . . . . . 1

Dense masks cost ``T²`` booleans (256 MiB at T = 16k): for short rows and tests.  On long rows
pass ``cu_seqlens`` to a varlen kernel or build a FlexAttention ``BlockMask``
(:func:`flex_block_mask`).  ``seq_idx`` (from either collator) is the common input.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def seq_idx_from_cu_seqlens(cu_seqlens: torch.Tensor, total_len: int) -> torch.Tensor:
    """Return the segment index of each of ``total_len`` positions; -1 past the last boundary.

    ``cu_seqlens`` ``[S + 1]`` gives ``[total_len]``; ``[B, S + 1]`` gives ``[B, total_len]``.
    Repeated trailing boundaries (empty segments) are allowed.
    """
    cu = cu_seqlens.to(torch.int64)
    positions = torch.arange(total_len, dtype=torch.int64, device=cu.device)
    if cu.ndim == 2:
        positions = positions.expand(cu.shape[0], total_len).contiguous()
    seq = torch.searchsorted(cu[..., 1:].contiguous(), positions, right=True)
    seq = torch.where(positions < cu[..., -1:], seq, -1)
    return seq.to(torch.int32)


def seq_idx_block_causal_mask(seq_idx: torch.Tensor) -> torch.Tensor:
    """Return the block-causal boolean mask ``[B, 1, L, L]`` of ``seq_idx`` ``[B, L]``/``[L]``."""
    seq = seq_idx.reshape(-1, seq_idx.shape[-1])
    length = seq.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=seq.device).tril()
    same = seq.unsqueeze(-1) == seq.unsqueeze(-2)
    real = (seq >= 0).unsqueeze(-1)
    eye = torch.eye(length, dtype=torch.bool, device=seq.device)
    return ((same & causal & real) | eye).unsqueeze(1)


def block_causal_mask(cu_seqlens: torch.Tensor, total_len: int | None = None) -> torch.Tensor:
    """Return the ``[T, T]`` boolean SDPA mask of one flat sequence (``True`` = attend).

    ``total_len`` defaults to ``cu_seqlens[-1]``; positions after it are padding.
    """
    total = int(cu_seqlens[-1]) if total_len is None else total_len
    return seq_idx_block_causal_mask(seq_idx_from_cu_seqlens(cu_seqlens, total))[0, 0]


def padded_block_causal_mask(cu_seqlens: torch.Tensor, max_seq_len: int) -> torch.Tensor:
    """Return the ``[B, 1, L, L]`` mask of a padded batch from its per-row ``cu_seqlens``."""
    return seq_idx_block_causal_mask(seq_idx_from_cu_seqlens(cu_seqlens, max_seq_len))


def document_mask_mod(seq_idx: torch.Tensor) -> Callable[..., torch.Tensor]:
    """Return a FlexAttention ``mask_mod`` for ``seq_idx`` ``[B, L]`` (block-causal, as above)."""
    seq = seq_idx.reshape(-1, seq_idx.shape[-1])

    def mask_mod(
        b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        q_seq, kv_seq = seq[b, q_idx], seq[b, kv_idx]
        inside = (q_seq == kv_seq) & (q_seq >= 0) & (q_idx >= kv_idx)
        return inside | (q_idx == kv_idx)

    return mask_mod


def flex_block_mask(
    seq_idx: torch.Tensor,
    *,
    device: str | torch.device | None = None,
    block_size: int = 128,
) -> object:
    """Build a FlexAttention ``BlockMask`` for ``seq_idx`` ``[B, L]`` on ``device``.

    ``seq_idx`` comes from :func:`~packshard.torch.collate.collate_varlen` (``[1, T]``),
    :func:`~packshard.torch.collate.collate_padded` (``[B, L]``) or
    :func:`seq_idx_from_cu_seqlens`.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    where = torch.device(device) if device is not None else seq_idx.device
    seq = seq_idx.reshape(-1, seq_idx.shape[-1]).to(where)
    batch, length = seq.shape
    return create_block_mask(
        document_mask_mod(seq),
        batch if batch > 1 else None,
        None,
        length,
        length,
        device=where,
        BLOCK_SIZE=block_size,
    )
