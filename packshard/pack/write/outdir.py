"""The output folder: what may be replaced, its lock, its temporary name, publishing.

``pack`` never destroys what it did not write and never reads what it writes::

    OUT                          must not be, contain or lie inside an input file or folder,
                                 nor be matched by an input glob (a rerun would read it)
    OUT exists                   empty: used;  written by packshard (a manifest, and only the
                                 files it names): replaced with --overwrite;  anything else:
                                 refused, with or without --overwrite
    .NAME.lock        beside OUT held (flock) for the whole run; a second run on the same OUT
                                 fails at once naming the first one's process
    .NAME.partial-PID beside OUT  the run writes here, renamed to OUT when complete
    .NAME.old-PID     beside OUT  the replaced OUT, during the swap only

``NAME`` is OUT's name, or for a name too long to take the suffixes within ``NAME_MAX``
(255 bytes), its start and a hash of the whole.  Leftover ``.partial`` / ``.old`` folders of a
process that is gone are removed by the next run on the same OUT, which says so; an ``.old``
folder left where OUT itself is missing (a crash in the middle of the swap) is put back first.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import shutil
import socket
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from packshard.errors import OutputError
from packshard.format.manifest import MANIFEST_NAME
from packshard.ingest.read.sources import InputFile

NAME_MAX = 255
CARD_NAME = "README.md"  # a dataset card packshard may write beside the files the manifest names
_SUFFIX_ROOM = len(".partial-") + 10  # the longest suffix, with a 10-digit process id
_OUTPUT_NAMES = ("rejects.jsonl", "examples.parquet", "shard-00000.parquet", MANIFEST_NAME)


def temp_stem(name: str) -> str:
    """Return the part of OUT's name its hidden companions use (its start and a hash if long)."""
    if len(os.fsencode(name)) + 1 + _SUFFIX_ROOM <= NAME_MAX:
        return name
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
    keep = name
    while len(os.fsencode(keep)) + 18 + _SUFFIX_ROOM > NAME_MAX:
        keep = keep[:-1]
    return f"{keep}~{digest}"


def written_by_packshard(folder: Path) -> str | None:
    """Say why ``folder`` is not a folder packshard wrote, or None when it is (or is empty)."""
    try:
        entries = sorted(os.listdir(folder))
    except OSError as exc:
        return f"cannot be listed ({exc.strerror})"
    if not entries:
        return None
    manifest = folder / MANIFEST_NAME
    try:
        if not stat.S_ISREG(os.stat(manifest).st_mode) or manifest.stat().st_size > 64 << 20:
            raise ValueError
        data = json.loads(manifest.read_text(encoding="utf-8"))
        names = {MANIFEST_NAME, CARD_NAME}
        names |= {str(e["path"]) for e in data["files"].values()}
        names |= {str(e["path"]) for e in data["shards"]}
        if "dataset_id" not in data:
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return f"holds {_listed(entries)} but no packshard manifest"
    others = [e for e in entries if e not in names or not (folder / e).is_file()]
    if others:
        return f"holds {_listed(others)}, which packshard did not write"
    return None


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check_out(out: str, overwrite: bool) -> None:
    """Refuse an OUT that cannot be written or replaced (before any work starts)."""
    path = Path(out)
    for above in (path, *path.parents):
        if above.exists() and not above.is_dir():
            where = "" if above == path else f" ({above} is a file)"
            raise OutputError(f"{out}: not a folder{where}; choose another -o")
    if not path.exists():
        return
    why = written_by_packshard(path)
    if why is not None:
        raise OutputError(
            f"{out}: output folder {why}; --overwrite only replaces a folder packshard "
            "wrote (choose another -o, or empty it)"
        )
    if any(path.iterdir()) and not overwrite:
        raise OutputError(f"{out}: output folder exists and is not empty (use --overwrite)")


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


