"""The torch reader and ``export`` serve only what they checked: what they serve trains a model.

A shard replaced after the dataset was opened (renamed over, or rewritten in place with the
same dataset id), a shard tampered with before a fresh open (with or without ``cache_dir``),
a valid Arrow file written over a cache entry, a re-hashed shard holding a token id outside
the vocabulary, a manifest whose ``tokenizer`` is null: each is refused by name with the fix,
never served, never a raw traceback.
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

torch = pytest.importorskip("torch")

from packshard.errors import FormatError, ManifestError  # noqa: E402
from packshard.torch import PackedDataset, PackedIterableDataset  # noqa: E402
from tests.hostile.test_crafted_folders import rewrite_column  # noqa: E402
from tests.hostile.test_out_folders import cli  # noqa: E402

SHARD = "shard-00001.parquet"


def changed_sha(out: Path) -> str:
    return (
        f"SHA-256 differs from the manifest: the shard was replaced or modified after it was "
        f"packed (run packshard verify {out}, and pack again)"
    )


def same_id_rewrite(out: Path, name: str = SHARD) -> None:
    """Rewrite a shard in place with other tokens, keeping its dataset id and its size class."""
    path = out / name
    table = pq.read_table(path)
    ids = table["input_ids"].to_pylist()
    ids[0] = [(t + 1) % 1000 for t in ids[0]]
    at = table.column_names.index("input_ids")
    table = table.set_column(at, "input_ids", pa.array(ids, type=table.schema.field(at).type))
    pq.write_table(table, path)  # same metadata, same dataset id: only the hash tells


def test_a_shard_rewritten_in_place_after_opening_is_refused(packed_demo_copy):
    ds = PackedDataset(packed_demo_copy)
    ds[0]  # shard 0 is served
    same_id_rewrite(packed_demo_copy)
    with pytest.raises(FormatError) as err:
        ds[ds.starts[1]]
    assert (err.value.path, err.value.problem) == (
        str(packed_demo_copy / SHARD),
        changed_sha(packed_demo_copy),
    )


def test_a_shard_renamed_over_after_opening_is_refused(packed_demo_copy, tmp_path):
    ds = PackedDataset(packed_demo_copy)
    other = tmp_path / "other.parquet"
    shutil.copy(packed_demo_copy / "shard-00002.parquet", other)
    os.replace(other, packed_demo_copy / SHARD)  # another shard of the same pack, same id
    with pytest.raises(FormatError, match="SHA-256 differs from the manifest"):
        ds[ds.starts[1]]


@pytest.mark.parametrize("cached", [False, True])
def test_a_fresh_open_of_a_tampered_shard_is_refused(packed_demo_copy, tmp_path, cached):
    same_id_rewrite(packed_demo_copy)
    cache = tmp_path / "cache" if cached else None
    ds = PackedDataset(packed_demo_copy, cache_dir=cache)
    with pytest.raises(FormatError) as err:
        ds[ds.starts[1]]
    assert err.value.path == str(packed_demo_copy / SHARD)
    with pytest.raises(FormatError, match="SHA-256 differs from the manifest"):
        list(PackedIterableDataset(packed_demo_copy, cache_dir=cache))


def test_an_arrow_file_written_over_a_cache_entry_is_refused(packed_demo_copy, tmp_path):
    cache = tmp_path / "cache"
    first = PackedDataset(packed_demo_copy, cache_dir=cache)
    want = first[0]["input_ids"]
    (entry,) = [p for p in cache.glob("*.arrow") if p.name.startswith(first.shard_sha256[0])]
    del first  # its memory map of the entry goes: the entry is truncated below
    table = pa.ipc.open_file(pa.py_buffer(entry.read_bytes())).read_all()
    ids = table["input_ids"].to_pylist()
    ids[0] = [7] * len(ids[0])  # a valid Arrow file, the same schema, other tokens
    forged = table.set_column(0, "input_ids", pa.array(ids, type=table.schema.field(0).type))
    with pa.OSFile(str(entry), "wb") as sink, pa.ipc.new_file(sink, forged.schema) as writer:
        writer.write_table(forged)
    with pytest.raises(FormatError) as err:
        PackedDataset(packed_demo_copy, cache_dir=cache)[0]
    assert (err.value.path, err.value.problem) == (
        str(entry),
        "SHA-256 differs from the one this cache entry was written with: it was modified "
        "(delete it: it is rebuilt from the shard)",
    )
    entry.unlink()  # the fix the message names
    assert torch.equal(PackedDataset(packed_demo_copy, cache_dir=cache)[0]["input_ids"], want)


def test_a_checked_cache_entry_is_mapped_without_a_second_hash(packed_demo_copy, tmp_path):
    cache = tmp_path / "cache"
    PackedDataset(packed_demo_copy, cache_dir=cache)[0]
    (record,) = cache.glob("*.arrow.checked")
    stamp = record.read_text()
    PackedDataset(packed_demo_copy, cache_dir=cache)[0]
    assert record.read_text() == stamp  # the entry's status is unchanged: no new record


@pytest.mark.parametrize("bad", [-5, 1 << 20])
def test_a_rehashed_shard_with_an_id_outside_the_vocabulary_is_refused(packed_demo_copy, bad):
    def poke(values: list) -> None:
        values[1][3] = bad

    shard = rewrite_column(packed_demo_copy, "input_ids", poke)  # checksum re-recorded
    with pytest.raises(FormatError) as err:
        PackedDataset(packed_demo_copy)[1]
    assert (err.value.path, err.value.problem) == (
        str(shard),
        f"row 1: token id {bad} outside the vocabulary [0, 1024) (run packshard verify)",
    )


def test_a_rehashed_label_that_is_not_its_token_is_refused(packed_demo_copy):
    def poke(values: list) -> None:
        at = next(i for i, v in enumerate(values[0]) if v != -100)
        values[0][at] = (values[0][at] + 1) % 1000

    rewrite_column(packed_demo_copy, "labels", poke)
    with pytest.raises(FormatError, match=r"row 0: label \d+ is neither -100 nor its token"):
        PackedDataset(packed_demo_copy)[0]


def test_a_null_tokenizer_entry_is_one_manifest_error(packed_demo_copy):
    manifest = json.loads((packed_demo_copy / "manifest.json").read_text())
    manifest["tokenizer"] = None
    (packed_demo_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError) as err:
        PackedDataset(packed_demo_copy)
    assert str(err.value) == (
        f"{packed_demo_copy / 'manifest.json'}: manifest.json: tokenizer: None is not of type "
        "'object' (run packshard verify)"
    )


# --- export: the same rules --------------------------------------------------------------------


def test_export_refuses_an_id_outside_the_vocabulary(packed_demo_copy, tmp_path):
    def poke(values: list) -> None:
        values[0][3] = -5

    shard = rewrite_column(packed_demo_copy, "input_ids", poke)
    for target in ("megatron", "unpacked", "mds", "torchtune"):
        result = cli("export", packed_demo_copy, "--to", target, "-o", tmp_path / target)
        assert (result.exit_code, result.stderr) == (
            1,
            f"error: {shard}: row 0: token id -5 outside the vocabulary [0, 1024) (run "
            "packshard verify)\n",
        ), target
        assert not (tmp_path / target).exists()


def test_export_refuses_a_null_tokenizer_entry(packed_demo_copy, tmp_path):
    manifest: dict[str, Any] = json.loads((packed_demo_copy / "manifest.json").read_text())
    manifest["tokenizer"] = None
    (packed_demo_copy / "manifest.json").write_text(json.dumps(manifest))
    result = cli("export", packed_demo_copy, "--to", "unpacked", "-o", tmp_path / "x")
    assert result.exit_code == 2  # a manifest error, as any other
    assert result.stderr.startswith("error: manifest.json: tokenizer: None is not of type")


def test_a_checked_shard_is_not_read_again_while_its_status_holds(packed_demo_copy, tmp_path):
    cache = tmp_path / "cache"
    first = PackedDataset(packed_demo_copy, cache_dir=cache)
    want = first[0]["input_ids"]
    (seen,) = cache.glob(f"{first.shard_sha256[0]}.shard.checked")
    del first
    shard = packed_demo_copy / "shard-00000.parquet"
    blob = shard.read_bytes()
    middle = len(blob) // 2
    shard.write_bytes(blob[:middle] + bytes([blob[middle] ^ 1]) + blob[middle + 1 :])  # in place
    with pytest.raises(FormatError, match="SHA-256 differs from the manifest"):
        PackedDataset(packed_demo_copy, cache_dir=cache)[0]  # the stamp no longer holds
    shard.write_bytes(blob)
    assert torch.equal(PackedDataset(packed_demo_copy, cache_dir=cache)[0]["input_ids"], want)
    assert seen.read_text().split()[1] == str(shard.stat().st_ino)
