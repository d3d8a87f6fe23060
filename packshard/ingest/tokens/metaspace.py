r"""The SentencePiece prefix rule, for a fast encoder that has no ``Metaspace`` pre-tokenizer.

Loading a SentencePiece-style tokenizer (Phi-3, Llama 2, Mistral …) gives it a ``Metaspace``
pre-tokenizer with ``split: false`` (:mod:`packshard.ingest.tokens.tokenizer`), which does two
things to each piece of text between added tokens:

* replaces every space with ``▁``;
* with ``prepend_scheme: first``, puts one ``▁`` before the piece that starts the text (at
  character 0), unless it already starts with ``▁`` after the replacement.

``fastokens`` has no ``Metaspace``.  So the fast tokenizer gets the same JSON with no
normalizer and no pre-tokenizer, and :class:`MetaspaceEncoder` does both in Python: it
replaces the spaces itself (``str.replace``: 1.2 µs a phi-3 chat text, fastokens' own
``Replace`` 6–7 µs) and puts the prefix on the text, where the reference would put it::

    text                    reference pieces            fast: encodes
    "Hi there"              ▁Hi ▁there                  "▁Hi▁there"
    " Hi"                   ▁Hi (no second ▁)           "▁Hi"
    "<|user|>\nHi"          <|user|> Hi (piece at 5)    "<|user|>\nHi"

A text gets the prefix unless it is empty, starts with a space or ``▁``, or its first token is an
added token (then no piece starts at character 0).  Whether a text starts with an added token is
guessed from its first characters and checked on the ids: a wrong guess is encoded again.

Replacing before the added tokens are found is exact when no added token holds a space or a
``▁`` (checked once), except where an added token with ``rstrip``/``lstrip`` meets whitespace
holding a space (``<|user|>\n Hi``): such a text is encoded by the reference.  Only ``first``
and ``never`` are modelled; anything else is :data:`None`.  The canary of
:mod:`packshard.ingest.tokens.backends` proves the rule on every run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from packshard.arrays import exclusive_cumsum

SPACE = "▁"


_WHITESPACE = "[\t\n\x0b\x0c\r\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
"""Unicode whitespace as Rust has it (``char::is_whitespace``), but for the space itself."""


@dataclass(frozen=True)
class MetaspaceRule:
    """What the fast encoder of a ``Metaspace`` tokenizer does in Python (see the module notes)."""

    prefix: bool  # prepend_scheme first: a ▁ before a text that does not start with one
    added: dict[int, str]  # added token ids and contents
    swallowed: re.Pattern[str] | None  # an lstrip/rstrip token meeting whitespace with a space


def fast_spec(spec: dict[str, Any]) -> tuple[dict[str, Any], MetaspaceRule | None] | None:
    """Return ``(JSON for the fast encoder, its Metaspace rule)``, or None when not modelled.

    ``spec`` is the loaded tokenizer's JSON.  One without a ``Metaspace`` pre-tokenizer comes
    back unchanged, with no rule.
    """
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") != "Metaspace":
        return spec, None
    if spec.get("normalizer") is not None or pre.get("replacement") != SPACE:
        return None
    if pre.get("split") is not False or pre.get("prepend_scheme") not in ("first", "never"):
        return None
    added = spec.get("added_tokens", [])
    if any(" " in a["content"] or SPACE in a["content"] for a in added):
        return None
    replaced = {**spec, "normalizer": None, "pre_tokenizer": None}
    rstrip, lstrip = ([a["content"] for a in added if a.get(side)] for side in ("rstrip", "lstrip"))
    parts = [f"{_either(rstrip)}{_WHITESPACE}* "] if rstrip else []
    parts += [f" {_WHITESPACE}*{_either(lstrip)}"] if lstrip else []
    swallowed = re.compile("|".join(parts)) if parts else None
    contents = {int(a["id"]): a["content"] for a in added}
    return replaced, MetaspaceRule(pre["prepend_scheme"] == "first", contents, swallowed)


def _either(texts: list[str]) -> str:
    return "(?:" + "|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)) + ")"


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


class MetaspaceEncoder:
    """Encode as a ``Metaspace(split=false)`` tokenizer would (see the module notes)."""

    def __init__(self, tok: Any, rule: MetaspaceRule, reference: Any) -> None:
        self._tok, self._rule, self._reference = tok, rule, reference
        self._added_ids = np.array(sorted(rule.added), dtype=np.int64)
        self._starts = tuple(sorted(set(rule.added.values()), key=len, reverse=True))

    def _encode(self, texts: list[str], prefix: np.ndarray) -> FlatIds:
        """Encode ``texts`` with their spaces replaced, ``prefix`` ones after a ``▁``."""
        replaced = [
            SPACE + t.replace(" ", SPACE) if p else t.replace(" ", SPACE)
            for t, p in zip(texts, prefix.tolist(), strict=True)
        ]
        return encode_flat(self._tok, replaced)

    def encode_flat(self, texts: list[str]) -> FlatIds:
        """Encode ``texts`` (never adding special tokens): each one's ids as the reference's."""
        swallowed = self._rule.swallowed
        aside = [swallowed.search(t) is not None for t in texts] if swallowed else []
        if not any(aside):
            return self._fast(texts)
        # a space a stripping added token swallows: the reference encodes those texts
        fast = iter(self._fast([t for t, a in zip(texts, aside, strict=True) if not a]))
        slow = iter(
            self._reference.encode_batch_fast(
                [t for t, a in zip(texts, aside, strict=True) if a], add_special_tokens=False
            )
        )
        return _joined(
            [np.asarray(next(slow).ids, np.int32) if a else next(fast).ids for a in aside]
        )

    def _fast(self, texts: list[str]) -> FlatIds:
        """Encode ``texts`` with fastokens, the prefix rule applied."""
        if not self._rule.prefix:
            return self._encode(texts, np.zeros(len(texts), dtype=bool))
        n = len(texts)
        plain = np.fromiter((bool(t) and t[0] not in (" ", SPACE) for t in texts), bool, count=n)
        looks_added = np.fromiter((t.startswith(self._starts) for t in texts), bool, count=n)
        flat = self._encode(texts, plain & ~looks_added)
        first = flat.ids[np.minimum(flat.offsets[:-1], len(flat.ids) - 1)] if len(flat.ids) else 0
        starts_added = (flat.lengths > 0) & np.isin(first, self._added_ids)
        wrong = np.flatnonzero(plain & looks_added & ~starts_added)
        if not wrong.size:
            return flat
        # an added token's text at the start that did not match as the token: prefix it
        again = self._encode([texts[i] for i in wrong.tolist()], np.ones(wrong.size, dtype=bool))
        pieces = [flat[i].ids for i in range(len(flat))]
        for j, i in enumerate(wrong.tolist()):
            pieces[i] = again[j].ids
        return _joined(pieces)


def _joined(pieces: list[np.ndarray]) -> FlatIds:
    offsets = exclusive_cumsum(np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces)))
    return FlatIds(np.concatenate([np.zeros(0, np.int32), *pieces]).astype(np.int32), offsets)


def load_json(text: str | bytes) -> dict[str, Any]:
    """Parse a tokenizer's JSON (a ``tokenizer.json``, or what ``Tokenizer.to_str`` returns).

    ``orjson`` parses it first; what only the standard parser accepts (integers beyond 64
    bits, NaN) falls back.  JSON that is not an object gives ``{}``.
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
