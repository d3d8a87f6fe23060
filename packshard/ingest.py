"""The ingest stream: files in, tokenized examples and rejects out, in input order.

Every command that needs tokens (``profile``, ``pack``) reads them from :func:`ingest`::

    read_records ─► normalize_record ─► render_example ──┐  pure Python, one record at a time
         │                 │                  │          │
         └── RecordError ──┴──────────────────┘          ▼
               (reject, or raise with on_error=fail)   batch of ``batch_size`` records
                                                          │
                               encode_rendered ◄──────────┘  one encode_batch call (all cores)
                                     │
                      no_trainable_tokens check (vectorised) ─► IngestChunk(batch, rejects)

A chunk covers ``batch_size`` consecutive input records (the last one fewer), so
``chunk.records == len(chunk.batch) + len(chunk.rejects)`` and summing ``records`` over the
stream counts every record read.  Examples keep input order; so do rejects.

An example is rejected as ``no_trainable_tokens`` when every label after its first token is
``IGNORE_INDEX``: once packed, the first label of a segment is masked at the seam, so such an
example would contribute nothing to the loss.  ``batch.extra["loss_tokens"]`` holds, per
example, the number of trained labels after the first token (what the packed row will count).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packshard.errors import RecordError, UsageError
from packshard.normalize import is_encodable, normalize_record
from packshard.records import (
    FORMATS,
    IGNORE_INDEX,
    LOSS_POLICIES,
    RawRecord,
    Reject,
    SourceRef,
    TokenizedBatch,
)
from packshard.sources import InputFile, read_records
from packshard.templates import ChatTemplate, Rendered, render_example
from packshard.tokenize import TokenizerBundle, encode_rendered


@dataclass(frozen=True, slots=True)
class IngestOptions:
    """How records are read, labelled and batched (the ``--format``/``--loss``… flags)."""

    format: str = "auto"
    domain_field: str = "domain"
    loss: str = "auto"
    on_error: str = "skip"  # or "fail"
    batch_size: int = 1024


@dataclass(frozen=True)
class IngestChunk:
    """The examples and rejects of ``records`` consecutive input records.

    ``label_paths`` counts the examples per label path (``generation_tags``, ``offsets``,
    ``none``) so a manifest can say how labels were found.
    """

    batch: TokenizedBatch
    rejects: tuple[Reject, ...]
    records: int
    label_paths: dict[str, int] = field(default_factory=dict)


def ingest_label_path(template: ChatTemplate | None, loss: str) -> str:
    """Return the label path chat records take under ``template`` and ``loss``."""
    if loss == "all" or template is None:
        return "none"
    return template.label_spans


def check_options(options: IngestOptions) -> None:
    """Raise :class:`UsageError` for an option value ingest cannot honour."""
    if options.format != "auto" and options.format not in FORMATS:
        raise UsageError(f"unknown --format {options.format!r} (expected auto, "
                         f"{', '.join(FORMATS)})")  # fmt: skip
    if options.loss not in LOSS_POLICIES:
        raise UsageError(f"unknown --loss {options.loss!r} (expected {', '.join(LOSS_POLICIES)})")
    if options.on_error not in ("skip", "fail"):
        raise UsageError(f"unknown --on-error {options.on_error!r} (expected skip or fail)")
    if options.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {options.batch_size}")


def _domain_of(raw: RawRecord, domain_field: str) -> str:
    value = raw.value
    if type(value) is dict:
        domain = value.get(domain_field)
        if type(domain) is str and domain and is_encodable(domain):
            return domain
    return raw.domain


def _loss_tokens(labels: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Trained labels per example, not counting each example's first token (int64)."""
    trained = labels != IGNORE_INDEX
    running = np.zeros(len(trained) + 1, dtype=np.int64)
    np.cumsum(trained, out=running[1:])
    counts = running[offsets[1:]] - running[offsets[:-1]]
    starts = offsets[:-1]
    nonempty = offsets[1:] > starts
    counts[nonempty] -= trained[starts[nonempty]]
    return counts


_Item = tuple[int, SourceRef, str, Rendered]  # input position, place, domain, rendering


