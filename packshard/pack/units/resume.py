"""What ``--resume`` may reuse: a job fingerprint by part, and each unit's files by hash.

A finished unit is reused only when nothing that decides its bytes has changed since it was
made, and its files are the ones it wrote::

    job.json   {"fingerprint": H(parts), "parts": {name: H(part)}}
       options     every recorded option, plus --on-error, --batch-size, the unit size and
                   the input names in order (an --on-error skip unit holds rejects that
                   --on-error fail would have stopped at)
       libraries   packshard, its format version, Python, and every library whose version
                   :mod:`packshard.format.environment` records (tokenizers, jinja2, …)
       conventions the template-rendering conventions
       inputs      every input's SHA-256
       setup       the tokenizer and template files' SHA-256
    UNIT/unit.json  {"files": {"tokens.bin": sha256, "meta.npz": sha256, …}, …}

A part that differs: every unit is redone, and the run says which parts changed.  A unit
whose ``unit.json`` cannot be read, or whose files' hashes differ from those it recorded, is
redone alone, and the run says so — it is never mixed into the output.
"""

from __future__ import annotations

import json
import platform
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from packshard import __version__
from packshard.digests import sha256_bytes
from packshard.errors import OutputError
from packshard.format.environment import CONTENT_LIBRARIES, library_versions
from packshard.format.version import FORMAT_VERSION
from packshard.ingest import WorkUnit, template_conventions
from packshard.pack.units.stored import MARKER, MappedUnit, load_unit, unit_files

JOB = "job.json"
PART_NAMES = {
    "options": "options",
    "libraries": "library versions",
    "conventions": "template conventions",
    "inputs": "input contents",
    "setup": "tokenizer or template files",
}


def _digest(value: Any) -> str:
    return sha256_bytes(json.dumps(value, sort_keys=True).encode("utf-8"))


def job_parts(
    options: Mapping[str, Any], sources: Sequence[str], hashes: Sequence[str], setup: Any
) -> dict[str, str]:
    """Return the hash of each part of the job fingerprint (see the module docstring)."""
    libraries = {
        "packshard": __version__,
        "format_version": FORMAT_VERSION,
        "python": platform.python_version(),
        **library_versions(CONTENT_LIBRARIES),
    }
    return {
        "options": _digest({**options, "sources": list(sources)}),
        "libraries": _digest(libraries),
        "conventions": _digest(template_conventions()),
        "inputs": _digest(list(hashes)),
        "setup": _digest(setup),
    }


def open_work(
    work: Path, parts: Mapping[str, str], resume: bool, note: Callable[[str], None]
) -> None:
    """Make the work folder, or keep it when ``--resume`` may reuse its units.

    A link or a file where the folder goes is refused: packshard never writes through, nor
    removes, what it did not make.
    """
    fingerprint = _digest(dict(parts))
    job = work / JOB
    if work.is_symlink() or (work.exists() and not work.is_dir()):  # never followed, nor removed
        what = "a link" if work.is_symlink() else "not a folder"
        raise OutputError(
            f"{work}: {what}, where pack keeps its work units beside the output folder "
            "(remove it, or choose another -o)"
        )
    if resume and job.is_file():
        try:
            doc = json.loads(job.read_text(encoding="utf-8"))
            same = doc["fingerprint"] == fingerprint
            old = doc.get("parts", {})
            changed = [PART_NAMES[k] for k in parts if old.get(k) != parts[k]]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OSError):
            same, changed = False, ["the job record (unreadable)"]
        if same:
            return
        note(
            f"--resume: {', '.join(changed) or 'the job'} changed since the units in "
            f"{work.name} were made; every unit is redone"
        )
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    doc = {"fingerprint": fingerprint, "parts": dict(parts)}
    job.write_text(json.dumps(doc, sort_keys=True) + "\n", encoding="utf-8")


def reusable_unit(folder: Path, unit: WorkUnit, note: Callable[[str], None]) -> MappedUnit | None:
    """Return a finished unit when its marker reads and its files are the ones it recorded.

    Anything else: the unit's folder is removed (it is redone) and ``note`` says why.
    """
    if not (folder / MARKER).is_file():
        return None
    why = "its unit.json cannot be read"
    try:
        recorded = json.loads((folder / MARKER).read_text(encoding="utf-8"))["files"]
        result = load_unit(folder, unit)
        if recorded == unit_files(folder):
            return result
        why = "its files differ from those it recorded"
    except Exception:  # any malformed marker or arrays file: json, numpy, zip, type errors
        pass
    note(f"--resume: unit {folder.name} is redone ({why})")
    shutil.rmtree(folder, ignore_errors=True)
    return None
