"""Probe: minijinja against packshard's Jinja sandbox on the same chat template calls.

Not used by ``pack`` (rendering stays on the sandbox, see docs/backends.md); this measures what a
fast renderer would give and whether its text is the same.  Every ``render_chat`` call that
ingest makes on the shared chat data is recorded (messages, tools, variables), then replayed,
interleaved, best of ``--rounds`` (CPU seconds):

(sandbox)    packshard's ``render_chat`` (immutable sandbox, budgets, generation recorder);
(minijinja)  ``minijinja.Environment(trim_blocks, lstrip_blocks, pycompat)`` with the HF
             globals (``raise_exception``, ``strftime_now``) and a ``tojson`` with
             ``ensure_ascii=False``, keys in given order.

Templates with ``{% generation %}`` cannot run on minijinja and are left out.

    pip install minijinja && python scripts/bench_render.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import packshard.ingest.label.spans as spans  # noqa: E402
from packshard.ingest.normalize import normalize_record  # noqa: E402
from packshard.ingest.read.sources import expand_inputs, read_records  # noqa: E402
from packshard.ingest.template.render import load_template, render_chat  # noqa: E402
from packshard.ingest.tokens.tokenizer import load_tokenizer  # noqa: E402
from packshard.ingest.types import IngestOptions  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
CASES = {"phi-3-mini config": ("phi-3-mini", None), "qwen3 config": ("qwen3", None)}


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


def minijinja_env(source: str) -> Any:
    import minijinja

    def raise_exception(message: str) -> None:
        raise minijinja.TemplateError(message)

    env = minijinja.Environment(
        trim_blocks=True, lstrip_blocks=True, pycompat=True, keep_trailing_newline=False
    )
    env.add_function("raise_exception", raise_exception)
    env.add_function("strftime_now", lambda fmt: datetime.now().strftime(fmt))
    env.add_filter(
        "tojson",
        lambda x, indent=None: minijinja.safe(json.dumps(x, ensure_ascii=False, indent=indent)),
    )
    env.add_template("chat", source)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for case, (tok, template) in CASES.items():
        tmpl, calls = recorded_calls(tok, template)
        if tmpl.has_generation:
            print(f"{case}: {{% generation %}} template, left out")
            continue
        env = minijinja_env(tmpl.text)
        best = {"sandbox": float("inf"), "minijinja": float("inf")}
        texts: dict[str, list[str]] = {}
        for _ in range(args.rounds):
            start = time.process_time()
            texts["sandbox"] = [render_chat(tmpl, m, t, v, g)[0] for m, t, v, g in calls]
            best["sandbox"] = min(best["sandbox"], time.process_time() - start)
            start = time.process_time()
            out = []
            for m, t, v, g in calls:
                ctx = {**v, "messages": m, "tools": t, "add_generation_prompt": g}
                out.append(env.render_template("chat", **ctx))
            best["minijinja"] = min(best["minijinja"], time.process_time() - start)
            texts["minijinja"] = out
        same = sum(a == b for a, b in zip(texts["sandbox"], texts["minijinja"], strict=True))
        print(
            f"{case}: {len(calls):,} renders; sandbox {best['sandbox']:.2f} s, minijinja "
            f"{best['minijinja']:.2f} s ({best['sandbox'] / best['minijinja']:.1f}x); "
            f"text equal {same:,}/{len(calls):,}"
        )


if __name__ == "__main__":
    main()
