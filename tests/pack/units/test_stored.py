"""A unit's arrays are written once, front to back, and the digest recorded is the file's."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from packshard.ingest import UnitRead
from packshard.pack.spill import SpillCounts
from packshard.pack.units.stored import ARRAYS, MARKER, SpillPart, load_unit, save_unit


def test_saved_arrays_read_back_and_hash_as_recorded(tmp_path):
    from packshard.ingest.read.units import WorkUnit

    arrays = {
        "lengths": np.arange(1, 300_001, dtype=np.int64),
        "lines": np.arange(300_000, dtype=np.int32),
        "truncated": np.zeros(300_000, bool),
        "record_lines": np.arange(300_000, dtype=np.int64),
    }
    unit = WorkUnit(ranges=())
    part = SpillPart(str(tmp_path), dict(arrays), SpillCounts(), ())
    doc = save_unit(tmp_path, UnitRead(records=3, newlines=4), part)
    data = (tmp_path / ARRAYS).read_bytes()
    assert doc["files"][ARRAYS] == hashlib.sha256(data).hexdigest()
    assert json.loads((tmp_path / MARKER).read_text())["files"] == doc["files"]
    back = load_unit(tmp_path, unit)
    assert sorted(back.value.arrays) == sorted(arrays)
    for name, values in arrays.items():
        assert back.value.arrays[name].dtype == values.dtype
        assert np.array_equal(back.value.arrays[name], values)
    assert (back.read.records, back.read.newlines) == (3, 4)
