"""Objects on a real S3-compatible server: globs, ranged reads, whole copies, refusals."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from packshard.errors import FormatError, InputError
from packshard.store.objects import (
    child_object,
    fetch_object,
    glob_objects,
    key_matches,
    list_objects,
    object_size,
    read_hashed_object,
    read_range,
)
from packshard.store.urls import parse_url
from packshard.store.writes import upload_file
from tests.store.conftest import upload


@pytest.mark.parametrize(
    ("key", "pattern", "hit"),
    [
        ("a.jsonl", "*.jsonl", True),
        ("d/a.jsonl", "*.jsonl", False),  # one level, as the shell
        ("d/e/a.jsonl", "**/*.jsonl", True),
        ("a.jsonl", "**/*.jsonl", True),
        (".hidden.jsonl", "*.jsonl", False),
        (".hidden.jsonl", ".*.jsonl", True),
        ("a.json", "*.jsonl", False),
    ],
)
def test_glob_levels_match_like_the_shell(key: str, pattern: str, hit: bool) -> None:
    assert key_matches(key.split("/"), pattern.split("/")) is hit


def test_listing_globbing_and_ranged_reads(bucket: str, tmp_path: Path) -> None:
    data = bytes(range(256)) * 100
    for key in ("in/a.jsonl", "in/b.jsonl", "in/sub/c.jsonl", "in/notes.txt", "other/d.jsonl"):
        upload(bucket, key, data)
    base = parse_url(f"s3://{bucket}/in")
    assert [u.key for u, _ in list_objects(base)] == [
        "in/a.jsonl",
        "in/b.jsonl",
        "in/notes.txt",
        "in/sub/c.jsonl",
    ]
    assert [u.key for u in glob_objects(parse_url(f"s3://{bucket}/in/*.jsonl"))] == [
        "in/a.jsonl",
        "in/b.jsonl",
    ]
    assert [u.key for u in glob_objects(parse_url(f"s3://{bucket}/**/*.jsonl"))] == [
        "in/a.jsonl",
        "in/b.jsonl",
        "in/sub/c.jsonl",
        "other/d.jsonl",
    ]
    a = parse_url(f"s3://{bucket}/in/a.jsonl")
    assert object_size(a) == len(data)
    assert object_size(parse_url(f"s3://{bucket}/in/none")) is None
    assert read_range(str(a), 1000, 1300) == data[1000:1300]
    got, sha = read_hashed_object(a)
    assert bytes(got) == data and sha == hashlib.sha256(data).hexdigest()
    fetch_object(a, tmp_path / "a.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == data
    (tmp_path / "big").write_bytes(data * 400)  # 10 MiB: more than one upload part
    target = parse_url(f"s3://{bucket}/up/big")
    assert upload_file(tmp_path / "big", target) == object_size(target) == len(data) * 400


def test_a_missing_object_or_bucket_is_one_line_naming_it(s3_server: dict[str, str]) -> None:
    with pytest.raises(InputError, match=r"s3://no-such-bucket-here/x: cannot"):
        read_range("s3://no-such-bucket-here/x", 0, 10)


@pytest.mark.parametrize("rel", ["../x", "/abs", "a//b", "./a", "a\\b", "", 3])
def test_a_manifest_name_outside_out_is_refused(rel: object) -> None:
    with pytest.raises(FormatError, match="not a relative path inside OUT"):
        child_object(parse_url("s3://b/out"), rel)
    assert (
        str(child_object(parse_url("s3://b/out"), "d/shard.parquet"))
        == "s3://b/out/d/shard.parquet"
    )
