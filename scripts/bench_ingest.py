"""Benchmark: the full ingest stream against the tokenizer alone, on the same data.

(a) ``Tokenizer.encode_batch`` on texts rendered beforehand (rendering not timed), in batches
    of the same size ingest uses, ids read out of every encoding;
(b) ``ingest`` end to end: read + normalize + render + tokenize + labels;
(c) ``Tokenizer.encode_batch_fast`` (no offsets) the same way as (a): what ingest itself
    calls when the tokenizer has a byte aligner (:mod:`packshard.ingest.tokens.alignment`), for
    reference.

Default data: every chat dataset of ``../shared/data`` with the phi-3-mini tokenizer and its
config template, repeated until there are at least ``--min-tokens`` tokens; without that
folder, a synthetic chat corpus and a byte-level BPE trained on the spot (built-in ChatML).
``--reasoning-case`` instead writes a synthetic multi-turn reasoning corpus (reasoning fields,
inline ``<think>`` blocks, tool calls, turns without reasoning) and uses the shared Qwen3
tokenizer with its release template, which drops history reasoning (``--turns expand`` to
build one example per turn); it also times rendering alone against rendering plus labels.
Each side runs ``--rounds`` times, interleaved; the best round counts (the machine is shared).

    python scripts/bench_ingest.py [--template PATH|chatml] [--min-tokens 2000000] [--synthetic]
    python scripts/bench_ingest.py --reasoning-case [--turns as_rendered|expand]
    python scripts/bench_ingest.py --baseline ../other-checkout [--rounds 5]

``--baseline`` times (b) alone, this tree against another checkout of packshard on the same
data: each round runs ingest once in a fresh process of each (warmed up by a first pass, not
timed), alternating, and the best round of each counts; the ratios this / baseline are
printed (CPU time is the steadier figure on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from packshard.ingest.label.spans import render_examples  # noqa: E402
from packshard.ingest.normalize import normalize_record  # noqa: E402
from packshard.ingest.read.sources import InputFile, expand_inputs, read_records  # noqa: E402
from packshard.ingest.stream import ingest  # noqa: E402
from packshard.ingest.template.render import load_template  # noqa: E402
from packshard.ingest.tokens.tokenizer import load_tokenizer  # noqa: E402
from packshard.ingest.types import IngestOptions  # noqa: E402

SHARED = REPO.parent / "shared" / "data"


def synthetic(folder: Path, records: int = 4000, seed: int = 0) -> tuple[str, list[str]]:
    """Write a chat corpus and a trained byte-level BPE into ``folder``; return their paths."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(3000)]  # fmt: skip

    def sentence(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n)) + "."

    data = folder / "chat.jsonl"
    with data.open("w") as fh:
        for _ in range(records):
            msgs = [{"role": "system", "content": sentence(12)}]
            for _ in range(rng.randint(1, 3)):
                msgs.append({"role": "user", "content": sentence(rng.randint(10, 80))})
                msgs.append({"role": "assistant", "content": sentence(rng.randint(20, 200))})
            fh.write(json.dumps({"messages": msgs}) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=4000, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator((sentence(30) for _ in range(3000)), trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|endoftext|>", "bos_token": None, "add_bos_token": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder), [str(data)]


def reasoning_corpus(folder: Path, records: int = 3000, seed: int = 0) -> list[str]:
    """Write multi-turn chats whose assistant turns reason (fields, inline, tool calls)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(3000)]

    def sentence(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n)) + "."

    parameters = {"type": "object", "properties": {"q": {"type": "string"}}}
    tool = {"type": "function", "function": {"name": "lookup", "parameters": parameters}}
    data = folder / "reasoning.jsonl"
    with data.open("w") as fh:
        for k in range(records):
            msgs: list[dict] = [{"role": "system", "content": sentence(10)}]
            for _ in range(rng.randint(1, 6)):
                msgs.append({"role": "user", "content": sentence(rng.randint(8, 60))})
                thought, answer = sentence(rng.randint(20, 160)), sentence(rng.randint(10, 120))
                style = rng.random()
                if style < 0.1:  # a tool call, its result, then the answer
                    function = {"name": "lookup", "arguments": {"q": sentence(3)}}
                    call = {"type": "function", "function": function}
                    turn = {"content": "", "reasoning_content": thought, "tool_calls": [call]}
                    msgs.append({"role": "assistant", **turn})
                    msgs.append({"role": "tool", "content": sentence(20)})
                    msgs.append({"role": "assistant", "content": answer})
                elif style < 0.5:
                    msgs.append(
                        {"role": "assistant", "content": answer, "reasoning_content": thought}
                    )
                elif style < 0.85:
                    inline = f"<think>\n{thought}\n</think>\n\n{answer}"
                    msgs.append({"role": "assistant", "content": inline})
                else:
                    msgs.append({"role": "assistant", "content": answer})
            record = {"messages": msgs, "tools": [tool] if k % 10 == 0 else None}
            fh.write(json.dumps(record) + "\n")
    return [str(data)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--template", default=None)
    parser.add_argument("--data", nargs="*", default=None)
    parser.add_argument("--min-tokens", type=int, default=2_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--synthetic", action="store_true", help="ignore ../shared/data")
    parser.add_argument("--reasoning-case", action="store_true", help="Qwen3 reasoning chats")
    parser.add_argument("--turns", default="as_rendered", choices=("as_rendered", "expand"))
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout's root")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory()
    template_spec = args.template
    if args.reasoning_case:
        tokenizer = args.tokenizer or str(SHARED / "tokenizers" / "qwen3")
        data = reasoning_corpus(Path(tmp.name))
    elif args.tokenizer and args.data:
        tokenizer, data = args.tokenizer, args.data
    elif (SHARED / "chat").is_dir() and not args.synthetic:
        tokenizer, data = str(SHARED / "tokenizers" / "phi-3-mini"), [str(SHARED / "chat")]
    else:
        tokenizer, data = synthetic(Path(tmp.name))
        template_spec = template_spec or "chatml"
    bundle = load_tokenizer(tokenizer)
    template = load_template(template_spec, bundle)
    options = IngestOptions(batch_size=args.batch_size, turns=args.turns)
    files: list[InputFile] = expand_inputs(data)

    texts = []  # rendering done once, outside the timed region
    convs = []
    for f in files:
        for raw in read_records(f):
            try:
                conv = normalize_record(raw)
                texts += [r.text for r in render_examples(conv, template, bundle, options)]
                convs.append(conv)
            except Exception:  # rejected records are not tokenized by ingest either
                continue
    if args.reasoning_case:
        render_alone_vs_labelled(convs, template, bundle, options, args.rounds)
    tokens_once = sum(len(e) for e in bundle.tokenizer.encode_batch(texts))
    repeat = max(1, -(-args.min_tokens // max(tokens_once, 1)))
    texts *= repeat
    files = files * repeat
    if args.baseline is not None:
        against_baseline(args, tokenizer, template_spec, data, repeat)
        tmp.cleanup()
        return
    batches = [texts[i : i + args.batch_size] for i in range(0, len(texts), args.batch_size)]
    tok = bundle.tokenizer

    def cpu() -> float:  # all threads of this process, so contention does not count
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def run_raw(fast: bool = False) -> int:
        encode = tok.encode_batch_fast if fast else tok.encode_batch
        n = 0
        for batch in batches:
            n += sum(len(e.ids) for e in encode(batch, add_special_tokens=False))
        return n

    def run_ingest() -> int:
        return sum(len(chunk.batch.input_ids) for chunk in ingest(files, bundle, template, options))

    best = {name: (float("inf"), float("inf"), 0) for name in ("raw", "ingest", "fast")}
    for _ in range(args.rounds):
        for name, fn in (
            ("raw", run_raw),
            ("ingest", run_ingest),
            ("fast", partial(run_raw, True)),
        ):
            wall, used = time.perf_counter(), cpu()
            n = fn()
            wall, used = time.perf_counter() - wall, cpu() - used
            old = best[name]
            best[name] = (min(old[0], wall), min(old[1], used), n)
    source = template.source if template is not None else "none"
    print(f"data: {len(files) // repeat} files x{repeat}, {len(texts):,} examples; "
          f"tokenizer {tokenizer}; template {source}; batch {args.batch_size}")  # fmt: skip
    rates, cpu_rates = {}, {}
    for name, (seconds, used, n) in best.items():
        rates[name], cpu_rates[name] = n / seconds, n / used
        label = {"raw": "(a) encode_batch, pre-rendered", "ingest": "(b) ingest, end to end",
                 "fast": "(c) encode_batch_fast"}[name]  # fmt: skip
        print(f"{label:32s} {n:>11,} tokens  {seconds:6.2f} s wall {rates[name] / 1e6:5.2f} M tok/s"
              f"  {used:6.2f} s cpu {cpu_rates[name] / 1e6:5.2f} M tok/cpu-s")  # fmt: skip
    ratio, cpu_ratio = rates["ingest"] / rates["raw"], cpu_rates["ingest"] / cpu_rates["raw"]
    print(f"ratio ingest / encode_batch: {ratio:.2f}x wall, {cpu_ratio:.2f}x cpu (target >= 0.80)")
    fast = rates["ingest"] / rates["fast"]
    aligned = "byte aligner" if bundle.aligner is not None else "offsets (no aligner)"
    print(f"ratio ingest / encode_batch_fast: {fast:.2f}x wall (ingest labels via {aligned})")
    tmp.cleanup()


ONE_ROUND = """
import json, resource, sys, time
from packshard.ingest.read.sources import expand_inputs
from packshard.ingest.stream import ingest
from packshard.ingest.template.render import load_template
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import IngestOptions
tokenizer, template, data, repeat, batch, turns = json.loads(sys.argv[1])
bundle = load_tokenizer(tokenizer)
chat = load_template(template, bundle)
options = IngestOptions(batch_size=batch, turns=turns)
files = expand_inputs(data)
for _ in ingest(files, bundle, chat, options):  # warm: kernels, caches
    pass
files = files * repeat
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
wall, used = time.perf_counter(), cpu()
n = sum(len(chunk.batch.input_ids) for chunk in ingest(files, bundle, chat, options))
print(json.dumps([time.perf_counter() - wall, cpu() - used, n]))
"""


def against_baseline(
    args: argparse.Namespace, tokenizer: str, template: str | None, data: list[str], repeat: int
) -> None:
    """Time (b) in this tree and in ``args.baseline``, alternating; print the ratios."""
    import os
    import subprocess

    trees = {"this": REPO, "baseline": args.baseline.resolve()}
    spec = json.dumps([tokenizer, template, data, repeat, args.batch_size, args.turns])
    best = {name: (float("inf"), float("inf"), 0) for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": str(tree)}
            done = subprocess.run(
                [sys.executable, "-c", ONE_ROUND, spec],
                env=env, capture_output=True, text=True, check=True, cwd=tree,
            )  # fmt: skip
            wall, used, n = json.loads(done.stdout.strip().splitlines()[-1])
            old = best[name]
            best[name] = (min(old[0], wall), min(old[1], used), n)
    for name, (wall, used, n) in best.items():
        print(f"{name:8s} (b) ingest: {n:>11,} tokens  {wall:6.2f} s wall  {used:6.2f} s cpu"
              f"  (best of {args.rounds})")  # fmt: skip
    (w1, c1, n1), (w0, c0, n0) = best["this"], best["baseline"]
    assert n1 == n0, f"the trees ingest different tokens: {n1} vs {n0}"
    print(f"this / baseline: {w1 / w0:.3f}x wall, {c1 / c0:.3f}x cpu")


def render_alone_vs_labelled(convs, template, bundle, options, rounds) -> None:
    """CPU time of one render per record against render_examples (labels, probes, expand)."""
    from packshard.ingest.label.reasoning import template_messages
    from packshard.ingest.template.render import render_chat

    prepared = []
    for conv in convs:
        msgs, _ = template_messages(
            conv.messages, template, options.reasoning, options.reasoning_markers, conv.ref
        )
        prepared.append((msgs, list(conv.tools) if conv.tools else None))
    best = {"render": float("inf"), "labelled": float("inf")}
    for _ in range(rounds):
        start = time.process_time()
        for msgs, tools in prepared:
            render_chat(template, msgs, tools, bundle.special_tokens_map)
        best["render"] = min(best["render"], time.process_time() - start)
        start = time.process_time()
        for conv in convs:
            render_examples(conv, template, bundle, options)
        best["labelled"] = min(best["labelled"], time.process_time() - start)
    n = len(convs)
    alone, labelled = best["render"], best["labelled"]
    print(
        f"render alone (one render per record)  {alone:6.2f} s cpu {1e6 * alone / n:7.1f} us/record"
    )
    print(
        f"render_examples, --turns {options.turns:11s} {labelled:6.2f} s cpu "
        f"{1e6 * labelled / n:7.1f} us/record ({labelled / alone:.2f}x the render alone)"
    )


if __name__ == "__main__":
    main()
