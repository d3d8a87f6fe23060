"""Publishing a pack on a store that has no rename: a lock, the files, the manifest last.

Locally OUT is filled under a temporary name and renamed into place.  A store has no rename,
so OUT is written where it lives, in an order that keeps a reader's one rule ("a folder with a
manifest is a pack") true at every moment::

    1 create OUT/.packshard-lock  If-None-Match: *     a second writer is refused here
      create it again: must be refused                 the control (packshard.store.writes)
    2 the command writes OUT into a local staging folder (the same code, the same bytes)
    3 replacing a pack (--overwrite): its manifest.json deleted first, then its files
    4 every file but the manifest uploaded; each object's size checked against its file
    5 manifest.json created If-None-Match: *           the pack appears, whole, at once
    6 the lock deleted (only if it is still this job's)

A job interrupted before 5 leaves no manifest, so no reader takes what it left for a pack;
one killed outright leaves its lock, and the next writer is refused, naming it, until someone
deletes it (a lock is never broken by a guess).  An OUT holding objects but no manifest is
refused rather than mixed with.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from packshard.errors import OutputError, PackshardError
from packshard.store.objects import list_objects, object_size, read_object
from packshard.store.stage import LOCK_NAME, MANIFEST_NAME
from packshard.store.urls import StoreUrl, parse_url
from packshard.store.writes import check_conditional, create_object, delete_created, upload_file


@dataclass
class StoreOut:
    """An OUT on a store, claimed: where to write it locally first, and what it replaces."""

    url: StoreUrl
    stage: Path
    """The local folder the command writes OUT into (it does not exist yet)."""
    replaced: list[StoreUrl] = field(default_factory=list)
    """The objects of the pack being replaced (``--overwrite``), its manifest first."""


def _holder(lock: StoreUrl) -> str:
    try:
        info = json.loads(read_object(lock))
        return f"{info['command']} on {info['host']} pid {info['pid']} since {info['started']}"
    except (PackshardError, ValueError, KeyError, TypeError):  # gone meanwhile, or not ours
        return "another job"


def _replaced(url: StoreUrl, overwrite: bool) -> list[StoreUrl]:
    """Return the objects a new pack at ``url`` replaces; refuse an OUT it may not write."""
    found = [u for u, _ in list_objects(url) if not u.key.endswith("/" + LOCK_NAME)]
    if not found:
        return []
    manifest = url.child(MANIFEST_NAME)
    if manifest not in found:
        raise OutputError(
            f"{url}: holds {len(found)} objects but no manifest.json (not a pack, or one whose "
            "publishing was interrupted): delete them or choose another OUT"
        )
    if not overwrite:
        raise OutputError(f"{url}: holds a pack (use --overwrite to replace it, or another OUT)")
    try:
        old = json.loads(read_object(manifest))
        named = [e["path"] for e in old.get("shards", [])]
        named += [e["path"] for e in old.get("files", {}).values()]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise OutputError(
            f"{manifest}: unreadable manifest, so what it owns is unknown (delete OUT's objects "
            "yourself, or choose another OUT)"
        ) from None
    names = {str(n) for n in named if isinstance(n, str)}
    return [manifest] + [
        u for u in found if u != manifest and u.key[len(url.key) :].lstrip("/") in names
    ]


@contextmanager
def claim_store(spec: str, overwrite: bool, command: str) -> Iterator[StoreOut]:
    """Lock the OUT at URL ``spec`` for the block and give a local staging folder for it.

    Raises:
        OutputError: another job holds the lock, the store cannot make writes conditional,
            or OUT holds what may not be replaced.

    """
    url = parse_url(spec)
    lock = url.child(LOCK_NAME)
    body = json.dumps(
        {
            "command": command,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "token": uuid.uuid4().hex,
        },
        sort_keys=True,
    ).encode()
    if not create_object(lock, body):
        raise OutputError(
            f"{url}: another job is writing it ({_holder(lock)}; lock {lock}): wait for it, "
            "or delete the lock if that job is gone"
        )
    try:
        check_conditional(lock, body)
        replaced = _replaced(url, overwrite)
        folder = Path(tempfile.mkdtemp(prefix="packshard-stage-"))
        try:
            yield StoreOut(url, folder / (url.key.rsplit("/", 1)[-1] or url.bucket), replaced)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        try:
            if read_object(lock) == body:  # still ours: a lock deleted by hand stays deleted
                delete_created(lock)
        except PackshardError:  # the lock is gone already: nothing to release
            pass


def publish_store(out: StoreOut, folder: Path) -> list[str]:
    """Upload the finished local pack ``folder`` to ``out``, its manifest last; return the names.

    Raises:
        OutputError: an upload failed or came out short, or another manifest appeared at OUT
            meanwhile (its lock deleted by hand): nothing of this pack is published then.

    """
    names = sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and not p.is_symlink()
    )
    if MANIFEST_NAME not in names:
        raise OutputError(f"{folder}: no manifest.json to publish (the local pack is incomplete)")
    for old in out.replaced:  # the manifest first: the old pack stops being one at once
        delete_created(old)
    for name in names:
        if name == MANIFEST_NAME:
            continue
        target = out.url.child(name)
        size = upload_file(folder / name, target)
        if object_size(target) != size:
            raise OutputError(f"{target}: {object_size(target)} bytes stored, {size} written")
    if not create_object(out.url.child(MANIFEST_NAME), (folder / MANIFEST_NAME).read_bytes()):
        raise OutputError(
            f"{out.url.child(MANIFEST_NAME)}: another pack was published here meanwhile (its "
            "lock was deleted by hand); this one is not published"
        )
    return names
