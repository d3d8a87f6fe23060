"""Input discovery, streaming readers, line numbers and the rejects of reading."""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from packshard.digests import sha256_path
from packshard.errors import InputError, RecordError
from packshard.ingest.read.sources import InputFile, expand_inputs, file_domain, read_records
from packshard.ingest.types import RawRecord
from packshard.records import SourceRef

STOP = "; the rest of the file is not read"


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def read(path: Path, **kwargs: int) -> list[RawRecord]:
    return list(read_records(InputFile(str(path), path.resolve()), **kwargs))


def summary(records: list[RawRecord]) -> list[tuple[int, object]]:
    """(line, value) for good records, (line, (code, reason)) for rejects."""
    return [
        (r.ref.line, r.value if r.error is None else (r.error.code, r.error.reason))
        for r in records
    ]


# --- names, discovery, hashing ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "domain"),
    [
        ("chat.jsonl.gz", "chat"),
        ("data/chat.jsonl", "chat"),
        ("a.b.json", "a.b"),
        ("x.json.zst", "x"),
        ("rows.parquet", "rows"),
        ("Upper.JSONL.GZ", "Upper"),
        ("notes.txt", "notes.txt"),
        ("dir.v2/a.gz.jsonl", "a.gz"),
    ],
)
def test_file_domain_strips_only_known_extensions(path: str, domain: str) -> None:
    assert file_domain(path) == domain


def test_expand_file_folder_glob_sorted_and_deduplicated(tmp_path: Path) -> None:
    for name in ["d/b.jsonl", "d/a.json.gz", "d/sub/c.parquet", "d/z.jsonl.zst"]:
        write(tmp_path / name, "")
    write(tmp_path / "d/README.md", "not data")
    write(tmp_path / "d/.hidden/x.jsonl", "")
    write(tmp_path / "d/.y.jsonl", "")
    write(tmp_path / "g/2.jsonl", "")
    write(tmp_path / "g/1.jsonl", "")
    d, g = str(tmp_path / "d"), str(tmp_path / "g")
    files = expand_inputs([f"{g}/*.jsonl", d, f"{d}/b.jsonl", f"{g}/1.jsonl"])
    assert [f.path for f in files] == [
        f"{g}/1.jsonl",
        f"{g}/2.jsonl",
        f"{d}/a.json.gz",
        f"{d}/b.jsonl",
        f"{d}/sub/c.parquet",
        f"{d}/z.jsonl.zst",
    ]
    assert files[3].real == (tmp_path / "d/b.jsonl").resolve()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("x.csv", "x.csv: unsupported input type "
         "(expected .jsonl, .json, .parquet, optionally .gz/.zst)"),
        ("x.parquet.gz", "x.parquet.gz: unsupported input type "
         "(Parquet is compressed inside; remove the outer .gz)"),
    ],
)  # fmt: skip
def test_expand_rejects_unsupported_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / name, "")
    with pytest.raises(InputError) as err:
        expand_inputs([name])
    assert str(err.value) == message
    assert err.value.exit_code == 2


def test_expand_reports_specs_that_match_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    write(tmp_path / "empty/notes.txt", "")
    cases = {
        "missing.jsonl": "missing.jsonl: no such file or folder",
        "*.jsonl": "*.jsonl: pattern matches no input files (check the glob)",
        "empty": "empty: folder holds no input files "
        "(expected .jsonl, .json, .parquet, optionally .gz/.zst)",
    }
    for spec, message in cases.items():
        with pytest.raises(InputError) as err:
            expand_inputs([spec])
        assert str(err.value) == message


