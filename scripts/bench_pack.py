"""Benchmark the packing planner side by side with TRL's packer and with numpy's sort.

    python scripts/bench_pack.py                 # 1M lengths vs TRL, 10M vs np.sort
    python scripts/bench_pack.py --n 100000      # a quicker TRL comparison
    python scripts/bench_pack.py --skip-trl --e2e-tokens 500000   # quick end-to-end part

Part 3 runs the whole ``pack`` (read, normalize, render, tokenize, spill, plan, write shards,
manifest) against ``Tokenizer.encode_batch`` alone on the same texts rendered beforehand, for
a SentencePiece and a byte-level tokenizer, with the runs alternating; it also shows pack
against ``encode_batch_fast`` (no offsets), which is what pack itself runs for these two.

Lengths are lognormal (median 300) rounded and clipped to [1, max_seq_len], seed fixed.
Timings are warm (the JIT runs once before timing); fast ones are the best of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from packshard.arrays import lower_bound_rows
from packshard.ingest.label.spans import render_example
from packshard.ingest.read.sources import expand_inputs, read_records
from packshard.ingest.template.render import load_template
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.pack.pipeline import PackConfig, pack_dataset
from packshard.pack.plan.planner import plan_packs


@dataclass(frozen=True, slots=True)
class Result:
    """One line of the table: ours against a baseline."""

    name: str
    ours_s: float
    base_s: float | None
    base_name: str
    rows: str = ""
    note: str = ""
    target: str = ""
    passed: bool | None = None


def make_lengths(n: int, max_seq_len: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = np.round(rng.lognormal(np.log(300), 1.0, n))
    return np.clip(raw, 1, max_seq_len).astype(np.int64)


def best_of(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def excess(rows: int, bound: int) -> str:
    return f"{rows:,} (+{100 * (rows / bound - 1):.4f}%)"


def warm_up() -> float:
    """Compile (or load from the on-disk cache) every kernel; return the seconds it took."""
    start = time.perf_counter()
    for dtype in (np.int32, np.int64):
        for strategy in ("bfd", "ffd", "wrapped"):
            plan_packs(np.array([3, 1, 2], dtype), 4, strategy)
    return time.perf_counter() - start


def compare_with_trl(n: int, max_seq_len: int, repeat: int) -> list[Result]:
    """Part 1: our bfd plan against ``trl.data_utils.pack_dataset(strategy="bfd")``."""
    import datasets
    import pyarrow as pa
    from trl.data_utils import pack_dataset

    datasets.disable_progress_bars()
    lengths = make_lengths(n, max_seq_len)
    bound = lower_bound_rows(int(lengths.sum()), max_seq_len)
    ours_s = best_of(lambda: plan_packs(lengths, max_seq_len, "bfd"), repeat)
    ours_rows = plan_packs(lengths, max_seq_len, "bfd").num_rows

    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(np.zeros(int(offsets[-1]), np.int32))
    ids = pa.ListArray.from_arrays(pa.array(offsets), values)
    dataset = datasets.Dataset(pa.table({"input_ids": ids}))  # built outside the timing
    start = time.perf_counter()
    packed = pack_dataset(dataset, seq_length=max_seq_len, strategy="bfd")
    trl_s = time.perf_counter() - start
    trl_rows = len(packed)
    del packed, dataset, ids, values
    return [
        Result(
            f"bfd plan vs TRL pack_dataset, {n:,} lengths",
            ours_s,
            trl_s,
            "TRL",
            excess(ours_rows, bound),
            f"TRL {excess(trl_rows, bound)}; bound {bound:,}",
            "≥100× faster, rows ≤ TRL",
            trl_s / ours_s >= 100 and ours_rows <= trl_rows,
        )
    ]


def compare_with_sort(n: int, max_seq_len: int, repeat: int) -> list[Result]:
    """Part 2: our planners on ``n`` lengths against numpy sorting the same array."""
    lengths = make_lengths(n, max_seq_len)
    bound = lower_bound_rows(int(lengths.sum()), max_seq_len)
    sort_s = best_of(lambda: np.sort(lengths), repeat)
    argsort_s = best_of(lambda: np.argsort(lengths, kind="stable"), repeat)
    results = []
    for strategy in ("bfd", "ffd", "wrapped"):
        ours_s = best_of(lambda s=strategy: plan_packs(lengths, max_seq_len, s), repeat)
        rows = plan_packs(lengths, max_seq_len, strategy).num_rows
        is_bfd = strategy == "bfd"
        results.append(
            Result(
                f"{strategy} plan, {n:,} int64 lengths",
                ours_s,
                sort_s,
                "np.sort",
                excess(rows, bound),
                f"bound {bound:,}",
                "≤2× np.sort" if is_bfd else "",
                ours_s <= 2 * sort_s if is_bfd else None,
            )
        )
    results.append(
        Result(
            f"np.argsort(kind='stable'), {n:,}",
            argsort_s,
            sort_s,
            "np.sort",
            note="what a sort-based planner pays before packing",
        )
    )
    return results


def end_to_end_setups(folder: Path) -> list[tuple[str, str | None, list[str], str]]:
    """``(tokenizer, template, inputs, label)`` per end-to-end run: both shared families."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_ingest import SHARED, synthetic

    if (SHARED / "chat").is_dir():
        chat = [str(SHARED / "chat")]
        return [
            (str(SHARED / "tokenizers" / "phi-3-mini"), None, chat,
             "shared chat data, phi-3-mini (SentencePiece) + its template"),
            (str(SHARED / "tokenizers" / "phi-2"), "chatml", chat,
             "shared chat data, phi-2 (byte-level BPE) + ChatML"),
        ]  # fmt: skip
    tokenizer, inputs = synthetic(folder)
    return [(tokenizer, "chatml", inputs, "synthetic chat corpus, trained BPE + built-in ChatML")]


