"""Where the commands print: a rich console on a terminal, plain unwrapped text in a pipe.

On a terminal, tables fit its width and colours carry meaning.  In a pipe or a log, rich
would wrap every table at 80 columns (a long domain name over three lines) and drop the
colours; so when stdout is not a terminal the console is as wide as the longest line
(:data:`PIPE_WIDTH`), has no colour, and what colour alone meant is written out in text
(``inspect`` brackets trained text: :data:`packshard.cli.inspect.TRAINED_MARKS`)::

    terminal: │ records read         │   65 │   (wrapped to the window, coloured)
    pipe:     one line per row, however long; no escape codes
"""

from __future__ import annotations

import sys
from typing import Any

PIPE_WIDTH = 4096
"""Columns of the console in a pipe: wide enough that no table or line is wrapped."""


def plain() -> bool:
    """Whether stdout is not a terminal (a pipe, a file, a log)."""
    return not sys.stdout.isatty()


def console() -> Any:
    """Return the console the commands print to (see the module docstring)."""
    from rich.console import Console

    if not plain():
        return Console(highlight=False, soft_wrap=False)

    class PlainConsole(Console):
        def print(self, *objects: Any, **kwargs: Any) -> None:
            for item in objects:
                unwrap(item)
            super().print(*objects, **kwargs)

    return PlainConsole(highlight=False, soft_wrap=False, width=PIPE_WIDTH, color_system=None)


def unwrap(renderable: Any) -> None:
    """Let every column of the tables in ``renderable`` be as wide as its longest cell."""
    from rich.console import Group
    from rich.table import Table

    if isinstance(renderable, Group):
        for item in renderable.renderables:
            unwrap(item)
    elif isinstance(renderable, Table):
        for column in renderable.columns:
            column.max_width, column.no_wrap, column.overflow = None, True, "ignore"
