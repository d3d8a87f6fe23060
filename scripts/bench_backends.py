"""Benchmark: end-to-end ``pack`` tokens/s, fast and reference backends, against bare encoding.

For each family (qwen3 with its training template, phi-3-mini with its config template; phi-2
with ChatML on request) the shared chat datasets are copied until they hold ``--min-tokens``
tokens, then, interleaved, best of ``--rounds``:

(a) ``packshard pack --backend fast``: a whole process (startup, imports, tokenizer load, canary
    included), wall time; tokens from the manifest (``stats.tokens_in``);
(b) the same with ``--backend reference``;
(c) bare ``tokenizers``: ``Tokenizer.encode_batch`` over the same rendered texts (rendered in
    this process beforehand, not timed), batches of 1,024, ids read out: the baseline the
    issue names; (d) ``encode_batch_fast`` (no offsets) beside it.

Ratios: tokens/s of (a) and (b) over (c); (a) over (b), in wall time and in CPU seconds (the
child's user + system time; ``encode_batch`` runs on every core, so on a busy machine the CPU
ratio is the steadier one).  Run it at 2M tokens here; the final figure wants
``--min-tokens 20000000`` (startup then weighs what it weighs in a real job).  Sizes given
comma-separated (``--min-tokens 20000000,50000000``) run one after the other, and a last table
gives the ratios by size: ``pack``'s fixed costs (startup, the last shard's write) weigh less
as the job grows.

With ``--floor``, the CPU seconds of the bare library calls alone (parse, render, encode,
write, imports: :func:`floor`) and the ratio to ``encode_batch`` they would allow.

With ``--trl``, (e) TRL's own preparation of the same chat records: ``datasets.map`` with
``apply_chat_template(..., return_assistant_tokens_mask=True)`` (transformers, same tokenizer
and template), then ``trl.pack_dataset(strategy="bfd")``, CPU seconds in this process
(tokenizer load not counted); the ratio is (e)'s CPU seconds over (a)'s per token.

    python scripts/bench_backends.py [--min-tokens 2000000[,20000000,…]] [--rounds 1]
        [--families qwen3,phi3] [--trl] [--floor]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHARED = REPO.parent / "shared" / "data"
FAMILIES = {
    "qwen3": ("qwen3", str(SHARED / "tokenizers/qwen3/chat_template.training.jinja")),
    "phi3": ("phi-3-mini", None),
    "phi2": ("phi-2", "chatml"),
}
MAX_SEQ_LEN = 4096


def rendered_texts(tokenizer: Path, template: str | None, files: list[Path]) -> list[str]:
    """The texts ``pack`` encodes (each example's rendered text), in one process, untimed."""
    from packshard.ingest.label.spans import render_examples
    from packshard.ingest.normalize import normalize_record
    from packshard.ingest.read.sources import expand_inputs, read_records
    from packshard.ingest.template.render import load_template
    from packshard.ingest.tokens.tokenizer import load_tokenizer
    from packshard.ingest.types import IngestOptions

    bundle = load_tokenizer(str(tokenizer))
    tmpl = load_template(template, bundle)
    options = IngestOptions()
    texts = []
    for f in expand_inputs([str(p) for p in files]):
        for raw in read_records(f, options=options):
            try:
                texts += [
                    r.text for r in render_examples(normalize_record(raw), tmpl, bundle, options)
                ]
            except Exception:  # rejected records are not encoded by pack either
                continue
    return texts


def chats(files: list[Path]) -> list[list[dict]]:
    """The chat records of ``files`` as message dicts (what TRL's preparation is given)."""
    from packshard.ingest.normalize import normalize_record
    from packshard.ingest.read.sources import expand_inputs, read_records
    from packshard.ingest.types import IngestOptions

    out = []
    for f in expand_inputs([str(p) for p in files]):
        for raw in read_records(f, options=IngestOptions()):
            try:
                conv = normalize_record(raw)
            except Exception:
                continue
            if conv.messages:
                out.append([{"role": m.role, "content": m.content} for m in conv.messages])
    return out


def trl(tokenizer: Path, template: str | None, records: list[list[dict]]) -> tuple[float, int]:
    """CPU seconds and tokens of TRL's preparation: map with assistant masks, then BFD."""
    from datasets import Dataset, disable_progress_bars
    from transformers import AutoTokenizer
    from trl.data_utils import pack_dataset

    disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    if template is not None and template.endswith(".jinja"):
        tok.chat_template = Path(template).read_text()
    ds = Dataset.from_dict({"messages": records})
    start = time.process_time()

    def prepare(example: dict) -> dict:
        out = tok.apply_chat_template(
            example["messages"], tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True,
        )  # fmt: skip
        return {"input_ids": out["input_ids"], "assistant_masks": out["assistant_masks"]}

    mapped = ds.map(prepare, remove_columns=["messages"])
    packed = pack_dataset(mapped, seq_length=MAX_SEQ_LEN, strategy="bfd")
    seconds = time.process_time() - start
    return seconds, sum(len(x) for x in packed["input_ids"])


def bare(tokenizer: Path, texts: list[str], fast: bool) -> tuple[float, int, float]:
    """Seconds, tokens and CPU seconds of bare ``tokenizers`` encoding (load not timed)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    encode = tok.encode_batch_fast if fast else tok.encode_batch
    start, cpu = time.perf_counter(), time.process_time()
    n = 0
    for i in range(0, len(texts), 1024):
        n += sum(len(e.ids) for e in encode(texts[i : i + 1024], add_special_tokens=False))
    return time.perf_counter() - start, n, time.process_time() - cpu


def floor(tokenizer: Path, template: str | None, files: list[Path]) -> dict[str, float]:
    """CPU seconds of the bare library calls any ``pack`` of ``files`` makes, nothing else.

    Parsing with orjson, rendering with minijinja (messages built beforehand, untimed),
    encoding with fastokens (the encoder ``--backend fast`` holds), writing the ids, labels
    and positions as zstd Parquet, and one process's imports and tokenizer load.  No
    normalising, labelling, planning, checking or hashing: a bound from below, so that
    ``encode_batch``'s wall time over this sum split across every core is the most any
    ``pack`` could reach on this machine with these libraries.
    """
    import minijinja
    import numpy as np
    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packshard.ingest.template.render import load_template
    from packshard.ingest.template.sandbox import hf_json, raise_exception, strftime_now
    from packshard.ingest.template.screen import CLOSE, OPEN, rewrite
    from packshard.ingest.tokens.backends import FastEncoder
    from packshard.ingest.tokens.tokenizer import load_tokenizer

    took: dict[str, float] = {}
    start = time.process_time()
    for f in files:
        data = f.read_bytes()
        if f.suffix == ".jsonl":
            [orjson.loads(line) for line in data.splitlines() if line.strip()]
        else:
            orjson.loads(data)
    took["parse (orjson)"] = time.process_time() - start
    bundle = load_tokenizer(str(tokenizer))
    env = minijinja.Environment(trim_blocks=True, lstrip_blocks=True, pycompat=True)
    env.add_global("raise_exception", raise_exception)
    env.add_global("strftime_now", strftime_now)
    env.add_filter(
        "tojson",
        lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: hf_json(
            x, ensure_ascii, indent, separators, sort_keys
        ),
    )
    env.add_global("packshard_open", OPEN)  # {% generation %} blocks, marked as the fast
    env.add_global("packshard_close", CLOSE)  # renderer marks them, and cut out again
    env.add_template("chat", rewrite(load_template(template, bundle).text))
    records = chats(files)
    start = time.process_time()
    extra = bundle.special_tokens_map
    texts = [env.render_template("chat", **extra, messages=m) for m in records]
    texts = [t.replace(OPEN, "").replace(CLOSE, "") for t in texts]
    took["render (minijinja)"] = time.process_time() - start
    encoder = FastEncoder(bundle)
    start = time.process_time()
    n = sum(len(encoder.encode_batch(texts[i : i + 1024]).ids) for i in range(0, len(texts), 1024))
    took["encode (fastokens)"] = time.process_time() - start
    rows = -(-n // MAX_SEQ_LEN)
    values = pa.array(np.arange(rows * MAX_SEQ_LEN, dtype=np.int32) % 32000)
    column = pa.ListArray.from_arrays(
        pa.array(np.arange(rows + 1, dtype=np.int32) * MAX_SEQ_LEN), values
    )
    table = pa.table({"input_ids": column, "labels": column, "position_ids": column})
    with tempfile.TemporaryDirectory() as tmp:
        start = time.process_time()
        pq.write_table(table, Path(tmp) / "s.parquet", compression="zstd", use_dictionary=False)
        took["write (Parquet, zstd)"] = time.process_time() - start
    code = (
        "import numpy, orjson, pyarrow.parquet, minijinja, fastokens, sys\n"
        "fastokens.Tokenizer.from_json_str(open(sys.argv[1]).read())"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code, str(tokenizer / "tokenizer.json")], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    took["imports and tokenizer load"] = (
        after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    )
    return took


def adopt_orphans() -> bool:
    """Become the subreaper of what ``pack`` starts (Linux), so that its CPU time is counted.

    With several workers (``--workers auto`` on a large input) the workers are children of a
    fork server that outlives the ``pack`` process; without this their CPU seconds would be
    lost with it, and the CPU ratio flattered.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def reap_orphans() -> None:
    """Wait for every adopted process, so that its CPU time joins ``RUSAGE_CHILDREN``."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def pack(tokenizer: Path, template: str | None, files: list[Path], out: Path, backend: str):
    """Seconds of one whole ``packshard pack`` process and the tokens it packed."""
    cli = "from packshard.cli import main; main()"
    cmd = [sys.executable, "-c", cli, "pack", *map(str, files), "-t", str(tokenizer)]
    cmd += ["--max-seq-len", str(MAX_SEQ_LEN), "--overlong", "split", "-o", str(out)]
    cmd += ["--backend", backend, "--overwrite", "--no-progress"]
    if template is not None:
        cmd += ["--template", template]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    seconds = time.perf_counter() - start
    reap_orphans()  # the worker processes' fork server, handed to us as it outlives pack
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    manifest = json.loads((out / "manifest.json").read_text())
    shutil.rmtree(out)
    return seconds, int(manifest["stats"]["tokens_in"]), cpu, manifest["environment"]["backends"]


def inputs(folder: Path, tokens_per_copy: int, min_tokens: int) -> list[Path]:
    """Copies of the shared chat files until they hold ``min_tokens`` tokens."""
    copies = max(1, -(-min_tokens // max(tokens_per_copy, 1)))
    out = []
    for k in range(copies):
        for src in sorted((SHARED / "chat").glob("*.json*")):
            dst = folder / f"{src.stem}.{k}{src.suffix}"
            shutil.copyfile(src, dst)
            out.append(dst)
    return out


def measure(family: str, min_tokens: int, args: argparse.Namespace) -> tuple[int, float, float]:
    """Run one family at one size, print its block; return tokens and fast's wall, CPU ratios."""
    tok_name, template = FAMILIES[family]
    tokenizer = SHARED / "tokenizers" / tok_name
    with tempfile.TemporaryDirectory() as tmp:
        once = rendered_texts(tokenizer, template, sorted((SHARED / "chat").glob("*.json*")))
        per_copy = bare(tokenizer, once, True)[1]
        files = inputs(Path(tmp), per_copy, min_tokens)
        texts = once * (len(files) // len(list((SHARED / "chat").glob("*.json*"))))
        best: dict[str, tuple[float, int, float]] = {}
        used = {}
        for _ in range(args.rounds):
            for name in ("fast", "reference", "encode_batch", "encode_batch_fast"):
                if name.startswith("encode"):
                    took = bare(tokenizer, texts, name.endswith("fast"))
                else:
                    s, n, c, used[name] = pack(tokenizer, template, files, Path(tmp) / "o", name)
                    took = (s, n, c)
                if name not in best or took[0] < best[name][0]:
                    best[name] = took
        trl_took = trl(tokenizer, template, chats(files)) if args.trl else None
        floor_took = floor(tokenizer, template, files) if args.floor else None
    rate = {k: n / s for k, (s, n, _) in best.items()}
    cpu_rate = {k: n / c for k, (_, n, c) in best.items()}
    print(f"\n{family}: {tok_name}, template {template or 'tokenizer config'}, "
          f"{best['reference'][1]:,} tokens packed, best of {args.rounds}")  # fmt: skip
    for name, (s, _, c) in best.items():
        print(
            f"  {name:18s} {s:8.2f} s  {rate[name] / 1e6:6.2f} M tokens/s   "
            f"{c:8.2f} CPU-s  {cpu_rate[name] / 1e6:6.2f} M tokens/CPU-s"
        )
    base, cpu_base = rate["encode_batch"], cpu_rate["encode_batch"]
    for name in ("fast", "reference"):
        print(
            f"  pack --backend {name:9s} / encode_batch: {rate[name] / base:5.2f}x wall, "
            f"{cpu_rate[name] / cpu_base:5.2f}x CPU"
        )
    print(f"  pack fast / pack reference:              {rate['fast'] / rate['reference']:5.2f}x")
    if trl_took is not None:
        trl_rate = trl_took[1] / trl_took[0]
        print(
            f"  TRL map + pack_dataset(bfd): {trl_took[0]:.2f} CPU-s for {trl_took[1]:,} "
            f"tokens; pack --backend fast uses {trl_rate and cpu_rate['fast'] / trl_rate:.2f}x "
            "fewer CPU-seconds per token"
        )
    if floor_took is not None:
        from packshard.engine import usable_cores

        cores = usable_cores()
        total = sum(floor_took.values())
        print(f"  floor: the bare library calls alone, {total:.2f} CPU-s:")
        for step, cpu in floor_took.items():
            print(f"    {step:28s} {cpu:6.2f} CPU-s")
        print(
            f"  at most {best['encode_batch'][0] / (total / cores):.2f}x encode_batch's wall "
            f"time on {cores} cores, were they split perfectly and nothing else done"
        )
    for step in ("render", "encode"):
        entry = used["fast"][step]
        print(f"  {step} by --backend fast: {entry['name']} {entry.get('version') or ''}")
    return best["fast"][1], rate["fast"] / base, cpu_rate["fast"] / cpu_base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--min-tokens",
        default="2000000",
        help="tokens to pack at least; several sizes, comma-separated, run one after the other",
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--families", default="qwen3,phi3")
    parser.add_argument("--trl", action="store_true", help="also TRL's preparation (slow)")
    parser.add_argument(
        "--floor", action="store_true", help="also the bare library calls' CPU (a bound)"
    )
    args = parser.parse_args()
    sizes = [int(size) for size in args.min_tokens.split(",")]
    if not adopt_orphans():
        print("note: the CPU seconds of pack's worker processes are not counted here (not Linux)")
    if not (SHARED / "chat").is_dir():
        sys.exit(f"{SHARED} not found: this benchmark needs the shared chat data")
    summary = [
        (family, *measure(family, size, args))
        for family in args.families.split(",")
        for size in sizes
    ]
    if len(summary) > 1:
        print("\npack --backend fast / encode_batch, by size:")
        for family, tokens, wall, cpu in summary:
            print(f"  {family:6s} {tokens:>12,} tokens  {wall:5.2f}x wall  {cpu:5.2f}x CPU")


if __name__ == "__main__":
    main()
