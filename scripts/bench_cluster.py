"""Benchmark ``pack`` on a cluster of Ray nodes against one local process, side by side.

    python scripts/bench_cluster.py                  # 6,000 Qwen3 chats, 3 rounds
    python scripts/bench_cluster.py --records 20000 --rounds 5
    python scripts/bench_cluster.py --store          # the nodes pack s3://… into s3://…

The same input is packed, in alternating rounds, by

* ``one process``: ``pack --workers 1``, the baseline;
* ``1 node``: a Ray cluster of one node with one CPU (``ray start --head``), joined by a
  driver process with ``--ray-address``;
* ``2 nodes``: a head and a second node started with ``ray start --address``, one CPU and
  one object store each (``tests/raynodes.py``), joined the same way.

Every run is a fresh ``pack`` process (its imports, tokenizer load and the cluster join
counted; the clusters are started before the rounds and not counted).  Reported per run:
wall seconds, tokens per second, tokens per second per node, and the CPU seconds each node's
processes spent (its raylet, workers and stores; the driver's own are apart), so the share
of the work each node took is measured, not assumed.  Ratios are medians over rounds with
their range.  Every run's shards and index are checked to be byte-identical to the
baseline's.  The inputs are the shared chat sets (``../shared/data``) cycled, the Qwen3
tokenizer and its training template, ``--max-seq-len 4096``; ``--split-bytes`` cuts them
into units so that both nodes have work.

With ``--store`` the clusters pack ``s3://bench/in/*.jsonl`` into ``s3://bench/out`` on
moto's S3 server, started here on 127.0.0.1 before the nodes (whose workers find it in their
environment); the baseline stays the one local process on local files, and the two nodes
also pack the local file into a local folder in each round (``2 nodes, local file →
folder``), so that what the store costs the cluster is measured side by side.  Each node's workers
read their units and hash the inputs in ranged requests; the driver reads none.  The shards
must be byte-identical to the baseline's and the examples index equal but for its
``source`` column (the URL where the baseline has the path).  Records per second and tokens
per second per node are printed beside each node's CPU seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

FOLDER = "2 nodes, local file → folder"
PACK = "import sys; from packshard.cli.commands import main; sys.argv[0] = 'packshard'; main()"


def digests(out: Path) -> dict[str, str]:
    """SHA-256 of every file of a pack but its manifest (which has a timestamp)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.iterdir())
        if p.name != "manifest.json"
    }


class NodeCpu:
    """CPU seconds each node's processes spend while a run lasts, sampled on a thread.

    Ray starts a job's workers when the job joins and ends them when it leaves, so a worker
    is seen only while the run lasts: its last sample is what it spent (a node's raylet and
    stores, up before the run, count from the first sample on).
    """

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[int, float]] = {}
        self._stop = threading.Event()
        self._sample()  # before the run: the base of what was up already
        self.first = {pid: cpu for pid, (_, cpu) in self.last.items()}
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psutil

        for index in range(len(self.cluster.nodes)):
            for proc in self.cluster.processes(index):
                try:
                    times = proc.cpu_times()
                except psutil.Error:
                    continue
                self.last[proc.pid] = (index, times.user + times.system)

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self._sample()

    def stop(self) -> list[float]:
        """Stop sampling; return each node's CPU seconds over the run."""
        self._stop.set()
        self._thread.join()
        self._sample()
        spent = [0.0] * len(self.cluster.nodes)
        for pid, (index, cpu) in self.last.items():
            spent[index] += cpu - self.first.get(pid, 0.0)
        return spent


def store_digests(url: str, local: Path) -> dict[str, str]:
    """:func:`digests` of the pack at ``url``, its index with ``source`` set to the local one's."""
    import pyarrow.parquet as pq

    from packshard.store import fetched_out

    with fetched_out(url) as folder:
        got = digests(folder)
        index = pq.read_table(folder / "examples.parquet")
    mine = pq.read_table(local / "examples.parquet")
    same = [n for n in mine.column_names if n != "source" and index[n].equals(mine[n])]
    sources = {Path(s).name for s in mine["source"].to_pylist()}
    ok = len(same) == len(mine.column_names) - 1
    ok = ok and {s.rsplit("/", 1)[-1] for s in index["source"].to_pylist()} == sources
    for name in ("examples.parquet", "rejects.jsonl", "README.md"):  # name the sources
        got[name] = digests(local)[name] if ok else "differs"
    return got


