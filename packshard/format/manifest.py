"""The dataset manifest: what a packed folder holds, how it was made, and its checksums.

``manifest.json`` is the last file written into an output folder and the first one read: the
configuration, the tokenizer and template hashes, every input's SHA-256 and record count,
statistics, one entry per shard.  Keys are sorted and paths relative, so two runs over the
same inputs differ only in ``created_at``.  Schema: ``packshard/schemas/manifest.v1.json``.

Counting rule (checked by ``verify``)::

    records = records_packed + rejected + dropped      (in total and per domain)
    lines(rejects.jsonl) = rejected + dropped
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from importlib import resources
from json.encoder import encode_basestring  # the C function where it is built
from pathlib import Path
from typing import Any

from packshard.digests import sha256_bytes
from packshard.errors import FormatError, ManifestError
from packshard.format.folder.paths import MISSING, inside_folder
from packshard.format.version import FORMAT_VERSION, check_format_version
from packshard.store.objects import object_size, read_object
from packshard.store.urls import is_url, parse_url

MANIFEST_NAME = "manifest.json"
MAX_MANIFEST_BYTES = 256 << 20
"""Largest manifest read (a manifest is a few kilobytes per shard and per input)."""


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def compute_dataset_id(config: Mapping[str, Any], fingerprints: Mapping[str, Any]) -> str:
    """Hash the configuration and the inputs' fingerprints into a stable dataset id.

    ``fingerprints`` holds everything the output depends on besides ``config``: input hashes,
    tokenizer and template hashes, the packshard format version.
    """
    blob = json.dumps({"config": config, "inputs": fingerprints}, sort_keys=True)
    return sha256_bytes(blob.encode("utf-8"))[:32]


def build_manifest(
    *,
    dataset_id: str,
    config: Mapping[str, Any],
    tokenizer: Mapping[str, Any],
    template: Mapping[str, Any],
    inputs: list[dict[str, Any]],
    stats: Mapping[str, Any],
    files: Mapping[str, Any],
    shards: list[dict[str, Any]],
    loss: Mapping[str, Any],
    environment: Mapping[str, Any],
    engine: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the manifest of a finished pack (``created_at`` is now, UTC).

    ``environment`` is :func:`packshard.format.environment.pack_environment`'s entry: the
    library versions and template conventions that made the pack.  ``engine`` (how the job
    ran: engine, workers, units) never changes the content.
    """
    from packshard import __version__

    return {
        "format_version": FORMAT_VERSION,
        "packshard_version": __version__,
        "dataset_id": dataset_id,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": dict(config),
        "tokenizer": dict(tokenizer),
        "template": dict(template),
        "inputs": inputs,
        "stats": dict(stats),
        "files": dict(files),
        "shards": shards,
        "loss": dict(loss),
        "environment": dict(environment),
        **({"engine": dict(engine)} if engine else {}),
    }


def load_schema() -> dict[str, Any]:
    """Return the manifest JSON Schema (format version 1)."""
    text = resources.files("packshard").joinpath("schemas/manifest.v1.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def inline_refs(node: Any, defs: Mapping[str, Any]) -> Any:
    """Return schema ``node`` with every ``{"$ref": "#/$defs/NAME"}`` replaced by that entry.

    The schema's definitions are not recursive, so the result is finite and means the same;
    a ``$ref`` beside other keywords becomes ``allOf``.  It skips a reference lookup per value
    (half the validation time of a 152-input manifest).
    """
    if isinstance(node, list):
        return [inline_refs(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: inline_refs(v, defs) for k, v in node.items() if k not in ("$ref", "$defs")}
    ref = node.get("$ref")
    if ref is None:
        return out
    target = inline_refs(defs[ref.removeprefix("#/$defs/")], defs)
    return {**out, "allOf": [target]} if out else target


@functools.cache
def manifest_validator() -> Any:
    """Return the manifest schema's validator, references inlined, built once a process."""
    import jsonschema

    schema = load_schema()
    return jsonschema.Draft202012Validator(inline_refs(schema, schema["$defs"]))


def schema_errors(manifest: Mapping[str, Any]) -> list[str]:
    """Validate ``manifest`` against the schema; return one message per violation."""
    return _violations(manifest_validator(), manifest)


def part_errors(manifest: Mapping[str, Any], keys: tuple[str, ...]) -> list[str]:
    """Validate only the top-level ``keys`` of ``manifest`` against their schema entries.

    For readers that use a few values of a folder someone else wrote: each is checked
    before it is used, without requiring what the reader never touches.
    """
    import jsonschema

    full = load_schema()
    schema = {
        "type": "object",
        "required": list(keys),
        "properties": {k: full["properties"][k] for k in keys},
        "$defs": full["$defs"],
    }
    return _violations(jsonschema.Draft202012Validator(schema), manifest)


def _violations(validator: Any, manifest: Mapping[str, Any]) -> list[str]:
    errors = sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path))
    return [
        f"manifest.json: {'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in errors
    ]


class _Unusual(Exception):
    """A value :func:`manifest_text` leaves to :func:`json.dumps` (its bytes, or its error)."""


