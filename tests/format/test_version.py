"""The format version: integers only, supported ones only, and the Parquet metadata it rides in."""

from __future__ import annotations

import pytest

from packshard.errors import ManifestError
from packshard.format.version import (
    FORMAT_VERSION,
    META_DATASET_ID,
    META_FORMAT_VERSION,
    SUPPORTED_VERSIONS,
    check_format_version,
    metadata_problem,
    parquet_metadata,
)

DATASET = "ab12" * 8


def test_version_one_is_written_and_supported():
    assert FORMAT_VERSION == 1 and SUPPORTED_VERSIONS == (1,)
    check_format_version(1, "x")
    assert parquet_metadata(DATASET) == {
        META_FORMAT_VERSION: b"1",
        META_DATASET_ID: DATASET.encode(),
    }
    assert (META_FORMAT_VERSION, META_DATASET_ID) == (
        b"packshard.format_version",
        b"packshard.dataset_id",
    )


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("1", "x: format_version is '1', expected an integer"),
        (True, "x: format_version is True, expected an integer"),
        (None, "x: format_version is None, expected an integer"),
        (
            2,
            "x: format_version 2 is not supported by this packshard (supports 1); upgrade "
            "packshard or re-pack the data",
        ),
    ],
)
def test_check_format_version_refuses_what_it_cannot_read(version, message):
    with pytest.raises(ManifestError) as info:
        check_format_version(version, "x")
    assert str(info.value) == message


def test_metadata_problem_says_what_is_wrong():
    good = parquet_metadata(DATASET)
    assert metadata_problem(good, DATASET) is None
    assert metadata_problem({**good, b"other": b"kept"}, DATASET) is None
    assert metadata_problem(None, DATASET) == "no packshard.format_version in its Parquet metadata"
    assert metadata_problem({}, DATASET) == "no packshard.format_version in its Parquet metadata"
    newer = {**good, META_FORMAT_VERSION: b"2"}
    assert metadata_problem(newer, DATASET) == "packshard.format_version '2' is not supported"
    garbled = {**good, META_FORMAT_VERSION: b"one"}
    assert metadata_problem(garbled, DATASET) == "packshard.format_version 'one' is not supported"
    other = "cd34" * 8
    assert metadata_problem(good, other) == (
        f"packshard.dataset_id {DATASET} differs from the manifest's {other} (the file belongs "
        "to another pack, or the folder was replaced while it was open)"
    )
    no_id = {META_FORMAT_VERSION: b"1"}
    assert metadata_problem(no_id, DATASET).startswith(
        f"packshard.dataset_id none differs from the manifest's {DATASET}"
    )
