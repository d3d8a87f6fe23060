"""Collate packed rows into the two batch shapes trainers take, and normalize their loss.

Varlen (:func:`collate_varlen`): every row of the batch is laid end to end as one sequence
``[1, T]``; the segment boundaries of all rows become one ``cu_seqlens``.  Three rows holding
segments of 3+2, 4 and 1+2 tokens, padded to a multiple of 8::

    input_ids     a a a b b c c c c d e e .  .  .  .          T = 16
    position_ids  0 1 2 0 1 0 1 2 3 0 0 1 0  1  2  3
    labels        - a a - b - c c c - - e -  -  -  -          (- = IGNORE_INDEX)
    seq_idx       0 0 0 1 1 2 2 2 2 3 4 4 5  5  5  5
    cu_seqlens    [0, 3, 5, 9, 10, 12, 16]                  max_seqlen = 4

Padding (``pad_to_multiple_of``) forms its own last segment with positions 0, 1, … and no
loss.  ``static_cu_seqlens_len`` repeats the last boundary so the tensor keeps one shape
across steps (CUDA graphs, context parallelism).

Padded (:func:`collate_padded`): ``[B, max_seq_len]`` tensors, padding in no segment
(``seq_idx`` -1, label -100, ``attention_mask`` 0); pair with ``masks.padded_block_causal_mask``.

Loss.  A packed step holds as many examples as fit, so to keep the token mean or the
per-example mean exact across micro-batches and ranks, divide summed losses by a global
count: :func:`loss_normalizers` gives the loss-token and example counts,
:func:`segment_mean_loss` the per-example mean.  Labels are unshifted and the first label of
every segment is -100, so no prediction crosses a seam.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from packshard.arrays import count_trained, exclusive_cumsum
from packshard.errors import UsageError
from packshard.records import IGNORE_INDEX
from packshard.torch.masks import seq_idx_from_cu_seqlens
from packshard.torch.steps import with_step

Row = dict[str, torch.Tensor]
ROW_KEYS = ("input_ids", "labels", "position_ids", "cu_seqlens", "example_ids")
SEGMENT_FILL = {"branch": 0, "kto_label": -1}
"""Per-segment columns of preference packs, and their value on padding or rows without them."""


def packed_row(feature: Mapping[str, Any]) -> Row:
    """Return a row as the collators take it: tensors, with its segment boundaries.

    Rows come from the reader (returned as they are), ``load_dataset(OUT)`` or a trainer that
    dropped columns.  The boundaries are ``cu_seqlens``, else ``seq_lengths``, else where
    ``position_ids`` restart; a row with none of them is refused.
    """
    extra = {
        k: torch.as_tensor(feature[k]).to(torch.int8)
        for k in SEGMENT_FILL
        if feature.get(k) is not None
    }
    if is_reader_row(feature):
        return {k: feature[k] for k in ROW_KEYS} | extra
    ids = torch.as_tensor(feature["input_ids"]).to(torch.int64)
    labels = torch.as_tensor(feature["labels"]).to(torch.int64) if "labels" in feature else None
    given = feature.get("position_ids")
    positions = None if given is None else torch.as_tensor(given).to(torch.int64)
    if "cu_seqlens" in feature:
        cu = torch.as_tensor(feature["cu_seqlens"]).to(torch.int64)
    elif "seq_lengths" in feature:
        cu = F.pad(torch.as_tensor(feature["seq_lengths"]).to(torch.int64).cumsum(0), (1, 0))
    elif positions is not None:
        restart = torch.ones_like(positions, dtype=torch.bool)
        restart[1:] = positions[1:] != positions[:-1] + 1
        cu = F.pad(restart.nonzero().flatten(), (0, 1), value=len(ids))
    else:
        raise UsageError(
            "a row reached the collator without cu_seqlens, seq_lengths or position_ids, so "
            "its seams cannot be found (keep position_ids: a trainer that removes unused "
            "columns keeps them; or pass remove_unused_columns=False)"
        )
    if labels is None or cu[0] != 0 or cu[-1] != len(ids):
        raise UsageError(f"a row's labels or boundaries do not fit its {len(ids)} tokens")
    if positions is None:
        positions = torch.arange(len(ids)) - torch.repeat_interleave(cu[:-1], cu.diff())
    example_ids = feature.get("example_ids")
    return {
        "input_ids": ids,
        "labels": labels,
        "position_ids": positions,
        "cu_seqlens": cu.to(torch.int32),
        "example_ids": torch.full((len(cu) - 1,), -1, dtype=torch.int64)
        if example_ids is None
        else torch.as_tensor(example_ids).to(torch.int64),
    } | extra


def segment_column(rows: list[Mapping[str, Any]], name: str) -> list[np.ndarray] | None:
    """Return each row's per-segment ``name`` (fill value where a row lacks it), or None.

    None when no row has it: batches of packs without preference records keep their keys.
    """
    if not any(name in r for r in rows):
        return None
    fill = SEGMENT_FILL[name]
    return [
        r[name].numpy().astype(np.int8)
        if name in r
        else np.full(r["cu_seqlens"].shape[0] - 1, fill, np.int8)
        for r in rows
    ]


def is_reader_row(feature: Mapping[str, Any]) -> bool:
    """Whether ``feature`` is a row as the reader yields it: every key a tensor."""
    return all(isinstance(feature.get(k), torch.Tensor) for k in ROW_KEYS)


def check_positions(positions: np.ndarray, cu_seqlens: np.ndarray) -> None:
    """Refuse positions that do not count 0, 1, … within every segment of ``cu_seqlens``.

    Checked at every segment's first and last token (two gathers per batch): positions
    regenerated over a whole row, the usual way seams get lost, fail both.
    """
    starts, lengths = cu_seqlens[:-1], np.diff(cu_seqlens)
    if (positions[starts] != 0).any() or (positions[cu_seqlens[1:] - 1] != lengths - 1).any():
        raise UsageError(
            "a row's position_ids do not restart at 0 where its segments start (they were "
            "regenerated, or the row is not a packshard row: run packshard verify)"
        )


def count_loss_tokens(labels: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Return the number of labels != IGNORE_INDEX in each segment of a flat sequence (int32).

    Every label counts (:func:`packshard.arrays.count_trained` with ``skip_first=False``): a
    packed segment's first label is already -100.
    """
    flat = labels.reshape(-1).cpu().numpy()
    counts = count_trained(flat, cu_seqlens.cpu().numpy().astype(np.int64), skip_first=False)
    return torch.from_numpy(counts.astype(np.int32))


