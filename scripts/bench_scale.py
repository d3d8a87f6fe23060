"""Benchmark the engines side by side: one process, local workers, Ray; stage costs; planning.

    python scripts/bench_scale.py                       # the Qwen3 finding, engines, stages
    python scripts/bench_scale.py --workers 1,2,4,8,16  # scaling on a machine with more cores
    python scripts/bench_scale.py --plan-sizes 10000000,100000000 --skip-e2e

Part 1 (the Qwen3 finding): ``pack`` of ``--records`` multi-turn chats of ``../shared/data``
with the Qwen3 tokenizer and its training template, against raw ``Tokenizer.encode_batch``
on the same texts rendered beforehand (tokenizer loaded beforehand, not timed), for each
``--workers`` count on the local engine and on Ray; runs alternate, ratios are medians of
pairs with their range.  Part 1b: the same through ``packshard pack``, a process per job
(each starts its own workers).  Part 2: what one job spends per stage (CPU seconds per million
tokens: hashing, map, plan, write, driver merge and the rest), measured by running the unit
path in this process; from it, the projected throughput on 16, 64 and 256 cores (Amdahl,
with the driver's part serial).  Part 3: what loading and rendering cost (tokenizer load,
template compile, render per record).  Part 4: the planner on ``--plan-sizes`` lognormal
lengths, with the driver's peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "data"
QWEN = SHARED / "tokenizers" / "qwen3"
TEMPLATE = QWEN / "chat_template.training.jinja"
MULTI_TURN = (
    "fastchat_dummy_conversation.json",
    "llamafactory_glaive_toolcall_en_demo.json",
    "anthropic_cookbook_json_mode_dataset.jsonl",
    "openai_cookbook_toy_chat_fine_tuning.jsonl",
)


def write_chats(folder: Path, records: int) -> Path:
    """``records`` multi-turn chats from the shared datasets, cycled, as one JSONL file."""
    from packshard.ingest.read.sources import expand_inputs, read_records

    values = []
    for f in expand_inputs([str(SHARED / "chat" / name) for name in MULTI_TURN]):
        values += [r.value for r in read_records(f) if r.value is not None]
    path = folder / "chats.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for i in range(records):
            fh.write(json.dumps(values[i % len(values)], ensure_ascii=False) + "\n")
    return path


def rendered_texts(data: Path) -> list[str]:
    from packshard.ingest.label.spans import render_example
    from packshard.ingest.normalize import normalize_record
    from packshard.ingest.read.sources import InputFile, read_records
    from packshard.ingest.template.render import load_template
    from packshard.ingest.tokens.tokenizer import load_tokenizer

    bundle = load_tokenizer(str(QWEN))
    template = load_template(str(TEMPLATE), bundle)
    texts = []
    for raw in read_records(InputFile(str(data), data)):
        try:
            texts.append(render_example(normalize_record(raw), template, bundle, "auto").text)
        except Exception:  # a record pack rejects: no text to encode
            continue
    return texts


def config(data: Path, out: Path, **options: object):
    from packshard.pack import PackConfig

    settings = {"max_seq_len": 4096, "template": str(TEMPLATE), "overwrite": True}
    settings.update(options)
    return PackConfig.build(inputs=(str(data),), tokenizer=str(QWEN), out=str(out), **settings)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}× ({min(values):.2f}–{max(values):.2f})"


def ratios(base: list[float], ours: list[float]) -> list[float]:
    """Throughput of ours relative to base, pair by pair (runs alternate)."""
    return [b / o for b, o in zip(base, ours, strict=True)]


def engines_part(args, folder: Path) -> dict:
    """Part 1: raw encode_batch vs pack on each engine, alternating, medians of pairs."""
    from packshard.ingest.tokens.tokenizer import load_tokenizer
    from packshard.pack import pack_dataset

    data = write_chats(folder, args.records)
    texts = rendered_texts(data)
    tok = load_tokenizer(str(QWEN)).tokenizer
    batches = [texts[i : i + 1024] for i in range(0, len(texts), 1024)]

    def raw() -> None:
        for batch in batches:
            sum(len(e.ids) for e in tok.encode_batch(batch, add_special_tokens=False))

    runs = {"raw": raw}
    split = max(1, data.stat().st_size // (2 * max(args.workers)) + 1)  # 2 units a worker
    for w in args.workers:
        runs[f"local×{w}"] = lambda w=w: pack_dataset(
            config(data, folder / "out", workers=w, split_bytes=split)
        )
    if args.ray:
        for w in sorted({min(2, max(args.workers)), max(args.workers)}):
            runs[f"ray×{w}"] = lambda w=w: pack_dataset(
                config(data, folder / "out", engine="ray", workers=w, split_bytes=split)
            )
    if args.ray:  # a cluster that is already up, as with --ray-address; its start is shown apart
        import os

        import ray

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        start = time.perf_counter()
        ray.init(
            address="local",
            num_cpus=max(args.workers),
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
            object_store_memory=256 << 20,
        )
        print(
            f"Ray local cluster start: {time.perf_counter() - start:.1f} s (once per job when "
            "packshard starts it; not in the figures below)"
        )
    manifest = pack_dataset(config(data, folder / "out")).manifest  # warms caches
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            times[name].append(timed(fn))
    tokens = manifest["stats"]["tokens"]
    lines = [
        f"data: {args.records:,} multi-turn chats, {tokens:,} tokens packed "
        f"(Qwen3 tokenizer, training template), {len(texts):,} rendered; {args.rounds} rounds"
    ]
    for name, values in times.items():
        line = f"  {name:10s} best {min(values):6.2f} s  median {statistics.median(values):6.2f} s"
        if name != "raw":
            line += f"  raw/pack {spread(ratios(times['raw'], values))}"
            if "local×1" in times:
                line += f"  vs local×1 {spread(ratios(times['local×1'], values))}"
        lines.append(line)
    for w in args.workers:
        if args.ray and f"ray×{w}" in times and f"local×{w}" in times:
            ratio = [loc / r for loc, r in zip(times[f"local×{w}"], times[f"ray×{w}"], strict=True)]
            lines.append(f"  ray×{w} / local×{w} throughput: {spread(ratio)} (target ≥ 0.80×)")
    if "local×2" in times:
        ratio = [o / t for o, t in zip(times["local×1"], times["local×2"], strict=True)]
        lines.append(f"  local×2 / local×1 throughput: {spread(ratio)} (target ≥ 1.00×)")
    print("\n".join(lines))
    return {"data": data, "tokens": tokens}


def stages_part(data: Path, folder: Path, tokens: int) -> None:
    """Part 2: CPU seconds per stage per million tokens, and the projection."""
    import packshard.pack.units.scale as scale
    from packshard.engine.base import SerialEngine
    from packshard.pack import pack_dataset

    spent: dict[str, float] = {}

    class Timing(SerialEngine):
        def run(self, fn, args, keys, on_result=None, on_started=None):
            start = time.process_time()
            out = super().run(fn, args, keys, on_result, on_started)
            spent[fn.__name__] = spent.get(fn.__name__, 0.0) + time.process_time() - start
            return out

    from contextlib import contextmanager

    @contextmanager
    def timing_engine(options, env=None, warm=None):
        yield Timing()

    saved_open, saved_merge, saved_plan = scale.open_engine, scale.merge_units, None
    import packshard.pack.pipeline as pipeline

    def merge(*a, **k):
        start = time.process_time()
        out = saved_merge(*a, **k)
        spent["merge"] = time.process_time() - start
        return out

    saved_plan = pipeline.plan_examples

    def plan(*a, **k):
        start = time.process_time()
        out = saved_plan(*a, **k)
        spent["plan"] = time.process_time() - start
        return out

    serial_cpu, busy = [], []
    for _ in range(2):
        start, wall = time.process_time(), time.perf_counter()
        pack_dataset(config(data, folder / "serial"))
        serial_cpu.append(time.process_time() - start)
        busy.append(serial_cpu[-1] / (time.perf_counter() - wall))
    from packshard.pack.units.map import warm_worker

    # a worker loads the tokenizer and compiles the template once, before its first unit (the
    # fork server's warm-up): a cost per worker, shown by part 3, not per token of the map
    warm_worker((str(QWEN), str(TEMPLATE), "reference"))
    saved_load = scale.load_tokenizer

    def load(*a, **k):
        start = time.process_time()
        out = saved_load(*a, **k)
        spent["load"] = time.process_time() - start
        return out

    scale.open_engine, scale.merge_units, pipeline.plan_examples = timing_engine, merge, plan
    scale.load_tokenizer = load
    try:
        start = time.process_time()
        pack_dataset(
            config(data, folder / "stages", resume=True, split_bytes=data.stat().st_size // 8)
        )
        total = time.process_time() - start
    finally:
        scale.open_engine, scale.merge_units, pipeline.plan_examples = (
            saved_open,
            saved_merge,
            saved_plan,
        )
        scale.load_tokenizer = saved_load
    stages = {
        "hash": spent.get("_hash", 0.0),
        "map": spent.get("map_unit", 0.0),
        "plan": spent.get("plan", 0.0),
        "write": spent.get("write_task", 0.0),
        "merge": spent.get("merge", 0.0),
    }
    fixed = spent.get("load", 0.0)  # the driver loads the tokenizer once per job
    # on its loader thread, while the first map task waits for it (the tasks share the
    # driver's load in one process): process_time counts it inside the map's window
    stages["map"] = max(0.0, stages["map"] - fixed)
    stages["driver rest"] = total - sum(stages.values()) - fixed
    print(f"fixed per job in the driver: tokenizer load {fixed:.2f} CPU s")
    print(
        f"CPU of the whole job, this process and its threads: one-process path "
        f"{min(serial_cpu):.2f} s, unit path (8 units, same process) {total:.2f} s: "
        f"{total / min(serial_cpu):.2f}× (the split/merge machinery's cost)"
    )
    cores = os.cpu_count() or 1
    print(
        f"one process keeps {max(busy):.2f} cores busy (the tokenizer's threads beside the main "
        f"thread): on {cores} cores --workers can give at most {cores / max(busy):.2f}× it"
    )
    per_m = {k: v / tokens * 1e6 for k, v in stages.items()}
    print(f"CPU seconds per million tokens (unit path in one process, {tokens:,} tokens):")
    for k, v in per_m.items():
        print(f"  {k:12s} {v:7.3f} s/Mtok")
    parallel = per_m["hash"] + per_m["map"] + per_m["write"]
    serial = per_m["plan"] + per_m["merge"] + per_m["driver rest"]
    print(
        f"  parallel (hash, map, write) {parallel:.3f} s/Mtok; serial (driver: merge, plan, index, "
        f"manifest) {serial:.3f} s/Mtok, plus the tokenizer load once per job"
    )
    for n in (16, 64, 256):
        rate = 1.0 / (serial + parallel / n)
        print(
            f"  projected at {n:3d} cores: {rate:6.2f} M tokens/s "
            f"({rate * 3600 / 1e3:.1f} G tokens/hour; "
            f"serial share {serial / (serial + parallel / n):.0%})"
        )


def command_line_part(data: Path, folder: Path, rounds: int, workers: int) -> None:
    """Part 1b: ``packshard pack`` from the command line, one process per job, alternating.

    Each job then starts its own fork server (imports and one tokenizer load for all its
    workers), which jobs inside one Python process (part 1) pay only once.
    """
    import subprocess

    exe = Path(sys.executable).with_name("packshard")
    base = [str(exe), "pack", str(data), "-t", str(QWEN), "--template", str(TEMPLATE)]
    base += ["--max-seq-len", "4096", "--overwrite", "-o", str(folder / "cli")]
    times: dict[int, list[float]] = {1: [], workers: []}
    for _ in range(rounds):
        for w in times:
            run = [*base, "--workers", str(w)]
            times[w].append(
                timed(lambda run=run: subprocess.run(run, check=True, capture_output=True))
            )
    ratio = ratios(times[1], times[workers])
    print(
        f"command line, a process per job: one process median {statistics.median(times[1]):.2f} s, "
        f"--workers {workers} {statistics.median(times[workers]):.2f} s: {spread(ratio)}"
    )


def loading_part() -> None:
    """Part 3: what loading the tokenizer and template and rendering one record cost."""
    from packshard.ingest.label.spans import render_example
    from packshard.ingest.normalize import normalize_record
    from packshard.ingest.read.sources import InputFile, read_records
    from packshard.ingest.template.render import load_template
    from packshard.ingest.tokens.tokenizer import load_tokenizer

    load = [timed(lambda: load_tokenizer(str(QWEN))) for _ in range(3)]
    bundle = load_tokenizer(str(QWEN))
    compile_s = [timed(lambda: load_template(str(TEMPLATE), bundle)) for _ in range(3)]
    template = load_template(str(TEMPLATE), bundle)
    path = SHARED / "chat" / "fastchat_dummy_conversation.json"
    convs = [normalize_record(r) for r in read_records(InputFile(str(path), path))]
    render = timed(lambda: [render_example(c, template, bundle, "auto") for c in convs])
    print(
        f"loading: Qwen3 tokenizer {min(load):.2f}–{max(load):.2f} s per load (once per worker "
        f"process, cached for its later tasks); template compile {min(compile_s) * 1e3:.1f} ms; "
        f"render {render / len(convs) * 1e6:.0f} µs per record ({len(convs)} ShareGPT chats)"
    )


def planning_part(sizes: list[int]) -> None:
    """Part 4: the planner on lognormal lengths (median 300), with peak memory."""
    from packshard.pack.plan.planner import plan_packs

    plan_packs(np.array([3, 1, 2], np.int64), 4, "bfd")
    for n in sizes:
        rng = np.random.default_rng(0)
        lengths = np.clip(np.round(rng.lognormal(np.log(300), 1.0, n)), 1, 4096).astype(np.int64)
        start = time.perf_counter()
        plan = plan_packs(lengths, 4096, "bfd")
        took = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        bound = -(-int(lengths.sum()) // 4096)
        print(
            f"plan bfd {n:>12,} lengths: {took:7.2f} s, {plan.num_rows:,} rows "
            f"(+{100 * (plan.num_rows / bound - 1):.4f}% over the bound), peak RSS {peak:,.0f} MiB"
        )
        del plan, lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="local worker counts, e.g. 1,2,4,8,16")
    parser.add_argument("--records", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-ray", dest="ray", action="store_false")
    parser.add_argument("--plan-sizes", default="10000000,100000000")
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument("--no-cli", dest="cli", action="store_false", help="skip part 1b")
    args = parser.parse_args()
    args.workers = [int(w) for w in args.workers.split(",")]
    if not QWEN.is_dir():
        sys.exit(f"needs the Qwen3 tokenizer at {QWEN}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if not args.skip_e2e:
            found = engines_part(args, folder)
            if args.cli and max(args.workers) > 1:
                command_line_part(found["data"], folder, args.rounds, max(args.workers))
            stages_part(found["data"], folder, found["tokens"])
            loading_part()
    planning_part([int(n) for n in args.plan_sizes.split(",") if n])


if __name__ == "__main__":
    main()
