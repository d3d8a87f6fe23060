"""packshard: pack chat fine-tuning data into audited, seam-safe Parquet shards.

Numba caches its compiled kernels beside their source by default, which writes into the
installed package (a read-only or shared location).  Unless ``NUMBA_CACHE_DIR`` is set,
packshard points it at ``$XDG_CACHE_HOME/packshard/numba`` (``~/.cache/packshard/numba``)
before any kernel module imports numba.
"""

import os as _os
import sys as _sys


def _numba_cache_dir() -> str:
    base = _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache")
    return _os.path.join(base, "packshard", "numba")


if "NUMBA_CACHE_DIR" not in _os.environ:
    _os.environ["NUMBA_CACHE_DIR"] = _numba_cache_dir()
    if "numba" in _sys.modules:  # imported before packshard: its config was read already
        _sys.modules["numba"].config.CACHE_DIR = _os.environ["NUMBA_CACHE_DIR"]

from packshard.errors import PackshardError  # noqa: E402
from packshard.records import IGNORE_INDEX  # noqa: E402

__version__ = "0.1.0"

__all__ = ["IGNORE_INDEX", "PackshardError", "__version__"]
