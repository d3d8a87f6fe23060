"""Benchmark: tokens/s delivered as collated torch batches, packed shards vs the usual path.

Data: a synthetic corpus (log-normal example lengths, random token ids, the first 30% of every
example without loss) of at least --tokens tokens.  The same examples are written twice:

* packed: next-fit into rows of --max-seq-len, written with packshard's shard writer
  (Parquet, zstd, no dictionary), read with PackedIterableDataset + collate_varlen, from the
  Parquet files and from the optional memory-mapped Arrow IPC cache (``cache_dir``);
* unpacked: a Hugging Face ``datasets`` folder (save_to_disk / load_from_disk), read with a
  DataLoader + transformers' DataCollatorWithFlattening.

Both loaders run in this process (num_workers=0) with about the same tokens per batch.

Usage: python scripts/bench_reader.py [--tokens 20000000] [--max-seq-len 4096]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import DataLoader

from packshard.format.manifest import write_manifest
from packshard.format.shards import SHARD_SCHEMA, write_shard
from packshard.format.version import FORMAT_VERSION
from packshard.records import IGNORE_INDEX
from packshard.torch import PackedDataset, PackedIterableDataset, collate_varlen

VOCAB = 32000


def make_examples(tokens: int, max_seq_len: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (lengths int64, offsets int64) of synthetic examples totalling >= tokens."""
    rng = np.random.default_rng(seed)
    n = int(tokens / 300 * 1.3) + 16
    lengths = np.clip(rng.lognormal(np.log(300), 0.9, size=n), 8, max_seq_len).astype(np.int64)
    keep = int(np.searchsorted(np.cumsum(lengths), tokens)) + 1
    lengths = lengths[:keep]
    return lengths, np.concatenate([[0], np.cumsum(lengths)])


