r"""Where each token lies in its text, from the token ids alone (no tokenizer offsets).

Labels need to know which tokens overlap the trained character spans.  ``encode_batch``
answers with offsets, but computing them costs about a quarter of tokenization time
(``encode_batch_fast`` skips them; measured 1.37 against 1.83 CPU-seconds on the shared chat
data with phi-3-mini).  For the two tokenizer families nearly every chat model uses, each
token id stands for a fixed byte string of the original text, so the byte range of every
token follows from the ids:

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

:func:`align` walks the ids of each example and compares every byte it assigns with the text.
An example whose tokens do not spell its text exactly (a normalizer rewrote it, an unknown
token, a rule not modelled here) comes back not ``ok``; the caller encodes it again with
offsets, so this path can make labels faster but never different.  A tokenizer outside the
two families (a normalizer other than NFC, WordPiece …), or whose post-processor trims spaces
off token offsets, gets no :class:`ByteAligner` at all.

:func:`span_tokens` turns character spans into token ranges with the rule the offsets path
uses: a token belongs to a span when its bytes overlap the span's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import tokenizers
from numba import njit

PIECE, ADDED, UNKNOWN = 0, 1, 2
LSTRIP, RSTRIP = 1, 2
NO_PREPEND, PREPEND_UNLESS_SPACE, PREPEND_AT_START, PREPEND_ALWAYS = 0, 1, 2, 3
_SPLITTERS = {"Split", "Digits", "Punctuation"}  # they cut the text, never change it


@dataclass(frozen=True)
class ByteAligner:
    """Per token id: what it stands for in the original text (bytes) and how it is matched."""

    family: str  # "byte_level" or "sentencepiece"
    kind: np.ndarray  # uint8 [V]: PIECE, ADDED or UNKNOWN (never spells text)
    strip: np.ndarray  # uint8 [V]: LSTRIP | RSTRIP for added tokens
    data: np.ndarray  # uint8: the bytes ids stand for
    start: np.ndarray  # int64 [V]: id i stands for data[start[i]:start[i] + length[i]]
    length: np.ndarray  # int64 [V]
    prepend: int  # NO_PREPEND … PREPEND_ALWAYS (see the module docstring)


def _state(component: Any) -> dict[str, Any] | None:
    return None if component is None else json.loads(component.__getstate__())


def _byte_decoder() -> dict[str, int]:
    """Return the inverse of GPT-2's byte-to-unicode table: printable stand-in -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _members(state: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """Return the steps of a normalizer or pre-tokenizer: a Sequence's members, or itself."""
    if state is None:
        return []
    return list(state.get(key, [])) if state.get("type") == "Sequence" else [state]


def _family(tok: tokenizers.Tokenizer) -> tuple[str, int] | None:
    """Return ``(family, prepend rule)`` when the pipeline is one this module models."""
    if type(tok.model).__name__ not in ("BPE", "Unigram"):
        return None
    if getattr(tok.model, "continuing_subword_prefix", None) or getattr(
        tok.model, "end_of_word_suffix", None
    ):
        return None  # pieces carry markers ("##", "</w>") the text does not
    post = _members(_state(tok.post_processor), "processors")
    if any(p.get("trim_offsets") for p in post):
        return None  # offsets trimmed of spaces: keep the tokenizer's own reading of a span edge
    steps = _members(_state(tok.normalizer), "normalizers")
    pres = _members(_state(tok.pre_tokenizer), "pretokenizers")
    kinds = [s.get("type") for s in steps]
    pre_kinds = [p.get("type") for p in pres]
    if pre_kinds.count("ByteLevel") == 1 and set(pre_kinds) <= _SPLITTERS | {"ByteLevel"}:
        byte_level = pres[pre_kinds.index("ByteLevel")]
        if byte_level.get("add_prefix_space") or kinds not in ([], ["NFC"]):
            return None
        return "byte_level", NO_PREPEND
    if pre_kinds == ["Metaspace"] and not steps and pres[0].get("replacement") == "▁":
        meta = pres[0]
        scheme = meta.get("prepend_scheme") or (
            "always" if meta.get("add_prefix_space") else "never"
        )
        rule = {"always": PREPEND_UNLESS_SPACE, "first": PREPEND_AT_START, "never": NO_PREPEND}
        return ("sentencepiece", rule[scheme]) if scheme in rule else None
    spaces = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    if (
        not pres
        and spaces in steps
        and all(s == spaces or s == {"type": "Prepend", "prepend": "▁"} for s in steps)
    ):
        return "sentencepiece", PREPEND_ALWAYS if "Prepend" in kinds else NO_PREPEND
    return None


def build_aligner(
    tok: tokenizers.Tokenizer, model: dict[str, Any] | None = None
) -> ByteAligner | None:
    """Build the byte table of ``tok``, or return ``None`` for a pipeline not modelled here.

    ``model`` is the ``model`` object of the tokenizer.json ``tok`` was loaded from, when the
    caller has it parsed already: its vocabulary is read from there (asking the tokenizer
    for it costs tens of milliseconds).

    Vectorised over the vocabulary (a 150k vocabulary takes milliseconds): the pieces are
    joined into one string and converted at once; added tokens and byte-fallback pieces are
    then pointed at bytes of their own.
    """
    found = _family(tok)
    if found is None:
        return None
    family, prepend = found
    vocab = _vocabulary(tok, model)
    added = tok.get_added_tokens_decoder()
    for i, token in added.items():
        vocab.setdefault(token.content, i)
    size = max(vocab.values(), default=-1) + 1
    pieces = [""] * size
    for text, i in vocab.items():
        pieces[i] = text
    joined = "".join(pieces)
    char_offsets = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, pieces), dtype=np.int64, count=size), out=char_offsets[1:])
    kind = np.full(size, PIECE, dtype=np.uint8)
    kind[np.diff(char_offsets) == 0] = UNKNOWN  # ids missing from the vocabulary
    if family == "byte_level":
        decoder = _byte_decoder()
        outside = re.compile("[^" + re.escape("".join(decoder)) + "]")
        bad = [m.start() for m in outside.finditer(joined)]  # no byte stands for them
        kind[np.searchsorted(char_offsets, bad, side="right") - 1] = UNKNOWN
        table = {ord(c): b for c, b in decoder.items()}
        data = joined.translate(table).encode("latin-1", errors="replace")
        start, length = char_offsets[:-1].copy(), np.diff(char_offsets)
    else:
        data = joined.replace("▁", " ").encode("utf-8")
        lead = np.flatnonzero((np.frombuffer(data, dtype=np.uint8) & 0xC0) != 0x80)
        lead = np.append(lead, len(data))
        start = lead[char_offsets[:-1]]
        length = lead[char_offsets[1:]] - start
    own: dict[int, bytes] = {}
    if family == "sentencepiece" and getattr(tok.model, "byte_fallback", False):
        for b in range(256):
            if (piece := vocab.get(f"<0x{b:02X}>")) is not None:
                own[piece] = bytes((b,))
    strip = np.zeros(size, dtype=np.uint8)
    for i, token in added.items():
        if i < size:
            own[i] = token.content.encode("utf-8")
            kind[i] = ADDED
            strip[i] = (LSTRIP if token.lstrip else 0) | (RSTRIP if token.rstrip else 0)
    extra = bytearray()
    for i, value in own.items():
        start[i], length[i] = len(data) + len(extra), len(value)
        extra += value
    buffer = np.frombuffer(data + bytes(extra), dtype=np.uint8)
    return ByteAligner(family, kind, strip, buffer, start.astype(np.int64), length.astype(np.int64),
                       prepend)  # fmt: skip


def _vocabulary(tok: tokenizers.Tokenizer, model: dict[str, Any] | None) -> dict[str, int]:
    """Piece -> id of the model's vocabulary (a Unigram vocabulary lists pieces by id)."""
    if model is not None:
        vocab = model.get("vocab")
        if isinstance(vocab, dict):
            return dict(vocab)
        if isinstance(vocab, list):
            return {entry[0]: i for i, entry in enumerate(vocab)}
    return tok.get_vocab(with_added_tokens=False)


