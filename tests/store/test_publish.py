"""Packs to and from a real S3-compatible server: the same bytes, one writer, no half packs.

Every test here runs against moto's server on 127.0.0.1 (``conftest.py``): ``pack`` reads
``s3://…/in/*.jsonl`` and publishes ``s3://…/out``; the local pack of the same files is the
reference.  The examples index names its sources as given, so the store pack's ``source``
column holds URLs where the local one holds paths; every other column, and every shard byte
for byte, is the same.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from packshard.errors import ManifestError, OutputError
from packshard.store import LOCK_NAME, StoreOut, claim_store, publish_store
from packshard.store.urls import parse_url
from tests.store.conftest import keys, upload

pytestmark = pytest.mark.slow

CLI = "import sys; from packshard.cli import main; sys.argv[0] = 'packshard'; main()"


def _inputs(bucket: str, root: Path) -> Path:
    """The demo chats as two files, locally under ``root/in`` and at ``s3://bucket/in/``."""
    from packshard.demo import demo_data_path

    lines = demo_data_path().read_bytes().splitlines(keepends=True)
    folder = root / "in"
    folder.mkdir(parents=True)
    for name, part in (("a.jsonl", lines[:30]), ("b.jsonl", lines[30:])):
        (folder / name).write_bytes(b"".join(part))
        upload(bucket, f"in/{name}", (folder / name).read_bytes())
    return folder


def _pack(inputs: tuple[str, ...], tokenizer: Path, out: str, **options: Any) -> Any:
    from packshard.pack import PackConfig, pack_dataset

    settings: dict[str, Any] = {"max_seq_len": 256, "template": "chatml", "shard_rows": 3}
    settings.update(options)
    config = PackConfig.build(inputs=inputs, tokenizer=str(tokenizer), out=out, **settings)
    return pack_dataset(config)


def _store_pack(bucket: str, tokenizer: Path, out: str) -> tuple[str, ...]:
    """The ``pack`` arguments of the store's inputs into ``out``, three rows a shard."""
    return ("pack", f"s3://{bucket}/in/*.jsonl", "-t", str(tokenizer), "--template", "chatml",
            "--max-seq-len", "256", "--shard-rows", "3", "-o", out, "--quiet")  # fmt: skip


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CLI, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def test_a_pack_on_the_store_is_the_local_pack(
    bucket: str, tmp_path: Path, demo_tokenizer: Path
) -> None:
    from packshard.store.objects import read_object
    from packshard.torch import PackedDataset, PackedIterableDataset
    from packshard.verify.run import VerifyOptions, verify_dataset

    local_in = _inputs(bucket, tmp_path)
    local = _pack(
        (str(local_in / "a.jsonl"), str(local_in / "b.jsonl")),
        demo_tokenizer,
        str(tmp_path / "out"),
    )
    remote = _pack((f"s3://{bucket}/in/*.jsonl",), demo_tokenizer, f"s3://{bucket}/out")
    assert remote.published == f"s3://{bucket}/out" and remote.shown == remote.published

    manifest = json.loads(read_object(parse_url(f"s3://{bucket}/out/manifest.json")))
    assert manifest["dataset_id"] == local.manifest["dataset_id"]
    assert [s["sha256"] for s in manifest["shards"]] == [
        s["sha256"] for s in local.manifest["shards"]
    ]
    assert len(manifest["shards"]) > 1
    assert [i["path"] for i in manifest["inputs"]] == [
        f"s3://{bucket}/in/a.jsonl",
        f"s3://{bucket}/in/b.jsonl",
    ]
    assert [i["resolved"] for i in manifest["inputs"]] == [i["path"] for i in manifest["inputs"]]
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in json.dumps(manifest)
    assert os.environ["AWS_ENDPOINT_URL"] not in json.dumps(manifest)
    stored = keys(bucket, "out/")
    assert f"out/{LOCK_NAME}" not in stored  # released
    for entry in manifest["shards"]:  # byte for byte
        assert (
            read_object(parse_url(f"s3://{bucket}/out/{entry['path']}"))
            == (tmp_path / "out" / entry["path"]).read_bytes()
        )
    (tmp_path / "remote-index.parquet").write_bytes(
        read_object(parse_url(f"s3://{bucket}/out/examples.parquet"))
    )
    mine = pq.read_table(tmp_path / "remote-index.parquet")
    theirs = pq.read_table(tmp_path / "out" / "examples.parquet")
    assert mine.schema.metadata == theirs.schema.metadata
    for name in theirs.column_names:
        if name != "source":
            assert mine.column(name).equals(theirs.column(name)), name
    renamed = {str(local_in / n): f"s3://{bucket}/in/{n}" for n in ("a.jsonl", "b.jsonl")}
    assert mine.column("source").to_pylist() == [
        renamed[s] for s in theirs.column("source").to_pylist()
    ]

    report = verify_dataset(f"s3://{bucket}/out", VerifyOptions(model="none"))
    assert report.out == f"s3://{bucket}/out"
    assert not len(report.findings) and not report.not_run
    assert report.checks["source"]["status"] == "passed"  # the inputs fetched from the store

    rows, local_rows = PackedDataset(f"s3://{bucket}/out"), PackedDataset(tmp_path / "out")
    assert len(rows) == len(local_rows)
    for k in range(len(rows)):
        for name, value in local_rows[k].items():
            assert rows[k][name].equal(value), (k, name)
    stream = PackedIterableDataset(f"s3://{bucket}/out", seed=3, rank=1, world_size=2)
    reference = PackedIterableDataset(tmp_path / "out", seed=3, rank=1, world_size=2)
    seen = [r["example_ids"].tolist() for r in stream]
    assert seen == [r["example_ids"].tolist() for r in reference]
    resumed = PackedIterableDataset(f"s3://{bucket}/out", seed=3, rank=1, world_size=2)
    resumed.load_state_dict(stream.state_dict(consumed=1))
    assert [r["example_ids"].tolist() for r in resumed] == seen[1:]


