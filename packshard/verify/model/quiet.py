"""Library warnings a user cannot act on, kept off the terminal while the model check loads.

Importing ``transformers``' model classes may import ``torchao``, which logs a line per native
kernel it cannot load and a deprecation per enum it registers.  :func:`quiet_libraries` raises
those loggers to ERROR during the import and the model's construction; errors still show.
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
