"""``pack`` CPU time and output bytes, one code tree against another, side by side.

Runs ``packshard pack`` as subprocesses, alternating the two trees (``--base`` on
``PYTHONPATH`` against this checkout), and measures each run's CPU time (user + system of
the child, ``RUSAGE_CHILDREN``).  Per case it prints the pairs and the new/old ratio of the
summed CPU, and whether the shards and the examples index kept their SHA-256::

    python scripts/bench_route.py --base /path/to/old/tree --pairs 3

Timed cases: every chat file of ``../shared/data`` with phi-3-mini (its tokenizer's
template) and with Qwen3 (``chat_template.training.jinja``), ``--workers 1``.  Byte checks
only (one run a side): the demo (``scripts/demo.sh``'s pack), phi-3 wrapped and Qwen3 with
``--overlong split`` at 512.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
MAIN = "import sys; from packshard.cli import main; sys.argv[0] = 'packshard'; main()"


def cases() -> dict[str, list[str]]:
    """The pack arguments (less ``--out``) of each case."""
    chat = sorted(str(p) for p in (SHARED / "chat").iterdir())
    tok = SHARED / "tokenizers"
    return {
        "phi-3": [*chat, "--tokenizer", str(tok / "phi-3-mini"), "--max-seq-len", "2048"],
        "qwen3": [
            *chat,
            *("--tokenizer", str(tok / "qwen3")),
            *("--template", str(tok / "qwen3" / "chat_template.training.jinja")),
            *("--max-seq-len", "2048"),
        ],
    }


def byte_cases(tmp: Path) -> dict[str, list[str]]:
    """Packs whose bytes are compared, not timed."""
    tokenizer = tmp / "demo-tokenizer"
    subprocess.run([sys.executable, "-m", "packshard.demo", str(tokenizer)], check=True)
    demo = REPO / "packshard" / "data" / "demo_chat.jsonl"
    timed = cases()
    return {
        "demo": [str(demo), "-t", str(tokenizer), "--template", "chatml", "--max-seq-len", "512"],
        "phi-3 wrapped": [*timed["phi-3"], "--strategy", "wrapped"],
        "qwen3 split 512": [*timed["qwen3"], "--overlong", "split", "--max-seq-len", "512"],
    }


def run(tree: Path | None, args: list[str], out: Path, extra: tuple[str, ...] = ()) -> float:
    """Pack once with ``tree``'s code (None: this checkout); return the child's CPU seconds."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, "-c", MAIN, "pack", *args, *extra, "--out", str(out), "--workers", "1"]
    subprocess.run(cmd, env=env, cwd=out.parent, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def digests(out: Path) -> dict[str, str]:
    """SHA-256 of the shards, the examples index and the rejects."""
    names = [*sorted(p.name for p in out.glob("*.parquet")), "rejects.jsonl"]
    return {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the old code tree")
    parser.add_argument("--new", type=Path, default=None, help="the new tree (default: this one)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--case", action="append", help="time only these cases (phi-3, qwen3)")
    parser.add_argument("--no-bytes", action="store_true", help="skip the byte-only cases")
    parser.add_argument(
        "--new-arg",
        action="append",
        default=[],
        help="an option for the new side only "
        "(e.g. --new-arg=--backend --new-arg=reference: the old code's encoder)",
    )
    args = parser.parse_args()
    extra = {"old": (), "new": tuple(args.new_arg)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, pack_args in ({} if args.no_bytes else byte_cases(Path(tmp))).items():
            sums = {}
            for side, tree in (("old", args.base), ("new", args.new)):
                out = Path(tmp) / "bytes"
                shutil.rmtree(out, ignore_errors=True)
                run(tree, pack_args, out, extra[side])
                sums[side] = digests(out)
            same = {k: sums["old"].get(k) == v for k, v in sums["new"].items()}
            print(f"{name}: same bytes {same}")
        for name, pack_args in cases().items():
            if args.case and name not in args.case:
                continue
            old_cpu, new_cpu = [], []
            sums: dict[str, dict[str, str]] = {}
            for i in range(args.pairs):
                order = [("old", args.base), ("new", args.new)]
                for side, tree in order if i % 2 == 0 else order[::-1]:
                    out = Path(tmp) / f"{name}-{side}"
                    shutil.rmtree(out, ignore_errors=True)
                    cpu = run(tree, pack_args, out, extra[side])
                    (old_cpu if side == "old" else new_cpu).append(cpu)
                    sums[side] = digests(out)
            pairs = ", ".join(f"{o:.2f}/{n:.2f}" for o, n in zip(old_cpu, new_cpu, strict=True))
            same = {k: sums["old"].get(k) == v for k, v in sums["new"].items()}
            print(f"{name}: cpu old/new s [{pairs}]  new/old {sum(new_cpu) / sum(old_cpu):.3f}")
            print(f"{name}: same bytes {same}")


if __name__ == "__main__":
    main()
