"""Time packing many one-record files against one file holding the same records.

    python scripts/bench_many_files.py                    # 10,000 files, default --workers
    python scripts/bench_many_files.py --files 2000 --workers 2
    python scripts/bench_many_files.py --baseline ../main # this tree against another checkout

Each input is one ``{"text": ...}`` line; the single file holds the same lines in the same
order.  Each pack runs as ``packshard pack`` in its own process, so the figure includes
start-up, workers and writing.  The two packs alternate ``--repeat`` times; reported: the
median wall time and CPU time (user + system, the pack and its workers) of each, and their
ratios (acceptance: the many files take at most 2x the one file).  On a machine shared with
other jobs the CPU time is the steadier figure.  With ``--baseline`` the packs of another
checkout of packshard (its root, put first on ``PYTHONPATH``) alternate with this one's in
the same run, and the ratios of this tree's times to the baseline's are printed too.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
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


def time_pack(
    data: Path, tokenizer: Path, out: Path, extra: list[str], code: Path | None = None
) -> tuple[float, float]:
    """Run one pack (of the checkout ``code``, else this one); return wall and CPU seconds."""
    cmd = [sys.executable, "-c", PACK, "pack", str(data), "-t", str(tokenizer)]
    cmd += ["--max-seq-len", "256", "-o", str(out), "--no-progress", *extra]
    shutil.rmtree(out, ignore_errors=True)  # a fresh output each time: no replace checks
    start, cpu = time.perf_counter(), _cpu()
    env = dict(os.environ)
    if code is not None:  # that checkout first, before whatever the caller's path holds
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH")]))
    # run from the work folder: ``python -c`` puts its working folder first on the path
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out.parent)
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
    parser.add_argument("--baseline", type=Path, default=None, help="Another checkout's root.")
    args = parser.parse_args()

    from packshard.demo import build_demo_tokenizer

    work = (args.work or Path(tempfile.mkdtemp(prefix="packshard-many-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    extra = ["--workers", args.workers] if args.workers else []
    try:
        tokenizer = build_demo_tokenizer(work / "tokenizer")
        many, one = write_inputs(work, args.files)
        here = Path(__file__).resolve().parents[1]
        codes = {"this": here, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
        runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for code in codes.values():  # untimed: each checkout's bytecode and numba cache made
            # (compiled here too: with PYTHONDONTWRITEBYTECODE set a run would write none)
            compileall.compile_dir(str(code / "packshard"), quiet=1)
            time_pack(one, tokenizer, work / "out-one", extra, code)
        for _ in range(args.repeat):
            for name, code in codes.items():
                for kind, data in (("one", one), ("many", many)):
                    timed = time_pack(data, tokenizer, work / f"out-{kind}", extra, code)
                    runs.setdefault((name, kind), []).append(timed)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    for name in codes:
        one_w, one_c = wall[name, "one"], cpu[name, "one"]
        many_w, many_c = wall[name, "many"], cpu[name, "many"]
        print(
            f"{name}: one file of {args.files:,} records: {one_w:6.2f} s wall, {one_c:6.2f} s CPU"
        )
        print(
            f"{name}: {args.files:,} one-record files:   {many_w:6.2f} s wall, {many_c:6.2f} s CPU"
            f"  ({many_w / one_w:.2f}x wall, {many_c / one_c:.2f}x CPU; median of {args.repeat})"
        )
    if args.baseline:
        for kind in ("one", "many"):
            print(
                f"this / baseline, {kind}: {wall['this', kind] / wall['baseline', kind]:.2f}x wall,"
                f" {cpu['this', kind] / cpu['baseline', kind]:.2f}x CPU"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