def run_pack(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"pack failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--split-bytes", type=int, default=1 << 20)
    parser.add_argument("--store", action="store_true", help="the clusters pack s3:// into s3://")
    args = parser.parse_args()

    from bench_scale import QWEN, TEMPLATE, write_chats

    from tests.raynodes import RayNodes

    work = Path(tempfile.mkdtemp(prefix="packshard-cluster-"))
    clusters: dict[str, RayNodes] = {}
    server = None
    try:
        data = write_chats(work, args.records)
        source, target = str(data), None
        if args.store:  # before the nodes: their workers take its address from the environment
            import boto3
            from bench_stores import start_server

            server, _ = start_server()
            boto3.client("s3").create_bucket(Bucket="bench")
            boto3.client("s3").upload_file(str(data), "bench", f"in/{data.name}")
            source, target = "s3://bench/in/*.jsonl", "s3://bench/out"
        options = ["-t", str(QWEN), "--template", str(TEMPLATE), "--max-seq-len", "4096"]
        options += ["--no-progress", "--split-bytes", str(args.split_bytes), "--overwrite"]
        common = [sys.executable, "-c", PACK, "pack", str(data), *options]
        joined = [sys.executable, "-c", PACK, "pack", source, *options]
        clusters["1 node"] = RayNodes(cpus=1).start(1)
        clusters["2 nodes"] = RayNodes(cpus=1).start(2)
        runs = ["one process", *clusters]
        if args.store:  # the same nodes on the local file into a local folder, beside
            clusters[FOLDER] = clusters["2 nodes"]
            runs.append(FOLDER)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        wall: dict[str, list[float]] = {name: [] for name in runs}
        cpu: dict[str, list[list[float]]] = {name: [] for name in runs}
        base: dict[str, str] | None = None
        tokens = records = 0
        kept = work / "baseline"  # the one process's pack: what the store packs are held to
        for _ in range(args.rounds):
            for name in runs:
                out = work / "out"
                if name == "one process":
                    cmd = [*common, "--workers", "1", "-o", str(out)]
                    wall[name].append(run_pack(cmd, env))
                else:
                    cluster = clusters[name]
                    sampled = NodeCpu(cluster)
                    stored = target is not None and name != FOLDER
                    cmd = [*(joined if stored else common), "--engine", "ray"]
                    cmd += ["--ray-address", cluster.address, "-o", target or str(out)]
                    wall[name].append(
                        run_pack(cmd if stored else [*cmd[:-1], str(out)], cluster.env)
                    )
                    cpu[name].append(sampled.stop())
                if target is not None and name not in ("one process", FOLDER):
                    got = store_digests(target, kept)
                else:
                    got = digests(out)
                if base is None:
                    base = got
                    stats = json.loads((out / "manifest.json").read_text())["stats"]
                    tokens, records = stats["tokens"], stats["records"]
                    shutil.copytree(out, kept)
                elif got != base:
                    raise SystemExit(f"{name}: the shards or index differ from one process's")
                shutil.rmtree(out, ignore_errors=True)
        where = f"{source} → {target} on the nodes" if target else "local files"
        print(f"{args.records:,} chats ({records:,} records), {tokens:,} tokens, {where}, "
              f"{args.rounds} rounds (median, range)")  # fmt: skip
        first = statistics.median(wall["one process"])
        for name in runs:
            nodes = 1 if name == "one process" else len(clusters[name].nodes)
            med = statistics.median(wall[name])
            speed = [tokens / w for w in wall[name]]
            ratio = [b / w for b, w in zip(wall["one process"], wall[name], strict=True)]
            rate = [records / w for w in wall[name]]
            line = (
                f"{name:<31} {med:6.2f} s  {statistics.median(speed):>10,.0f} tokens/s  "
                f"{statistics.median(speed) / nodes:>10,.0f} per node  "
                f"{statistics.median(rate) / nodes:>7,.0f} records/s per node  "
                f"vs one process {statistics.median(ratio):.2f}× "
                f"({min(ratio):.2f}–{max(ratio):.2f})"
            )
            if cpu[name]:
                per_node = [statistics.median(c[i] for c in cpu[name]) for i in range(nodes)]
                line += "  node CPU s " + " / ".join(f"{c:.1f}" for c in per_node)
            print(line)
        print(f"one process: {first:.2f} s; every run gave the same shards and index")
    finally:
        for cluster in set(clusters.values()):
            cluster.close()
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
