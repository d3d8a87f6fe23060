"""Ingest progress on stderr: a bar on a terminal, plain periodic lines in a log.

A long ``pack`` or ``profile`` says how far it is wherever its stderr goes::

    terminal (--progress, the default there): a rich bar, redrawn in place
      ⠙ ingest ━━━━━━━━━━━╺━━━━━━━━━━  41%   412,000 records (38,100/s)  52,100,000 tokens …
    pipe, file, CI log (the default there): one line every LINE_SECONDS, never redrawn
      ingest: 412,000 records, 52,100,000 tokens, 41% of 1.2 GB in 10 s (41,200 records/s,
      5.2M tokens/s), about 15 s left
    --no-progress, --quiet: nothing

Counts grow as work units finish.  The share done is the finished units' bytes over every
input's, so the estimate is ``elapsed × (total − done) / done`` (none before the first unit).
A log run that printed a line prints a last one at the end; a short run prints nothing.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

PROGRESS_MODES = ("off", "bar", "lines")
"""``off``: nothing; ``bar``: a rich bar (a terminal); ``lines``: periodic plain lines (a log)."""
LINE_SECONDS = 10.0
"""Seconds between two plain progress lines."""


def progress_mode(progress: bool | str | None, stream: TextIO | None = None) -> str:
    """Return the mode of ``progress``: a mode name as is; False: off.

    True or None (on, the default) picks by ``stream`` (default stderr): a terminal gets the
    bar, anything else the plain lines (a bar in a log is a screen of escape codes).
    """
    if isinstance(progress, str):
        if progress not in PROGRESS_MODES:
            raise ValueError(f"progress mode {progress!r} is none of {PROGRESS_MODES}")
        return progress
    if progress is False:
        return "off"
    return "bar" if (stream or sys.stderr).isatty() else "lines"


def open_progress(progress: bool | str | None, total_bytes: int = 0) -> IngestProgress | None:
    """Start the progress of ``progress`` (see :func:`progress_mode`); None when off."""
    mode = progress_mode(progress)
    return None if mode == "off" else IngestProgress(mode, total_bytes)


def human_count(value: float) -> str:
    """Return ``5.2M``, ``38.1k``, ``412``: a count people read at a glance."""
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


def human_seconds(value: float) -> str:
    """Return ``42 s``, ``2 min 05 s`` or ``3 h 07 min``: a duration people read at a glance."""
    whole = round(value)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


class IngestProgress:
    """Records, tokens and bytes done, shown as a bar or as lines (module docstring)."""

    def __init__(
        self,
        mode: str = "bar",
        total_bytes: int = 0,
        stream: TextIO | None = None,
        every: float | None = None,
    ) -> None:
        self.mode = mode
        self._total = total_bytes
        self._records = self._tokens = self._bytes = 0
        self._start = time.perf_counter()
        self._lock = threading.Lock()
        self._stream = stream
        self._lines = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if mode == "bar":
            self._progress, self._task = self._bar()
            self._progress.start()
        else:
            every = LINE_SECONDS if every is None else every
            self._thread = threading.Thread(
                target=self._tick, args=(every,), name="packshard-progress", daemon=True
            )
            self._thread.start()

    def _bar(self) -> tuple[Any, Any]:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        progress = Progress(
            SpinnerColumn(),
            TextColumn("ingest"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[records]:>12,} records ({task.fields[rate]:,.0f}/s)"),
            TextColumn("{task.fields[tokens]:>14,} tokens ({task.fields[trate]:,.0f}/s)"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        task = progress.add_task(
            "ingest", total=self._total or None, records=0, rate=0.0, tokens=0, trate=0.0
        )
        return progress, task

    def add(self, records: int, tokens: int, nbytes: int = 0) -> None:
        """Count records, tokens and input bytes done (a work unit)."""
        with self._lock:
            self._records += records
            self._tokens += tokens
            self._bytes += nbytes
            if self.mode != "bar":
                return
            elapsed = max(time.perf_counter() - self._start, 1e-9)
            self._progress.update(
                self._task,
                completed=self._bytes,
                records=self._records,
                tokens=self._tokens,
                rate=self._records / elapsed,
                trate=self._tokens / elapsed,
            )

    def line(self, done: bool = False) -> str:
        """Return the plain line of what is done so far (``done``: the last one)."""
        with self._lock:
            records, tokens, nbytes = self._records, self._tokens, self._bytes
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        text = f"ingest: {records:,} records, {tokens:,} tokens"
        if done:
            text += f", done in {human_seconds(elapsed)}"
        elif self._total:
            share = min(nbytes / self._total, 1.0)
            text += f", {share:.0%} of {human_count(self._total)}B in {human_seconds(elapsed)}"
        else:
            text += f" in {human_seconds(elapsed)}"
        text += f" ({human_count(records / elapsed)} records/s, "
        text += f"{human_count(tokens / elapsed)} tokens/s)"
        if not done and self._total:
            if nbytes:
                left = elapsed * max(self._total - nbytes, 0) / nbytes
                text += f", about {human_seconds(left)} left"
            else:
                text += ", estimate after the first unit"
        return text

    def _print(self, text: str) -> None:
        print(text, file=self._stream or sys.stderr, flush=True)

    def _tick(self, every: float) -> None:
        while not self._stop.wait(every):
            self._print(self.line())
            self._lines += 1

    def close(self) -> None:
        """Take the bar off the terminal; in a log, end with a last line if any was printed."""
        if self.mode == "bar":
            self._progress.stop()
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._lines:
            self._print(self.line(done=True))
