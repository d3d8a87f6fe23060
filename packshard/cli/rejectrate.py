"""The reject rate of a run: exit 1 when most records were rejected, a warning above 10 %.

A run that rejects most of its records is almost always a mistake (a forced ``--format``, a
wrong field name), yet it writes a valid output.  The share *rejected* (bad input, not policy
drops) is compared with a limit::

    rate = rejected / records read
    --max-reject-rate F given:  rate > F             → error line, exit 1 (the output is kept
                                                        for inspection)
    not given:                  rate > 50 % (FAIL)   → error line, exit 1, likewise
                                rate > 10 % (WARN)   → a warning line, exit 0

A pipeline reads exit codes, not warnings: a run that rejected most of its input stops it
by default (``--max-reject-rate 1`` keeps any run going).  Either line is one line with the
counts, the codes that dominate and the likely cause of the largest, e.g.::

    error: 95.4% of 65 records rejected, over the default --max-reject-rate 0.5 (missing_field
    61, invalid_json 1): likely cause: --format alpaca is forced on records of other formats
    (use --format auto)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from packshard.cli.errors import fail, warn
from packshard.errors import EXIT_DATA, REJECT_CODES, REJECTED, UsageError
from packshard.format.causes import likely_cause

WARN_RATE = 0.10
"""Rejected share above which a run warns when no ``--max-reject-rate`` is given."""
FAIL_RATE = 0.50
"""Rejected share above which a run fails (exit 1) when no ``--max-reject-rate`` is given."""


def check_max_reject_rate(value: float | None) -> None:
    """Refuse a ``--max-reject-rate`` outside 0..1 (usage error, exit 2)."""
    if value is not None and not 0.0 <= value <= 1.0:
        raise UsageError(f"--max-reject-rate must be between 0 and 1 (a share), got {value}")


def reject_rate_line(
    records: int,
    by_code: Mapping[str, int],
    max_rate: float | None,
    forced_format: str = "auto",
    sources: Sequence[str] = (),
) -> tuple[str | None, bool]:
    """Return the line to print (None when the rate is fine) and whether it is an error."""
    rejected = {c: n for c, n in by_code.items() if n and REJECT_CODES[c].kind == REJECTED}
    total = sum(rejected.values())
    rate = total / records if records else 0.0
    limit = WARN_RATE if max_rate is None else max_rate
    if total == 0 or rate <= limit:
        return None, False
    ranked = sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0]))
    codes = ", ".join(f"{code} {n:,}" for code, n in ranked[:4])
    if len(ranked) > 4:
        codes += ", …"
    cause = likely_cause(ranked[0][0], forced_format, sources)
    failed = max_rate is not None or rate > FAIL_RATE
    if max_rate is not None:
        over = f"over --max-reject-rate {max_rate:g}"
    elif failed:
        over = f"over the default --max-reject-rate {FAIL_RATE:g} (raise it to keep such a run)"
    else:
        over = f"over {WARN_RATE:.0%} (runs over {FAIL_RATE:.0%} fail; --max-reject-rate sets it)"
    line = f"{rate:.1%} of {records:,} records rejected, {over} ({codes}): likely cause: {cause}"
    return line, failed


def enforce_reject_rate(
    records: int,
    by_code: Mapping[str, int],
    max_rate: float | None,
    forced_format: str,
    sources: Sequence[str] = (),
) -> None:
    """Print the reject-rate line on stderr; exit 1 over ``--max-reject-rate`` (default 0.5)."""
    line, failed = reject_rate_line(records, by_code, max_rate, forced_format, sources)
    if line is None:
        return
    if failed:
        fail(line, EXIT_DATA)
    warn(line)
