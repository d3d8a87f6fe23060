"""The output folder of any command: where it may be, and what may be replaced.

Every command that writes a folder (``pack``, ``export``) goes through these checks, with its
inputs given as plain paths (for ``export`` the input is the packed folder)::

    OUT                          must not be, contain or lie inside an input file or folder,
                                 nor be matched by an input glob (a rerun would read it)
    OUT exists                   empty: used;  written by packshard: replaced with --overwrite;
                                 anything else: refused, with or without --overwrite;
                                 read-only (itself or a folder in it): refused, since
                                 neither filling nor replacing it could finish

"Written by packshard" is proven, not guessed from a few keys:

    a pack      manifest.json valid against its JSON Schema; every file it names a regular
                file inside OUT of the recorded size; every Parquet file it names carries the
                manifest's dataset id in its metadata; nothing else but the dataset card
    an export   export.json naming every other file (regular files only) with its SHA-256,
                and each file's SHA-256 matching

OUT is resolved once (:func:`resolve_out`) and every later step uses that place, so a parent
swapped during the run cannot send a rename elsewhere.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from packshard.digests import sha256_path
from packshard.errors import OutputError
from packshard.format.card import CARD_NAME
from packshard.format.folder.paths import inside_folder
from packshard.format.manifest import MANIFEST_NAME, load_manifest
from packshard.format.version import metadata_problem

NAME_MAX = 255
EXPORT_INFO = "export.json"  # an export's record of the files it wrote, with their SHA-256
_SUFFIX_ROOM = len(".partial-") + 10  # the longest suffix, with a 10-digit process id
_OUTPUT_NAMES = ("rejects.jsonl", "examples.parquet", "shard-00000.parquet", MANIFEST_NAME)
_MAX_INFO_BYTES = 64 << 20


def temp_stem(name: str) -> str:
    """Return the part of OUT's name its hidden companions use (its start and a hash if long)."""
    if len(os.fsencode(name)) + 1 + _SUFFIX_ROOM <= NAME_MAX:
        return name
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
    keep = name
    while len(os.fsencode(keep)) + 18 + _SUFFIX_ROOM > NAME_MAX:
        keep = keep[:-1]
    return f"{keep}~{digest}"


def resolve_out(out: str | os.PathLike[str]) -> Path:
    """Return OUT as the real folder it lies in plus its own name (OUT itself not followed)."""
    text = os.fspath(out)
    head, name = os.path.split(text.rstrip(os.sep) or text)
    if name in ("", ".", ".."):
        return Path(os.path.realpath(text))
    return Path(os.path.realpath(head or ".")) / name


def _regular(folder: Path, name: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(folder / name).st_mode)
    except OSError:
        return False


def _pack_names(folder: Path) -> set[str]:
    """Return the names a pack in ``folder`` wrote; raise ValueError when it is not one."""
    try:
        manifest = load_manifest(folder, validate=True)
        dataset_id = manifest["dataset_id"]
        entries = [*manifest["files"].values(), *manifest["shards"]]
        for entry in entries:
            path = inside_folder(folder, entry["path"])
            if "bytes" in entry and os.stat(path).st_size != entry["bytes"]:
                raise ValueError
            if entry["path"].endswith(".parquet"):
                import pyarrow.parquet as pq

                if metadata_problem(pq.read_schema(path).metadata, dataset_id) is not None:
                    raise ValueError
    except Exception as exc:  # a bad manifest or file; an unreadable Parquet footer: many kinds
        raise ValueError from exc
    return {MANIFEST_NAME, CARD_NAME} | {str(e["path"]) for e in entries}


def _export_names(folder: Path) -> set[str]:
    """Return the names an export in ``folder`` wrote; raise ValueError when it is not one."""
    path = folder / EXPORT_INFO
    try:
        if not _regular(folder, EXPORT_INFO) or os.lstat(path).st_size > _MAX_INFO_BYTES:
            raise ValueError
        info = json.loads(path.read_bytes().decode("utf-8"))
        files = info["files"]
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise ValueError
        for name, digest in files.items():
            if "/" in name or not _regular(folder, name) or sha256_path(folder / name) != digest:
                raise ValueError
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ValueError from exc
    return {EXPORT_INFO, *files}


