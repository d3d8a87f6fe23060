"""Exports: the (context -> target) pairs a trainer trains on."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from packshard.records import IGNORE_INDEX

# --- exports: the (context -> target) pairs a trainer trains on --------------------------------


def trained_pairs(out: Path) -> Counter:
    """Every trained pair of a packed folder: (the segment's tokens before t, token t).

    Label ``t`` of a segment ``[s, e)`` trains the prediction of ``input_ids[t]`` from
    ``input_ids[s:t]`` (attention inside the segment, positions from 0).
    """
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    pairs: Counter = Counter()
    for entry in manifest["shards"]:
        for row in pq.read_table(out / entry["path"]).to_pylist():
            ids, labels, cu = row["input_ids"], row["labels"], row["cu_seqlens"]
            for s, e in itertools.pairwise(cu):
                for t in range(s + 1, e):
                    if labels[t] != IGNORE_INDEX:
                        pairs[(tuple(ids[s:t]), ids[t])] += 1
    return pairs
