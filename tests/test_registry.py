"""Every reject code lives in one registry, with its kind, and docs/pack.md lists exactly those."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from packshard.errors import DROPPED, REJECT_CODES, REJECTED, RecordError
from packshard.records import Reject, SourceRef

ROOT = Path(__file__).resolve().parents[1]


def test_every_code_has_a_kind_and_a_meaning() -> None:
    for name, code in REJECT_CODES.items():
        assert code.name == name
        assert code.kind in (REJECTED, DROPPED)
        assert code.meaning and not code.meaning.endswith(".")


def test_the_readme_table_is_the_registry() -> None:
    rows = [f"| `{c.name}` | {c.kind} | {c.meaning} |" for c in REJECT_CODES.values()]
    table = "\n".join(["| code | kind | meaning |", "| --- | --- | --- |", *rows])
    assert table in (ROOT / "docs" / "pack.md").read_text(encoding="utf-8")


def test_every_registered_code_is_emitted_and_every_emitted_code_registered() -> None:
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "packshard").rglob("*.py"))
    registry = (ROOT / "packshard" / "errors.py").read_text(encoding="utf-8")
    emitted = set()
    for name in REJECT_CODES:
        uses = len(re.findall(rf'"{name}"', source)) - len(re.findall(rf'"{name}"', registry))
        if uses > 0:
            emitted.add(name)
    assert emitted == set(REJECT_CODES), (
        f"registered but never emitted: {set(REJECT_CODES) - emitted}"
    )


def test_an_unregistered_code_cannot_be_raised_or_written() -> None:
    with pytest.raises(AssertionError, match="unregistered reject code 'made_up'"):
        RecordError("made_up", "why")
    with pytest.raises(AssertionError, match="unregistered reject code 'made_up'"):
        Reject(SourceRef("a.jsonl", 1), "a", "made_up", "why")


@pytest.mark.parametrize("code", sorted(REJECT_CODES))
def test_kind_follows_the_registry(code: str) -> None:
    reject = Reject(SourceRef("a.jsonl", 1), "a", code, "why")
    assert reject.kind == REJECT_CODES[code].kind
