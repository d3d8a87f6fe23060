"""Claiming an output folder: its lock, its temporary name, clean-up, publishing.

Every command that writes a folder claims it here, after :mod:`packshard.format.folder.outdir`'s
checks, on the place OUT was resolved to once::

    .NAME.lock        beside OUT held (flock) for the whole run; a second run on the same OUT
                                 fails at once naming the first one's process and
                                 command.  Opened with O_NOFOLLOW: a link planted there is
                                 refused, never written through
    .NAME.partial-PID beside OUT  the run writes here, renamed to OUT when complete (an
                                 empty OUT is kept and filled, the manifest last)
    .NAME.old-PID     beside OUT  the replaced OUT, during the swap only
    .NAME.rejects.jsonl beside OUT  the rejects of a run that packed nothing (it publishes
                                 no folder); removed by the next run that publishes

``NAME`` is OUT's name (or, too long for the suffixes within 255 bytes, its start and a
hash).  Leftovers of a process that is gone are removed by the next run on the same OUT,
which says so (an ``.old`` left where OUT is missing is put back first); one that cannot be
removed stops the run with one line naming it.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from packshard.errors import OutputError
from packshard.format.folder.outdir import (
    check_out,
    check_overlap,
    resolve_out,
    temp_stem,
    written_by_packshard,
)
from packshard.format.manifest import MANIFEST_NAME
from packshard.format.rejects import REJECTS_NAME


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
    """A locked OUT: where to write (``tmp``) and what the preparation did (``notes``).

    ``out`` is OUT as the user gave it (for messages); ``place`` is where it was resolved to,
    which every rename uses.
    """

    out: Path
    tmp: Path
    stem: str
    place: Path
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
        out = self.place
        if os.path.lexists(out):
            why = written_by_packshard(out)
            if why is not None:  # something appeared there during the run
                raise OutputError(f"{self.out}: output folder {why}; it was left as it is")
            if not any(os.scandir(out)):  # an empty OUT (perhaps the current folder): filled
                _fill(self.tmp, out)
                self._drop_kept()
                return
            old = self.tmp.parent / f".{self.stem}.old-{os.getpid()}"
            os.replace(out, old)
            try:
                os.replace(self.tmp, out)
            except BaseException:
                os.replace(old, out)
                raise
            problem = _remove(old)
            if problem is not None:
                raise OutputError(
                    f"{self.out}: the new pack is in place, but the old one could not be "
                    f"removed: {old.name} beside it ({problem}); make it writable and remove it"
                )
        else:
            os.replace(self.tmp, out)
        self._drop_kept()

    def _drop_kept(self) -> None:
        """Remove the rejects an earlier run that published nothing kept beside OUT."""
        kept = self.tmp.parent / f".{self.stem}.{REJECTS_NAME}"
        if kept.is_file() and not kept.is_symlink():  # an earlier run's, now out of date
            kept.unlink()

    def keep(self, name: str) -> Path:
        """Move ``name`` out of the temp folder to ``.NAME.<name>`` beside OUT; return it.

        For a run that publishes nothing but has something to show (its rejects).
        """
        kept = self.tmp.parent / f".{self.stem}.{name}"
        os.replace(self.tmp / name, kept)
        return kept


def _fill(tmp: Path, out: Path) -> None:
    """Move the finished files of ``tmp`` into the empty folder ``out``, the manifest last.

    An empty OUT is kept, not swapped (it may be the shell's current folder, ``pack -o .``);
    the manifest comes last, so no reader sees a partial pack as a whole one.
    """
    names = sorted(os.listdir(tmp), key=lambda name: name == MANIFEST_NAME)
    for name in names:
        os.replace(tmp / name, out / name)


def _remove(path: Path) -> str | None:
    """Remove a folder packshard made (a link is removed, never what it points to).

    Returns None once it is gone, else why it is not (the first error met).
    """
    if path.is_symlink():
        path.unlink()
        return None
    errors: list[str] = []

    def failed(*args: object) -> None:
        exc = args[-1]
        exc = exc[1] if isinstance(exc, tuple) else exc
        errors.append(getattr(exc, "strerror", None) or str(exc))

    shutil.rmtree(path, onerror=failed)
    return errors[0] if errors and os.path.lexists(path) else None


@contextmanager
def _locked(out: Path, path: Path, command: str) -> Iterator[None]:
    """Hold the lock file ``path`` beside ``out`` for the block; remove it after.

    The lock file holds the holder's process id, host and command (``pack``, ``export``,
    ``reference``), so a second run names the command that holds it, not its own.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    while True:
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OutputError(
                    f"{out}: {path.name} beside the output folder is a link (remove it, or "
                    "choose another -o)"
                ) from None
            raise OutputError(
                f"{out}: cannot write beside the output folder ({exc.strerror}); choose another -o"
            ) from None
        import fcntl

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OutputError(
                f"{out}: {path.name} beside the output folder is not a regular file (remove "
                "it, or choose another -o)"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 256, 0).decode(errors="replace").split()
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            who = f"another packshard {holder[2] if len(holder) >= 3 else 'run'}"  # the holder's
            if len(holder) >= 2:
                who += f" (process {holder[0]} on {holder[1]})"
            raise OutputError(
                f"{out}: {who} is writing this output folder (lock {path.name}); wait for it "
                "to finish or choose another -o"
            ) from None
        try:
            current = os.lstat(path)
        except FileNotFoundError:
            current = None
        mine = os.fstat(fd)
        if current is not None and (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {command}\n".encode(), 0)
            break
        os.close(fd)  # the previous holder removed the file as we opened it: lock afresh
    try:
        yield
    finally:
        try:
            os.unlink(path)
        finally:
            os.close(fd)


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
            if kind == "old" and not os.path.lexists(claim.place):
                os.replace(path, claim.place)
                claim.note(f"put back {claim.out} from {name} (a replace was interrupted)")
            else:
                problem = _remove(path)
                if problem is not None:
                    raise OutputError(
                        f"{claim.out}: cannot remove {name} beside it, left by an interrupted "
                        f"run ({problem}); make it writable and remove it"
                    )
                claim.note(f"removed {name} left by an interrupted run (process {pid})")


@contextmanager
def claim_out(
    out: str,
    overwrite: bool,
    specs: Sequence[str],
    files: Sequence[tuple[str, str]],
    notify: Callable[[str], None] | None = None,
    command: str = "pack",
) -> Iterator[Claim]:
    """Lock OUT, check it again, clean up after interrupted runs, and make the temp folder.

    ``specs`` and ``files`` are the command's inputs.  The clean-up's notes go to ``notify``
    (else ``Claim.notes``).  On leaving, the temp folder is removed and the lock released.
    """
    path = Path(out)
    for above in (path, *path.parents):  # a file on the way: say so before resolving
        if os.path.lexists(above) and not above.is_dir():
            check_out(out, overwrite)
    place = resolve_out(out)
    check_overlap(out, specs, files, place)
    try:
        place.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{out}: cannot create its parent folder ({exc.strerror})") from None
    stem = temp_stem(place.name)
    with _locked(path, place.parent / f".{stem}.lock", command):
        tmp = place.parent / f".{stem}.partial-{os.getpid()}"
        claim = Claim(path, tmp, stem, place, notify=notify)
        _clean(claim)
        check_out(out, overwrite, place)
        try:
            claim.tmp.mkdir()
        except OSError as exc:
            raise OutputError(f"{out}: cannot create {claim.tmp.name} ({exc.strerror})") from None
        try:
            yield claim
        finally:
            shutil.rmtree(claim.tmp, ignore_errors=True)


@contextmanager
def amend_out(out: str | os.PathLike[str], name: str, command: str) -> Iterator[Path]:
    """Lock a finished OUT to add the file ``name`` to it; yield OUT resolved.

    It takes OUT's lock, proves packshard wrote OUT, then lets the caller write ``name``
    through :func:`publish_file` and rewrite the manifest.  A ``name`` left unlisted by an
    interrupted earlier amend is the one file tolerated.
    """
    place = resolve_out(out)
    if not (place / "manifest.json").is_file():
        raise OutputError(f"{out}: no manifest.json (give the OUT folder that pack wrote)")
    with _locked(Path(out), place.parent / f".{temp_stem(place.name)}.lock", command):
        why = written_by_packshard(place)
        if why is not None and why != f"holds {name!r}, which packshard did not write":
            raise OutputError(f"{out}: {why}; only a folder packshard wrote can be amended")
        yield place


def publish_file(folder: Path, name: str, write: Callable[[Path], None]) -> Path:
    """Write ``folder/name`` atomically: ``write`` fills a temporary file beside OUT, renamed in.

    The temporary file is ``.NAME.<name>.partial-PID`` beside OUT (same file system), never
    inside it: an interrupted write leaves OUT as it was.
    """
    final = folder / name
    tmp = folder.parent / f".{temp_stem(folder.name)}.{name}.partial-{os.getpid()}"
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()
    return final
