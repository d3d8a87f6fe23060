"""Writes to a store, through boto3: a create only where none is, uploads, deletes.

A store has no rename, so OUT cannot be filled under a temporary name and swapped in.  Two
things still need an atomic decision, and both are a conditional create, ``PUT`` with
``If-None-Match: *`` (S3 and compatible stores since 2024; refused with HTTP 412 when the key
exists, 409 while another conditional write of it is in flight)::

    the lock  OUT/.packshard-lock   one writer per OUT: the second create is refused
    the pack  OUT/manifest.json     published once: never written over another's

pyarrow's filesystems have no conditional write, so publishing goes through boto3 (the ``s3``
extra; its multipart uploads are also the faster, ``docs/object-stores.md``).  A store that
ignores the header would let two writers both "win", so :func:`check_conditional` creates the
lock's key a second time and requires that create to be refused (the control).  ``gs://``
and ``az://`` have their own conditions that no client here sends yet: publishing there is
refused, reading is not.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from packshard.errors import OutputError
from packshard.store.urls import StoreUrl

_CLIENTS: dict[int, Any] = {}


def _client() -> Any:
    try:
        import boto3
    except ImportError:
        raise OutputError(
            "publishing to s3:// needs boto3 for its conditional writes "
            "(pip install 'packshard[s3]')"
        ) from None
    if os.getpid() not in _CLIENTS:
        _CLIENTS[os.getpid()] = boto3.client("s3")
    return _CLIENTS[os.getpid()]


def create_object(url: StoreUrl, body: bytes) -> bool:
    """Write ``body`` at ``url`` only if no object is there: True written, False refused.

    Raises:
        OutputError: the store cannot make the write conditional, or the write failed.

    """
    if url.scheme != "s3":
        raise OutputError(
            f"{url.root}: publishing to {url.scheme}:// is refused: packshard has no "
            "conditional write for it, and without one a second writer could not be refused "
            "(write OUT to s3:// or a local folder and copy it there)"
        )
    client = _client()
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.put_object(Bucket=url.bucket, Key=url.key, Body=body, IfNoneMatch="*")
    except ClientError as exc:
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status in (409, 412) or error.get("Code") in (
            "PreconditionFailed",
            "ConditionalRequestConflict",
        ):
            return False
        if status == 501 or error.get("Code") == "NotImplemented":
            raise _unsupported(url) from None
        raise OutputError(
            f"{url}: cannot write ({error.get('Code')}: {error.get('Message')})"
        ) from None
    except BotoCoreError as exc:
        raise OutputError(f"{url}: cannot write ({exc})") from None
    return True


def _unsupported(url: StoreUrl) -> OutputError:
    return OutputError(
        f"{url.root}: the store does not honour conditional writes (PUT If-None-Match: *), "
        "so a second writer to OUT could not be refused; publishing there is refused (use a "
        "store that supports them, or write OUT locally)"
    )


def check_conditional(url: StoreUrl, body: bytes) -> None:
    """After ``url`` was created with ``body``: create it again, which must be refused.

    Raises:
        OutputError: the second create was accepted (the store ignores the condition).

    """
    if create_object(url, body):
        raise _unsupported(url)


def delete_created(url: StoreUrl) -> None:
    """Delete the object at ``url`` (the lock, a replaced pack's file) with the same client.

    Deleted by key alone (pyarrow's ``delete_file`` would leave an ``OUT/`` marker behind).

    Raises:
        OutputError: the store refused the delete.

    """
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        _client().delete_object(Bucket=url.bucket, Key=url.key)
    except (ClientError, BotoCoreError) as exc:
        raise OutputError(f"{url}: cannot delete ({exc})") from None


def upload_file(source: Path, url: StoreUrl) -> int:
    """Upload the local file ``source`` to ``url``; the object appears whole when this returns.

    Raises:
        OutputError: the upload failed.

    """
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        _client().upload_file(str(source), url.bucket, url.key)
    except (ClientError, BotoCoreError, OSError) as exc:
        raise OutputError(f"{url}: cannot write the object ({exc})") from None
    return source.stat().st_size
