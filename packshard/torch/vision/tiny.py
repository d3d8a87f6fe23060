r"""A tiny random Qwen2.5-VL, and packed rows compared with their examples alone.

The model is transformers' own ``Qwen2_5_VLForConditionalGeneration`` shrunk to two text
layers of width 64 and a two-block vision tower (about 20M parameters, nearly all of them the
151,936-token embedding), fp32 on CPU, seeded.  ``compare_row`` runs a packed row with its
four-row positions and each segment alone (its own three rotary rows, its own images), and
the three position forms a packer can get wrong on the same row::

    form                       what transformers does with it         must
    4 rows (text + 3 rotary)   seams from the text row: block-causal  equal alone (<= 1e-4)
    1 row (text positions)     one sequence, 1-D rotary               differ
    3 rotary rows, restarted   no text row: one causal sequence       differ
    4 rows, none restarted     no seam in the text row                differ

Rotary positions are relative, so a segment's positions shifted by a constant change nothing
by themselves: the last two controls fail because the model then sees no seam and attends
across it, which is what a packer that does not restart them produces.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from packshard.torch.vision.rope import mrope_positions, packed_positions

TINY_SEED = 0


def tiny_qwen25_vl(vocab_size: int = 151936, patch_size: int = 14) -> Any:
    """Return a small random-init Qwen2.5-VL in eval mode (fp32, SDPA attention).

    ``patch_size`` 16 takes a Qwen3-VL pack's pixels: Qwen3-VL places an image's positions
    by the same rule (its ``get_vision_position_ids`` is Qwen2.5-VL's), so the seams are
    proven the same way.
    """
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(TINY_SEED)
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": vocab_size,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e6,
                "mrope_section": [2, 3, 3],
            },
        },
        vision_config={
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "fullatt_block_indexes": [1],
            "window_size": 8 * patch_size,
            "patch_size": patch_size,
        },
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
    )
    config._attn_implementation = "sdpa"
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def _logits(model: Any, ids: torch.Tensor, pixels: Any, grids: Any, positions: Any) -> Any:
    with torch.no_grad():
        return model(
            input_ids=ids[None],
            pixel_values=pixels,
            image_grid_thw=grids,
            position_ids=positions,
            use_cache=False,  # with a cache transformers never looks for seams
        ).logits[0]


def compare_row(model: Any, row: dict[str, Any], image_pad_id: int = 151655) -> dict[str, float]:
    """Return max |Δlogit| of a packed row vs its segments alone, for the row and each control.

    ``row`` is a :class:`~packshard.torch.vision.rows.PackedVisionDataset` row.  The keys:
    ``packed`` (must be small), ``one_row``, ``three_rows``, ``not_restarted`` (must not).
    """
    ids = row["input_ids"].long()
    cu = row["cu_seqlens"].numpy().astype(np.int64)
    grids = row.get("image_grid_thw")
    pixels = row.get("pixel_values")
    grid_list = grids.tolist() if grids is not None else []
    counts = np.asarray([t * h * w for t, h, w in grid_list], np.int64)  # patches per image
    pad = ids.numpy() == image_pad_id
    alone = []
    image_at, patch_at = 0, 0
    for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        seg = ids[lo:hi]
        runs = int(np.count_nonzero(np.diff(np.concatenate(([0], pad[lo:hi].view(np.int8)))) == 1))
        mine = grid_list[image_at : image_at + runs]
        patches = int(counts[image_at : image_at + runs].sum())
        seg_pixels = seg_grids = None
        if runs:
            assert pixels is not None and grids is not None, "image tokens without images"
            seg_pixels = pixels[patch_at : patch_at + patches]
            seg_grids = grids[image_at : image_at + runs]
        positions = torch.from_numpy(mrope_positions(seg.numpy(), mine, image_pad_id))[:, None]
        alone.append(_logits(model, seg, seg_pixels, seg_grids, positions))
        image_at, patch_at = image_at + runs, patch_at + patches

    def moved(positions: torch.Tensor) -> float:
        got = _logits(model, ids, pixels, grids, positions)
        return max(
            float((got[lo:hi] - a).abs().max())
            for lo, hi, a in zip(cu[:-1].tolist(), cu[1:].tolist(), alone, strict=True)
        )

    four = row["position_ids"]
    whole = mrope_positions(ids.numpy(), grid_list, image_pad_id)
    naive = np.concatenate([np.arange(len(ids))[None], whole])
    return {
        "packed": moved(four[:, None]),
        "one_row": moved(four[0][None]),
        "three_rows": moved(four[1:, None]),
        "not_restarted": moved(torch.from_numpy(naive)[:, None]),
    }


__all__ = ["compare_row", "packed_positions", "tiny_qwen25_vl"]
