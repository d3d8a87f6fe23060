r"""Turn rendered text into token ids and labels, in batches.

Labels (:func:`encode_rendered`) come from trained character spans.  A span maps to every
token whose character range overlaps it — the rule ``transformers`` uses for its assistant
mask — so a special token that swallowed the following newline (``rstrip``) still counts::

    text    <|assistant|>\nHi!<|end|>\n<|endoftext|>
    span                   [---------)  (content + end marker)
    tokens  [<|assistant|>\n][Hi][!][<|end|>\n][<|endoftext|>]
    labels        -100       Hi  !   <|end|>      -100

Where the tokens lie comes from one of two places:

* the ids alone, for byte-level BPE and SentencePiece-style tokenizers
  (:mod:`packshard.ingest.tokens.alignment`): ``encode_batch_fast``, without offsets; an
  example whose ids do not spell its text is encoded again with offsets;
* the offsets of ``encode_batch`` otherwise, only at the span edges
  (``Encoding.char_to_token``).

Both give the same labels.  Span edges become +1/-1 marks in a difference array whose running
sum is the label mask.  Token ids are int32 from end to end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import tokenizers

from packshard.arrays import count_trained, exclusive_cumsum, utf8_batch
from packshard.ingest.tokens.alignment import align, covered, span_tokens
from packshard.ingest.tokens.backends import encoder_for
from packshard.ingest.tokens.metaspace import FlatIds
from packshard.ingest.tokens.tokenizer import TokenizerBundle
from packshard.ingest.types import Rendered
from packshard.records import IGNORE_INDEX

_EDGE_SCAN = 64  # characters searched for a covered edge before falling back to all offsets


def _first_token(enc: tokenizers.Encoding, lo: int, hi: int) -> int | None:
    """Index of the first token overlapping characters [lo, hi), via ``char_to_token``."""
    for c in range(lo, min(hi, lo + _EDGE_SCAN)):
        t = enc.char_to_token(c)
        if t is not None:
            return int(t)
    return None if hi <= lo + _EDGE_SCAN else -1


def _last_token(enc: tokenizers.Encoding, lo: int, hi: int, n: int) -> int | None:
    """One past the last token overlapping characters [lo, hi)."""
    for c in range(hi - 1, max(lo, hi - _EDGE_SCAN) - 1, -1):
        t = enc.char_to_token(c)
        if t is not None:
            # Byte-fallback pieces of one character share its offsets: take them all.
            while t + 1 < n:
                chars = enc.token_to_chars(t + 1)
                if chars is None or chars[0] >= hi or chars[1] <= chars[0]:
                    break
                t += 1
            return int(t) + 1
    return None if hi - lo <= _EDGE_SCAN else -1


def _span_tokens(enc: tokenizers.Encoding, lo: int, hi: int, n: int) -> tuple[int, int]:
    """Token range [t0, t1) overlapping characters [lo, hi); empty when none does."""
    t0 = _first_token(enc, lo, hi)
    t1 = _last_token(enc, lo, hi, n) if t0 is not None else None
    if t0 is None or t1 is None:
        return 0, 0
    if t0 < 0 or t1 < 0:  # long uncovered edge (a normalizer removed text): use all offsets
        offs = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
        hit = np.flatnonzero((offs[:, 1] > lo) & (offs[:, 0] < hi) & (offs[:, 1] > offs[:, 0]))
        return (int(hit[0]), int(hit[-1]) + 1) if hit.size else (0, 0)
    return t0, t1


def encode_rendered(
    bundle: TokenizerBundle, rendered: Sequence[Rendered]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokenize rendered examples in one ``encode_batch`` call and label their trained spans.

    Returns flat ``(input_ids int32, labels int32, offsets int64)``.  A token is trained when
    it overlaps one of ``spans`` (every token under ``label_path`` ``"none"``).
    """
    return label_encodings(bundle, rendered, encode_texts(bundle, rendered))


def offsets_needed(bundle: TokenizerBundle, rendered: Sequence[Rendered]) -> bool:
    """Tell whether labelling ``rendered`` needs the tokenizer's character offsets.

    Not when every example trains on all its tokens, nor when the tokenizer has a
    :class:`~packshard.ingest.tokens.aligner.ByteAligner` (token positions then come from
    the ids).
    """
    return bundle.aligner is None and any(r.label_path != "none" for r in rendered)


