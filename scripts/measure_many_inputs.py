"""Measure the driver's peak memory on many one-record input files, one process vs workers.

    python scripts/measure_many_inputs.py --files 1000            # --workers 1 and 2
    python scripts/measure_many_inputs.py --files 1000 --code DIR  # another checkout's code

Every pack runs in its own process; its peak RSS (the largest of the driver and the workers
it waited for) comes from ``getrusage(RUSAGE_CHILDREN)`` in a fresh wrapper process.  Each
unit of a ``--workers`` run reads one file, so the run makes as many units as files: the
claim under test is that a unit's metadata does not grow with the number of inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACK = "import sys; from packshard.cli.commands import main; sys.argv[0] = 'packshard'; main()"
WRAP = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
    "print('peak_kb', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)"
)


def run(folder: Path, tokenizer: Path, workers: int, code: str | None) -> tuple[float, float]:
    out = folder / f"out-{workers}"
    argv = [sys.executable, "-c", PACK, "pack", str(folder / "data"), "-t", str(tokenizer)]
    argv += ["--max-seq-len", "64", "-o", str(out), "--no-progress", "--workers", str(workers)]
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = code
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", WRAP, *argv], env=env, capture_output=True, text=True, check=True
    )
    seconds = time.perf_counter() - started
    kb = int(re.search(r"peak_kb (\d+)", done.stderr).group(1))  # type: ignore[union-attr]
    return kb / 1024, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--code", help="a folder holding another packshard package to measure")
    args = parser.parse_args()
    from packshard.demo import build_demo_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tokenizer = build_demo_tokenizer(folder / "tok")
        (folder / "data").mkdir()
        for i in range(args.files):
            line = json.dumps({"text": f"record {i}"}) + "\n"
            (folder / "data" / f"input-{i:06d}.jsonl").write_text(line)
        one, t1 = run(folder, tokenizer, 1, args.code)
        two, t2 = run(folder, tokenizer, 2, args.code)
        print(
            f"{args.files} files: --workers 1 peak {one:.0f} MB ({t1:.0f} s), "
            f"--workers 2 peak {two:.0f} MB ({t2:.0f} s), ratio {two / one:.2f}"
        )


if __name__ == "__main__":
    main()