def collate_varlen(
    rows: list[Mapping[str, Any]],
    pad_to_multiple_of: int | None = None,
    static_cu_seqlens_len: int | None = None,
    pad_token_id: int = 0,
) -> dict[str, torch.Tensor | int]:
    """Flatten rows into one ``[1, T]`` sequence with ``cu_seqlens`` over all their segments.

    Returns ``input_ids``, ``labels``, ``position_ids`` (int64 ``[1, T]``), ``seq_idx`` (int32
    ``[1, T]``), ``cu_seqlens`` (int32 ``[S + 1]``), ``max_seqlen`` (int),
    ``num_loss_tokens_per_segment`` (int32 ``[S]``), ``example_ids`` (int64 ``[S]``, -1 for
    padding and empty segments) and ``num_loss_tokens`` (int); rows of a preference pack add
    ``branch`` and ``kto_label`` (int8 ``[S]``, 0 and -1 on padding).
    """
    if not rows:
        raise UsageError("collate_varlen got an empty batch")
    checked = not all(is_reader_row(r) for r in rows)  # reader rows derive them from cu_seqlens
    raw, rows = rows, [packed_row(r) for r in rows]
    total = sum(int(r["input_ids"].shape[0]) for r in rows)
    pad = (-total) % pad_to_multiple_of if pad_to_multiple_of else 0
    # Per-segment bookkeeping is small: numpy, few calls.  Token columns: one copy each.
    tail = [[pad]] if pad else []  # padding is a segment of its own, example id -1
    seqlens = np.concatenate([np.diff(r["cu_seqlens"].numpy()) for r in rows] + tail)
    seqlens = seqlens.astype(np.int64)
    example_ids = np.concatenate([r["example_ids"].numpy() for r in rows] + [[-1]] * bool(pad))
    cu_seqlens = exclusive_cumsum(seqlens)
    out: dict[str, torch.Tensor | int] = {}
    columns: dict[str, torch.Tensor] = {}
    for name, fill in (("input_ids", pad_token_id), ("labels", IGNORE_INDEX), ("position_ids", 0)):
        parts = [r[name] for r in rows]
        if pad:
            parts.append(torch.arange(pad) if name == "position_ids" else torch.full((pad,), fill))
        out[name] = columns[name] = torch.cat(parts).to(torch.int64).unsqueeze(0)
    if checked:
        check_positions(columns["position_ids"].numpy()[0], cu_seqlens)
    loss_counts = count_trained(columns["labels"].numpy()[0], cu_seqlens, skip_first=False)
    seq_idx = np.repeat(np.arange(len(seqlens), dtype=np.int32), seqlens)
    if static_cu_seqlens_len is not None:
        if len(cu_seqlens) > static_cu_seqlens_len:
            raise UsageError(
                f"batch has {len(seqlens)} segments, more than static_cu_seqlens_len "
                f"{static_cu_seqlens_len} allows (raise static_cu_seqlens_len)"
            )
        extra = static_cu_seqlens_len - len(cu_seqlens)
        cu_seqlens = np.pad(cu_seqlens, (0, extra), constant_values=total + pad)
        loss_counts = np.pad(loss_counts, (0, extra))
        example_ids = np.pad(example_ids, (0, extra), constant_values=-1)
    for name, fill in SEGMENT_FILL.items():
        per_row = segment_column(rows, name)
        if per_row is not None:
            values = np.concatenate([*per_row, np.full(int(bool(pad)), fill, np.int8)])
            values = np.pad(values, (0, len(cu_seqlens) - 1 - len(values)), constant_values=fill)
            out[name] = torch.from_numpy(values)
    out["seq_idx"] = torch.from_numpy(seq_idx).unsqueeze(0)
    out["cu_seqlens"] = torch.from_numpy(cu_seqlens.astype(np.int32))
    out["max_seqlen"] = int(seqlens.max())
    out["num_loss_tokens_per_segment"] = torch.from_numpy(loss_counts.astype(np.int32))
    out["num_loss_tokens"] = int(loss_counts.sum())
    out["example_ids"] = torch.from_numpy(example_ids.astype(np.int64))
    return with_step(out, raw)


