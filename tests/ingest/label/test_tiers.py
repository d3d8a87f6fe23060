"""Each labelling tier is needed: a record only it can place, which fails with it switched off.

The templates are ChatML with one twist each: ``COUNTED`` writes the number of messages
first (so a shorter conversation is not a prefix of the longer: tier 4 fails), ``SIZED`` each
content's length after it (so stand-ins change the text around them: tier 3 fails); a content
found twice defeats search (tier 2).
"""

from __future__ import annotations

from typing import Any

import pytest

import packshard.ingest.label.tiers as chat_module
import packshard.ingest.label.tiers as turns
from packshard.errors import RecordError
from packshard.ingest.template.render import compile_template
from packshard.ingest.tokens.tokenizer import load_tokenizer
from tests.helpers import THINK, answer, build_qwen, chat, rendered_spans, user

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}SIZE<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PLAIN = CHATML.replace("SIZE", "")
SIZED = CHATML.replace("SIZE", " [{{ m.content | length }}]")
COUNTED = "{{ messages | length }} messages\n" + PLAIN
TAGGED = PLAIN.replace(
    "{{ m.content }}",
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
    "{% else %}{{ m.content }}{% endif %}",
)
OFF = {  # search is two functions: any conversation's, and its shortcut for plain ones
    "tags": [(chat_module, "generation_blocks")],
    "search": [(turns, "search_anchors"), (turns, "plain_turns")],
    "probe": [(turns, "probe_anchors")],
    "prefix": [(turns, "prefix_turn")],
}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_tokenizer(str(build_qwen(tmp_path_factory.mktemp("qwen"))))


def _trained(template: str, record: dict[str, Any], bundle: Any) -> list[str]:
    ((text, spans, _, _),) = rendered_spans(record, compile_template(template, "t"), bundle)
    return [text[a:b] for a, b in spans]


def _needs(tier: str, template: str, record: dict[str, Any], bundle: Any, monkeypatch) -> None:
    """Switch ``tier`` off: the record is no longer labelled as it was."""
    before = _trained(template, record, bundle)
    for module, name in OFF[tier]:
        monkeypatch.setattr(module, name, lambda *args: None)
    try:
        assert _trained(template, record, bundle) != before, f"{tier} is not needed"
    except RecordError as err:
        assert err.code == "template_error"


def test_tier_1_generation_tags_decide_exactly(bundle, monkeypatch) -> None:
    record = chat(user("Capital of France?"), answer("Paris."))
    assert _trained(TAGGED, record, bundle) == ["Paris."]  # the tags leave the end marker out
    _needs("tags", TAGGED, record, bundle, monkeypatch)


def test_tier_2_search_reads_a_template_the_renders_cannot(bundle, monkeypatch) -> None:
    record = chat(user("Capital of France?"), answer("Paris."))
    template = "{{ messages | length }} messages\n" + SIZED
    assert _trained(template, record, bundle) == ["Paris. [6]<|im_end|>"]
    _needs("search", template, record, bundle, monkeypatch)


def test_tier_3_the_probe_places_a_content_found_twice(bundle, monkeypatch) -> None:
    record = chat(user("ok"), answer("ok"), user("again"), answer("ok"))
    assert _trained(COUNTED, record, bundle) == ["ok<|im_end|>", "ok<|im_end|>"]
    _needs("probe", COUNTED, record, bundle, monkeypatch)


def test_tier_4_the_prefix_difference_places_what_nothing_else_can(bundle, monkeypatch) -> None:
    record = chat(user("ok"), answer("ok"), user("again"), answer("ok"))
    assert _trained(SIZED, record, bundle) == ["ok [2]<|im_end|>", "ok [2]<|im_end|>"]
    _needs("prefix", SIZED, record, bundle, monkeypatch)


def test_tier_4_never_cuts_inside_a_special_token(bundle) -> None:
    # the conversation through turn 2 ends <|im_end|>\n<|endoftext|>; the text goes on
    # <|im_end|>\n<|im_start|>: they part inside a special token ("<|"), the turn ends before
    ended = SIZED.replace("{% endif %}", "{% else %}<|endoftext|>{% endif %}")
    record = chat(user("ok"), answer("ok"), user("again"), answer("ok"))
    assert _trained(ended, record, bundle) == ["ok [2]<|im_end|>", "ok [2]<|im_end|>"]


def test_tier_4_places_a_trained_user_turn_from_its_content(bundle) -> None:
    record = chat(user("ok", train=True), answer("ok"))
    assert _trained(SIZED, record, bundle) == ["ok [2]<|im_end|>", "ok [2]<|im_end|>"]


def test_tier_4_leaves_a_rewritten_turn_unplaced(bundle) -> None:
    upper = PLAIN.replace("{{ m.content }}", "{{ m.content | upper }} [{{ m.content | length }}]")
    with pytest.raises(RecordError) as err:
        _trained(upper, chat(user("ok"), answer("ok")), bundle)
    assert err.value.reason.startswith("message 2 (assistant) does not appear")


def test_tier_4_reads_on_where_the_last_turn_renders_otherwise(bundle, monkeypatch) -> None:
    # THINK gives the last turn an empty reasoning block, a turn in the history none: turn 2
    # is read from the conversation through message 3; tier 4 alone labels as search does
    think = compile_template(THINK, "think.jinja")
    record = chat(user("ok"), answer("ok"), user("again"), answer("fine"))
    searched = rendered_spans(record, think, bundle)
    monkeypatch.setattr(turns, "search_anchors", lambda *args: None)
    monkeypatch.setattr(turns, "probe_anchors", lambda *args: None)
    assert rendered_spans(record, think, bundle) == searched
    ((text, spans, _, _),) = searched
    assert [text[a:b] for a, b in spans] == [
        "ok<|im_end|>",
        "<think>\n\n</think>\n\nfine<|im_end|>",
    ]
