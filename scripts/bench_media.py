"""Benchmark: counting an image record's vision tokens from headers vs through the processor.

Planning needs each image's placeholder count.  packshard reads it from the file's header
(``Image.open(path).size``, no pixel decoded) and the resize rule
(:mod:`packshard.ingest.media.grid`); the usual way decodes every image through transformers'
Qwen2-VL image processor and reads ``image_grid_thw``.  Both sides run in this process, on
one core, over the same records: LLaMA-Factory-style ``messages`` + ``images`` records, each
naming one of ``--files`` distinct image files (copies of the shared images, renamed, so no
file's header is read twice in a pass).  The header side is the whole counting step of
``pack`` for a record: JSON parse, normalize (find, stat and size each image), grid, count.
``count`` times the counting step alone (find, stat, header, grid), ``normalize`` the whole
per-record work.  Both sides are timed in alternation, ``--repeat`` times, the file pages
warm for both; each prints records per second and the ratio, with CPU seconds.

``--family qwen3_vl`` counts by Qwen3-VL's rule and decodes through the processor as its
checkpoints set it (patch 16).  ``--plan N`` also times the planner on N synthetic
vision-language examples (lengths 200..2,000 at 4,096 tokens, 1 or 2 images, 50..400 vision
tokens each): plain ``bfd`` against the capped planner with caps that never bind (the same
plan) and with caps that do (3 images, 1,024 vision tokens a row), median of ``--repeat``.

Usage: python scripts/bench_media.py [--records 20000] [--files 2000] [--baseline 400]
       [--family qwen2_vl|qwen3_vl] [--plan 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packshard.ingest.media.files import find_media
from packshard.ingest.media.grid import image_grid, vision_tokens
from packshard.ingest.normalize import normalize_record
from packshard.ingest.types import RawRecord
from packshard.options import VISION_RULES, VisionCaps, VisionRule
from packshard.records import SourceRef

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "multimodal"


def make_corpus(folder: Path, records: int, files: int) -> list[str]:
    """Write ``files`` image copies under ``folder`` and return ``records`` JSON lines."""
    images = sorted(p for p in (SHARED / "images").iterdir() if p.suffix in (".png", ".jpg"))
    images += sorted((SHARED / "mllm_demo_data").glob("*.jpg"))
    (folder / "imgs").mkdir()
    names = []
    for k in range(files):
        src = images[k % len(images)]
        name = f"imgs/{k:06d}{src.suffix}"
        shutil.copyfile(src, folder / name)
        names.append(name)
    lines = []
    for i in range(records):
        record = {
            "messages": [
                {"role": "user", "content": f"<image>What is in picture {i}?"},
                {"role": "assistant", "content": "A photograph."},
            ],
            "images": [names[i % files]],
        }
        lines.append(json.dumps(record))
    return lines


def count_headers(lines: list[str], source: str, rule: VisionRule) -> int:
    """The counting step of pack: parse, normalize (find and size images), grid, count."""
    total = 0
    for n, line in enumerate(lines, 1):
        conv = normalize_record(RawRecord(SourceRef(source, n), "bench", json.loads(line)))
        for m in conv.media:
            total += vision_tokens(image_grid(m.width, m.height, rule), rule)
    return total


def count_files(lines: list[str], root: str, rule: VisionRule) -> int:
    """The counting step alone: each record's images found, stat'ed, sized, gridded, counted.

    The records' image lists are taken from the parsed records beforehand (untimed): JSON
    parsing and message normalization are what every record costs, with or without images.
    """
    total = 0
    for k, path in enumerate(lines):
        m = find_media(path, root, f"image {k}")
        total += vision_tokens(image_grid(m.width, m.height, rule), rule)
    return total


def count_processor(lines: list[str], folder: Path, processor: object) -> int:
    """The usual way: decode each image through the processor and read its grid."""
    from PIL import Image

    total = 0
    for line in lines:
        for name in json.loads(line)["images"]:
            with Image.open(folder / name) as image:
                got = processor(images=[image.convert("RGB")], return_tensors="np")  # type: ignore[operator]
            total += int(got["image_grid_thw"].prod(axis=1).sum()) // 4
    return total


def timed(fn: object, *args: object) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)  # type: ignore[operator]
    return time.perf_counter() - wall, time.process_time() - cpu, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--baseline", type=int, default=400, help="records the processor decodes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--family", choices=tuple(VISION_RULES), default="qwen2_vl")
    parser.add_argument("--plan", type=int, default=0, help="examples the planners place")
    args = parser.parse_args()
    rule = VISION_RULES[args.family]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    processor = Qwen2VLImageProcessorPil(**rule.processor_options())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        lines = make_corpus(folder, args.records, args.files)
        source = str(folder / "chat.jsonl")
        sub = lines[: args.baseline]
        assert count_headers(sub, source, rule) == count_processor(sub, folder, processor)
        paths = [p for line in lines for p in json.loads(line)["images"]]
        assert count_files(paths, tmp, rule) == count_headers(lines, source, rule)
        heads, procs, files = [], [], []
        for _ in range(args.repeat):
            files.append(timed(count_files, paths, tmp, rule))
            heads.append(timed(count_headers, lines, source, rule))
            procs.append(timed(count_processor, sub, folder, processor))
        f_wall = statistics.median(x[0] for x in files)
        f_cpu = statistics.median(x[1] for x in files)
        h_wall = statistics.median(x[0] for x in heads)
        h_cpu = statistics.median(x[1] for x in heads)
        p_wall = statistics.median(x[0] for x in procs)
        p_cpu = statistics.median(x[1] for x in procs)
        h_rate, p_rate = args.records / h_wall, args.baseline / p_wall
        print(
            f"records {args.records:,} (processor side: the first {args.baseline:,}), "
            f"{args.files:,} distinct image files, median of {args.repeat}, rule {rule.name}"
        )
        print(
            f"count      {args.records / f_wall:10,.0f} records/s  "
            f"({args.records / f_cpu:,.0f} per CPU-s)  find, stat, header, grid"
        )
        print(
            f"normalize  {h_rate:10,.0f} records/s  ({args.records / h_cpu:,.0f} per CPU-s)  "
            "the same plus JSON parse and message normalization"
        )
        print(f"processor  {p_rate:10,.0f} records/s  ({args.baseline / p_cpu:,.0f} per CPU-s)")
        print(
            f"ratio      {h_rate / p_rate:10.1f}x wall, "
            f"{(args.records / h_cpu) / (args.baseline / p_cpu):.1f}x CPU (normalize / processor)"
        )
        print(f"load       {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    if args.plan:
        bench_plan(args.plan, args.repeat)


def bench_plan(n: int, repeat: int) -> None:
    """Time plain bfd against the capped planner, caps not binding and binding."""
    import numpy as np

    from packshard.pack.plan.planner import plan_packs
    from packshard.pack.plan.vision import plan_capped

    rng = np.random.default_rng(0)
    lengths = rng.integers(200, 2000, n)
    images = rng.integers(1, 3, n)
    vision = np.minimum(lengths - 10, images * rng.integers(50, 400, n))
    big = 4096
    sides = {
        "plain bfd": lambda: plan_packs(lengths, big, "bfd"),
        "capped, caps not binding": lambda: plan_capped(
            lengths, images, vision, big, "bfd", VisionCaps(big, big)
        ),
        "capped, 3 images / 1,024 vision": lambda: plan_capped(
            lengths, images, vision, big, "bfd", VisionCaps(3, 1024)
        ),
    }
    for side in sides.values():
        side()  # numba's cache loaded, not timed
    times = {name: [] for name in sides}
    rows = {}
    for _ in range(repeat):
        for name, side in sides.items():
            wall = time.perf_counter()
            rows[name] = side().num_rows
            times[name].append(time.perf_counter() - wall)
    base = statistics.median(times["plain bfd"])
    for name, values in times.items():
        t = statistics.median(values)
        print(f"plan {n:,}  {name:32s} {t:8.3f} s  {rows[name]:,} rows  {t / base:6.1f}x plain")
    print(f"load       {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")


if __name__ == "__main__":
    main()
