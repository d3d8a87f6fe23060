"""The profile of a dataset: per-domain counts, lengths and utilization, from the ingest stream.

``profile_lengths`` works on per-example arrays (:mod:`packshard.profile.gather`, never the
tokens).  The report has one :class:`DomainProfile` for the whole input and one per domain.
Loss tokens exclude each example's first label; prompt tokens = tokens − loss tokens.
Per-domain utilization treats each domain as if profiled alone.

The report also advises (:func:`overlong_effect`, :func:`describe_fit`): per domain, what
``--overlong`` does to its overlong examples, the smallest length that keeps
:data:`KEEP_SHARE` of them whole, and what an optimizer step of ``batch_size`` rows takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packshard.errors import UsageError
from packshard.profile.lengths import (
    PERCENTILE_METHOD,
    LengthStats,
    Utilization,
    compute_histogram_edges,
    measure_lengths,
    measure_utilization,
    nearest_rank,
)
from packshard.profile.shape import packed_shape
from packshard.records import Reject

MAX_LISTED_REJECTS = 10
KEEP_PERCENT = 99
KEEP_SHARE = KEEP_PERCENT / 100
"""Share of the examples the suggested length keeps whole (not truncated, split or dropped)."""


@dataclass(frozen=True, slots=True)
class DomainProfile:
    """Counts, lengths and utilization of one domain, or of everything (name ``"total"``).

    ``histogram`` counts examples per bin of the report's ``histogram_edges``.  ``lengths`` is
    ``None`` and ``utilization`` empty when the domain has no accepted example.
    """

    name: str
    records: int
    examples: int
    rejected: int
    tokens: int
    loss_tokens: int
    over_max: int
    lengths: LengthStats | None
    utilization: tuple[Utilization, ...]
    lower_bound_rows: int
    histogram: tuple[int, ...]
    reasoning_examples: int = 0  # examples with a non-empty rendered reasoning block
    reasoning_tokens: int = 0  # tokens inside those blocks (first token of each example out)
    reasoning_loss_tokens: int = 0  # the trained ones among them
    over_max_tokens: int = 0  # tokens of the examples longer than max_seq_len
    over_max_parts: int = 0  # parts those make when split: Σ ⌈len / max_seq_len⌉
    keep_length: int = 0  # the smallest length that keeps KEEP_SHARE of the examples whole

    @property
    def reasoning_loss_share(self) -> float:
        """Share of loss tokens that are reasoning."""
        return self.reasoning_loss_tokens / self.loss_tokens if self.loss_tokens else 0.0

    @property
    def prompt_tokens(self) -> int:
        """Tokens without loss (tokens − loss tokens)."""
        return self.tokens - self.loss_tokens

    @property
    def loss_share(self) -> float:
        """Share of tokens that carry loss."""
        return self.loss_tokens / self.tokens if self.tokens else 0.0

    @property
    def over_max_share(self) -> float:
        """Share of examples longer than ``max_seq_len``."""
        return self.over_max / self.examples if self.examples else 0.0

    def strategy(self, name: str) -> Utilization:
        """Return the utilization of strategy ``name``.

        ``name`` is one of :data:`~packshard.profile.lengths.STRATEGIES`.
        """
        return next(u for u in self.utilization if u.strategy == name)


@dataclass(frozen=True, slots=True)
class ProfileReport:
    """The whole profile: settings, the total, one profile per domain (sorted by name)."""

    max_seq_len: int
    batch_size: int
    seed: int
    label_path: str
    total: DomainProfile
    domains: tuple[DomainProfile, ...]
    histogram_edges: tuple[int, ...]
    verdict: str
    percentile_method: str = PERCENTILE_METHOD
    overlong: str = "drop"  # the --overlong policy pack would apply
    rejects: tuple[Reject, ...] = ()  # the first MAX_LISTED_REJECTS, with file:line
    reject_codes: tuple[tuple[str, int], ...] = ()  # every reject, counted per code
    shape: Mapping[str, Any] = field(default_factory=dict)  # profile.shape.packed_shape
    mixture: Mapping[str, Any] = field(default_factory=dict)  # --mix: profile.mixture's
    pairs: Mapping[str, Any] = field(default_factory=dict)  # profile.pairs; empty: no pairs
    vision: Mapping[str, Any] = field(default_factory=dict)  # profile.vision; empty: no images


def profile_lengths(
    lengths: np.ndarray,
    loss_tokens: np.ndarray,
    domain_codes: np.ndarray,
    domain_names: Sequence[str],
    rejected: Mapping[str, int],
    max_seq_len: int,
    batch_size: int = 8,
    seed: int = 0,
    label_path: str = "offsets",
    reasoning: tuple[np.ndarray, np.ndarray] | None = None,
    first: np.ndarray | None = None,
    overlong: str = "drop",
) -> ProfileReport:
    """Profile examples given as arrays: ``domain_names[domain_codes[i]]`` is example i's domain.

    ``rejected`` counts rejected records per domain name (unknown names become domains).
    ``reasoning`` holds per example its reasoning tokens and the trained ones; ``first`` marks
    each record's first example; ``overlong`` is the policy the advice describes.  Raises
    :class:`UsageError` on a non-positive size and on arrays of different lengths.
    """
    if max_seq_len <= 0 or batch_size <= 0:
        raise UsageError(
            f"max_seq_len {max_seq_len} and batch_size {batch_size} must be positive "
            "(use --max-seq-len / --batch-size)"
        )
    lengths = np.asarray(lengths, dtype=np.int64)
    loss_tokens = np.asarray(loss_tokens, dtype=np.int64)
    codes = np.asarray(domain_codes, dtype=np.int64)
    if not lengths.shape == loss_tokens.shape == codes.shape:
        raise UsageError(
            f"lengths {lengths.shape}, loss_tokens {loss_tokens.shape} and domain_codes "
            f"{codes.shape} must have one entry per example"
        )
    zeros = np.zeros(lengths.shape[0], dtype=np.int64)
    thought, thought_loss = reasoning if reasoning is not None else (zeros, zeros)
    starts = np.ones(lengths.shape[0], dtype=bool) if first is None else np.asarray(first, bool)
    names = list(domain_names)
    names += sorted(set(rejected) - set(names))
    edges = compute_histogram_edges(max(int(lengths.max(initial=0)), max_seq_len), max_seq_len)
    bins = np.clip(np.searchsorted(edges, lengths, side="right") - 1, 0, edges.shape[0] - 2)

    def profile_one(name: str, where: np.ndarray, rejects: int) -> DomainProfile:
        own = lengths[where]
        utilization, lower_bound = measure_utilization(own, max_seq_len, batch_size, seed)
        counts = np.bincount(bins[where], minlength=edges.shape[0] - 1)
        ordered = np.sort(own)
        over = ordered[ordered > max_seq_len]
        return DomainProfile(
            name=name,
            records=int(np.count_nonzero(starts[where])) + rejects,
            examples=int(own.shape[0]),
            rejected=rejects,
            tokens=int(own.sum()),
            loss_tokens=int(loss_tokens[where].sum()),
            over_max=int(over.shape[0]),
            lengths=measure_lengths(ordered) if own.shape[0] else None,
            utilization=utilization,
            lower_bound_rows=lower_bound,
            histogram=tuple(int(c) for c in counts),
            reasoning_examples=int(np.count_nonzero(thought[where])),
            reasoning_tokens=int(thought[where].sum()),
            reasoning_loss_tokens=int(thought_loss[where].sum()),
            over_max_tokens=int(over.sum()),
            over_max_parts=int((-(-over // max_seq_len)).sum()),
            keep_length=keep_length(ordered),
        )

    total = profile_one("total", np.ones(lengths.shape[0], dtype=bool), sum(rejected.values()))
    domains = tuple(
        profile_one(name, codes == code, int(rejected.get(name, 0)))
        for code, name in sorted(enumerate(names), key=lambda item: item[1])
        if np.any(codes == code) or rejected.get(name, 0)
    )
    return ProfileReport(
        max_seq_len=max_seq_len,
        batch_size=batch_size,
        seed=seed,
        label_path=label_path,
        total=total,
        domains=domains,
        histogram_edges=tuple(int(e) for e in edges),
        verdict=write_verdict(total, max_seq_len),
        shape=packed_shape(lengths, loss_tokens, max_seq_len, batch_size),
        overlong=overlong,
    )


def keep_length(ordered: np.ndarray) -> int:
    """Return the smallest length that keeps KEEP_SHARE of ``ordered`` (sorted) whole; 0: none."""
    return nearest_rank(ordered, KEEP_PERCENT) if ordered.shape[0] else 0


def overlong_effect(d: DomainProfile, overlong: str, max_seq_len: int) -> str:
    """Say what ``--overlong`` does to ``d``'s examples longer than ``max_seq_len``."""
    if not d.over_max:
        return "none over: every example kept whole"
    some = f"{d.over_max:,} of {d.examples:,} examples ({d.over_max_share:.1%})"
    share = d.over_max_tokens / d.tokens if d.tokens else 0.0
    if overlong == "drop":
        return f"drops {some}, {d.over_max_tokens:,} tokens ({share:.1%})"
    if overlong == "truncate":
        cut = d.over_max_tokens - d.over_max * max_seq_len
        return f"truncates {some}, cutting {cut:,} tokens ({cut / d.tokens:.1%})"
    if overlong == "split":
        return f"splits {some} into {d.over_max_parts:,} parts"
    return f"stops pack: {some} are longer (choose --overlong drop|truncate|split)"