def collate_padded(
    rows: list[Mapping[str, Any]], max_seq_len: int, pad_token_id: int = 0
) -> dict[str, torch.Tensor]:
    """Stack rows into ``[B, max_seq_len]`` tensors; padding belongs to no segment.

    Returns ``input_ids``, ``labels``, ``position_ids`` (int64, padding: pad id, -100, 0),
    ``attention_mask`` (int64, 1 on tokens), ``seq_idx`` (int32, -1 on padding), per-row
    ``cu_seqlens`` (int32 ``[B, S_max + 1]``, padded with the row's token count),
    ``num_loss_tokens_per_segment`` (int32 ``[B, S_max]``) and ``num_tokens`` (int64 ``[B]``);
    rows of a preference pack add ``branch``, ``kto_label`` (int8 ``[B, S_max]``, 0 and -1 past
    a row's segments) and ``example_ids`` (int64 ``[B, S_max]``, -1 past them).
    """
    if not rows:
        raise UsageError("collate_padded got an empty batch")
    raw, rows = rows, [packed_row(r) for r in rows]
    batch = len(rows)
    ids = torch.full((batch, max_seq_len), pad_token_id, dtype=torch.int64)
    labels = torch.full((batch, max_seq_len), IGNORE_INDEX, dtype=torch.int64)
    positions = torch.zeros((batch, max_seq_len), dtype=torch.int64)
    num_tokens = torch.tensor([r["input_ids"].shape[0] for r in rows], dtype=torch.int64)
    width = max(r["cu_seqlens"].shape[0] for r in rows)
    cu_all = torch.zeros((batch, width), dtype=torch.int32)
    loss_counts = torch.zeros((batch, width - 1), dtype=torch.int32)
    for b, r in enumerate(rows):
        n = int(num_tokens[b])
        if n > max_seq_len:
            raise UsageError(f"row {b} has {n} tokens > max_seq_len {max_seq_len}")
        ids[b, :n] = r["input_ids"]
        labels[b, :n] = r["labels"]
        positions[b, :n] = r["position_ids"]
        cu = r["cu_seqlens"].to(torch.int64)
        check_positions(r["position_ids"].numpy(), cu.numpy())
        cu_all[b] = n
        cu_all[b, : cu.shape[0]] = cu
        loss_counts[b, : cu.shape[0] - 1] = count_loss_tokens(r["labels"], cu)
    seq_idx = seq_idx_from_cu_seqlens(cu_all, max_seq_len)  # -1 past a row's last boundary
    segment_keys: dict[str, torch.Tensor] = {}
    for name, fill in SEGMENT_FILL.items():
        per_row = segment_column(rows, name)
        if per_row is not None:
            grid = np.full((batch, width - 1), fill, np.int8)
            owners = np.full((batch, width - 1), -1, np.int64)
            for b, (part, r) in enumerate(zip(per_row, rows, strict=True)):
                grid[b, : part.shape[0]] = part
                owners[b, : part.shape[0]] = r["example_ids"].numpy()
            segment_keys[name] = torch.from_numpy(grid)
            segment_keys["example_ids"] = torch.from_numpy(owners)
    return with_step(
        segment_keys
        | {
            "input_ids": ids,
            "labels": labels,
            "position_ids": positions,
            "attention_mask": (seq_idx >= 0).to(torch.int64),
            "seq_idx": seq_idx,
            "cu_seqlens": cu_all,
            "num_loss_tokens_per_segment": loss_counts,
            "num_tokens": num_tokens,
        },
        raw,
    )


