"""A torchtune that cannot import (torchao too new) is named with its pin after the export."""

from __future__ import annotations

import sys

from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.export.pins import torchtune_problem


def _break_torchao(monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "torchtune" or m.startswith("torchtune.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao raises ImportError


def test_a_broken_torchtune_import_names_the_torchao_pin(packed_demo, tmp_path, monkeypatch):
    _break_torchao(monkeypatch)
    result = CliRunner().invoke(
        main, ["export", str(packed_demo), "--to", "torchtune", "-o", str(tmp_path / "tt")]
    )
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("warning: ")]
    assert line.startswith("warning: torchtune cannot be imported here (")
    assert line.endswith(
        "torchtune 0.6.1 needs torchao==0.17.0 (pip install 'torchao==0.17.0', or pip install "
        "'packshard[torchtune]')"
    )


def test_nothing_said_when_torchtune_is_absent(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchtune", None)
    assert torchtune_problem() is None
