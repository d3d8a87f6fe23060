"""Convert a packed output folder to the formats other training projects read."""

from packshard.export.run import ExportResult, export_dataset

__all__ = ["ExportResult", "export_dataset"]