def test_sha256_path_streams_the_bytes(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000
    path = write(tmp_path / "a.jsonl", data)
    assert sha256_path(path, chunk=1000) == hashlib.sha256(data).hexdigest()


def test_unopenable_file_raises_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        read(tmp_path / "gone.jsonl")
    assert str(err.value) == f"{tmp_path / 'gone.jsonl'}: cannot open (No such file or directory)"


# --- JSONL -----------------------------------------------------------------------------------


def test_jsonl_counts_blank_lines_and_places_every_reject(tmp_path: Path) -> None:
    lines = [
        b'\xef\xbb\xbf{"a": 1}',  # byte order mark on line 1
        b"",
        b"   \t",
        b'{"a": 2}\r',  # CRLF
        b'{"a": ',
        b'{"s": "caf\xc3\xa9 \xff"}',
        b"[1, 2]",
        b'"text"',
        b"null",
        b"[" * 100_000,
        b'{"a": 3}',  # no final newline
    ]
    path = write(tmp_path / "chat.jsonl", b"\n".join(lines))
    records = read(path)
    assert summary(records) == [
        (1, {"a": 1}),
        (4, {"a": 2}),
        (5, ("invalid_json", "invalid JSON: Expecting value at column 7")),
        (6, ("invalid_utf8", "invalid UTF-8 at byte offset 13 of the line (invalid start byte)")),
        (7, ("not_an_object", "record is a list, expected a JSON object")),
        (8, ("not_an_object", "record is a string, expected a JSON object")),
        (9, ("not_an_object", "record is null, expected a JSON object")),
        (10, ("invalid_json", "invalid JSON: nested too deeply")),
        (11, {"a": 3}),
    ]
    assert {r.domain for r in records} == {"chat"}
    assert records[2].ref == SourceRef(str(path), 5)
    assert str(records[2].error) == f"{path}:5: invalid JSON: Expecting value at column 7"


def test_jsonl_values_are_what_the_standard_parser_reads(tmp_path: Path) -> None:
    """Python's json reading, also where faster parsers differ (huge integers become floats)."""
    lines = [
        '{"a": 2, "b": [1.5, -0.0, 1e308, "x\\u00e9"]}',  # (a repeated key is a reject)
        '{"n": NaN, "i": Infinity}',  # not JSON to the fast parser
        '{"big": 123456789012345678901234567890}',  # beyond 64 bits
        '{"s": "\\ud800"}',  # a lone surrogate escape (rejected later, at rendering)
        '{"crlf": true}\r',
        '  {"padded": "yes"}  ',
    ]
    records = read(write(tmp_path / "a.jsonl", "\ufeff" + "\n".join(lines) + "\n"))
    expected = [json.loads(line.lstrip("\ufeff")) for line in lines]
    values = [r.value for r in records]
    assert [r.error for r in records] == [None] * len(lines)
    assert json.dumps(values, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert values[2]["big"] == 123456789012345678901234567890


@pytest.mark.parametrize("chunk_size", [1, 2, 7, 1 << 20])
def test_jsonl_lines_survive_any_chunk_size(tmp_path: Path, chunk_size: int) -> None:
    rows = [{"i": i, "t": "é中🙂" * i} for i in range(30)]
    text = "\n\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n"
    records = read(write(tmp_path / "a.jsonl", text), chunk_size=chunk_size)
    assert summary(records) == [(2 * i + 1, r) for i, r in enumerate(rows)]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
GARBAGE = ["{", "not json", '{"a": }', "[1, 2", "{'single': 1}", '{"a": 1} x']
LINES = st.lists(
    st.one_of(
        st.dictionaries(st.text(), JSON_VALUES, max_size=4).map(lambda d: ("ok", d)),
        st.sampled_from(["", " ", "\t", "\r", "  \r"]).map(lambda s: ("blank", s)),
        st.sampled_from(GARBAGE).map(lambda s: ("bad", s)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(lines=LINES, chunk_size=st.integers(1, 64), newline_at_end=st.booleans())
def test_every_nonblank_jsonl_line_is_one_record(
    tmp_path_factory: pytest.TempPathFactory,
    lines: list[tuple[str, object]],
    chunk_size: int,
    newline_at_end: bool,
) -> None:
    texts = [json.dumps(v, ensure_ascii=False) if k == "ok" else str(v) for k, v in lines]
    data = "\n".join(texts) + ("\n" if newline_at_end else "")
    path = write(tmp_path_factory.mktemp("p") / "x.jsonl", data)
    records = read(path, chunk_size=chunk_size)
    expected = [(n, kind, v) for n, (kind, v) in enumerate(lines, 1) if kind != "blank"]
    assert [r.ref.line for r in records] == [n for n, _, _ in expected]
    for record, (_, kind, value) in zip(records, expected, strict=True):
        if kind == "ok":
            assert record.error is None and record.value == value
        else:
            assert record.value is None and record.error.code == "invalid_json"


# --- compressed streams ----------------------------------------------------------------------

JSONL = "".join(json.dumps({"i": i, "pad": "x" * (i % 50)}) + "\n" for i in range(2000)).encode()


def zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("a.jsonl.gz", gzip.compress(JSONL)),
        ("a.jsonl.zst", zst(JSONL)),
        ("a.jsonl.gz", gzip.compress(JSONL[:5000]) + gzip.compress(JSONL[5000:]) + b"\0" * 8),
        ("a.jsonl.zst", zst(JSONL[:777]) + zst(JSONL[777:])),
    ],
)
def test_compressed_jsonl_reads_like_plain(tmp_path: Path, name: str, data: bytes) -> None:
    plain = read(write(tmp_path / "a.jsonl", JSONL))
    for chunk_size in (97, 1 << 20):
        records = read(write(tmp_path / name, data), chunk_size=chunk_size)
        assert summary(records) == summary(plain)
        assert len(records) == 2000 and records[0].domain == "a"


@pytest.mark.parametrize("codec", [".gz", ".zst"])
def test_truncated_stream_rejects_at_the_first_unread_line(tmp_path: Path, codec: str) -> None:
    hexes = (hashlib.sha256(str(i).encode()).hexdigest() for i in range(6000))
    data = "".join(json.dumps({"h": h}) + "\n" for h in hexes).encode()  # several zstd blocks
    packed = gzip.compress(data) if codec == ".gz" else zst(data)
    cut = packed[: len(packed) // 2]
    if codec == ".gz":
        prefix = zlib.decompressobj(wbits=31).decompress(cut)
    else:
        prefix = zstandard.ZstdDecompressor().decompressobj().decompress(cut)
    whole_lines = prefix.count(b"\n")
    assert 0 < whole_lines < 6000
    records = read(write(tmp_path / f"a.jsonl{codec}", cut), chunk_size=4096)
    assert len(records) == whole_lines + 1
    assert all(r.error is None for r in records[:-1])
    last = records[-1]
    assert last.ref.line == whole_lines + 1
    assert (last.error.code, last.error.reason) == (
        "unreadable",
        f"cannot decompress: the {codec} stream is truncated (it ends before its end marker)"
        + STOP,
    )


def test_corrupt_stream_is_one_unreadable_record(tmp_path: Path) -> None:
    records = read(write(tmp_path / "a.jsonl.gz", b'{"not": "gzip"}\n'))
    assert summary(records) == [
        (
            1,
            (
                "unreadable",
                "cannot decompress: corrupt .gz stream (Error -3 while decompressing data: "
                "incorrect header check)" + STOP,
            ),
        )
    ]
    records = read(write(tmp_path / "b.jsonl.zst", b"\x00" * 64))
    assert records[0].error.code == "unreadable"
    assert records[0].error.reason.startswith("cannot decompress: corrupt .zst stream (")


# --- JSON files ------------------------------------------------------------------------------

ARRAY = [{"id": i, "s": 'é中🙂\\"\n' * i, "n": [1.5, -2e300, None, True]} for i in range(12)]


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 5, 16, 1 << 20])
@pytest.mark.parametrize("indent", [None, 2])
def test_json_array_streams_with_any_chunk_size(
    tmp_path: Path, chunk_size: int, indent: int | None
) -> None:
    text = json.dumps(ARRAY, ensure_ascii=False, indent=indent)
    assert chunk_size < len(json.dumps(ARRAY[1])) or chunk_size == 1 << 20  # < one element
    records = read(write(tmp_path / "a.json", "\ufeff" + text), chunk_size=chunk_size)
    assert summary(records) == [(i, v) for i, v in enumerate(ARRAY, 1)]


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(JSON_VALUES, max_size=12),
    chunk_size=st.integers(1, 40),
    indent=st.sampled_from([None, 0, 3]),
)
def test_json_array_property_any_chunk_size(
    tmp_path_factory: pytest.TempPathFactory, values: list[Any], chunk_size: int, indent: int | None
) -> None:
    text = json.dumps(values, ensure_ascii=False, indent=indent)
    path = write(tmp_path_factory.mktemp("p") / "x.json", text)
    records = read(path, chunk_size=chunk_size)
    assert [r.ref.line for r in records] == list(range(1, len(values) + 1))
    for record, value in zip(records, values, strict=True):
        if isinstance(value, dict):
            assert record.error is None and record.value == value
        else:
            assert record.error.code == "not_an_object"


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 4, 1 << 20])
def test_json_numbers_are_not_cut_at_chunk_edges(tmp_path: Path, chunk_size: int) -> None:
    text = "[12345678, {}, -0.5e-3, 0.0, 1.25e+3]"
    records = read(write(tmp_path / "a.json", text), chunk_size=chunk_size)
    kind = ("not_an_object", "record is a number, expected a JSON object")
    assert summary(records) == [(1, kind), (2, {}), (3, kind), (4, kind), (5, kind)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', [(1, {"a": 1})]),
        ("  [ ]  ", []),
        ("", [(1, ("invalid_json", "invalid JSON: the file is empty"))]),
        (
            '{"a": 1}\n{"a": 2}\n',
            [
                (
                    1,
                    (
                        "invalid_json",
                        "invalid JSON: extra data at line 2; "
                        "a file of one JSON value per line must be named .jsonl",
                    ),
                )
            ],
        ),
        (
            '[{"a": 1},\n {"a": 2},\n {"a": 3 "b": 4},\n {"a": 5}]',
            [
                (1, {"a": 1}),
                (2, {"a": 2}),
                (3, ("invalid_json", "invalid JSON: Expecting ',' delimiter at line 3" + STOP)),
            ],
        ),
        (
            '[{"a": 1} {"a": 2}]',
            [
                (1, {"a": 1}),
                (
                    2,
                    (
                        "invalid_json",
                        "invalid JSON: expected ',' or ']' after element 1 at line 1" + STOP,
                    ),
                ),
            ],
        ),
        (
            '[{"a": 1},',
            [
                (1, {"a": 1}),
                (2, ("invalid_json", "invalid JSON: Expecting value at line 1" + STOP)),
            ],
        ),
        (
            '[{"a": 1},]',
            [
                (1, {"a": 1}),
                (2, ("invalid_json", "invalid JSON: Expecting value at line 1" + STOP)),
            ],
        ),
        (
            '[{"a": "unterminated',
            [(1, ("invalid_json", "invalid JSON: Unterminated string starting at line 1" + STOP))],
        ),
        (
            '[{"a": 1}]\n[2]',
            [
                (1, {"a": 1}),
                (2, ("invalid_json", "invalid JSON: extra data after the closing ']' at line 2")),
            ],
        ),
    ],
)
def test_json_file_shapes_and_breaks(
    tmp_path: Path, text: str, expected: list[tuple[int, object]]
) -> None:
    for chunk_size in (3, 1 << 20):
        assert summary(read(write(tmp_path / "a.json", text), chunk_size=chunk_size)) == expected


