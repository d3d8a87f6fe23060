"""``pack s3://… -o s3://… --engine ray`` on two nodes: the bytes of one local process.

A real cluster of two nodes (``tests/raynodes.py``: a head and a second raylet, one CPU each)
and moto's S3 server (``conftest.py``), both on this machine.  The nodes are started with the
store's endpoint and credentials in their environment, as each machine of a real cluster
has its own.  A driver process joins the cluster with the command line a user types::

    packshard pack 's3://B/in/*.jsonl' … --engine ray --ray-address HEAD -o s3://B/out

and must give the shards of ``pack`` on the same files as local paths, in one process, byte
for byte.  The examples index and the rejects name each record's source as it was given (a
URL, a path): every other column and field is the same, and the sources map one to one by
name.  The driver's store reads are watched (its filesystem wrapped): it opens no input
object, the workers of the nodes read them; a one-process store pack watched the same way
opens both (the control: the watch sees reads where they happen).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from packshard.store.objects import read_object
from packshard.store.urls import parse_url
from tests.raynodes import ROOT, RayNodes, ray_cli
from tests.store.conftest import keys, upload

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("ray")]

SPLIT = 12_000  # bytes per unit: the two inputs make about 26 units, so both nodes get many
OPTIONS = {"max_seq_len": 256, "template": "chatml", "shard_rows": 8, "split_bytes": SPLIT}
NAMES = ("a.jsonl", "b.jsonl")
WATCHED = (
    "import json, sys\n"
    "import packshard.store.objects as objects\n"
    "record, opened, store_fs = sys.argv[1], [], objects.filesystem\n"
    "class Watched:  # every object opened for reading noted, then opened\n"
    "    def __init__(self, fs): self.fs = fs\n"
    "    def __getattr__(self, name):\n"
    "        if name.startswith('open_input'):  # open_input_file, open_input_stream\n"
    "            return lambda path: opened.append(path) or getattr(self.fs, name)(path)\n"
    "        return getattr(self.fs, name)\n"
    "objects.filesystem = lambda url: Watched(store_fs(url))\n"
    "from packshard.cli import main\n"
    "sys.argv = ['packshard', *sys.argv[2:]]\n"
    "try:\n"
    "    main()\n"
    "finally:\n"
    "    open(record, 'w').write(json.dumps(opened))\n"
)  # fmt: skip


@pytest.fixture(scope="module")
def stored(s3_server: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The demo chats 20 times over in two files, locally and at ``s3://BUCKET/in/``."""
    import boto3

    from packshard.demo import demo_data_path

    bucket = f"t-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    lines = (demo_data_path().read_bytes() * 20).splitlines(keepends=True)
    folder = tmp_path_factory.mktemp("nodes-in")
    for name, part in zip(NAMES, (lines[:600], lines[600:]), strict=True):
        (folder / name).write_bytes(b"".join(part))
        upload(bucket, f"in/{name}", (folder / name).read_bytes())
    return {"bucket": bucket, "folder": folder}


@pytest.fixture(scope="module")
def cluster(s3_server: dict[str, str]):
    """Two nodes whose workers reach the store (its endpoint in their environment)."""
    pytest.importorskip("ray")
    if ray_cli() is None:
        pytest.skip("the ray command is not installed (pip install 'packshard[ray]')")
    with RayNodes(cpus=1).start(2) as nodes:
        assert nodes.env["AWS_ENDPOINT_URL"] == s3_server["AWS_ENDPOINT_URL"]
        yield nodes


@pytest.fixture(scope="module")
def local(stored, packed_demo_tokenizer, tmp_path_factory) -> Path:
    """``pack`` of the same two files as local paths, one process: the bytes to give."""
    from packshard.pack import PackConfig, pack_dataset

    out = tmp_path_factory.mktemp("local") / "out"
    inputs = tuple(str(stored["folder"] / n) for n in NAMES)
    config = PackConfig.build(inputs, str(packed_demo_tokenizer), str(out), workers=1, **OPTIONS)  # type: ignore[arg-type]
    pack_dataset(config)
    return out


def pack_args(bucket: str, tokenizer: Path, out: str, *more: str) -> list[str]:
    """The ``pack`` command line of the store's inputs into ``out``."""
    return ["pack", f"s3://{bucket}/in/*.jsonl", "-t", str(tokenizer), "--template", "chatml",
            "--max-seq-len", "256", "--shard-rows", "8", "--split-bytes", str(SPLIT),
            "-o", out, "--quiet", *more]  # fmt: skip


