"""Find what a manifest recorded — inputs, tokenizer, template — again, and check their hashes.

Each recorded file is looked for as :mod:`packshard.verify.source` says; only a regular file
(a folder for the tokenizer) counts, and one whose SHA-256 differs from the recorded one is a
:class:`Mismatch`.

The files found are opened as a stage (:func:`~packshard.ingest.stage.open.open_stage`), with
the checks ``pack`` and ``profile`` run, on the options the manifest records::

    tokenizer found, its tokenizer.json hashed ─► template spec found ─► open_stage
        ─► the template's SHA-256 against the recorded one ─► Stage (or Mismatch)

``--allow-split-markers`` is not recorded (it changes no output): a pack that needed it
passed its marker check when it was made, so the stage is opened allowing split markers.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from packshard.digests import sha256_bytes, sha256_path
from packshard.ingest import Stage, open_stage
from packshard.verify.turns import recorded_options


def locate(
    recorded: str,
    root: str | None,
    resolved: Any = None,
    folder_ok: bool = False,
    sha256: str | None = None,
    digest: Any = sha256_path,
) -> tuple[Path | None, bool]:
    """Find a recorded file; with ``sha256``, the first candidate holding those bytes.

    Candidates as the module says; only a regular file (or, with ``folder_ok``, a folder)
    counts.  When none matches ``sha256`` the first existing one is returned with ``False``;
    ``(None, False)`` when nothing is found.
    """
    candidates = []
    if root:
        candidates += [Path(root) / recorded, Path(root) / Path(recorded).name]
    candidates.append(Path(recorded))
    if isinstance(resolved, str) and resolved:
        candidates.append(Path(resolved))
    found = []
    for path in candidates:
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(mode) or (folder_ok and stat.S_ISDIR(mode)):
            if sha256 is None:
                return path, True
            try:
                if digest(path) == sha256:
                    return path, True
            except OSError:
                pass
            found.append(path)
    return (found[0] if found else None), False


def open_recorded(manifest: dict[str, Any], options: Any) -> tuple[Stage | None, str | None]:
    """Open the recorded (or given) tokenizer and template: ``(stage, None)``, or ``(None, why)``.

    Raises:
        Mismatch: a file was found but its SHA-256 is not the recorded one, or the recorded
            template cannot be found.
        PackshardError: the stage does not open (its loads and checks).

    """
    recorded = manifest["tokenizer"]
    given = options.tokenizer or recorded["path"]
    resolved = None if options.tokenizer else recorded.get("resolved")
    path, _ = locate(given, options.source_root, resolved, True, recorded["sha256"], _json_sha)
    if path is None:
        return None, f"tokenizer {given} not found (give --tokenizer or --source-root)"
    json_path = path / "tokenizer.json" if path.is_dir() else path
    try:
        sha = sha256_path(json_path)  # before loading: a file that is not the one packed is
    except OSError as exc:  # never parsed
        raise Mismatch(f"tokenizer {json_path}: cannot be read ({exc.strerror})") from None
    if sha != recorded["sha256"]:
        raise Mismatch(
            f"tokenizer {path}: SHA-256 {sha[:12]}… differs from {recorded['sha256'][:12]}… "
            "recorded at pack time (a different tokenizer gives different ids)"
        )
    spec = _template_spec(manifest["template"], options)
    opts = recorded_options(manifest["config"])
    stage = open_stage(str(path), spec, opts, allow_split_markers=True)
    template, want = stage.template, manifest["template"].get("sha256")
    found = template.sha256 if template is not None else None
    if (template is not None or spec is not None) and found != want:
        shown = template.source if template else manifest["template"].get("source")
        raise Mismatch(
            f"template {shown}: SHA-256 {str(found)[:12]}… "
            f"differs from {str(want)[:12]}… recorded at pack time "
            "(the template was edited or replaced after packing)"
        )
    return stage, None


class Mismatch(Exception):
    """A recorded file was found but is not the one packed (its hash differs)."""


def _template_spec(recorded: dict[str, Any], options: Any) -> str | None:
    """Return the template spec to load: the given one, the recorded one found again, or None."""
    source = recorded.get("source")
    if options.template:
        return str(options.template)
    if source is None or source == "tokenizer_config.json":
        return None
    if source.startswith("builtin:"):
        return str(source.split(":", 1)[1])
    where = (recorded.get("resolved"), False, recorded.get("sha256"), _text_sha)
    found, _ = locate(source, options.source_root, *where)
    if found is None:
        raise Mismatch(f"template {source} not found (give --template or --source-root)")
    return str(found)


def _json_sha(path: Path) -> str:
    """SHA-256 of a tokenizer given as its ``tokenizer.json`` or its folder."""
    return sha256_path(path / "tokenizer.json" if path.is_dir() else path)


def _text_sha(path: Path) -> str:
    """SHA-256 of a template file's text as loaded (UTF-8, universal newlines)."""
    return sha256_bytes(path.read_text(encoding="utf-8").encode("utf-8"))
