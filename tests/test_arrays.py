"""The shared array idioms: ranges given by offsets, trained-label counts, capacity figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packshard import arrays
from packshard.arrays import (
    NameCodes,
    arrow_array,
    arrow_coded_strings,
    arrow_strings,
    count_trained,
    exclusive_cumsum,
    fill_rate,
    lower_bound_rows,
    numpy_view,
)
from packshard.records import IGNORE_INDEX as X


def test_the_docstring_example_by_hand() -> None:
    lengths = np.array([3, 2, 4])
    offsets = exclusive_cumsum(lengths)
    assert offsets.dtype == np.int64 and offsets.tolist() == [0, 3, 5, 9]
    labels = np.array([X, 1, 1, X, 2, X, 3, 3, X], dtype=np.int32)
    assert count_trained(labels, offsets).tolist() == [2, 1, 2]


def test_count_trained_skips_each_range_first_label_only_when_asked() -> None:
    labels = np.array([5, 6, X, 7, 8, 9], dtype=np.int32)
    offsets = np.array([0, 2, 2, 3, 6])  # an empty range in the middle
    assert count_trained(labels, offsets).tolist() == [1, 0, 0, 2]
    assert count_trained(labels, offsets, skip_first=False).tolist() == [2, 0, 0, 3]
    assert count_trained(labels, [0]).tolist() == []
    assert count_trained(labels, offsets).dtype == np.int64


def test_count_trained_skips_each_first_label() -> None:
    labels = np.array([7, 8, X, 9, X, X, 5], dtype=np.int32)
    offsets = np.array([0, 2, 4, 4, 7], dtype=np.int64)
    assert count_trained(labels, offsets).tolist() == [1, 1, 0, 1]


def test_count_trained_excludes_each_first_token() -> None:
    labels = np.array([5, 6, X, 8, 9, 10, X, X, 11], dtype=np.int32)
    offsets = np.array([0, 3, 3, 6, 9])  # an empty example in the middle
    assert count_trained(labels, offsets).tolist() == [1, 0, 2, 1]


def test_count_trained_of_ranges_inside_a_longer_array() -> None:
    labels = np.array([5, 6, X, 7, 8, X, 9, 10], dtype=np.int32)
    assert count_trained(labels, np.array([2, 2, 5, 6])).tolist() == [0, 2, 0]


def test_exclusive_cumsum_of_nothing() -> None:
    assert exclusive_cumsum(np.zeros(0, np.int32)).tolist() == [0]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.sampled_from([X, 0, 1, 2]), max_size=6), max_size=12))
def test_count_trained_equals_a_loop(ranges: list[list[int]]) -> None:
    flat = np.array([v for r in ranges for v in r], dtype=np.int32)
    offsets = exclusive_cumsum(np.array([len(r) for r in ranges], dtype=np.int64))
    assert count_trained(flat, offsets).tolist() == [sum(v != X for v in r[1:]) for r in ranges]
    assert count_trained(flat, offsets, skip_first=False).tolist() == [
        sum(v != X for v in r) for r in ranges
    ]


def test_name_codes_in_order_of_first_appearance_one_name_or_many() -> None:
    codes = NameCodes(("a.jsonl",))
    assert codes.encode(("b", "b", "b")).tolist() == [1, 1, 1]
    assert codes.encode(["c", "b", "a.jsonl", "c"]).tolist() == [2, 1, 0, 2]
    assert codes.encode(("a.jsonl",)).tolist() == [0]
    assert codes.encode(()).dtype == np.int32 and codes.encode(()).size == 0
    assert codes.encode(("d", "d")).dtype == np.int32
    assert codes.names == ["a.jsonl", "b", "c", "d"]


def test_capacity_figures() -> None:
    assert lower_bound_rows(18, 8) == 3
    assert lower_bound_rows(16, 8) == 2
    assert lower_bound_rows(0, 8) == 0
    assert lower_bound_rows(np.int64(17), np.int32(8)) == 3
    assert fill_rate(18, 3, 8) == 0.75
    assert fill_rate(16, 2, 8) == 1.0
    assert fill_rate(0, 0, 8) == 0.0  # no rows: nothing filled, everywhere (planner and stats)
    assert fill_rate(5, 1, 10) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        (np.array([0, 5, -3], dtype=np.int32), None),
        (np.array([0, 5, -3], dtype=np.int64), pa.int32()),
        (np.arange(10, dtype=np.int64)[::3], pa.int64()),
        (np.array([1, 2], dtype=np.int8), pa.int8()),
        (np.array([True, False, True] * 5), pa.bool_()),
        (np.zeros(0, dtype=np.int32), pa.int32()),
        (np.array([0, 127, -128], dtype=np.int8), pa.int32()),
        (np.array([7, 0], dtype=np.int16), pa.int64()),
        (np.array([250, 3], dtype=np.uint8), pa.int16()),
    ],
)
def test_arrow_array_equals_pa_array(values: np.ndarray, kind: pa.DataType | None) -> None:
    got, want = arrow_array(values, kind), pa.array(values, kind)
    assert got.type == want.type and got.null_count == 0 and got.equals(want)
    assert numpy_view(got).tolist() == values.tolist() if kind != pa.bool_() else True


def test_arrow_array_casts_safely_like_pa_array() -> None:
    with pytest.raises(pa.ArrowInvalid):
        arrow_array(np.array([2**40], dtype=np.int64), pa.int32())
    with pytest.raises(pa.ArrowInvalid):
        arrow_array(np.array([-1], dtype=np.int32), pa.uint8())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(max_size=6), min_size=1, max_size=5),
    st.lists(st.integers(0, 4), max_size=40),
    st.booleans(),
)
def test_arrow_coded_strings_equal_the_dictionary_cast(
    names: list[str], picks: list[int], wide: bool
) -> None:
    if wide:  # past CODED_WIDTH: gathered byte by byte
        names = [*names, "w" * (arrays.CODED_WIDTH + 1)]
    codes = np.array([p % len(names) for p in picks], dtype=np.int8)
    want = pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(names, pa.string()))
    got = arrow_coded_strings(codes, names)
    got.validate(full=True)
    assert got.equals(want.cast(pa.string()))
    with pytest.raises(ValueError, match="outside the names"):
        arrow_coded_strings(np.array([len(names)]), names)


def test_arrow_strings_and_numpy_view() -> None:
    names = ["a", "", "日本語", "tail"]
    assert arrow_strings(names).equals(pa.array(names, pa.string()))
    sliced = pa.array(np.arange(8, dtype=np.int32)).slice(3, 4)
    assert numpy_view(sliced).tolist() == [3, 4, 5, 6]
    assert numpy_view(pa.array([], pa.int32())).dtype == np.int32
    assert numpy_view(pa.array([], pa.int32())).size == 0


def test_pack_never_imports_pandas(tmp_path: Path) -> None:
    # pa.array and Array.to_numpy import pandas (≈0.2 CPU-s a process); pack avoids both, and
    # Arrow's casts (pyarrow.compute)
    from packshard.demo import build_demo_tokenizer, demo_data_path

    tokenizer = build_demo_tokenizer(tmp_path / "tok")
    args = [str(demo_data_path()), "-t", str(tokenizer), "--template", "chatml"]
    args += ["--max-seq-len", "512", "-o", str(tmp_path / "out"), "--no-progress"]
    prelude = (
        "import sys\nfrom packshard.cli import main\n"
        "try:\n    main()\nfinally:\n    print('PANDAS', 'pandas' in sys.modules)\n"
        "    print('COMPUTE', 'pyarrow.compute' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", prelude, "pack", *args], capture_output=True, text=True, timeout=300
    )
    assert "PANDAS False" in result.stdout, result.stdout + result.stderr
    assert "COMPUTE False" in result.stdout  # its import: 0.1-0.2 CPU-s (readers may use it)
