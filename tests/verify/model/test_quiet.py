"""verify's model check prints no library warnings a user cannot act on (a quiet demo)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from packshard.verify.model.quiet import NOISY_LOGGERS, quiet_libraries


@pytest.mark.torch
def test_verify_with_the_tiny_model_writes_nothing_to_stderr(packed_demo):
    pytest.importorskip("transformers")
    code = "from packshard.cli.commands import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "verify", str(packed_demo), "--no-source", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "OK: every seam holds" in done.stdout


def test_levels_are_restored():
    logger = logging.getLogger(NOISY_LOGGERS[0])
    before = logger.level
    with quiet_libraries():
        assert logger.level == logging.ERROR
    assert logger.level == before
