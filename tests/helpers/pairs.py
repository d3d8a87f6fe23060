"""Preference pairs: rows as a preference pack holds them."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packshard.records import IGNORE_INDEX, PackedRow

# --- preference pairs: rows as a preference pack holds them ------------------------------------


def preference_rows(
    layouts: list[list[tuple[int, ...]]], seed: int = 0, vocab: int = 120
) -> tuple[list[PackedRow], list[list[int]]]:
    """Hand-made preference rows and their per-segment ``branch`` lists.

    Each row is a list of items: ``(prompt, chosen, rejected)`` token counts make a pair (two
    adjacent segments sharing the prompt, chosen first, labels only on the answer), ``(n,)``
    a plain segment (first half unlabelled).  Token ids are random in ``[5, vocab)``.
    """
    rng = np.random.default_rng(seed)
    rows, branches, next_id = [], [], 0
    for layout in layouts:
        segs: list[tuple[np.ndarray, np.ndarray]] = []
        branch: list[int] = []
        for item in layout:
            if len(item) == 1:
                ids = rng.integers(5, vocab, size=item[0])
                labels = ids.copy()
                labels[: max(1, item[0] // 2)] = IGNORE_INDEX
                segs.append((ids, labels))
                branch.append(0)
                continue
            prompt = rng.integers(5, vocab, size=item[0])
            for code, length in ((1, item[1]), (2, item[2])):
                answer = rng.integers(5, vocab, size=length)
                ids = np.concatenate([prompt, answer])
                labels = np.concatenate([np.full(len(prompt), IGNORE_INDEX), answer])
                segs.append((ids, labels))
                branch.append(code)
        lengths = [len(ids) for ids, _ in segs]
        rows.append(
            PackedRow(
                input_ids=np.concatenate([i for i, _ in segs]).astype(np.int32),
                labels=np.concatenate([lab for _, lab in segs]).astype(np.int32),
                position_ids=np.concatenate([np.arange(k) for k in lengths]).astype(np.int32),
                cu_seqlens=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
                example_ids=np.arange(next_id, next_id + len(segs), dtype=np.int64),
            )
        )
        branches.append(branch)
        next_id += len(segs)
    return rows, branches


def pair_branches(segments: int) -> list[int]:
    """Segments paired in order (1, 2, 1, 2, …), a last odd one plain."""
    return [1 + (j % 2) if j < segments - segments % 2 else 0 for j in range(segments)]


def add_branch_column(out: Path) -> None:
    """Turn a real pack into one with pairs: a branch column in every shard, manifest updated."""
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["shards"]:
        path = out / entry["path"]
        table = pq.read_table(path)
        branches = [pair_branches(len(e)) for e in table["example_ids"].to_pylist()]
        table = table.append_column("branch", pa.array(branches, pa.list_(pa.int8())))
        pq.write_table(table, path)
        entry["bytes"] = path.stat().st_size
        entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2))


def rehash(out: Path, name: str) -> None:
    """Record ``out/name``'s new SHA-256 and size in the manifest, as a forger would."""
    from packshard.digests import sha256_path

    manifest = json.loads((out / "manifest.json").read_text())
    path = out / name
    for entry in [*manifest["shards"], *manifest.get("files", {}).values()]:
        if entry.get("path") == name:
            entry.update(sha256=sha256_path(path), bytes=path.stat().st_size)
    (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2))


def pack_from(root: Path, tokenizer: Path, *args: Any) -> Any:
    """Run ``packshard pack`` in-process from ``root`` (paths in ``args`` relative to it).

    Reference backends, so that stderr holds only what the run itself says.
    """
    from click.testing import CliRunner

    from packshard.cli.commands import main

    argv = ["pack", "-t", str(tokenizer), "--max-seq-len", "16", "--no-progress", *map(str, args)]
    argv += ["--backend", "reference"]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        return CliRunner().invoke(main, argv, prog_name="packshard", catch_exceptions=False)
    finally:
        os.chdir(cwd)


def reject_lines(out: Path) -> list[tuple[int, str, str]]:
    """Return ``(line, code, reason)`` of every line of ``out/rejects.jsonl``."""
    lines = (out / "rejects.jsonl").read_text(encoding="utf-8").splitlines()
    return [(r["line"], r["code"], r["reason"]) for r in map(json.loads, lines)]