def describe_fit(report: ProfileReport) -> str:
    """Return the advice line: the suggested length and the rows of an optimizer step."""
    total = report.total
    if not total.examples:
        return ""
    line = (
        f"max_seq_len {total.keep_length:,} keeps {KEEP_SHARE:.0%} of examples whole "
        f"(the smallest that does; {report.max_seq_len:,} keeps "
        f"{1 - total.over_max_share:.1%})"
    )
    if total.utilization:
        rows = total.strategy("packed").rows
        steps = -(-rows // report.batch_size)
        line += (
            f"; packed: {rows:,} rows, {report.batch_size} rows per optimizer step "
            f"(--batch-size): {steps:,} step{'s' if steps != 1 else ''} an epoch, about "
            f"{total.examples / max(steps, 1):,.1f} examples a step"
        )
    return line


def write_verdict(total: DomainProfile, max_seq_len: int) -> str:
    """Return one sentence saying what packing saves against padding to ``max_seq_len``."""
    if not total.utilization:
        return "no accepted examples: nothing to pack"
    pad, packed = total.strategy("pad_to_max"), total.strategy("packed")
    saved = 1.0 - packed.computed_tokens / pad.computed_tokens
    bucketed = total.strategy("bucketed")
    return (
        f"packing removes {saved:.0%} of computed tokens vs padding to max_seq_len "
        f"{max_seq_len} ({pad.rows:,} padded rows → {packed.rows:,} packed rows, "
        f"fill {packed.fraction:.1%}; bucketed batches reach {bucketed.fraction:.1%})"
    )
