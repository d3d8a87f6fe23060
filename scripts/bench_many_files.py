"""Time packing many one-record files against one file holding the same records.

    python scripts/bench_many_files.py                    # 10,000 files, default --workers
    python scripts/bench_many_files.py --files 2000 --workers 2

Each input is one ``{"text": ...}`` line; the single file holds the same lines in the same
order.  Each pack runs as ``packshard pack`` in its own process, so the figure includes
start-up, workers and writing.  The two packs alternate ``--repeat`` times; reported: the
median wall time and CPU time (user + system, the pack and its workers) of each, and their
ratios (acceptance: the many files take at most 2x the one file).  On a machine shared with
other jobs the CPU time is the steadier figure.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACK = "import sys; from packshard.cli.commands import main; sys.argv[0] = 'packshard'; main()"


def write_inputs(folder: Path, count: int) -> tuple[Path, Path]:
    """Write ``count`` one-record files under ``folder/many`` and ``folder/one.jsonl``."""
    many = folder / "many"
    many.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"text": f"record {k} of a small file"}) + "\n" for k in range(count)]
    for k, line in enumerate(lines):
        (many / f"part-{k:05d}.jsonl").write_text(line)
    one = folder / "one.jsonl"
    one.write_text("".join(lines))
    return many, one


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_pack(data: Path, tokenizer: Path, out: Path, extra: list[str]) -> tuple[float, float]:
    """Run one pack; return its wall time and CPU time in seconds."""
    cmd = [sys.executable, "-c", PACK, "pack", str(data), "-t", str(tokenizer)]
    cmd += ["--max-seq-len", "256", "-o", str(out), "--no-progress", *extra]
    shutil.rmtree(out, ignore_errors=True)  # a fresh output each time: no replace checks
    start, cpu = time.perf_counter(), _cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"pack failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return seconds, _cpu() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--workers", default=None, help="--workers for both packs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None, help="Keep data and outputs here.")
    args = parser.parse_args()

    from packshard.demo import build_demo_tokenizer

    work = args.work or Path(tempfile.mkdtemp(prefix="packshard-many-"))
    work.mkdir(parents=True, exist_ok=True)
    extra = ["--workers", args.workers] if args.workers else []
    try:
        tokenizer = build_demo_tokenizer(work / "tokenizer")
        many, one = write_inputs(work, args.files)
        runs: dict[str, list[tuple[float, float]]] = {"one": [], "many": []}
        for _ in range(args.repeat):
            runs["one"].append(time_pack(one, tokenizer, work / "out-one", extra))
            runs["many"].append(time_pack(many, tokenizer, work / "out-many", extra))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    print(f"one file of {args.files:,} records: {wall['one']:6.1f} s wall, {cpu['one']:6.1f} s CPU")
    print(
        f"{args.files:,} one-record files:   {wall['many']:6.1f} s wall, {cpu['many']:6.1f} s CPU"
        f"  ({wall['many'] / wall['one']:.2f}x wall, {cpu['many'] / cpu['one']:.2f}x CPU;"
        f" median of {args.repeat})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
