"""What a unit task is and what it returns: the values a driver reads without the ingest.

A command hands its engine one :class:`UnitTask` per work unit; the worker runs it
(:func:`~packshard.ingest.stage.unit.run_unit`) and returns a :class:`UnitResult`: what
ingest counted (:class:`UnitRead`) and what the command's sink kept (``value``).  The driver
puts the results in order with :func:`in_order`, which turns each unit's relative lines
absolute and raises the first unit error in input order::

    one input, 3 byte ranges      newlines 40, 35, 52
    line bases                    0, 40, 75        (whole inputs and row groups: 0)
    third unit's error, line 7 ─► RecordError at line 82 of the input

Nothing here loads a tokenizer or renders a template: a driver that merges results (pack's
merge, resume's reuse check) imports these values, not the stage that made them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from packshard.errors import RecordError
from packshard.ingest.read.units import WorkUnit
from packshard.ingest.template.sandbox import ChatTemplate
from packshard.ingest.tokens.tokenizer import TokenizerBundle
from packshard.ingest.types import IngestChunk, StageSpec

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True, slots=True)
class UnitError:
    """A record error a unit met, at its line relative to the unit's range."""

    code: str
    reason: str
    source: str
    line: int

    def at(self, base: int) -> RecordError:
        """Return the error at its absolute line (``base``: lines before the unit's range)."""
        return RecordError(self.code, self.reason, self.source, self.line + base)


@dataclass(frozen=True, slots=True)
class UnitRead:
    """What ingesting a unit counted, whatever the command."""

    records: int = 0  # every record read (accepted or rejected)
    newlines: int = 0  # lines of a byte range (0 for row groups and whole inputs)
    error: UnitError | None = None
    reasoning_dropped: int = 0  # trained turns whose reasoning the template left out
    pairs_read: int = 0  # preference records read (packed or rejected)
    encode: dict[str, Any] | None = None  # what encoded the unit (backends.decided)


@dataclass(frozen=True, slots=True)
class UnitResult(Generic[T]):
    """One unit's result: what ingest counted and what the command's sink kept (``value``)."""

    unit: WorkUnit
    read: UnitRead
    value: T


class UnitWriter(Protocol[T_co]):
    """A command's side of one unit: fed each chunk, then finished once."""

    def add(self, chunk: IngestChunk) -> None:
        """Keep what the command needs of ``chunk``."""

    def finish(self, read: UnitRead) -> T_co:
        """Return what the unit's result carries back to the driver."""


class UnitSink(Protocol[T_co]):
    """What a command hands its unit tasks: picklable; opens a writer in the worker."""

    def open(
        self,
        unit: WorkUnit,
        spec: StageSpec,
        bundle: TokenizerBundle,
        template: ChatTemplate | None,
    ) -> AbstractContextManager[UnitWriter[T_co]]:
        """Open the unit's writer (closed, and cleaned up on failure, by the context)."""


S = TypeVar("S", bound=UnitSink[Any], covariant=True)


@dataclass(frozen=True, slots=True)
class UnitTask(Generic[S]):
    """One unit to ingest: the stage that loads it, the unit, the command's sink."""

    stage: StageSpec
    unit: WorkUnit
    sink: S


def in_order(results: Sequence[UnitResult[T]], inputs: int) -> Iterator[tuple[UnitResult[T], int]]:
    """Yield each unit's result with its line base, in unit order; raise the first error.

    ``inputs`` is the number of input files the units were cut from; the line base is the
    module docstring's.

    Raises:
        RecordError: the first unit error in input order, at its absolute line.

    """
    line_base = [0] * inputs
    for result in results:
        first = result.unit.ranges[0]  # the only one, or the first of whole inputs (base 0)
        base = line_base[first.index] if first.kind == "bytes" else 0
        if not result.unit.gathered:
            line_base[first.index] += result.read.newlines
        if result.read.error is not None:
            raise result.read.error.at(base)
        yield result, base
