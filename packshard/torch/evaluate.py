"""Packed evaluation: every example's own loss, from packed rows, traced to its source line.

Rows are fed as :func:`~packshard.torch.hf.collate_hf` lays them (``[1, T]``, positions
restarting in every segment, no mask), after :func:`~packshard.torch.seams.check_model` has
shown on the first batch that the model keeps segments apart.  Token losses are summed per
segment, never across one::

    labels      - a a | - b | - c c c       (- = -100; the first label of a segment is -100)
    token loss  0 x x | 0 y | 0 z z z       loss of label t from the logits of t - 1
    per example loss_sum = Σ x, num_tokens = 2; loss_sum = y, 1; …   loss_mean = sum / tokens

so each example's numbers are those of the example run alone (to float rounding).  ``split``
selects the shards read; records carry ``example_id``, ``source`` and ``line``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from packshard.format.examples import read_examples
from packshard.format.folder.paths import inside_folder
from packshard.torch.collate import collate_varlen, token_losses
from packshard.torch.dataset import PackedDataset, split_shards
from packshard.torch.seams import check_model, evaluating, packed_logits
from packshard.torch.steps import positive_int

INDEX_COLUMNS = ("example_id", "source", "line")


def _segment_losses(model: Any, batch: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    logits = packed_logits(model, batch)[0]
    losses = token_losses(logits, batch["labels"][0].to(logits.device))
    per_token = losses.double().cpu().numpy()  # loss of label t, 0 at t = 0
    cu = batch["cu_seqlens"].numpy().astype(np.int64)
    sums = np.add.reduceat(per_token, cu[:-1]) if len(cu) > 1 else np.zeros(0)
    counts = batch["num_loss_tokens_per_segment"].numpy().astype(np.int64)
    return sums, counts


def evaluate(
    model: Any,
    out: str | os.PathLike[str],
    split: str = "eval",
    batch_size: int = 8,
) -> list[dict[str, Any]]:
    """Return one record per example of ``split``: its loss summed and averaged over its tokens.

    Each record holds ``example_id``, ``source``, ``line``, ``loss_sum`` (fp64),
    ``num_tokens`` and ``loss_mean`` (``nan`` without trained tokens), in example-id order.
    The model runs in eval mode without gradients; its mode is restored.
    """
    positive_int("batch_size", batch_size)
    data = PackedDataset(out, split=None)  # every shard: split_shards picks them
    chosen = split_shards(data.manifest["shards"], split, f"{data.out} has", "evaluate")
    rows = np.concatenate([np.arange(data.starts[k], data.starts[k + 1]) for k in chosen])
    name = str(data.manifest.get("files", {}).get("examples", {}).get("path", "examples.parquet"))
    table = read_examples(inside_folder(data.out, name), data.dataset_id, list(INDEX_COLUMNS))
    ids, sources, lines = (table[c].to_pylist() for c in INDEX_COLUMNS)
    where = {k: (src, line) for k, src, line in zip(ids, sources, lines, strict=True)}
    found: dict[int, tuple[float, int]] = {}
    with evaluating(model):
        for start in range(0, len(rows), batch_size):
            batch = collate_varlen([data[int(i)] for i in rows[start : start + batch_size]])
            if start == 0:
                check_model(model, batch)
            sums, counts = _segment_losses(model, batch)
            ids = torch.as_tensor(batch["example_ids"]).tolist()
            for k, s, c in zip(ids, sums, counts, strict=True):
                prior = found.get(k, (0.0, 0))  # an example split over rows adds up its parts
                found[k] = (prior[0] + float(s), prior[1] + int(c))
    return [
        {
            "example_id": k,
            "source": where.get(k, ("", 0))[0],
            "line": where.get(k, ("", 0))[1],
            "loss_sum": loss_sum,
            "num_tokens": tokens,
            "loss_mean": loss_sum / tokens if tokens else float("nan"),
        }
        for k, (loss_sum, tokens) in sorted(found.items())
    ]
