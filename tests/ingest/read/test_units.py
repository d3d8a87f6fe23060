from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packshard.errors import InputError
from packshard.ingest.read.sources import InputFile, read_records
from packshard.ingest.read.units import InputRange, RangeRead, plan_ranges, plan_units, read_range

BOM = b"\xef\xbb\xbf"


def records_of(splits: list[InputRange]) -> list[tuple[int, str]]:
    """Every split's records with lines made absolute, as the driver does."""
    out, base = [], {}
    for s in splits:
        state = RangeRead()
        records = list(read_range(s, state))
        shift = base.get(s.index, 0) if s.kind == "bytes" else 0
        out += [(r.ref.line + shift, r.error.code if r.error else "ok") for r in records]
        base[s.index] = base.get(s.index, 0) + state.newlines
    return out


def whole(f: InputFile) -> list[tuple[int, str]]:
    return [(r.ref.line, r.error.code if r.error else "ok") for r in read_records(f)]


def test_jsonl_is_cut_at_line_starts_and_lines_stay_absolute(tmp_path):
    path = tmp_path / "chat.jsonl"
    lines = [b'{"a": 1}', b"", b"{bad", b'{"b": 2}', b"", b"", b'{"c": 3}']
    path.write_bytes(BOM + b"\n".join(lines))  # no newline after the last line
    f = InputFile(str(path), path)
    splits = plan_ranges([f], 9)
    assert [(s.start, s.stop) for s in splits] == [(0, 12), (12, 27), (27, 37)]
    assert all(path.read_bytes()[s.start - 1 : s.start] == b"\n" for s in splits[1:])
    assert splits[0].describe() == f"{path} bytes 0–12"
    assert splits[0].name == "00000-bytes-0-12"
    assert records_of(splits) == whole(f) == [(1, "ok"), (3, "invalid_json"), (4, "ok"), (7, "ok")]


def test_a_line_starting_with_a_bom_is_never_a_cut_point(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'{"a": 1}\n' + BOM + b'{"b": 2}\n{"c": 3}\n')
    f = InputFile(str(path), path)
    splits = plan_ranges([f], 5)
    assert [(s.start, s.stop) for s in splits] == [(0, 21), (21, 30)]
    assert records_of(splits) == whole(f) == [(1, "ok"), (2, "invalid_json"), (3, "ok")]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.sampled_from([b'{"x": 1}', b"", b"  ", b"[]", b'{"y": "\xc3\xa9"}', b"\xff"]),
        max_size=12,
    ),
    st.integers(1, 40),
    st.booleans(),
)
def test_any_cut_reads_what_the_whole_file_reads(tmp_path_factory, lines, target, newline_end):
    path = tmp_path_factory.mktemp("cut") / "data.jsonl"
    path.write_bytes(b"\n".join(lines) + (b"\n" if newline_end else b""))
    f = InputFile(str(path), path)
    assert records_of(plan_ranges([f], target)) == whole(f)


class FakeStore:
    """Store objects served from local files through pyarrow's random-access file.

    ``open_stored`` is what every read of a store object goes through; ``opened`` counts
    the opens, so a test can tell whether the planner read an object.
    """

    def __init__(self, files: dict[str, object]) -> None:
        self.files, self.opened = files, 0

    def open(self, f: InputFile) -> pa.NativeFile:
        self.opened += 1
        return pa.OSFile(str(self.files[f.path]))


def stored(path) -> InputFile:
    """``path`` as an unfetched store object at ``s3://b/NAME``."""
    return InputFile(f"s3://b/{path.name}", Path(f"s3://b/{path.name}"), path.stat().st_size)


