"""The command-line reference (``docs/cli.md``), generated from the click commands themselves.

Each command gets its help text, usage line and an options table (name, type or choices,
default, help), in the order ``--help`` lists them::

    ## packshard pack
    <help text, with its Example:>
    | option | value | default | help |

``make docs`` writes the page; ``tests/cli/test_reference.py`` fails when the page and the
commands disagree, so the reference cannot drift from the code.
"""

from __future__ import annotations

import inspect

import click

from packshard.cli.commands import main

HEADER = (
    "# Command-line reference\n\n"
    "Generated from the commands by `make docs` (`python -m packshard.cli.reference`); a test\n"
    "fails when it is out of date. Each command's `--help` prints the same.\n"
)


def _value(param: click.Parameter) -> str:
    if isinstance(param.type, click.Choice):
        return "\\|".join(str(c) for c in param.type.choices)
    if isinstance(param, click.Option) and param.is_flag:
        return "flag"
    return param.type.name.upper()


def _default(param: click.Parameter) -> str:
    default = param.default
    unset = param.required or type(default).__name__ == "Sentinel"
    if unset or default is None or default == () or getattr(param, "is_flag", False):
        return "on" if default is True else ""
    return f"`{default}`"


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def command_reference(name: str, command: click.Command) -> str:
    """Return the markdown section of one command."""
    ctx = click.Context(command, info_name=f"packshard {name}")
    lines = [f"## packshard {name}", "", "```text", command.get_usage(ctx), "```", ""]
    help_text = inspect.cleandoc((command.help or "").replace("\b\n", ""))
    lines += ["```text", help_text, "```", ""]
    args = [p for p in command.params if isinstance(p, click.Argument)]
    if args:
        lines.append("Arguments: " + ", ".join(f"`{a.human_readable_name}`" for a in args) + ".")
        lines.append("")
    lines += ["| option | value | default | help |", "| --- | --- | --- | --- |"]
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        lines.append(f"| {names} | {_value(param)} | {_default(param)} | {_cell(param.help)} |")
    return "\n".join(lines) + "\n"


def cli_reference() -> str:
    """Return the whole reference page."""
    sections = [command_reference(n, main.commands[n]) for n in sorted(main.commands)]
    return HEADER + "\n" + "\n".join(sections)


if __name__ == "__main__":
    import sys
    from pathlib import Path

    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/cli.md")
    target.write_text(cli_reference(), encoding="utf-8")
    print(f"wrote {target}")
