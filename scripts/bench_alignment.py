"""Benchmark: labels from the ids (alignment) against labels from offsets, per tokenizer family.

For each shared tokenizer (phi-3-mini with its config template, phi-2 with ChatML, qwen3 with
its training template) the shared chat datasets are rendered once (not timed), then three ways
of encoding + labelling the same batches are timed (CPU seconds of all threads: the machine
may be shared), interleaved, best of ``--rounds``:

(offsets)   ``encode_batch`` with offsets (tokenizers), labels from ``char_to_token``;
(ids)       ``encode_batch_fast`` (tokenizers, no offsets), labels from the ids (alignment);
(ids+fast)  fastokens (``--backend fast``), labels from the ids: the path ``auto`` takes.

The labels of the three are checked equal.  Ratios are time / offsets time (below 1: faster).

    python scripts/bench_alignment.py [--rounds 3] [--min-tokens 300000]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from packshard.ingest.label.spans import render_examples  # noqa: E402
from packshard.ingest.normalize import normalize_record  # noqa: E402
from packshard.ingest.read.sources import expand_inputs, read_records  # noqa: E402
from packshard.ingest.template.render import load_template  # noqa: E402
from packshard.ingest.tokens.labels import encode_texts, label_batch  # noqa: E402
from packshard.ingest.tokens.tokenizer import load_tokenizer  # noqa: E402
from packshard.ingest.types import IngestOptions  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
FAMILIES = {
    "phi-3 (sentencepiece)": ("phi-3-mini", None),
    "phi-2 (byte-level)": ("phi-2", "chatml"),
    "qwen3 (byte-level)": ("qwen3", str(SHARED / "tokenizers/qwen3/chat_template.training.jinja")),
}


def rendered_batches(tok: str, template: str | None, min_tokens: int, size: int) -> tuple:
    bundle = load_tokenizer(str(SHARED / "tokenizers" / tok))
    tmpl = load_template(template, bundle)
    options = IngestOptions()
    out = []
    for f in expand_inputs([str(p) for p in sorted((SHARED / "chat").glob("*.json*"))]):
        for raw in read_records(f, options=options):
            try:
                out += render_examples(normalize_record(raw), tmpl, bundle, options)
            except Exception:  # rejected records are not labelled by ingest either
                continue
    tokens = sum(len(e) for e in bundle.tokenizer.encode_batch_fast([r.text for r in out]))
    out *= max(1, -(-min_tokens // tokens))
    return bundle, [out[i : i + size] for i in range(0, len(out), size)], tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-tokens", type=int, default=300_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    args = parser.parse_args()
    print(f"{'family':24s} {'offsets':>9s} {'ids':>14s} {'ids+fast':>14s}  tokens")
    for family, (tok, template) in FAMILIES.items():
        bundle, batches, _ = rendered_batches(tok, template, args.min_tokens, args.batch_size)
        no_aligner = replace(bundle, aligner=None, encoders={})
        ways = {
            "offsets": (no_aligner, "reference"),
            "ids": (bundle, "reference"),
            "ids+fast": (bundle, "fast"),
        }
        labels: dict[str, np.ndarray] = {}
        best = dict.fromkeys(ways, float("inf"))
        for _ in range(args.rounds):
            for name, (b, backend) in ways.items():
                start = time.process_time()
                got = [label_batch(b, r, encode_texts(b, r, backend)).labels for r in batches]
                best[name] = min(best[name], time.process_time() - start)
                labels[name] = np.concatenate(got)
        assert all(np.array_equal(labels["offsets"], v) for v in labels.values()), family
        base = best["offsets"]
        cells = [f"{best[k]:5.2f}s {best[k] / base:5.2f}x" for k in ("ids", "ids+fast")]
        n = len(labels["offsets"])
        print(f"{family:24s} {base:8.2f}s {cells[0]:>14s} {cells[1]:>14s}  {n:,}")


if __name__ == "__main__":
    main()
