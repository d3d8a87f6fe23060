"""packshard's own processes skip numba's extensions; a library caller's process does not."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from packshard import jit

ROOT = Path(__file__).resolve().parents[1]

# a process that plans three lengths with the planner's kernels, then says what it imported
PLAN = """
import json, sys
from packshard import jit
if sys.argv[1] == "own":
    jit.own_process()
import numpy as np
from packshard.pack.plan.planner import plan_packs
skipped = jit.skip_if_own(imported=True)
rows = plan_packs(np.array([3, 2, 1], np.int32), 4, "bfd")
from packshard.ingest.tokens.alignment import covered
mask = covered(6, np.array([0, 3], np.int64), np.array([2, 5], np.int64))
print(json.dumps({"skipped": skipped, "awkward": "awkward" in sys.modules,
                  "registries": "numba.np.linalg" in sys.modules, "mask": mask.tolist(),
                  "rows": [rows.row_offsets.tolist(), rows.seg_example.tolist()]}))
"""


def run(code: str, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != jit.OWN_ENV}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(
    importlib.util.find_spec("awkward") is None,
    reason="awkward (a numba extension, installed with gigatoken) is not installed",
)
def test_own_process_plans_the_same_without_importing_awkward():
    own, library = run(PLAN, "own"), run(PLAN, "library")
    assert own["skipped"] and not own["awkward"]
    assert not library["skipped"] and library["awkward"]  # control: numba loads it otherwise
    assert own["rows"] == library["rows"]


def test_own_process_loads_cached_kernels_without_the_registries():
    library = run(PLAN, "library")  # also fills numba's cache, if it was empty
    own = run(PLAN, "own")
    assert own["skipped"] and not own["registries"]
    assert library["registries"]  # control: numba's own load imports them
    assert (own["rows"], own["mask"]) == (library["rows"], library["mask"])
    assert own["mask"] == [True, True, False, True, True, False]


def test_the_light_load_is_installed_once():
    code = (
        "import json\nfrom numba.core import caching\nfrom packshard import jit\n"
        "first = caching.Cache.load_overload\nassert jit.load_cached_lightly()\n"
        "light = caching.Cache.load_overload\nassert jit.load_cached_lightly()\n"
        "print(json.dumps([first is light, light is caching.Cache.load_overload]))"
    )
    assert run(code) == [False, True]


def test_skip_if_own_needs_the_mark(monkeypatch):
    monkeypatch.delenv(jit.OWN_ENV, raising=False)
    assert not jit.skip_if_own()


def test_skip_if_own_imports_no_numba_when_asked_not_to():
    code = (
        "import json, sys\nfrom packshard import jit\njit.own_process()\n"
        "print(json.dumps({'skipped': jit.skip_if_own(imported=True),"
        " 'numba': 'numba' in sys.modules}))"
    )
    assert run(code) == {"skipped": False, "numba": False}
