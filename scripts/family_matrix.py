"""Print the family matrix: every architecture family packed vs alone, through its packed path.

Usage: python scripts/family_matrix.py [--data ../shared/data] [--families a,b] [--markdown]

One packed row of real chat data (two shared chat files packed with the Qwen3 tokenizer at
512 tokens, the first row with three or more segments) is run through a tiny random model of
each family (see packshard.torch.layers.matrix).  Without the shared data a fixed random row
of the same shape is used and the table says so.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch


def _row(data: Path) -> tuple[torch.Tensor, list[int], str]:
    tok = data / "tokenizers" / "qwen3"
    names = ("llamafactory_alpaca_en_demo.json", "openai_cookbook_toy_chat_fine_tuning.jsonl")
    chat = [data / "chat" / name for name in names if (data / "chat" / name).is_file()]
    if tok.is_dir() and chat:
        from click.testing import CliRunner

        from packshard.cli import main
        from packshard.torch import PackedDataset

        out = Path(tempfile.mkdtemp()) / "packed"
        args = ["pack", *map(str, chat), "-t", str(tok), "--max-seq-len", "512", "-o", str(out)]
        result = CliRunner().invoke(main, args)
        if result.exit_code in (0, 1) and (out / "manifest.json").is_file():
            ds = PackedDataset(str(out))
            for i in range(len(ds)):
                row = ds[i]
                cu = row["cu_seqlens"].tolist()
                if len(cu) >= 4:
                    ids = row["input_ids"].to(torch.int64) % 4096
                    return ids, cu, f"row {i} of {out.name} ({', '.join(p.name for p in chat)})"
    gen = torch.Generator().manual_seed(0)
    lengths = [37, 90, 21, 130]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.randint(0, 1000, (cu[-1],), generator=gen), cu, "a random row (no shared data)"


def main() -> int:
    """Run the matrix and print it; exit 1 when a family neither passes nor is refused."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data")
    )
    parser.add_argument("--families", default=None)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    import transformers

    from packshard.torch.layers.matrix import FAMILIES, balance_figures, check_family

    ids, cu, where = _row(Path(args.data))
    families = args.families.split(",") if args.families else list(FAMILIES)
    print(
        f"transformers {transformers.__version__}, torch {torch.__version__}, CPU fp32; "
        f"{where}: {len(cu) - 1} segments, {cu[-1]} tokens"
    )
    columns = [
        "family",
        "layer kinds",
        "segmented layers",
        "attention masks",
        "plain",
        "packed path",
        "control (seams withheld)",
        "verdict",
    ]
    print("| " + " | ".join(columns) + " |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    bad = 0
    for family in families:
        start = time.perf_counter()
        r = check_family(family, ids, cu)
        kinds = ", ".join(f"{k} ×{n}" for k, n in r.kinds.items())
        fmt = lambda v: "—" if v is None else f"{v:.1e}"  # noqa: E731
        control = "—" if r.control is None else f"{r.control:.2g} at {r.control_layer}"
        verdict = r.verdict
        bad += not (verdict == "passes" or verdict.startswith(("refused", "not built")))
        print(
            f"| {family} | {kinds} | {', '.join(r.segmented) or '—'} | "
            f"{'yes' if r.masks else 'no'} | {fmt(r.plain)} | {fmt(r.packed)} | {control} | "
            f"{verdict} |",
            flush=True,
        )
        print(f"  ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    moe = balance_figures("qwen3_moe", ids, cu)
    print(
        f"\nqwen3_moe load-balancing loss on this row: packed {moe.packed:.6f}, the same "
        f"examples padded {moe.padded:.6f} (Δ {abs(moe.packed - moe.padded):.1e}), mean of each "
        f"alone {moe.mean_alone:.6f} (Δ {abs(moe.packed - moe.mean_alone):.1e}); per segment "
        f"from the packed row {moe.per_segment:.6f} (Δ vs alone "
        f"{abs(moe.per_segment - moe.mean_alone):.1e})"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
