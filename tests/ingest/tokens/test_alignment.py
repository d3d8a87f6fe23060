"""Token byte ranges from ids alone must give exactly the labels the offsets give.

Every check compares the two paths of :func:`packshard.ingest.tokens.labels.encode_rendered`: with
the tokenizer's :class:`~packshard.ingest.tokens.alignment.ByteAligner` (``encode_batch_fast``,
positions parsed from the ids) and without it (``encode_batch`` offsets, ``char_to_token``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors

from packshard.arrays import utf8_batch
from packshard.ingest.label.spans import render_example
from packshard.ingest.normalize import normalize_record
from packshard.ingest.read.sources import expand_inputs, read_records
from packshard.ingest.template.render import load_template
from packshard.ingest.tokens.aligner import (
    NO_PREPEND,
    PREPEND_ALWAYS,
    PREPEND_AT_START,
    PREPEND_UNLESS_SPACE,
    build_aligner,
)
from packshard.ingest.tokens.alignment import align, span_tokens
from packshard.ingest.tokens.labels import encode_rendered
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import RawRecord, Rendered
from packshard.records import SourceRef
from tests.helpers import FAMILIES, byte_level_bpe, sentencepiece_bpe

SPECIALS = ["<s>", "</s>", "<|end|>", "<|user|>"]


def _both(bundle, rendered):
    """Labels (and ids) from the byte path and from the offsets path."""
    assert bundle.aligner is not None
    fast = encode_rendered(bundle, rendered)
    slow = encode_rendered(dataclasses.replace(bundle, aligner=None), rendered)
    return fast, slow


def _assert_same(bundle, rendered) -> None:
    fast, slow = _both(bundle, rendered)
    for a, b, name in zip(fast, slow, ("input_ids", "labels", "offsets"), strict=True):
        assert np.array_equal(a, b), name


def _parse_ok(bundle, rendered) -> np.ndarray:
    texts = [r.text[r.bos_chars :] for r in rendered]
    encs = bundle.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    ids = np.array([i for e in encs for i in e.ids], dtype=np.int32)
    offsets = np.zeros(len(encs) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encs], out=offsets[1:])
    text, text_offsets = utf8_batch(texts)
    return align(bundle.aligner, text, text_offsets, ids, offsets)[2]


def _save(folder: Path, tok: Tokenizer, config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config or {}), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("align_families")
    return {f.name: f.build(root / f.name) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_family_has_an_aligner_and_matches_offsets(families, family) -> None:
    bundle = load_tokenizer(str(families[family.name]))
    template = load_template(None, bundle)
    rendered = []
    for line, record in enumerate(family.records, 1):
        conv = normalize_record(RawRecord(SourceRef("x.jsonl", line), "x", record))
        rendered.append(render_example(conv, template, bundle, "auto"))
    assert bundle.aligner is not None, family.name
    assert _parse_ok(bundle, rendered).all(), family.name
    _assert_same(bundle, rendered)


@pytest.mark.shared_data
@pytest.mark.parametrize(("name", "template"), [("phi-3-mini", None), ("phi-2", "chatml")])
def test_real_tokenizers_on_every_shared_dataset(shared_data: Path, name, template) -> None:
    bundle = load_tokenizer(str(shared_data / "tokenizers" / name))
    tmpl = load_template(template, bundle)
    rendered = []
    for f in expand_inputs([str(shared_data / "chat")]):
        for raw in read_records(f):
            try:
                rendered.append(render_example(normalize_record(raw), tmpl, bundle, "auto"))
            except Exception:  # rejected records are another test's business
                continue
    assert len(rendered) > 5000
    assert _parse_ok(bundle, rendered).all()
    for i in range(0, len(rendered), 1024):
        _assert_same(bundle, rendered[i : i + 1024])


def _spm(tmp_path: Path, prefix: str, legacy: bool | None = None) -> Path:
    tok = sentencepiece_bpe(prefix, ["<unk>", *SPECIALS])
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:  # phi-3 style: the turn markers swallow what follows
        if added["content"] in ("<|end|>", "<|user|>"):
            added["rstrip"] = True
    config = {"bos_token": "<s>", "eos_token": "</s>", "tokenizer_class": "LlamaTokenizer"}
    if legacy is not None:
        config["legacy"] = legacy
    return _save(tmp_path / f"spm-{prefix}-{legacy}", Tokenizer.from_str(json.dumps(spec)), config)


def _bpe(tmp_path: Path, lstrip: bool = False, nfc: bool = False) -> Path:
    tok = byte_level_bpe(None)
    tok.add_special_tokens(
        [AddedToken(s, special=True, normalized=False, lstrip=lstrip, rstrip=True)
         for s in SPECIALS]
    )  # fmt: skip
    if nfc:
        tok.normalizer = normalizers.NFC()
    return _save(tmp_path / f"bpe-{lstrip}-{nfc}", tok, {"bos_token": "<s>", "eos_token": "</s>"})


@pytest.mark.parametrize(
    ("prefix", "legacy", "family", "prepend"),
    [
        ("prepend", None, "sentencepiece", PREPEND_ALWAYS),  # not Llama-converted: kept as is
        ("metaspace", False, "sentencepiece", PREPEND_AT_START),
        ("metaspace", True, "sentencepiece", PREPEND_UNLESS_SPACE),
        ("none", None, "sentencepiece", NO_PREPEND),
    ],
)
def test_pipelines_are_recognised(tmp_path, prefix, legacy, family, prepend) -> None:
    folder = _spm(tmp_path, prefix, legacy)
    if prefix == "prepend":  # another class keeps the file's normalizer
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    aligner = load_tokenizer(str(folder)).aligner
    assert aligner is not None
    assert (aligner.family, aligner.prepend) == (family, prepend)


def test_unmodelled_pipelines_get_no_aligner() -> None:
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert build_aligner(wordpiece) is None
    lowered = byte_level_bpe(None)
    lowered.normalizer = normalizers.Lowercase()
    assert build_aligner(lowered) is None
    prefixed = byte_level_bpe(None)
    prefixed.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    assert build_aligner(prefixed) is None
    trimmed = byte_level_bpe(None)  # GPT-2's post-processor: offsets lose their leading space
    trimmed.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=True)])
    assert build_aligner(trimmed) is None
    trimmed.post_processor = processors.ByteLevel(trim_offsets=False)
    assert build_aligner(trimmed) is not None
    suffixed = Tokenizer(models.BPE({"a</w>": 0, "a": 1}, [], end_of_word_suffix="</w>"))
    suffixed.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert build_aligner(suffixed) is None


# Texts mixing what trips alignment up: added tokens and the whitespace they swallow (also
# Unicode spaces), spaces at section starts, byte-fallback characters, newlines.
PIECES = ["<s>", "</s>", "<|end|>", "<|user|>", " ", "  ", "\n", "\u3000", "\u00a0", "the",
          " quick", "fox", "héllo", "你好", "🦊", "✓", "yes", " no", "\t", "say"]  # fmt: skip


@st.composite
def examples(draw) -> Rendered:
    text = "".join(draw(st.lists(st.sampled_from(PIECES), min_size=1, max_size=14)))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), min_size=2, max_size=6)))
    spans = tuple((a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False) if b > a)
    return Rendered(text, spans, "offsets")


@pytest.fixture(scope="module")
def tokenizer_zoo(tmp_path_factory: pytest.TempPathFactory) -> list:
    root = tmp_path_factory.mktemp("zoo")
    folders = [_spm(root, "metaspace", False), _spm(root, "metaspace", True),
               _spm(root, "none"), _bpe(root), _bpe(root, lstrip=True)]  # fmt: skip
    prepend = _spm(root, "prepend")
    config = json.loads((prepend / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (prepend / "tokenizer_config.json").write_text(json.dumps(config))
    return [load_tokenizer(str(f)) for f in (*folders, prepend)]


@settings(max_examples=150, deadline=None)
@given(batch=st.lists(examples(), min_size=1, max_size=6))
def test_random_texts_and_spans_label_like_offsets(tokenizer_zoo, batch) -> None:
    for bundle in tokenizer_zoo:
        _assert_same(bundle, batch)


def test_a_text_the_ids_do_not_spell_falls_back_to_offsets(tmp_path) -> None:
    bundle = load_tokenizer(str(_bpe(tmp_path, nfc=True)))
    decomposed = "say he\u0301llo"  # NFC composes e + U+0301: the ids spell another text
    batch = [Rendered(decomposed, ((4, 10),), "offsets"), Rendered("say yes", ((4, 7),), "offsets")]
    assert _parse_ok(bundle, batch).tolist() == [False, True]
    _assert_same(bundle, batch)
    _, labels, _ = encode_rendered(bundle, batch[:1])
    assert (labels != -100).sum() > 0


def _spans_by_scan(text, text_offsets, start, end, token_offsets, examples, los, his):
    """Token ranges of character spans, each span scanned from its example's first byte."""
    t0, t1 = np.zeros(len(examples), np.int64), np.zeros(len(examples), np.int64)
    for s, (e, lo_chars, hi_chars) in enumerate(zip(examples, los, his, strict=True)):
        first, stop = text_offsets[e], text_offsets[e + 1]
        starts = [i - first for i in range(first, stop) if text[i] & 0xC0 != 0x80]
        lo = starts[lo_chars] if lo_chars < len(starts) else stop - first
        hi = starts[hi_chars] if hi_chars < len(starts) else stop - first
        if hi <= lo:
            continue
        k0, k1 = token_offsets[e], token_offsets[e + 1]
        a = next((k for k in range(k0, k1) if max(end[k], start[k] + 1) > lo), k1)
        b = next((k for k in range(a, k1) if start[k] >= hi), k1)
        if b > a:
            t0[s], t1[s] = a - k0, b - k0
    return t0, t1


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(st.text(alphabet="ab \n你😀", max_size=30), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 3), min_size=200, max_size=200),
    raw=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 33), st.integers(0, 33)), max_size=8),
    ordered=st.booleans(),
)
def test_span_tokens_walks_once_and_agrees_with_a_scan_per_span(texts, cuts, raw, ordered):
    # spans in text order reuse a cursor; spans out of order or of another example restart it
    text, text_offsets = utf8_batch(texts)
    start, end, token_offsets, k = [], [], [0], 0
    for e in range(len(texts)):
        pos, stop = 0, int(text_offsets[e + 1] - text_offsets[e])
        while pos < stop:  # a cut of 0 is a token that stands for no byte (a lone prefix)
            cut = cuts[k % len(cuts)]
            start.append(pos)
            end.append(min(stop, pos + cut))
            pos = min(stop, pos + max(cut, 1))
            k += 1
        token_offsets.append(len(start))
    spans = [(e % len(texts), lo, hi) for e, lo, hi in raw]
    spans = sorted(spans) if ordered else spans
    args = (
        text,
        text_offsets,
        np.asarray(start, np.int64),
        np.asarray(end, np.int64),
        np.asarray(token_offsets, np.int64),
        *(np.asarray([s[j] for s in spans], np.int64) for j in range(3)),
    )
    got, want = span_tokens(*args), _spans_by_scan(*args)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
