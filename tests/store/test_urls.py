"""Store URLs: the schemes packshard takes, and what a URL may not carry."""

from __future__ import annotations

import pytest

from packshard.errors import UsageError
from packshard.store.urls import StoreUrl, is_url, parse_url


def test_a_url_splits_into_scheme_bucket_and_key() -> None:
    url = parse_url("s3://bucket/in/chat.jsonl")
    assert url == StoreUrl("s3", "bucket", "in/chat.jsonl")
    assert str(url) == "s3://bucket/in/chat.jsonl"
    assert url.path == "bucket/in/chat.jsonl"
    assert (
        str(parse_url("gs://b/out/").child("shard-00000.parquet"))
        == "gs://b/out/shard-00000.parquet"
    )
    assert str(parse_url("az://box")) == "az://box"


def test_local_paths_are_not_urls() -> None:
    assert not is_url("data/chat.jsonl")
    assert not is_url("/abs/s3:/x")
    assert is_url("s3://b/k") and is_url("http://host/x")


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("http://host/data.jsonl", "unsupported scheme http://"),
        ("file:///tmp/x.jsonl", "unsupported scheme file://"),
        ("s3://AKIA:secret@bucket/in", "credentials or accounts in a URL are refused"),
        ("s3://bucket/in?endpoint_override=localhost", "options in a URL are refused"),
        ("s3:///in/x.jsonl", "no bucket named"),
    ],
)
def test_what_a_url_may_not_be_is_refused_by_name(spec: str, words: str) -> None:
    with pytest.raises(UsageError, match=words.replace("?", r"\?")) as err:
        parse_url(spec)
    assert "secret" not in str(err.value)  # a credential is never echoed back
