"""Rank balance of ``pack --dp``: balanced vs the seed's order at DP=8 and DP=64, real lengths.

    python scripts/bench_balance.py                          # ../shared/data, ×64, 4,096 tokens
    python scripts/bench_balance.py --scale 16 --max-seq-len 8192

The shared chat folder is packed once (qwen3 tokenizer, ``--overlong truncate``: every record
keeps a length) and its examples' lengths are read from ``examples.parquet``.  They are
repeated ``--scale`` times (the data "scaled up": the same length distribution, many more
rows), planned by the planner ``pack`` uses (BFD), the rows shuffled with the seed as ``pack``
does, then ordered by :func:`packshard.pack.plan.balance.balanced_order` — the functions
``pack --dp`` runs.  For each data-parallel size, micro-batch 1 and several accumulations it
prints ``Σ_steps max_rank / Σ_steps mean_rank`` (1.000: no rank waits) and the worst step, for
the seed's order and for the balanced one, by both costs (tokens, and attention
``Σn + c·Σn²`` with ``c = 1/(12·4096)``), and the balancing time.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from packshard.format.topology import ATTENTION_C, Topology, row_costs, step_balance
from packshard.pack import PackConfig, pack_dataset
from packshard.pack.plan.balance import balanced_order
from packshard.pack.plan.planner import plan_packs

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_lengths(shared: Path, max_seq_len: int, work: Path) -> np.ndarray:
    """Pack the shared chat folder once and return its examples' lengths."""
    out = work / f"chat-{max_seq_len}"
    if not (out / "examples.parquet").is_file():
        config = PackConfig.build(
            inputs=(str(shared / "chat"),),
            tokenizer=str(shared / "tokenizers" / "qwen3"),
            out=str(out),
            max_seq_len=max_seq_len,
            overlong="truncate",
            overwrite=True,
        )
        pack_dataset(config)
    return pq.read_table(out / "examples.parquet", columns=["num_tokens"])["num_tokens"].to_numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", type=Path, default=SHARED)
    parser.add_argument("--scale", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, help="Folder for the pack (default: temp).")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-balance-"))
    lengths = np.tile(shared_lengths(args.shared, args.max_seq_len, work), args.scale)
    plan = plan_packs(lengths, args.max_seq_len, "bfd")
    rows = plan.num_rows
    order = np.random.default_rng(args.seed).permutation(rows)  # the seed's row shuffle
    plan = plan.permute_rows(order)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"{len(lengths):,} examples (shared chat ×{args.scale}), {rows:,} rows of "
        f"{args.max_seq_len} tokens, fill {plan.fill_rate:.4f}; load average {load}"
    )
    print(f"attention cost c = {ATTENTION_C:.3g} (1/(12·4096))")
    print(
        f"{'dp':>4} {'accum':>5} {'cost':>9} {'steps':>6} {'seed order':>11} {'worst':>7} "
        f"{'balanced':>9} {'worst':>7} {'time s':>7}"
    )
    for dp in (8, 64):
        for accum in (1, 4):
            for cost in ("tokens", "attention"):
                topology = Topology(dp=dp, micro_batch=1, grad_accum=accum, cost=cost)
                costs = row_costs(plan.seg_length, plan.row_offsets, cost, topology.c)
                started = time.perf_counter()
                balanced = balanced_order(costs, topology, args.seed)
                took = time.perf_counter() - started
                plain, good = step_balance(costs, topology), step_balance(costs[balanced], topology)
                print(
                    f"{dp:>4} {accum:>5} {cost:>9} {good['steps']:>6} "
                    f"{plain['max_over_mean']:>11.4f} {plain['worst_step']:>7.3f} "
                    f"{good['max_over_mean']:>9.4f} {good['worst_step']:>7.3f} {took:>7.3f}"
                )


if __name__ == "__main__":
    main()
