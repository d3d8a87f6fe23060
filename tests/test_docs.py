"""Documentation coverage: every command has help with an example and a place in the README."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from packshard.cli.commands import main

README = Path(__file__).resolve().parents[1] / "README.md"
COMMANDS = sorted(main.commands)


def test_the_commands_are_the_documented_six():
    assert COMMANDS == ["export", "inspect", "pack", "profile", "repack", "verify"]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_with_an_example(name):
    command = main.commands[name]
    assert command.help, f"packshard {name} has no help text"
    result = CliRunner().invoke(main, [name, "--help"], prog_name="packshard")
    assert result.exit_code == 0
    assert "Example:" in result.output, f"packshard {name} --help shows no Example:"
    example = result.output.split("Example:", 1)[1]
    assert f"packshard {name} " in example, f"the example of packshard {name} does not run it"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_has_help(name):
    command = main.commands[name]
    for param in command.params:
        if isinstance(param, click.Option) and param.name != "help":
            assert param.help, f"packshard {name} {param.opts[0]} has no help text"


def test_group_help_lists_every_command():
    result = CliRunner().invoke(main, ["--help"], prog_name="packshard")
    assert result.exit_code == 0
    assert "Example:" in result.output
    for name in COMMANDS:
        assert re.search(rf"^  {name}\s+\S", result.output, re.M), f"{name} missing from --help"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_is_in_the_readme(name):
    text = README.read_text(encoding="utf-8") if README.is_file() else ""
    assert text.strip(), f"{README.name} is empty: document the commands {', '.join(COMMANDS)}"
    assert re.search(rf"\bpackshard {name}\b", text), (
        f"{README.name} never shows `packshard {name}`: add a section with an example of it"
    )


def test_help_examples_render_without_a_literal_backslash_b():
    """A raw docstring would print click's verbatim marker as the two characters '\\b'."""
    from click.testing import CliRunner

    from packshard.cli.commands import main

    for args in ([], *([name] for name in main.commands)):
        result = CliRunner().invoke(main, [*args, "--help"])
        assert result.exit_code == 0
        assert "\\b" not in result.output, args
        assert "Example:\n" in result.output, args


def test_the_readme_is_short_and_the_manual_lives_in_docs():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"README.md has {lines} lines: move the detail into docs/ (at most 300)"
    docs = README.parent / "docs"
    for link in re.findall(r"\]\((docs/[^)#]+)\)", README.read_text(encoding="utf-8")):
        assert (README.parent / link).is_file(), f"README links to {link}, which does not exist"
    assert docs.is_dir() and len(list(docs.glob("*.md"))) >= 8
