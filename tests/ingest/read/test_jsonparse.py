"""JSON records: repeated keys refused at any depth; a value's end found in any pieces."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from packshard.ingest.read.jsonparse import ValueScanner, parse_record

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(JSON_VALUES, st.lists(st.integers(1, 7), min_size=1, max_size=30), st.sampled_from(",] \n"))
def test_the_scanner_finds_the_end_of_any_value_fed_in_any_pieces(value, cuts, after):
    text = json.dumps(value) + after + '{"next": 1}'
    end = len(json.dumps(value))
    scanner, fed, found = ValueScanner(), 0, None
    for size in [*cuts, len(text)]:
        piece = text[fed : fed + size]
        at = scanner.scan(piece, 0)
        if at is not None:
            found = fed + at
            break
        fed += len(piece)
    assert found == end


@given(JSON_VALUES)
def test_records_without_repeated_keys_parse_as_json_does(value):
    assert parse_record(json.dumps(value)) == (json.loads(json.dumps(value)), None)


def test_a_repeated_key_at_any_depth_is_a_reject():
    why = "in a JSON object (json would silently keep the last value; fix the record)"
    for text, key in (
        ('{"role": "user", "role": "assistant"}', "role"),
        ('{"messages": [{"content": "a", "x": {"k": 1, "k": 1}}]}', "k"),
        ('[{"a": 1}, {"b": 2, "b": 3}]', "b"),
    ):
        assert parse_record(text) == (None, ("duplicate_key", f"duplicate key {key!r} {why}"))
    assert parse_record('{"a": 1, "A": 2}') == ({"a": 1, "A": 2}, None)  # keys are case-sensitive


def test_escaped_quotes_and_brackets_inside_strings_close_nothing():
    text = '{"a": "\\"]}\\\\", "b": [1, "]"]} tail'
    assert ValueScanner().scan(text, 0) == text.index(" tail")
    assert ValueScanner().scan("12345, 6", 0) == 5
    assert ValueScanner().scan('"abc', 0) is None
