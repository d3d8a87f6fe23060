"""verify's check of every rendered assistant turn against the recorded policies."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import packshard.ingest.label.tiers as chat_module
from packshard.ingest.label.frame import template_frame
from packshard.ingest.template.render import compile_template
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import IngestOptions
from packshard.pack import PackConfig, pack_dataset
from packshard.records import IGNORE_INDEX
from packshard.verify.run import VerifyOptions, verify_dataset
from packshard.verify.turns import TurnCheck, decode_pieces, recorded_options
from tests.helpers import THINK, answer, build_qwen, chat, user, write_jsonl

X = IGNORE_INDEX
TURN = (
    "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nAdd.\n</think>\n\n4<|im_end|>"
)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen(tmp_path_factory.mktemp("qwen"))


def _check(qwen: Path, whole: bool = True, **options: Any) -> tuple[Any, list[str], Any]:
    bundle = load_tokenizer(str(qwen))
    opts = IngestOptions(**options)
    frame = template_frame(compile_template(THINK, "think"), bundle, opts.reasoning_markers)
    ids = np.asarray(bundle.tokenizer.encode(TURN, add_special_tokens=False).ids, np.int32)
    return TurnCheck(frame, opts, whole), decode_pieces(bundle.tokenizer, ids), ids


def _labels(pieces: list[str], ids: np.ndarray, trained: str) -> np.ndarray:
    """Labels training the tokens from the first one of ``trained`` on, through <|im_end|>."""
    text = "".join(pieces)
    ends = np.cumsum([len(p) for p in pieces])
    lo, hi = text.index(trained), text.rindex("<|im_end|>") + len("<|im_end|>")
    starts = ends - np.array([len(p) for p in pieces])
    on = (ends > lo) & (starts < hi)
    return np.where(on, ids, X).astype(np.int32)


def test_labels_that_keep_the_promise(qwen: Path) -> None:
    check, pieces, ids = _check(qwen)
    assert check.problems(pieces, _labels(pieces, ids, "<think>")) == (1, 1, None)
    masked, pieces, ids = _check(qwen, reasoning="mask")
    assert masked.problems(pieces, _labels(pieces, ids, "4<|im_end|>")) == (1, 1, None)
    untrained = np.full(len(ids), X, dtype=np.int32)  # a turn that is not trained at all
    assert check.problems(pieces, untrained) == (1, 1, None)


def test_labels_that_break_it(qwen: Path) -> None:
    check, pieces, ids = _check(qwen)
    answer_only = _labels(pieces, ids, "4<|im_end|>")  # what only training content gives
    assert check.problems(pieces, answer_only)[2] == (
        "reasoning of a trained turn untrained although --reasoning train"
    )
    masked, _, _ = _check(qwen, reasoning="mask")
    assert masked.problems(pieces, _labels(pieces, ids, "<think>"))[2] == (
        "reasoning trained although --reasoning mask"
    )
    no_end = _labels(pieces, ids, "<think>")
    no_end[np.flatnonzero(no_end != X)[-1]] = X  # the end marker left out
    assert check.problems(pieces, no_end)[2] == "assistant text of a trained turn left untrained"
    tags, _, _ = _check(qwen, whole=False)
    assert tags.problems(pieces, no_end)[2] is None  # generation tags decide the turn's end


def test_older_manifests_read_as_the_defaults() -> None:
    options = recorded_options({"format": "auto", "domain_field": "domain", "loss": "auto"})
    assert options == IngestOptions()


def test_verify_catches_reasoning_left_untrained(qwen: Path, tmp_path: Path, monkeypatch) -> None:
    """Labels that train only the answer — what packing did before turns were located —
    re-ingest to themselves, so only the policy check can see that they break --reasoning
    train."""
    template = tmp_path / "think.jinja"
    template.write_text(THINK, encoding="utf-8")
    data = write_jsonl(tmp_path / "r.jsonl", [chat(user("2+2?"), answer("4", reasoning="Add."))])
    out = tmp_path / "out"
    config = PackConfig.build(
        inputs=(str(data),),
        tokenizer=str(qwen),
        template=str(template),
        out=str(out),
        max_seq_len=128,
    )
    pack_dataset(config)
    report = verify_dataset(out, VerifyOptions(model="none"))
    assert report.ok and report.checks["source"]["turns_checked"] == 1
    assert report.checks["source"]["reasoning_blocks_checked"] == 1
    real = chat_module._apply_reasoning

    def answer_only(text: str, spans: Any, bodies: Any, options: Any, base: Any) -> Any:
        return real(text, spans, bodies, IngestOptions(reasoning="mask"), base)

    monkeypatch.setattr(chat_module, "_apply_reasoning", answer_only)
    pack_dataset(replace(config, overwrite=True))
    report = verify_dataset(out, VerifyOptions(model="none"))
    assert not report.ok
    assert [str(f) for f in report.findings.items] == [
        f"[source] {data}:1: reasoning of a trained turn untrained although --reasoning train"
    ]
