"""Measure the peak memory of packing many small files, one process against ``--workers 2``.

    python scripts/measure_many_inputs.py                 # 10,000 one-record files
    python scripts/measure_many_inputs.py --files 1000

Each input is one ``{"text": ...}`` line and ``--split-bytes 1`` keeps small inputs from
being gathered, so a work unit is one file and the job's cost is per unit: what a unit
writes beside its part, what travels back, what the driver keeps.  Each run packs in its
own subprocess; the figure is the peak of the summed PSS of its whole process tree (driver,
fork server, workers), sampled from ``/proc`` every 0.2 s, beside the largest single
process's peak (``getrusage(RUSAGE_CHILDREN).ru_maxrss``).  Reported: each peak, the ratio
``--workers 2`` over ``--workers 1`` of the summed peaks (acceptance: at most 2x), and the
largest size the units folder reached (it is removed when the pack ends).
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
WRAP = (
    "import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
    "print('PEAK_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
    "sys.exit(rc)"
)
# the units folder is removed when the pack ends: its size is sampled while it runs
SIZE = "du -sk {work} 2>/dev/null | cut -f1"


def write_files(folder: Path, count: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(count):
        path = folder / f"part-{k:05d}.jsonl"
        path.write_text(json.dumps({"text": f"record {k} of a small file"}) + "\n")
        paths.append(path)
    return paths


def tree_kib(pid: int) -> int:
    """Summed PSS (KiB) of ``pid`` and every descendant (0 for one that has gone).

    PSS shares each page among the processes that map it, so the fork server's pages the
    workers inherit are counted once, not once per worker as summed RSS would.
    """
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += _pss_kib(p)
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration, ValueError):
            continue
    return total


def _pss_kib(pid: int) -> int:
    """PSS of one process (``smaps_rollup``; its RSS where the kernel has no rollup)."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        return next(int(ln.split()[1]) for ln in rollup.splitlines() if ln.startswith("Pss:"))
    except (OSError, StopIteration):
        status = Path(f"/proc/{pid}/status").read_text()
        return next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS"))


def run(cmd: list[str], work: Path) -> tuple[int, int, float, int]:
    """Run ``cmd``; return peak KiB (tree summed, largest process), seconds, largest units KiB."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", WRAP, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    units = tree = 0
    tick = 0
    while proc.poll() is None:
        time.sleep(0.2)
        tree = max(tree, tree_kib(proc.pid))
        tick += 1
        if tick % 5 == 0 and work.exists():
            out = subprocess.run(SIZE.format(work=work), shell=True, capture_output=True)
            units = max(units, int(out.stdout.strip() or 0))
    stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - start
    text = stderr.decode()
    if proc.returncode != 0:
        raise SystemExit(f"pack failed ({proc.returncode}):\n{stdout.decode()}\n{text}")
    kib = [int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("PEAK_KIB")]
    return tree, kib[-1], seconds, units


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=None, help="Keep data and outputs here.")
    args = parser.parse_args()

    from packshard.demo import build_demo_tokenizer

    work = args.work or Path(tempfile.mkdtemp(prefix="packshard-many-"))
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = args.tokenizer or build_demo_tokenizer(work / "tokenizer")
    peaks = {}
    try:
        inputs = write_files(work / "inputs", args.files)
        listing = work / "inputs.txt"
        listing.write_text("".join(f"{p}\n" for p in inputs))
        for workers in (1, 2):
            out = work / f"out-{workers}"
            cmd = [sys.executable, "-c", PACK, "pack", str(work / "inputs"), "-t", str(tokenizer)]
            cmd += ["--max-seq-len", "256", "-o", str(out), "--overwrite", "--no-progress"]
            cmd += ["--workers", str(workers), "--split-bytes", "1"]  # a unit per file
            units = work / f".out-{workers}.units"
            tree, kib, seconds, units_kib = run(cmd, units)
            peaks[workers] = tree
            line = f"--workers {workers}: peak PSS {tree / 1024:8.1f} MiB"
            line += f" (largest process {kib / 1024:.1f} MiB)"
            line += f"  units folder {units_kib / 1024:8.1f} MiB  {seconds:6.1f} s"
            print(line, flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{args.files:,} files: --workers 2 / --workers 1 peak PSS = {peaks[2] / peaks[1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