def start_watched(args: list[str], record: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """Run the command line ``args`` in a process whose store opens are written to ``record``."""
    return subprocess.Popen(
        [sys.executable, "-c", WATCHED, str(record), *args],
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def fetched(bucket: str, prefix: str, dest: Path) -> Path:
    """Copy every object below ``s3://bucket/prefix/`` into the folder ``dest``."""
    dest.mkdir()
    for key in keys(bucket, prefix + "/"):
        name = key[len(prefix) + 1 :]
        (dest / name).write_bytes(read_object(parse_url(f"s3://{bucket}/{key}")))
    return dest


def same_but_sources(store: Path, local: Path, bucket: str, folder: Path) -> None:
    """Assert the index and rejects of ``store`` equal ``local``'s, sources mapped by name."""
    renamed = {str(folder / n): f"s3://{bucket}/in/{n}" for n in NAMES}
    mine, theirs = (
        pq.read_table(store / "examples.parquet"),
        pq.read_table(local / "examples.parquet"),
    )
    assert mine.schema == theirs.schema and mine.schema.metadata == theirs.schema.metadata
    for name in theirs.column_names:
        if name != "source":
            assert mine.column(name).equals(theirs.column(name)), name
    assert mine.column("source").to_pylist() == [
        renamed[s] for s in theirs.column("source").to_pylist()
    ]
    rejects = [json.loads(x) for x in (local / "rejects.jsonl").read_text().splitlines()]
    assert rejects, "the broken demo line is rejected: the rejects are compared"
    for reject in rejects:
        reject["source"] = renamed[reject["source"]]
    assert [json.loads(x) for x in (store / "rejects.jsonl").read_text().splitlines()] == rejects


def train_a_few_steps(url: str) -> tuple[float, float]:
    """Four SGD steps of a tiny Llama on rows streamed from ``url``.

    Returns the first batch's loss before and after them.
    """
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils.data import DataLoader

    from packshard.torch import PackedIterableDataset, collate_varlen, seq_idx_block_causal_mask

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        use_cache=False, attn_implementation="sdpa",
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = DataLoader(PackedIterableDataset(url, seed=0), batch_size=2, collate_fn=collate_varlen)

    def loss_of(batch: dict[str, Any]) -> Any:
        mask = seq_idx_block_causal_mask(batch["seq_idx"])  # each segment alone
        return model(
            input_ids=batch["input_ids"],
            labels=batch["labels"],
            position_ids=batch["position_ids"],
            attention_mask=mask,
        ).loss

    batches = iter(loader)
    first = next(batches)
    with torch.no_grad():
        before = float(loss_of(first))
    for batch in [first, *(next(batches) for _ in range(3))]:
        loss = loss_of(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        after = float(loss_of(first))
    return before, after


def test_two_nodes_pack_from_the_store_into_the_store_as_one_local_process(
    cluster, stored, local, packed_demo_tokenizer, tmp_path
):
    from packshard.verify.run import VerifyOptions, verify_dataset

    bucket = stored["bucket"]
    args = pack_args(bucket, packed_demo_tokenizer, f"s3://{bucket}/out")
    driver = start_watched(
        [*args, "--engine", "ray", "--ray-address", cluster.address],
        tmp_path / "ray.json",
        cluster.env,
    )
    ran_on_second = False
    while driver.poll() is None:
        ran_on_second = ran_on_second or cluster.busy(1)
        time.sleep(0.01)
    _, err = driver.communicate()
    assert driver.returncode == 0, err
    assert ran_on_second, "node 1 never ran a task: the run did not cross a node boundary"

    # the driver opened no input object: the nodes' workers read them (hashes and units)
    opened = json.loads((tmp_path / "ray.json").read_text())
    assert opened, "the watch saw no store read at all"  # it reads the lock it created
    assert not [p for p in opened if p.startswith(f"{bucket}/in/")], opened
    # the control: one process maps the units itself, so the same watch sees the inputs read
    control = start_watched(
        [*pack_args(bucket, packed_demo_tokenizer, f"s3://{bucket}/one"), "--workers", "1"],
        tmp_path / "one.json",
        cluster.env,
    )
    _, err = control.communicate()
    assert control.returncode == 0, err
    seen = set(json.loads((tmp_path / "one.json").read_text()))
    assert {f"{bucket}/in/{n}" for n in NAMES} <= seen, seen

    store = fetched(bucket, "out", tmp_path / "store")
    one = fetched(bucket, "one", tmp_path / "one")
    manifest = json.loads((store / "manifest.json").read_text())
    mine = json.loads((local / "manifest.json").read_text())
    assert manifest["engine"]["name"] == "ray" and manifest["engine"]["workers"] == 2
    assert manifest["engine"]["units"] >= 20
    assert manifest["dataset_id"] == mine["dataset_id"]
    assert [i["path"] for i in manifest["inputs"]] == [f"s3://{bucket}/in/{n}" for n in NAMES]
    assert [i["sha256"] for i in manifest["inputs"]] == [i["sha256"] for i in mine["inputs"]]
    assert manifest["shards"] == mine["shards"] and len(manifest["shards"]) > 2
    assert manifest["stats"] == mine["stats"]
    names = sorted(p.name for p in local.iterdir() if p.name != "manifest.json")
    assert sorted(p.name for p in store.iterdir() if p.name != "manifest.json") == names
    differ = [n for n in names if (store / n).read_bytes() != (local / n).read_bytes()]
    assert differ == ["README.md", "examples.parquet", "rejects.jsonl"]  # sources as given
    card = zip(*((f / "README.md").read_text().splitlines() for f in (store, local)), strict=True)
    changed = [a for a, b in card if a != b]  # the card's hash of the index's SHA-256, alone
    assert len(changed) == 1 and changed[0].startswith('- {"config_name": "examples"'), changed
    assert all(n.endswith(".parquet") for n in names if n.startswith("shard-"))
    same_but_sources(store, local, bucket, stored["folder"])
    for n in names:  # the one-process store pack: the same bytes as the two nodes'
        assert (one / n).read_bytes() == (store / n).read_bytes(), n

    before, after = train_a_few_steps(f"s3://{bucket}/out")  # torch imported: skipped without
    assert after < before, (before, after)
    report = verify_dataset(f"s3://{bucket}/out", VerifyOptions())  # every stage, the model's too
    assert not len(report.findings) and not report.not_run
    assert "model" in report.checks
    assert {c["status"] for c in report.checks.values()} == {"passed"}, report.checks
    assert report.checks["source"]["status"] == "passed"  # the inputs read from the store
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in json.dumps(manifest)