def end_to_end_data(
    folder: Path, tokenizer: str, template: str | None, inputs: list[str], min_tokens: int
) -> tuple[Path, list[str], int]:
    """One JSONL of ``inputs`` repeated to at least ``min_tokens``; its rendered texts."""
    values = [raw.value for f in expand_inputs(inputs) for raw in read_records(f) if raw.value]
    bundle = load_tokenizer(tokenizer)
    tmpl = load_template(template, bundle)
    texts = []
    for value in values:
        try:
            texts.append(render_example(normalize_record_value(value), tmpl, bundle, "auto").text)
        except Exception:
            texts.append("")
    once = sum(len(e) for e in bundle.tokenizer.encode_batch(texts, add_special_tokens=False))
    repeat = max(1, -(-min_tokens // max(once, 1)))
    data = folder / f"e2e-{Path(tokenizer).name}.jsonl"
    with data.open("w") as fh:
        for _ in range(repeat):
            for value in values:
                fh.write(json.dumps(value, ensure_ascii=False) + "\n")
    return data, [t for t in texts if t] * repeat, repeat


def normalize_record_value(value: object) -> object:
    from packshard.ingest.normalize import normalize_record
    from packshard.ingest.types import RawRecord
    from packshard.records import SourceRef

    return normalize_record(RawRecord(SourceRef("bench", 1), "bench", value))


def compare_end_to_end(min_tokens: int, max_seq_len: int, repeat: int) -> list[Result]:
    """Part 3: ``pack`` end to end against raw ``encode_batch`` on the same rendered texts.

    Raw and pack runs alternate, so both meet the same moments of a shared machine; the
    ratio reported is the median over those pairs (best-of times are shown too).  The raw
    loop reads the ids out of every encoding, as any user of the tokenizer must.
    """
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for tokenizer, template, inputs, label in end_to_end_setups(folder):
            data, texts, times = end_to_end_data(folder, tokenizer, template, inputs, min_tokens)
            bundle = load_tokenizer(tokenizer)
            batches = [texts[i : i + 1024] for i in range(0, len(texts), 1024)]

            def raw(fast: bool = False, batches: list[list[str]] = batches, bundle=bundle) -> None:
                encode = (
                    bundle.tokenizer.encode_batch_fast if fast else bundle.tokenizer.encode_batch
                )
                for batch in batches:
                    sum(len(e.ids) for e in encode(batch, add_special_tokens=False))

            # phi-2 has no ChatML tokens: its markers are split on purpose here
            config = PackConfig.build(inputs=(str(data),), tokenizer=tokenizer, template=template,
                                out=str(folder / "out"), max_seq_len=max_seq_len,
                                overwrite=True,
                                allow_split_markers=template == "chatml")  # fmt: skip
            tokens = sum(len(e) for b in batches for e in bundle.tokenizer.encode_batch(b))
            rows = pack_dataset(config).manifest["stats"]["rows"]  # also warms every cache
            raw_t, fast_t, pack_t = [], [], []
            for _ in range(max(repeat, 5)):
                for fn, into in ((raw, raw_t), (lambda: raw(fast=True), fast_t),
                                 (partial(pack_dataset, config), pack_t)):  # fmt: skip
                    start = time.perf_counter()
                    fn()
                    into.append(time.perf_counter() - start)
            paired = statistics.median(r / p for r, p in zip(raw_t, pack_t, strict=True))
            fast_paired = statistics.median(r / p for r, p in zip(fast_t, pack_t, strict=True))
            pack_s, raw_s, fast_s = min(pack_t), min(raw_t), min(fast_t)
            name = f"pack end to end, {tokens:,} tokens ({label}, x{times})"
            results.append(Result(
                name, pack_s, raw_s, "encode_batch", f"{rows:,} rows",
                f"{tokens / pack_s / 1e6:.2f} M tok/s vs {tokens / raw_s / 1e6:.2f} M tok/s raw; "
                f"pack/raw = {paired:.2f}× (median of {len(pack_t)} alternating pairs; "
                f"best-of {raw_s / pack_s:.2f}×)",
                "≥0.7× raw throughput", paired >= 0.7,
            ))  # fmt: skip
            results.append(Result(
                "  same, against encode_batch_fast (no offsets; what pack runs for this "
                "tokenizer)", pack_s, fast_s, "encode_batch_fast", "",
                f"pack/raw = {fast_paired:.2f}× (median of pairs)",
            ))  # fmt: skip
    return results


def render(results: list[Result], console: Console) -> None:
    table = Table(title="packshard packing benchmark (warm, best of runs)")
    columns = ("comparison", "ours", "baseline", "ratio", "target", "ok", "rows (over ⌈Σ/L⌉)")
    for column in (*columns, "notes"):
        table.add_column(column, overflow="fold")
    for r in results:
        ratio = ""
        if r.base_s is not None:
            ratio = f"{r.base_s / r.ours_s:.1f}× faster" if r.base_s >= r.ours_s else ""
            ratio = ratio or f"{r.ours_s / r.base_s:.2f}× the time"
        ok = {None: "", True: "[green]yes[/]", False: "[red]no[/]"}[r.passed]
        base = f"{r.base_s:.3f} s {r.base_name}" if r.base_s is not None else ""
        table.add_row(r.name, f"{r.ours_s:.3f} s", base, ratio, r.target, ok, r.rows, r.note)
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="lengths for the TRL run")
    parser.add_argument("--n-sort", type=int, default=10_000_000, help="lengths vs np.sort")
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-trl", action="store_true", help="skip the (slow) TRL run")
    parser.add_argument("--e2e-tokens", type=int, default=2_000_000, help="tokens for part 3")
    args = parser.parse_args()
    console = Console(width=max(Console().width, 170))
    jit_s = warm_up()
    console.print(f"first calls (JIT compile or on-disk cache load): {jit_s:.2f} s")
    results: list[Result] = []
    if not args.skip_trl:
        results += compare_with_trl(args.n, args.max_seq_len, args.repeat)
    results += compare_with_sort(args.n_sort, args.max_seq_len, args.repeat)
    if args.e2e_tokens > 0:
        results += compare_end_to_end(args.e2e_tokens, args.max_seq_len, args.repeat)
    render(results, console)


if __name__ == "__main__":
    main()
