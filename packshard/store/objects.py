"""Objects in a store through pyarrow's filesystems: list, glob, read ranges, fetch.

One filesystem per scheme and bucket and process, made on first use from the environment
(:mod:`packshard.store.urls`), so a forked worker or a Ray task on another node builds its own
and never inherits a client's sockets::

    s3://bucket/…  pyarrow.fs.S3FileSystem   (region from the bucket, AWS_ENDPOINT_URL honoured)
    gs://bucket/…  pyarrow.fs.GcsFileSystem  (default credentials)
    az://box/…     pyarrow.fs.AzureFileSystem(account_name=$AZURE_STORAGE_ACCOUNT_NAME)

Reads are ranged: :func:`open_object` gives a random-access file whose ``read_at`` and
``seek``/``read`` are HTTP range requests, so a Parquet footer or one row group costs one
request of its own size; :func:`read_range` is the byte range a work unit reads on the node
that maps it.  Writes are :mod:`packshard.store.writes`' (boto3: conditional creates and
faster uploads).  Every failure of the store (no such bucket, permissions, network) is one
line naming the URL.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from packshard.errors import InputError, PackshardError
from packshard.store.urls import StoreUrl, parse_url

CHUNK = 8 << 20
"""Bytes per read or write request when whole objects are copied (8 MiB)."""

_FILESYSTEMS: dict[tuple[int, str, str], Any] = {}


def filesystem(url: StoreUrl) -> Any:
    """Return this process's pyarrow filesystem for ``url``'s scheme and bucket."""
    import pyarrow.fs as pafs

    key = (os.getpid(), url.scheme, url.bucket)
    if key not in _FILESYSTEMS:
        try:
            if url.scheme == "az":
                account = os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
                if not account:
                    raise InputError(
                        f"{url}: set AZURE_STORAGE_ACCOUNT_NAME (the storage account of az:// URLs)"
                    )
                fs = pafs.AzureFileSystem(account_name=account)
            else:
                fs = pafs.FileSystem.from_uri(url.root)[0]
        except PackshardError:
            raise
        except (OSError, ValueError, ImportError) as exc:
            raise InputError(f"{url.root}: cannot open the store ({_reason(exc)})") from None
        _FILESYSTEMS[key] = fs
    return _FILESYSTEMS[key]


def _reason(exc: BaseException) -> str:
    """Return the first line of a store error, without the SDK's request details."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextmanager
def store_errors(
    url: StoreUrl | str, doing: str, kind: type[PackshardError] = InputError
) -> Iterator[None]:
    """Turn a store's OSError inside the block into one ``kind`` line naming ``url``."""
    try:
        yield
    except OSError as exc:
        raise kind(f"{url}: cannot {doing} ({_reason(exc)})") from None


def object_size(url: StoreUrl) -> int | None:
    """Return the object's size in bytes, or None when there is no object at ``url``."""
    import pyarrow.fs as pafs

    with store_errors(url, "look up the object"):
        info = filesystem(url).get_file_info(url.path)
    return int(info.size) if info.type == pafs.FileType.File else None


def list_objects(url: StoreUrl) -> list[tuple[StoreUrl, int]]:
    """Every object below ``url`` (recursive) and its size, sorted by key."""
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(url.path, recursive=True, allow_not_found=True)
    with store_errors(url, "list the objects"):
        infos = filesystem(url).get_file_info(selector)
    found = [
        (StoreUrl(url.scheme, url.bucket, i.path.split("/", 1)[1]), int(i.size))
        for i in infos
        if i.type == pafs.FileType.File
    ]
    return sorted(found, key=lambda item: item[0].key)


def glob_objects(pattern: StoreUrl) -> list[StoreUrl]:
    """Return the objects whose keys match ``pattern`` (``*``, ``?``, ``[…]``; ``**`` any levels).

    Hidden names (a level starting with ``.``) match only a pattern level that starts with
    ``.``, as the shell's globs do.  Listed once, from the longest prefix without a wildcard.
    """
    return [u for u, _ in glob_sized(pattern)]


def glob_sized(pattern: StoreUrl) -> list[tuple[StoreUrl, int]]:
    """:func:`glob_objects`, each object with its size from the same listing."""
    parts = pattern.key.split("/")
    fixed = 0
    while fixed < len(parts) and not set("*?[") & set(parts[fixed]):
        fixed += 1
    base = StoreUrl(pattern.scheme, pattern.bucket, "/".join(parts[:fixed]))
    wanted = parts[fixed:]
    return [(u, n) for u, n in list_objects(base) if key_matches(u.key.split("/")[fixed:], wanted)]


