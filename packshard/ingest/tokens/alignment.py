r"""Where each token lies in its text, from the token ids alone (no tokenizer offsets).

Labels need to know which tokens overlap the trained character spans.  Offsets are a large
share of tokenization time; for the two tokenizer families nearly every chat model uses, each
token id stands for a fixed byte string of the text, so every token's bytes follow from the
ids:

* byte-level BPE (GPT-2, Llama 3, Qwen, Phi-2 …): a piece is the bytes its characters encode
  through the byte-to-unicode table;
* SentencePiece-style pieces (Llama 2, Mistral, Phi-3, Gemma …): ``▁`` stands for a space,
  ``<0xNN>`` (byte fallback) for the byte ``NN``, anything else for its UTF-8 bytes.

Added tokens stand for their content, plus the whitespace that ``lstrip``/``rstrip`` swallow
on either side, and end a section of the text.  The tokenizer may put a ``▁`` in front of a
section (``Metaspace`` with ``prepend_scheme`` ``always`` or ``first`` when the section does
not start with a space, ``first`` only at the start of the text; a ``Prepend("▁")``
normalizer in front of every section): that ``▁`` stands for no byte, and the token holding
it is aligned with the section's first character, as the tokenizer aligns it::

    text    <|assistant|>\n Hi 😀<|end|>
    ids     [<|assistant|>][▁Hi][▁][<0xF0>][<0x9F>][<0x98>][<0x80>][<|end|>]
    bytes   <|assistant|>\n   ␠Hi  ␠  F0      9F      98      80    <|end|>
            (content + the "\n" its rstrip swallows)

:func:`align` compares every byte it assigns with the text; an example whose tokens do not
spell it exactly comes back not ``ok`` and is encoded again with offsets, so labels can be
faster but never different.  A tokenizer outside the two families gets no
:class:`~packshard.ingest.tokens.aligner.ByteAligner`.

:func:`span_tokens` turns character spans into token ranges with the rule the offsets path
uses: a token belongs to a span when its bytes overlap the span's.

It is what lets the fast encoder, which gives no offsets, label at all
(``docs/performance.md``, "Token positions from the ids").
"""

from __future__ import annotations

import numpy as np
from numba import njit

from packshard.ingest.tokens.aligner import (
    ADDED,
    LSTRIP,
    NO_PREPEND,
    PREPEND_ALWAYS,
    PREPEND_UNLESS_SPACE,
    RSTRIP,
    UNKNOWN,
    ByteAligner,
)


