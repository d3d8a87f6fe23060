"""A real S3-compatible server on the loopback address, started by the tests themselves.

moto's server mode (``python -m moto.server``) runs as a subprocess on a free port of
127.0.0.1; the tests reach it the way a user reaches any S3-compatible store, through the
environment (``AWS_ENDPOINT_URL`` and throwaway credentials), never through options.  The
tests skip, saying why, where moto is not installed (it is in the ``dev`` extra).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

SERVER_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Start moto's S3 server on 127.0.0.1 for the session; yield the client environment."""
    pytest.importorskip("moto.server", reason="moto is not installed (pip install 'moto[server]')")
    pytest.importorskip("boto3", reason="boto3 is not installed (pip install boto3)")
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=2).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto server did not start: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
    saved = {k: os.environ.get(k) for k in [*SERVER_ENV, "AWS_ENDPOINT_URL"]}
    env = {**SERVER_ENV, "AWS_ENDPOINT_URL": endpoint}
    os.environ.update(env)
    try:
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def bucket(s3_server: dict[str, str]) -> str:
    """A fresh, empty bucket on the test server; its name."""
    import boto3

    name = f"t-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name


def keys(bucket: str, prefix: str = "") -> list[str]:
    """Every object key in ``bucket`` under ``prefix``, sorted."""
    import boto3

    found: list[str] = []
    pages = (
        boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    )
    for page in pages:
        found += [o["Key"] for o in page.get("Contents", [])]
    return sorted(found)


def upload(bucket: str, key: str, data: bytes) -> Any:
    """Put ``data`` at ``key`` in ``bucket``."""
    import boto3

    return boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=data)
