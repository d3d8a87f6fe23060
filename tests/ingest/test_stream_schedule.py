"""The ingest schedule: encoding in pieces off the main thread changes nothing in the output.

The first chunk is encoded and labelled in pieces of ``FIRST_PIECE`` records; later
chunks go to the tokenize thread whole, or are encoded in place with ``threads=1``.  These
tests pin what neither may change: chunk boundaries, order, rejects, the earliest failure
first, and no thread left behind.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packshard.errors import RecordError
from packshard.ingest.label.spans import render_example
from packshard.ingest.normalize import normalize_record
from packshard.ingest.read.sources import expand_inputs, read_records
from packshard.ingest.stream import FIRST_PIECE, ingest
from packshard.ingest.template.render import load_template
from packshard.ingest.tokens.labels import encode_rendered, encode_texts, label_encodings
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import IngestOptions
from tests.helpers import build_tokenizer

WORDS = ["hello", "world", "quick", "brown", "fox", "jumps", "over", "lazy", "dog"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return load_tokenizer(str(build_tokenizer(tmp_path_factory.mktemp("tok"))))


@pytest.fixture(scope="module")
def template(bundle):
    return load_template("chatml", bundle)


def row(i: int) -> str:
    """Record ``i`` (1-based): mostly chats, some plain texts, an invalid line every 37th."""
    if i % 37 == 0:
        return "{broken"
    words = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(1 + i % 5))
    if i % 5 == 0:
        return json.dumps({"text": words})
    msgs = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": words}]
    return json.dumps({"messages": msgs})


def write_rows(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join(rows) + "\n")
    return path


def run(path: Path, bundle, template, threads: int = 2, **options):
    files = expand_inputs([str(path)])
    return list(ingest(files, bundle, template, IngestOptions(**options), threads=threads))


def reference(path: Path, bundle, template) -> tuple[list[int], list[np.ndarray], list[np.ndarray]]:
    """Each good record rendered and encoded alone: lines, ids, labels."""
    lines, ids, labels = [], [], []
    for raw in read_records(expand_inputs([str(path)])[0]):
        try:
            rendered = render_example(normalize_record(raw), template, bundle, "auto")
        except RecordError:
            continue
        a, b, _ = encode_rendered(bundle, [rendered])
        lines.append(raw.ref.line)
        ids.append(a)
        labels.append(b)
    return lines, ids, labels


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    n = 2 * FIRST_PIECE + 45  # the first chunk spans several pieces at batch_size >= 301
    return write_rows(
        tmp_path_factory.mktemp("data") / "chat.jsonl", [row(i) for i in range(1, n + 1)]
    )


@settings(max_examples=12, deadline=None)
@given(
    batch_size=st.sampled_from([1, 7, FIRST_PIECE - 1, FIRST_PIECE, FIRST_PIECE + 1, 200, 1024]),
    threads=st.sampled_from([1, 2]),
)
def test_chunks_match_records_encoded_alone(
    bundle, template, corpus: Path, batch_size: int, threads: int
) -> None:
    chunks = run(corpus, bundle, template, threads, batch_size=batch_size)
    total = 2 * FIRST_PIECE + 45
    sizes = [c.records for c in chunks]
    assert sizes == [batch_size] * (total // batch_size) + (
        [total % batch_size] if total % batch_size else []
    )
    for c in chunks:
        assert c.records == len(c.batch) + len(c.rejects)
        assert c.batch.offsets[0] == 0 and c.batch.offsets[-1] == len(c.batch.input_ids)
    lines, ids, labels = reference(corpus, bundle, template)
    got = [(r.line, *c.batch.example(i)) for c in chunks for i, r in enumerate(c.batch.refs)]
    assert [g[0] for g in got] == lines
    for (_, a, b), want_a, want_b in zip(got, ids, labels, strict=True):
        np.testing.assert_array_equal(a, want_a)
        np.testing.assert_array_equal(b, want_b)
    rejected = [(r.ref.line, r.code) for c in chunks for r in c.rejects]
    assert rejected == [(i, "invalid_json") for i in range(37, total + 1, 37)]


def test_label_encodings_after_encode_texts_is_encode_rendered(bundle, template, corpus) -> None:
    rendered = []
    for raw in read_records(expand_inputs([str(corpus)])[0]):
        try:
            rendered.append(render_example(normalize_record(raw), template, bundle, "auto"))
        except RecordError:
            continue
    whole = encode_rendered(bundle, rendered)
    split = label_encodings(bundle, rendered, encode_texts(bundle, rendered))
    for a, b in zip(whole, split, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def no_eos(tmp_path_factory):
    """A tokenizer without EOS: an empty text record has no token to train on."""
    folder = build_tokenizer(tmp_path_factory.mktemp("no_eos"), {"bos_token": None})
    return load_tokenizer(str(folder))


def text_rows(n: int, empty: int, broken: int) -> list[str]:
    rows = [json.dumps({"text": "hello world fox"}) for _ in range(n)]
    rows[empty - 1] = json.dumps({"text": ""})
    rows[broken - 1] = "{broken"
    return rows


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("empty", "broken", "batch_size"),
    [
        (5, FIRST_PIECE + 20, 1024),  # both in the first chunk, in different pieces
        (250, 450, 200),  # an earlier chunk still being encoded, then a later chunk
        (FIRST_PIECE + 20, FIRST_PIECE + 30, 1024),  # the same piece
    ],
)
def test_fail_mode_reports_the_earliest_record(
    no_eos, tmp_path, empty, broken, batch_size, threads
) -> None:
    data = write_rows(tmp_path / "d.jsonl", text_rows(600, empty, broken))
    with pytest.raises(RecordError) as info:
        run(data, no_eos, None, threads, on_error="fail", batch_size=batch_size)
    assert (info.value.code, info.value.line) == ("no_trainable_tokens", empty)
    assert str(info.value).startswith(f"{tmp_path / 'd.jsonl'}:{empty}: no token to train on")


@pytest.mark.parametrize("threads", [1, 2])
def test_fail_mode_reports_a_bad_record_before_a_later_empty_one(no_eos, tmp_path, threads) -> None:
    data = write_rows(tmp_path / "d.jsonl", text_rows(600, 400, 30))
    with pytest.raises(RecordError) as info:
        run(data, no_eos, None, threads, on_error="fail", batch_size=200)
    assert (info.value.code, info.value.line) == ("invalid_json", 30)


def tokenize_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("packshard-tokenize")]


def test_no_thread_outlives_the_stream(bundle, template, corpus: Path, no_eos, tmp_path) -> None:
    before = len(tokenize_threads())
    stream = ingest(expand_inputs([str(corpus)]), bundle, template, IngestOptions(batch_size=50))
    next(stream)
    stream.close()  # the consumer stops early
    assert len(tokenize_threads()) == before
    data = write_rows(tmp_path / "d.jsonl", text_rows(600, 300, 500))
    with pytest.raises(RecordError):
        run(data, no_eos, None, on_error="fail", batch_size=100)
    assert len(tokenize_threads()) == before


def test_one_thread_encodes_in_place(bundle, template, corpus: Path, monkeypatch) -> None:
    from packshard.ingest import stream

    made = []
    real = stream.ThreadPoolExecutor
    monkeypatch.setattr(
        stream, "ThreadPoolExecutor", lambda *args, **kw: made.append(1) or real(*args, **kw)
    )
    files = expand_inputs([str(corpus)])
    one = list(ingest(files, bundle, template, IngestOptions(batch_size=50), threads=1))
    assert made == []  # no tokenize thread: each chunk encoded on this one
    two = list(ingest(files, bundle, template, IngestOptions(batch_size=50)))
    assert made == [1]  # the default keeps its thread
    assert [c.records for c in one] == [c.records for c in two]
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a.batch.input_ids, b.batch.input_ids)
        np.testing.assert_array_equal(a.batch.labels, b.batch.labels)
