"""The ingest stream: files in, tokenized examples and rejects out, in input order.

Every command that needs tokens (``profile``, ``pack``) reads them from :func:`ingest`::

    read_records ─► normalize_record ─► render_example ──┐  pure Python, one record at a time
         │                 │                  │          │
         └── RecordError ──┴──────────────────┘          ▼
               (reject, or raise with on_error=fail)   chunk of ``batch_size`` records
                                                          │
                          encode_and_label ◄──────────────┘  tokenize thread: the encoder and
                                 │                            the alignment kernels, no GIL
                          no_trainable_tokens check, rejects (vectorised, main thread)
                                 │
                                 └─► IngestChunk(batch, rejects)

A chunk covers ``batch_size`` consecutive input records (the last one fewer), so
``chunk.records == len(chunk.batch) + len(chunk.rejects)`` and summing ``records`` over the
stream counts every record read.  Examples keep input order; so do rejects.

Encoding and labelling (:func:`~packshard.ingest.tokens.labels.encode_and_label`) release
the GIL, so they run on a second thread while the main thread reads and renders the next
records, which bounds a pack's wall time.  Where a worker has one core, ``threads`` is 1
(:func:`~packshard.engine.worker_cores`) and chunks are encoded in place.  With a second
thread the first chunk is encoded in pieces of ``FIRST_PIECE`` records, so both cores start
at once (``docs/performance.md``, "The ingest stream")::

    tokenize thread       [0a][0b]..[0h][encode+label 1     ][encode+label 2     ]..
    main thread      [r0a][r0b][r0c]..[r0h][render 1][check 0, yield][render 2][check 1]..

Templates render within ``max_record_bytes`` characters and ``template_timeout`` seconds; a
template that runs out of time or steps on each of the first :data:`RUNAWAY_RECORDS` records,
none rendered, stops the run at once (it would on every record).

An example whose every label after the first is ``IGNORE_INDEX`` trains nothing once packed:
a ``no_trainable_tokens`` reject.  ``chunk.loss_tokens`` counts those labels per example.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from packshard.arrays import count_trained, exclusive_cumsum
from packshard.errors import RecordError, TemplateError
from packshard.ingest.label.spans import expanded_reason, render_examples
from packshard.ingest.normalize import normalize_record
from packshard.ingest.pairs import is_preference
from packshard.ingest.progress import open_progress
from packshard.ingest.read.jsonparse import is_encodable
from packshard.ingest.read.sources import read_records
from packshard.ingest.template.budget import TemplateRunawayError
from packshard.ingest.template.fast import with_renderer
from packshard.ingest.template.render import ChatTemplate
from packshard.ingest.tokens.labels import Labelled, encode_and_label
from packshard.ingest.tokens.tokenizer import TokenizerBundle
from packshard.ingest.types import IngestChunk, IngestOptions, RawRecord, Rendered, TokenizedBatch
from packshard.records import Reject, SourceRef

IN_FLIGHT = 2  # chunks rendered but not yet labelled: one encoding, one queued
FIRST_PIECE = 128  # records per encode_batch call in the first chunk


def ingest_label_path(template: ChatTemplate | None, loss: str) -> str:
    """Return the label path chat records take under ``template`` and ``loss``."""
    if loss == "all" or template is None:
        return "none"
    return template.label_spans


def _domain_of(raw: RawRecord, domain_field: str) -> str:
    value = raw.value
    if type(value) is dict:
        domain = value.get(domain_field)
        if type(domain) is str and domain and is_encodable(domain):
            return domain
    return raw.domain


class _Item(NamedTuple):
    """One rendered example waiting to be encoded, with its record's place."""

    seq: int  # the record's position in the input (records read before it, plus one)
    ref: SourceRef
    domain: str
    format: str
    rendered: Rendered


