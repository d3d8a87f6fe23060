"""Local copies of store objects for the stages that read local files.

Stages that hash and cut inputs on local files fetch an ``s3://`` input once per process into
a staging folder (removed when the process ends; the recorded ``source`` stays the URL);
``verify`` and ``export`` of an OUT on a store fetch the pack whole::

    s3://bucket/in/a.jsonl ──fetch──► $TMPDIR/packshard-inputs-XXXX/3f2a…/a.jsonl  (source: URL)
    s3://bucket/out/       ──fetch──► $TMPDIR/packshard-out-XXXX/out/…              (manifest first)

A Ray worker on another node reads its unit's byte range where it runs instead
(:func:`packshard.store.objects.read_range`).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from packshard.errors import ManifestError
from packshard.store.objects import fetch_object, list_objects, object_size
from packshard.store.urls import StoreUrl, parse_url

LOCK_NAME = ".packshard-lock"
"""The lock object of an OUT being written (:mod:`packshard.store.publish`)."""
MANIFEST_NAME = "manifest.json"

_STAGED: dict[str, Path] = {}
_FOLDER: dict[int, Path] = {}


def _inputs_folder() -> Path:
    pid = os.getpid()
    if pid not in _FOLDER:
        folder = Path(tempfile.mkdtemp(prefix="packshard-inputs-"))
        _FOLDER[pid] = folder

        def remove() -> None:  # only the process that made it removes it
            if os.getpid() == pid:
                shutil.rmtree(folder, ignore_errors=True)

        atexit.register(remove)
    return _FOLDER[pid]


def fetch_input(url: StoreUrl) -> Path:
    """Return a local copy of the input object ``url``, fetched once per process."""
    text = str(url)
    if text not in _STAGED or not _STAGED[text].exists():
        folder = _inputs_folder() / hashlib.sha256(text.encode()).hexdigest()[:16]
        folder.mkdir(exist_ok=True)
        dest = folder / url.key.rsplit("/", 1)[-1]
        fetch_object(url, dest)
        _STAGED[text] = dest
    return _STAGED[text]


@contextmanager
def fetched_out(spec: str) -> Iterator[Path]:
    """Fetch the pack at the URL ``spec`` into a local folder for the block, then remove it.

    The manifest is looked for first: no manifest, no pack, nothing fetched.

    Raises:
        ManifestError: there is no ``manifest.json`` at ``spec``.

    """
    url = parse_url(spec)
    if object_size(url.child(MANIFEST_NAME)) is None:
        raise ManifestError(
            f"{url.child(MANIFEST_NAME)}: no manifest (is {url} a packshard output? a pack "
            "still being published or interrupted has none: wait for it, or pack again)"
        )
    stage = Path(tempfile.mkdtemp(prefix="packshard-out-"))
    try:
        local = stage / (url.key.rsplit("/", 1)[-1] or url.bucket)
        local.mkdir()
        fetch_object(url.child(MANIFEST_NAME), local / MANIFEST_NAME)
        for obj, _ in list_objects(url):
            rel = obj.key[len(url.key) :].lstrip("/") if url.key else obj.key
            if rel in (MANIFEST_NAME, LOCK_NAME) or any(p.startswith(".") for p in rel.split("/")):
                continue
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
            fetch_object(obj, local / rel)
        yield local
    finally:
        shutil.rmtree(stage, ignore_errors=True)
