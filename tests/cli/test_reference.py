"""docs/cli.md is the reference the commands generate: it cannot drift from the code."""

from __future__ import annotations

from pathlib import Path

from packshard.cli.commands import main
from packshard.cli.reference import cli_reference, command_reference

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_the_reference_page_is_current():
    assert DOCS.read_text(encoding="utf-8") == cli_reference(), (
        "docs/cli.md is out of date: run `make docs`"
    )


def test_every_option_of_every_command_is_in_the_reference():
    for name, command in main.commands.items():
        section = command_reference(name, command)
        assert section.startswith(f"## packshard {name}\n")
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("-"):
                    assert f"`{opt}`" in section, f"{name} {opt} missing from the reference"
