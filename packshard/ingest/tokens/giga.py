r"""gigatoken as a fast encoder: the tokenizer's own JSON, ids returned flat, memory bounded.

gigatoken reads the loaded tokenizer's JSON as ``tokenizers`` wrote it, packshard's
adjustments included, and models SentencePiece's ``Metaspace`` itself: no emulation in Python
(:mod:`packshard.ingest.tokens.metaspace` is fastokens' alone).  Measured on chat records seen
once (``scripts/corpus.py``), ids equal to ``tokenizers`` on every text, CPU-seconds to encode
the same texts on one thread::

    family (vocabulary)          tokenizers   fastokens           gigatoken
    phi-3-mini (SentencePiece)   6.45         5.0 (+ emulation)   0.72      3.77M tokens
    Qwen3 (byte-level BPE)       6.46         0.22                0.31      3.13M tokens
    building the encoder         —            0.44 / 1.85         0.10 / 0.71  (phi-3 / Qwen3)

so :mod:`packshard.ingest.tokens.backends` tries gigatoken first for SentencePiece vocabularies
and fastokens first for byte-level ones, each behind the same canary.

Ids come back as a padded ``uint32`` matrix and each row's length (its numpy path; the ragged
one imports awkward, about a second), cut into :class:`FlatIds`.  A batch is split so that no
matrix exceeds :data:`MATRIX_CHARS` character cells (a token is at least one character or
one of at most four bytes, so at most 4 x 4M cells x 4 bytes = 64 MiB)::

    texts   [300 ch][1,200 ch][90,000 ch][500 ch] ...
    pieces  └─ n x longest <= 4M ─┘└─ alone ─┘└── ...

A text longer than the bound alone is encoded alone, without a matrix.  In a forked worker
gigatoken encodes on the calling thread (its own rule, after ``os.fork``), elsewhere on its
thread pool.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packshard.ingest.tokens.metaspace import FlatIds
from packshard.ingest.tokens.tokenizer import TokenizerBundle

LIBRARY = "gigatoken"
MATRIX_CHARS = 4 << 20
"""Character cells (texts x the longest text) of one padded batch at most."""


class GigaEncoder:
    """gigatoken over the tokenizer as loaded: ids only, never offsets."""

    library = LIBRARY

    def __init__(self, bundle: TokenizerBundle) -> None:
        import gigatoken

        self._tok: Any = gigatoken.Tokenizer.from_json(bundle.tokenizer.to_str())

    def encode_batch(self, texts: list[str]) -> FlatIds:
        """Encode ``texts`` (no special tokens added) into :class:`FlatIds`."""
        ids: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        for start, stop in pieces([len(t) for t in texts]):
            if stop - start == 1 and len(texts[start]) > MATRIX_CHARS:
                one = np.asarray(self._tok.encode(texts[start]), dtype=np.int32)
                ids.append(one)
                lengths.append(np.array([len(one)], dtype=np.int64))
                continue
            matrix, counts = self._tok.encode_batch_padded(texts[start:stop], 0)
            counts = np.asarray(counts, dtype=np.int64)
            keep = np.arange(matrix.shape[1]) < counts[:, None]
            ids.append(np.asarray(matrix[keep], dtype=np.int32))
            lengths.append(counts)
        flat = np.concatenate(ids) if ids else np.zeros(0, np.int32)
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        if lengths:
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
        return FlatIds(flat, offsets)


def pieces(sizes: list[int]) -> list[tuple[int, int]]:
    """Cut texts of ``sizes`` characters into ranges whose count x longest <= MATRIX_CHARS."""
    out: list[tuple[int, int]] = []
    start, longest = 0, 0
    for i, size in enumerate(sizes):
        widest = max(longest, size)
        if i > start and (i - start + 1) * widest > MATRIX_CHARS:
            out.append((start, i))
            start, widest = i, size
        longest = widest
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out
