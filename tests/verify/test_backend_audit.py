"""A wrong fast encoder is caught: ``auto``'s first-records check refuses it, ``verify`` finds it.

The fast encoder is corrupted on purpose: one id changes in every text holding one string (the
first demo record's answer).  ``--backend auto`` sees it on the first records and encodes with
the reference (the output is the reference's bytes); a forced ``--backend fast`` packs the
wrong id, and ``verify``'s source check, which re-encodes with the reference, reports the
changed segment and names the backend that encoded it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from packshard.demo import demo_data_path
from packshard.ingest.tokens import backends
from packshard.pack import PackConfig, pack_dataset
from packshard.pack.units import early
from packshard.verify.run import VerifyOptions, verify_dataset

pytest.importorskip("fastokens")

WRONG_IN = "Go to Settings → Billing → Cancel plan"  # the first demo record's answer


class _Changed:
    """An encoding whose ids are the fast encoder's with the fifth one changed."""

    def __init__(self, enc: object) -> None:
        self.ids = list(enc.ids)  # type: ignore[attr-defined]
        self.ids[4] = (self.ids[4] + 1) % 500

    def __len__(self) -> int:
        return len(self.ids)


@pytest.fixture
def corrupted(monkeypatch):
    # the demo is a small job, which tries gigatoken first: moved below it, fastokens encodes
    monkeypatch.setattr(early, "SMALL_JOB_BYTES", 0)
    real = backends.FastEncoder.encode_batch

    def encode_batch(self, texts):
        return [
            _Changed(e) if WRONG_IN in t else e
            for t, e in zip(texts, real(self, texts), strict=True)
        ]

    monkeypatch.setattr(backends.FastEncoder, "encode_batch", encode_batch)


def _pack(tmp: Path, tokenizer: Path, backend: str):
    config = PackConfig.build(
        inputs=(str(demo_data_path()),),
        tokenizer=str(tokenizer),
        out=str(tmp / backend),
        max_seq_len=256,
        template="chatml",
        backend=backend,
    )
    return pack_dataset(config)


def _digests(out: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.parquet"))
    }


def test_auto_falls_back_when_the_first_records_differ(tmp_path, demo_tokenizer, corrupted):
    result = _pack(tmp_path, demo_tokenizer, "auto")
    encode = result.manifest["environment"]["backends"]["encode"]
    assert encode["name"] == "tokenizers"
    assert encode["reason"].startswith("fastokens disagrees with tokenizers on the input: text 0")
    notes = [w for w in result.warnings if w.startswith("--backend auto")]
    assert len(notes) == 1 and "disagrees" in notes[0]
    reference = _pack(tmp_path, demo_tokenizer, "reference")
    assert _digests(result.out) == _digests(reference.out)


def test_verify_finds_a_forced_fast_pack_and_names_the_backend(tmp_path, demo_tokenizer, corrupted):
    result = _pack(tmp_path, demo_tokenizer, "fast")
    assert result.manifest["environment"]["backends"]["encode"]["name"] == "fastokens"
    report = verify_dataset(str(result.out), VerifyOptions(model="none", source=True))
    findings = [f for f in report.findings.items if f.check == "source"]
    assert findings, "a changed id must be a source finding"
    assert all("encoded by fastokens 0.3.5 with --backend fast" in f.message for f in findings)
    assert all("verify re-encodes with tokenizers" in f.message for f in findings)


def test_verify_of_an_honest_fast_pack_is_clean(tmp_path, demo_tokenizer):
    result = _pack(tmp_path, demo_tokenizer, "fast")
    report = verify_dataset(str(result.out), VerifyOptions(model="none", source=True))
    assert report.findings.count() == 0


@pytest.fixture
def misrendered(monkeypatch):
    from packshard.ingest.template import fast

    real = fast.FastRenderer.render

    def render(self, *args):
        got = real(self, *args)
        if got is None or WRONG_IN not in got[0]:
            return got
        return got[0].replace("Billing", "Billinq"), got[1]  # same length: spans still fit

    monkeypatch.setattr(fast, "_RENDERERS", {})
    monkeypatch.setattr(fast.FastRenderer, "render", render)


def test_a_wrong_fast_renderer_is_refused_by_auto_and_found_by_verify(
    tmp_path, demo_tokenizer, misrendered
):
    result = _pack(tmp_path, demo_tokenizer, "auto")
    render = result.manifest["environment"]["backends"]["render"]
    assert render["name"] == "jinja2"
    assert render["reason"].startswith("minijinja differs on the input: ")
    notes = [w for w in result.warnings if w.startswith("--backend auto")]
    assert len(notes) == 1 and "rendering with jinja2: minijinja differs" in notes[0]
    reference = _pack(tmp_path, demo_tokenizer, "reference")
    assert _digests(result.out) == _digests(reference.out)
    forced = _pack(tmp_path, demo_tokenizer, "fast")
    assert forced.manifest["environment"]["backends"]["render"]["name"] == "minijinja"
    report = verify_dataset(str(forced.out), VerifyOptions(model="none", source=True))
    findings = [f for f in report.findings.items if f.check == "source"]
    assert findings, "a changed text must be a source finding"
    assert all("rendered by minijinja 3.1.0 with --backend fast" in f.message for f in findings)
