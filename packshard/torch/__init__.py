"""Stream packed shards into a torch training loop.

Import this subpackage explicitly (``from packshard.torch import …``): it needs torch, which
``import packshard`` never loads.

Typical loop::

    ds = PackedIterableDataset("OUT", seed=0, tokenizer="tokenizer.json")
    loader = ResumableLoader(ds, batch_size=8, collate_fn=collate_varlen, num_workers=2)
    for batch in loader:
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                    use_cache=False,  # a KV cache turns packed-sequence detection off
                    **flash_attn_kwargs(batch))  # or a 4-D mask, see masks
        ...
        ckpt["data"] = loader.state_dict()  # the exact resume point
"""

from packshard.torch.collate import (
    collate_padded,
    collate_varlen,
    count_loss_tokens,
    flash_attn_kwargs,
    loss_normalizers,
    packed_row,
    segment_mean_loss,
    token_losses,
)
from packshard.torch.dataset import PackedDataset, tokenizer_sha256
from packshard.torch.evaluate import evaluate
from packshard.torch.hf import check_trainer, collate_hf
from packshard.torch.layers import SegmentedLayers, packed_segments, segment_layers
from packshard.torch.masks import (
    block_causal_mask,
    document_mask_mod,
    flex_block_mask,
    padded_block_causal_mask,
    seq_idx_block_causal_mask,
    seq_idx_from_cu_seqlens,
)
from packshard.torch.placement import epoch_rows
from packshard.torch.seams import SeamLeakError, check_model
from packshard.torch.stream import PackedIterableDataset, ResumableLoader

__all__ = [
    "PackedDataset",
    "PackedIterableDataset",
    "ResumableLoader",
    "SeamLeakError",
    "SegmentedLayers",
    "block_causal_mask",
    "check_model",
    "check_trainer",
    "collate_hf",
    "collate_padded",
    "collate_varlen",
    "count_loss_tokens",
    "document_mask_mod",
    "epoch_rows",
    "evaluate",
    "flash_attn_kwargs",
    "flex_block_mask",
    "loss_normalizers",
    "packed_row",
    "packed_segments",
    "padded_block_causal_mask",
    "segment_layers",
    "segment_mean_loss",
    "seq_idx_block_causal_mask",
    "seq_idx_from_cu_seqlens",
    "token_losses",
    "tokenizer_sha256",
]