def test_a_store_object_is_cut_by_its_size_and_each_worker_finds_its_lines(tmp_path):
    path = tmp_path / "chat.jsonl"
    lines = [b'{"a": 1}', b"", b"{bad", b'{"b": 2}', b"", b"", b'{"c": 3}']
    path.write_bytes(BOM + b"\n".join(lines))  # 37 bytes, no newline after the last line
    f = stored(path)
    store = FakeStore({f.path: path})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("packshard.ingest.read.units.open_stored", store.open)
        patch.setattr("packshard.ingest.read.sources.open_stored", store.open)
        splits = plan_ranges([f], 9)
        assert store.opened == 0  # the planner read nothing of it
        assert [(s.start, s.stop) for s in splits] == [
            (0, 9),
            (9, 18),
            (18, 27),
            (27, 36),
            (36, 37),
        ]
        assert all(s.in_store and s.real == f.path and s.total == 37 for s in splits)
        assert splits[1].describe() == "s3://b/chat.jsonl bytes 9–18"
        local = InputFile(str(path), path)
        assert (
            records_of(splits)
            == whole(local)
            == [(1, "ok"), (3, "invalid_json"), (4, "ok"), (7, "ok")]
        )
        assert store.opened == 5  # each range opened by its own reader
        (one,) = plan_ranges([f], 100)  # read whole: the object streamed, not fetched
        assert one.kind == "bytes" and records_of([one]) == whole(local)


def test_a_store_read_that_fails_is_one_line_naming_the_object_and_range(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_bytes(b'{"a": 1}\n' * 20)
    f = stored(path)

    class Broken(pa.PythonFile):  # the store stops answering after the bounds are found
        def read_at(self, nbytes, offset):
            raise OSError("connection reset by peer")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("packshard.ingest.read.units.open_stored", lambda f: Broken(open(path, "rb")))
        split = plan_ranges([f], 50)[1]  # [50, 100): lines of 9 bytes start at 54 … 108
        with pytest.raises(InputError) as caught:
            list(read_range(split))
    assert str(caught.value) == (
        "s3://b/chat.jsonl: cannot read bytes 54–108 (connection reset by peer)"
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [b'{"x": 1}', b"", b"  ", b"[]", b'{"y": "\xc3\xa9"}', b"\xff", BOM + b'{"z": 2}']
        ),
        max_size=12,
    ),
    st.integers(1, 40),
    st.booleans(),
)
def test_any_nominal_cut_of_a_store_object_reads_what_the_whole_file_reads(
    tmp_path_factory, lines, target, newline_end
):
    path = tmp_path_factory.mktemp("cut") / "data.jsonl"
    path.write_bytes(b"\n".join(lines) + (b"\n" if newline_end else b""))
    f = stored(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("packshard.ingest.read.units.open_stored", FakeStore({f.path: path}).open)
        splits = plan_ranges([f], target)
        assert records_of(splits) == whole(InputFile(str(path), path))
        assert records_of(splits) == records_of(plan_ranges([InputFile(str(path), path)], target))


def test_store_parquet_and_gzip_objects_read_where_the_task_runs(tmp_path):
    rows = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(10)]}), rows, row_group_size=3)
    packed = tmp_path / "chat.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"a": 1}\n{"b": 2}\n'))
    files = [stored(rows), stored(packed)]
    store = FakeStore({f.path: p for f, p in zip(files, (rows, packed), strict=True)})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("packshard.ingest.read.units.open_stored", store.open)
        patch.setattr("packshard.ingest.read.sources.open_stored", store.open)
        splits = plan_ranges(files, 1)
        assert store.opened == 1  # the Parquet footer: its row groups' bounds
        assert [(s.kind, s.start, s.stop) for s in splits] == [
            ("rows", 0, 1), ("rows", 1, 2), ("rows", 2, 3), ("rows", 3, 4), ("file", 0, 0)
        ]  # fmt: skip
        assert records_of(splits[:4]) == whole(InputFile(str(rows), rows))
        assert [r.value for r in read_range(splits[4])] == [{"a": 1}, {"b": 2}]


def test_parquet_is_cut_at_row_groups_numbered_from_the_file_start(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(10)]}), path, row_group_size=3)
    f = InputFile(str(path), path)
    splits = plan_ranges([f], 1)
    assert [(s.start, s.stop, s.first_row) for s in splits] == [
        (0, 1, 0),
        (1, 2, 3),
        (2, 3, 6),
        (3, 4, 9),
    ]
    assert splits[1].describe() == f"{path} row groups 1–1"
    assert records_of(splits) == whole(f)
    assert [r.value["text"] for r in read_range(splits[2])] == ["row 6", "row 7", "row 8"]


