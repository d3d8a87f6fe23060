"""``packshard pack``: from input files to an audited, atomically published output folder."""

from packshard.pack.config import PackConfig
from packshard.pack.pipeline import PackResult, pack_dataset

__all__ = ["PackConfig", "PackResult", "pack_dataset"]