def _label_batch(
    options: IngestOptions,
    items: list[_Item],
    rejects: list[tuple[int, Reject]],
    encoding: list[Future[Labelled]],
    pairs_read: int,
) -> IngestChunk:
    records = len({item.seq for item in items}) + len(rejects)
    done = Labelled.join([part.result() for part in encoding])
    ids, labels, offsets, reasoning = done.input_ids, done.labels, done.offsets, done.reasoning
    loss = count_trained(labels, offsets)
    empty = np.flatnonzero(loss == 0)
    dropped = _over_expanded(items, np.diff(offsets), options)
    if any(item.rendered.pair for item in items):  # preference records: both branches the same?
        dropped.update(identical_pairs(items, ids, offsets, options.on_error))
    if empty.size or dropped:  # a record with an example that trains nothing is rejected whole
        for i in empty.tolist():
            seq, ref, domain, _, rendered = items[i]
            turn = f"message {rendered.turn}: " if rendered.turn else ""
            reason = (
                f"{turn}no token to train on after the first (loss policy {options.loss}: the "
                "trained turns are empty or the template drops them)"
            )
            if options.on_error == "fail":
                raise RecordError("no_trainable_tokens", reason, ref.source, ref.line)
            dropped.setdefault(seq, Reject(ref, domain, "no_trainable_tokens", reason))
        rejects = sorted(rejects + list(dropped.items()), key=lambda pair: pair[0])
        keep = np.fromiter(
            (item.seq not in dropped for item in items), dtype=bool, count=len(items)
        )
        lengths = np.diff(offsets)
        token_keep = np.repeat(keep, lengths)
        ids, labels = ids[token_keep], labels[token_keep]
        offsets = exclusive_cumsum(lengths[keep])
        loss = loss[keep]
        if reasoning is not None:
            reasoning = (reasoning[0][keep], reasoning[1][keep])
        items = [item for item, k in zip(items, keep.tolist(), strict=True) if k]
    shown = [item.rendered for item in items]
    turns = [r.turn for r in shown]
    pairs = [r.pair for r in shown]
    images = [r.images for r in shown]
    vision = [r.vision_tokens for r in shown]
    sizes = [size for r in shown for size in r.image_sizes]
    batch = TokenizedBatch(
        input_ids=ids,
        labels=labels,
        offsets=offsets,
        refs=tuple(item.ref for item in items),
        domains=tuple(item.domain for item in items),
        formats=tuple(item.format for item in items),
        turns=np.asarray(turns, dtype=np.int32) if any(turns) else None,
        pairs=np.asarray(pairs, dtype=np.int8) if any(pairs) else None,
        images=np.asarray(images, dtype=np.int32) if any(images) else None,
        vision_tokens=np.asarray(vision, dtype=np.int32) if any(images) else None,
        image_sizes=np.asarray(sizes, dtype=np.int64).reshape(-1, 3) if any(images) else None,
    )
    tokens, trained = reasoning if reasoning is not None else (None, None)
    return IngestChunk(
        batch=batch,
        rejects=tuple(r for _, r in rejects),
        records=records,
        loss_tokens=loss,
        label_paths=dict(Counter(r.label_path for r in shown)),
        reasoning_tokens=tokens,
        reasoning_loss=trained,
        reasoning_dropped=sum(r.reasoning_dropped for r in shown),
        pairs_read=pairs_read,
    )


def identical_pairs(
    items: list[_Item], ids: np.ndarray, offsets: np.ndarray, on_error: str
) -> dict[int, Reject]:
    """Reject the preference pairs whose two branches are the same token ids."""
    out = {}
    for i, item in enumerate(items):
        if item.rendered.pair != 1:
            continue  # a chosen branch is always followed by its rejected one
        a = ids[offsets[i] : offsets[i + 1]]
        b = ids[offsets[i + 1] : offsets[i + 2]]
        if np.array_equal(a, b):
            seq, ref, domain = item.seq, item.ref, item.domain
            reason = f"chosen and rejected render the same {a.size} tokens (nothing to prefer)"
            if on_error == "fail":
                raise RecordError("identical_pair", reason, ref.source, ref.line)
            out[seq] = Reject(ref, domain, "identical_pair", reason)
    return out