def flash_attn_kwargs(batch: dict[str, torch.Tensor | int]) -> dict[str, torch.Tensor | int]:
    """Return a varlen batch's boundaries under the names Hugging Face's flash path takes.

    ``model(input_ids=…, position_ids=…, **flash_attn_kwargs(batch))`` with
    ``attn_implementation="flash_attention_2"`` runs one varlen kernel over all segments.
    """
    return {
        "cu_seq_lens_q": batch["cu_seqlens"],
        "cu_seq_lens_k": batch["cu_seqlens"],
        "max_length_q": batch["max_seqlen"],
        "max_length_k": batch["max_seqlen"],
    }


def loss_normalizers(batch: dict[str, torch.Tensor | int]) -> dict[str, torch.Tensor]:
    """Return the denominators of the two usual objectives for one (micro-)batch.

    ``num_loss_tokens``: divide the summed token losses by it (summed over micro-batches and
    ranks) for the token mean.  ``num_examples``: segments with at least one loss token; divide
    the summed :func:`segment_mean_loss` by it for the per-example mean.
    """
    counts = batch["num_loss_tokens_per_segment"]
    assert isinstance(counts, torch.Tensor)
    return {
        "num_loss_tokens": counts.sum().to(torch.int64),
        "num_examples": (counts > 0).sum().to(torch.int64),
        "num_loss_tokens_per_segment": counts,
    }


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Return each label's cross-entropy (``[..., T]``, 0 where no loss), shift included.

    The loss of label ``t`` uses ``logits[..., t - 1, :]``; position 0 never has one.
    """
    shifted = F.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX)
    flat = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        shifted.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    ).reshape(shifted.shape)
    return F.pad(flat[..., :-1], (1, 0), value=0.0)


def segment_mean_loss(
    logits: torch.Tensor, labels: torch.Tensor, cu_seqlens: torch.Tensor
) -> torch.Tensor:
    """Return the mean token loss of every segment (0 where it has no loss token).

    ``logits`` ``[1, T, V]`` with flat ``cu_seqlens`` ``[S + 1]`` gives ``[S]``; a padded
    batch ``[B, L, V]`` with ``cu_seqlens`` ``[B, S + 1]`` gives ``[B, S]``.
    """
    losses = token_losses(logits, labels)
    cu = cu_seqlens.to(torch.int64).reshape(-1, cu_seqlens.shape[-1])
    losses = losses.reshape(cu.shape[0], -1)
    csum = F.pad(losses.double().cumsum(-1), (1, 0), value=0.0)
    sums = csum.gather(1, cu[:, 1:]) - csum.gather(1, cu[:, :-1])
    valid = F.pad((labels.reshape(cu.shape[0], -1) != IGNORE_INDEX).long().cumsum(-1), (1, 0))
    counts = valid.gather(1, cu[:, 1:]) - valid.gather(1, cu[:, :-1])
    means = (sums / counts.clamp(min=1)).to(losses.dtype)
    return means.reshape(*cu_seqlens.shape[:-1], -1)
