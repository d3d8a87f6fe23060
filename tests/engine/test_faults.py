from __future__ import annotations

import pytest

from packshard.engine.faults import inject, parse_faults
from packshard.errors import UsageError


def test_parse_faults():
    assert parse_faults("crash:bytes 0–:1, raise:shard-00001:9") == (
        ("crash", "bytes 0–", 1),
        ("raise", "shard-00001", 9),
    )
    assert parse_faults(None) == () == parse_faults("")
    with pytest.raises(UsageError, match="'boom:x:1' is not KIND:MATCH:TIMES"):
        parse_faults("boom:x:1")


def test_a_raise_fault_fails_the_first_attempts_only(tmp_path):
    faults = parse_faults("raise:shard-00001:2")
    inject("shard-00000.parquet", faults, tmp_path)  # no match: nothing happens
    for attempt in (1, 2):
        with pytest.raises(
            OSError, match=f"rehearsed fault in shard-00001.parquet .attempt {attempt}"
        ):
            inject("shard-00001.parquet", faults, tmp_path)
    inject("shard-00001.parquet", faults, tmp_path)
    inject("shard-00001.parquet", faults, None)  # no folder: faults are off
