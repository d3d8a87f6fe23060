"""A plain training loop: a tiny random Qwen2.5-VL trained on packed image-text rows, on CPU.

The recipe of ``docs/vision.md``: ``PackedVisionDataset`` serves each packed row with its
pixels (loaded and hash-checked in the DataLoader's workers), its grids and its four-row
positions; ``collate_vision`` stacks rows into one packed batch row; the model's own loss
(labels shifted inside, ``-100`` skipped) trains it.  Nothing here knows about seams: the
text row of ``position_ids`` tells transformers where each example starts.

Usage: python scripts/train_vlm_example.py OUT [--steps 8] [--rows-per-step 1] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packshard.torch.vision import PackedVisionDataset, collate_vision
from packshard.torch.vision.tiny import tiny_qwen25_vl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rows-per-step", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--media-root", default=None)
    args = parser.parse_args()
    rows = PackedVisionDataset(args.out, media_root=args.media_root)
    loader = DataLoader(
        rows,
        batch_size=args.rows_per_step,
        shuffle=True,
        num_workers=args.workers,
        collate_fn=collate_vision,
        generator=torch.Generator().manual_seed(0),
    )
    model = tiny_qwen25_vl().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step, start = 0, time.perf_counter()
    while step < args.steps:
        for batch in loader:
            loss = model(**batch, use_cache=False).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            images = len(batch.get("image_grid_thw", []))
            print(
                f"step {step}: loss {loss.item():.4f}  tokens {batch['input_ids'].shape[1]}  "
                f"images {images}  ({time.perf_counter() - start:.1f} s)"
            )
            if step == args.steps:
                break


if __name__ == "__main__":
    main()
