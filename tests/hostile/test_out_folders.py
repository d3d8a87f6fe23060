"""Hostile OUT folders: verify, inspect and the reader read nothing outside OUT, never hang,
and never call a folder OK that they did not check.

Each folder is a copy of a good pack with one thing made hostile: a manifest path leaving the
folder (absolute, ``..``, a link), a FIFO or device where a file should be, values of the wrong
type or size, a cache key that is not the shard's, shards replaced under an open reader.  A
canary file outside OUT shows by its atime that it was never read.  The last part is
``verify``'s promise: inputs are found from any working directory, a shifted token id is
caught there, and a stage that could not run is never reported as passed.
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
from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.digests import sha256_path
from packshard.errors import FormatError, ManifestError
from tests.helpers import Canary, changed, run_capped, tree_state


def cli(*args: Any, cwd: Path | None = None) -> Any:
    here = os.getcwd()
    os.chdir(cwd or here)
    try:
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    finally:
        os.chdir(here)


def edit_manifest(out: Path, change: Any) -> None:
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def verify(out: Path, *extra: Any, cwd: Path | None = None) -> Any:
    return cli("verify", out, "--model", "none", *extra, cwd=cwd)


@pytest.fixture
def hostile(packed_demo_copy: Path, tmp_path: Path) -> tuple[Path, Canary]:
    """A copy of the demo pack and a canary beside it (nothing may read it)."""
    return packed_demo_copy, Canary(tmp_path / "canary.txt")


# --- paths that leave the folder ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("shard", "{canary}", "does not match"),
        ("shard", "../canary.txt", "should not be valid under"),
        ("rejects", "{canary}", "does not match"),
        ("examples", "sub/../../canary.txt", "should not be valid under"),
    ],
)
def test_manifest_paths_outside_the_folder_are_findings_and_never_read(
    hostile, key, value, problem
):
    out, canary = hostile
    value = value.format(canary=canary.path)

    def change(m: dict[str, Any]) -> None:
        (m["shards"][0] if key == "shard" else m["files"][key])["path"] = value

    edit_manifest(out, change)
    before = tree_state(out.parent)
    result = verify(out)
    assert result.exit_code == 1
    where = "shards/0" if key == "shard" else f"files/{key}"
    assert f"✗ [integrity] manifest.json: {where}/path: '{value}' {problem}" in result.stdout
    assert "not run: structure: the manifest is invalid (see integrity)" in result.stdout
    assert "OK" not in result.stdout
    assert not canary.read
    assert changed(before, tree_state(out.parent)) == []


@pytest.mark.parametrize("name", ["shard-00000.parquet", "rejects.jsonl", "examples.parquet"])
def test_a_link_leaving_the_folder_is_a_finding_and_never_read(hostile, name):
    out, _ = hostile
    outside = out.parent / f"outside-{name}"
    shutil.copyfile(out / name, outside)  # byte-identical: its checksum would pass
    canary = Canary(outside, outside.read_text(errors="replace"))
    shutil.copyfile(out / name, outside)
    os.utime(outside, (0, outside.stat().st_mtime))
    (out / name).unlink()
    (out / name).symlink_to(outside)
    result = verify(out, "--no-source")
    assert result.exit_code == 1
    key = "shards/0" if name.startswith("shard") else f"files/{name.split('.')[0]}"
    assert f"✗ [integrity] {key}: {name}: is a link to a place outside the folder (not read)" in (
        result.stdout
    )
    assert not canary.read


def test_a_fifo_or_device_in_place_of_a_file_does_not_block(packed_demo_copy, tmp_path):
    out = packed_demo_copy
    (out / "shard-00001.parquet").unlink()
    os.mkfifo(out / "shard-00001.parquet")
    (out / "rejects.jsonl").unlink()
    (out / "rejects.jsonl").symlink_to("/dev/zero")
    edit_manifest(out, lambda m: m["inputs"][0].update(path="/dev/zero", resolved="/dev/zero"))
    done = run_capped(["verify", out, "--model", "none"], tmp_path, seconds=120)
    assert done.returncode == 1, done.stderr
    for line in (
        "✗ [integrity] shards/1: shard-00001.parquet: is not a regular file (not read)",
        "✗ [integrity] files/rejects: rejects.jsonl: is a link to a place outside the folder "
        "(not read)",
        "✗ [source] input /dev/zero is not a regular file (not read)",
    ):
        assert line in done.stdout


def test_a_manifest_that_is_a_link_or_too_deep_is_refused(packed_demo_copy, tmp_path):
    out = packed_demo_copy
    canary = Canary(tmp_path / "elsewhere.json", (out / "manifest.json").read_text())
    (out / "manifest.json").unlink()
    (out / "manifest.json").symlink_to(canary.path)
    for command in ("verify", "inspect"):
        result = cli(command, out)
        assert (result.exit_code, result.stderr) == (
            2,
            f"error: {out}/manifest.json: is a link to a place outside the folder\n",
        )
    assert not canary.read
    (out / "manifest.json").unlink()
    for text, why in (
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"format_version": NaN}', "NaN is not a JSON number"),
        ("\xff", "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
    ):
        (out / "manifest.json").write_text(text, encoding="utf-8" if text != "\xff" else "latin-1")
        result = cli("verify", out)
        assert (result.exit_code, result.stderr) == (
            2,
            f"error: {out}/manifest.json: unreadable manifest: {why}\n",
        ), text[:20]


# --- values of the wrong type or size ----------------------------------------------------------


def test_wrong_typed_manifest_values_are_findings_not_crashes(packed_demo_copy):
    out = packed_demo_copy

    def change(m: dict[str, Any]) -> None:
        m["shards"][0]["rows"] = "many"
        m["config"]["max_seq_len"] = [256]
        m["stats"]["domains"]["chat"]["tokens"] = "lots"

    edit_manifest(out, change)
    result = verify(out)
    assert result.exit_code == 1
    for line in (
        "✗ [integrity] manifest.json: config/max_seq_len: [256] is not of type 'integer'",
        "✗ [integrity] manifest.json: shards/0/rows: 'many' is not of type 'integer'",
        "✗ [integrity] manifest.json: stats/domains/chat/tokens: 'lots' is not of type 'integer'",
    ):
        assert line in result.stdout
    result = cli("inspect", out)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: manifest.json: config/max_seq_len: [256] is not of")
    assert result.stderr.count("\n") == 1


@pytest.mark.torch
def test_the_reader_checks_values_before_sizing_anything(packed_demo_copy, tmp_path):
    from packshard.torch import PackedDataset, PackedIterableDataset

    out = packed_demo_copy
    edit_manifest(out, lambda m: m["shards"][0].update(rows=10**12))
    with pytest.raises(ManifestError) as info:  # refused before a 10**12-row permutation
        PackedIterableDataset(out)
    assert str(info.value) == (
        f"{out}/shard-00000.parquet: 4 rows, but the manifest says {10**12} (the folder is "
        "incomplete or was modified: run packshard verify)"
    )
    edit_manifest(out, lambda m: m["shards"][0].update(rows=4, path="/etc/hostname"))
    with pytest.raises(ManifestError, match=r"shards/0/path: '/etc/hostname' does not match"):
        PackedDataset(out)
    outside = tmp_path / "copy.parquet"
    shutil.copyfile(out / "shard-00000.parquet", outside)
    (out / "shard-00000.parquet").unlink()
    (out / "shard-00000.parquet").symlink_to(outside)
    edit_manifest(out, lambda m: m["shards"][0].update(path="shard-00000.parquet"))
    with pytest.raises(FormatError) as info:
        PackedDataset(out)
    assert str(info.value) == (
        "shard-00000.parquet: is a link to a place outside the folder (not read)"
    )


@pytest.mark.torch
def test_a_hostile_folder_cannot_poison_a_shared_cache(packed_demo, packed_demo_copy, tmp_path):
    import torch

    from packshard.torch import PackedDataset

    hostile, cache = packed_demo_copy, tmp_path / "cache"
    # the hostile folder claims the legitimate shard's hash but holds other tokens
    shutil.copyfile(hostile / "shard-00001.parquet", hostile / "shard-00000.parquet")
    with pytest.raises(FormatError) as info:
        PackedDataset(hostile, cache_dir=cache)[0]
    assert str(info.value) == (
        f"{hostile}/shard-00000.parquet: SHA-256 differs from the manifest: the shard was "
        f"replaced or modified after it was packed (run packshard verify {hostile}, and pack again)"
    )
    assert not cache.exists() or not any(cache.iterdir())
    legit, plain = PackedDataset(packed_demo, cache_dir=cache), PackedDataset(packed_demo)
    assert torch.equal(legit[0]["input_ids"], plain[0]["input_ids"])
    sha = sha256_path(packed_demo / "shard-00000.parquet")
    (entry,) = cache.glob("*.arrow")
    assert entry.name == f"{sha}-derived-positions-{sha256_path(entry)}.arrow"
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [entry.name, f"{entry.name}.checked", f"{sha}.shard.checked"]
    )
    edit_manifest(hostile, lambda m: m["shards"][0].update(sha256="../../escape"))
    with pytest.raises(ManifestError, match=r"shards/0/sha256: '\.\./\.\./escape' does not match"):
        PackedDataset(hostile, cache_dir=cache)


@pytest.mark.torch
def test_a_reader_refuses_shards_replaced_under_it(tmp_path, word_tokenizer):
    from packshard.pack import PackConfig, pack_dataset
    from packshard.torch import PackedDataset

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": f"w{i} w{i + 1}"}) + "\n" for i in range(2, 40)))

    def pack(seed: int) -> str:
        config = PackConfig.build(
            inputs=(str(data),),
            tokenizer=str(word_tokenizer),
            max_seq_len=8,
            out=str(tmp_path / "out"),
            overwrite=True,
            seed=seed,
        )
        return pack_dataset(config).manifest["dataset_id"]

    old = pack(0)
    ds = PackedDataset(tmp_path / "out")  # open, nothing decoded yet
    new = pack(1)  # --overwrite replaces the folder under the reader
    with pytest.raises(FormatError) as info:
        ds[0]
    assert new != old
    assert str(info.value) == (
        f"{tmp_path}/out/shard-00000.parquet: SHA-256 differs from the manifest: the shard was "
        f"replaced or modified after it was packed (run packshard verify {tmp_path / 'out'}, and "
        "pack again)"
    )


# --- verify never says OK about what it did not check ------------------------------------------


def shift_token_ids(out: Path, vocab: int) -> None:
    """Shift every token id by one (labels follow), and fix the checksums: only the ids lie."""
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["shards"]:
        path = out / entry["path"]
        table = pq.read_table(path)
        ids = table["input_ids"].combine_chunks()
        labels = table["labels"].combine_chunks()
        flat = (ids.values.to_numpy() + 1) % vocab
        lab = labels.values.to_numpy().copy()
        lab[lab != -100] = flat[lab != -100]
        new = {
            "input_ids": pa.ListArray.from_arrays(ids.offsets, pa.array(flat, pa.int32())),
            "labels": pa.ListArray.from_arrays(labels.offsets, pa.array(lab, pa.int32())),
        }
        for name, column in new.items():
            at = table.schema.get_field_index(name)
            table = table.set_column(at, table.schema.field(name), column)
        pq.write_table(table, path, use_dictionary=False, compression="zstd")
        entry.update(sha256=sha256_path(path), bytes=path.stat().st_size)
    (out / "manifest.json").write_text(json.dumps(manifest))


def test_verify_finds_the_inputs_from_anywhere_and_catches_shifted_ids(tmp_path, word_tokenizer):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    lines = [json.dumps({"text": " ".join(f"w{i + k}" for k in range(5))}) for i in range(2, 60)]
    (project / "data.jsonl").write_text("\n".join(lines) + "\n")
    args = ["pack", "data.jsonl", "-t", word_tokenizer, "--max-seq-len", "24", "-o", "out"]
    assert cli(*args, cwd=project).exit_code == 0  # the input is recorded as "data.jsonl"
    out = project / "out"
    result = verify(out, cwd=elsewhere)
    assert result.exit_code == 0, result.stdout
    assert "source    │ passed  │ 58 examples re-tokenized and compared" in result.stdout
    assert result.stdout.rstrip().endswith("OK: every seam holds")
    shift_token_ids(out, vocab=500)
    result = verify(out, cwd=elsewhere)
    assert result.exit_code == 1
    assert "token ids differ from the source example re-tokenized" in result.stdout
    assert "OK: every seam holds" not in result.stdout
    moved = tmp_path / "moved"
    (project / "data.jsonl").rename(tmp_path / "data.jsonl")
    moved.mkdir()
    (tmp_path / "data.jsonl").rename(moved / "data.jsonl")
    result = verify(out, cwd=elsewhere)
    assert result.exit_code == 2
    assert "not run: source: input data.jsonl not found (give --source-root)" in result.stdout
    assert result.stdout.rstrip().endswith("NOT VERIFIED: 1 check did not run (see above)")
    result = verify(out, "--source-root", moved, cwd=elsewhere)
    assert result.exit_code == 1  # found again, and the shift is caught again
    assert "token ids differ from the source example re-tokenized" in result.stdout
    result = verify(out, "--no-source", cwd=elsewhere)  # opting out is said, not passed
    assert "source    │ skipped │ --no-source" in result.stdout


def empty_cu_seqlens(out: Path) -> None:
    path = out / "shard-00000.parquet"
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[0]["cu_seqlens"] = []
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path, use_dictionary=False)
    edit_manifest(
        out, lambda m: m["shards"][0].update(sha256=sha256_path(path), bytes=path.stat().st_size)
    )


@pytest.mark.torch
def test_broken_rows_are_findings_and_the_model_stage_skips_only_them(packed_demo_copy):
    empty_cu_seqlens(packed_demo_copy)
    result = cli("verify", packed_demo_copy, "--no-source", "--model-rows", "2")
    assert result.exit_code == 1
    assert "✗ [structure] shard-00000.parquet row 0: cu_seqlens must start at 0 and end at" in (
        result.stdout
    )
    assert "model     │ passed" in result.stdout
    result = cli("inspect", packed_demo_copy, "--row", "0")
    assert (result.exit_code, result.stderr) == (
        1,
        f"error: {packed_demo_copy}/shard-00000.parquet: row 0: cu_seqlens or example_ids "
        "break the row (run packshard verify)\n",
    )
    assert cli("inspect", packed_demo_copy, "--row", "1").exit_code == 0
