"""``profile`` on an engine: every work unit profiled by a task, the arrays merged in order.

``profile`` cuts the inputs into the same units as ``pack`` (:mod:`packshard.ingest.read.units`)
and runs one task per unit on the engine::

    driver: open_stage ─► plan_units ─► engine.run(profile_unit, UnitTask per unit)
    task:   run_unit into a ProfileSink ─► ProfileParts.to_unit (a few integers per example)
    driver: in_order ─► ProfileParts.add_unit (lines absolute, domain codes global) ─► report

A task returns only the few integers per example the report needs, its first rejects and its
reject counts (:class:`~packshard.profile.gather.ProfileParts`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from packshard.engine import open_engine, worker_cores
from packshard.ingest import (
    ChatTemplate,
    InputFile,
    Stage,
    TokenizerBundle,
    UnitRead,
    UnitResult,
    UnitTask,
    WorkUnit,
    in_order,
    input_bytes,
    open_progress,
    open_stage,
    plan_units,
    run_unit,
)
from packshard.ingest.types import IngestChunk, StageSpec
from packshard.profile.config import ProfileConfig
from packshard.profile.gather import ProfileParts, ProfileUnit
from packshard.profile.report import ProfileReport


@dataclass(frozen=True, slots=True)
class ProfileSink:
    """A profile's side of a unit: :class:`ProfileParts` gathered chunk by chunk."""

    @contextmanager
    def open(
        self,
        unit: WorkUnit,
        spec: StageSpec,
        bundle: TokenizerBundle,
        template: ChatTemplate | None,
    ) -> Iterator[ProfileWriter]:
        """Gather the unit's examples into fresh parts."""
        yield ProfileWriter()


@dataclass(slots=True)
class ProfileWriter:
    """One unit's gathered parts."""

    parts: ProfileParts = field(default_factory=ProfileParts)

    def add(self, chunk: IngestChunk) -> None:
        """Gather ``chunk``'s examples and rejects."""
        self.parts.add_chunk(chunk)

    def finish(self, read: UnitRead) -> ProfileUnit:
        """Return the unit's few integers per example."""
        return self.parts.to_unit()


def profile_unit(task: UnitTask[ProfileSink]) -> UnitResult[ProfileUnit]:
    """Profile one unit: per-example arrays, first rejects, counts (runs in a worker)."""
    return run_unit(task, worker_cores())


def profile_inputs(
    files: Sequence[InputFile],
    config: ProfileConfig,
    progress: bool | str | None = False,
    stage: Stage | None = None,
) -> ProfileReport:
    """Profile ``files`` (``config.inputs`` expanded) unit by unit on ``config.engine``.

    ``stage`` is the stage the caller already opened (opened here otherwise).

    Raises:
        RecordError: the first unit error in input order (``--on-error fail``).

    """
    config.check()
    if stage is None:
        stage = open_stage(config.tokenizer, config.template, config.ingest)
    units = plan_units(files, config.split_bytes)
    tasks = [UnitTask(stage.spec, u, ProfileSink()) for u in units]
    bar = open_progress(progress, sum(u.size for u in units))

    def done(i: int, r: UnitResult[ProfileUnit]) -> None:
        if bar is not None:
            bar.add(r.read.records, r.value.tokens, units[i].size)

    try:
        engine = config.engine.sized(input_bytes(files))  # --workers auto
        with open_engine(engine) as running, stage.shared():
            results = running.run(profile_unit, tasks, [u.describe() for u in units], done)
    finally:
        if bar is not None:
            bar.close()
    parts = ProfileParts()  # the units' results in unit order, lines made absolute
    for r, base in in_order(results, len(files)):
        parts.add_unit(r.value, base)
    mix = config.mix_target()
    return parts.report(
        config.max_seq_len, config.batch_size, config.seed, stage.label_path, mix, config.overlong
    )
