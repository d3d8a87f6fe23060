"""The rejects file: one sorted JSON line per reject, counted as written, read back checked."""

from __future__ import annotations

import json

import pytest

from packshard.errors import FormatError
from packshard.format.rejects import (
    REJECTS_NAME,
    RejectsWriter,
    RejectTally,
    read_rejects,
    reject_line,
)
from packshard.records import Reject, SourceRef

REJECTS = [
    Reject(SourceRef("a.jsonl", 2), "chat", "invalid_json", "invalid JSON: Expecting value"),
    Reject(SourceRef("b.jsonl", 7), "code", "too_long", "example is 9 tokens > max_seq_len 8"),
    Reject(SourceRef("a.jsonl", 5), "chat", "too_long", "example is 12 tokens > max_seq_len 8"),
    Reject(SourceRef("a.jsonl", 9), "wörld", "unknown_role", "role 'narrator' is not one of …"),
]


def test_reject_line_is_sorted_utf8_json():
    line = reject_line(REJECTS[3])
    assert line == (
        '{"code": "unknown_role", "domain": "wörld", "line": 9, '
        '"reason": "role \'narrator\' is not one of …", "source": "a.jsonl"}'
    )
    assert "\n" not in line and json.loads(line)["domain"] == "wörld"


def test_writer_counts_what_it_writes_and_reading_gives_it_back(tmp_path):
    path = tmp_path / REJECTS_NAME
    with RejectsWriter(path) as writer:
        writer.write(REJECTS[:2])
        writer.write(())
        writer.write(REJECTS[2:])
        tally = writer.close()
    assert path.read_text(encoding="utf-8") == "".join(reject_line(r) + "\n" for r in REJECTS)
    assert tally == RejectTally(
        by_code={"invalid_json": 1, "too_long": 2, "unknown_role": 1},
        by_domain={
            "chat": {"rejected": 1, "dropped": 1},
            "code": {"rejected": 0, "dropped": 1},
            "wörld": {"rejected": 1, "dropped": 0},
        },
        by_source={
            "a.jsonl": {"rejected": 2, "dropped": 1},
            "b.jsonl": {"rejected": 0, "dropped": 1},
        },
    )
    assert list(tally.by_code) == sorted(tally.by_code)
    assert (tally.total("rejected"), tally.total("dropped"), tally.lines) == (2, 2, 4)
    assert list(read_rejects(path)) == REJECTS


def test_an_empty_file_tallies_nothing(tmp_path):
    path = tmp_path / REJECTS_NAME
    tally = RejectsWriter(path).close()
    assert tally == RejectTally() and tally.lines == 0 and tally.total("rejected") == 0
    assert path.read_bytes() == b"" and list(read_rejects(path)) == []


GOOD = reject_line(REJECTS[0])


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not a JSON line"),
        ("[1, 2]", "expected an object with keys code, domain, line, reason, source"),
        (GOOD.replace('"code"', '"kind"'), "expected an object with keys code, domain"),
        (GOOD.replace('"line": 2', '"line": -1'), "line must be a non-negative integer, got -1"),
        (GOOD.replace('"line": 2', '"line": true'), "line must be a non-negative integer"),
        (GOOD.replace('"domain": "chat"', '"domain": 3'), "source, domain and reason must be"),
        (GOOD.replace("invalid_json", "made_up"), "unknown reject code 'made_up'"),
    ],
)
def test_read_rejects_names_the_damaged_line(tmp_path, line, problem):
    path = tmp_path / REJECTS_NAME
    path.write_text(f"{GOOD}\n\n{line}\n", encoding="utf-8")
    with pytest.raises(FormatError) as info:
        list(read_rejects(path))
    assert info.value.path == f"{path}:3"
    assert info.value.problem.startswith(problem)


def test_read_rejects_refuses_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / REJECTS_NAME
    path.write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    with pytest.raises(FormatError) as info:
        list(read_rejects(path))
    assert info.value.path == str(path) and info.value.problem.startswith("not UTF-8")
