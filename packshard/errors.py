"""One exception hierarchy for every failure packshard reports.

Messages are compiler style: they start with the place (``file:line`` where a record is
involved), say what is wrong, and end with the flag or action that fixes it, e.g.::

    chat.jsonl:1812: example is 9133 tokens > max_seq_len 8192 (use --overlong truncate|split|drop)

Exit codes follow one rule across the command line: 0 ok, 1 data or audit failure, 2 usage
(bad flags, unreadable input, missing files).  ``assert`` is reserved for internal invariants;
data is validated with these exceptions.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_DATA = 1
EXIT_USAGE = 2


class PackshardError(Exception):
    """Base class of every error packshard raises on purpose."""

    exit_code: int = EXIT_DATA


class UsageError(PackshardError):
    """Bad options or arguments: the command cannot start."""

    exit_code = EXIT_USAGE


class InputError(PackshardError):
    """An input file or folder cannot be found or opened."""

    exit_code = EXIT_USAGE


class TokenizerError(PackshardError):
    """A tokenizer cannot be loaded or lacks what the job needs."""

    exit_code = EXIT_USAGE


class TemplateError(PackshardError):
    """A chat template cannot be loaded, compiled or rendered."""

    exit_code = EXIT_USAGE


class RecordError(PackshardError):
    """One input record cannot be used; it becomes a line in ``rejects.jsonl``.

    ``code`` is stable and machine readable (``invalid_json``, ``too_long`` …); ``reason`` is
    for people.  ``str(err)`` is ``source:line: reason``.
    """

    exit_code = EXIT_DATA

    def __init__(self, code: str, reason: str, source: str = "<unknown>", line: int = 0) -> None:
        self.code = code
        self.reason = reason
        self.source = source
        self.line = line
        super().__init__(f"{source}:{line}: {reason}")

    def at(self, source: str, line: int) -> RecordError:
        """Return the same error placed at ``source:line``."""
        return type(self)(self.code, self.reason, source, line)


class ManifestError(PackshardError):
    """A dataset folder's manifest is missing, invalid or of an unsupported version."""

    exit_code = EXIT_USAGE


class AuditError(PackshardError):
    """``verify`` found at least one finding."""

    exit_code = EXIT_DATA
