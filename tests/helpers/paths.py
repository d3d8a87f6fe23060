"""Paths: the repository, and the real third-party data beside it (skipped when absent)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("PACKSHARD_SHARED_DATA") or REPO.parent / "shared" / "data")
"""The real tokenizers and datasets (outside the repository); PACKSHARD_SHARED_DATA moves it."""
SHARED_SKIP = "real third-party data not found at"
"""How a test that needs :data:`SHARED_DATA` starts its skip reason (counted at the end)."""
