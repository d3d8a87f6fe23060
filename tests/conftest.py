"""Shared fixtures: real third-party inputs from ``../shared/data`` when present."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of real tokenizers and chat datasets; skip when this checkout has none."""
    if not (SHARED_DATA / "tokenizers").is_dir():
        pytest.skip(f"real third-party data not found at {SHARED_DATA} (kept outside the repository)")
    return SHARED_DATA
