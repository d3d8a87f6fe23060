"""Crafted output folders are findings or one-line errors, never a traceback or a hang.

A row whose ``cu_seqlens`` is empty is a finding in every stage of ``verify``; a token id
outside the vocabulary is one line from ``inspect``; a manifest that lists one shard
200,000 times is refused before anything is validated or opened per entry; a shard swapped
for a link after the reader validated the folder is refused when it is opened.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packshard.digests import sha256_path
from packshard.errors import FormatError, ManifestError
from tests.hostile.test_out_folders import cli, edit_manifest


def rewrite_column(out: Path, name: str, change: Any) -> Path:
    """Change one list column of shard 0 and fix its checksum and size in the manifest."""
    shard = out / "shard-00000.parquet"
    table = pq.read_table(shard)
    values = table[name].to_pylist()
    change(values)
    at = table.column_names.index(name)
    table = table.set_column(at, name, pa.array(values, type=table.schema.field(name).type))
    pq.write_table(table, shard)

    def fix(m: dict[str, Any]) -> None:
        m["shards"][0].update(sha256=sha256_path(shard), bytes=shard.stat().st_size)

    edit_manifest(out, fix)
    return shard


def test_empty_cu_seqlens_is_a_finding_in_every_stage(packed_demo_copy):
    def empty(values: list) -> None:
        values[0] = []

    rewrite_column(packed_demo_copy, "cu_seqlens", empty)
    result = cli("verify", packed_demo_copy, "--model", "none")
    assert result.exit_code == 1, result.output
    assert "✗ [structure] shard-00000.parquet row 0: cu_seqlens" in result.stdout
    assert "its row's cu_seqlens do not hold this segment (see structure)" in result.stdout


def test_inspect_on_a_token_id_outside_the_vocabulary_is_one_line(packed_demo_copy):
    def negative(values: list) -> None:
        values[0][3] = -5

    shard = rewrite_column(packed_demo_copy, "input_ids", negative)
    result = cli("inspect", packed_demo_copy, "--row", "0")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"error: {shard}: row 0: token id -5 at position 3 is not in the tokenizer's vocabulary"
    )
    assert result.stderr.count("\n") == 1


def test_a_shard_listed_200000_times_is_refused_at_once(packed_demo_copy, tmp_path):
    def repeat(m: dict[str, Any]) -> None:
        m["shards"] = [m["shards"][0]] * 200_000

    edit_manifest(packed_demo_copy, repeat)
    result = cli("verify", packed_demo_copy, "--model", "none")
    assert result.exit_code == 1
    assert (
        "✗ [integrity] manifest.json lists 'shard-00000.parquet' 200,000 times; every file is "
        "listed once"
    ) in result.stdout
    assert "not run: structure: the manifest is invalid (see integrity)" in result.stdout
    result = cli("export", packed_demo_copy, "--to", "unpacked", "-o", tmp_path / "exp")
    assert (result.exit_code, result.stderr) == (
        2,
        "error: manifest.json lists 'shard-00000.parquet' 200,000 times; every file is listed "
        "once\n",
    )


@pytest.mark.torch
def test_the_reader_refuses_a_shard_swapped_for_a_link_after_it_opened(packed_demo_copy):
    from packshard.torch import PackedDataset

    out = packed_demo_copy
    ds = PackedDataset(out)  # validated: every shard path inside the folder
    outside = out.parent / "outside.parquet"
    shutil.copyfile(out / "shard-00000.parquet", outside)  # byte-identical
    os.unlink(out / "shard-00000.parquet")
    os.symlink(outside, out / "shard-00000.parquet")
    with pytest.raises(FormatError) as err:
        ds[0]
    assert str(err.value) == (
        f"{out}/shard-00000.parquet: is a link to a place outside the folder (not read) (run "
        "packshard verify)"
    )


def test_a_manifest_of_duplicates_is_refused_by_the_reader_too(packed_demo_copy):
    pytest.importorskip("torch")
    from packshard.torch import PackedDataset

    def repeat(m: dict[str, Any]) -> None:
        m["shards"] = [m["shards"][0]] * 3

    edit_manifest(packed_demo_copy, repeat)
    with pytest.raises(ManifestError, match=r"lists 'shard-00000\.parquet' 3 times"):
        PackedDataset(packed_demo_copy)
    assert json.loads((packed_demo_copy / "manifest.json").read_text())["shards"]
