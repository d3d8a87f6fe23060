"""An answer that opens a reasoning block and never closes it is ``invalid_reasoning``.

Trained, ``<think>`` with no ``</think>`` would teach the model to open a block it never ends
(under ``mask``, to open a second one); under every ``--reasoning`` policy the record is one
reject, and ``verify``'s turn check finds such a turn trained in a pack.  A closing marker
with no opening one, under a template that does not split on it, is one too under ``mask``
and ``drop``: the reasoning before it could be neither masked nor dropped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from packshard.errors import RecordError
from packshard.ingest.label.frame import template_frame
from packshard.ingest.label.reasoning import template_messages
from packshard.ingest.template.render import CHATML, compile_template
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import IngestOptions, Message
from packshard.records import IGNORE_INDEX, SourceRef
from packshard.verify.turns import TurnCheck, decode_pieces
from tests.helpers import THINK, build_qwen


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen(tmp_path_factory.mktemp("qwen"))


@pytest.mark.parametrize("policy", ["train", "mask", "drop"])
@pytest.mark.parametrize("content", ["<think>\nstill thinking", "  <think>never closed"])
def test_an_unclosed_opener_is_invalid_reasoning(qwen, policy, content):
    template = compile_template(THINK, "think")
    messages = (Message("user", "q"), Message("assistant", content))
    with pytest.raises(RecordError) as err:
        template_messages(messages, template, policy, ("<think>", "</think>"), SourceRef("a", 3))
    assert (err.value.code, err.value.line) == ("invalid_reasoning", 3)
    assert err.value.reason == (
        "message 2 (assistant) opens a reasoning block with '<think>' but never closes it with "
        "'</think>' (close it, or cut it)"
    )


def test_a_later_opener_in_the_answer_is_fine(qwen):
    template = compile_template(THINK, "think")
    messages = (Message("user", "q"), Message("assistant", "Use the <think> tag."))
    out, has = template_messages(messages, template, "train", ("<think>", "</think>"), None)
    assert out[1]["content"] == "Use the <think> tag." and has == [False, False]


def test_verify_finds_a_trained_unclosed_block(qwen):
    bundle = load_tokenizer(str(qwen))
    opts = IngestOptions()
    frame = template_frame(compile_template(THINK, "think"), bundle, opts.reasoning_markers)
    text = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nAdd. 4<|im_end|>"
    ids = np.asarray(bundle.tokenizer.encode(text, add_special_tokens=False).ids, np.int32)
    pieces = decode_pieces(bundle.tokenizer, ids)
    start = text.index("<think>")
    ends = np.cumsum([len(p) for p in pieces])
    labels = np.where(ends > start, ids, IGNORE_INDEX).astype(np.int32)
    assert TurnCheck(frame, opts, True).problems(pieces, labels)[2] == (
        "a reasoning block opened with '<think>' and never closed"
    )


@pytest.mark.parametrize("policy", ["mask", "drop"])
def test_a_stray_closer_is_invalid_reasoning_where_the_policy_needs_the_block(policy):
    template = compile_template(CHATML, "chatml")  # it does not split content on the closer
    messages = (Message("user", "q"), Message("assistant", "Add 2 and 2.\n</think>\n\nIt is 4."))
    with pytest.raises(RecordError) as err:
        template_messages(messages, template, policy, ("<think>", "</think>"), SourceRef("a", 5))
    assert (err.value.code, err.value.line) == ("invalid_reasoning", 5)
    assert err.value.reason == (
        f"message 2 (assistant) holds '</think>' with no '<think>' before it: under --reasoning "
        f"{policy} its reasoning cannot be told from its answer (open the block with '<think>', "
        "or cut the marker)"
    )
    out, _ = template_messages(messages, template, "train", ("<think>", "</think>"), None)
    assert out[1]["content"] == messages[1].content  # trained whole: nothing to tell apart
