"""Write tasks are made one at a time, when an engine takes them, and not kept."""

from __future__ import annotations

import pytest

from packshard.pack.write.shards import Made


def test_tasks_are_made_when_taken_and_every_index_rule_holds():
    made: list[int] = []

    def make(k: int):
        made.append(k)
        return f"task {k}"

    tasks = Made(make, 3)  # type: ignore[arg-type]
    assert len(tasks) == 3 and made == []  # nothing is made up front
    assert tasks[1] == "task 1" and tasks[-1] == "task 2" and made == [1, 2]
    assert tasks[1] == "task 1" and made == [1, 2, 1]  # a retry makes it again: no cache
    assert list(tasks) == ["task 0", "task 1", "task 2"]
    assert tasks[0:3:2] == ["task 0", "task 2"]
    with pytest.raises(IndexError):
        tasks[3]
    with pytest.raises(IndexError):
        tasks[-4]
