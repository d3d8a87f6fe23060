"""Object stores, side by side: which client library, what a store costs, and local speed kept.

    python scripts/bench_stores.py --part libraries   # pyarrow vs boto3 (vs s3fs), one server
    python scripts/bench_stores.py --part store              # pack and read: local folder vs s3://
    python scripts/bench_stores.py --part local --baseline ../before   # this tree vs another

Every part starts moto's S3 server on 127.0.0.1 itself where it needs one (``pip install
'moto[server]'``).  ``libraries`` times the operations packshard makes (one object written,
read whole, read in 1 MiB ranges as a Parquet reader does, a prefix listed) through each
library against the same server, alternating, median of ``--rounds``; ratios are to pyarrow.
moto is a Python server on the same 2 cores, so absolute speeds are the server's; the ratios
say what each client adds.  ``store`` packs the same records into a local folder and into
``s3://`` (inputs there too) and reads each pack whole with ``PackedDataset``, each in a fresh
process.  ``local`` times a local pack and a local read with this tree and with the tree at
``--baseline`` (another checkout: the commit before), alternating fresh processes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACK = "import sys; from packshard.cli import main; sys.argv[0] = 'packshard'; main()"
READ = (
    "import sys, time; from packshard.torch import PackedDataset; t = time.perf_counter(); "
    "c = time.process_time(); d = PackedDataset(sys.argv[1]); "
    "n = sum(int(d[i]['input_ids'].numel()) for i in range(len(d))); "
    "print(n, time.perf_counter() - t, time.process_time() - c)"
)


def start_server() -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(endpoint, timeout=2).close()
            break
        except OSError:
            time.sleep(0.1)
    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    os.environ.update(env)
    return proc, env


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def part_libraries(args: argparse.Namespace) -> None:
    import boto3
    import pyarrow.fs as pafs

    proc, _ = start_server()
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        size = args.mib << 20
        payload = os.urandom(size)
        for k in range(args.objects):
            client.put_object(Bucket="bench", Key=f"many/{k:05d}", Body=b"x")
        fs = pafs.FileSystem.from_uri("s3://bench")[0]
        ranges = [(i << 20, 1 << 20) for i in range(0, args.mib, max(1, args.mib // 32))]

        def arrow_ops() -> dict[str, Callable[[], object]]:
            def put() -> None:
                with fs.open_output_stream("bench/arrow.bin") as out:
                    out.write(payload)

            def get() -> bytes:  # the size known: one request (a stream's read() asks 64 KiB)
                with fs.open_input_file("bench/arrow.bin") as f:
                    return f.read_at(f.size(), 0)

            def ranged() -> None:
                with fs.open_input_file("bench/arrow.bin") as f:
                    for start, n in ranges:
                        f.read_at(n, start)

            def listing() -> object:
                return fs.get_file_info(pafs.FileSelector("bench/many", recursive=True))

            return {"put": put, "get": get, "ranges": ranged, "list": listing}

        def boto_ops() -> dict[str, Callable[[], object]]:
            def put() -> None:
                client.upload_fileobj(__import__("io").BytesIO(payload), "bench", "boto.bin")

            def get() -> bytes:
                return client.get_object(Bucket="bench", Key="boto.bin")["Body"].read()

            def ranged() -> None:
                for start, n in ranges:
                    client.get_object(
                        Bucket="bench", Key="boto.bin", Range=f"bytes={start}-{start + n - 1}"
                    )["Body"].read()

            def listing() -> object:
                pages = client.get_paginator("list_objects_v2").paginate(
                    Bucket="bench", Prefix="many/"
                )
                return [o for p in pages for o in p.get("Contents", [])]

            return {"put": put, "get": get, "ranges": ranged, "list": listing}

        libraries = {"pyarrow": arrow_ops(), "boto3": boto_ops()}
        try:
            import s3fs

            sfs = s3fs.S3FileSystem(endpoint_url=os.environ["AWS_ENDPOINT_URL"])

            def s_put() -> None:
                sfs.pipe_file("bench/s3fs.bin", payload)

            def s_get() -> bytes:
                return sfs.cat_file("bench/s3fs.bin")

            def s_ranged() -> None:
                with sfs.open("bench/s3fs.bin", "rb", block_size=1 << 20, cache_type="none") as f:
                    for start, n in ranges:
                        f.seek(start)
                        f.read(n)

            def s_list() -> object:
                sfs.invalidate_cache()
                return sfs.find("bench/many")

            libraries["s3fs"] = {"put": s_put, "get": s_get, "ranges": s_ranged, "list": s_list}
        except ImportError:
            print("s3fs not installed: compared pyarrow and boto3 only")
        times: dict[str, dict[str, list[float]]] = {n: {} for n in libraries}
        for _ in range(args.rounds):
            for op in ("put", "get", "ranges", "list"):
                for name, ops in libraries.items():
                    times[name].setdefault(op, []).append(timed(ops[op]))
        what = f"{len(ranges)} ranged reads of 1 MiB, {args.objects} objects listed"
        print(f"{args.mib} MiB object, {what}; median of {args.rounds}")
        for op in ("put", "get", "ranges", "list"):
            base = statistics.median(times["pyarrow"][op])
            cells = [
                f"{name} {statistics.median(t[op]):.3f} s ({statistics.median(t[op]) / base:.2f}x)"
                for name, t in times.items()
            ]
            print(f"  {op:7s}", "  ".join(cells))
    finally:
        proc.terminate()


def write_records(folder: Path, records: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "chat.jsonl"
    with open(path, "w") as out:
        for i in range(records):
            row = {"messages": [
                {"role": "user", "content": f"question {i}: " + "more words " * (i % 7 + 1)},
                {"role": "assistant", "content": f"answer {i}: " + "a reply " * (i % 11 + 1)},
            ]}  # fmt: skip
            out.write(json.dumps(row) + "\n")
    return path


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, str, float]:
    """Run ``cmd``; return its wall seconds, its output and its CPU seconds (with children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])}…: {done.stderr[-2000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, done.stdout, cpu


def part_store(args: argparse.Namespace, work: Path, tok: Path) -> None:
    import boto3

    proc, senv = start_server()
    try:
        data = write_records(work / "in", args.records)
        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        client.upload_file(str(data), "bench", "in/chat.jsonl")
        env = {**os.environ, **senv, "PYTHONPATH": str(ROOT)}
        common = pack_options(tok)
        pack_t: dict[str, list[float]] = {"local": [], "s3": []}
        read_t: dict[str, list[float]] = {"local": [], "s3": []}
        for _ in range(args.rounds):
            places = (("local", str(data), str(work / "out")),
                      ("s3", "s3://bench/in/chat.jsonl", "s3://bench/out"))  # fmt: skip
            for where, src, out in places:
                cmd = [sys.executable, "-c", PACK, "pack", src, *common, "-o", out]
                pack_t[where].append(run(cmd, env)[0])
                read_t[where].append(
                    float(run([sys.executable, "-c", READ, out], env)[1].split()[1])
                )
        print(f"{args.records:,} records, median of {args.rounds} (fresh processes)")
        for label, t in (("pack (whole process)", pack_t), ("read every row", read_t)):
            a, b = statistics.median(t["local"]), statistics.median(t["s3"])
            print(f"  {label:22s} local {a:.2f} s   s3:// {b:.2f} s   ratio {b / a:.2f}x")
    finally:
        proc.terminate()


def pack_options(tok: Path) -> list[str]:
    """Return the options every timed ``pack`` of this script takes after its input."""
    options = ["-t", str(tok), "--template", "chatml", "--max-seq-len", "1024"]
    return [*options, "--quiet", "--overwrite"]


def part_local(args: argparse.Namespace, work: Path, tok: Path) -> None:
    if not args.baseline:
        raise SystemExit("--part local needs --baseline (another checkout of packshard)")
    data = write_records(work / "in", args.records)
    trees = {"this": str(ROOT), "baseline": str(Path(args.baseline).resolve())}
    common = pack_options(tok)
    times: dict[str, dict[str, list[float]]] = {
        k: {"pack wall": [], "pack CPU": [], "read wall": [], "read CPU": []} for k in trees
    }
    shards: dict[str, bytes] = {}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": tree}
            out = work / f"out-{name}"
            cmd = [sys.executable, "-c", PACK, "pack", str(data), *common, "-o", str(out)]
            wall, _, cpu = run(cmd, env)
            times[name]["pack wall"].append(wall)
            times[name]["pack CPU"].append(cpu)
            _, text, _ = run([sys.executable, "-c", READ, str(out)], env)
            times[name]["read wall"].append(float(text.split()[1]))
            times[name]["read CPU"].append(float(text.split()[2]))
            shards[name] = b"".join(p.read_bytes() for p in sorted(out.glob("shard-*.parquet")))
            shards[name] += (out / "examples.parquet").read_bytes()
    print(f"{args.records:,} records, median of {args.rounds}, alternating fresh processes")
    for label in times["this"]:
        a, b = statistics.median(times["baseline"][label]), statistics.median(times["this"][label])
        print(f"  {label:10s} baseline {a:.2f} s   this tree {b:.2f} s   ratio {b / a:.3f}x")
    print("  shards and index byte-identical:", shards["this"] == shards["baseline"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("libraries", "store", "local"), required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=64, help="object size of --part libraries")
    parser.add_argument(
        "--objects", type=int, default=500, help="objects listed by --part libraries"
    )
    parser.add_argument("--records", type=int, default=20000, help="records of --part store/local")
    parser.add_argument("--baseline", help="another packshard checkout (--part local)")
    args = parser.parse_args()
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.part == "libraries":
        part_libraries(args)
    else:
        sys.path.insert(0, str(ROOT))
        from packshard.demo import build_demo_tokenizer

        with tempfile.TemporaryDirectory() as tmp:
            tok = build_demo_tokenizer(Path(tmp) / "tok")
            (part_store if args.part == "store" else part_local)(args, Path(tmp), tok)
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
