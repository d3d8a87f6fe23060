"""Time packing many one-record files against one file holding the same records.

    python scripts/bench_many_files.py                    # 10,000 files, default --workers
    python scripts/bench_many_files.py --files 2000 --workers 2

Each input is one ``{"text": ...}`` line; the single file holds the same lines in the same
order.  Each pack runs as ``packshard pack`` in its own process, so the figure includes
start-up, workers and writing.  Reported: both wall times and their ratio (acceptance: the
many files take at most 2x the one file).
"""

from __future__ import annotations

import argparse
import json
import shutil
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


def time_pack(data: Path, tokenizer: Path, out: Path, extra: list[str]) -> float:
    """Run one pack; return its wall time in seconds."""
    cmd = [sys.executable, "-c", PACK, "pack", str(data), "-t", str(tokenizer)]
    cmd += ["--max-seq-len", "256", "-o", str(out), "--overwrite", "--no-progress", *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"pack failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--workers", default=None, help="--workers for both packs")
    parser.add_argument("--work", type=Path, default=None, help="Keep data and outputs here.")
    args = parser.parse_args()

    from packshard.demo import build_demo_tokenizer

    work = args.work or Path(tempfile.mkdtemp(prefix="packshard-many-"))
    work.mkdir(parents=True, exist_ok=True)
    extra = ["--workers", args.workers] if args.workers else []
    try:
        tokenizer = build_demo_tokenizer(work / "tokenizer")
        many, one = write_inputs(work, args.files)
        one_s = time_pack(one, tokenizer, work / "out-one", extra)
        many_s = time_pack(many, tokenizer, work / "out-many", extra)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"one file of {args.files:,} records: {one_s:6.1f} s")
    print(f"{args.files:,} one-record files:   {many_s:6.1f} s  ({many_s / one_s:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
