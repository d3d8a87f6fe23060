"""Megatron-Bridge packed-sequence Parquet: ``input_ids``, ``seq_start_id``, ``loss_mask``.

This is ``--to megatron``, read by Megatron-Bridge's ``GPTSFTPackedParquetDataset`` from
0.4.0 on; releases up to 0.3.1 read ``--to megatron-npy`` (:mod:`packshard.export.megatron_npy`).

The reader takes files ending ``.idx.parquet`` (or a folder or glob of ``.parquet``), requires
these three columns (others are ignored), reads one row group at a time and slices each segment
``[s, e)`` of ``seq_start_id + [len(input_ids)]`` itself: inputs ``input_ids[s:e-1]``, targets
``input_ids[s+1:e]``, loss ``loss_mask[s:e-1]``.  It stores no labels, so its ``loss_mask`` is
*shifted*: ``loss_mask[p]`` says whether the target at ``p + 1`` trains.  For a packshard row
(``-`` = -100)::

    input_ids      a b c | d e f g         cu_seqlens [0, 3, 7]
    labels         - b c | - - f g
    seq_start_id   [0, 3]                  cu_seqlens[:-1]
    loss_mask      1 1 0 | 0 1 1 0         labels[p + 1] != -100, 0 at every segment's end

so the trained (context → target) pairs are packshard's exactly (the first label of every
segment is -100, so the whole-row shift gives 0 at every segment's end).  A one-token segment
has no target: its token is dropped (counted in ``export.json``).  The collator zeroes the
loss where the *input* is EOS (it pads with EOS), so trained targets after an EOS inside a
sequence are counted (``targets_after_eos``).

An aligned pack (``pack --cp N``, ``--pad-multiple``) is written as Megatron-Bridge's packer
writes it for ``pad_seq_to_mult = m``: every sequence's run-time length ``n − 1`` padded with
EOS to a multiple of ``m`` (loss 0 on the pads).  For ``m = 4`` and ``a b c d e f``::

    input_ids   a b c d e f E E E      stored 9 = 8 + 1, run-time 8 = 2·4
    loss_mask   … shifted …   0 0 0 0  E = EOS

Files, as Megatron-Bridge's builder names them: ``training_{N}.idx.parquet`` (row groups of
500 rows) and ``{N}_metadata.jsonl`` (lengths at run time, ``n - 1``), ``N`` = ``max_seq_len``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packshard.arrays import exclusive_cumsum
from packshard.errors import UsageError
from packshard.export.common import Rows, read_rows
from packshard.format.topology import pad_segments, padded_lengths
from packshard.records import IGNORE_INDEX

ROW_GROUP_ROWS = 500
SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("seq_start_id", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
    ]
)


def megatron_table(
    rows: Rows, eos_id: int | None, multiple: int = 1
) -> tuple[pa.Table, dict[str, Any]]:
    """Convert one shard's rows; return the table and its run-time length statistics.

    ``eos_id`` is the tokenizer's EOS id (None: none), whose trained targets the collator drops.
    ``multiple`` > 1 (an aligned pack) pads every sequence's run-time length to it with EOS
    (:func:`aligned_lengths`).
    """
    trained = rows.labels != IGNORE_INDEX
    loss_mask = np.zeros(len(trained), dtype=np.int8)
    loss_mask[:-1] = trained[1:]
    kept_seg = rows.seg_len > 1
    keep = np.repeat(kept_seg, rows.seg_len)
    kept_len = rows.seg_len[kept_seg]
    ids, mask = rows.ids[keep].astype(np.int32), loss_mask[keep]
    stored = kept_len
    if multiple > 1:
        if eos_id is None:
            raise UsageError(
                "an aligned pack's Megatron export pads with the EOS id, and the tokenizer "
                "has none (pack without --cp/--pad-multiple, or with a tokenizer that has EOS)"
            )
        stored = aligned_lengths(kept_len, multiple)
        ids = pad_segments(ids, kept_len, stored, int(eos_id))
        mask = pad_segments(mask, kept_len, stored, 0)
    row_of_kept = np.repeat(np.arange(rows.num_rows), np.diff(rows.seg_off))[kept_seg]
    segs = np.bincount(row_of_kept, minlength=rows.num_rows)
    live = segs > 0  # a row left with no segment is not written
    seg_off = exclusive_cumsum(segs[live])
    tok_off = exclusive_cumsum(
        np.bincount(row_of_kept, weights=stored, minlength=rows.num_rows)[live]
    )
    starts = exclusive_cumsum(stored)[:-1] - np.repeat(tok_off[:-1], segs[live])

    def lists(offsets: np.ndarray, values: np.ndarray) -> pa.ListArray:
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))

    table = pa.Table.from_arrays(
        [lists(tok_off, ids), lists(seg_off, starts.astype(np.int32)), lists(tok_off, mask)],
        schema=SCHEMA,
    )
    after_eos = 0 if eos_id is None else int(np.count_nonzero(loss_mask & (rows.ids == eos_id)))
    runtime = np.bincount(row_of_kept, weights=stored - 1, minlength=rows.num_rows)[live]
    stats = {
        "rows": int(live.sum()),
        "sequences": len(kept_len),
        "dropped_one_token_segments": int((~kept_seg).sum()),
        "max_seqlen": int(stored.max() - 1) if len(stored) else 0,
        "max_segments": int(segs.max()) if len(segs) else 0,
        "runtime_tokens": int(runtime.sum()),
        "min_runtime_row": int(runtime.min()) if len(runtime) else 0,
        "targets_after_eos": after_eos,
    }
    if multiple > 1:
        stats["alignment_pads"] = int((stored - kept_len).sum())
    return table, stats


def aligned_lengths(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """Return each sequence's stored length once its run-time length is a multiple.

    Megatron-Bridge trains ``n − 1`` tokens of a stored ``n``, so a sequence is padded to
    ``⌈(n − 1)/m⌉·m + 1`` stored tokens, as its packer does; the run-time row stays within the
    padded row, hence ``max_seq_len``.
    """
    return padded_lengths(np.asarray(lengths, dtype=np.int64) - 1, multiple) + 1


def write_megatron(
    out: Path, folder: Path, max_seq_len: int, eos_id: int | None, multiple: int = 1
) -> dict[str, Any]:
    """Write the Megatron-Bridge files of ``out`` into ``folder``; return what was written.

    ``multiple`` > 1: an aligned pack, written in the context-parallel form (its
    ``pad_seq_to_mult``, recorded in what is returned).
    """
    name = f"training_{max_seq_len}.idx.parquet"
    totals: dict[str, Any] = {}
    with pq.ParquetWriter(folder / name, SCHEMA) as writer:
        for rows in read_rows(out):
            table, stats = megatron_table(rows, eos_id, multiple)
            if table.num_rows:
                writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
            merge_stats(totals, stats)
    written = write_metadata(folder, name, totals, max_seq_len)
    return {**written, "pad_seq_to_mult": multiple} if multiple > 1 else written


def merge_stats(totals: dict[str, Any], stats: dict[str, Any]) -> None:
    """Add one shard's statistics to ``totals`` (max of maxima, min of minima, sum of counts)."""
    for key, value in stats.items():
        merge = max if key.startswith("max") else min if key.startswith("min") else sum
        totals[key] = merge([totals[key], value]) if key in totals else value


def write_metadata(
    folder: Path, training: str, totals: dict[str, Any], max_seq_len: int
) -> dict[str, Any]:
    """Write the metadata Megatron-Bridge reads (``{N}_metadata.jsonl`` holds a list of it).

    Returns what the export wrote: ``training``, the metadata file, ``totals`` and the metadata.
    """
    rows_out = totals.get("rows", 0)
    metadata = {
        "dataset_max_seqlen": totals.get("max_seqlen", 0),
        "max_samples_per_bin": totals.get("max_segments", 0),
        "packing_factor": round(totals.get("sequences", 0) / rows_out, 2) if rows_out else 0.0,
        "packing_efficiency": round(
            100 * totals.get("runtime_tokens", 0) / rows_out / max_seq_len, 2
        )
        if rows_out
        else 0.0,
        "pack_size": max_seq_len,
        "min_packed_seqlen": totals.get("min_runtime_row", 0),
    }
    meta_name = f"{max_seq_len}_metadata.jsonl"
    (folder / meta_name).write_text(json.dumps([metadata]) + "\n", encoding="utf-8")
    return {"training": training, "metadata": meta_name, **totals, "packing": metadata}
