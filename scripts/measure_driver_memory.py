"""Measure the driver's peak memory per example: tiny records at two sizes, the slope between.

    python scripts/measure_driver_memory.py                      # 200k and 2M records
    python scripts/measure_driver_memory.py --small 20000 --large 200000 --workers 1
    python scripts/measure_driver_memory.py --stages             # and each stage's peak

Every record is ``{"text":"a"}`` (one or two tokens), so the per-example state of the driver
dominates and the per-token state is negligible.  Each size packs in its own subprocess; its
peak RSS is ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` read by a fresh wrapper process, so one
measurement never sees another.  The figure reported is

    (peak RSS at --large  -  peak RSS at --small) / (large - small)   bytes per example

which cancels the fixed base (interpreter, numpy, pyarrow, the tokenizer, one shard).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACK = "import sys; from packshard.cli.commands import main; sys.argv[0] = 'packshard'; main()"
STAGED = """
import sys, threading, time, traceback
from packshard.cli.commands import main
sys.argv[0] = "packshard"
STAGES = ("map_unit", "merge_units", "plan_examples", "pack_stats", "write_shards_on", "pack_spill")
peaks, driver = {}, threading.get_ident()
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096
def sample():
    while True:
        frame = sys._current_frames().get(driver)
        names = [f.name for f in traceback.extract_stack(frame)] if frame else []
        stage = next((s for s in STAGES if s in names), None)
        if stage == "pack_spill":  # a step of its own: the function pack_spill is in
            stage = "pack_spill>" + (names[names.index(stage) + 1:] or ["-"])[0]
        if stage is not None:
            peaks[stage] = max(peaks.get(stage, 0), rss())
        time.sleep(0.005)
threading.Thread(target=sample, daemon=True).start()
try:
    main()
finally:
    for stage, peak in sorted(peaks.items(), key=lambda kv: -kv[1]):
        print("STAGE", stage, peak, file=sys.stderr)
"""
WRAP = (
    "import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
    "print('PEAK_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
    "sys.exit(rc)"
)


def write_tiny(path: Path, n: int) -> None:
    line = b'{"text":"a"}\n'
    block = line * 100_000
    with open(path, "wb") as fh:
        for _ in range(n // 100_000):
            fh.write(block)
        fh.write(line * (n % 100_000))


def peak(cmd: list[str]) -> tuple[int, float, dict[str, int]]:
    """Run ``cmd`` under the wrapper; return its peak RSS in KiB, wall seconds, stage peaks.

    The stage peaks (bytes) come only from a ``cmd`` run by :data:`STAGED`.
    """
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", WRAP, *cmd], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"pack failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    kib = [int(ln.split()[1]) for ln in proc.stderr.splitlines() if ln.startswith("PEAK_KIB")]
    stages = {ln.split()[1]: int(ln.split()[2]) for ln in proc.stderr.splitlines()
              if ln.startswith("STAGE ")}  # fmt: skip
    return kib[-1], seconds, stages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=200_000)
    parser.add_argument("--large", type=int, default=2_000_000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=None, help="Keep data and outputs here.")
    parser.add_argument(
        "--stages",
        action="store_true",
        help="Also sample the RSS every 5 ms and report each stage's peak at both sizes "
        "(the sampling thread adds a little time, not memory).",
    )
    args = parser.parse_args()

    from packshard.demo import build_demo_tokenizer

    work = args.work or Path(tempfile.mkdtemp(prefix="packshard-drvmem-"))
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = args.tokenizer or build_demo_tokenizer(work / "tokenizer")
    figures: dict[int, int] = {}
    stages: dict[int, dict[str, int]] = {}
    try:
        for n in (args.small, args.large):
            data = work / f"tiny-{n}.jsonl"
            write_tiny(data, n)
            out = work / f"out-{n}"
            runner = STAGED if args.stages else PACK
            cmd = [sys.executable, "-c", runner, "pack", str(data), "-t", str(tokenizer)]
            cmd += ["--max-seq-len", str(args.max_seq_len), "-o", str(out), "--overwrite"]
            cmd += ["--workers", str(args.workers), "--no-progress"]
            kib, seconds, stages[n] = peak(cmd)
            figures[n] = kib
            print(f"{n:>10,} records  peak RSS {kib / 1024:8.1f} MiB  {seconds:6.1f} s", flush=True)
            data.unlink()
            shutil.rmtree(out, ignore_errors=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    slope = (figures[args.large] - figures[args.small]) * 1024 / (args.large - args.small)
    if args.stages:
        small, large = stages[args.small], stages[args.large]
        print(f"{'stage':<36} {'peak MiB':>9} {'peak MiB':>9} {'bytes/example':>14}")
        for stage in sorted(large, key=lambda s: -large[s]):
            base = small.get(stage, 0)
            per = (large[stage] - base) / (args.large - args.small) if base else float("nan")
            print(f"{stage:<36} {base / 2**20:9.1f} {large[stage] / 2**20:9.1f} {per:14.1f}")
    print(f"driver memory per example: {slope:.1f} bytes "
          f"({args.small:,} -> {args.large:,} records, --workers {args.workers})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
