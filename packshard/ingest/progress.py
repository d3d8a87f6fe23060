"""The ingest progress line: records and tokens read so far, and their rates, on stderr."""

from __future__ import annotations

import time


class IngestProgress:
    """A rich progress line on stderr: records, tokens and their rates."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("ingest"),
            TextColumn("{task.fields[records]:>12,} records ({task.fields[rate]:,.0f}/s)"),
            TextColumn("{task.fields[tokens]:>14,} tokens ({task.fields[trate]:,.0f}/s)"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self._task = self._progress.add_task(
            "ingest", total=None, records=0, rate=0.0, tokens=0, trate=0.0
        )
        self._records = 0
        self._tokens = 0
        self._start = time.perf_counter()
        self._progress.start()

    def add(self, records: int, tokens: int) -> None:
        """Count records and tokens done (a chunk, a work unit)."""
        self._records += records
        self._tokens += tokens
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        self._progress.update(
            self._task,
            records=self._records,
            tokens=self._tokens,
            rate=self._records / elapsed,
            trate=self._tokens / elapsed,
        )

    def close(self) -> None:
        """Take the line off the terminal."""
        self._progress.stop()
