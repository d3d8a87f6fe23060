"""Findings: what ``verify`` reports, each pinned to a place a person can open.

A finding names its check and, where it applies, the shard file, row, segment, example id and
the example's source ``file:line``.  Each check builds its own :class:`FindingList`, capped per
kind (the count of the rest is kept) so a badly broken folder still gives a readable report,
and returns it in its :class:`CheckResult`; the run merges them once, at the end.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import Any

MAX_PER_KIND = 20


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing ``verify`` found wrong."""

    check: str
    message: str
    shard: str | None = None
    row: int | None = None
    segment: int | None = None
    example_id: int | None = None
    source: str | None = None

    def place(self) -> str:
        """``shard row R segment S (example E, file:line)`` — the parts that apply."""
        parts = []
        if self.shard is not None:
            parts.append(self.shard)
        if self.row is not None:
            parts.append(f"row {self.row}")
        if self.segment is not None:
            parts.append(f"segment {self.segment}")
        where = " ".join(parts)
        extra = []
        if self.example_id is not None:
            extra.append(f"example {self.example_id}")
        if self.source is not None:
            extra.append(self.source)
        if extra:
            where = f"{where} ({', '.join(extra)})" if where else ", ".join(extra)
        return where

    def __str__(self) -> str:
        where = self.place()
        return f"[{self.check}] {where + ': ' if where else ''}{self.message}"

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


@dataclass
class FindingList:
    """Findings of one run, capped per (check, kind) with the overflow counted."""

    items: list[Finding] = field(default_factory=list)
    overflow: Counter[str] = field(default_factory=Counter)
    _seen: Counter[str] = field(default_factory=Counter)

    def add(self, finding: Finding, kind: str | None = None) -> None:
        """Record a finding unless its kind already has ``MAX_PER_KIND`` listed."""
        key = f"{finding.check}:{kind or finding.message[:40]}"
        self._seen[key] += 1
        if self._seen[key] <= MAX_PER_KIND:
            self.items.append(finding)
        else:
            self.overflow[key] += 1

    def add_capped(self, check: str, kind: str, total: int, first: Iterable[Finding]) -> None:
        """Add ``total`` findings of a kind: the first ``MAX_PER_KIND`` of ``first`` listed.

        Only those are built (``first`` is read no further); the rest are counted.
        """
        listed = 0
        for finding in islice(first, MAX_PER_KIND):
            self.add(finding, kind)
            listed += 1
        if total > listed:
            self._seen[f"{check}:{kind}"] += total - listed
            self.overflow[f"{check}:{kind}"] += total - listed

    def count(self, check: str | None = None) -> int:
        """Total findings (listed and overflowed), optionally of one check."""
        return sum(n for k, n in self._seen.items() if check is None or k.split(":", 1)[0] == check)

    def count_kind(self, check: str, kind: str) -> int:
        """Count the findings added of one kind (listed and overflowed)."""
        return self._seen[f"{check}:{kind}"]

    def __len__(self) -> int:
        return self.count()

    def extend(self, other: FindingList) -> None:
        """Add another list's findings and overflow counts (kinds stay separate per check)."""
        self.items.extend(other.items)
        self.overflow.update(other.overflow)
        self._seen.update(other._seen)


PASSED, FAILED, SKIPPED, NOT_RUN = "passed", "failed", "skipped", "not run"


@dataclass(frozen=True)
class CheckResult:
    """What one verify check found: its findings and the figures it measured.

    ``skipped``: the user opted out; ``not_run``: it could not run although asked (which keeps
    the run from ending OK).  A check that did not run is never reported as passed.
    """

    name: str
    findings: FindingList = field(default_factory=FindingList)
    detail: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    not_run: str | None = None

    @property
    def status(self) -> str:
        """``not run``, ``skipped``, ``passed`` or ``failed``."""
        if self.findings.count(self.name):
            return FAILED
        if self.not_run is not None:
            return NOT_RUN
        if self.skipped is not None:
            return SKIPPED
        return PASSED

    def summary(self) -> dict[str, Any]:
        """Return the check's report entry: status, findings and the measured figures."""
        why = self.not_run if self.not_run is not None else self.skipped
        if why is not None and not self.findings.count(self.name):
            return {"status": self.status, "detail": why}
        return {"status": self.status, **self.detail, "findings": self.findings.count(self.name)}


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem the proof found in row ``row`` (its index among the rows checked).

    ``segment`` is the segment it concerns, ``None`` for the whole row.  ``kind`` groups the
    findings it becomes (each kind is listed up to its own cap): ``model`` or ``pairs``.
    """

    row: int
    name: str
    segment: int | None
    message: str
    kind: str = "model"

    def __str__(self) -> str:
        where = self.name if self.segment is None else f"{self.name} segment {self.segment}"
        return f"{where}: {self.message}"


@dataclass(frozen=True, slots=True)
class SegmentResult:
    """One segment's comparison; deltas are max absolute differences (None: not measured)."""

    segment: int
    example_id: int
    num_tokens: int
    logit_delta: float
    loss_packed: float | None
    loss_alone: float | None
    loss_delta: float
    mutation_delta: float | None
    control_delta: float | None


@dataclass(frozen=True, slots=True)
class PairResult:
    """One pair's sums packed, alone and under the naive control (chosen segment ``segment``)."""

    row: int
    segment: int
    chosen_example_id: int
    rejected_example_id: int
    chosen_tokens: int
    rejected_tokens: int
    logp_delta: float
    token_logp_delta: float
    loss_packed: float
    loss_alone: float
    loss_delta: float
    control_delta: float | None


@dataclass(frozen=True, slots=True)
class RowResult:
    """One row's comparison; ``control`` is ``detected``, ``not detected`` or ``not applicable``."""

    row: int
    name: str
    num_tokens: int
    segments: tuple[SegmentResult, ...]
    max_logit_delta: float
    max_loss_delta: float
    mutation_delta: float | None
    control_delta: float | None
    control: str
    loss_true: float | None
    loss_naive: float | None
    loss_tokens: int


@dataclass(frozen=True, slots=True)
class EquivalenceReport:
    """Everything the model check measured; ``ok`` is true when ``issues`` is empty.

    Made by :func:`~packshard.verify.model.equivalence.check_rows`.
    """

    rows: tuple[RowResult, ...]
    max_logit_delta: float
    max_loss_delta: float
    max_mutation_delta: float | None
    control_min_delta: float | None
    control_max_delta: float | None
    control_threshold: float
    control_detected: bool
    loss_true: float | None
    loss_naive: float | None
    ok: bool
    atol: float
    vocab_folded: bool
    issues: tuple[Issue, ...] = ()
    notes: tuple[str, ...] = field(default=())
    pairs: tuple[PairResult, ...] = ()
    pair_summary: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the report as plain JSON-ready values."""
        data = asdict(self)
        data["issues"] = [str(issue) for issue in self.issues]
        return data
