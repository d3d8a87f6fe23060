"""Benchmark: the structural audit of ``verify`` against merely reading the same shards.

Data: a real ``pack`` output of synthetic ``text`` records (random words, 5-90 words each)
tokenized with the offline demo tokenizer into rows of --max-seq-len tokens, at least --rows
rows.  It is built once under --out and reused while its manifest exists (delete the folder
or pass --rebuild to build again).

Timed, in one process, best of --repeat runs each:

* read:      ``pq.read_table(shard, memory_map=True)`` of every shard (what any reader pays);
* audit:     ``verify_dataset(OUT, VerifyOptions(source=False, model="none"))``: manifest and
             schema, SHA-256 of every file, reading every shard, the vectorised seam audit,
             counts, the examples index, the seam table;
* audit without checksums: the same with the SHA-256 step replaced by the recorded value,
             so the structural part is seen alone.

Target: the audit without checksums within 3x the read time.

Usage: python scripts/bench_verify.py [--rows 100000] [--max-seq-len 256] [--out bench-out/verify]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow.parquet as pq

from packshard.demo import build_demo_tokenizer
from packshard.pack.pipeline import PackConfig, pack_dataset
from packshard.verify.run import VerifyOptions, verify_dataset

WORDS = (
    "the a of to and in is it that for on with as was at by be this from or an are not have "
    "you data model token shard row seam packed example label position attention loss train "
    "python function return value list string number file line read write check verify "
    "quick brown fox jumps over lazy dog hello world thanks question answer please explain"
).split()


def write_records(path: Path, rows: int, max_seq_len: int, seed: int) -> None:
    """Write enough ``text`` records for about ``rows`` full rows (~2 demo tokens per word)."""
    rng = np.random.default_rng(seed)
    words_needed = int(rows * max_seq_len / 2.0 * 1.05)
    lengths = rng.integers(5, 90, size=words_needed // 47 + 1)
    picks = rng.integers(0, len(WORDS), size=int(lengths.sum()))
    vocab = np.array(WORDS, dtype=object)
    with open(path, "w", encoding="utf-8") as fh:
        start = 0
        for n in lengths.tolist():
            text = " ".join(vocab[picks[start : start + n]])
            fh.write(json.dumps({"text": text}) + "\n")
            start += n


def build(out: Path, rows: int, max_seq_len: int) -> float:
    """Pack the synthetic corpus into ``out/packed``; return the seconds it took."""
    tok = build_demo_tokenizer(out / "tok")
    data = out / "synthetic.jsonl"
    write_records(data, rows, max_seq_len, seed=0)
    started = time.perf_counter()
    pack_dataset(
        PackConfig.build(
            inputs=(str(data),),
            tokenizer=str(tok),
            out=str(out / "packed"),
            max_seq_len=max_seq_len,
            format="text",
            shard_rows=8192,
            overwrite=True,
        )
    )
    return time.perf_counter() - started


def best(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--max-seq-len", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path("bench-out/verify"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()

    packed = args.out / "packed"
    manifest_path = packed / "manifest.json"
    if args.rebuild or not manifest_path.is_file():
        args.out.mkdir(parents=True, exist_ok=True)
        print(f"building {packed} (>= {args.rows:,} rows of {args.max_seq_len} tokens) ...")
        print(f"  pack took {build(args.out, args.rows, args.max_seq_len):.1f} s")
    manifest = json.loads(manifest_path.read_text())
    stats = manifest["stats"]
    rows, tokens = stats["rows"], stats["tokens"]
    if rows < args.rows:
        raise SystemExit(f"{packed} has {rows:,} rows < --rows {args.rows:,} (use --rebuild)")
    shards = [packed / s["path"] for s in manifest["shards"]]
    size = sum(p.stat().st_size for p in shards)
    print(
        f"dataset: {rows:,} rows, {tokens:,} tokens, {stats['examples']:,} examples, "
        f"{len(shards)} shards, {size / 2**20:.1f} MiB"
    )

    def read_all() -> int:
        return sum(pq.read_table(p, memory_map=True).num_rows for p in shards)

    def audit() -> object:
        return verify_dataset(packed, VerifyOptions(source=False, model="none"))

    recorded = {str(packed / e["path"]): e["sha256"] for e in manifest["shards"]}
    recorded.update({str(packed / e["path"]): e["sha256"] for e in manifest["files"].values()})

    def audit_without_checksums() -> object:
        with mock.patch("packshard.verify.integrity.sha256_path", lambda p: recorded[str(p)]):
            return audit()

    read_all()  # warm the page cache once so every variant reads from memory
    t_read, n = best(read_all, args.repeat)
    assert n == rows
    t_audit, report = best(audit, args.repeat)
    assert report.ok, [str(f) for f in report.findings.items[:5]]  # type: ignore[attr-defined]
    t_struct, report = best(audit_without_checksums, args.repeat)
    assert report.ok  # type: ignore[attr-defined]

    print(f"{'step':<34}{'seconds':>9}{'rows/s':>14}{'tokens/s':>15}{'x read':>8}")
    for name, t in (
        ("read shards (pq.read_table)", t_read),
        ("audit incl. SHA-256", t_audit),
        ("audit without SHA-256", t_struct),
    ):
        print(f"{name:<34}{t:>9.3f}{rows / t:>14,.0f}{tokens / t:>15,.0f}{t / t_read:>8.2f}")
    verdict = "OK" if t_struct <= 3 * t_read else "SLOWER THAN TARGET"
    print(f"target: audit without SHA-256 <= 3x read: {t_struct / t_read:.2f}x ({verdict})")


if __name__ == "__main__":
    main()
