"""Every failure of a command becomes one line on stderr and an exit code, in one place.

:class:`CommandGroup` runs a command and turns what escapes it into a message:
:class:`~packshard.errors.PackshardError` with its own exit code (1 data, 2 usage), an
``OSError`` the environment raised (disk full, permission, read-only) with a hint, and running
out of memory with the options that lower it.  Messages stay on one line (a newline inside a
path or a record is escaped) so that they remain greppable, and hold no character a terminal
acts on (:func:`printable`: a manifest or an input cannot forge a line on the screen).
"""

from __future__ import annotations

import errno
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from packshard.engine.signals import Terminated
from packshard.errors import EXIT_USAGE, PackshardError, UsageError
from packshard.jit import own_process

CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""Characters a terminal acts on instead of showing: C0 but tab and newline (ESC starts a
sequence that moves the cursor, recolours or retitles; CR and backspace overwrite), DEL, C1,
and the Unicode line separators and bidirectional overrides (which reorder what is shown)."""


def printable(text: str) -> str:
    """Escape what a terminal would act on (:data:`CONTROL`), as ``\\x1b`` or ``\\u202e``.

    Every string from a manifest or an input passes here before it reaches a terminal, so
    a crafted value cannot move the cursor, rewrite a line already printed or hide text.
    """
    return CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


def one_line(text: str) -> str:
    """Keep a message on one line whatever a path or a record holds (newlines escaped).

    No character a terminal acts on is left either (:func:`printable`).
    """
    return printable(text.replace("\r", "\\r").replace("\n", "\\n"))


def fail(message: str, exit_code: int) -> NoReturn:
    """Print one error line on stderr and exit with ``exit_code``."""
    click.secho("error:", fg="red", bold=True, err=True, nl=False)
    click.echo(f" {message}", err=True)
    sys.exit(exit_code)


_OS_HINTS = {
    errno.ENOSPC: "the disk is full: free space or write elsewhere",
    errno.EDQUOT: "the disk quota is full: free space or write elsewhere",
    errno.EFBIG: "the file is larger than this system allows",
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.EACCES: "check the permissions",
    errno.EPERM: "check the permissions",
}


@contextmanager
def naming(path: str) -> Iterator[None]:
    """Give an OSError that names no file (a failed write, disk full) the path being written."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = path
        raise


def not_over(*paths: str | None, reading: list[Path]) -> None:
    """Refuse a report path that would overwrite an input or a file of the folder read."""
    for path in paths:
        if path is None:
            continue
        real = Path(path).resolve()
        for read in reading:
            if real == read.resolve() or read.resolve() in real.parents:
                raise UsageError(f"{path}: would write over or into {read}, which is being read")


def warn(message: str) -> None:
    """Print one warning line on stderr."""
    click.secho("warning:", fg="yellow", err=True, nl=False)
    click.echo(f" {one_line(message)}", err=True)


class CommandGroup(click.Group):
    """A click group whose commands end in one line and an exit code, never a traceback."""

    owns_process = False
    """Whether this run reads the process's own command line (``args`` None): the process
    ends with the command, so what a command froze (:mod:`packshard.cli.commands`) stays so."""

    def main(self, args: Sequence[str] | None = None, *rest: Any, **kwargs: Any) -> Any:
        """Run the command line ``args`` (None: the process's own)."""
        self.owns_process = args is None
        if self.owns_process:  # no other package's numba extensions here (packshard.jit)
            own_process()
        return super().main(args, *rest, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; what escapes it ends in one line and an exit code."""
        try:
            return super().invoke(ctx)
        except PackshardError as exc:  # one unwrapped line: messages start with ``file:line``
            fail(one_line(str(exc)), exc.exit_code)
        except OSError as exc:  # the last resort for what the environment refused: one line
            where = f"{exc.filename}: " if exc.filename else ""
            hint = _OS_HINTS.get(exc.errno or 0, "")
            what = exc.strerror or " ".join(str(exc).split())
            fail(one_line(f"{where}{what}" + (f" ({hint})" if hint else "")), EXIT_USAGE)
        except Terminated as exc:  # SIGTERM or SIGHUP: workers stopped, partial output removed
            fail(f"{exc} (the partial output was removed)", exc.exit_code)
        except MemoryError:
            fail(
                "out of memory (lower --batch-size or --max-record-bytes, or give the run "
                "more memory)",
                EXIT_USAGE,
            )
