"""The time each verify check takes, and a progress line per check on stderr.

``verify`` runs checks of very different cost::

    verify: integrity …            ← when the check starts (stderr, a terminal only)
    verify: integrity done (0.04 s)
    verify: source …               (the re-ingest's own progress bar runs below it)

:class:`StageClock` measures each check (``with clock.stage("source"):``), adding up a
check run in pieces, and the summary table prints the times (``checks[name]["seconds"]``
in the report and its JSON).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class StageClock:
    """Seconds per check, and start/done lines on ``stream`` when ``progress``."""

    def __init__(self, progress: bool = False, stream: TextIO | None = None) -> None:
        self.progress = progress
        self.stream = stream if stream is not None else sys.stderr
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, label: str | None = None) -> Iterator[None]:
        """Time the block as (part of) check ``name``; say when it starts and ends (``label``)."""
        shown = label or name
        self._say(f"verify: {shown} …")
        started = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - started
            self.seconds[name] = self.seconds.get(name, 0.0) + spent
            self._say(f"verify: {shown} done ({spent:.2f} s)")

    def _say(self, line: str) -> None:
        if self.progress:
            print(line, file=self.stream, flush=True)


def format_seconds(seconds: float | None) -> str:
    """``0.04 s``, ``12.3 s``, ``2 min 05 s``; an empty string when not measured."""
    if seconds is None:
        return ""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"
