"""``profile`` on an engine: every work unit profiled by a task, the arrays merged in order.

``profile`` cuts the inputs into the same units as ``pack`` (:mod:`packshard.ingest.read.splits`:
byte ranges, row groups, small whole inputs gathered) and runs one task per unit on the engine
``--workers`` / ``--engine`` name (``--workers 1``: in this process, on the driver's tokenizer
and template)::

    driver: load tokenizer + template ─► plan_units ─► engine.run(profile_unit, units)
    task:   ingest over its unit ─► ProfileParts.to_unit (a few integers per example)
    driver: ProfileParts.add_unit in unit order (lines absolute, domain codes global) ─► report

A task returns only the few integers per example the report needs (length, loss tokens,
domain code, reasoning tokens and the trained ones, whether it starts a record), its first
rejects and its reject counts.  Both sides gather with
:class:`~packshard.profile.gather.ProfileParts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from packshard.engine import open_engine, worker_cores
from packshard.errors import RecordError
from packshard.ingest.stage.loaded import Loaded, loaded, sharing
from packshard.ingest.progress import open_progress
from packshard.ingest.read.sources import InputFile
from packshard.ingest.read.splits import SplitRead, WorkUnit, input_bytes, plan_units, read_split
from packshard.ingest.stream import ingest, ingest_label_path
from packshard.ingest.template.render import load_template
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import IngestOptions
from packshard.profile.config import ProfileConfig
from packshard.profile.gather import ProfileParts
from packshard.profile.report import ProfileReport


@dataclass(frozen=True, slots=True)
class ProfileTask:
    """One unit to profile, with what loads the tokenizer and template in the worker."""

    tokenizer: str
    template: str | None
    options: IngestOptions
    unit: WorkUnit


def profile_unit(task: ProfileTask) -> dict[str, Any]:
    """Profile one unit: per-example arrays, first rejects, counts (runs in a worker)."""
    bundle, template = loaded(task.tokenizer, task.template)
    state = SplitRead()
    parts = ProfileParts()
    error = None
    records = 0
    try:
        chunks = ingest(
            list(task.unit.splits),
            bundle,
            template,
            task.options,
            read=lambda s, options: read_split(s, state, options),
            threads=worker_cores(),
        )
        for chunk in chunks:
            parts.add_chunk(chunk)
            records += chunk.records
    except RecordError as exc:  # --on-error fail: the driver raises the first, in order
        error = (exc.code, exc.reason, exc.source, exc.line)
    return {**parts.to_unit(), "newlines": state.newlines, "records": records, "error": error}


def profile_inputs(
    files: Sequence[InputFile],
    config: ProfileConfig,
    progress: bool | str | None = False,
    load: Loaded | None = None,
) -> ProfileReport:
    """Profile ``files`` (``config.inputs`` expanded) unit by unit on ``config.engine``.

    Tasks load ``config.tokenizer`` and ``config.template`` by spec; ``load`` is the pair the
    caller already holds for them (loaded here otherwise), which tasks run in this process
    share.  See the module docstring.

    Raises:
        RecordError: the first unit error in input order (``--on-error fail``).

    """
    config.check()
    tokenizer, template = config.tokenizer, config.template
    if load is None:
        bundle = load_tokenizer(tokenizer)
        load = bundle, load_template(template, bundle)
    label_path = ingest_label_path(load[1], config.ingest.loss)
    units = plan_units(files, config.split_bytes)
    tasks = [ProfileTask(tokenizer, template, config.ingest, u) for u in units]
    bar = open_progress(progress, sum(u.size for u in units))

    def done(i: int, r: dict[str, Any]) -> None:
        if bar is not None:
            bar.add(r["records"], int(r["lengths"].sum()), units[i].size)

    try:
        engine = config.engine.sized(input_bytes(files))  # --workers auto
        with open_engine(engine) as running, sharing(tokenizer, template, lambda: load):
            results = running.run(profile_unit, tasks, [u.describe() for u in units], done)
    finally:
        if bar is not None:
            bar.close()
    parts = ProfileParts()  # the units' results in unit order, lines made absolute
    line_base = [0] * len(files)
    for unit, r in zip(units, results, strict=True):
        first = unit.splits[0]  # the only one, or the first of whole inputs (base 0)
        base = line_base[first.index] if first.kind == "bytes" else 0
        if not unit.gathered:
            line_base[first.index] += r["newlines"]
        if r["error"] is not None:
            code, reason, source, line = r["error"]
            raise RecordError(code, reason, source, line + base)
        parts.add_unit(r, base)
    mix = config.mix_target()
    return parts.report(
        config.max_seq_len, config.batch_size, config.seed, label_path, mix, config.overlong
    )
