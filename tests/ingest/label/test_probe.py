"""The probe render places every piece where a search would, and avoids the text's own
characters."""

from __future__ import annotations

from typing import Any

import pytest

import packshard.ingest.label.tiers as turns
from packshard.ingest.template.render import compile_template
from packshard.ingest.tokens.tokenizer import load_tokenizer
from tests.helpers import REASONING_CHAT, THINK, answer, build_qwen, chat, rendered_spans, user


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_tokenizer(str(build_qwen(tmp_path_factory.mktemp("qwen"))))


@pytest.fixture(scope="module")
def think() -> Any:
    return compile_template(THINK, "think.jinja")


@pytest.mark.parametrize("options", [{}, {"reasoning": "mask"}, {"turns": "expand"}])
def test_the_probe_places_what_search_places(think, bundle, monkeypatch, options) -> None:
    searched = [rendered_spans(record, think, bundle, **options) for record in REASONING_CHAT]
    probes: list[int] = []
    real = turns.probe_anchors

    def probe_only(*args: Any) -> Any:
        found = real(*args)
        probes.append(found is not None)
        return found

    monkeypatch.setattr(turns, "search_anchors", lambda *args: None)
    monkeypatch.setattr(turns, "probe_anchors", probe_only)
    probed = [rendered_spans(record, think, bundle, **options) for record in REASONING_CHAT]
    assert probed == searched
    assert probes and all(probes)  # every probe agreed with the text


def test_stand_ins_avoid_characters_the_text_holds(think, bundle, monkeypatch) -> None:
    monkeypatch.setattr(turns, "search_anchors", lambda *args: None)
    record = chat(user("private \ue000\ue001 use"), answer("ok \ue0000\ue001", reasoning="hm"))
    ((text, spans, _, _),) = rendered_spans(record, think, bundle)
    assert [text[a:b] for a, b in spans] == ["<think>\nhm\n</think>\n\nok \ue0000\ue001<|im_end|>"]