def align(
    aligner: ByteAligner,
    text: np.ndarray,
    text_offsets: np.ndarray,
    ids: np.ndarray,
    token_offsets: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Byte range of every token within its example's text, and which examples parsed.

    Example ``e``'s ids and text are the offsets' slices.  Returns ``(start, end, ok)``: int64
    byte positions within each text, and per example whether its ids spell it exactly.
    """
    start = np.zeros(len(ids), dtype=np.int64)
    end = np.zeros(len(ids), dtype=np.int64)
    ok = np.zeros(len(text_offsets) - 1, dtype=np.bool_)
    _parse(
        text,
        text_offsets,
        ids,
        token_offsets,
        aligner.kind,
        aligner.strip,
        aligner.data,
        aligner.start,
        aligner.length,
        aligner.prepend,
        start,
        end,
        ok,
    )
    return start, end, ok


def span_tokens(
    text: np.ndarray,
    text_offsets: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    token_offsets: np.ndarray,
    span_example: np.ndarray,
    span_lo: np.ndarray,
    span_hi: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Token range ``[t0, t1)`` (within its example) overlapping each character span.

    Spans are ``[span_lo, span_hi)`` in characters of example ``span_example``'s text; an
    empty result is ``(0, 0)``.  A token that stands for no byte (a section's lone ``▁``)
    counts as covering the byte where it sits.
    """
    t0 = np.zeros(len(span_example), dtype=np.int64)
    t1 = np.zeros(len(span_example), dtype=np.int64)
    _spans(text, text_offsets, start, end, token_offsets, span_example, span_lo, span_hi, t0, t1)
    return t0, t1


@njit(cache=True, nogil=True)
def covered(total: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:  # pragma: no cover
    """Mark every token inside one of the ranges ``[starts[k], ends[k])`` of ``total`` tokens.

    One pass over the ranges: 0.1 µs an example against 1.1 for a difference array built with
    ``np.add.at`` and summed (phi-3, the shared chat data, 1,024 examples a call).
    """
    mask = np.zeros(total, dtype=np.bool_)
    for k in range(len(starts)):
        mask[starts[k] : ends[k]] = True
    return mask


@njit(cache=True, nogil=True)
def _whitespace(text: np.ndarray, i: int, stop: int) -> int:  # pragma: no cover - jitted
    """Byte length of the Unicode whitespace character at ``text[i]`` (0 if it is not one)."""
    b = text[i]
    if b == 0x20 or 0x09 <= b <= 0x0D:
        return 1
    if b == 0xC2 and i + 1 < stop and (text[i + 1] == 0x85 or text[i + 1] == 0xA0):
        return 2
    if i + 2 >= stop:
        return 0
    c, d = text[i + 1], text[i + 2]
    if b == 0xE1 and c == 0x9A and d == 0x80:
        return 3
    if b == 0xE2 and c == 0x80 and (0x80 <= d <= 0x8A or d == 0xA8 or d == 0xA9 or d == 0xAF):
        return 3
    if b == 0xE2 and c == 0x81 and d == 0x9F:
        return 3
    if b == 0xE3 and c == 0x80 and d == 0x80:
        return 3
    return 0


@njit(cache=True, nogil=True)
def _skip_whitespace(text: np.ndarray, pos: int, stop: int) -> int:  # pragma: no cover
    while pos < stop:
        w = _whitespace(text, pos, stop)
        if w == 0:
            break
        pos += w
    return pos


@njit(cache=True, nogil=True)
def _parse(  # pragma: no cover - jitted
    text: np.ndarray,
    text_offsets: np.ndarray,
    ids: np.ndarray,
    token_offsets: np.ndarray,
    kind: np.ndarray,
    strip: np.ndarray,
    data: np.ndarray,
    piece_start: np.ndarray,
    piece_length: np.ndarray,
    prepend: int,
    start: np.ndarray,
    end: np.ndarray,
    ok: np.ndarray,
) -> None:
    vocab = len(kind)
    for e in range(len(text_offsets) - 1):
        first, stop = text_offsets[e], text_offsets[e + 1]
        pos = first
        section = True
        good = True
        for k in range(token_offsets[e], token_offsets[e + 1]):
            tid = ids[k]
            if tid < 0 or tid >= vocab or kind[tid] == UNKNOWN:
                good = False
                break
            a = piece_start[tid]
            b = a + piece_length[tid]
            begin = pos
            skip = 0
            if kind[tid] == ADDED:
                if strip[tid] & LSTRIP:
                    pos = _skip_whitespace(text, pos, stop)
            elif section and prepend != NO_PREPEND and b > a and data[a] == 0x20:
                if prepend == PREPEND_ALWAYS:
                    skip = 1
                elif pos >= stop or text[pos] != 0x20:
                    if prepend == PREPEND_UNLESS_SPACE or pos == first:
                        skip = 1
            n = b - a - skip
            if pos + n > stop:
                good = False
                break
            for j in range(n):
                if text[pos + j] != data[a + skip + j]:
                    good = False
                    break
            if not good:
                break
            pos += n
            section = kind[tid] == ADDED  # an added token ends a section of the text
            if section and strip[tid] & RSTRIP:
                pos = _skip_whitespace(text, pos, stop)
            start[k] = begin - first
            end[k] = pos - first
        ok[e] = good and pos == stop


@njit(cache=True, nogil=True)
def _advance(text: np.ndarray, i: int, stop: int, seen: int, chars: int) -> int:  # pragma: no cover
    """Byte where character ``chars`` starts, walking on from byte ``i`` (character ``seen``)."""
    while i < stop and seen < chars:
        i += 1
        while i < stop and text[i] & 0xC0 == 0x80:
            i += 1
        seen += 1
    return i


@njit(cache=True, nogil=True)
def _spans(  # pragma: no cover - jitted
    text: np.ndarray,
    text_offsets: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    token_offsets: np.ndarray,
    span_example: np.ndarray,
    span_lo: np.ndarray,
    span_hi: np.ndarray,
    t0: np.ndarray,
    t1: np.ndarray,
) -> None:
    # A cursor (character, byte, first token past it) carries over from one span to the next
    # of the same example, so spans in text order cost one walk of the text, not one each.
    # An ASCII text (most of them) has a byte for each character: no walk at all.
    at_e, at_char, at_byte, at_token = -1, 0, 0, 0
    ascii = False
    for s in range(len(span_example)):
        e = span_example[s]
        first, stop = text_offsets[e], text_offsets[e + 1]
        if e != at_e:
            ascii = True
            for i in range(first, stop):
                if text[i] >= 0x80:
                    ascii = False
                    break
        if e != at_e or span_lo[s] < at_char:
            at_e, at_char, at_byte, at_token = e, 0, first, token_offsets[e]
        if ascii:
            lo = min(first + max(span_lo[s], 0), stop)
        else:
            lo = _advance(text, at_byte, stop, at_char, span_lo[s])
        at_char, at_byte = span_lo[s], lo
        if span_hi[s] <= span_lo[s]:
            continue
        if ascii:
            hi = min(first + span_hi[s], stop)
        else:
            hi = _advance(text, lo, stop, span_lo[s], span_hi[s])
        if hi <= lo:
            continue
        lo, hi = lo - first, hi - first
        k0, k1 = token_offsets[e], token_offsets[e + 1]
        a = at_token
        while a < k1 and max(end[a], start[a] + 1) <= lo:
            a += 1
        at_token = a
        b = a
        while b < k1 and start[b] < hi:
            b += 1
        if b > a:
            t0[s] = a - k0
            t1[s] = b - k0