def test_the_store_reader_refuses_a_changed_shard(
    bucket: str, tmp_path: Path, demo_tokenizer: Path
) -> None:
    from packshard.errors import FormatError
    from packshard.store.objects import read_object
    from packshard.torch import PackedDataset

    _inputs(bucket, tmp_path)
    _pack((f"s3://{bucket}/in/a.jsonl",), demo_tokenizer, f"s3://{bucket}/out")
    rows = PackedDataset(f"s3://{bucket}/out")
    name = rows.shard_names[0]
    data = bytearray(read_object(parse_url(f"s3://{bucket}/out/{name}")))
    data[100] ^= 1
    upload(bucket, f"out/{name}", bytes(data))
    with pytest.raises(FormatError, match=f"s3://{bucket}/out/{name}: SHA-256 differs"):
        rows[0]


def test_a_second_writer_is_refused_and_readers_never_see_a_half_pack(
    bucket: str, tmp_path: Path, demo_tokenizer: Path
) -> None:
    from packshard.torch import PackedDataset

    _inputs(bucket, tmp_path)
    out = f"s3://{bucket}/out"
    args = _store_pack(bucket, demo_tokenizer, out)
    first, second = _cli(*args), _cli(*args)
    views = []
    while first.poll() is None or second.poll() is None:  # a reader polling all along
        try:
            views.append(len(PackedDataset(out)))
        except ManifestError as exc:
            assert "no manifest" in str(exc)
            views.append(None)
        time.sleep(0.05)
    results = sorted([(p.returncode, p.stderr.read().decode()) for p in (first, second)])
    assert [code for code, _ in results] == [0, 2], results
    refusal = results[1][1]
    assert "another job is writing it" in refusal or "holds a pack" in refusal, refusal
    full = len(PackedDataset(out))
    assert set(views) <= {None, full}  # nothing, or the whole pack: never a part of one
    assert f"out/{LOCK_NAME}" not in keys(bucket, "out/")


def test_a_killed_pack_leaves_no_manifest_and_its_lock_refuses_the_next(
    bucket: str, tmp_path: Path, demo_tokenizer: Path
) -> None:
    from packshard.torch import PackedDataset

    _inputs(bucket, tmp_path)
    out = f"s3://{bucket}/out"
    args = _store_pack(bucket, demo_tokenizer, out)
    stuck = _cli(*args, env={"PACKSHARD_FAULTS": "hang:shard-00001:1"})  # mid-run: shards
    deadline = time.monotonic() + 120
    while f"out/{LOCK_NAME}" not in keys(bucket, "out/"):
        assert stuck.poll() is None and time.monotonic() < deadline, (
            stuck.stderr.read() if stuck.poll() is not None else "no lock"
        )
        time.sleep(0.1)
    refused = _cli(*args)
    assert refused.wait(120) == 2
    assert "another job is writing it (pack on" in refused.stderr.read().decode()
    os.killpg(stuck.pid, signal.SIGKILL)  # the job, its workers: as a lost machine would
    stuck.wait(30)
    assert keys(bucket, "out/") == [f"out/{LOCK_NAME}"]  # no manifest, nothing else
    with pytest.raises(ManifestError, match="no manifest"):
        PackedDataset(out)
    after = _cli(*args)
    assert after.wait(120) == 2
    assert f"lock {out}/{LOCK_NAME}" in after.stderr.read().decode()
    import boto3

    boto3.client("s3").delete_object(Bucket=bucket, Key=f"out/{LOCK_NAME}")  # the user's call
    again = _cli(*args)
    assert again.wait(300) == 0, again.stderr.read().decode()
    assert len(PackedDataset(out)) > 0


def test_a_terminated_pack_releases_its_lock_and_publishes_nothing(
    bucket: str, tmp_path: Path, demo_tokenizer: Path
) -> None:
    _inputs(bucket, tmp_path)
    out = f"s3://{bucket}/out"
    args = _store_pack(bucket, demo_tokenizer, out)
    stuck = _cli(*args, env={"PACKSHARD_FAULTS": "hang:shard-00001:1"})
    deadline = time.monotonic() + 120
    while f"out/{LOCK_NAME}" not in keys(bucket, "out/"):
        assert stuck.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    stuck.send_signal(signal.SIGTERM)  # as a scheduler ending the job would
    assert stuck.wait(60) != 0
    assert keys(bucket, "out/") == []  # the lock released, nothing published


