"""The ``packshard`` command line: ``main`` is the console entry point."""

from packshard.cli.commands import main

__all__ = ["main"]