def _tokenize(
    bundle: TokenizerBundle,
    items: list[_Item],
    rejects: list[tuple[int, Reject]],
    options: IngestOptions,
    records: int,
) -> IngestChunk:
    ids, labels, offsets = encode_rendered(bundle, [item[3] for item in items])
    loss = _loss_tokens(labels, offsets)
    empty = np.flatnonzero(loss == 0)
    if empty.size:
        reason = (f"no token to train on after the first (loss policy {options.loss}: the "
                  "trained turns are empty or the template drops them)")  # fmt: skip
        dropped = []
        for i in empty.tolist():
            seq, ref, domain, _ = items[i]
            if options.on_error == "fail":
                raise RecordError("no_trainable_tokens", reason, ref.source, ref.line)
            dropped.append((seq, Reject(ref, domain, "no_trainable_tokens", reason)))
        rejects = sorted(rejects + dropped, key=lambda pair: pair[0])
        keep = loss > 0
        lengths = np.diff(offsets)
        token_keep = np.repeat(keep, lengths)
        ids, labels = ids[token_keep], labels[token_keep]
        offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
        np.cumsum(lengths[keep], out=offsets[1:])
        loss = loss[keep]
        items = [item for item, k in zip(items, keep.tolist(), strict=True) if k]
    batch = TokenizedBatch(
        input_ids=ids,
        labels=labels,
        offsets=offsets,
        refs=tuple(item[1] for item in items),
        domains=tuple(item[2] for item in items),
        extra={"loss_tokens": loss},
    )
    paths = dict(Counter(item[3].label_path for item in items))
    return IngestChunk(batch, tuple(r for _, r in rejects), records, paths)


def _render_batches(
    files: Sequence[InputFile],
    bundle: TokenizerBundle,
    template: ChatTemplate | None,
    options: IngestOptions,
) -> Iterator[tuple[list[_Item], list[tuple[int, Reject]]]]:
    """Read, normalize and render ``batch_size`` records at a time (the pure-Python half)."""
    items: list[_Item] = []
    rejects: list[tuple[int, Reject]] = []
    seq = 0
    for f in files:
        for raw in read_records(f):
            seq += 1
            try:
                conv = normalize_record(raw, options.format, options.domain_field)
                rendered = render_example(conv, template, bundle, options.loss)
            except RecordError as err:
                if options.on_error == "fail":
                    raise
                domain = _domain_of(raw, options.domain_field)
                rejects.append((seq, Reject(raw.ref, domain, err.code, err.reason)))
            else:
                items.append((seq, conv.ref, conv.domain, rendered))
            if len(items) + len(rejects) >= options.batch_size:
                yield items, rejects
                items, rejects = [], []
    if items or rejects:
        yield items, rejects


def ingest(
    files: Sequence[InputFile],
    bundle: TokenizerBundle,
    template: ChatTemplate | None,
    options: IngestOptions,
    progress: bool = False,
) -> Iterator[IngestChunk]:
    """Stream ``files`` as tokenized, labelled chunks of ``options.batch_size`` records.

    Batch ``k`` is tokenized on a worker thread (``encode_batch`` releases the GIL) while
    batch ``k + 1`` is rendered and chunk ``k - 1`` is consumed, so the Python work hides
    behind tokenization where there are cores to spare.

    Raises:
        RecordError: the first bad record, when ``options.on_error == "fail"``.
        TemplateError: a chat record with no template, or a template escaping its sandbox.
        UsageError: an option ingest does not know.

    """
    check_options(options)
    bar = _Progress() if progress else None
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="packshard-tokenize")
    pending: Future[IngestChunk] | None = None
    batches = _render_batches(files, bundle, template, options)
    try:
        while True:
            try:
                batch = next(batches, None)
            except RecordError:
                if pending is not None:
                    pending.result()  # an earlier record's failure is reported first
                raise
            done = pending.result() if pending is not None else None
            pending = None
            if batch is not None:
                items, rejects = batch
                pending = pool.submit(_tokenize, bundle, items, rejects, options,
                                      len(items) + len(rejects))  # fmt: skip
            if done is not None:
                if bar is not None:
                    bar.advance(done)
                yield done
            if batch is None:
                break
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()


class _Progress:
    """A rich progress line on stderr: records, tokens and their rates."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("ingest"),
            TextColumn("{task.fields[records]:>12,} records ({task.fields[rate]:,.0f}/s)"),
            TextColumn("{task.fields[tokens]:>14,} tokens ({task.fields[trate]:,.0f}/s)"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self._task = self._progress.add_task("ingest", total=None, records=0, rate=0.0,
                                             tokens=0, trate=0.0)  # fmt: skip
        self._records = 0
        self._tokens = 0
        self._start = time.perf_counter()
        self._progress.start()

    def advance(self, chunk: IngestChunk) -> None:
        self._records += chunk.records
        self._tokens += int(chunk.batch.offsets[-1])
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        fields: dict[str, Any] = {"records": self._records, "tokens": self._tokens,
                                  "rate": self._records / elapsed,
                                  "trate": self._tokens / elapsed}  # fmt: skip
        self._progress.update(self._task, **fields)

    def close(self) -> None:
        self._progress.stop()