def _over_expanded(
    items: list[_Item], lengths: np.ndarray, options: IngestOptions
) -> dict[int, Reject]:
    """Reject the records whose ``--turns expand`` examples exceed ``max_expanded_tokens``."""
    if options.turns != "expand" or not items:
        return {}
    seqs = np.fromiter((item.seq for item in items), np.int64, count=len(items))
    _, first, inverse, examples = np.unique(
        seqs, return_index=True, return_inverse=True, return_counts=True
    )
    totals = np.bincount(inverse, weights=lengths)
    dropped = {}
    for k in np.flatnonzero(totals > options.max_expanded_tokens).tolist():
        seq, ref, domain, _, _ = items[int(first[k])]
        reason = expanded_reason(options.max_expanded_tokens, int(examples[k]))
        if options.on_error == "fail":
            raise RecordError("too_large", reason, ref.source, ref.line)
        dropped[seq] = Reject(ref, domain, "too_large", reason)
    return dropped


class _InPlace:
    """Run each submitted call at once, on this thread: a process with one core to use."""

    def submit(self, fn: Callable[..., Labelled], /, *args: Any) -> Future[Labelled]:
        future: Future[Labelled] = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # raised where the result is read, as from a thread
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        return None


class _Failed(Exception):
    """A record failed with ``on_error=fail``; ``items`` were rendered before it, unencoded."""

    def __init__(self, error: RecordError, items: list[_Item]) -> None:
        super().__init__(str(error))
        self.error = error
        self.items = items


class _Piece(NamedTuple):
    """Rendered records handed to the tokenizer: a piece of a chunk, or its end."""

    items: list[_Item]
    rejects: list[tuple[int, Reject]]  # (record position, reject), in input order
    closes: bool  # the piece ends a chunk of ``batch_size`` records
    pairs: int  # preference records read (packed or rejected)


def _render_pieces(
    files: Sequence[Any],
    bundle: TokenizerBundle,
    template: ChatTemplate | None,
    options: IngestOptions,
    read: Callable[..., Iterable[RawRecord]],
    first_piece: int,
) -> Iterator[_Piece]:
    """Read, normalize and render records (the pure-Python half), a piece at a time.

    A piece that ``closes`` ends a chunk of ``batch_size`` records.  The first chunk
    comes in pieces of ``first_piece`` records, so the tokenizer starts after a few
    milliseconds of rendering instead of a whole chunk's worth.
    """
    items: list[_Item] = []
    rejects: list[tuple[int, Reject]] = []
    seq = count = pairs = 0  # records read, records in the open chunk, preference records
    runaways: int | None = 0  # records the template ran away on, while none has rendered
    piece = min(first_piece, options.batch_size)
    if template is not None:
        template = template.bounded(options.max_record_bytes, options.template_timeout)
        template = with_renderer(template, bundle.special_tokens_map, options.backend)
    for f in files:
        for raw in read(f, options=options):
            seq += 1
            count += 1
            pairs += options.format == "preference" or (  # forced, or detected by its keys
                options.format == "auto" and type(raw.value) is dict and is_preference(raw.value)
            )
            try:
                conv = normalize_record(
                    raw, options.format, options.domain_field, options.media_root
                )
                examples = render_examples(conv, template, bundle, options)
            except RecordError as err:
                if options.on_error == "fail":
                    raise _Failed(err, items) from err
                domain = _domain_of(raw, options.domain_field)
                rejects.append((seq, Reject(raw.ref, domain, err.code, err.reason)))
                if runaways is not None and isinstance(err.__cause__, TemplateRunawayError):
                    runaways += 1
                    if runaways >= RUNAWAY_RECORDS:
                        raise _runaway(template, options) from None
            else:
                items += [_Item(seq, conv.ref, conv.domain, conv.format, r) for r in examples]
                runaways = None  # a record rendered: the template does finish
            if count >= options.batch_size:
                yield _Piece(items, rejects, True, pairs)
                items, rejects, count, piece, pairs = [], [], 0, options.batch_size, 0
            elif len(items) + len(rejects) >= piece:
                yield _Piece(items, rejects, False, pairs)
                items, rejects, pairs = [], [], 0
    if count:
        yield _Piece(items, rejects, True, pairs)


