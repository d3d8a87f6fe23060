"""The dataset manifest: what a packed folder holds, how it was made, and its checksums.

``manifest.json`` is the last file written into an output folder and the first one read from
it.  It records the configuration, the tokenizer and template hashes (so a reader can refuse a
mismatched tokenizer), every input's SHA-256 and record count, statistics, and one entry per
shard with its row/token counts, byte size and SHA-256.  Keys are sorted and paths inside the
folder are relative, so two runs over the same inputs differ only in ``created_at``.

Format versions are integers.  Readers accept the versions in :data:`SUPPORTED_VERSIONS` and
refuse anything else with a message that names both.  The JSON Schema lives in
``packshard/schemas/manifest.v1.json``.

Counting rule (checked by ``verify``)::

    records = records_packed + rejected + dropped      (in total and per domain)
    lines(rejects.jsonl) = rejected + dropped
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from packshard.errors import ManifestError

FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
MANIFEST_NAME = "manifest.json"
EXAMPLES_NAME = "examples.parquet"
REJECTS_NAME = "rejects.jsonl"
SHARD_PATTERN = "shard-{index:05d}.parquet"
META_FORMAT_VERSION = b"packshard.format_version"
META_DATASET_ID = b"packshard.dataset_id"


def sha256_bytes(data: bytes) -> str:
    """Return the lowercase hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_path(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """Return the lowercase hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def compute_dataset_id(config: Mapping[str, Any], fingerprints: Mapping[str, Any]) -> str:
    """Hash the configuration and the inputs' fingerprints into a stable dataset id.

    ``fingerprints`` holds everything the output depends on besides ``config``: input hashes,
    tokenizer and template hashes, the packshard format version.
    """
    blob = json.dumps({"config": config, "inputs": fingerprints}, sort_keys=True)
    return sha256_bytes(blob.encode("utf-8"))[:32]


def load_schema() -> dict[str, Any]:
    """Return the manifest JSON Schema (format version 1)."""
    text = resources.files("packshard").joinpath("schemas/manifest.v1.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def schema_errors(manifest: Mapping[str, Any]) -> list[str]:
    """Validate ``manifest`` against the schema; return one message per violation."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(load_schema())
    errors = sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path))
    out = []
    for err in errors:
        where = "/".join(str(p) for p in err.absolute_path) or "(root)"
        out.append(f"manifest.json: {where}: {err.message}")
    return out


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as sorted, indented JSON via a temporary file and an atomic rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, sort_keys=True, indent=2, ensure_ascii=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_manifest(out: str | os.PathLike[str], validate: bool = True) -> dict[str, Any]:
    """Read ``OUT/manifest.json``, refusing missing files and unsupported format versions.

    With ``validate`` the manifest is also checked against the JSON Schema and the first
    violations are reported together.
    """
    path = Path(out) / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(
            f"{path}: no manifest (is {out} a packshard output folder? a run that was "
            "interrupted leaves none: pack again)"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: unreadable manifest: {exc}") from exc
    if not isinstance(manifest, dict):
        raise ManifestError(f"{path}: manifest is not a JSON object")
    check_format_version(manifest.get("format_version"), str(path))
    if validate:
        problems = schema_errors(manifest)
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise ManifestError("; ".join(problems[:5]) + more)
    return manifest


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
