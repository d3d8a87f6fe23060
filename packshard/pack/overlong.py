"""The overlong policy: what happens to an example longer than ``max_seq_len`` (``L``).

Applied to every tokenized chunk before it is spilled:

* ``drop``: the example becomes a reject with code ``too_long``;
* ``truncate``: keep the first ``L`` tokens; an example left with no target is dropped
  (code ``truncated_no_targets``);
* ``split``: consecutive parts of ``L`` tokens, each its own example (``part`` 0, 1, …);
  parts without a target are dropped; a record whose parts are all dropped is dropped
  (code ``split_no_targets``);
* ``error``: stop with a :class:`RecordError` naming ``file:line``.

A preference pair is one unit (:func:`police_pairs`, applied first): a pair whose two
branches together pass ``L`` is dropped with one ``too_long`` reject naming both lengths
(``drop``, and ``split``, which cannot cut a pair), stops the run (``error``), or has its
answers cut, never its prompts (``truncate``; the prompt of a branch is everything before
its first trained token).  The answer budget ``B = L − Pc − Pr`` is shared so that the
shorter answer stays whole when it fits in half::

    chosen    [ prompt Pc ][ answer Ac ····· ]       Ac + Ar > B
    rejected  [ prompt Pr ][ answer Ar ·· ]
    kept      a = Ac if Ac ≤ B//2, else B − Ar if Ar ≤ B − B//2, else B//2;  b = B − a

A pair whose prompts leave fewer than 2 answer tokens (one each) is dropped as ``too_long``.

"Target" counts labels other than the example's first, which packing always masks.  Under
``wrapped`` the planner cuts at row ends instead.  Vectorised over the chunk; split parts::

    tokens   [0 ........................ n)
    parts    [0, L) [L, 2L) … [kL, n)          part p starts at p·L within the example
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from packshard.arrays import count_trained, exclusive_cumsum
from packshard.errors import RecordError
from packshard.ingest import pair_starts
from packshard.ingest.types import TokenizedBatch
from packshard.records import IGNORE_INDEX, Reject


@dataclass(frozen=True, slots=True)
class Policed:
    """A chunk after the overlong policy: kept examples, where each came from, and the drops.

    Kept example ``j`` is (a part of) batch example ``index[j]``: ``ids``/``labels`` sliced by
    ``offsets``, ``part`` 0, 1, …, ``truncated`` when it lost its tail.
    """

    ids: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray
    index: np.ndarray  # int64 [kept]
    parts: np.ndarray  # int32 [kept]
    truncated: np.ndarray  # bool [kept]
    rejects: tuple[Reject, ...]
    tokens_truncated: int = 0
    records_split: int = 0
    parts_dropped: int = 0


def apply_overlong(
    batch: TokenizedBatch,
    max_seq_len: int,
    policy: str,
    cut: bool = True,
    records: np.ndarray | None = None,
) -> Policed:
    """Apply ``policy`` to the examples of ``batch`` longer than ``max_seq_len``.

    ``cut=False`` (the ``wrapped`` strategy) keeps every example whole.  ``records`` numbers
    each example's record: ``drop`` drops each example too long on its own, and a record is
    dropped (one reject) only when none of its examples is left.
    """
    ids, labels, offsets = batch.input_ids, batch.labels, batch.offsets
    lengths = np.diff(offsets)
    n = len(lengths)
    record = np.arange(n) if records is None else np.asarray(records, dtype=np.int64)
    over = np.flatnonzero(lengths > max_seq_len) if cut else np.zeros(0, np.int64)
    whole = Policed(
        ids,
        labels,
        offsets,
        np.arange(n, dtype=np.int64),
        np.zeros(n, np.int32),
        np.zeros(n, bool),
        (),
    )
    if not over.size:
        return whole
    if policy == "error":
        i = int(over[0])
        raise RecordError(
            "too_long",
            f"example is {int(lengths[i])} tokens > max_seq_len {max_seq_len} "
            "(use --overlong truncate|split|drop)",
            batch.refs[i].source,
            batch.refs[i].line,
        )
    if policy == "drop":  # each example alone: a turn example that fits is kept
        keep = np.ones(n, dtype=bool)
        keep[over] = False
        kept_any = np.zeros(int(record.max()) + 1, dtype=bool)
        kept_any[record[keep]] = True
        gone = over[~kept_any[record[over]]]  # records none of whose examples is left
        first_over = gone[np.unique(record[gone], return_index=True)[1]]
        rejects = tuple(
            Reject(
                batch.refs[i],
                batch.domains[i],
                "too_long",
                f"{_which(batch, i)}is {int(lengths[i])} tokens > max_seq_len {max_seq_len} "
                "(dropped; use --overlong truncate|split to keep it)",
            )
            for i in np.sort(first_over).tolist()
        )
        return replace(_select(whole, keep, rejects), parts_dropped=int(over.size - gone.size))
    split = policy == "split"
    cut_ids, cut_labels, cut_offsets, index, parts = _cut(
        ids, labels, offsets, max_seq_len, over, split
    )
    truncated = np.zeros(len(index), dtype=bool)
    if not split:
        truncated[over] = True
    pieces = Policed(cut_ids, cut_labels, cut_offsets, index, parts, truncated, ())
    empty = (count_trained(cut_labels, cut_offsets) == 0) & (
        truncated | (parts > 0) | np.isin(index, over)
    )
    rejects, lost = _dropped_records(batch, record, index, empty, policy)
    chopped = int(lengths[over].sum() - max_seq_len * over.size) if not split else 0
    return replace(
        _select(pieces, ~empty, rejects),
        tokens_truncated=chopped,
        records_split=int(over.size) if split else 0,
        parts_dropped=int(empty.sum()) if split else lost,
    )


def _which(batch: TokenizedBatch, i: int) -> str:
    """Name example ``i`` in a reason: ``"example "``, or the message it trains (expand)."""
    turn = int(batch.turns[i]) if batch.turns is not None else 0
    return f"example for message {turn} " if turn else "example "


def _cut(
    ids: np.ndarray,
    labels: np.ndarray,
    offsets: np.ndarray,
    limit: int,
    over: np.ndarray,
    split: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Truncate or split the examples listed in ``over``; others pass through unchanged.

    Returns new ``ids, labels, offsets`` and, per new example, the index of the example it
    came from and its part number.
    """
    lengths = np.diff(offsets)
    pieces = np.ones(len(lengths), dtype=np.int64)
    if split:
        pieces[over] = -(-lengths[over] // limit)
    index = np.repeat(np.arange(len(lengths)), pieces)
    part = np.arange(len(index)) - np.repeat(exclusive_cumsum(pieces)[:-1], pieces)
    start = offsets[index] + part * limit
    end = np.minimum(start + limit, offsets[index + 1])
    new_offsets = exclusive_cumsum(end - start)
    gather = np.repeat(start - new_offsets[:-1], end - start) + np.arange(int(new_offsets[-1]))
    return ids[gather], labels[gather], new_offsets, index, part.astype(np.int32)


def _select(chunk: Policed, keep: np.ndarray, rejects: tuple[Reject, ...]) -> Policed:
    lo, hi = int(chunk.offsets[0]), int(chunk.offsets[-1])
    mask = np.repeat(keep, np.diff(chunk.offsets))
    return Policed(
        chunk.ids[lo:hi][mask],
        chunk.labels[lo:hi][mask],
        exclusive_cumsum(np.diff(chunk.offsets)[keep]),
        chunk.index[keep],
        chunk.parts[keep],
        chunk.truncated[keep],
        rejects,
    )


def _dropped_records(
    batch: TokenizedBatch,
    record: np.ndarray,
    index: np.ndarray,
    empty: np.ndarray,
    policy: str,
) -> tuple[tuple[Reject, ...], int]:
    """Rejects for records none of whose pieces survived, and the examples lost by others.

    The second value counts the whole examples truncation emptied in records that kept
    another example (``--turns expand``).
    """
    kept_any = np.zeros(len(batch), dtype=bool)
    kept_any[record[index[~empty]]] = True
    touched = np.zeros(len(batch), dtype=bool)
    touched[record[index[empty]]] = True
    if policy == "truncate":
        code, why = "truncated_no_targets", "no target token left after truncation"
    else:
        code, why = "split_no_targets", "no part kept a target token after splitting"
    gone = touched & ~kept_any
    first = np.unique(record, return_index=True)[1]  # a record's first example names it
    rejects = tuple(
        Reject(batch.refs[first[r]], batch.domains[first[r]], code, f"{why} (dropped)")
        for r in np.flatnonzero(gone[: len(first)]).tolist()
    )
    lost = int(np.count_nonzero(empty & kept_any[record[index]])) if policy == "truncate" else 0
    return rejects, lost


def _answer_start(labels: np.ndarray) -> int:
    trained = np.flatnonzero(labels != IGNORE_INDEX)
    return int(trained[0]) if trained.size else int(labels.size)


def police_pairs(
    batch: TokenizedBatch, max_seq_len: int, policy: str
) -> tuple[TokenizedBatch, np.ndarray, tuple[Reject, ...], int]:
    """Apply the overlong policy to the pairs of ``batch`` as units (see the module notes).

    Returns the batch without the dropped pairs and with truncated answers, a per-example
    ``truncated`` flag, the rejects and the tokens cut.
    """
    n = len(batch)
    truncated = np.zeros(n, dtype=bool)
    if batch.pairs is None:
        return batch, truncated, (), 0
    lengths = np.diff(batch.offsets)
    starts = pair_starts(batch.pairs)
    over = starts[lengths[starts] + lengths[starts + 1] > max_seq_len]
    if not over.size:
        return batch, truncated, (), 0
    keep_len = lengths.copy()
    rejects = []
    for i in over.tolist():
        lc, lr = int(lengths[i]), int(lengths[i + 1])
        ref = batch.refs[i]
        both = (
            f"pair of {lc} + {lr} = {lc + lr} tokens (chosen + rejected) > "
            f"max_seq_len {max_seq_len}"
        )
        if policy == "error":
            raise RecordError(
                "too_long", f"{both} (use --overlong truncate|drop)", ref.source, ref.line
            )
        pc = _answer_start(batch.example(i)[1])
        pr = _answer_start(batch.example(i + 1)[1])
        budget = max_seq_len - pc - pr
        if policy != "truncate" or budget < 2:
            why = (
                f"prompts of {pc} + {pr} tokens leave no room for the answers"
                if policy == "truncate"
                else "a pair is never split"
                if policy == "split"
                else "dropped"
            )
            fix = "use --overlong truncate to keep it" if policy != "truncate" else "dropped"
            rejects.append(Reject(ref, batch.domains[i], "too_long", f"{both} ({why}; {fix})"))
            keep_len[i] = keep_len[i + 1] = 0
            continue
        ac, ar = lc - pc, lr - pr
        half = budget // 2
        a = ac if ac <= half else budget - ar if ar <= budget - half else half
        keep_len[i], keep_len[i + 1] = pc + a, pr + (budget - a)
        truncated[i], truncated[i + 1] = keep_len[i] < lc, keep_len[i + 1] < lr
    keep = keep_len > 0
    cut = int((lengths - keep_len)[keep].sum())
    pos = np.arange(int(batch.offsets[-1]), dtype=np.int64) - np.repeat(batch.offsets[:-1], lengths)
    mask = pos < np.repeat(keep_len, lengths)
    picked = np.flatnonzero(keep).tolist()
    out = replace(
        batch,
        input_ids=batch.input_ids[mask],
        labels=batch.labels[mask],
        offsets=exclusive_cumsum(keep_len[keep]),
        refs=tuple(batch.refs[j] for j in picked),
        domains=tuple(batch.domains[j] for j in picked),
        formats=tuple(batch.formats[j] for j in picked),
        turns=batch.turns[keep] if batch.turns is not None else None,
        pairs=batch.pairs[keep],
        images=batch.images[keep] if batch.images is not None else None,
        vision_tokens=batch.vision_tokens[keep] if batch.vision_tokens is not None else None,
        image_sizes=None
        if batch.image_sizes is None or batch.images is None
        else batch.image_sizes[np.repeat(keep, batch.images)],
    )
    return out, truncated[keep], tuple(rejects), cut
