"""Inputs named by URL: expanded like local specs, fetched once a process, sources kept as URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

from packshard.errors import InputError, ManifestError
from packshard.ingest.read.inputs import expand_inputs
from packshard.store import fetched_out
from tests.store.conftest import upload


def test_urls_expand_like_local_specs_and_are_fetched_once(bucket: str) -> None:
    for key in ("in/a.jsonl", "in/b.json", "in/sub/c.jsonl.gz", "in/.hidden.jsonl", "in/notes.txt"):
        upload(bucket, key, key.encode())
    base = f"s3://{bucket}/in"
    folder = expand_inputs([base])  # a prefix: every supported object below, hidden skipped
    assert [f.path for f in folder] == [
        f"{base}/a.jsonl",
        f"{base}/b.json",
        f"{base}/sub/c.jsonl.gz",
    ]
    assert [f.real.read_bytes() for f in folder] == [
        b"in/a.jsonl",
        b"in/b.json",
        b"in/sub/c.jsonl.gz",
    ]
    again = expand_inputs([f"{base}/*.jsonl", f"{base}/a.jsonl"])  # a glob, then the same object
    assert [f.path for f in again] == [f"{base}/a.jsonl"]  # named twice, kept once
    assert again[0].real == folder[0].real  # fetched once in this process
    assert [f.path for f in expand_inputs([f"{base}/**/*.jsonl*"])] == [
        f"{base}/a.jsonl",
        f"{base}/sub/c.jsonl.gz",
    ]


def test_pack_lists_objects_with_their_sizes_and_fetches_none(bucket: str, monkeypatch) -> None:
    import packshard.store.stage as stage

    for key, size in (("in/a.jsonl", 10), ("in/b.jsonl", 3000), ("in/c.json.gz", 7)):
        upload(bucket, key, b"x" * size)
    monkeypatch.setattr(stage, "_STAGED", {})  # nothing fetched by an earlier test counts
    base = f"s3://{bucket}/in"
    for spec in (base, f"{base}/*.j*", f"{base}/b.jsonl"):  # prefix, glob, object
        listed = expand_inputs([spec], fetch=False)
        assert all(f.in_store and str(f.real) == str(Path(f.path)) for f in listed)
        sizes = {f.path.rsplit("/", 1)[-1]: f.stored_size for f in listed}
        assert sizes == ({"b.jsonl": 3000} if spec.endswith("b.jsonl") else
                         {"a.jsonl": 10, "b.jsonl": 3000, "c.json.gz": 7})  # fmt: skip
    assert stage._STAGED == {}  # the control: fetched, the same objects are recorded there
    assert not any(f.in_store for f in expand_inputs([base]))
    assert len(stage._STAGED) == 3


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("in/*.txt", "unsupported input type"),
        ("in/notes.txt", "unsupported input type"),
        ("in/*.parquet", "pattern matches no input files"),
        ("nothing/here", "no such object, and the prefix holds no objects"),
        ("in/only-text", "no such object, and the prefix holds no input files"),
    ],
)
def test_a_url_that_names_no_input_is_refused_by_name(bucket: str, spec: str, words: str) -> None:
    upload(bucket, "in/notes.txt", b"x")
    upload(bucket, "in/only-text/readme.txt", b"x")
    with pytest.raises(InputError, match=words) as err:
        expand_inputs([f"s3://{bucket}/{spec}"])
    assert f"s3://{bucket}/" in str(err.value)


def test_a_prefix_without_a_manifest_is_no_pack(bucket: str, tmp_path: Path) -> None:
    upload(bucket, "out/shard-00000.parquet", b"half a pack")
    with pytest.raises(ManifestError, match="no manifest"):
        with fetched_out(f"s3://{bucket}/out"):
            pass
