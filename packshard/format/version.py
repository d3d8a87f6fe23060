"""The format version and the key-value metadata every Parquet file packshard writes carries.

Format versions are integers.  Readers accept the versions in :data:`SUPPORTED_VERSIONS` and
refuse anything else with a message that names both.  Every Parquet file of an output folder
(the shards and the examples index) holds ``packshard.format_version`` and
``packshard.dataset_id`` in its key-value metadata, so a file that wandered in from another
folder, or a shard replaced under an open reader, is recognised: its dataset id differs from
the manifest's.  Additive changes (a new column, a new manifest key) keep version 1; a change of
meaning bumps it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packshard.errors import ManifestError

FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
META_FORMAT_VERSION = b"packshard.format_version"
META_DATASET_ID = b"packshard.dataset_id"


def check_format_version(version: Any, where: str) -> None:
    """Raise :class:`ManifestError` unless ``version`` is a supported format version."""
    if not isinstance(version, int) or isinstance(version, bool):
        raise ManifestError(f"{where}: format_version is {version!r}, expected an integer")
    if version not in SUPPORTED_VERSIONS:
        supported = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise ManifestError(
            f"{where}: format_version {version} is not supported by this packshard "
            f"(supports {supported}); upgrade packshard or re-pack the data"
        )


def parquet_metadata(dataset_id: str) -> dict[bytes, bytes]:
    """Return the key-value metadata of a Parquet file of dataset ``dataset_id``."""
    return {META_FORMAT_VERSION: str(FORMAT_VERSION).encode(), META_DATASET_ID: dataset_id.encode()}


def metadata_problem(meta: Mapping[bytes, bytes] | None, dataset_id: str) -> str | None:
    """Say what is wrong with a Parquet file's packshard metadata, or None when it matches.

    The file must carry a supported format version and ``dataset_id``.
    """
    meta = meta or {}
    version = meta.get(META_FORMAT_VERSION)
    if version is None:
        return "no packshard.format_version in its Parquet metadata"
    if not version.isdigit() or int(version) not in SUPPORTED_VERSIONS:
        return f"packshard.format_version {version.decode(errors='replace')!r} is not supported"
    got = meta.get(META_DATASET_ID)
    if got != dataset_id.encode():
        shown = "none" if got is None else got.decode(errors="replace")
        return (
            f"packshard.dataset_id {shown} differs from the manifest's {dataset_id} (the file "
            "belongs to another pack, or the folder was replaced while it was open)"
        )
    return None
