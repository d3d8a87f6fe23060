r"""What each token id stands for in the original text: the tables of the ids-only alignment.

For the two tokenizer families nearly every chat model uses, each token id stands for a fixed
byte string of the original text:

* byte-level BPE (GPT-2, Llama 3, Qwen, Phi-2 …): a piece is the bytes its characters encode
  through the byte-to-unicode table;
* SentencePiece-style pieces (Llama 2, Mistral, Phi-3, Gemma …): ``▁`` stands for a space,
  ``<0xNN>`` (byte fallback) for the byte ``NN``, anything else for its UTF-8 bytes.

:func:`build_aligner` recognises the family from the tokenizer's pipeline and turns its
vocabulary into flat arrays (:class:`ByteAligner`): per id its kind (piece, added token, or
unknown), the bytes it stands for, and for added tokens the whitespace their ``lstrip`` /
``rstrip`` swallow.  A tokenizer outside the two families (a normalizer other than NFC,
WordPiece, ``##``/``</w>`` pieces …), or whose post-processor trims spaces off token offsets,
gets no aligner at all, and its labels come from offsets.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import tokenizers

from packshard.arrays import exclusive_cumsum

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
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + k): b for k, b in enumerate(others)}


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

    ``model`` is the parsed tokenizer.json's ``model``, when the caller has it (its
    vocabulary is read from there).  Vectorised over the vocabulary: the pieces are joined
    into one string and converted at once.
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
    char_offsets = exclusive_cumsum(np.fromiter(map(len, pieces), dtype=np.int64, count=size))
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
    return ByteAligner(
        family, kind, strip, buffer, start.astype(np.int64), length.astype(np.int64), prepend
    )


def _vocabulary(tok: tokenizers.Tokenizer, model: dict[str, Any] | None) -> dict[str, int]:
    """Piece -> id of the model's vocabulary (a Unigram vocabulary lists pieces by id)."""
    if model is not None:
        vocab = model.get("vocab")
        if isinstance(vocab, dict):
            return dict(vocab)
        if isinstance(vocab, list):
            return {entry[0]: i for i, entry in enumerate(vocab)}
    return tok.get_vocab(with_added_tokens=False)
