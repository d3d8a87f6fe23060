"""Compiled kernels are cached in the user's cache, never inside the installed package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = (
    "import packshard.pack.plan.planner, numba, numpy as np\n"
    "from packshard.pack.plan.planner import plan_packs\n"
    "plan_packs(np.array([3, 4, 5], dtype=np.int64), 8, 'bfd')\n"
    "print(numba.config.CACHE_DIR)\n"
)


def test_the_numba_cache_goes_to_the_user_cache(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    where = Path(done.stdout.strip())
    assert where == tmp_path / "cache" / "packshard" / "numba"
    assert any(where.rglob("*.nbi"))  # the kernels' index files were written there


def test_a_numba_cache_dir_the_user_set_is_kept(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "mine"))
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    assert Path(done.stdout.strip()) == tmp_path / "mine"
