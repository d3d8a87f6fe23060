r"""The SentencePiece prefix rule, for a fast encoder that has no ``Metaspace`` pre-tokenizer.

Loading a SentencePiece-style tokenizer (Phi-3, Llama 2, Mistral …) gives it a ``Metaspace``
pre-tokenizer with ``split: false`` (:mod:`packshard.ingest.tokens.tokenizer`), which does two
things to each piece of text between added tokens:

* replaces every space with ``▁``;
* with ``prepend_scheme: first``, puts one ``▁`` before the piece that starts the text (at
  character 0), unless it already starts with ``▁`` after the replacement.

``fastokens`` has no ``Metaspace``; it has ``Replace``.  So the fast tokenizer gets the same
JSON with a ``Replace(" ", "▁")`` normalizer and no pre-tokenizer, and the prefix is put on the
text itself, where the reference would put it::

    text                    reference pieces            fast: encodes
    "Hi there"              ▁Hi ▁there                  "▁Hi there"
    " Hi"                   ▁Hi (no second ▁)           " Hi"
    "<|user|>\nHi"          <|user|> Hi (piece at 5)    "<|user|>\nHi"

A text gets the prefix unless it is empty, starts with a space or ``▁``, or its first token is an
added token (then no piece starts at character 0).  Whether a text starts with an added token is
guessed from its first characters and checked on the ids: a wrong guess is encoded again.  Only
``first`` and ``never`` are modelled, with no normalizer and no added token that would match
differently on normalized text; anything else is :data:`None` (the reference encodes).  The
canary of :mod:`packshard.ingest.tokens.backends` proves the rule on every run before it is trusted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

SPACE = "▁"


def fast_spec(spec: dict[str, Any]) -> tuple[dict[str, Any], bool] | None:
    """Return ``(JSON for the fast encoder, prefix first piece)``, or None when not modelled.

    ``spec`` is the loaded tokenizer's JSON.  One without a ``Metaspace`` pre-tokenizer comes
    back unchanged (no prefix rule).
    """
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") != "Metaspace":
        return spec, False
    if spec.get("normalizer") is not None or pre.get("replacement") != SPACE:
        return None
    if pre.get("split") is not False or pre.get("prepend_scheme") not in ("first", "never"):
        return None
    for added in spec.get("added_tokens", []):
        if added.get("normalized") and (" " in added["content"] or SPACE in added["content"]):
            return None
    replaced = dict(spec)
    replaced["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    replaced["pre_tokenizer"] = None
    return replaced, pre["prepend_scheme"] == "first"


@dataclass(frozen=True)
class FlatIds(Sequence[Any]):
    """A batch's ids, flat: text ``i`` owns ``ids[offsets[i]:offsets[i + 1]]``."""

    ids: np.ndarray  # int32
    offsets: np.ndarray  # int64 [n + 1]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: Any) -> Any:
        return _Ids(self.ids[self.offsets[i] : self.offsets[i + 1]])

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per text (int64)."""
        return np.diff(self.offsets)


@dataclass(frozen=True)
class _Ids:
    ids: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


def encode_flat(tok: Any, texts: list[str]) -> FlatIds:
    """Encode ``texts`` with a fastokens tokenizer into :class:`FlatIds` (no Python ints)."""
    ids, offsets = tok.encode_batch_flat(texts, add_special_tokens=False)
    flat = np.frombuffer(ids, dtype=np.uint32).astype(np.int32)
    return FlatIds(flat, np.frombuffer(offsets, dtype=np.uint64).astype(np.int64))


class PrefixedEncoder:
    """Encode as a ``Metaspace(prepend_scheme=first, split=false)`` tokenizer would."""

    def __init__(self, tok: Any, spec: dict[str, Any]) -> None:
        self._tok = tok
        added = {int(a["id"]): a["content"] for a in spec.get("added_tokens", [])}
        self._added_ids = np.array(sorted(added), dtype=np.int64)
        self._starts = tuple(sorted(set(added.values()), key=len, reverse=True))

    def _prefixed(self, text: str) -> bool:
        return bool(text) and text[0] not in (" ", SPACE) and not text.startswith(self._starts)

    def encode_flat(self, texts: list[str]) -> FlatIds:
        """Encode ``texts`` (never adding special tokens): each one's ids as the reference's."""
        guess = np.fromiter(map(self._prefixed, texts), dtype=bool, count=len(texts))
        flat = encode_flat(
            self._tok, [SPACE + t if g else t for t, g in zip(texts, guess, strict=True)]
        )
        lengths = flat.lengths
        first = flat.ids[np.minimum(flat.offsets[:-1], len(flat.ids) - 1)] if len(flat.ids) else 0
        starts_added = (lengths > 0) & np.isin(first, self._added_ids)
        plain = np.fromiter(
            (bool(t) and t[0] not in (" ", SPACE) for t in texts), dtype=bool, count=len(texts)
        )
        wrong = np.flatnonzero(plain & ~guess & ~starts_added)
        if not wrong.size:
            return flat
        # an added token's text at the start that did not match as the token: prefix it
        again = encode_flat(self._tok, [SPACE + texts[i] for i in wrong.tolist()])
        pieces = [flat[i].ids for i in range(len(flat))]
        for j, i in enumerate(wrong.tolist()):
            pieces[i] = again[j].ids
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        return FlatIds(np.concatenate([flat.ids[:0], *pieces]).astype(np.int32), offsets)


def load_json(text: str) -> dict[str, Any]:
    """Parse a tokenizer's JSON (what ``Tokenizer.to_str`` returns).

    ``orjson`` parses it a little faster than the standard parser (0.11 against 0.12 CPU-s
    for Qwen3's 4.6 MB); what only the standard parser accepts (integers beyond 64 bits) falls
    back.
    """
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = json.loads(text)
    return value if isinstance(value, dict) else {}


def dump_json(spec: dict[str, Any]) -> str:
    """Serialize a tokenizer's JSON for the fast encoder: the same keys, order and values.

    ``orjson`` writes non-ASCII text as is (as ``json.dumps(ensure_ascii=False)``), in a tenth
    of its time (phi-3: 0.003 against 0.035 CPU-s); what it refuses (integers beyond 64 bits,
    lone surrogates) goes through the standard serializer.
    """
    try:
        return orjson.dumps(spec).decode("utf-8")
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(spec, ensure_ascii=False)