def manifest_text(manifest: Mapping[str, Any]) -> str:
    """Return ``json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=False)``, faster.

    With ``indent`` the standard library leaves its C encoder for a pure-Python one (0.20
    against 0.10 CPU-s for the 5.5 MB manifest of 10,000 one-record inputs).  This writes the
    same text from one recursive function that appends to a list, a dict or list of leaves
    in one join: strings through the standard library's own C quoting
    (``json.encoder.encode_basestring``), numbers through ``int.__repr__`` and
    ``float.__repr__`` as it does, keys sorted as it sorts them::

        {                       "{" newline, then each item at the next indent,
          "inputs": [           items joined by "," newline, "key": value,
            {                   the closing bracket back at the parent's indent;
              "path": "a.jsonl" an empty dict or list is "{}" or "[]"
            }
          ]
        }

    Anything else (a key that is no string, NaN, a cycle …) is left to :func:`json.dumps` on
    the whole manifest, so its text or its error is the library's.
    """
    out: list[str] = []
    try:
        _encode(manifest, "\n", out)
    except (_Unusual, RecursionError, TypeError):
        return json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=False)
    return "".join(out)


def _finite(value: float) -> str:
    if not math.isfinite(value):
        raise _Unusual  # NaN, Infinity: the library's own spelling, or its error
    return float.__repr__(value)


_LEAVES: dict[type, Callable[[Any], str]] = {
    str: encode_basestring,
    int: int.__repr__,
    float: _finite,
}
"""The common leaves' texts (exact types only: a subclass is the library's to encode)."""


def _encode(value: Any, newline: str, out: list[str]) -> None:
    """Append ``value`` to ``out``, its nested lines starting with ``newline`` + two spaces.

    A dict or list of leaves only (an input's entry, a domain's counts) is joined in one
    expression: most of the manifest, and half the time of item by item.
    """
    kind = type(value)
    if kind is dict:
        if not value:
            out.append("{}")
            return
        keys, inner = sorted(value), newline + "  "  # a key no string: TypeError here or below
        try:
            texts = [encode_basestring(k) + ": " + _LEAVES[type(value[k])](value[k]) for k in keys]
        except KeyError:  # a nested value, or true, false, null: item by item
            out.append("{" + inner)
            for n, key in enumerate(keys):
                out.append(("," + inner if n else "") + encode_basestring(key) + ": ")
                _encode(value[key], inner, out)
            out.append(newline + "}")
        else:
            out.append("{" + inner + ("," + inner).join(texts) + newline + "}")
    elif kind is list or kind is tuple:
        if not value:
            out.append("[]")
            return
        inner = newline + "  "
        try:
            texts = [_LEAVES[type(item)](item) for item in value]
        except KeyError:
            out.append("[" + inner)
            for n, item in enumerate(value):
                if n:
                    out.append("," + inner)
                _encode(item, inner, out)
            out.append(newline + "]")
        else:
            out.append("[" + inner + ("," + inner).join(texts) + newline + "]")
    elif kind in _LEAVES:
        out.append(_LEAVES[kind](value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    else:
        raise _Unusual


def write_manifest(folder: Path, manifest: Mapping[str, Any]) -> None:
    """Write ``folder/manifest.json``: sorted, indented, via a temporary file and a rename."""
    path = folder / MANIFEST_NAME
    tmp = path.with_name(f".{path.name}.tmp")
    # encoded whole, then written once: json.dump writes every token (700,000 calls for the
    # manifest of 10,000 inputs)
    text = manifest_text(manifest)
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_manifest(out: str | os.PathLike[str], validate: bool = True) -> dict[str, Any]:
    """Read ``OUT/manifest.json``, refusing missing files and unsupported format versions.

    With ``validate`` it is also checked against the JSON Schema (the first violations
    together).  ``out`` may be a store URL: no manifest there means no pack.
    """
    if is_url(out):
        url = parse_url(str(out)).child(MANIFEST_NAME)
        if object_size(url) is None:
            raise ManifestError(
                f"{url}: no manifest (is {out} a packshard output? a pack still being "
                "published or interrupted has none: wait for it, or pack again)"
            )
        return parse_manifest(read_object(url), str(url), validate)
    path = Path(out) / MANIFEST_NAME
    try:
        inside_folder(out, MANIFEST_NAME)
    except FormatError as exc:
        if exc.problem != MISSING:
            raise ManifestError(f"{path}: {exc.problem.removesuffix(' (not read)')}") from None
        raise ManifestError(
            f"{path}: no manifest (is {out} a packshard output folder? a run that was "
            "interrupted leaves none: pack again)"
        ) from None
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError(f"{path}: unreadable manifest: {exc}") from None
    return parse_manifest(raw, str(path), validate)


def parse_manifest(raw: bytes, path: str, validate: bool = True) -> dict[str, Any]:
    """Parse a manifest's bytes read from ``path`` (a file or a store URL), checked as on load."""
    try:
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ValueError(f"larger than {MAX_MANIFEST_BYTES:,} bytes")
        manifest = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise ManifestError(f"{path}: unreadable manifest: nested too deeply") from None
    except ValueError as exc:  # JSON and UTF-8 errors are ValueErrors
        raise ManifestError(f"{path}: unreadable manifest: {exc}") from None
    if not isinstance(manifest, dict):
        raise ManifestError(f"{path}: manifest is not a JSON object")
    check_format_version(manifest.get("format_version"), path)
    if validate:
        problems = schema_errors(manifest)
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise ManifestError("; ".join(problems[:5]) + more)
    return manifest