def test_json_invalid_utf8_keeps_earlier_elements(tmp_path: Path) -> None:
    data = b'[{"a": "\xc3\xa9"}, {"a": "x\xffy"}, {"a": 3}]'
    for chunk_size in (1, 5, 1 << 20):
        records = read(write(tmp_path / "a.json", data), chunk_size=chunk_size)
        assert summary(records) == [
            (1, {"a": "é"}),
            (
                2,
                (
                    "invalid_utf8",
                    "invalid UTF-8 at byte offset 22 of the file (invalid start byte)" + STOP,
                ),
            ),
        ]


def test_compressed_json_array_and_truncation(tmp_path: Path) -> None:
    text = json.dumps([{"i": i, "pad": "y" * 40} for i in range(500)]).encode()
    records = read(write(tmp_path / "a.json.zst", zst(text)), chunk_size=64)
    assert [r.value["i"] for r in records] == list(range(500))
    cut = gzip.compress(text)[:300]
    records = read(write(tmp_path / "b.json.gz", cut), chunk_size=64)
    assert all(r.error is None for r in records[:-1]) and len(records) > 1
    assert records[-1].ref.line == len(records)
    assert records[-1].error.code == "unreadable"


# --- Parquet ---------------------------------------------------------------------------------


def test_parquet_rows_become_dicts_with_row_numbers(tmp_path: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}], "domain": None if i % 2 else "math"}
        for i in range(2500)
    ]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1000)
    records = read(path, chunk_size=100)
    assert summary(records) == [(i, r) for i, r in enumerate(rows, 1)]
    assert records[0].domain == "t"