def next_fit(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Row offsets into the example list: consecutive examples until the row is full."""
    bounds, used = [0], 0
    for i, n in enumerate(lengths.tolist()):
        if used + n > capacity:
            bounds.append(i)
            used = 0
        used += n
    bounds.append(len(lengths))
    return np.asarray(bounds, dtype=np.int64)


def build_corpus(folder: Path, tokens: int, max_seq_len: int, shard_rows: int) -> dict:
    lengths, offsets = make_examples(tokens, max_seq_len, seed=0)
    total = int(offsets[-1])
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, size=total, dtype=np.int32)
    positions = (np.arange(total) - np.repeat(offsets[:-1], lengths)).astype(np.int32)
    prompt_len = np.repeat(np.maximum(1, lengths * 3 // 10), lengths)
    labels = np.where(positions < prompt_len, IGNORE_INDEX, ids).astype(np.int32)

    packed = folder / "packed"
    packed.mkdir(parents=True)
    rows = next_fit(lengths, max_seq_len)
    entries = []
    for k, lo in enumerate(range(0, len(rows) - 1, shard_rows)):
        r = rows[lo : min(lo + shard_rows, len(rows) - 1) + 1]  # example bounds of these rows
        ex0, ex1 = int(r[0]), int(r[-1])
        t0 = int(offsets[ex0])
        tok_off = (offsets[r] - t0).astype(np.int32)
        seg_len = lengths[ex0:ex1]
        row_of_seg = np.repeat(np.arange(len(r) - 1), np.diff(r))
        ends = offsets[ex0 + 1 : ex1 + 1] - offsets[r[row_of_seg]]
        cu_off = (r - ex0) + np.arange(len(r))
        cu_val = np.zeros(len(seg_len) + len(r) - 1, dtype=np.int32)
        is_end = np.ones(len(cu_val), dtype=bool)
        is_end[cu_off[:-1]] = False
        cu_val[is_end] = ends
        lab = labels[t0 : int(offsets[ex1])]
        loss = np.add.reduceat((lab != IGNORE_INDEX).astype(np.int64), tok_off[:-1])
        table = pa.Table.from_arrays(
            [
                pa.ListArray.from_arrays(tok_off, ids[t0 : int(offsets[ex1])]),
                pa.ListArray.from_arrays(tok_off, lab),
                pa.ListArray.from_arrays(tok_off, positions[t0 : int(offsets[ex1])]),
                pa.ListArray.from_arrays(cu_off.astype(np.int32), cu_val),
                pa.ListArray.from_arrays((r - ex0).astype(np.int32), np.arange(ex0, ex1)),
                pa.array(np.diff(tok_off).astype(np.int32)),
                pa.array(loss.astype(np.int32)),
                pa.array(np.maximum.reduceat(seg_len, (r - ex0)[:-1]).astype(np.int32)),
            ],
            schema=SHARD_SCHEMA,
        )
        entries.append(write_shard(table, packed, f"shard-{k:05d}.parquet", "bench", "zstd"))
    manifest = {
        "format_version": FORMAT_VERSION,
        "dataset_id": "bench",
        "config": {"max_seq_len": max_seq_len},
        "tokenizer": {
            "path": "tokenizer.json",
            "sha256": "0" * 64,
            "vocab_size": VOCAB,
            "bos_token_id": None,
            "eos_token_id": None,
            "pad_token_id": None,
        },
        "shards": [e.to_dict() for e in entries],
        "stats": {"rows": len(rows) - 1, "tokens": total},
    }
    write_manifest(packed, manifest)

    import datasets

    ex_off = pa.array(offsets.astype(np.int32))
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(ex_off, ids),
            "labels": pa.ListArray.from_arrays(ex_off, labels),
        }
    )
    datasets.Dataset(table).save_to_disk(str(folder / "hf"))
    return {"examples": len(lengths), "rows": len(rows) - 1, "tokens": total}


def measure(loader, limit_s: float) -> tuple[int, int, float]:
    """Iterate until exhausted or limit_s; return (tokens, batches, seconds)."""
    tokens = batches = 0
    start = time.perf_counter()
    for batch in loader:
        tokens += int(batch["input_ids"].shape[-1])
        batches += 1
        if time.perf_counter() - start > limit_s:
            break
    return tokens, batches, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=20_000_000)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--rows-per-batch", type=int, default=8)
    parser.add_argument("--hf-seconds", type=float, default=15.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="bench-reader-"))
    try:
        t = time.perf_counter()
        info = build_corpus(folder, args.tokens, args.max_seq_len, shard_rows=1024)
        print(
            f"synthetic corpus (log-normal lengths, random ids): {info['tokens']:,} tokens, "
            f"{info['examples']:,} examples -> {info['rows']:,} rows of <= {args.max_seq_len} "
            f"(built in {time.perf_counter() - t:.1f} s)"
        )
        examples_per_batch = round(info["examples"] / info["rows"] * args.rows_per_batch)

        t = time.perf_counter()
        ds = PackedDataset(folder / "packed")
        for k in range(len(ds.shard_paths)):
            ds._shard(k)
        decode = info["tokens"] / (time.perf_counter() - t)
        print(f"Parquet decode into Arrow buffers: {decode / 1e6:.0f} M tokens/s")

        results = {}
        runs = [
            ("packed Parquet, epoch 0 (decodes)", None, 2),
            ("packed Arrow IPC cache, first run (decodes, writes cache)", folder / "cache", 1),
            ("packed Arrow IPC cache, fresh dataset (memory-mapped)", folder / "cache", 2),
        ]
        for label, cache, epochs in runs:
            packed = PackedIterableDataset(folder / "packed", seed=0, cache_dir=cache)
            loader = DataLoader(packed, batch_size=args.rows_per_batch, collate_fn=collate_varlen)
            for epoch in range(epochs):
                tokens, batches, sec = measure(loader, 1e9)
                name = label if epoch == 0 else label.split(",")[0] + ", epoch 1 (warm)"
                results[name] = tokens / sec
                print(
                    f"{name}: {tokens:,} tokens in {batches} batches, {sec:.2f} s -> "
                    f"{tokens / sec / 1e6:.1f} M tokens/s"
                )

        import datasets
        from transformers import DataCollatorWithFlattening

        hf = datasets.load_from_disk(str(folder / "hf"))
        hf_loader = DataLoader(
            hf,
            batch_size=examples_per_batch,
            shuffle=True,
            collate_fn=DataCollatorWithFlattening(return_flash_attn_kwargs=True),
        )
        tokens, batches, sec = measure(hf_loader, args.hf_seconds)
        hf_rate = tokens / sec
        print(
            f"datasets + DataCollatorWithFlattening ({examples_per_batch} examples/batch): "
            f"{tokens:,} tokens in {batches} batches, {sec:.2f} s -> "
            f"{hf_rate / 1e6:.2f} M tokens/s"
        )
        for label, rate in results.items():
            print(f"ratio {label} / usual path: {rate / hf_rate:.1f}x")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
