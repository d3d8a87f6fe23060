"""``pack``'s output folder: :mod:`packshard.format.folder.outdir`'s guard, given ``pack``'s inputs.

The rules (what may be replaced, the lock, the temporary names, publishing) are shared by
every command that writes a folder and live in :mod:`packshard.format.folder.outdir` and
:mod:`packshard.format.folder.claim`; this module hands them the input files ``pack`` found.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from packshard.format.folder.claim import Claim
from packshard.format.folder.claim import claim_out as _claim_out
from packshard.format.folder.outdir import (
    CARD_NAME,
    NAME_MAX,
    check_out,
    temp_stem,
    written_by_packshard,
)
from packshard.format.folder.outdir import check_overlap as _check_overlap
from packshard.ingest.read.sources import InputFile

__all__ = [
    "CARD_NAME",
    "NAME_MAX",
    "Claim",
    "check_out",
    "check_overlap",
    "claim_out",
    "temp_stem",
    "written_by_packshard",
]


def _reals(files: Sequence[InputFile]) -> list[tuple[str, str]]:
    return [(str(f.path), str(f.real)) for f in files]


def check_overlap(out: str, specs: Sequence[str], files: Sequence[InputFile]) -> None:
    """Refuse an OUT that is, holds or lies inside an input, or that an input glob matches."""
    _check_overlap(out, specs, _reals(files))


@contextmanager
def claim_out(
    out: str,
    overwrite: bool,
    specs: Sequence[str],
    files: Sequence[InputFile],
    notify: Callable[[str], None] | None = None,
) -> Iterator[Claim]:
    """Claim OUT for ``pack`` (see :func:`packshard.format.folder.claim.claim_out`)."""
    with _claim_out(out, overwrite, specs, _reals(files), notify) as claim:
        yield claim
