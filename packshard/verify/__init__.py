"""``packshard verify``: integrity, structure, source and model checks of a packed folder."""

from packshard.verify.run import VerifyOptions, VerifyReport, verify_dataset

__all__ = ["VerifyOptions", "VerifyReport", "verify_dataset"]
