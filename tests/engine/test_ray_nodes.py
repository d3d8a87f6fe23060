"""``--engine ray`` across two nodes: the same bytes as one process, and a node that vanishes.

A real cluster of two nodes (``tests/raynodes.py``: a head and a second raylet started with
``ray start --address``, each with its own object store and temp folder, one CPU each) runs
``pack`` as a user would: a separate driver process joins it with ``--ray-address``.  Every
map task reads its unit itself, on the node that runs it, and every write task writes its
shard into the output folder; the driver sends plans and receives per-example integers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packshard.demo import demo_data_path
from packshard.pack import PackConfig, pack_dataset
from tests.helpers import output_digests
from tests.raynodes import ROOT, RayNodes, ray_cli

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

SPLIT = 12_000  # bytes per unit: 26 units of the 300 KB input, so both nodes get many
OPTIONS = {"max_seq_len": 256, "template": "chatml", "shard_rows": 8, "split_bytes": SPLIT}
DRIVER = (
    "import json, sys\n"
    "from packshard.errors import PackshardError\n"
    "from packshard.pack import PackConfig, pack_dataset\n"
    "args = json.loads(sys.argv[1])\n"
    "config = PackConfig.build(**{**args, 'inputs': tuple(args['inputs'])})\n"
    "try:\n"
    "    pack_dataset(config)\n"
    "except PackshardError as exc:\n"
    "    print(f'error: {exc}', file=sys.stderr)\n"
    "    sys.exit(1)\n"
)


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    if ray_cli() is None:
        pytest.skip("the ray command is not installed (pip install 'packshard[ray]')")
    with RayNodes(cpus=1).start(2) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> Path:
    """The demo chats 20 times over (about 300 KB, 1,300 records, its broken line 20 times)."""
    path = tmp_path_factory.mktemp("nodes") / "chat.jsonl"
    path.write_bytes(demo_data_path().read_bytes() * 20)
    return path


@pytest.fixture(scope="module")
def local(chat, packed_demo_tokenizer, tmp_path_factory) -> Path:
    """The same pack by one local process: the bytes the cluster must give."""
    out = tmp_path_factory.mktemp("local") / "out"
    config = PackConfig.build(
        (str(chat),), str(packed_demo_tokenizer), str(out), workers=1, **OPTIONS
    )  # type: ignore[arg-type]
    pack_dataset(config)
    return out


def start_driver(cluster: RayNodes, chat: Path, tokenizer: Path, out: Path, **more: object):
    """Start ``pack`` in a driver process of its own that joins ``cluster``."""
    import json

    args = {
        "inputs": [str(chat)],
        "tokenizer": str(tokenizer),
        "out": str(out),
        "engine": "ray",
        "ray_address": cluster.address,
        **OPTIONS,
        **more,
    }
    env = {**cluster.env, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, json.dumps(args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def watch(cluster: RayNodes, driver: subprocess.Popen, kill: bool) -> bool:
    """Poll until the driver ends; return whether node 1 ran a task meanwhile.

    With ``kill``, node 1's raylet is killed the first time it is seen running a task.
    """
    seen = False
    while driver.poll() is None:
        if not seen and cluster.busy(1):
            seen = True
            if kill:
                cluster.kill_raylet(1)
        time.sleep(0.01)
    return seen


def published(out: Path) -> list[str]:
    """What a reader could take for a pack under or beside OUT: manifests and partial folders."""
    found = [str(p) for p in out.parent.rglob("manifest.json")]
    return found + [str(p) for p in out.parent.glob(f".{out.name}.partial-*")]


def test_two_nodes_give_the_bytes_of_one_process(cluster, chat, packed_demo_tokenizer, local):
    out = local.parent.parent / "two-nodes" / "out"
    out.parent.mkdir()
    driver = start_driver(cluster, chat, packed_demo_tokenizer, out)
    ran_on_second = watch(cluster, driver, kill=False)
    _, err = driver.communicate()
    assert driver.returncode == 0, err
    assert ran_on_second, "node 1 never ran a task: the run did not cross a node boundary"
    assert output_digests(out) == output_digests(local)
    import json

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["engine"]["name"] == "ray" and manifest["engine"]["workers"] == 2
    assert manifest["engine"]["units"] == 26
    assert not (out.parent / ".out.units").exists()  # the work folder is removed


@pytest.mark.parametrize("retries", [2, 0], ids=["retried", "no-retries"])
def test_a_node_killed_mid_pack_gives_the_same_bytes_or_a_clear_error(
    cluster, chat, packed_demo_tokenizer, local, tmp_path, retries
):
    out = tmp_path / "out"
    before = len(cluster.nodes)
    driver = start_driver(cluster, chat, packed_demo_tokenizer, out, max_retries=retries)
    killed = watch(cluster, driver, kill=True)
    _, err = driver.communicate()
    assert killed, "node 1 ran no task before the pack ended: nothing was killed"
    if retries:  # Ray reruns the lost node's tasks on the head: the same bytes
        assert driver.returncode == 0, err
        assert output_digests(out) == output_digests(local)
    else:  # nothing may rerun them: one clear line, and nothing published
        assert driver.returncode == 1
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        task = rf"{re.escape(str(chat))}( bytes \d+–\d+)?|shard-\d{{5}}\.parquet"  # any task
        assert re.fullmatch(
            rf"error: ({task}): failed 1 times \(its node \S+ "
            r"[0-9a-f]{8} died\); nothing was published \(fix the cause, then rerun with "
            r"--resume to keep the finished units\)",
            lines[0],
        ), err
        assert not out.exists()
        assert published(out) == []
    cluster.restart_node(1)  # for the next test
    assert len(cluster.nodes) == before
    assert os.path.isdir(cluster.temp[1])


REACH = (
    "import json, sys\n"
    "from pathlib import Path\n"
    "from packshard.engine.ray import RayEngine\n"
    "from packshard.errors import UsageError\n"
    "engine = RayEngine(1, sys.argv[1], 0, {})\n"
    "folder = Path(sys.argv[2])\n"
    "try:\n"
    "    seen = engine.unreached(folder)\n"
    "    control = engine.unreached(folder, expect='another token')\n"
    "    engine.check_reach([folder])\n"
    "    engine.unreached = lambda folder: ['10.0.0.7', '10.0.0.9']  # as a blind node answers\n"
    "    try:\n"
    "        engine.check_reach([folder])\n"
    "        error = None\n"
    "    except UsageError as exc:\n"
    "        error = str(exc)\n"
    "finally:\n"
    "    engine.close()\n"
    "print(json.dumps([seen, control, error, sorted(p.name for p in folder.iterdir())]))\n"
)


def test_every_node_is_asked_whether_it_sees_the_work_folder(cluster, tmp_path):
    import json

    env = {**cluster.env, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", REACH, cluster.address, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    seen, control, error, left = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == []  # both nodes read the driver's marker
    assert len(control) == 2  # the control: a token nobody wrote is missed on both nodes
    assert error is not None and error.startswith(f"{tmp_path}: not seen by nodes 10.0.0.7, ")
    assert "put it on storage every node mounts" in error
    assert left == []  # no marker left behind
