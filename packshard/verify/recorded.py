"""What a pack was made from, found again: its inputs, tokenizer and template, hash-checked.

The manifest records each input's path as given and its SHA-256, the tokenizer's path and
hash, and the template's source and hash.  :func:`locate` looks for a recorded path as it is,
then under ``--source-root`` (the same relative path, then the file name); the tokenizer and
template may also be given explicitly.  A file found with another hash is a :class:`Mismatch`:
the source check must not compare against a different tokenizer or an edited template.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packshard.digests import sha256_path
from packshard.ingest.templates import ChatTemplate, load_template
from packshard.ingest.tokenizer import TokenizerBundle, load_tokenizer


def locate(recorded: str, root: str | None) -> Path | None:
    """Return the recorded path, else the same path or file name under ``root``, if it exists."""
    candidates = [Path(recorded)]
    if root:
        candidates += [Path(root) / recorded, Path(root) / Path(recorded).name]
    return next((p for p in candidates if p.exists()), None)


def resolve_tokenizer(
    manifest: dict[str, Any], options: Any
) -> tuple[TokenizerBundle | None, str | None]:
    """Load the recorded (or given) tokenizer; ``(None, why)`` when it is not found.

    Raises:
        Mismatch: the tokenizer found is not the one recorded (its SHA-256 differs).

    """
    recorded = manifest["tokenizer"]
    path = locate(options.tokenizer or recorded["path"], options.source_root)
    if path is None:
        return None, f"tokenizer {recorded['path']} not found (give --tokenizer or --source-root)"
    bundle = load_tokenizer(str(path))
    json_path = path / "tokenizer.json" if path.is_dir() else path
    sha = sha256_path(json_path)
    if sha != recorded["sha256"]:
        raise Mismatch(
            f"tokenizer {path}: SHA-256 {sha[:12]}… differs from {recorded['sha256'][:12]}… "
            "recorded at pack time (a different tokenizer gives different ids)"
        )
    return bundle, None


class Mismatch(Exception):
    """A recorded file was found but is not the one the pack was made with."""


def resolve_template(
    manifest: dict[str, Any], bundle: TokenizerBundle, options: Any
) -> ChatTemplate | None:
    """Load the recorded (or given) chat template, ``None`` for a pack made without one.

    Raises:
        Mismatch: the template is not found, or is not the one recorded.

    """
    recorded = manifest["template"]
    source = recorded.get("source")
    if source is None and options.template is None:
        return None
    if options.template:
        spec: str | None = options.template
    elif source == "tokenizer_config.json":
        spec = None
    elif source.startswith("builtin:"):
        spec = source.split(":", 1)[1]
    else:
        found = locate(source, options.source_root)
        if found is None:
            raise Mismatch(f"template {source} not found (give --template or --source-root)")
        spec = str(found)
    template = load_template(spec, bundle)
    sha = template.sha256 if template is not None else None
    if sha != recorded.get("sha256"):
        raise Mismatch(
            f"template {template.source if template else source}: SHA-256 {str(sha)[:12]}… "
            f"differs from {str(recorded.get('sha256'))[:12]}… recorded at pack time "
            "(the template was edited or replaced after packing)"
        )
    return template
