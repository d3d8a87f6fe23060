"""The ingest stream: order, batching, rejects, loss counts and label paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from packshard.errors import RecordError, UsageError
from packshard.ingest.label.spans import render_example
from packshard.ingest.normalize import normalize_record
from packshard.ingest.read.sources import expand_inputs
from packshard.ingest.stream import ingest, ingest_label_path
from packshard.ingest.template.render import load_template
from packshard.ingest.tokens.labels import encode_rendered
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import IngestOptions, RawRecord, TokenizedBatch
from packshard.records import IGNORE_INDEX
from tests.helpers import build_tokenizer, write_jsonl


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return load_tokenizer(str(build_tokenizer(tmp_path_factory.mktemp("tok"))))


def chat(user: str, assistant: str, **extra) -> dict:
    msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return {"messages": msgs, **extra}


def run(files, bundle, template, **options):
    return list(ingest(expand_inputs([str(f) for f in files]), bundle, template,
                       IngestOptions(**options)))  # fmt: skip


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "mixed.jsonl",
        [
            chat("hello", "world"),  # 1
            "{broken",  # 2 invalid_json
            {"messages": [{"role": "user", "content": "only a question"}]},  # 3 no_assistant_turn
            {"text": "the quick brown fox", "domain": "web"},  # 4
            {"prompt": "2+2=", "completion": "4"},  # 5
            {"nothing": 1, "domain": "odd"},  # 6 unknown_format, domain from the record
            chat("hello", "fox", domain="chat"),  # 7
        ],
    )


def test_order_rejects_and_counts(bundle, mixed: Path) -> None:
    template = load_template("chatml", bundle)
    chunks = run([mixed], bundle, template, batch_size=3)
    assert [c.records for c in chunks] == [3, 3, 1]
    assert [len(c.batch) + len(c.rejects) for c in chunks] == [3, 3, 1]
    refs = [r.line for c in chunks for r in c.batch.refs]
    assert refs == [1, 4, 5, 7]
    rejects = [(r.ref.line, r.code, r.domain) for c in chunks for r in c.rejects]
    assert rejects == [
        (2, "invalid_json", "mixed"),
        (3, "no_assistant_turn", "mixed"),
        (6, "unknown_format", "odd"),
    ]
    assert [d for c in chunks for d in c.batch.domains] == ["mixed", "web", "mixed", "chat"]
    paths: dict[str, int] = {}
    for c in chunks:
        for k, v in c.label_paths.items():
            paths[k] = paths.get(k, 0) + v
    assert paths == {"generation_tags": 2, "none": 1, "offsets": 1}


def test_batches_equal_encoding_each_example_alone(bundle, mixed: Path) -> None:
    template = load_template("chatml", bundle)
    chunk = run([mixed], bundle, template, batch_size=100)[0]
    batch: TokenizedBatch = chunk.batch
    assert batch.input_ids.dtype == np.int32 and batch.labels.dtype == np.int32
    assert batch.offsets.dtype == np.int64 and batch.offsets[0] == 0
    texts = {1: chat("hello", "world"), 7: chat("hello", "fox")}
    for i, ref in enumerate(batch.refs):
        ids, labels = batch.example(i)
        if ref.line in texts:
            conv = normalize_record(RawRecord(ref, "mixed", texts[ref.line]))
            alone = encode_rendered(bundle, [render_example(conv, template, bundle, "auto")])
            np.testing.assert_array_equal(ids, alone[0])
            np.testing.assert_array_equal(labels, alone[1])
    assert batch.formats == ("messages", "text", "prompt_completion", "messages")
    loss = chunk.loss_tokens
    expected = [int((batch.example(i)[1][1:] != IGNORE_INDEX).sum()) for i in range(len(batch))]
    assert loss.tolist() == expected and (loss > 0).all()


def test_no_trainable_tokens_and_fail_mode(tmp_path: Path) -> None:
    config = {"bos_token": None}  # no eos: an empty text has no token at all
    bundle = load_tokenizer(str(build_tokenizer(tmp_path / "t", config)))
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "hello world"}, {"text": ""}, {"text": "a"}])
    chunks = run([data], bundle, None)
    rejects = [(r.ref.line, r.code) for c in chunks for r in c.rejects]
    assert rejects == [(2, "no_trainable_tokens"), (3, "no_trainable_tokens")]  # 1 token only
    assert [r.line for c in chunks for r in c.batch.refs] == [1]
    assert chunks[0].records == 3 and chunks[0].batch.offsets.tolist()[0] == 0
    with pytest.raises(RecordError, match=r"d\.jsonl:2: no token to train on"):
        run([data], bundle, None, on_error="fail")


def test_fail_mode_raises_the_first_bad_record(bundle, mixed: Path) -> None:
    with pytest.raises(RecordError) as info:
        run([mixed], bundle, load_template("chatml", bundle), on_error="fail")
    assert (info.value.code, info.value.line) == ("invalid_json", 2)


def test_options_are_checked(bundle, mixed: Path) -> None:
    cases = [({"loss": "most"}, "--loss"), ({"on_error": "x"}, "--on-error")]
    cases += [({"format": "csv"}, "--format"), ({"batch_size": 0}, "--batch-size")]
    for bad, flag in cases:
        with pytest.raises(UsageError, match=flag):
            IngestOptions(**bad).check()
        with pytest.raises(UsageError, match=flag):
            run([mixed], bundle, None, **bad)
    IngestOptions().check()  # the defaults are valid


def test_label_path_names(bundle) -> None:
    template = load_template("chatml", bundle)
    assert ingest_label_path(template, "auto") == "generation_tags"
    assert ingest_label_path(template, "all") == "none"
    assert ingest_label_path(None, "auto") == "none"


def test_progress_bar_runs(bundle, mixed: Path, capsys) -> None:
    chunks = list(ingest(expand_inputs([str(mixed)]), bundle, load_template("chatml", bundle),
                         IngestOptions(), progress="bar"))  # fmt: skip
    assert sum(c.records for c in chunks) == 7
    assert "records" in capsys.readouterr().err


def _phi3_labels(shared: Path, spec: str | None, pattern: str):
    bundle = load_tokenizer(str(shared / "tokenizers" / "phi-3-mini"))
    template = load_template(spec, bundle)
    files = expand_inputs([str(shared / "chat" / pattern)])
    chunks = list(ingest(files, bundle, template, IngestOptions()))
    ids = np.concatenate([c.batch.input_ids for c in chunks])
    labels = np.concatenate([c.batch.labels for c in chunks])
    return ids, labels, [r for c in chunks for r in c.rejects]


@pytest.mark.parametrize("pattern", ["*.jsonl", pytest.param("*", marks=pytest.mark.slow)])
def test_phi3_offsets_path_equals_generation_tags(shared_data: Path, pattern: str) -> None:
    training = str(shared_data / "tokenizers" / "phi-3-mini" / "chat_template.training.jinja")
    ids_a, labels_a, rejects_a = _phi3_labels(shared_data, None, pattern)
    ids_b, labels_b, rejects_b = _phi3_labels(shared_data, training, pattern)
    assert rejects_a == rejects_b
    np.testing.assert_array_equal(ids_a, ids_b)
    np.testing.assert_array_equal(labels_a, labels_b)


def test_expand_counts_records_not_examples(tmp_path: Path) -> None:
    from packshard.ingest.template.render import compile_template
    from tests.helpers import THINK, answer, build_qwen, user
    from tests.helpers import chat as record

    bundle = load_tokenizer(str(build_qwen(tmp_path / "qwen")))
    template = compile_template(THINK, "think.jinja")
    data = write_jsonl(
        tmp_path / "r.jsonl",
        [
            record(user("a"), answer("1", reasoning="x"), user("b"), answer("2", reasoning="y")),
            "{broken",
            record(user("c"), answer("3")),
        ],
    )
    (as_rendered,) = run([data], bundle, template)
    assert as_rendered.batch.turns is None and as_rendered.reasoning_dropped == 1
    (chunk,) = run([data], bundle, template, turns="expand")
    assert chunk.records == 3 and len(chunk.batch) == 3 and len(chunk.rejects) == 1
    assert [r.line for r in chunk.batch.refs] == [1, 1, 3]
    assert chunk.batch.turns is not None and chunk.batch.turns.tolist() == [2, 4, 2]
    assert chunk.reasoning_dropped == 0
    assert chunk.reasoning_tokens is not None and chunk.reasoning_loss is not None
    assert (chunk.reasoning_tokens > 0).tolist() == [True, True, False]
    assert (chunk.reasoning_loss == chunk.reasoning_tokens).all()
