"""A core install (``pip install .``, no extras) packs, verifies and inspects.

The test environment has torch and the extras' libraries, which load modules a core install
never loads (``pyarrow.compute`` above all: pyarrow 26 no longer loads it with
``pyarrow.parquet``, so ``pa.compute`` is missing unless something imported it).  Each run here
is a fresh interpreter, which has imported nothing but packshard and in which torch and
transformers cannot be imported, so a hidden dependency fails here as it would for a user.
``scripts/core_install_check.sh`` (``make test-core``, run by CI) repeats this in a real venv.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BLOCKED = ("torch", "transformers", "pandas", "datasets")
PRELUDE = f"""
import sys

class Missing:
    # What a core install does not have: importing it fails as if it were not installed.
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Missing)
from packshard.cli import main
sys.exit(main())
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PRELUDE, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from packshard.demo import build_demo_tokenizer, demo_data_path

    root = tmp_path_factory.mktemp("core")
    tokenizer = build_demo_tokenizer(root / "tok")
    out = root / "out"
    args = [str(demo_data_path()), "-t", str(tokenizer), "--template", "chatml"]
    result = run("pack", *args, "--max-seq-len", "512", "-o", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr
    return out


def test_pack_runs_without_pyarrow_compute_or_torch(packed: Path) -> None:
    assert (packed / "manifest.json").is_file()


def test_verify_without_the_model_stage_passes(packed: Path) -> None:
    result = run("verify", str(packed), "--model", "none")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: every seam holds" in result.stdout


def test_verify_says_in_one_line_what_the_model_stage_needs(packed: Path) -> None:
    result = run("verify", str(packed))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    wanted = (
        "not run: model: the model stage needs torch and transformers: "
        "pip install 'packshard[torch]' (or pass --model none to skip it)"
    )
    assert wanted in result.stdout.replace("\n", " ").replace("  ", " ") or wanted in result.stdout
    assert "OK: every seam holds" not in result.stdout
    assert "NOT VERIFIED: 1 check did not run" in result.stdout


def test_inspect_runs_without_the_extras(packed: Path) -> None:
    result = run("inspect", str(packed), "--row", "0")
    assert result.returncode == 0, result.stderr
    assert "segment 0" in result.stdout