def test_corrupt_parquet_cannot_be_opened(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.parquet", b"PAR1 this is not parquet")
    with pytest.raises(InputError) as err:
        read(path)
    assert str(err.value).startswith(f"{path}: cannot read Parquet file (")


# --- the real third-party files --------------------------------------------------------------

SHARED_COUNTS = {
    "llamafactory_alpaca_en_demo.json": 999,
    "llamafactory_alpaca_zh_demo.json": 1000,
    "codealpaca_code_alpaca_2k.json": 2017,
    "llamafactory_identity.json": 91,
    "llamafactory_glaive_toolcall_en_demo.json": 300,
    "fastchat_dummy_conversation.json": 500,
    "openai_cookbook_toy_chat_fine_tuning.jsonl": 5,
    "anthropic_cookbook_json_mode_dataset.jsonl": 500,
    "v1_sft_demo.jsonl": 500,
}


@pytest.mark.shared_data
def test_shared_chat_files_read_without_rejects(shared_data: Path) -> None:
    files = expand_inputs([str(shared_data / "chat")])
    assert sorted(Path(f.path).name for f in files) == sorted(SHARED_COUNTS)
    for f in files:
        records = list(read_records(f))
        assert len(records) == SHARED_COUNTS[Path(f.path).name]
        assert [r.ref.line for r in records] == list(range(1, len(records) + 1))
        assert all(r.error is None and isinstance(r.value, dict) for r in records)
        if f.real.stat().st_size < 300_000:  # the incremental reader agrees at a tiny chunk size
            assert [r.value for r in read_records(f, chunk_size=13)] == [r.value for r in records]


def test_record_error_is_a_record_error(tmp_path: Path) -> None:
    (record,) = read(write(tmp_path / "a.jsonl", "oops\n"))
    assert isinstance(record.error, RecordError) and record.error.exit_code == 1
    assert (record.error.source, record.error.line) == (str(tmp_path / "a.jsonl"), 1)
