"""Startup: a command imports only what it needs (no torch, transformers, numba on --help).

Each check runs in a fresh interpreter, so what earlier tests imported does not count.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "numba", "fastokens", "datasets", "ray")


def _imported(code: str) -> set[str]:
    found = f"','.join(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    probe = f"{code}\nimport sys\nprint('IMPORTED:' + {found})"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("IMPORTED:"), done.stdout
    return set(filter(None, line.removeprefix("IMPORTED:").split(",")))


@pytest.mark.parametrize("command", [[], ["pack"], ["profile"], ["verify"], ["export"]])
def test_help_imports_nothing_heavy(command):
    code = (
        "from packshard.cli import main\n"
        f"try:\n    main({[*command, '--help']!r})\nexcept SystemExit:\n    pass"
    )
    assert _imported(code) == set()


def test_a_pack_imports_neither_torch_nor_transformers(tmp_path, demo_tokenizer):
    from packshard.demo import demo_data_path

    args = [str(demo_data_path()), "-t", str(demo_tokenizer), "--template", "chatml"]
    args += ["--max-seq-len", "256", "-o", str(tmp_path / "out")]
    code = (
        "from packshard.cli import main\n"
        f"try:\n    main({['pack', *args]!r})\nexcept SystemExit as exc:\n    assert not exc.code"
    )
    assert _imported(code) <= {"numba", "fastokens"}  # labels and plans are jitted


def test_inspect_imports_nothing_heavy(packed_demo):
    """``inspect`` reads a folder: no planner (numba), no model (torch, transformers)."""
    code = (
        "from packshard.cli import main\n"
        f"try:\n    main(['inspect', {str(packed_demo)!r}, '--row', '0'])\n"
        "except SystemExit as exc:\n    assert not exc.code"
    )
    assert _imported(code) == set()


def test_verify_without_the_model_check_imports_no_model_library(packed_demo):
    code = (
        "from packshard.cli import main\n"
        f"try:\n    main(['verify', {str(packed_demo)!r}, '--model', 'none'])\n"
        "except SystemExit as exc:\n    assert not exc.code"
    )
    assert _imported(code) <= {"numba"}  # the source check labels with the jitted aligner


@pytest.mark.parametrize(
    "module", ["packshard.cli.tables", "packshard.cli.html", "packshard.pack.plan.mix"]
)
def test_option_and_table_modules_import_no_pipeline(module):
    """A step's module does not drag in the pack pipeline (and numba) through a package."""
    assert _imported(f"import {module}") == set()


def test_a_command_freezes_its_imports_and_thaws_them_in_a_callers_process(packed_demo):
    """The ``packshard`` process keeps its modules frozen; ``main([...])`` in a caller does not."""
    import gc

    from click.testing import CliRunner

    from packshard.cli import main

    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('FROZEN:', gc.get_freeze_count()))\n"
        f"sys.argv = ['packshard', 'inspect', {str(packed_demo)!r}]\n"
        "from packshard.cli import main\nmain()"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.rsplit("FROZEN:", 1)[1]) > 10_000
    result = CliRunner().invoke(main, ["inspect", str(packed_demo)])
    assert result.exit_code == 0, result.output
    assert gc.get_freeze_count() == 0
