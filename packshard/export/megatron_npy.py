"""Megatron-Bridge's older packed-sequence file: ``training_{N}.npy`` and its metadata.

This is ``--to megatron-npy``, for Megatron-Bridge releases up to 0.3.1, which train packed SFT
data only from a ``.npy`` file (``GPTSFTPackedDataset`` loads it with ``np.load(path,
allow_pickle=True)``; later releases read ``--to megatron``'s Parquet).  The file is a
one-dimensional NumPy *object* array, one ``dict`` per packed row, as that release's own
``fill_packing_strategy`` writes it::

    {"input_ids": [a, b, c, d, e, f, g],     Python lists of ints
     "loss_mask": [1, 1, 0, 0, 1, 1, 0],     shifted: loss_mask[p] trains the target at p + 1
     "seq_start_id": [0, 3]}                 each sequence's start (a list: the reader appends
                                             len(input_ids) with +)

The reader slices each sequence as the Parquet form's does, so the rows are
:func:`packshard.export.megatron.megatron_table`'s, written as dicts.  Beside it,
``{N}_metadata.jsonl`` (a JSON list of one object: ``max_samples_per_bin``,
``dataset_max_seqlen``, ``min_packed_seqlen`` … which the collator reads with
``pad_cu_seqlens``), ``N`` = packshard's ``max_seq_len`` = ``packed_sequence_size``.

An object array is stored by NumPy with pickle: that is the released reader's format.
packshard writes it from lists and ints only, and never loads one (the tests read it back with
an unpickler that admits NumPy's array reconstruction alone).

The collator is the Parquet form's: it zeroes the loss where the *input* token is EOS, and the
trained targets lost that way are counted alike (``targets_after_eos``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from packshard.export.common import read_rows
from packshard.export.megatron import megatron_table, merge_stats, write_metadata


def write_megatron_npy(
    out: Path, folder: Path, max_seq_len: int, eos_id: int | None
) -> dict[str, Any]:
    """Write ``training_{N}.npy`` and ``{N}_metadata.jsonl`` into ``folder``; return the counts."""
    samples: list[dict[str, list[int]]] = []
    totals: dict[str, Any] = {}
    for rows in read_rows(out):
        table, stats = megatron_table(rows, eos_id)
        merge_stats(totals, stats)
        columns = table.to_pydict()
        for ids, mask, starts in zip(
            columns["input_ids"], columns["loss_mask"], columns["seq_start_id"], strict=True
        ):
            samples.append({"input_ids": ids, "loss_mask": mask, "seq_start_id": starts})
    array = np.empty(len(samples), dtype=object)
    array[:] = samples
    name = f"training_{max_seq_len}.npy"
    with open(folder / name, "wb") as fh:
        np.save(fh, array, allow_pickle=True)
    return write_metadata(folder, name, totals, max_seq_len)