def test_an_upload_cut_short_publishes_no_manifest(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import packshard.store.publish as publish

    folder = tmp_path / "pack"
    folder.mkdir()
    for name in ("shard-00000.parquet", "shard-00001.parquet", "examples.parquet", "manifest.json"):
        (folder / name).write_text(name)
    calls, real_put = [], publish.upload_file

    def failing(source: Path, url: Any) -> int:  # the connection drops at the second file
        calls.append(source.name)
        if len(calls) == 2:
            raise OutputError(f"{url}: cannot write the object (connection reset)")
        return real_put(source, url)

    monkeypatch.setattr(publish, "upload_file", failing)
    with pytest.raises(OutputError, match="connection reset"):
        with claim_store(f"s3://{bucket}/out", False, "pack") as out:
            publish_store(out, folder)
    assert "manifest.json" not in calls
    assert "out/manifest.json" not in keys(bucket, "out/") and keys(
        bucket, "out/"
    )  # a part, no pack
    with pytest.raises(
        OutputError, match=r"no manifest.json \(not a pack, or one whose publishing"
    ):
        with claim_store(f"s3://{bucket}/out", True, "pack"):
            pass


def test_overwrite_replaces_a_pack_manifest_first(
    bucket: str, tmp_path: Path, demo_tokenizer: Path
) -> None:
    _inputs(bucket, tmp_path)
    out = f"s3://{bucket}/out"
    _pack((f"s3://{bucket}/in/a.jsonl",), demo_tokenizer, out)
    with pytest.raises(OutputError, match="holds a pack \\(use --overwrite"):
        _pack((f"s3://{bucket}/in/b.jsonl",), demo_tokenizer, out)
    with claim_store(out, True, "pack") as claim:
        assert claim.replaced[0] == parse_url(f"{out}/manifest.json")  # deleted first
        assert {str(u) for u in claim.replaced[1:]} >= {
            f"{out}/shard-00000.parquet",
            f"{out}/examples.parquet",
        }
    again = _pack((f"s3://{bucket}/in/b.jsonl",), demo_tokenizer, out, overwrite=True)
    assert [i["path"] for i in again.manifest["inputs"]] == [f"s3://{bucket}/in/b.jsonl"]


class _IgnoresConditions:
    """An S3 client whose store ignores If-None-Match: every put succeeds."""

    def put_object(self, **kwargs: Any) -> dict[str, Any]:
        return {}


def test_a_store_that_ignores_conditional_writes_is_refused(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import packshard.store.writes as create

    with claim_store(f"s3://{bucket}/ok", False, "pack") as claim:  # control: the real store passes
        assert isinstance(claim, StoreOut)
    monkeypatch.setattr(create, "_client", lambda: _IgnoresConditions())
    with pytest.raises(OutputError, match="does not honour conditional writes"):
        with claim_store(f"s3://{bucket}/out", False, "pack"):
            pass


def test_publishing_where_no_conditional_write_exists_is_refused() -> None:
    with pytest.raises(OutputError, match="publishing to gs:// is refused"):
        with claim_store("gs://bucket/out", False, "pack"):
            pass


def test_dataloader_workers_read_the_store_and_resume_exactly(
    bucket: str, tmp_path: Path, demo_tokenizer: Path
) -> None:
    from packshard.torch import PackedDataset, PackedIterableDataset, collate_varlen
    from packshard.torch.stream import ResumableLoader

    local_in = _inputs(bucket, tmp_path)
    out = f"s3://{bucket}/out"
    _pack((f"s3://{bucket}/in/*.jsonl",), demo_tokenizer, out, shard_rows=2)
    files = (str(local_in / "a.jsonl"), str(local_in / "b.jsonl"))
    _pack(files, demo_tokenizer, str(tmp_path / "out"), shard_rows=2)
    PackedDataset(out)[0]  # this process opened the store first: the workers fork after it

    def batches(where: str, state: dict[str, Any] | None = None) -> tuple[list[Any], Any]:
        loader = ResumableLoader(
            PackedIterableDataset(where, seed=5),
            batch_size=2,
            collate_fn=collate_varlen,
            num_workers=2,
            multiprocessing_context="fork",
        )
        if state is not None:
            loader.load_state_dict(state)
        seen, saved = [], None
        for k, batch in enumerate(loader):
            seen.append(batch["input_ids"].tolist())
            if k == 1:
                saved = loader.state_dict()
        return seen, saved

    whole, state = batches(out)
    assert len(whole) >= 3
    assert whole == batches(str(tmp_path / "out"))[0]  # the local pack's batches, in order
    assert batches(out, state)[0] == whole[2:]  # resumed at exactly the next batch