def encode_texts(
    bundle: TokenizerBundle,
    rendered: Sequence[Rendered],
    backend: str = "reference",
    small_job: bool = False,
) -> Sequence[Any]:
    """Run one ``encode_batch`` over rendered examples (the text after any ``bos_chars``).

    The half of :func:`encode_rendered` that runs without the GIL (:func:`label_encodings` is
    the other).  It skips the offsets unless :func:`offsets_needed`; then ``backend`` chooses
    the library (:mod:`packshard.ingest.tokens.backends`).
    """
    texts = [r.text[r.bos_chars :] for r in rendered]
    if offsets_needed(bundle, rendered):
        return bundle.tokenizer.encode_batch(texts, add_special_tokens=False)
    if backend != "reference":
        return encoder_for(bundle, backend, small_job).encode_batch(texts)
    return bundle.tokenizer.encode_batch_fast(texts, add_special_tokens=False)


def label_encodings(
    bundle: TokenizerBundle, rendered: Sequence[Rendered], encs: Sequence[Any]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flatten the encodings of ``rendered`` into ``(input_ids, labels, offsets)``.

    See :func:`encode_rendered`; ``encs`` comes from :func:`encode_texts` on the same list.
    """
    labelled = label_batch(bundle, rendered, encs)
    return labelled.input_ids, labelled.labels, labelled.offsets


@dataclass(frozen=True, slots=True)
class Labelled:
    """A labelled batch and, per example, the tokens of its reasoning blocks.

    ``reasoning`` (``None`` when no example has a reasoning block) holds the tokens inside
    reasoning blocks and the trained ones among them, each example's first token left out
    (as :func:`~packshard.arrays.count_trained` counts).
    """

    input_ids: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray
    reasoning: tuple[np.ndarray, np.ndarray] | None = None

    @staticmethod
    def join(parts: Sequence[Labelled]) -> Labelled:
        """Concatenate labelled batches in order (examples are labelled independently)."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            empty = np.zeros(0, dtype=np.int32)
            return Labelled(empty, empty.copy(), np.zeros(1, dtype=np.int64))
        lengths = np.concatenate([np.diff(p.offsets) for p in parts])
        reasoning = None
        if any(p.reasoning is not None for p in parts):
            counts = [
                p.reasoning or (np.zeros(len(p.offsets) - 1, dtype=np.int64),) * 2 for p in parts
            ]
            tokens, loss = zip(*counts, strict=True)
            reasoning = np.concatenate(tokens), np.concatenate(loss)
        return Labelled(
            np.concatenate([p.input_ids for p in parts]),
            np.concatenate([p.labels for p in parts]),
            exclusive_cumsum(lengths),
            reasoning,
        )


def encode_and_label(
    bundle: TokenizerBundle,
    rendered: Sequence[Rendered],
    backend: str = "reference",
    small_job: bool = False,
) -> Labelled:
    """Encode and label ``rendered``: the tokenize thread's task in :mod:`packshard.ingest.stream`.

    Both halves run off the ingest's main thread: the encoders and the alignment kernels
    release the GIL, so they overlap the next records' rendering.
    """
    return label_batch(bundle, rendered, encode_texts(bundle, rendered, backend, small_job))


def label_batch(
    bundle: TokenizerBundle, rendered: Sequence[Rendered], encs: Sequence[Any]
) -> Labelled:
    """Label the encodings of ``rendered`` and count the tokens of their reasoning blocks."""
    n = len(rendered)
    if n == 0:
        return Labelled.join(())
    cuts = np.fromiter((r.bos_chars for r in rendered), dtype=np.int64, count=n)
    lead = cuts > 0  # a BOS id goes first
    if isinstance(encs, FlatIds):  # the fast encoder's ids, already flat
        encoded, raw_ids = encs.lengths, encs.ids
    else:
        encoded = np.fromiter(map(len, encs), dtype=np.int64, count=n)
        flat = chain.from_iterable(e.ids for e in encs)
        raw_ids = np.fromiter(flat, dtype=np.int32, count=int(encoded.sum()))
    lengths = encoded + lead
    offsets = exclusive_cumsum(lengths)
    total = int(offsets[-1])
    ids = raw_ids
    if lead.any():
        ids = np.full(total, bundle.bos_token_id, dtype=np.int32)
        body = np.ones(total, dtype=bool)
        body[offsets[:-1][lead]] = False
        ids[body] = raw_ids

    # every example's spans in one table (example, lo, hi), characters of the encoded text
    every = np.fromiter((r.label_path == "none" for r in rendered), dtype=bool, count=n)
    trained_spans = [() if e else r.spans for r, e in zip(rendered, every.tolist(), strict=True)]
    table, bos = _span_table(trained_spans, cuts)
    blocks = 0  # reasoning spans, listed after the trained ones
    if any(r.reasoning for r in rendered):
        reasoning, _ = _span_table([r.reasoning for r in rendered], cuts, clip=False)
        blocks = len(reasoning)
        table = np.concatenate([table, reasoning])
    starts = [offsets[:-1][every], offsets[:-1][bos]]  # whole examples; BOS ids in a span
    ends = [offsets[1:][every], offsets[:-1][bos] + 1]
    block_starts = block_ends = np.zeros(0, dtype=np.int64)
    if len(table):
        if offsets_needed(bundle, rendered):
            t0, t1 = _offset_spans(encs, encoded, table)
        else:
            t0, t1 = _byte_spans(bundle, rendered, raw_ids, encoded, table)
        base = offsets[table[:, 0]] + lead[table[:, 0]]
        first, stop = base + t0, base + t1
        hit = t1 > t0
        hit[len(table) - blocks :] = False
        starts.append(first[hit])
        ends.append(stop[hit])
        block_starts, block_ends = first[len(table) - blocks :], stop[len(table) - blocks :]
    trained = covered(total, np.concatenate(starts), np.concatenate(ends))
    labels = np.where(trained, ids, np.int32(IGNORE_INDEX)).astype(np.int32, copy=False)
    if not blocks:
        return Labelled(ids, labels, offsets)
    inside = covered(total, block_starts, block_ends)
    tokens = count_trained(np.where(inside, 0, IGNORE_INDEX), offsets)
    loss = count_trained(np.where(inside & trained, 0, IGNORE_INDEX), offsets)
    return Labelled(ids, labels, offsets, (tokens, loss))


def _span_table(
    spans: Sequence[Sequence[tuple[int, int]]], cuts: np.ndarray, clip: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Flatten each example's character spans into rows ``(example, lo, hi)``.

    Spans move left by the example's ``cuts`` (its BOS characters, not encoded).  With
    ``clip``, a span reaching into the BOS starts at 0 and the examples whose BOS it covers
    are flagged (their BOS id is trained); empty spans are left out.
    """
    n = len(spans)
    counts = np.fromiter(map(len, spans), dtype=np.int64, count=n)
    flat = chain.from_iterable(chain.from_iterable(spans))
    edges = np.fromiter(flat, dtype=np.int64, count=2 * int(counts.sum())).reshape(-1, 2)
    example = np.repeat(np.arange(n, dtype=np.int64), counts)
    cut = cuts[example]
    lo, hi = edges[:, 0] - cut, edges[:, 1] - cut
    bos = np.zeros(n, dtype=bool)
    if clip:
        bos[example[(lo < 0) & (hi + cut > 0)]] = True
        lo = np.maximum(lo, 0)
        keep = hi > lo
        example, lo, hi = example[keep], lo[keep], hi[keep]
    return np.stack([example, lo, hi], axis=1), bos


def _offset_spans(
    encs: Sequence[tokenizers.Encoding], encoded: np.ndarray, table: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Token ranges of character spans from the encodings' offsets (``char_to_token``)."""
    t0 = np.zeros(len(table), dtype=np.int64)
    t1 = np.zeros(len(table), dtype=np.int64)
    for s, (i, lo, hi) in enumerate(table.tolist()):
        t0[s], t1[s] = _span_tokens(encs[i], lo, hi, int(encoded[i]))
    return t0, t1


def _byte_spans(
    bundle: TokenizerBundle,
    rendered: Sequence[Rendered],
    raw_ids: np.ndarray,
    encoded: np.ndarray,
    table: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Token ranges of character spans from the ids (see :mod:`packshard.ingest.tokens.alignment`).

    Examples whose ids do not spell their text are encoded again, with offsets.
    """
    assert bundle.aligner is not None
    texts = [r.text[r.bos_chars :] for r in rendered]
    text, text_offsets = utf8_batch(texts)
    token_offsets = exclusive_cumsum(encoded)
    start, end, ok = align(bundle.aligner, text, text_offsets, raw_ids, token_offsets)
    columns = table.T.copy()  # example, lo, hi: each contiguous
    t0, t1 = span_tokens(text, text_offsets, start, end, token_offsets, *columns)
    failed = ~ok[table[:, 0]]
    if failed.any():
        redo = np.unique(table[failed, 0])
        again = bundle.tokenizer.encode_batch(
            [texts[i] for i in redo.tolist()], add_special_tokens=False
        )
        where = {i: j for j, i in enumerate(redo.tolist())}
        sub = table[failed].copy()
        sub[:, 0] = [where[i] for i in sub[:, 0].tolist()]
        t0[failed], t1[failed] = _offset_spans(again, encoded[redo], sub)
    return t0, t1
