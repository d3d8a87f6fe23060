"""Rehearsed failures: make chosen tasks crash or raise, to see retries and ``--resume`` work.

``PACKSHARD_FAULTS`` holds comma-separated ``KIND:MATCH:TIMES`` entries.  A task whose key
contains ``MATCH`` fails its first ``TIMES`` attempts: ``crash`` ends its worker process at
once (as an out-of-memory kill would), ``raise`` raises :class:`OSError` (as a flaky disk
would), ``hang`` sleeps an hour (as a stuck task would, for signal rehearsals)::

    PACKSHARD_FAULTS='crash:bytes 0–:1'        # the first unit's worker dies once, then works
    PACKSHARD_FAULTS='raise:shard-00001:9'     # writing shard 1 fails every attempt

Attempts are counted with marker files in a folder the caller names (the run's work folder),
so the count holds across worker processes and retries.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from packshard.errors import UsageError

FAULTS_ENV = "PACKSHARD_FAULTS"
HANG_SECONDS = 3600.0
KINDS = ("crash", "raise", "hang")


def parse_faults(spec: str | None) -> tuple[tuple[str, str, int], ...]:
    """Return ``(kind, match, times)`` entries; raise :class:`UsageError` on a bad spec."""
    entries = []
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        parts = item.strip().split(":")
        if len(parts) != 3 or parts[0] not in KINDS or not parts[2].isdigit():
            raise UsageError(
                f"{FAULTS_ENV}: {item!r} is not KIND:MATCH:TIMES (KIND crash|raise|hang)"
            )
        entries.append((parts[0], parts[1], int(parts[2])))
    return tuple(entries)


def inject(key: str, faults: tuple[tuple[str, str, int], ...], folder: Path | None) -> None:
    """Fail this attempt of task ``key`` when an entry of ``faults`` says so."""
    if folder is None:
        return
    for kind, match, times in faults:
        if match not in key:
            continue
        tag = hashlib.sha256(f"{kind}:{match}:{key}".encode()).hexdigest()[:16]
        folder.mkdir(parents=True, exist_ok=True)
        attempt = 0
        while True:
            try:
                os.close(os.open(folder / f"{tag}-{attempt}", os.O_CREAT | os.O_EXCL))
                break
            except FileExistsError:
                attempt += 1
        if attempt < times:
            if kind == "crash":
                os._exit(70)
            if kind == "hang":
                time.sleep(HANG_SECONDS)
            raise OSError(f"rehearsed fault in {key} (attempt {attempt + 1})")