def written_by_packshard(folder: Path) -> str | None:
    """Say why ``folder`` is not a folder packshard wrote, or None when it is (or is empty)."""
    try:
        entries = sorted(os.listdir(folder))
    except OSError as exc:
        return f"cannot be listed ({exc.strerror})"
    if not entries:
        return None
    reader = _export_names if EXPORT_INFO in entries and MANIFEST_NAME not in entries else None
    try:
        names = (reader or _pack_names)(folder)
    except ValueError:
        what = "export record" if reader else "manifest"
        return f"holds {_listed(entries)} but no packshard {what}"
    others = [e for e in entries if e not in names or not _regular(folder, e)]
    if others:
        return f"holds {_listed(others)}, which packshard did not write"
    return None


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check_out(out: str, overwrite: bool, place: Path | None = None) -> None:
    """Refuse an OUT that cannot be written or replaced (``place``: OUT resolved once)."""
    path = place if place is not None else Path(out)
    shown = Path(out)
    for above, named in zip((path, *path.parents), (shown, *shown.parents), strict=False):
        if above.exists() and not above.is_dir():
            where = "" if above == path else f" ({named} is a file)"
            raise OutputError(f"{out}: not a folder{where}; choose another -o")
    if not path.exists():
        return
    locked = _read_only(path)
    if locked is not None:
        raise OutputError(
            f"{out}: {locked} is read-only, so the pack cannot be written or replaced "
            "there (make it writable with chmod -R u+w, or choose another -o)"
        )
    why = written_by_packshard(path)
    if why is not None:
        raise OutputError(
            f"{out}: output folder {why}; --overwrite only replaces a folder packshard "
            "wrote (choose another -o, or empty it)"
        )
    if any(path.iterdir()) and not overwrite:
        raise OutputError(f"{out}: output folder exists and is not empty (use --overwrite)")


def _read_only(path: Path) -> str | None:
    """Name the first folder in ``path`` (itself, then those inside) this process cannot write.

    None when every one is writable: replacing OUT removes every file in it, and filling an
    empty OUT adds files to it.
    """
    for folder, subfolders, _ in os.walk(path):
        if not os.access(folder, os.W_OK | os.X_OK):
            return "the output folder" if folder == os.fspath(path) else os.fspath(folder)
        subfolders[:] = [d for d in subfolders if not os.path.islink(os.path.join(folder, d))]
    return None


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _glob_matches(pattern: str, path: str) -> bool:
    """Tell whether an input glob (``**`` for any folders) would match ``path``."""
    parts, names = os.path.abspath(pattern).split(os.sep), path.split(os.sep)

    def match(i: int, j: int) -> bool:
        if i == len(parts):
            return j == len(names)
        if parts[i] == "**":
            return any(match(i + 1, k) for k in range(j, len(names) + 1))
        hidden = j < len(names) and names[j].startswith(".") and not parts[i].startswith(".")
        ok = j < len(names) and not hidden and fnmatch.fnmatchcase(names[j], parts[i])
        return ok and match(i + 1, j + 1)

    return match(0, 0)


def check_overlap(
    out: str, specs: Sequence[str], files: Sequence[tuple[str, str]], place: Path | None = None
) -> None:
    """Refuse an OUT that is, holds or lies inside an input, or that an input glob matches.

    ``specs`` are the inputs as given (files, folders, globs); ``files`` the input files
    found, each as (the name to show, its real path).
    """
    real = os.path.realpath(place if place is not None else out)
    given = os.path.abspath(out)
    for shown, file_real in files:
        if _inside(file_real, real):
            raise OutputError(
                f"{out}: output folder holds the input {shown} (choose an -o outside the inputs)"
            )
    for spec in specs:
        if os.path.isdir(spec):
            folder = os.path.realpath(spec)
            if _inside(real, folder) or _inside(folder, real):
                where = "lies inside" if _inside(real, folder) else "holds"
                raise OutputError(
                    f"{out}: output folder {where} the input folder {spec} (a later run would "
                    "read its own output; choose an -o outside the inputs)"
                )
        elif any(c in spec for c in "*?["):
            for base in {real, given}:
                reached = [os.path.join(base, name) for name in _OUTPUT_NAMES]
                reached += [str(p) for p in (Path(base), *Path(base).parents)]  # walked folders
                if any(_glob_matches(spec, p) for p in reached):
                    raise OutputError(
                        f"{out}: the input pattern {spec} reaches the output folder (a later "
                        "run would read its own output; choose an -o outside it)"
                    )


def work_folder(out: Path) -> Path:
    """Where the units of a pack into ``out`` live: ``.OUT.units`` beside it.

    OUT is resolved first (:func:`resolve_out`): ``-o .`` gives ``../.NAME.units``, never a
    folder inside OUT; a name too long takes its start and a hash.
    """
    place = resolve_out(out)
    return place.parent / f".{temp_stem(place.name)}.units"
