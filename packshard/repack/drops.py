"""The parent's rejects, as a fresh pack with the new options would write them.

Records the parent dropped as too long (code ``too_long``) have no tokens in it.  They stay
dropped where a fresh pack would drop them too (``--overlong drop`` and longer than the new
``max_seq_len``, their length read from the reject's reason, e.g. ``is 9120 tokens >
max_seq_len 8192 (dropped …``); the reject is rewritten to name the new ``max_seq_len`` and the
records count among those read (:func:`with_drops`), as a fresh pack counts them.  Where a
fresh pack would keep one, the repack stops and names it.  Every other reject is carried as
it is::

    parent rejects.jsonl ─► too_long, still too long ─► rewritten, counted as read
                         ─► too_long, would fit now  ─► UsageError (pack from the inputs)
                         ─► any other code           ─► carried unchanged
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from packshard.arrays import add_counts
from packshard.errors import FormatError, UsageError
from packshard.format.rejects import REJECTS_NAME, read_rejects
from packshard.pack.config import PackConfig
from packshard.pack.spill import SpillCounts
from packshard.records import Reject

_TOO_LONG = re.compile(r"is (\d+) tokens > max_seq_len (\d+) \(dropped")


def carried_rejects(
    parent: Path, manifest: dict[str, Any], config: PackConfig
) -> tuple[list[Reject], list[tuple[Reject, int]]]:
    """Return the parent's rejects as a fresh pack under ``config`` writes them.

    Also returns the ``too_long`` drops with their lengths (records the spill writer never
    sees).  A drop that a fresh pack would keep is refused.
    """
    plan = config.plan
    carried: list[Reject] = []
    dropped: list[tuple[Reject, int]] = []
    for reject in read_rejects(parent / REJECTS_NAME):
        if reject.code != "too_long":
            carried.append(reject)
            continue
        found = _TOO_LONG.search(reject.reason)
        if found is None:
            raise FormatError(str(parent / REJECTS_NAME), f"{reject.ref}: no length in its reason")
        length = int(found.group(1))
        if plan.overlong == "error" and plan.strategy != "wrapped":
            raise UsageError(
                f"{reject.ref}: the parent dropped this {length}-token record as too long; "
                "under --overlong error a fresh pack would stop there (use --overlong drop)"
            )
        kept = plan.strategy == "wrapped" or plan.overlong != "drop"
        if kept or length <= plan.max_seq_len:
            how = f"--overlong {plan.overlong}" if plan.overlong != "drop" else "it fits"
            if plan.strategy == "wrapped":
                how = "--strategy wrapped splits it"
            raise UsageError(
                f"{reject.ref}: the parent dropped this {length}-token record as too long, and "
                f"with --max-seq-len {plan.max_seq_len} a fresh pack would keep it ({how}); "
                "its tokens are not in the parent (pack from the inputs, or keep --overlong "
                "drop with a --max-seq-len below its length)"
            )
        old = f"> max_seq_len {found.group(2)} (dropped"
        reason = reject.reason.replace(old, f"> max_seq_len {plan.max_seq_len} (dropped")
        fresh = Reject(reject.ref, reject.domain, reject.code, reason)
        carried.append(fresh)
        dropped.append((fresh, length))
    return carried, dropped


def with_drops(counts: SpillCounts, dropped: list[tuple[Reject, int]]) -> SpillCounts:
    """Count the carried drops as records read, per source and domain, with their tokens."""
    per_source = np.zeros(len(counts.sources), np.int64)
    code = {name: i for i, name in enumerate(counts.sources)}
    domains = list(counts.domains)
    for reject, _ in dropped:
        if reject.domain not in domains:
            domains.append(reject.domain)
    per_domain = np.zeros((2, len(domains)), np.int64)  # records, tokens
    for reject, length in dropped:
        per_source[code[reject.ref.source]] += 1
        per_domain[:, domains.index(reject.domain)] += (1, length)
    return replace(
        counts,
        domains=tuple(domains),
        records_per_source=tuple((np.asarray(counts.records_per_source) + per_source).tolist()),
        records_per_domain=tuple(
            add_counts(np.asarray(counts.records_per_domain), per_domain[0]).tolist()
        ),
        tokens_in_per_domain=tuple(
            add_counts(np.asarray(counts.tokens_in_per_domain), per_domain[1]).tolist()
        ),
    )
