"""Token ids and assistant masks equal transformers' without ``../shared/data``.

:mod:`tests.ingest.test_transformers_parity` compares packshard with ``transformers`` on real
third-party tokenizers kept outside the repository, so a fresh clone skips it.  The same
comparisons run here on what the repository holds: the committed fixture tokenizer
(``tests/fixtures/contract/tokenizer``, a byte-level BPE with ChatML specials), the embedded
demo data and the hand-built edge records (tools, tool calls, ShareGPT, non-ASCII scripts),
under the fixture's own template (labels from character offsets) and the built-in ChatML
(``{% generation %}`` labels, compared with ``return_assistant_tokens_mask``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from packshard.demo import demo_data_path
from packshard.errors import RecordError
from packshard.ingest.label.spans import render_example
from packshard.ingest.normalize import normalize_record
from packshard.ingest.read.sources import expand_inputs, read_records
from packshard.ingest.tokens.labels import encode_rendered
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import Conversation

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "contract"


@pytest.fixture(scope="module")
def tokenizers_():
    path = str(FIXTURES / "tokenizer")
    return {"fixture": (load_tokenizer(path), transformers.AutoTokenizer.from_pretrained(path))}


def _conversations() -> list[Conversation]:
    convs = []
    for f in expand_inputs([str(demo_data_path()), str(FIXTURES / "edge.jsonl")]):
        for record in read_records(f):
            if isinstance(record, RecordError):
                continue  # the demo's one broken line
            try:
                conv = normalize_record(record)
            except RecordError:
                continue
            if conv.messages and not any(m.extra for m in conv.messages):
                convs.append(conv)  # (turn fields beyond role and content: tool calls, names)
    return convs


@pytest.mark.parametrize("spec", [None, "chatml"])
def test_ids_labels_and_runs_equal_transformers(tokenizers_, spec) -> None:
    from tests.ingest.test_transformers_parity import _check

    checked = _check("fixture", spec, _conversations(), tokenizers_)
    assert checked >= 40


def test_text_path_matches_plain_encoding(tokenizers_) -> None:
    bundle, hf = tokenizers_["fixture"]
    for conv in _conversations():
        text = "\n\n".join(m.content or "" for m in conv.messages)
        plain = Conversation(conv.ref, conv.domain, "text", text=text)
        ids, labels, _ = encode_rendered(bundle, [render_example(plain, None, bundle, "auto")])
        expected = hf(text, add_special_tokens=True)["input_ids"] + [hf.eos_token_id]
        assert ids.tolist() == expected and (labels == ids).all()
        assert np.all(labels[: len(ids)] == ids)