@pytest.mark.parametrize("name", ["chat.json", "chat.jsonl.gz"])
def test_files_that_cannot_be_cut_are_one_unit(tmp_path, name):
    path = tmp_path / name
    data = json.dumps([{"a": 1}, {"b": 2}]) if name.endswith(".json") else '{"a": 1}\n{"b": 2}\n'
    path.write_bytes(gzip.compress(data.encode()) if name.endswith(".gz") else data.encode())
    f = InputFile(str(path), path)
    (split,) = plan_ranges([f], 1)
    assert split.kind == "file" and split.describe() == f"{path} (whole file)"
    assert records_of([split]) == whole(f)


def test_the_unit_size_follows_the_inputs_not_the_workers(tmp_path, monkeypatch):
    """Without --split-bytes: the inputs' bytes over 64, within 16–64 MiB, so a small input is
    one unit (no fill and drain per MiB), and a large dataset 64 MiB units."""
    from packshard.ingest.read import units as module
    from packshard.ingest.read.units import MIN_SPLIT_BYTES, SPLIT_BYTES, auto_split_bytes

    def sized(name, size):
        path = tmp_path / name
        with open(path, "wb") as fh:
            fh.truncate(size)  # sparse: only the size matters here
        return InputFile(name, path)

    mib = 1 << 20
    assert MIN_SPLIT_BYTES == 16 * mib
    assert auto_split_bytes([sized("tiny.jsonl", 1000)]) == MIN_SPLIT_BYTES
    assert auto_split_bytes([sized("eight.jsonl", 8 * mib)]) == MIN_SPLIT_BYTES  # one unit
    assert auto_split_bytes([sized("a.jsonl", 1536 * mib), sized("b.jsonl", 512 * mib)]) == 32 * mib
    assert auto_split_bytes([sized("big.jsonl", 100 * 64 * mib)]) == SPLIT_BYTES
    assert auto_split_bytes([InputFile("gone.jsonl", tmp_path / "gone.jsonl")]) == MIN_SPLIT_BYTES

    monkeypatch.setattr(module, "MIN_SPLIT_BYTES", mib)  # cut an 8 MB file at the default
    lines = b"".join(b'{"text": "%06d %s"}\n' % (i, b"x" * 200) for i in range(40_000))
    data = tmp_path / "eight.jsonl"
    data.write_bytes(lines)
    files = [InputFile("eight.jsonl", data)]
    splits = plan_ranges(files)  # the default: chosen from the inputs
    assert len(splits) == -(-len(lines) // mib) > 4
    assert b"".join(data.read_bytes()[s.start : s.stop] for s in splits) == lines


def test_small_whole_inputs_are_gathered_up_to_the_unit_size(tmp_path):
    def write(name: str, size: int) -> InputFile:
        path = tmp_path / name
        path.write_bytes(b"".join(b'{"t": "x"}\n' for _ in range(size // 11)))
        return InputFile(str(path), path)

    files = [write("a.jsonl", 33), write("b.jsonl", 44), write("c.jsonl", 22)]
    files += [write("big.jsonl", 220), write("d.jsonl", 11), write("e.json", 0)]
    units = plan_units(files, 100)
    names = [[s.path.rsplit("/", 1)[-1] for s in u.ranges] for u in units]
    assert names[0] == ["a.jsonl", "b.jsonl", "c.jsonl"]  # 33 + 44 + 22 = 99 bytes <= 100
    assert all(n == ["big.jsonl"] for n in names[1:-1]) and len(names) > 3  # cut: alone
    assert names[-1] == ["d.jsonl", "e.json"]  # a run starts again after it
    assert units[0].name == "00000-inputs-00002" and units[1].name == units[1].ranges[0].name
    assert units[0].size == 99 and units[0].describe().endswith("(3 whole inputs)")
    assert [s for u in units for s in u.ranges] == plan_ranges(files, 100)  # same splits, in order
    assert len(plan_units(files, 50)[0].ranges) == 1  # 33 + 44 > 50: a run of one
