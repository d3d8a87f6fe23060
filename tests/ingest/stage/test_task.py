"""The driver's one way of putting unit results in order: lines absolute, errors in order."""

from __future__ import annotations

from typing import Any

import pytest

from packshard.errors import RecordError
from packshard.ingest import UnitError, UnitRead, UnitResult, WorkUnit, in_order
from packshard.ingest.read.units import InputRange


def _unit(index: int, kind: str, start: int = 0, *more: int) -> WorkUnit:
    splits = [InputRange(index, f"in{index}.jsonl", f"/in{index}.jsonl", kind, start, start + 10)]
    splits += [InputRange(i, f"in{i}.jsonl", f"/in{i}.jsonl", "file") for i in more]
    return WorkUnit(tuple(splits))


def _result(unit: WorkUnit, newlines: int, error: UnitError | None = None) -> UnitResult[Any]:
    return UnitResult(unit, UnitRead(records=newlines, newlines=newlines, error=error), None)


def test_line_bases_count_the_ranges_before_in_the_same_input() -> None:
    results = [
        _result(_unit(0, "bytes", 0), 4),
        _result(_unit(0, "bytes", 10), 3),
        _result(_unit(1, "file", 0, 2, 3), 0),  # whole inputs gathered: numbered from 1
        _result(_unit(0, "bytes", 20), 5),
        _result(_unit(4, "rows", 0), 0),  # row groups: numbered from the file's first row
    ]
    assert [base for _, base in in_order(results, 5)] == [0, 4, 0, 7, 0]


def test_the_first_error_in_unit_order_is_raised_at_its_absolute_line() -> None:
    late = UnitError("invalid_json", "not JSON", "in0.jsonl", 2)
    results = [
        _result(_unit(0, "bytes", 0), 4),
        _result(_unit(0, "bytes", 10), 3, late),
        _result(_unit(0, "bytes", 20), 5, UnitError("invalid_json", "y", "in0.jsonl", 1)),
    ]
    seen = []
    with pytest.raises(RecordError) as raised:
        for result, _ in in_order(results, 1):
            seen.append(result)
    assert str(raised.value) == str(RecordError("invalid_json", "not JSON", "in0.jsonl", 6))
    assert seen == results[:1]  # the units before it were handed over, none after
