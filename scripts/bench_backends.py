"""Benchmark: whole ``pack`` processes against a fresh bare ``encode_batch``, on text seen once.

For each family (qwen3 with its training template, phi-3-mini with its config template; phi-2
with ChatML on request) and each size of ``--min-tokens``, the corpus of ``scripts/corpus.py``
is built to that size (the shared chat files once, then chat records cut from the text of the
installed packages, no record twice; its checksum printed), then, alternating, ``--rounds``
times:

(a) ``packshard pack --backend fast``: a whole process (startup, imports, tokenizer loads,
    canary, its worker processes) timed from outside; wall seconds, and CPU seconds of the
    whole process tree (the benchmark is the subreaper of the workers, so their CPU counts);
    tokens from the manifest (``stats.tokens_in``);
(b) with ``--reference``, the same with ``--backend reference``;
(c) bare ``tokenizers``: a tokenizer loaded fresh (untimed), ``Tokenizer.encode_batch`` over
    the same rendered texts (rendered in this process beforehand, untimed), batches of 1,024,
    ids read out: the baseline; (d) with ``--encode-batch-fast``, ``encode_batch_fast`` (no
    offsets) beside it.  ``tokenizers`` keeps no cache between calls, and every text is
    encoded once a round.

Ratios are taken pair by pair (round k's ``pack`` against round k's ``encode_batch``): tokens
per second (wall) and tokens per CPU-second; the median and the spread over the rounds are
printed, with the load average before and after each size.  ``--copies`` instead copies the
shared chat files to size, as earlier versions of this benchmark did: every copy after the first
is text the fast encoders have cached, so its ratios are not a measure of ``pack``.

With ``--floor``, the CPU seconds of the bare library calls alone (parse, render, encode,
write, imports: :func:`floor`) and the ratio to ``encode_batch`` they would allow.

With ``--trl``, (e) TRL's own preparation of the same chat records: ``datasets.map`` with
``apply_chat_template(..., return_assistant_tokens_mask=True)`` (transformers, same tokenizer
and template), then ``trl.pack_dataset(strategy="bfd")``, CPU seconds in this process
(tokenizer load not counted); the ratio is (e)'s CPU seconds over (a)'s per token.

    python scripts/bench_backends.py [--min-tokens 2000000[,20000000,…]] [--rounds 3]
        [--families qwen3,phi3] [--reference] [--encode-batch-fast] [--copies] [--trl]
        [--floor]

The package is compiled to byte code first, as an installed one is.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

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


def copies(folder: Path, tokens_per_copy: int, min_tokens: int) -> list[Path]:
    """Copies of the shared chat files until they hold ``min_tokens`` tokens (``--copies``)."""
    copies = max(1, -(-min_tokens // max(tokens_per_copy, 1)))
    out = []
    for k in range(copies):
        for src in sorted((SHARED / "chat").glob("*.json*")):
            dst = folder / f"{src.stem}.{k}{src.suffix}"
            shutil.copyfile(src, dst)
            out.append(dst)
    return out


def corpus_files(folder: Path) -> list[Path]:
    """The record files of a corpus built by ``scripts/corpus.py``, in order."""
    return [folder / name for name in json.loads((folder / "corpus.json").read_text())["files"]]


def corpus(folder: Path, tokenizer: Path, template: str | None, min_tokens: int) -> list[Path]:
    """The corpus built to hold about ``min_tokens`` tokens of this family; its files.

    The shared files' tokens are counted, and the source records' tokens a character from a
    sample of 4M characters; the corpus is then built once to the characters that gives.
    """
    from corpus import build

    sample = folder / "sample"
    build(sample, 4_000_000, shared=False)
    per_char = bare(tokenizer, rendered_texts(tokenizer, template, corpus_files(sample)), True)[1]
    per_char /= json.loads((sample / "corpus.json").read_text())["chars"]
    shared = sorted((SHARED / "chat").glob("*.json*"))
    shared_tokens = bare(tokenizer, rendered_texts(tokenizer, template, shared), True)[1]
    shutil.rmtree(sample)
    chars = max(0, int((min_tokens - shared_tokens) / per_char))
    info = build(folder / "corpus", chars)
    print(f"  corpus: {sum(info['records'].values()):,} source records + the shared chat files, "
          f"{info['chars']:,} source characters, sha256 {info['checksum'][:16]}…")  # fmt: skip
    return corpus_files(folder / "corpus")


def load() -> str:
    """The load averages over 1, 5 and 15 minutes, as ``uptime`` prints them."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def spread(values: list[float]) -> str:
    """The median of ``values`` and their range."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return f"{median:5.2f}x ({ordered[0]:.2f}-{ordered[-1]:.2f}x)"


def measure(family: str, min_tokens: int, args: argparse.Namespace) -> tuple[int, str, str]:
    """Run one family at one size, print its block; return tokens and fast's wall, CPU ratios."""
    tok_name, template = FAMILIES[family]
    tokenizer = SHARED / "tokenizers" / tok_name
    print(f"\n{family}: {tok_name}, template {template or 'tokenizer config'}, "
          f"at least {min_tokens:,} tokens; load {load()}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        if args.copies:
            shared = sorted((SHARED / "chat").glob("*.json*"))
            per_copy = bare(tokenizer, rendered_texts(tokenizer, template, shared), True)[1]
            files = copies(Path(tmp), per_copy, min_tokens)
        else:
            files = corpus(Path(tmp), tokenizer, template, min_tokens)
        texts = rendered_texts(tokenizer, template, files)
        names = ["fast", *(["reference"] * args.reference), "encode_batch"]
        names += ["encode_batch_fast"] * args.encode_batch_fast
        runs: dict[str, list[tuple[float, int, float]]] = {name: [] for name in names}
        used = {}
        for _ in range(args.rounds):
            for name in names:
                if name.startswith("encode"):
                    took = bare(tokenizer, texts, name.endswith("fast"))
                else:
                    s, n, c, used[name] = pack(tokenizer, template, files, Path(tmp) / "o", name)
                    took = (s, n, c)
                runs[name].append(took)
        trl_took = trl(tokenizer, template, chats(files)) if args.trl else None
        floor_took = floor(tokenizer, template, files) if args.floor else None
    print(f"  {runs['fast'][0][1]:,} tokens packed, {len(texts):,} texts, {args.rounds} rounds; "
          f"load {load()}")  # fmt: skip
    for name, took in runs.items():
        for k, (s, n, c) in enumerate(took):
            print(
                f"  {name:18s} round {k + 1}: {s:8.2f} s  {n / s / 1e6:6.2f} M tokens/s   "
                f"{c:8.2f} CPU-s  {n / c / 1e6:6.2f} M tokens/CPU-s"
            )

    def ratios(name: str, cpu: bool) -> list[float]:
        pairs = zip(runs[name], runs["encode_batch"], strict=True)
        return [(n / (c if cpu else s)) / (m / (d if cpu else t)) for (s, n, c), (t, m, d) in pairs]

    wall, cpu = spread(ratios("fast", False)), spread(ratios("fast", True))
    for name in names[: 1 + args.reference]:
        print(f"  pack --backend {name:9s} / encode_batch: {spread(ratios(name, False))} wall, "
              f"{spread(ratios(name, True))} CPU  (median, range of the pairs)")  # fmt: skip
    if trl_took is not None:
        fast_rate = statistics.median(n / c for _, n, c in runs["fast"])
        print(
            f"  TRL map + pack_dataset(bfd): {trl_took[0]:.2f} CPU-s for {trl_took[1]:,} "
            f"tokens; pack --backend fast uses {fast_rate / (trl_took[1] / trl_took[0]):.2f}x "
            "fewer CPU-seconds per token"
        )
    if floor_took is not None:
        from packshard.engine import usable_cores

        cores = usable_cores()
        total = sum(floor_took.values())
        print(f"  floor: the bare library calls alone, {total:.2f} CPU-s:")
        for step, took_cpu in floor_took.items():
            print(f"    {step:28s} {took_cpu:6.2f} CPU-s")
        best = min(s for s, _, _ in runs["encode_batch"])
        print(
            f"  at most {best / (total / cores):.2f}x encode_batch's wall "
            f"time on {cores} cores, were they split perfectly and nothing else done"
        )
    for step in ("render", "encode"):
        entry = used["fast"][step]
        print(f"  {step} by --backend fast: {entry['name']} {entry.get('version') or ''}")
    return runs["fast"][0][1], wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--min-tokens",
        default="2000000",
        help="tokens to pack at least; several sizes, comma-separated, run one after the other",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--families", default="qwen3,phi3")
    parser.add_argument(
        "--reference", action="store_true", help="also pack --backend reference (slow)"
    )
    parser.add_argument(
        "--encode-batch-fast", action="store_true", help="also encode_batch_fast (no offsets)"
    )
    parser.add_argument(
        "--copies", action="store_true", help="the shared chat files copied (cached text)"
    )
    parser.add_argument("--trl", action="store_true", help="also TRL's preparation (slow)")
    parser.add_argument(
        "--floor", action="store_true", help="also the bare library calls' CPU (a bound)"
    )
    args = parser.parse_args()
    sizes = [int(size) for size in args.min_tokens.split(",")]
    # byte code for the package, as an installed one has it (PYTHONDONTWRITEBYTECODE would
    # otherwise make every pack process compile packshard's sources again)
    compileall.compile_dir(str(REPO / "packshard"), quiet=1)
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
            print(f"  {family:6s} {tokens:>12,} tokens  {wall} wall  {cpu} CPU")


if __name__ == "__main__":
    main()
