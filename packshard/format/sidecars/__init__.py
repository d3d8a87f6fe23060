"""Sidecars: files added to a finished pack, each listed in its manifest and checked on read.

A sidecar is written after ``pack`` under OUT's lock and listed in the manifest's ``files``
with its size and SHA-256 (:func:`~packshard.format.folder.claim.amend_out`).  Its contents are
checked by the same function wherever it is read, so ``verify`` refuses what a trainer would
refuse: :mod:`~packshard.format.sidecars.reference` (the reference model's log-probabilities).
"""

from packshard.format.sidecars.reference import (
    REFERENCE_KEY,
    REFERENCE_NAME,
    REFERENCE_SCHEMA,
    read_reference,
    reference_problem,
    scored_example_ids,
)

__all__ = [
    "REFERENCE_KEY",
    "REFERENCE_NAME",
    "REFERENCE_SCHEMA",
    "read_reference",
    "reference_problem",
    "scored_example_ids",
]
