"""The reference log-probability sidecar: its columns, and the checks every reader runs.

``OUT/reference_logps.parquet`` holds one row per preference segment of the pack (a pair's
branch, or a KTO record), written by :mod:`packshard.torch.pairs.reference`::

    example_id   int64     the segment's example (examples.parquet's id)
    logp         float64   summed log-probability of its trained tokens, finite
    num_tokens   int32     its trained tokens, >= 0
    metadata     packshard.format_version, packshard.dataset_id (the pack's)

A DPO or KTO loss reads these numbers as the reference model's: a NaN poisons every step it
meets, a missing row leaves a pair without its reference, a duplicated one makes the lookup
depend on the order of the rows.  :func:`reference_problem` says what breaks the contract,
comparing the ids with the pack's scored segments (:func:`scored_example_ids`: those of the
shards with a ``branch`` or a ``kto_label``, what the writer scores), vectorised: a sort and
a few passes over the columns.  ``verify`` reports it as a finding; the trainer's reader
(:class:`~packshard.torch.pairs.reference.ReferenceLogps`) refuses the file with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packshard.errors import FormatError
from packshard.format.shards import list_values
from packshard.format.version import metadata_problem

REFERENCE_NAME = "reference_logps.parquet"
REFERENCE_KEY = "reference_logps"
"""The sidecar's file name in OUT and its key in the manifest's ``files``."""
REFERENCE_SCHEMA = pa.schema(
    [("example_id", pa.int64()), ("logp", pa.float64()), ("num_tokens", pa.int32())]
)
SCORE_AGAIN = "score it again with write_reference_logps"


def scored_example_ids(tables: Iterable[pa.Table]) -> np.ndarray:
    """Return, sorted, the ids of the segments a reference scores, from the pack's shards.

    A segment is scored when its ``branch`` is not 0 or its ``kto_label`` not -1, as the writer
    scores.  Each table needs ``example_ids`` and whichever of those two its shard has.
    """
    found = [np.zeros(0, dtype=np.int64)]
    for table in tables:
        ids = list_values(table["example_ids"])[0].astype(np.int64)
        scored = np.zeros(len(ids), dtype=bool)
        for name, none in (("branch", 0), ("kto_label", -1)):
            if name in table.column_names:
                scored |= list_values(table[name])[0] != none
        found.append(ids[scored])
    return np.sort(np.concatenate(found))


def reference_problem(table: pa.Table, dataset_id: str, expected: np.ndarray | None) -> str | None:
    """Say what first breaks the sidecar's contract (see the module notes), or None.

    ``expected``: the sorted ids of the pack's scored segments (:func:`scored_example_ids`);
    None when some shard could not be read (the rows are then not compared with them).
    """
    problem = metadata_problem(table.schema.metadata, dataset_id)
    if problem is not None:
        return problem
    for field in REFERENCE_SCHEMA:
        if field.name not in table.column_names:
            return f"no column {field.name} (not a reference log-probability file)"
        got = table.schema.field(field.name).type
        if got != field.type:
            return f"column {field.name} is {got}, the contract says {field.type}"
        if table[field.name].null_count:
            return f"column {field.name} holds nulls"
    ids = np.asarray(table["example_id"].to_numpy(), dtype=np.int64)
    logp = np.asarray(table["logp"].to_numpy(), dtype=np.float64)
    counts = np.asarray(table["num_tokens"].to_numpy(), dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    ids, logp, counts = ids[order], logp[order], counts[order]
    twice = np.flatnonzero(ids[1:] == ids[:-1])
    if twice.size:
        return f"example {int(ids[twice[0]])} has more than one row (one per example)"
    bad = np.flatnonzero(~np.isfinite(logp))
    if bad.size:
        return f"example {int(ids[bad[0]])}: logp is {float(logp[bad[0]])}, not a finite number"
    negative = np.flatnonzero(counts < 0)
    if negative.size:
        return f"example {int(ids[negative[0]])}: num_tokens {int(counts[negative[0]])} < 0"
    if expected is None:
        return None
    missing = np.setdiff1d(expected, ids, assume_unique=True)
    if missing.size:
        more = f" (and {missing.size - 1} more)" if missing.size > 1 else ""
        return f"example {int(missing[0])}{more} has no row: each scored example needs one"
    extra = np.setdiff1d(ids, expected, assume_unique=True)
    if extra.size:
        return f"example {int(extra[0])} is not a scored example of this pack"
    return None


def read_reference(
    path: Path, data: bytes | bytearray, dataset_id: str, expected: np.ndarray | None
) -> pa.Table:
    """Decode the sidecar's bytes (already read and hashed) and check them; refuse by name.

    Raises:
        FormatError: unreadable, or any :func:`reference_problem`, with the fix.

    """
    try:
        table = pq.read_table(pa.BufferReader(pa.py_buffer(data)))
    except Exception as exc:  # any decode failure: pyarrow raises many kinds
        raise FormatError(str(path), f"unreadable Parquet: {exc} ({SCORE_AGAIN})") from None
    problem = reference_problem(table, dataset_id, expected)
    if problem is not None:
        raise FormatError(str(path), f"{problem} ({SCORE_AGAIN})")
    return table
