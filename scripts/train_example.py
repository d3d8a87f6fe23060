"""A minimal training loop on packed shards: the intended use of ``packshard.torch``.

    python scripts/train_example.py                 # packs the embedded demo chats first
    python scripts/train_example.py --data OUT --steps 50 --num-workers 2

A tiny random Llama (hidden 64, 2 layers, sdpa, fp32) trains on CPU for a few steps.  Each
step takes a varlen batch (rows laid end to end, ``[1, T]``) and keeps examples apart with
either a 4-D block-causal mask (``--attention mask``) or position-id packing detection
(``--attention position_ids``, which needs ``use_cache=False`` in transformers 5).  On a GPU
with flash-attention, pass ``**flash_attn_kwargs(batch)`` instead.  The loss is the token mean
over the batch (what ``model(labels=…)`` computes); the per-example mean is printed beside it.
The loader's state is saved at the end: loading it resumes at exactly the next row.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path

import torch

from packshard.torch import (
    PackedIterableDataset,
    ResumableLoader,
    collate_varlen,
    loss_normalizers,
    segment_mean_loss,
    seq_idx_block_causal_mask,
)


def pack_demo(folder: Path) -> tuple[Path, Path]:
    """Pack the embedded demo chats with a throwaway tokenizer; return (OUT, tokenizer)."""
    from packshard.demo import build_demo_tokenizer, demo_data_path
    from packshard.pack.pipeline import PackConfig, pack_dataset

    tok = build_demo_tokenizer(folder / "tokenizer")
    config = PackConfig.build(
        inputs=(str(demo_data_path()),),
        tokenizer=str(tok),
        out=str(folder / "out"),
        max_seq_len=256,
        template="chatml",
    )
    pack_dataset(config)
    return folder / "out", tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="a packshard output folder (default: demo)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-rows", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--attention", choices=("mask", "position_ids"), default="mask")
    args = parser.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    tmp = tempfile.TemporaryDirectory(prefix="packshard-train-")
    tokenizer = None
    if args.data is None:
        args.data, tokenizer = pack_demo(Path(tmp.name))
    dataset = PackedIterableDataset(args.data, seed=0, tokenizer=tokenizer)
    vocab = int(dataset.data.manifest["tokenizer"]["vocab_size"])
    loader = ResumableLoader(
        dataset,
        batch_size=args.batch_rows,
        collate_fn=functools.partial(collate_varlen, pad_to_multiple_of=64),
        num_workers=args.num_workers,
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max(dataset.data.max_seq_len, 64),
        attn_implementation="sdpa",
        use_cache=False,
    )
    model = LlamaForCausalLM(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    print(f"{args.data}: {len(dataset.data)} rows, {len(loader)} batches per epoch")

    step, tokens, start = 0, 0, time.perf_counter()
    while step < args.steps:
        for batch in loader:
            inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
            if args.attention == "mask":
                inputs["attention_mask"] = seq_idx_block_causal_mask(batch["seq_idx"])
            out = model(**inputs, labels=batch["labels"])  # token mean over the batch
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            with torch.no_grad():
                per_example = segment_mean_loss(out.logits, batch["labels"], batch["cu_seqlens"])
                norm = loss_normalizers(batch)
                example_mean = per_example.sum() / norm["num_examples"].clamp(min=1)
            step += 1
            tokens += int(batch["input_ids"].shape[1])
            rate = tokens / (time.perf_counter() - start)
            print(
                f"step {step:3d} epoch {dataset.epoch}  T={batch['input_ids'].shape[1]:4d}  "
                f"examples={int(norm['num_examples']):2d}  loss(token mean)={out.loss.item():.3f}  "
                f"loss(example mean)={example_mean.item():.3f}  {rate:,.0f} tokens/s"
            )
            if step >= args.steps:
                break
    print("loader state:", json.dumps(loader.state_dict(), sort_keys=True))
    tmp.cleanup()


if __name__ == "__main__":
    main()