def check_overlap(out: str, specs: Sequence[str], files: Sequence[InputFile]) -> None:
    """Refuse an OUT that is, holds or lies inside an input, or that an input glob matches."""
    real, given = os.path.realpath(out), os.path.abspath(out)
    for f in files:
        if _inside(str(f.real), real):
            raise OutputError(
                f"{out}: output folder holds the input {f.path} (choose an -o outside the inputs)"
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return pid != os.getpid()


@dataclass
class Claim:
    """A locked OUT: where to write (``tmp``) and what the preparation did (``notes``)."""

    out: Path
    tmp: Path
    stem: str
    notes: list[str] = field(default_factory=list)
    notify: Callable[[str], None] | None = None

    def note(self, text: str) -> None:
        """Say what was done: at once through ``notify``, else kept in ``notes``."""
        if self.notify is not None:
            self.notify(text)
        else:
            self.notes.append(text)

    def publish(self) -> None:
        """Move the finished folder into place, replacing an old one only when complete."""
        out = self.out
        if out.exists():
            why = written_by_packshard(out)
            if why is not None:  # something appeared there during the run
                raise OutputError(f"{out}: output folder {why}; it was left as it is")
            old = self.tmp.parent / f".{self.stem}.old-{os.getpid()}"
            os.replace(out, old)
            try:
                os.replace(self.tmp, out)
            except BaseException:
                os.replace(old, out)
                raise
            _remove(old)
        else:
            os.replace(self.tmp, out)


def _remove(path: Path) -> None:
    """Remove a folder packshard made (a link is removed, never what it points to)."""
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def _lock(out: Path, path: Path) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OutputError(
                f"{out}: cannot write beside the output folder ({exc.strerror}); choose another -o"
            ) from None
        import fcntl

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 256, 0).decode(errors="replace").split()
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            who = f"process {holder[0]} on {holder[1]}" if len(holder) >= 2 else "another run"
            raise OutputError(
                f"{out}: another packshard pack ({who}) is writing this output folder (lock "
                f"{path.name}); wait for it to finish or choose another -o"
            ) from None
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        mine = os.fstat(fd)
        if current is not None and (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
            return fd
        os.close(fd)  # the previous holder removed the file as we opened it: lock afresh


def _clean(claim: Claim) -> None:
    """Remove what interrupted runs left beside OUT; put back an OUT lost mid-swap."""
    parent, stem = claim.tmp.parent, claim.stem
    for name in sorted(os.listdir(parent)):
        for kind in ("old", "partial"):
            prefix = f".{stem}.{kind}-"
            pid = name[len(prefix) :]
            if not name.startswith(prefix) or not pid.isdigit() or _alive(int(pid)):
                continue
            path = parent / name
            if kind == "old" and not claim.out.exists():
                os.replace(path, claim.out)
                claim.note(f"put back {claim.out} from {name} (a replace was interrupted)")
            else:
                _remove(path)
                claim.note(f"removed {name} left by an interrupted run (process {pid})")


@contextmanager
def claim_out(
    out: str,
    overwrite: bool,
    specs: Sequence[str],
    files: Sequence[InputFile],
    notify: Callable[[str], None] | None = None,
) -> Iterator[Claim]:
    """Lock OUT, check it again, clean up after interrupted runs, and make the temp folder.

    What the clean-up did goes to ``notify`` as it happens (else to ``Claim.notes``).  On
    leaving, the temp folder is removed (it is gone already once published) and the lock
    released.
    """
    path, place = Path(out), Path(os.path.abspath(out))  # place: "." has a name and a parent
    check_overlap(out, specs, files)
    try:
        place.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{out}: cannot create its parent folder ({exc.strerror})") from None
    stem = temp_stem(place.name)
    lock = place.parent / f".{stem}.lock"
    fd = _lock(path, lock)
    claim = Claim(path, place.parent / f".{stem}.partial-{os.getpid()}", stem, notify=notify)
    try:
        _clean(claim)
        check_out(out, overwrite)
        try:
            claim.tmp.mkdir()
        except OSError as exc:
            raise OutputError(f"{out}: cannot create {claim.tmp.name} ({exc.strerror})") from None
        try:
            yield claim
        finally:
            shutil.rmtree(claim.tmp, ignore_errors=True)
    finally:
        try:
            os.unlink(lock)
        finally:
            os.close(fd)
