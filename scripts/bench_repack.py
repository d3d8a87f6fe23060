"""Benchmark ``repack`` against the fresh ``pack`` it replaces: whole processes, same run.

    python scripts/bench_repack.py -t ../shared/data/tokenizers/phi-3-mini            # 1M records
    python scripts/bench_repack.py -t TOKENIZER --records 100000 --work /tmp/bench    # quicker

Steps, each a ``packshard`` process of its own, timed from start to exit:

1. ``pack DATA --max-seq-len 4096 --workers 1 -o parent``  (the pack a user already has)
2. ``pack DATA --max-seq-len 8192 --seed 1 --workers 1 -o fresh``  (what re-tokenizing costs)
3. ``repack parent --max-seq-len 8192 --seed 1 -o repacked``

then checks that ``fresh`` and ``repacked`` hold the same shards and examples index, byte for
byte, and prints wall and CPU seconds and their ratios.  Each is one process (``pack
--workers 1`` runs its tasks in its own process; the bytes never depend on it), so CPU is
counted whole: a fork server's workers are not reaped by the command.  The package is compiled
to byte code first, as an installed one is (with ``PYTHONDONTWRITEBYTECODE`` set, every
process would compile it again: about a second that neither command has when installed).
DATA is ``--records`` short chat records (seeded: a user turn of 2-12 words, an answer of
2-20), written once into ``--work``.
"""

from __future__ import annotations

import argparse
import compileall
import hashlib
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = (
    "the a of to and in is it you that he was for on are with as I his they be at one have "
    "this from"
).split()
CLI = "import sys; from packshard.cli import main; sys.argv[0] = 'packshard'; main()"


def write_records(path: Path, n: int, seed: int = 0) -> None:
    """Write ``n`` short two-turn chats to ``path`` (JSONL)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(n):
            user = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12)))
            answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 20)))
            messages = [
                {"role": "user", "content": user},
                {"role": "assistant", "content": answer},
            ]
            fh.write(json.dumps({"messages": messages}) + "\n")


def timed(*args: str) -> tuple[float, float]:
    """Run ``packshard ARGS`` as a process of its own; return its wall and CPU seconds.

    CPU is user + system of the process and those it reaped; on a machine shared with other
    work it says more than the wall time.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", CLI, *args], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def digests(folder: Path) -> dict[str, str]:
    """SHA-256 of the shards and the examples index of a pack."""
    names = [s["path"] for s in json.loads((folder / "manifest.json").read_text())["shards"]]
    return {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
        for name in [*names, "examples.parquet"]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-t", "--tokenizer", required=True)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--work", type=Path, help="Folder for the data and packs (default: temp).")
    parser.add_argument(
        "--keep-parent",
        action="store_true",
        help="Reuse the parent pack already in --work (steps 2 and 3 only; step 1 is not timed).",
    )
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-repack-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "chat.jsonl"
    if not data.is_file():
        write_records(data, args.records)
    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "packshard"), quiet=1)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())  # other work on the machine
    # one process each (--workers 1: pack's tasks run in its own process), so that CPU time is
    # counted whole (workers of a fork server are not reaped by the command) and both compete
    # alike for a shared machine
    common = ("-t", args.tokenizer, "--no-progress", "--overwrite", "--workers", "1")
    parent = (float("nan"), float("nan"))
    if not (args.keep_parent and (work / "parent" / "manifest.json").is_file()):
        parent = timed(
            "pack", str(data), "--max-seq-len", "4096", "-o", str(work / "parent"), *common
        )
    new = ("--max-seq-len", "8192", "--seed", "1")
    fresh = timed("pack", str(data), *new, "-o", str(work / "fresh"), *common)
    repack = timed(
        "repack", str(work / "parent"), *new, "-o", str(work / "repacked"), "--overwrite"
    )
    same = digests(work / "fresh") == digests(work / "repacked")
    stats = json.loads((work / "repacked" / "manifest.json").read_text())["stats"]
    print(f"records {args.records:,}, examples {stats['examples']:,}, tokens {stats['tokens']:,}")
    after = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"load average before: {load}; after: {after}")
    print("                                      wall s    CPU s")
    print(f"pack (parent, 4096)               {parent[0]:9.2f} {parent[1]:9.2f}")
    print(f"pack (fresh, 8192, seed 1)        {fresh[0]:9.2f} {fresh[1]:9.2f}")
    print(f"repack (parent → 8192, seed 1)    {repack[0]:9.2f} {repack[1]:9.2f}")
    wall, cpu = fresh[0] / repack[0], fresh[1] / repack[1]
    print(f"repack is {wall:.1f}× faster (wall), {cpu:.1f}× less CPU")
    print(f"shards and examples index byte-identical: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
