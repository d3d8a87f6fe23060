"""A fresh clone's run ends with one line saying what was skipped for want of the real data."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

from tests.conftest import shared_skip_line
from tests.helpers import REPO, SHARED_SKIP


def test_the_line_counts_only_shared_data_skips():
    reports = [
        SimpleNamespace(longrepr=("t.py", 1, f"Skipped: {SHARED_SKIP} /x (kept outside)")),
        SimpleNamespace(longrepr=("t.py", 2, "Skipped: no GPU")),
        SimpleNamespace(longrepr=("t.py", 3, f"Skipped: {SHARED_SKIP} /x (kept outside)")),
    ]
    line = shared_skip_line(reports)
    assert line is not None and line.startswith("2 test(s) skipped: the real tokenizers")
    assert "PACKSHARD_SHARED_DATA=" in line
    assert shared_skip_line(reports[1:2]) is None


def test_a_run_without_the_data_prints_the_line(tmp_path):
    env = {**os.environ, "PACKSHARD_SHARED_DATA": str(tmp_path / "absent")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "tests/ingest/stage/test_markers.py", "-k", "refused or own_templates"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    assert "2 test(s) skipped: the real tokenizers and datasets are not at" in done.stdout
