"""One work unit ingested in a worker: the unit task run into the command's sink.

``pack``, ``profile`` and ``verify`` cut their inputs into work units
(:func:`~packshard.ingest.read.units.plan_units`) and run one :class:`UnitTask` per unit on
an engine.  The task ingests its unit into the command's sink; the sink keeps what its
command needs (a spill part, a profile's integers, digests) and returns it as the
result's ``value``::

    worker   UnitTask(stage, unit, sink) ─► run_unit(task, worker_cores()):
               loaded(stage) ─► sink.open(…) ─► ingest(unit) ─► writer.add(chunk) …
               ─► writer.finish(read) ─► UnitResult(unit, records, newlines, error, …, value)
    driver   in_order(results, inputs) ─► (result, line base) per unit, in unit order;
               the first unit error raised there, at its absolute line

A unit's lines are relative to its byte range's start (a record on the range's first line is
line 1); ``newlines`` is how many lines the range held, so the driver adds the lines of the
ranges before it in the same input (``line base``).  Row groups and whole inputs are numbered
from their input's start already (base 0).  A ``RecordError`` (``--on-error fail``,
``--overlong error``) does not stop the unit's task: it comes back as ``error`` and the
driver raises the first one in input order, whichever unit finished first.
"""

from __future__ import annotations

from typing import Any, TypeVar

from packshard.errors import PackshardError, RecordError
from packshard.ingest.label.spans import render_example
from packshard.ingest.normalize import normalize_record
from packshard.ingest.read.units import RangeRead, read_range
from packshard.ingest.stage.loaded import load_early, loaded
from packshard.ingest.stage.task import UnitError, UnitRead, UnitResult, UnitSink, UnitTask
from packshard.ingest.stream import ingest
from packshard.ingest.template.fast import renderer_for
from packshard.ingest.tokens.backends import decided, warm_encoder
from packshard.ingest.tokens.labels import encode_texts, label_encodings
from packshard.ingest.types import RawRecord
from packshard.records import SourceRef

T = TypeVar("T")


def run_unit(task: UnitTask[UnitSink[T]], threads: int) -> UnitResult[T]:
    """Ingest one unit into its sink (see the module docstring); runs in a worker.

    ``threads`` is the cores the worker may use (the engine's ``worker_cores``): with one,
    chunks are encoded on the reading thread (:func:`~packshard.ingest.stream.ingest`).
    """
    spec, unit = task.stage, task.unit
    bundle, template = loaded(spec.tokenizer, spec.template)
    # decided while the first records render
    warm_encoder(bundle, spec.options.backend, spec.options.small_job)
    state = RangeRead()
    records = reasoning_dropped = pairs_read = 0
    error = None
    with task.sink.open(unit, spec, bundle, template) as writer:
        try:
            chunks = ingest(
                list(unit.ranges),
                bundle,
                template,
                spec.options,
                read=lambda s, options: read_range(s, state, options),
                threads=threads,
            )
            for chunk in chunks:
                records += chunk.records
                reasoning_dropped += chunk.reasoning_dropped
                pairs_read += chunk.pairs_read
                writer.add(chunk)
        except RecordError as exc:  # --on-error fail, --overlong error: the driver decides
            error = UnitError(exc.code, exc.reason, exc.source, exc.line)
        read = UnitRead(
            records,
            state.newlines,
            error,
            reasoning_dropped,
            pairs_read,
            decided(bundle, spec.options.backend, spec.options.small_job),
        )
        return UnitResult(unit, read, writer.finish(read))


def warm_stage(specs: tuple[str, str | None, str] | tuple[str, str | None, str, bool]) -> None:
    """Load the tokenizer, the template and the run's backends, and label one tiny record.

    ``specs`` are the tokenizer, the template, ``--backend`` and, optionally, whether the
    job is small (:func:`~packshard.ingest.stage.loaded.load_early`).  The tiny record also loads
    every jitted kernel labelling uses; run in the fork server, all of it is in each worker
    before its first unit (:mod:`packshard.engine.forkwarm`).  So are the fast renderer and
    encoder (1.33 CPU-s for Qwen3's fastokens encoder in each worker otherwise); the encoder
    is only built here, never used, so that no state of its library's threads crosses the
    fork: each worker still decides and proves it.
    """
    tokenizer, template_spec, backend, *_ = specs
    load_early(specs)
    bundle, template = loaded(tokenizer, template_spec)
    value: dict[str, Any] = {"text": "warm"}
    if template is not None:
        value = {
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
        }
    try:
        if backend != "reference" and template is not None:
            renderer_for(template, bundle.special_tokens_map, backend)
        conv = normalize_record(RawRecord(SourceRef("warm", 1), "warm", value))
        rendered = [render_example(conv, template, bundle, "auto")]
        label_encodings(bundle, rendered, encode_texts(bundle, rendered))
    except PackshardError:  # a template that wants other turns: the first unit warms up
        return
