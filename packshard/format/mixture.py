"""The realised mixture: per domain, what a pack made with ``--mix`` holds, counted one way.

``pack`` records it in the manifest's ``stats.mix.domains`` and ``verify`` recounts it from
the examples index (whose token counts the structure stage ties to the shards), so both
count with :func:`realised_mixture`::

    domain  examples  repeats  tokens   trained_tokens  share_tokens  share_trained_tokens …
    chat    1,200     200      410,000  180,000         0.587         0.6
    code      600       0      230,000   90,000         0.329         0.3

``repeats`` counts the examples with ``repeat > 0`` (second and later copies of a record);
shares are rounded to 6 decimals, so a recount matches the manifest exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

MEASURES = ("tokens", "trained_tokens", "examples")
"""What a share can be counted in (``--mix-by``), in the keys' order."""
REALISED_KEYS = (
    "examples",
    "repeats",
    "tokens",
    "trained_tokens",
    "share_tokens",
    "share_trained_tokens",
    "share_examples",
)
"""The keys of a domain's entry that :func:`realised_mixture` computes (verify compares them)."""


def realised_mixture(
    domain: np.ndarray,
    tokens: np.ndarray,
    trained: np.ndarray,
    repeat: np.ndarray,
    names: Sequence[str],
) -> dict[str, dict[str, Any]]:
    """Return, per domain of ``names``, its examples, repeats, tokens and shares of each.

    Arguments are per packed example; ``domain`` indexes ``names``.
    """
    n = len(names)
    codes = np.asarray(domain, dtype=np.int64)

    def per(weights: np.ndarray | None = None) -> list[int]:
        return np.bincount(codes, weights=weights, minlength=n).astype(np.int64).tolist()

    counts = {
        "examples": per(),
        "repeats": per((np.asarray(repeat) > 0).astype(np.float64)),
        "tokens": per(np.asarray(tokens, dtype=np.float64)),
        "trained_tokens": per(np.asarray(trained, dtype=np.float64)),
    }
    out: dict[str, dict[str, Any]] = {}
    for code, name in enumerate(names):
        entry: dict[str, Any] = {key: values[code] for key, values in counts.items()}
        for measure in MEASURES:
            whole = sum(counts[measure])
            entry[f"share_{measure}"] = round(counts[measure][code] / whole, 6) if whole else 0.0
        out[name] = entry
    return out
