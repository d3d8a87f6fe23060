"""Pack the demo and the shared chat data with every template, print each pack's SHA-256s.

    python scripts/check_label_bytes.py DATA_DIR > before.txt   # on the old code
    python scripts/check_label_bytes.py DATA_DIR > after.txt    # on the new code
    diff before.txt after.txt                                   # labelling kept its bytes

``DATA_DIR`` holds ``chat/`` and ``tokenizers/`` (phi-3-mini, phi-2, qwen3).  Each pack runs
``packshard pack`` at ``--max-seq-len 4096`` on every chat file at once; the demo is packed
twice more (``--overlong split --strategy wrapped`` at 4096 and 512).  Qwen3 is also packed
with ``--empty-reasoning mask`` and ``--turns expand``, which place every turn rather than
taking the common case's shortcut.  Printed: the SHA-256 of ``examples.parquet`` and of every
``shard-*.parquet``, one line each.  ``--backend fast`` and ``--backend reference`` give each
pack that backend (default: ``pack``'s own, ``auto``); the two listings are equal when the
fast backends keep the bytes::

    diff <(python scripts/check_label_bytes.py DATA_DIR --backend fast) \
         <(python scripts/check_label_bytes.py DATA_DIR --backend reference)

``--tiers`` instead renders every record in process and counts which labelling tier placed
its turns (:mod:`packshard.ingest.label.tiers`) and how many template renders each record took;
``--prefix-only`` adds, per record, a second labelling with tiers 1–3 switched off, and counts
the records whose spans and token labels tier 4 alone reproduces.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import itertools
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = str(Path(sys.executable).parent / "packshard")
DEMO = ROOT / "packshard" / "data" / "demo_chat.jsonl"


def _packs(data: Path, demo_tok: Path) -> list[tuple[str, list[str]]]:
    chat = sorted(str(p) for p in (data / "chat").iterdir())
    tok = data / "tokenizers"
    phi3, qwen = tok / "phi-3-mini", tok / "qwen3"
    demo = [str(DEMO), "-t", str(demo_tok), "--template", "chatml"]
    return [
        ("demo", [*demo, "--max-seq-len", "4096"]),
        (
            "demo-split-wrapped",
            [*demo, "--max-seq-len", "4096", "--overlong", "split", "--strategy", "wrapped"],
        ),
        (
            "demo-512-split-wrapped",
            [*demo, "--max-seq-len", "512", "--overlong", "split", "--strategy", "wrapped"],
        ),
        ("phi3", [*chat, "-t", str(phi3)]),
        (
            "phi3-training",
            [*chat, "-t", str(phi3), "--template", str(phi3 / "chat_template.training.jinja")],
        ),
        (  # phi-2 spells ChatML's markers in pieces: pack refuses that unless told
            "phi2-chatml",
            [*chat, "-t", str(tok / "phi-2"), "--template", "chatml", "--allow-split-markers"],
        ),
        ("qwen3", [*chat, "-t", str(qwen)]),
        (
            "qwen3-training",
            [*chat, "-t", str(qwen), "--template", str(qwen / "chat_template.training.jinja")],
        ),
        (
            "qwen3-later",
            [
                *chat,
                "-t",
                str(qwen),
                "--template",
                str(qwen / "chat_template.later_revision.jinja"),
            ],
        ),
        ("qwen3-empty-mask", [*chat, "-t", str(qwen), "--empty-reasoning", "mask"]),
        ("qwen3-expand", [*chat, "-t", str(qwen), "--turns", "expand"]),
    ]


def _args(argv: list[str]) -> list[str]:
    return argv if "--max-seq-len" in argv else [*argv, "--max-seq-len", "4096"]


def _digests(out: Path) -> list[str]:
    files = [out / "examples.parquet", *sorted(out.glob("shard-*.parquet"))]
    return [f"{f.name} {hashlib.sha256(f.read_bytes()).hexdigest()}" for f in files]


def _tiers(name: str, argv: list[str], prefix_only: bool) -> str:
    """Render every record in process: the tier that placed it, renders per record.

    ``prefix_only``: also label each record with tiers 1–3 switched off (tier 4 alone) and
    count the records whose character spans and token labels come out the same.
    """
    import packshard.ingest.label.tiers as tiers
    import packshard.ingest.template.render as templates
    from packshard.errors import PackshardError
    from packshard.ingest.label.spans import render_examples
    from packshard.ingest.normalize import normalize_record
    from packshard.ingest.read.sources import expand_inputs, read_records
    from packshard.ingest.tokens.labels import encode_rendered
    from packshard.ingest.tokens.tokenizer import load_tokenizer
    from packshard.ingest.types import IngestOptions

    inputs = [a for a in argv if a.endswith((".json", ".jsonl"))]
    opt = dict(itertools.pairwise(argv))
    bundle = load_tokenizer(opt["-t"])
    template = templates.load_template(opt.get("--template"), bundle)
    options = IngestOptions(
        empty_reasoning=opt.get("--empty-reasoning", "train"),
        turns=opt.get("--turns", "as_rendered"),
    )
    used: list[str] = []
    renders = [0]
    tiers = {
        "tags": (tiers, "generation_blocks"),
        "search": (tiers, "search_anchors"),
        "probe": (tiers, "probe_anchors"),
        "prefix": (tiers, "prefix_turn"),
    }
    real = {tier: getattr(mod, fn) for tier, (mod, fn) in tiers.items()}
    off: set[str] = set()

    def counted(tier: str) -> Any:
        def call(*args: Any) -> Any:
            found = None if tier in off else real[tier](*args)
            if found:
                used.append(tier)
            return found

        return call

    def render(*args: Any, **kwargs: Any) -> Any:
        renders[0] += 1
        return real_render(*args, **kwargs)

    real_render = templates.render_chat
    for tier, (mod, fn) in tiers.items():
        setattr(mod, fn, counted(tier))
    modules = [m for m in list(sys.modules.values()) if getattr(m, "render_chat", 0) is real_render]
    for mod in modules:
        mod.render_chat = render  # type: ignore[attr-defined]

    def label(raw: Any) -> Any:
        used.clear()
        renders[0] = 0
        try:
            out = render_examples(normalize_record(raw), template, bundle, options)
        except PackshardError as err:
            return f"rejected {err}", None
        ids = [encode_rendered(bundle, [r])[1].tolist() for r in out]
        return [(r.text, r.spans) for r in out], ids

    counts: collections.Counter[str] = collections.Counter()
    per: collections.Counter[int] = collections.Counter()
    alone: collections.Counter[str] = collections.Counter()
    per_alone: collections.Counter[int] = collections.Counter()
    try:
        for raw in (raw for f in expand_inputs(inputs) for raw in read_records(f)):
            if raw.error is not None:
                continue
            spans, labels = label(raw)
            counts[
                "+".join(dict.fromkeys(used)) or ("rejected" if labels is None else "whole")
            ] += 1
            per[renders[0]] += 1
            if prefix_only:
                off.update(("tags", "search", "probe"))
                spans4, labels4 = label(raw)
                off.clear()
                alone["same labels"] += labels4 == labels
                alone["same spans"] += spans4 == spans
                alone["records"] += 1
                per_alone[renders[0]] += 1
    finally:
        for tier, (mod, fn) in tiers.items():
            setattr(mod, fn, real[tier])
        for mod in modules:
            mod.render_chat = real_render  # type: ignore[attr-defined]
    line = f"{name} tiers [{_counts(counts)}] renders/record [{_counts(per)}]"
    if prefix_only:
        line += f" | tier 4 alone: {_counts(alone)}; renders/record [{_counts(per_alone)}]"
    return line


def _counts(counter: collections.Counter[Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counter.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--only", nargs="*", help="pack names to run (default: all)")
    parser.add_argument("--tiers", action="store_true", help="count tiers and renders instead")
    parser.add_argument("--prefix-only", action="store_true", help="with --tiers: tier 4 alone")
    parser.add_argument("--backend", choices=("auto", "fast", "reference"), help="for each pack")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        demo_tok = Path(tmp) / "demo-tokenizer"
        subprocess.run(
            [sys.executable, "-m", "packshard.demo", str(demo_tok)], check=True, capture_output=True
        )
        for name, argv in _packs(args.data, demo_tok):
            if args.only and name not in args.only:
                continue
            argv = _args(argv)
            if args.tiers:
                print(_tiers(name, argv, args.prefix_only), flush=True)
                continue
            out = Path(tmp) / name
            cmd = [BIN, "pack", *argv, "-o", str(out), "--no-progress"]
            if args.backend:
                cmd += ["--backend", args.backend]
            subprocess.run(cmd, check=True, capture_output=True)
            for line in _digests(out):
                print(f"{name} {line}", flush=True)


if __name__ == "__main__":
    main()
