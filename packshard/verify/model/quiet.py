"""Library warnings a user cannot act on, kept off the terminal while the model check loads.

Importing ``transformers``' model classes may import ``torchao`` where it is installed (the
torchtune extra), and that logs a line per native kernel it cannot load on this machine
(``Failed to load …/_C_mxfp8….so``) and a deprecation per enum it registers with torch
(``… is an Enum subclass and is now natively supported …``).  Neither says anything about the
pack or the check; :func:`quiet_libraries` raises those loggers to ERROR for the duration of
the import and the model's construction, and restores them after.  Errors still show.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

NOISY_LOGGERS = ("torchao", "torch.utils._pytree")
"""Loggers whose warnings during the model's import are about the libraries, not the data."""


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """Run the block with :data:`NOISY_LOGGERS` at ERROR; restore their levels after."""
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