def key_matches(names: list[str], parts: list[str]) -> bool:
    """Whether a key's levels ``names`` match a glob's levels ``parts`` (``**``: any levels)."""
    if not parts:
        return not names
    if parts[0] == "**":
        return any(key_matches(names[k:], parts[1:]) for k in range(len(names) + 1))
    if not names:
        return False
    hidden = names[0].startswith(".") and not parts[0].startswith(".")
    if hidden or not fnmatch.fnmatchcase(names[0], parts[0]):
        return False
    return key_matches(names[1:], parts[1:])


def open_object(url: StoreUrl) -> Any:
    """Open ``url`` for ranged reads (a pyarrow ``RandomAccessFile``: ``read_at``, ``size``)."""
    with store_errors(url, "open the object"):
        return filesystem(url).open_input_file(url.path)


def read_range(url: str | StoreUrl, start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` of the object at ``url``: one ranged request, on any node."""
    where = parse_url(url) if isinstance(url, str) else url
    with open_object(where) as handle:
        with store_errors(where, f"read bytes {start}-{stop}"):
            data = handle.read_at(stop - start, start)
    if len(data) != stop - start:
        raise InputError(
            f"{where}: {len(data)} bytes at {start}, expected {stop - start} (changed while read?)"
        )
    return bytes(data)


def hash_object(url: str | StoreUrl) -> str:
    """Return the SHA-256 of the object at ``url``, read in ranges of ``CHUNK`` (never whole)."""
    where = parse_url(url) if isinstance(url, str) else url
    digest = hashlib.sha256()
    with open_object(where) as handle, store_errors(where, "read the object"):
        size, done = handle.size(), 0
        while done < size:
            chunk = handle.read_at(min(CHUNK, size - done), done)
            if not chunk:
                raise InputError(f"{where}: {done} of {size} bytes read (changed while read?)")
            digest.update(chunk)
            done += len(chunk)
    return digest.hexdigest()


def read_object(url: StoreUrl) -> bytes:
    """Return the whole object at ``url``."""
    with open_object(url) as handle, store_errors(url, "read the object"):
        return bytes(handle.read_at(handle.size(), 0))  # one request of the known size


def fetch_object(url: StoreUrl, dest: Path) -> int:
    """Copy the object at ``url`` to the local file ``dest`` (written beside it, then renamed)."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    with open_object(url) as src, store_errors(url, "read the object"), open(tmp, "wb") as sink:
        size, done = src.size(), 0
        while done < size:  # known ranges: a stream's read() asks in 64 KiB requests
            chunk = src.read_at(min(CHUNK, size - done), done)
            if not chunk:
                raise InputError(f"{url}: {done} of {size} bytes read (changed while read?)")
            sink.write(chunk)
            done += len(chunk)
    os.replace(tmp, dest)
    return dest.stat().st_size


def read_hashed_object(url: StoreUrl) -> tuple[bytearray, str]:
    """Read the object at ``url`` in ranges of ``CHUNK``; return it and its SHA-256.

    The bytes hashed are the bytes returned (as :func:`packshard.digests.read_hashed` does
    for a local file): a reader serves exactly what it checked.
    """
    digest = hashlib.sha256()
    with open_object(url) as handle, store_errors(url, "read the object"):
        data = bytearray(handle.size())
        view, filled = memoryview(data), 0
        while filled < len(data):
            got = handle.read_at(min(CHUNK, len(data) - filled), filled)
            if not got:
                break
            view[filled : filled + len(got)] = got
            digest.update(got)
            filled += len(got)
    if filled < len(data):
        raise InputError(f"{url}: {filled} of {len(data)} bytes read (changed while read?)")
    return data, digest.hexdigest()


def child_object(folder: StoreUrl, rel: object) -> StoreUrl:
    """Return the object ``rel`` names below ``folder``, where ``rel`` is a plain relative key.

    A name that is absolute, climbs (``..``), has empty or ``.`` levels or backslashes is
    refused, as :mod:`packshard.format.folder.paths` refuses it locally.

    Raises:
        FormatError: ``rel`` is not a plain relative key.

    """
    from packshard.errors import FormatError

    if not isinstance(rel, str) or not rel or "\\" in rel or rel.startswith("/"):
        raise FormatError(f"{folder}/{rel!r}", "not a relative path inside OUT (not read)")
    if any(part in ("", ".", "..") for part in rel.split("/")):
        raise FormatError(f"{folder}/{rel}", "not a relative path inside OUT (not read)")
    return folder.child(rel)
