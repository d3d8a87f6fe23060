"""LLaMA-Factory's v1 SFT records pack whole: text parts under ``value``, ``loss_weight`` on
every message.

The shared ``chat/v1_sft_demo.jsonl`` (500 records) packs with no reject; each example's ids
equal ``apply_chat_template`` on its messages with the parts joined, and its trained tokens
are exactly its weight-1 turns: the labels equal those of the same records written as plain
OpenAI messages (content strings, no weights), whose assistant turns the policy trains.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from packshard.records import IGNORE_INDEX

pytestmark = pytest.mark.shared_data
V1 = "chat/v1_sft_demo.jsonl"


def _flattened(records: list[dict], out: Path) -> Path:
    """The same records as OpenAI messages: parts joined, no weights."""
    lines = []
    for record in records:
        messages = [
            {"role": m["role"], "content": "".join(p["value"] for p in m["content"])}
            for m in record["messages"]
        ]
        lines.append(json.dumps({"messages": messages}) + "\n")
    out.write_text("".join(lines), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def v1_records(shared_data: Path) -> list[dict]:
    path = shared_data / V1
    if not path.is_file():
        pytest.skip(f"{path} not found (kept outside the repository)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _by_line(packed) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    lines = packed.examples["line"]
    ids = packed.examples["example_id"]
    return {line: packed.segment(i)[:2] for line, i in zip(lines, ids, strict=True)}


def test_the_v1_demo_packs_every_record_as_its_flattened_messages(
    shared_data, v1_records, run_pack, tmp_path
) -> None:
    tokenizer = shared_data / "tokenizers" / "phi-3-mini"
    v1 = run_pack([shared_data / V1], tokenizer, tmp_path / "v1", max_seq_len=1024)
    assert v1.rejects == []
    assert v1.manifest["stats"]["records_packed"] == len(v1_records) == 500
    flat_path = _flattened(v1_records, tmp_path / "flat.jsonl")
    flat = run_pack([flat_path], tokenizer, tmp_path / "flat", max_seq_len=1024)
    got, want = _by_line(v1), _by_line(flat)
    assert got.keys() == want.keys() == set(range(1, 501))
    for line in got:
        for a, b in zip(got[line], want[line], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"line {line}")
    for line, record in enumerate(v1_records, 1):  # weights: 0 on user, 1 on assistant
        weights = [m["loss_weight"] for m in record["messages"]]
        assert weights == [0.0, 1.0], line
        assert (got[line][1] != IGNORE_INDEX).any()


def test_ids_equal_apply_chat_template_and_only_weight_one_turns_train(
    shared_data, v1_records
) -> None:
    transformers = pytest.importorskip("transformers")
    from packshard.ingest.label.spans import render_example
    from packshard.ingest.normalize import normalize_record
    from packshard.ingest.template.render import load_template
    from packshard.ingest.tokens.labels import encode_rendered
    from packshard.ingest.tokens.tokenizer import load_tokenizer
    from packshard.ingest.types import RawRecord
    from packshard.records import SourceRef

    folder = str(shared_data / "tokenizers" / "phi-3-mini")
    bundle, hf = load_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)
    template = load_template(None, bundle)
    for line, record in enumerate(v1_records[:60], 1):
        conv = normalize_record(RawRecord(SourceRef("v1.jsonl", line), "v1", record))
        flat = [{"role": m.role, "content": m.content} for m in conv.messages]
        ids, labels, _ = encode_rendered(bundle, [render_example(conv, template, bundle, "auto")])
        out = hf.apply_chat_template(
            flat, tokenize=True, add_generation_prompt=False, return_dict=True
        )
        assert ids.tolist() == list(out["input_ids"]), line
        trained = bundle.tokenizer.decode(
            ids[labels != IGNORE_INDEX].tolist(), skip_special_tokens=True
        )
        weighted = [m.content for m, w in zip(conv.messages, record["messages"], strict=True)]
        ones = [c for c, m in zip(weighted, record["messages"], strict=True) if m["loss_weight"]]
        assert "".join(trained.split()) == "".join("".join(ones).split()), line