RUNAWAY_RECORDS = 3
"""Records in a row the template runs out of time or steps on, none rendered before them,
after which the run stops: a template that loops on every record would otherwise spend
``--template-timeout`` on each (57 s for 40 records at the default), then pack nothing."""


def _runaway(template: ChatTemplate | None, options: IngestOptions) -> TemplateError:
    source = template.source if template is not None else "the template"
    return TemplateError(
        f"{source}: the template ran out of its budget ({options.template_timeout:g} s, or "
        f"its loop steps) on each of the first {RUNAWAY_RECORDS} records and rendered none: "
        "it loops whatever the record (fix it, or use --template-timeout to allow more)"
    )


def ingest(
    files: Sequence[Any],
    bundle: TokenizerBundle,
    template: ChatTemplate | None,
    options: IngestOptions,
    progress: bool | str | None = False,
    read: Callable[..., Iterable[RawRecord]] = read_records,
    threads: int = 2,
) -> Iterator[IngestChunk]:
    """Stream ``files`` as tokenized, labelled chunks of ``options.batch_size`` records.

    ``read`` turns each item of ``files`` into its records: :func:`read_records` for input
    files, :func:`packshard.ingest.read.units.read_range` for a work unit.

    Chunk ``k`` is tokenized on a worker thread while chunk ``k + 1`` is rendered and chunk
    ``k - 1`` labelled here (at most ``IN_FLIGHT`` ahead); with ``threads=1`` on this thread.

    Raises:
        RecordError: the first bad record, when ``options.on_error == "fail"``.
        TemplateError: a chat record with no template, or a template escaping its sandbox.
        UsageError: an option ingest does not know.

    """
    options.check()
    bar = open_progress(progress)
    pool: ThreadPoolExecutor | _InPlace = _InPlace()
    if threads > 1:
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="packshard-tokenize")
    pending: deque[tuple[list[_Item], list[tuple[int, Reject]], list[Future[Labelled]], int]]
    pending = deque()
    pairs = 0
    items: list[_Item] = []
    rejects: list[tuple[int, Reject]] = []
    encoding: list[Future[Labelled]] = []
    # on one thread nothing starts earlier: the first chunk is encoded whole, in one call
    first = FIRST_PIECE if threads > 1 else options.batch_size
    pieces = _render_pieces(files, bundle, template, options, read, first)
    try:
        while True:
            try:
                piece = next(pieces, None)
            except _Failed as failed:
                # A record read before the failing one may have no token to train on: that
                # failure comes first.  (With on_error=fail there are no rejects to keep.)
                last = [item.rendered for item in failed.items]
                encoding.append(
                    pool.submit(encode_and_label, bundle, last, options.backend, options.small_job)
                )
                for earlier in (*pending, (items + failed.items, rejects, encoding, 0)):
                    _label_batch(options, *earlier)
                raise failed.error from failed.error.__cause__
            if piece is not None:
                items += piece.items
                rejects += piece.rejects
                pairs += piece.pairs
                if piece.items:
                    rendered = [item.rendered for item in piece.items]
                    encoding.append(
                        pool.submit(
                            encode_and_label, bundle, rendered, options.backend, options.small_job
                        )
                    )
                if not piece.closes:
                    continue
                pending.append((items, rejects, encoding, pairs))
                items, rejects, encoding, pairs = [], [], [], 0
            while pending and (
                piece is None or len(pending) > IN_FLIGHT or all(f.done() for f in pending[0][2])
            ):
                chunk = _label_batch(options, *pending.popleft())
                if bar is not None:
                    bar.add(chunk.records, int(chunk.batch.offsets[-1]))
                yield chunk
            if piece is None:
                break
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()
