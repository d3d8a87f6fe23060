"""Input specs to input files: files, folders and globs, expanded without losing anything.

A spec is a file, a folder (every supported file below it) or a glob (``*``, ``?``, ``[…]``,
``**`` for any number of folders).  The result keeps spec order, each spec's matches sorted,
and is deduplicated by real path.  Hidden entries (a name starting with ``.``) are skipped in
folders and by wildcards, as the shell does; files of other types are skipped in folders.

Nothing is skipped silently otherwise: a folder that cannot be listed, or a FIFO, socket or
device with a supported name, is a usage error naming it (globs are expanded here: ``glob``
passes over unreadable folders without a word).  Files are opened with
:func:`~packshard.ingest.read.regular.open_regular`.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packshard.errors import InputError, RecordError
from packshard.ingest.read.regular import special_file
from packshard.ingest.types import RawRecord
from packshard.records import SourceRef
from packshard.store.objects import glob_sized, list_objects, object_size, open_object
from packshard.store.stage import fetch_input
from packshard.store.urls import is_url, parse_url

EXPECTED = "expected .jsonl, .json, .parquet, optionally .gz/.zst"
_CODECS = (".gz", ".zst")
_TYPES = (".jsonl", ".json", ".parquet")
_MAGIC = frozenset("*?[")


@dataclass(frozen=True, slots=True)
class InputFile:
    """One input file: ``path`` as given or found (the recorded ``source``), ``real`` resolved.

    A store object left where it is (``expand_inputs(…, fetch=False)``: ``pack``, whose
    workers read their units from the store themselves) has its size from the listing in
    ``stored_size``; its ``real`` is then ``Path(path)``, a name that is never opened.
    """

    path: str
    real: Path
    stored_size: int | None = None

    @property
    def in_store(self) -> bool:
        """Whether the bytes are read from the store (not fetched to a local file)."""
        return self.stored_size is not None


def split_ext(name: str) -> tuple[str, str, str]:
    """Return ``(stem, type, codec)`` of a file name, e.g. ``("chat", ".jsonl", ".gz")``."""
    lower = name.lower()
    codec = next((ext for ext in _CODECS if lower.endswith(ext)), "")
    lower = lower[: len(lower) - len(codec)]
    kind = next((ext for ext in _TYPES if lower.endswith(ext)), "")
    return name[: len(name) - len(codec) - len(kind)], kind, codec


def _unsupported(path: str) -> str | None:
    """Why the file's name is no supported input type; None when it is one."""
    _, kind, codec = split_ext(os.path.basename(path))
    if kind == ".parquet" and codec:
        return f"Parquet is compressed inside; remove the outer {codec}"
    return None if kind else EXPECTED


def _check_type(path: str) -> None:
    if (why := _unsupported(path)) is not None:
        raise InputError(f"{path}: unsupported input type ({why})")


