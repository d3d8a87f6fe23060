"""Findings: what ``verify`` reports, each pinned to a place a person can open.

A finding names its check and, where it applies, the shard file, row, segment, example id and
the example's source ``file:line``.  Checks cap the findings they list per kind (the count of
the rest is kept) so a badly broken folder still gives a readable report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
        return {
            "check": self.check,
            "message": self.message,
            "shard": self.shard,
            "row": self.row,
            "segment": self.segment,
            "example_id": self.example_id,
            "source": self.source,
        }


@dataclass
class FindingList:
    """Findings of one run, capped per (check, kind) with the overflow counted."""

    items: list[Finding] = field(default_factory=list)
    overflow: dict[str, int] = field(default_factory=dict)
    _seen: dict[str, int] = field(default_factory=dict)

    def add(self, finding: Finding, kind: str | None = None) -> None:
        """Record a finding unless its kind already has ``MAX_PER_KIND`` listed."""
        key = f"{finding.check}:{kind or finding.message[:40]}"
        seen = self._seen.get(key, 0)
        self._seen[key] = seen + 1
        if seen < MAX_PER_KIND:
            self.items.append(finding)
        else:
            self.overflow[key] = self.overflow.get(key, 0) + 1

    def add_unlisted(self, check: str, kind: str, n: int) -> None:
        """Count ``n`` more findings of a kind without building them (past the listing cap)."""
        if n > 0:
            key = f"{check}:{kind}"
            self._seen[key] = self._seen.get(key, 0) + n
            self.overflow[key] = self.overflow.get(key, 0) + n

    def count(self, check: str | None = None) -> int:
        """Total findings (listed and overflowed), optionally of one check."""
        listed = sum(1 for f in self.items if check is None or f.check == check)
        extra = sum(
            n for k, n in self.overflow.items() if check is None or k.split(":", 1)[0] == check
        )
        return listed + extra

    def count_kind(self, check: str, kind: str) -> int:
        """Count the findings added of one kind (listed and overflowed)."""
        return self._seen.get(f"{check}:{kind}", 0)

    def __len__(self) -> int:
        return self.count()
