r"""gigatoken as a fast encoder: the tokenizer's own JSON, one call a text, ids returned flat.

gigatoken reads the loaded tokenizer's JSON, packshard's adjustments included, and models
``Metaspace`` itself.  CPU-seconds to encode the same chat texts on one thread
(``scripts/corpus.py``; ids equal to ``tokenizers`` on every text)::

    family (vocabulary)          tokenizers   fastokens           gigatoken
    phi-3-mini (SentencePiece)   6.45         5.0 (+ emulation)   0.72      3.77M tokens
    Qwen3 (byte-level BPE)       6.46         0.22                0.31      3.13M tokens
    building the encoder         —            0.44 / 1.85         0.10 / 0.71  (phi-3 / Qwen3)

so :mod:`packshard.ingest.tokens.backends` tries gigatoken first for SentencePiece vocabularies
and fastokens first for byte-level ones, each behind the same canary.

Each text is encoded by its own call (``encode``: a ``uint32`` array, the GIL released while it
runs) and the arrays are joined into :class:`FlatIds`.  The batch calls return the same ids but
import awkward on first use (0.5-1.5 s of a process's start) and, padded, a matrix as wide as
the longest text (0.40-0.73 CPU-s against 0.31 on 2.45M phi-3 tokens).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packshard.ingest.tokens.metaspace import FlatIds
from packshard.ingest.tokens.tokenizer import TokenizerBundle

LIBRARY = "gigatoken"


class GigaEncoder:
    """gigatoken over the tokenizer as loaded: ids only, never offsets."""

    library = LIBRARY

    def __init__(self, bundle: TokenizerBundle) -> None:
        import gigatoken

        self._encode: Any = gigatoken.Tokenizer.from_json(bundle.tokenizer.to_str()).encode

    def encode_batch(self, texts: list[str]) -> FlatIds:
        """Encode ``texts`` (no special tokens added) into :class:`FlatIds`."""
        arrays = [self._encode(t) for t in texts]
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        flat = np.concatenate(arrays).astype(np.int32) if arrays else np.zeros(0, np.int32)
        return FlatIds(flat, offsets)