def _listing(folder: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise InputError(
            f"{folder}: cannot list folder ({exc.strerror or exc}); its files would be "
            "left out (fix its permissions or leave it out of the inputs)"
        ) from None


def _mode(path: str) -> int | None:
    try:
        return os.stat(path).st_mode
    except OSError:
        return None  # a broken link, or gone


def _regular(path: str, mode: int | None) -> str:
    """Return ``path``, a regular file by its ``mode``; refuse a broken link or special file."""
    if mode is None:
        raise InputError(
            f"{path}: broken link or unreadable entry (fix it or leave it out of the inputs)"
        )
    if not stat.S_ISREG(mode):
        raise special_file(path, mode)
    return path


def _walk(folder: str) -> list[tuple[str, bool]]:
    """Every supported file below ``folder`` and whether it is a link, sorted by path.

    Hidden entries are skipped.  Paths are spelled as ``str(Path(path))`` spells them, each
    folder's spelling worked out once (:func:`_spelled`).
    """
    files = ((p, m, k) for p, m, k in _below(folder) if m is None or not stat.S_ISDIR(m))
    found = [(_regular(p, m), k) for p, m, k in files if _unsupported(p) is None]
    heads: dict[str, str] = {}
    return [(_spelled(path, heads), link) for path, link in sorted(found)]


def _spelled(path: str, heads: dict[str, str]) -> str:
    """Return ``str(Path(path))`` for ``path`` = a folder joined with a plain entry name.

    The folder is spelled by ``Path`` once (``heads`` remembers it) and the name joined to it,
    not a ``Path`` parse per file.
    """
    head, name = os.path.split(path)
    spelled = heads.get(head)
    if spelled is None:
        spelled = heads[head] = str(Path(head))
    return name if spelled == "." else os.path.join(spelled, name)


def _glob(pattern: str) -> list[str]:
    """Expand ``pattern`` like ``glob.glob(recursive=True)``, refusing unreadable folders."""
    parts = pattern.split(os.sep)
    roots = [os.sep] if pattern.startswith(os.sep) else [""]
    parts = [p for p in parts if p] if pattern.startswith(os.sep) else parts
    for k, part in enumerate(parts):
        last = k == len(parts) - 1
        nxt: list[str] = []
        for root in roots:
            base = root or os.curdir
            if part == "**":  # any folders; last, any entries too (as glob does)
                nxt.append(os.path.join(root, "") if last and root else root)
                below = _below(root)  # every entry when last, else the folders
                nxt.extend(p for p, m, _ in below if last or (m is not None and stat.S_ISDIR(m)))
            elif not _MAGIC & set(part):
                path = os.path.join(root, part)
                if os.path.lexists(path) and (last or os.path.isdir(path)):
                    nxt.append(path)
            elif os.path.isdir(base):
                for entry in _listing(base):
                    hidden = entry.name.startswith(".") and not part.startswith(".")
                    if not hidden and fnmatch.fnmatchcase(entry.name, part):
                        path = os.path.join(root, entry.name)
                        if last or os.path.isdir(path):
                            nxt.append(path)
        roots = nxt
    return sorted({r for r in roots if r})


def _below(root: str) -> Iterator[tuple[str, int | None, bool]]:
    """Yield every non-hidden entry below ``root``: path, mode (None: broken or gone), link.

    Iterative, each folder listed once by identity (a link back to a parent cannot loop).  A
    regular file or folder takes its type from the listing (``d_type``), no ``stat``; a link
    or anything else is ``stat``-ed through.
    """
    stack, seen = [root], set()
    while stack:
        here = stack.pop()
        info = os.stat(here or os.curdir)
        if (info.st_dev, info.st_ino) in seen:
            continue
        seen.add((info.st_dev, info.st_ino))
        for entry in _listing(here or os.curdir):
            if entry.name.startswith("."):
                continue
            path = os.path.join(here, entry.name)
            link = entry.is_symlink()
            if not link and entry.is_file(follow_symlinks=False):
                mode: int | None = stat.S_IFREG
            elif not link and entry.is_dir(follow_symlinks=False):
                mode = stat.S_IFDIR
            else:
                mode = _mode(path)
            if mode is not None and stat.S_ISDIR(mode):
                stack.append(path)
            yield path, mode, link


def expand_inputs(specs: Sequence[str], fetch: bool = True) -> list[InputFile]:
    """Expand files, folders and globs into input files, in a deterministic order.

    See the module docstring; a file reached twice is kept once, at its first place.  Store
    objects are fetched, or with ``fetch`` False listed with their sizes only.

    Raises:
        InputError: a spec matches nothing, names an unsupported or special file, or reaches
            a folder that cannot be listed.

    """
    files: list[InputFile] = []
    seen: set[str] = set()  # resolved paths, which are canonical as strings
    folders: dict[str, Path] = {}
    for spec in specs:
        if is_url(spec):
            for url, size in _store_inputs(spec):
                if url not in seen:
                    seen.add(url)
                    if fetch:
                        files.append(InputFile(url, fetch_input(parse_url(url))))
                    else:
                        files.append(InputFile(url, Path(url), size))
            continue
        mode = _mode(spec)
        paths: list[tuple[str, bool | None]]  # each path, and whether it is a link (None: ask)
        if mode is not None and stat.S_ISDIR(mode):
            paths = list(_walk(spec))
            if not paths:
                raise InputError(f"{spec}: folder holds no input files ({EXPECTED})")
        elif mode is not None and stat.S_ISREG(mode):
            _check_type(spec)
            paths = [(spec, None)]
        elif _MAGIC & set(spec):
            paths = []
            for match in _glob(spec):
                found = _mode(match)
                if found is not None and stat.S_ISDIR(found):
                    paths.extend(_walk(match))
                else:
                    _check_type(match)
                    paths.append((_regular(match, found), None))
            if not paths:
                raise InputError(f"{spec}: pattern matches no input files (check the glob)")
        elif mode is not None:
            raise special_file(spec, mode)
        else:
            raise InputError(f"{spec}: no such file or folder")
        for path, link in paths:
            real = _resolved(path, folders, link)
            if str(real) not in seen:
                seen.add(str(real))
                files.append(InputFile(path, real))
    return files


def _store_inputs(spec: str) -> list[tuple[str, int]]:
    """Return the objects a URL spec names (an object, a prefix or a glob) and their sizes.

    The same rules as local specs; an object's recorded ``source`` is its URL.
    """
    url = parse_url(spec)
    if _MAGIC & set(url.key):
        found = glob_sized(url)
        for match, _ in found:
            _check_type(str(match))
        if not found:
            raise InputError(f"{spec}: pattern matches no input files (check the glob)")
    elif (size := object_size(url)) is not None:
        _check_type(spec)
        found = [(url, size)]
    else:
        below = [
            (u, n) for u, n in list_objects(url) if u.key.startswith(url.key + "/") or not url.key
        ]
        found = [
            (u, n)
            for u, n in below
            if _unsupported(u.key) is None
            and not any(p.startswith(".") for p in u.key[len(url.key) :].split("/"))
        ]
        if not found:
            what = "no input files" if below else "no objects"
            raise InputError(f"{spec}: no such object, and the prefix holds {what} ({EXPECTED})")
    return [(str(u), n) for u, n in found]


def _resolved(path: str, folders: dict[str, Path], link: bool | None = None) -> Path:
    """Return ``Path(path).resolve()``, each folder resolved once (``folders`` remembers them).

    A name that is no link resolves to its resolved folder joined with the name: one
    ``lstat`` (none when the listing said so, ``link`` False) instead of one per component.
    """
    head, name = os.path.split(path)
    if name in ("", ".", "..") or link or (link is None and os.path.islink(path)):
        return Path(path).resolve()
    base = folders.get(head)
    if base is None:
        base = folders[head] = Path(os.path.realpath(head or os.curdir))
    return base / name


def open_stored(f: InputFile) -> Any:
    """Open the store object ``f`` for sized and ranged reads, where this process runs.

    Each ``read(n)`` is one ranged request of ``n`` bytes (:mod:`packshard.store.objects`).

    Raises:
        InputError: the object cannot be opened (one line naming its URL).

    """
    return open_object(parse_url(f.path))


def file_domain(path: str) -> str:
    """Return the file's name without its known extensions (``chat.jsonl.gz`` -> ``chat``)."""
    name = os.path.basename(path)
    return split_ext(name)[0] or name


def reject_record(f: InputFile, line: int, code: str, reason: str) -> RawRecord:
    """Return the raw record that stands for a record of ``f`` rejected with ``code``."""
    return RawRecord(
        SourceRef(f.path, line), file_domain(f.path), None, RecordError(code, reason, f.path, line)
    )
