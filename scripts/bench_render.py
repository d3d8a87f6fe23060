"""Benchmark: the fast renderer (minijinja) against packshard's Jinja sandbox, same calls.

Every ``render_chat`` call that ingest makes on the shared chat data is recorded (messages,
tools, variables), then replayed, best of ``--rounds`` (CPU seconds):

(sandbox)    packshard's ``render_reference`` (immutable sandbox, budgets, generation recorder);
(minijinja)  packshard's ``FastRenderer`` (``packshard.ingest.template.fast``): the per-record
             checks, minijinja, the generation markers cut into spans; a declined record
             counts as the sandbox rendering it.

Text and ``{% generation %}`` spans are compared call by call.

    pip install 'packshard[fast]' && python scripts/bench_render.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import packshard.ingest.label.spans as spans  # noqa: E402
from packshard.ingest.normalize import normalize_record  # noqa: E402
from packshard.ingest.read.sources import expand_inputs, read_records  # noqa: E402
from packshard.ingest.template.render import load_template  # noqa: E402
from packshard.ingest.tokens.tokenizer import load_tokenizer  # noqa: E402
from packshard.ingest.types import IngestOptions  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
TOK = SHARED / "tokenizers"
CASES = {
    "phi-3-mini config": ("phi-3-mini", None),
    "phi-3-mini training": ("phi-3-mini", str(TOK / "phi-3-mini/chat_template.training.jinja")),
    "qwen3 config": ("qwen3", None),
    "qwen3 training": ("qwen3", str(TOK / "qwen3/chat_template.training.jinja")),
    "phi-2 chatml": ("phi-2", "chatml"),
}


def recorded_calls(tok: str, template: str | None) -> tuple[Any, list[tuple]]:
    bundle = load_tokenizer(str(SHARED / "tokenizers" / tok))
    tmpl = load_template(template, bundle)
    calls: list[tuple] = []
    real = spans.render_chat

    def record(t, messages, tools, variables, add_generation_prompt=False):
        calls.append(
            (json.loads(json.dumps(messages)), tools, dict(variables), add_generation_prompt)
        )
        return real(t, messages, tools, variables, add_generation_prompt)

    spans.render_chat = record
    options = IngestOptions()
    try:
        for f in expand_inputs([str(p) for p in sorted((SHARED / "chat").glob("*.json*"))]):
            for raw in read_records(f, options=options):
                try:
                    spans.render_examples(normalize_record(raw), tmpl, bundle, options)
                except Exception:
                    continue
    finally:
        spans.render_chat = real
    return tmpl, calls


def main() -> None:
    from packshard.ingest.template.fast import FastRenderer
    from packshard.ingest.template.render import render_reference
    from packshard.ingest.template.screen import screen

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for case, (tok, template) in CASES.items():
        tmpl, calls = recorded_calls(tok, template)
        if (why := screen(tmpl.text)) is not None:
            print(f"{case}: not screened in ({why})")
            continue
        fast = FastRenderer(tmpl)
        best = {"sandbox": float("inf"), "minijinja": float("inf")}
        out: dict[str, list] = {}
        for _ in range(args.rounds):
            start = time.process_time()
            want = []
            for m, t, v, g in calls:
                try:
                    want.append(render_reference(tmpl, m, t, v, g))
                except Exception:
                    want.append(None)
            best["sandbox"] = min(best["sandbox"], time.process_time() - start)
            start = time.process_time()
            got = [fast.render(tmpl, m, t, v, g) for m, t, v, g in calls]
            best["minijinja"] = min(best["minijinja"], time.process_time() - start)
            out = {"sandbox": want, "minijinja": got}
        declined = sum(g is None for g in out["minijinja"])
        same = sum(
            g == w for g, w in zip(out["minijinja"], out["sandbox"], strict=True) if g is not None
        )
        print(
            f"{case}: {len(calls):,} renders; sandbox {best['sandbox']:.2f} s, minijinja "
            f"{best['minijinja']:.2f} s ({best['sandbox'] / best['minijinja']:.1f}x); text and "
            f"spans equal {same:,}/{len(calls) - declined:,} ({declined:,} declined: the "
            "sandbox renders them)"
        )


if __name__ == "__main__":
    main()
