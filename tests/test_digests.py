"""SHA-256 of files: every size around the read sizes, special files refused, a stop honoured."""

from __future__ import annotations

import hashlib
import os

import pytest

from packshard.digests import read_hashed, sha256_path


@pytest.mark.parametrize("size", [0, 1, 99, 100, 101, 299, 300, 301, 1000])
def test_sha256_path_hashes_every_byte_whatever_the_size(tmp_path, size) -> None:
    path = tmp_path / "f.bin"
    data = os.urandom(size)
    path.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    assert sha256_path(path, chunk=100) == want  # the first read sized to the file, then chunks
    assert sha256_path(str(path)) == want
    with open(path, "rb") as fh:
        assert read_hashed(fh) == (bytearray(data), want)


def test_sha256_path_refuses_a_fifo_and_a_folder_without_reading(tmp_path) -> None:
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)  # opened without blocking, refused before any read
    with pytest.raises(OSError, match="not a regular file"):
        sha256_path(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        sha256_path(tmp_path)
    (tmp_path / "ok.jsonl").write_bytes(b"{}\n")  # the control: a regular file is read
    assert sha256_path(tmp_path / "ok.jsonl") == hashlib.sha256(b"{}\n").hexdigest()


def test_sha256_path_stops_when_asked_and_closes_what_it_opened(tmp_path) -> None:
    path = tmp_path / "big.bin"
    path.write_bytes(b"x" * 1000)
    asked: list[int] = []
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None

    def until() -> bool:
        asked.append(1)
        return len(asked) == 2

    with pytest.raises(InterruptedError, match="hashing stopped"):
        sha256_path(path, chunk=100, until=until)
    assert len(asked) == 2  # asked after each chunk, stopped at the second
    assert (
        sha256_path(path, chunk=100, until=lambda: False) == hashlib.sha256(b"x" * 1000).hexdigest()
    )
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) == fds