def utf8_batch(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Return the texts' UTF-8 bytes, concatenated, and the byte offset of each (int64)."""
    encoded = [t.encode("utf-8") for t in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets


def align(
    aligner: ByteAligner,
    text: np.ndarray,
    text_offsets: np.ndarray,
    ids: np.ndarray,
    token_offsets: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Byte range of every token within its example's text, and which examples parsed.

    ``ids[token_offsets[e]:token_offsets[e + 1]]`` are the ids of example ``e`` (as encoded,
    without an inserted BOS), whose text is ``text[text_offsets[e]:text_offsets[e + 1]]``.
    Returns ``(start, end, ok)``: int64 byte positions relative to each example's text, and
    a bool per example, false where the ids do not spell the text exactly.
    """
    start = np.zeros(len(ids), dtype=np.int64)
    end = np.zeros(len(ids), dtype=np.int64)
    ok = np.zeros(len(text_offsets) - 1, dtype=np.bool_)
    _parse(text, text_offsets, ids, token_offsets, aligner.kind, aligner.strip, aligner.data,
           aligner.start, aligner.length, aligner.prepend, start, end, ok)  # fmt: skip
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
    text: np.ndarray, text_offsets: np.ndarray, ids: np.ndarray, token_offsets: np.ndarray,
    kind: np.ndarray, strip: np.ndarray, data: np.ndarray, piece_start: np.ndarray,
    piece_length: np.ndarray, prepend: int, start: np.ndarray, end: np.ndarray, ok: np.ndarray,
) -> None:  # fmt: skip
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
            if kind[tid] == ADDED:
                if strip[tid] & RSTRIP:
                    pos = _skip_whitespace(text, pos, stop)
                section = True
            else:
                section = False
            start[k] = begin - first
            end[k] = pos - first
        ok[e] = good and pos == stop


@njit(cache=True, nogil=True)
def _char_to_byte(text: np.ndarray, first: int, stop: int, chars: int) -> int:  # pragma: no cover
    """Byte position (from ``first``) where character ``chars`` of the text starts."""
    seen = 0
    for i in range(first, stop):
        if text[i] & 0xC0 != 0x80:
            if seen == chars:
                return i - first
            seen += 1
    return stop - first


@njit(cache=True, nogil=True)
def _spans(  # pragma: no cover - jitted
    text: np.ndarray, text_offsets: np.ndarray, start: np.ndarray, end: np.ndarray,
    token_offsets: np.ndarray, span_example: np.ndarray, span_lo: np.ndarray,
    span_hi: np.ndarray, t0: np.ndarray, t1: np.ndarray,
) -> None:  # fmt: skip
    for s in range(len(span_example)):
        e = span_example[s]
        first, stop = text_offsets[e], text_offsets[e + 1]
        lo = _char_to_byte(text, first, stop, span_lo[s])
        hi = _char_to_byte(text, first, stop, span_hi[s])
        if hi <= lo:
            continue
        k0, k1 = token_offsets[e], token_offsets[e + 1]
        a = k0
        while a < k1 and max(end[a], start[a] + 1) <= lo:
            a += 1
        b = a
        while b < k1 and start[b] < hi:
            b += 1
        if b > a:
            t0[s] = a - k0
            t1[s] = b - k0
