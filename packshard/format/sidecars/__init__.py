"""Sidecars: files added to a finished pack, each listed in its manifest and checked on read.

A sidecar is written after ``pack`` under OUT's lock and listed in the manifest
(:func:`~packshard.format.folder.claim.amend_out`); the same function checks it wherever it is
read: :mod:`~packshard.format.sidecars.reference`.
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
