"""The rejects file, ``rejects.jsonl``: one JSON line per record not packed, written and read here.

Each line holds ``source``, ``line``, ``domain``, ``code`` and ``reason`` (sorted keys, UTF-8).
A code's kind — ``rejected`` (bad input) or ``dropped`` (a policy) — comes from the registry
:data:`packshard.errors.REJECT_CODES`, so the file itself needs no kind column.

:class:`RejectsWriter` counts what it writes and returns the counts as a :class:`RejectTally`
when closed: the manifest's ``rejected``/``dropped`` totals, per domain, per source and per code
are those counts, so they cannot disagree with the file.  :func:`read_rejects` reads the file
back and says which line is damaged when one is.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from packshard.errors import DROPPED, REJECT_CODES, REJECTED, FormatError
from packshard.records import Reject, SourceRef

REJECTS_NAME = "rejects.jsonl"
MAX_LINE = 1 << 20  # characters: a reject line holds a path, a domain and a short reason
_KEYS = ("code", "domain", "line", "reason", "source")


def reject_line(reject: Reject) -> str:
    """Return the ``rejects.jsonl`` line of one reject (no trailing newline)."""
    record = {
        "source": reject.ref.source,
        "line": reject.ref.line,
        "domain": reject.domain,
        "code": reject.code,
        "reason": reject.reason,
    }
    return json.dumps(record, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True)
class RejectTally:
    """What a rejects file holds, counted as it was written."""

    by_code: dict[str, int] = field(default_factory=dict)
    by_domain: dict[str, dict[str, int]] = field(default_factory=dict)  # domain -> kind -> n
    by_source: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> kind -> n

    def total(self, kind: str) -> int:
        """Lines of one kind (``rejected`` or ``dropped``)."""
        return sum(n for code, n in self.by_code.items() if REJECT_CODES[code].kind == kind)

    @property
    def lines(self) -> int:
        """Every line of the file."""
        return sum(self.by_code.values())


class RejectsWriter:
    """Append rejects to ``rejects.jsonl``; :meth:`close` returns their :class:`RejectTally`."""

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "w", encoding="utf-8")
        self._codes: Counter[str] = Counter()
        self._domains: Counter[tuple[str, str]] = Counter()
        self._sources: Counter[tuple[str, str]] = Counter()

    def write(self, rejects: Iterable[Reject]) -> None:
        """Write one line per reject and count it."""
        for reject in rejects:
            kind = REJECT_CODES[reject.code].kind
            self._fh.write(reject_line(reject) + "\n")
            self._codes[reject.code] += 1
            self._domains[(reject.domain, kind)] += 1
            self._sources[(reject.ref.source, kind)] += 1

    def close(self) -> RejectTally:
        """Close the file and return what it holds."""
        self._fh.close()
        by_domain: dict[str, dict[str, int]] = {}
        by_source: dict[str, dict[str, int]] = {}
        for counts, by in ((self._domains, by_domain), (self._sources, by_source)):
            for (name, kind), n in counts.items():
                by.setdefault(name, {REJECTED: 0, DROPPED: 0})[kind] = n
        return RejectTally(dict(sorted(self._codes.items())), by_domain, by_source)

    def __enter__(self) -> RejectsWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._fh.close()


def read_rejects(path: Path) -> Iterator[Reject]:
    """Yield the rejects of a ``rejects.jsonl`` file, in file order.

    Raises:
        FormatError: a line is not a JSON object with the five fields of a reject, or names
            an unknown code (the message gives the line number).

    """
    with open(path, encoding="utf-8", errors="strict") as fh:
        try:
            for number, text in enumerate(iter(lambda: fh.readline(MAX_LINE + 1), ""), start=1):
                if len(text) > MAX_LINE:
                    raise FormatError(
                        f"{path}:{number}", f"line longer than {MAX_LINE:,} characters"
                    )
                if text.strip():
                    yield _parse(text, f"{path}:{number}")
        except UnicodeDecodeError as exc:
            raise FormatError(str(path), f"not UTF-8 ({exc.reason})") from None


def _parse(text: str, where: str) -> Reject:
    try:
        item = json.loads(text)
    except (ValueError, RecursionError):
        raise FormatError(where, "not a JSON line") from None
    if not isinstance(item, dict) or sorted(item) != list(_KEYS):
        raise FormatError(where, f"expected an object with keys {', '.join(_KEYS)}")
    code, domain, line, reason, source = (item[k] for k in _KEYS)
    if not (isinstance(source, str) and isinstance(domain, str) and isinstance(reason, str)):
        raise FormatError(where, "source, domain and reason must be strings")
    if not isinstance(line, int) or isinstance(line, bool) or line < 0:
        raise FormatError(where, f"line must be a non-negative integer, got {line!r}")
    if code not in REJECT_CODES:
        raise FormatError(where, f"unknown reject code {code!r}")
    return Reject(SourceRef(source, line), domain, code, reason)
