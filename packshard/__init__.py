"""packshard: pack chat fine-tuning data into audited, seam-safe Parquet shards."""

from packshard.errors import PackshardError
from packshard.records import IGNORE_INDEX

__version__ = "0.1.0"

__all__ = ["IGNORE_INDEX", "PackshardError", "__version__"]
