"""Benchmark the packing planner side by side with TRL's packer and with numpy's sort.

    python scripts/bench_pack.py                 # 1M lengths vs TRL, 10M vs np.sort
    python scripts/bench_pack.py --n 100000      # a quicker TRL comparison

Lengths are lognormal (median 300) rounded and clipped to [1, max_seq_len], seed fixed.
Timings are warm (the JIT runs once before timing); fast ones are the best of --repeat runs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from rich.console import Console
from rich.table import Table

from packshard.packing import lower_bound_rows, plan_packs


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
    bound = lower_bound_rows(lengths, max_seq_len)
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
    bound = lower_bound_rows(lengths, max_seq_len)
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
    args = parser.parse_args()
    console = Console(width=max(Console().width, 170))
    jit_s = warm_up()
    console.print(f"first calls (JIT compile or on-disk cache load): {jit_s:.2f} s")
    results: list[Result] = []
    if not args.skip_trl:
        results += compare_with_trl(args.n, args.max_seq_len, args.repeat)
    results += compare_with_sort(args.n_sort, args.max_seq_len, args.repeat)
    render(results, console)


if __name__ == "__main__":
    main()
