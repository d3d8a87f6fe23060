"""``export`` reads its input the way ``verify`` does: schema, containment, one-line errors.

A manifest naming a path outside the folder (``..``, absolute, a link leaving it), values of
the wrong type, or shard rows whose boundaries are broken stop the export with one line
(exit 1 or 2); nothing outside the folder is read and nothing is written.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from packshard.digests import sha256_path
from tests.helpers import Canary, changed, tree_state
from tests.hostile.test_out_folders import cli, edit_manifest


def export(out: Path, dest: Path) -> Any:
    return cli("export", out, "--to", "unpacked", "-o", dest)


def one_line_error(result: Any, code: int, start: str) -> None:
    assert result.exit_code == code, result.output
    assert result.stderr.startswith(f"error: {start}"), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize("value", ["../canary.txt", "/etc/passwd", "sub/../../canary.txt"])
def test_a_shard_path_outside_the_folder_is_refused_and_never_read(
    packed_demo_copy, tmp_path, value
):
    out = packed_demo_copy
    canary = Canary(tmp_path / "canary.txt")

    def change(m: dict[str, Any]) -> None:
        m["shards"][0]["path"] = value

    edit_manifest(out, change)
    before = tree_state(tmp_path)
    result = export(out, tmp_path / "exp")
    one_line_error(result, 2, "manifest.json: shards/0/path: ")
    assert not canary.read
    assert changed(before, tree_state(tmp_path)) == []


def test_a_shard_linked_outside_the_folder_is_refused(packed_demo_copy, tmp_path):
    out = packed_demo_copy
    outside = tmp_path / "outside.parquet"
    shutil.copyfile(out / "shard-00000.parquet", outside)  # byte-identical: checksum passes
    (out / "shard-00000.parquet").unlink()
    (out / "shard-00000.parquet").symlink_to(outside)
    result = export(out, tmp_path / "exp")
    one_line_error(
        result, 1, f"{out / 'shard-00000.parquet'}: is a link to a place outside the folder"
    )
    assert not (tmp_path / "exp").exists()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_seq_len", [256]),
        ("shards", {"path": "x"}),
        ("dataset_id", 7),
        ("pad_token_id", "zero"),
    ],
)
def test_type_confused_manifests_are_one_line_errors(packed_demo_copy, tmp_path, key, value):
    out = packed_demo_copy

    def change(m: dict[str, Any]) -> None:
        if key == "max_seq_len":
            m["config"][key] = value
        elif key == "pad_token_id":
            m["tokenizer"][key] = value
        else:
            m[key] = value

    edit_manifest(out, change)
    one_line_error(export(out, tmp_path / "exp"), 2, "manifest.json: ")
    assert not (tmp_path / "exp").exists()


def test_crafted_rows_are_one_line_errors(packed_demo_copy, tmp_path):
    out = packed_demo_copy
    shard = out / "shard-00000.parquet"
    table = pq.read_table(shard)
    cu = table["cu_seqlens"].to_pylist()
    cu[0] = [0, 10**6]  # a segment running past its row
    import pyarrow as pa

    table = table.set_column(
        table.column_names.index("cu_seqlens"),
        "cu_seqlens",
        pa.array(cu, type=table.schema.field("cu_seqlens").type),
    )
    pq.write_table(table, shard)

    def change(m: dict[str, Any]) -> None:
        m["shards"][0]["sha256"] = sha256_path(shard)
        m["shards"][0]["bytes"] = os.path.getsize(shard)

    edit_manifest(out, change)
    one_line_error(export(out, tmp_path / "exp"), 1, f"{shard}: row 0: cu_seqlens")
    assert not (tmp_path / "exp").exists()


def test_a_good_export_still_works(packed_demo_copy, tmp_path):
    result = export(packed_demo_copy, tmp_path / "exp")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "exp" / "export.json").read_text())["target"] == "unpacked"
