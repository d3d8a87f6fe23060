"""Measure the peak memory of ``packshard pack`` on synthetic datasets of growing size.

    python scripts/measure_memory.py                         # 20k and 200k records
    python scripts/measure_memory.py --sizes 10000 100000 --max-seq-len 4096

The claim under test: peak memory is bounded by the per-example arrays plus one shard, so a
dataset 10x larger packs in about the same peak RSS.  Each dataset is a JSONL file of ``text``
records (pseudo-words, lognormal lengths, fixed seed), tokenized with the offline demo BPE.
Every pack runs in its own process; its peak RSS comes from ``/usr/bin/time -v`` when present,
else from ``getrusage(RUSAGE_CHILDREN)`` in a fresh wrapper process.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PACK = "import sys; from packshard.cli.commands import main; sys.argv[0] = 'packshard'; main()"
WRAP = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
    "print('Maximum resident set size (kbytes):', "
    "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)"
)


def make_words(rng: np.random.Generator, count: int = 5000) -> list[str]:
    letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
    sizes = rng.integers(2, 10, size=count)
    return ["".join(rng.choice(letters, size=int(k))) for k in sizes]


def write_dataset(path: Path, n: int, median_words: int, seed: int = 0) -> int:
    """Write ``n`` text records; return the file size in bytes."""
    rng = np.random.default_rng(seed)
    words = np.array(make_words(rng))
    lengths = np.clip(np.round(rng.lognormal(np.log(median_words), 0.8, n)), 1, 20 * median_words)
    with open(path, "w", encoding="utf-8") as fh:
        for k, length in enumerate(lengths.astype(np.int64)):
            text = " ".join(words[rng.integers(0, len(words), size=int(length))])
            fh.write(json.dumps({"text": text, "domain": f"d{k % 4}"}) + "\n")
    return path.stat().st_size


def peak_rss_kib(cmd: list[str]) -> tuple[int, float, str]:
    """Run ``cmd``; return its peak RSS in KiB, wall seconds and stderr."""
    if Path("/usr/bin/time").exists():
        full = ["/usr/bin/time", "-v", *cmd]
    else:
        full = [sys.executable, "-c", WRAP, *cmd]
    start = time.perf_counter()
    proc = subprocess.run(full, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"pack failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    if match is None:
        raise SystemExit(f"no peak RSS in the output of {full[0]}:\n{proc.stderr}")
    return int(match.group(1)), seconds, proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--median-words", type=int, default=60)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--shard-rows", type=int, default=8192)  # the CLI default
    parser.add_argument("--work", type=Path, default=None, help="Keep data and outputs here.")
    args = parser.parse_args()

    from packshard.demo import build_demo_tokenizer

    work = args.work or Path(tempfile.mkdtemp(prefix="packshard-mem-"))
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = build_demo_tokenizer(work / "tokenizer")
    results = []
    try:
        for n in args.sizes:
            data = work / f"synthetic-{n}.jsonl"
            size = write_dataset(data, n, args.median_words)
            out = work / f"out-{n}"
            cmd = [sys.executable, "-c", PACK, "pack", str(data), "-t", str(tokenizer)]
            cmd += ["--max-seq-len", str(args.max_seq_len), "-o", str(out), "--overwrite"]
            cmd += ["--shard-rows", str(args.shard_rows), "--no-progress"]
            kib, seconds, _ = peak_rss_kib(cmd)
            manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
            stats = manifest["stats"]
            results.append((n, size, stats["tokens"], len(manifest["shards"]), kib, seconds))
            print(
                f"{n:>9,} records  {size / 2**20:8.1f} MiB jsonl  {stats['tokens']:>12,} tokens  "
                f"{len(manifest['shards']):>4} shards  peak RSS {kib / 1024:8.1f} MiB  "
                f"{seconds:6.1f} s",
                flush=True,
            )
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if len(results) >= 2:
        (n0, *_, k0, _), (n1, *_, k1, _) = results[0], results[-1]
        print(f"records x{n1 / n0:.1f} -> peak RSS x{k1 / k0:.2f} ({k0 / 1024:.0f} -> "
              f"{k1 / 1024:.0f} MiB)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
