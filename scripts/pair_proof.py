"""Measure the pair proof on real preference data: per-pair |Δ logp| packed vs alone, the control.

Renders every pair of a LLaMA-Factory preference file with a real tokenizer's chat template
(each branch its own conversation: ids = apply_chat_template(prompt + [answer]), labels the
tokens after the prompt's generation prompt), packs pairs whole into rows (first fit, chosen
then rejected, adjacent), writes contract shards with the ``branch`` column, and runs

1. verify's model stage (:mod:`packshard.verify.model.pairs`): each pair's token and summed
   log-probabilities and DPO loss packed vs alone, and the naive control;
2. the recipe's check (:func:`packshard.torch.pairs.train.check_pair_loss`): each branch's
   summed log-probability from packed rows vs the branch run unpadded alone, then the same
   batch with its positions regenerated over the row (the classic lost seam), which must be
   caught.

Usage: python scripts/pair_proof.py ../shared/data/preference/llamafactory_dpo_en_demo.json \
           ../shared/data/tokenizers/qwen3 [--pairs 300] [--max-seq-len 2048]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from packshard.records import IGNORE_INDEX
from packshard.torch import collate_varlen
from packshard.torch.pairs.train import check_pair_loss
from packshard.torch.seams import SeamLeakError
from packshard.verify.model.check import check_model
from packshard.verify.model.forward import build_tiny_model
from packshard.verify.run import VerifyOptions

ROLES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user"}


def branches(record: dict[str, Any]) -> tuple[list[dict[str, str]], str, str]:
    prompt = [{"role": ROLES[m["from"]], "content": m["value"]} for m in record["conversations"]]
    if record.get("system"):
        prompt.insert(0, {"role": "system", "content": record["system"]})
    return prompt, record["chosen"]["value"], record["rejected"]["value"]


def render(tok: Any, prompt: list[dict[str, str]], answer: str) -> tuple[np.ndarray, np.ndarray]:
    head = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    full = tok.apply_chat_template(
        [*prompt, {"role": "assistant", "content": answer}], tokenize=True
    )
    head, full = list(getattr(head, "input_ids", head)), list(getattr(full, "input_ids", full))
    if full[: len(head)] != head:
        raise ValueError("the prompt does not render as a prefix of the conversation")
    labels = np.array(full)
    labels[: len(head)] = IGNORE_INDEX
    return np.array(full, dtype=np.int32), labels.astype(np.int32)


def pack_rows(pairs: list[list[tuple[np.ndarray, np.ndarray]]], max_len: int) -> list[list[int]]:
    """First fit, pairs as units (both branches' length)."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i, pair in enumerate(pairs):
        size = sum(len(ids) for ids, _ in pair)
        for r, room in enumerate(free):
            if size <= room:
                rows[r].append(i)
                free[r] -= size
                break
        else:
            rows.append([i])
            free.append(max_len - size)
    return rows


def write_pack(out: Path, pairs: list[Any], rows: list[list[int]], max_len: int) -> None:
    cols: dict[str, list[Any]] = {
        k: [] for k in ("input_ids", "labels", "position_ids", "cu_seqlens", "example_ids")
    }
    cols["branch"] = []
    for members in rows:
        segs = [(2 * i + b, *pairs[i][b]) for i in members for b in (0, 1)]
        lengths = [len(ids) for _, ids, _ in segs]
        cols["input_ids"].append(np.concatenate([s[1] for s in segs]).tolist())
        cols["labels"].append(np.concatenate([s[2] for s in segs]).tolist())
        cols["position_ids"].append(np.concatenate([np.arange(n) for n in lengths]).tolist())
        cols["cu_seqlens"].append([0, *np.cumsum(lengths).tolist()])
        cols["example_ids"].append([s[0] for s in segs])
        cols["branch"].append([1 + (s[0] % 2) for s in segs])
    types = {"example_ids": pa.int64(), "branch": pa.int8()}
    table = pa.table(
        {k: pa.array(v, pa.list_(types.get(k, pa.int32()))) for k, v in cols.items()}
    ).replace_schema_metadata(
        {b"packshard.format_version": b"1", b"packshard.dataset_id": b"0123456789abcdef"}
    )
    out.mkdir(parents=True)
    pq.write_table(table, out / "shard-00000.parquet")
    data = (out / "shard-00000.parquet").read_bytes()
    manifest = {
        "format_version": 1,
        "dataset_id": "0123456789abcdef",
        "config": {"max_seq_len": max_len, "position_ids": "reset"},
        "tokenizer": {"sha256": "", "vocab_size": 0},
        "shards": [
            {
                "path": "shard-00000.parquet",
                "rows": len(rows),
                "sha256": hashlib.sha256(data).hexdigest(),
                "bytes": len(data),
            }
        ],
    }
    (out / "manifest.json").write_text(json.dumps(manifest))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("tokenizer")
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--max-seq-len", type=int, default=2048)
    parser.add_argument("--model-rows", type=int, default=8)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    records = json.loads(Path(args.data).read_text(encoding="utf-8"))[: args.pairs]
    pairs, skipped = [], 0
    for record in records:
        prompt, chosen, rejected = branches(record)
        pair = [render(tok, prompt, chosen), render(tok, prompt, rejected)]
        if sum(len(ids) for ids, _ in pair) > args.max_seq_len:
            skipped += 1
            continue
        pairs.append(pair)
    rows = pack_rows(pairs, args.max_seq_len)
    tokens = sum(len(ids) for pair in pairs for ids, _ in pair)
    print(
        f"{len(pairs)} pairs ({skipped} longer than {args.max_seq_len} left out), {tokens:,} "
        f"tokens in {len(rows)} rows; lower bound {-(-tokens // args.max_seq_len)} rows"
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        write_pack(out, pairs, rows, args.max_seq_len)
        manifest = json.loads((out / "manifest.json").read_text())
        tables = {0: pq.read_table(out / "shard-00000.parquet")}
        started = time.perf_counter()
        options = VerifyOptions(model="tiny", model_rows=args.model_rows, seed=0)
        result, _, _ = check_model(manifest, tables, None, options)
        p = result.detail["pairs"]
        print(
            f"verify model stage: {result.status} in {time.perf_counter() - started:.1f} s; "
            f"{p['pairs']} pairs in {result.detail['rows']} rows"
        )
        print(f"  max |Δ token logp| packed vs alone  {p['max_token_logp_delta']:.2e}")
        print(f"  max |Δ summed logp| packed vs alone {p['max_pair_logp_delta']:.2e}")
        print(f"  max |Δ DPO loss| packed vs alone    {p['max_pair_loss_delta']:.2e}")
        print(
            f"  naive control: {p['control_pairs_moved']} of {p['pairs']} pairs moved by "
            f">= 1e-2 (smallest move {p['control_min_pair_delta']:.3f})"
        )
        for f in list(result.findings.items)[:5]:
            print(f"  finding: {f.message}")
    model = build_tiny_model(4096, seed=0)
    picked = [
        {
            "input_ids": torch.tensor(tables[0]["input_ids"][r].as_py()) % 4096,
            "labels": torch.tensor(
                [t % 4096 if t != IGNORE_INDEX else t for t in tables[0]["labels"][r].as_py()]
            ),
            "cu_seqlens": torch.tensor(tables[0]["cu_seqlens"][r].as_py(), dtype=torch.int32),
            "example_ids": torch.tensor(tables[0]["example_ids"][r].as_py()),
            "position_ids": torch.tensor(tables[0]["position_ids"][r].as_py()),
            "branch": torch.tensor(tables[0]["branch"][r].as_py(), dtype=torch.int8),
        }
        for r in range(min(2, len(rows)))
    ]
    batch = collate_varlen(picked)
    reference = build_tiny_model(4096, seed=1)
    delta = check_pair_loss(model, batch, reference)
    pairs_in_batch = int((batch["branch"] == 1).sum())
    print(
        f"recipe check: {pairs_in_batch} pairs in 2 packed rows, max |branch logp packed - "
        f"alone| = {delta:.2e} (tolerance 1e-4)"
    )
    lost = dict(batch, position_ids=torch.arange(batch["input_ids"].shape[1])[None])
    try:
        check_pair_loss(model, lost, reference)
        print("positions regenerated over the row: NOT caught")
    except SeamLeakError as exc:
        print(f"positions regenerated over the row: caught ({str(exc).split(':')[0]})")


if __name__ == "__main__":
    main()
