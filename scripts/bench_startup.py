"""Benchmark: what a ``pack`` process spends before its first record, step by step.

Each round starts two fresh interpreters, alternating: one as a library caller's process
(numba loads every installed ``numba_extensions`` entry point at the first kernel), one as
the ``packshard`` command's own (:mod:`packshard.jit`: the entry points skipped).  Each
imports and builds, in ``pack``'s order but one step after the other on one thread, what a
``pack`` process needs before its first record, and reports the CPU seconds of each step
(``getrusage``, the process's own); the medians over ``--rounds`` and the totals are printed,
with the load average.  Steps that ``pack`` runs on threads beside each other (the
tokenizer load, the planner's first plan) are summed here, so the total is CPU, not wall.

    python scripts/bench_startup.py [--tokenizer ../shared/data/tokenizers/phi-3-mini]
        [--rounds 5]

The package is compiled to byte code first, as an installed one is.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"

STEPS = r"""
import json, resource, sys
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
marks, last = [], cpu()
def mark(name):
    global last
    now = cpu(); marks.append((name, now - last)); last = now
own = sys.argv[1] == "own"
tokenizer = sys.argv[2]
if own:
    from packshard.jit import own_process
    own_process()
import numpy; mark("import numpy")
import pyarrow, pyarrow.parquet; mark("import pyarrow, pyarrow.parquet")
import numba; mark("import numba")
if own:
    from packshard.jit import skip_if_own
    assert skip_if_own(imported=True)
import packshard.pack.pipeline; mark("import the rest of packshard.pack.pipeline")
import packshard.cli.commands, packshard.cli.tables; mark("import the command line, rich")
from packshard.pack.plan.planner import warm_planner
warm_planner("bfd"); mark("first plan: 3 kernels' caches (the library's: numba's registries first)")
from packshard.ingest.tokens.tokenizer import load_tokenizer
bundle = load_tokenizer(tokenizer); mark("load the tokenizer (tokenizers, byte aligner)")
from packshard.ingest.template.render import load_template
load_template(None, bundle); mark("compile the template")
from packshard.ingest.tokens.backends import encoder_for
encoder_for(bundle, "fast").encode_batch(["warm"]); mark("build the fast encoder")
from packshard.pack.units.map import warm_worker
warm_worker((tokenizer, None, "fast")); mark("label one record: the aligner's kernels")
print(json.dumps(marks))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default=str(SHARED / "tokenizers" / "phi-3-mini"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    compileall.compile_dir(REPO / "packshard", quiet=1)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PACKSHARD_OWN_PROCESS", None)
    runs: dict[str, list[list[tuple[str, float]]]] = {"library": [], "own": []}
    print(f"load before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for _ in range(args.rounds):
        for mode in runs:
            done = subprocess.run(
                [sys.executable, "-c", STEPS, mode, args.tokenizer],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[mode].append(json.loads(done.stdout.splitlines()[-1]))
    print(f"load after:  {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"CPU-s, median of {args.rounds}: library caller's process | packshard's own")
    for k, (name, _) in enumerate(runs["own"][0]):
        lib = statistics.median(r[k][1] for r in runs["library"])
        own = statistics.median(r[k][1] for r in runs["own"])
        print(f"  {name:62s} {lib:6.3f} | {own:6.3f}")
    totals = {m: statistics.median(sum(c for _, c in r) for r in rs) for m, rs in runs.items()}
    print(f"  {'total':62s} {totals['library']:6.3f} | {totals['own']:6.3f}")


if __name__ == "__main__":
    main()
