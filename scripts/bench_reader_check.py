"""Benchmark: what the torch reader's checks cost, on the first batch and on a whole epoch.

When the reader opens a shard it reads it once, hashing it as it streams in (SHA-256 against
the manifest), decodes those bytes, and checks token ids against the vocabulary and labels
against their tokens; a cache entry is hashed at each open too.  This script times the same
reads with those checks and with them switched off (the hash replaced by a plain read, the
token check by nothing), in this process, on a synthetic corpus written with packshard's own
shard writer (``scripts/bench_reader.py``'s).

* first batch: open the folder, collate the first ``--rows-per-batch`` rows (one shard decoded);
* epoch: every row through ``PackedIterableDataset`` + ``collate_varlen``, from Parquet and from
  a fresh dataset over the warm Arrow IPC cache (memory-mapped).

Each figure is the median of ``--repeat`` runs of each side, alternated, the file pages warm
(the same state for both), in wall-clock and in CPU time.

Usage: python scripts/bench_reader_check.py [--tokens 16000000] [--shard-rows 2048]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_reader import build_corpus

import packshard.torch.dataset as reader
from packshard.torch import PackedDataset, PackedIterableDataset, collate_varlen

SHAS: dict[str, str] = {}
"""Each shard's path and its manifest SHA-256, claimed by the unchecked read."""


def _plain_read(fh: BinaryIO) -> tuple[bytes, str]:
    return fh.read(), SHAS[os.readlink(f"/proc/self/fd/{fh.fileno()}")]


def _unhashed_map(cache: Path, expected: str) -> pa.Table:
    with open(cache, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapped))).read_all()


@contextmanager
def unchecked() -> Iterator[None]:
    """Switch the reader's checks off: a plain read, no token check, no cache hash."""
    names = ("read_hashed", "tokens_problem", "_mapped")
    saved = [getattr(reader, n) for n in names]
    stubs = [_plain_read, lambda table, vocab: None, _unhashed_map]
    for name, stub in zip(names, stubs, strict=True):
        setattr(reader, name, stub)
    try:
        yield
    finally:
        for name, old in zip(names, saved, strict=True):
            setattr(reader, name, old)


def first_batch(out: Path, rows: int, cache: Path | None) -> float:
    start = time.perf_counter()
    ds = PackedDataset(out, cache_dir=cache)
    collate_varlen([ds[i] for i in range(rows)])
    return time.perf_counter() - start


def epoch(out: Path, rows: int, cache: Path | None) -> float:
    start = time.perf_counter()
    data = PackedIterableDataset(out, seed=0, cache_dir=cache)
    for _ in DataLoader(data, batch_size=rows, collate_fn=collate_varlen):
        pass
    return time.perf_counter() - start


def compare(name: str, run: Callable[[], float], repeat: int, tokens: int | None) -> None:
    """Print the medians of ``run`` with the checks and without, and the difference.

    The two sides alternate, so a colleague's load on the machine falls on both alike; each
    run is timed in wall-clock seconds and in this process's CPU seconds (which another
    process's load barely moves).
    """
    sides: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(repeat):
        for checked in (True, False):
            cpu = time.process_time()
            if checked:
                wall = run()
            else:
                with unchecked():
                    wall = run()
            sides[checked].append((wall, time.process_time() - cpu))
    for i, unit in ((0, "wall"), (1, "CPU")):
        on = statistics.median(t[i] for t in sides[True])
        off = statistics.median(t[i] for t in sides[False])
        rate = ""
        if tokens is not None:
            rate = f"; {tokens / on / 1e6:.1f} vs {tokens / off / 1e6:.1f} M tokens/s"
        print(
            f"{name} ({unit}): checked {on * 1e3:.0f} ms, unchecked {off * 1e3:.0f} ms, "
            f"+{(on - off) * 1e3:.0f} ms ({(on / off - 1) * 100:+.1f}%){rate}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=16_000_000)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--shard-rows", type=int, default=2048)
    parser.add_argument("--rows-per-batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp(prefix="bench-check-"))
    try:
        info = build_corpus(folder, args.tokens, args.max_seq_len, shard_rows=args.shard_rows)
        out, cache = folder / "packed", folder / "cache"
        manifest = json.loads((out / "manifest.json").read_text())
        SHAS.update({str(out / s["path"]): s["sha256"] for s in manifest["shards"]})
        shards = sorted(out.glob("shard-*.parquet"))
        size = sum(p.stat().st_size for p in shards)
        print(
            f"synthetic corpus: {info['tokens']:,} tokens, {info['rows']:,} rows of <= "
            f"{args.max_seq_len}, {len(shards)} shards of {args.shard_rows} rows "
            f"({size / len(shards) / 1e6:.1f} MB each, zstd)"
        )
        b, tokens = args.rows_per_batch, info["tokens"]
        epoch(out, b, cache)  # writes the cache entries and warms every file's pages
        compare("first batch, Parquet", lambda: first_batch(out, b, None), args.repeat, None)
        compare("first batch, cache", lambda: first_batch(out, b, cache), args.repeat, None)
        compare("epoch, Parquet", lambda: epoch(out, b, None), args.repeat, tokens)
        compare("epoch, cache", lambda: epoch(out, b, cache), args.repeat, tokens)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
