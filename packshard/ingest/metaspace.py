r"""The SentencePiece prefix rule, for a fast encoder that has no ``Metaspace`` pre-tokenizer.

Loading a SentencePiece-style tokenizer (Phi-3, Llama 2, Mistral …) gives it a ``Metaspace``
pre-tokenizer with ``split: false`` (:mod:`packshard.ingest.tokenizer`), which does two things
to each piece of text between added tokens:

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
canary of :mod:`packshard.ingest.backends` proves the rule on every run before it is trusted.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

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


class PrefixedEncoder:
    """Encode as a ``Metaspace(prepend_scheme=first, split=false)`` tokenizer would."""

    def __init__(self, tok: Any, spec: dict[str, Any]) -> None:
        self._tok = tok
        added = {int(a["id"]): a["content"] for a in spec.get("added_tokens", [])}
        self._added_ids = np.array(sorted(added), dtype=np.int64)
        self._starts = tuple(sorted(set(added.values()), key=len, reverse=True))

    def _prefixed(self, text: str) -> bool:
        return bool(text) and text[0] not in (" ", SPACE) and not text.startswith(self._starts)

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False) -> list[Any]:
        """Encode ``texts`` (never adding special tokens): each one's ids as the reference's."""
        guess = [self._prefixed(t) for t in texts]
        encs = list(
            self._tok.encode_batch(
                [SPACE + t if g else t for t, g in zip(texts, guess, strict=True)],
                add_special_tokens=False,
            )
        )
        wrong = [
            i
            for i, (t, g, e) in enumerate(zip(texts, guess, encs, strict=True))
            if t and not g and t[0] not in (" ", SPACE) and not self._starts_added(e)
        ]
        if wrong:  # an added token's text at the start that did not match as the token
            again = self._tok.encode_batch([SPACE + texts[i] for i in wrong], False)
            for i, enc in zip(wrong, again, strict=True):
                encs[i] = enc
        return encs

    def _starts_added(self, enc: Any) -> bool:
        ids = enc.ids
        return len(ids) > 0 and bool(np.isin(ids[0], self._added_ids))


def load_json(text: str) -> dict[str, Any]:
    """Parse a tokenizer's JSON (what ``Tokenizer.to_str`` returns)."""
    value = json.loads(text)
    return value if isinstance(value, dict) else {}
