"""Reader datasets: random access, manifest checks, distributed/worker split, exact resume."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from packshard.digests import sha256_path  # noqa: E402
from packshard.errors import FormatError, ManifestError, UsageError  # noqa: E402
from packshard.records import IGNORE_INDEX, PackedRow  # noqa: E402
from packshard.torch import (  # noqa: E402
    PackedDataset,
    PackedIterableDataset,
    ResumableLoader,
    collate_varlen,
    epoch_rows,
)
from tests.helpers import (  # noqa: E402
    TOKENIZER_BYTES,
    TOKENIZER_SHA,
    fixture_rows,
    rehash,
    write_out,
)


@pytest.fixture
def out_11(tmp_path: Path) -> tuple[Path, list[PackedRow]]:
    """11 rows over shards of 4, 4 and 3 rows (11 is odd: remainders matter)."""
    rows = fixture_rows(11)
    return write_out(tmp_path / "out", [rows[:4], rows[4:8], rows[8:]]), rows


def test_packed_dataset_reads_rows_back_exactly(out_11):
    out, rows = out_11
    ds = PackedDataset(out)
    assert len(ds) == 11
    assert ds.max_seq_len == 64
    for i in [0, 3, 4, 7, 8, 10, -1]:
        got, want = ds[i], rows[i]
        for name in ("input_ids", "labels", "position_ids", "example_ids"):
            assert got[name].dtype == torch.int64
            assert got[name].tolist() == getattr(want, name).tolist()
        assert got["cu_seqlens"].dtype == torch.int32
        assert got["cu_seqlens"].tolist() == want.cu_seqlens.tolist()
    with pytest.raises(IndexError, match="row 11 out of range for 11 rows"):
        ds[11]
    assert ds.locate(5) == (1, 1)


def test_reset_positions_are_derived_and_cached_shards_read_the_same(tmp_path):
    rows = fixture_rows(9, seed=7)
    out = write_out(tmp_path / "out", [rows[:5], rows[5:]], position_policy="reset")
    stored = PackedDataset(write_out(tmp_path / "stored", [rows[:5], rows[5:]]))
    derived = PackedDataset(out)
    cache = tmp_path / "cache"
    cached = PackedDataset(out, cache_dir=cache)
    assert derived.derive_positions and not stored.derive_positions
    for i in range(9):
        want = stored[i]
        for ds in (derived, cached):
            got = ds[i]
            assert set(got) == set(want)
            for name in want:
                assert got[name].dtype == want[name].dtype
                assert torch.equal(got[name], want[name]), name
    shas = [s["sha256"] for s in derived.manifest["shards"]]
    named = sorted(p.name for p in cache.glob("*.arrow"))
    assert sorted(p.name for p in cache.glob("*.arrow.checked")) == [f"{n}.checked" for n in named]
    assert sorted(p.name for p in cache.glob("*.shard.checked")) == [
        f"{s}.shard.checked" for s in sorted(shas)
    ]
    assert [n[:64] for n in named] == sorted(shas)  # the shard's SHA-256, then the entry's own
    assert all(n == f"{n[:64]}-derived-positions-{sha256_path(cache / n)}.arrow" for n in named)
    reopened = PackedDataset(out, cache_dir=cache)  # served from the memory-mapped copy
    assert torch.equal(reopened[8]["input_ids"], stored[8]["input_ids"])
    (out / "shard-00001.parquet").write_bytes(b"not parquet any more")  # the cache is no excuse
    with pytest.raises(FormatError, match=r"shard-00001\.parquet: unreadable Parquet"):
        PackedDataset(out, cache_dir=cache)


def test_rows_are_writable_copies(out_11):
    out, rows = out_11
    ds = PackedDataset(out)
    row = ds[0]
    row["input_ids"][0] = -7  # must not touch the decoded shard
    assert ds[0]["input_ids"][0].item() == int(rows[0].input_ids[0])


def test_unknown_format_version_is_refused(tmp_path):
    out = write_out(tmp_path / "v2", [fixture_rows(2)], version=2)
    with pytest.raises(ManifestError) as err:
        PackedDataset(out)
    assert str(err.value) == (
        f"{out / 'manifest.json'}: format_version 2 is not supported by this packshard "
        "(supports 1); upgrade packshard or re-pack the data"
    )


def test_missing_manifest_is_refused(tmp_path):
    with pytest.raises(ManifestError, match="no manifest"):
        PackedDataset(tmp_path)


def test_shard_with_wrong_row_count_is_refused(out_11):
    out, _ = out_11
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][1]["rows"] = 5
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError) as err:  # the footer is read before any row is sized
        PackedDataset(out)
    assert str(err.value) == (
        f"{out / 'shard-00001.parquet'}: 4 rows, but the manifest says 5 "
        "(the folder is incomplete or was modified: run packshard verify)"
    )


@pytest.mark.parametrize(
    ("meta", "problem"),
    [
        (
            {b"packshard.format_version": b"1", b"packshard.dataset_id": b"other"},
            "packshard.dataset_id other differs from the manifest's f0f0f0f0f0f0f0f0 (the file "
            "belongs to another pack, or the folder was replaced while it was open) (run "
            "packshard verify)",
        ),
        (None, "no packshard.format_version in its Parquet metadata (run packshard verify)"),
    ],
    ids=["another-pack", "no-metadata"],
)
def test_shard_of_another_pack_is_refused(out_11, meta, problem):
    out, _ = out_11
    path = out / "shard-00001.parquet"
    pq.write_table(pq.read_table(path).replace_schema_metadata(meta), path)
    rehash(out, path.name)  # the checksum holds: the metadata check is what refuses it
    ds = PackedDataset(out)
    ds[0]  # shard 0 is this pack's
    with pytest.raises(FormatError) as err:
        ds[4]
    assert (err.value.path, err.value.problem) == (str(path), problem)
    with pytest.raises(FormatError, match="run packshard verify"):
        list(PackedIterableDataset(out))


def test_tokenizer_mismatch_names_both_hashes(out_11, tmp_path):
    out, _ = out_11
    other = tmp_path / "tok"
    other.mkdir()
    (other / "tokenizer.json").write_bytes(b'{"model": "another"}')
    other_sha = hashlib.sha256(b'{"model": "another"}').hexdigest()
    with pytest.raises(ManifestError) as err:
        PackedDataset(out, tokenizer=other)
    assert str(err.value) == (
        f"{out / 'manifest.json'}: shards were packed with tokenizer sha256 {TOKENIZER_SHA}, "
        f"but {other} has sha256 {other_sha} (train with the tokenizer the data was packed "
        "with, or pack again with this one)"
    )
    with pytest.raises(ManifestError, match=f"but expected_tokenizer_sha256 has sha256 {'0' * 64}"):
        PackedIterableDataset(out, expected_tokenizer_sha256="0" * 64)
    (other / "tokenizer.json").write_bytes(TOKENIZER_BYTES)
    assert len(PackedDataset(out, tokenizer=other / "tokenizer.json")) == 11
    assert len(PackedDataset(out, expected_tokenizer_sha256=TOKENIZER_SHA.upper())) == 11


def test_import_packshard_does_not_import_torch():
    code = "import sys, packshard; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_epoch_rows_remainder_rules():
    dropped = epoch_rows(11, seed=3, epoch=0, shuffle=True, world_size=2, drop_remainder=True)
    assert dropped.shape == (2, 5)
    assert len(set(dropped.ravel().tolist())) == 10
    padded = epoch_rows(11, seed=3, epoch=0, shuffle=True, world_size=2, drop_remainder=False)
    assert padded.shape == (2, 6)
    flat = padded.T.ravel()  # the epoch's global order
    assert sorted(flat[:11].tolist()) == list(range(11))
    assert flat[11] == flat[0]  # the one padding row repeats the permutation's first row
    plain = epoch_rows(5, seed=0, epoch=0, shuffle=False, world_size=2, drop_remainder=True)
    assert plain.tolist() == [[0, 2], [1, 3]]


def read_epoch(ds: PackedIterableDataset, num_workers: int, batch_size: int = 2) -> list[int]:
    loader = ResumableLoader(
        ds, batch_size=batch_size, collate_fn=collate_varlen, num_workers=num_workers
    )
    ids = []
    for batch in loader:
        ids.extend(e for e in batch["example_ids"].tolist() if e >= 0)
    return ids


def row_of_example(rows: list[PackedRow]) -> dict[int, int]:
    return {int(e): i for i, r in enumerate(rows) for e in r.example_ids}


@pytest.mark.parametrize("drop_remainder", [True, False])
def test_two_ranks_two_workers_read_each_row_once_per_epoch(out_11, drop_remainder):
    out, rows = out_11
    owner = row_of_example(rows)
    epochs = []
    for epoch in range(2):
        per_rank = []
        for rank in range(2):
            ds = PackedIterableDataset(
                out, seed=5, rank=rank, world_size=2, drop_remainder=drop_remainder
            )
            ds.set_epoch(epoch)
            ids = read_epoch(ds, num_workers=2)
            per_rank.append(list(dict.fromkeys(owner[e] for e in ids)))
            assert per_rank[-1] == ds.rank_rows(epoch).tolist()  # strictly in order
        assert len(per_rank[0]) == len(per_rank[1]) == (5 if drop_remainder else 6)
        seen = per_rank[0] + per_rank[1]
        if drop_remainder:
            assert len(set(seen)) == 10  # each row once, one row (11 % 2) dropped
        else:
            assert set(seen) == set(range(11))  # every row, one repeated
            assert len(seen) == 12
        epochs.append(seen)
    assert epochs[0] != epochs[1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_after_k_batches_matches_uninterrupted_run(tmp_path, num_workers):
    rows = fixture_rows(23, seed=4)
    out = write_out(tmp_path / "out23", [rows[:10], rows[10:20], rows[20:]])

    def make() -> PackedIterableDataset:
        return PackedIterableDataset(out, seed=1, rank=1, world_size=2)

    full_ds = make()
    uninterrupted = []
    for epoch in range(2):
        full_ds.set_epoch(epoch)
        uninterrupted.append(read_epoch(full_ds, num_workers))

    ds = make()
    loader = ResumableLoader(ds, batch_size=2, collate_fn=collate_varlen, num_workers=num_workers)
    first = []
    for k, batch in enumerate(loader):
        first.extend(e for e in batch["example_ids"].tolist() if e >= 0)
        if k == 1:
            break
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["consumed"] == 4  # of 11 rows on this rank

    resumed_ds = make()
    resumed_ds.load_state_dict(json.loads(json.dumps(state)))
    resumed = first + read_epoch(resumed_ds, num_workers)
    assert resumed == uninterrupted[0]
    resumed_ds.set_epoch(1)
    assert read_epoch(resumed_ds, num_workers) == uninterrupted[1]


def test_finished_epoch_moves_on_without_set_epoch(out_11):
    out, _ = out_11
    ds = PackedIterableDataset(out, seed=2, world_size=1, rank=0)
    first = [r["example_ids"][0].item() for r in ds]
    assert ds.state_dict()["consumed"] == 11
    second = [r["example_ids"][0].item() for r in ds]
    assert ds.epoch == 1
    assert sorted(first) == sorted(second) and first != second


def test_resume_with_other_settings_is_refused(out_11):
    out, _ = out_11
    state = PackedIterableDataset(out, seed=1, rank=0, world_size=2).state_dict()
    other = PackedIterableDataset(out, seed=1, rank=0, world_size=3)
    with pytest.raises(UsageError) as err:
        other.load_state_dict(state)
    assert str(err.value) == (
        "cannot resume: the saved state has world_size=2 but this dataset has world_size=3 "
        "(resume with the same data and settings)"
    )


def test_too_few_rows_for_the_ranks_is_refused(tmp_path):
    out = write_out(tmp_path / "small", [fixture_rows(2)])
    with pytest.raises(UsageError, match="2 rows for 3 ranks leaves every rank empty"):
        PackedIterableDataset(out, rank=0, world_size=3)
    assert len(PackedIterableDataset(out, rank=2, world_size=3, drop_remainder=False)) == 1


@pytest.fixture(scope="module")
def real_pack(tmp_path_factory) -> tuple[Path, Path]:
    """A real ``pack`` output: the embedded demo chats, a throwaway BPE, 4 rows per shard."""
    from packshard.demo import build_demo_tokenizer, demo_data_path
    from packshard.pack.pipeline import PackConfig, pack_dataset

    root = tmp_path_factory.mktemp("real")
    tok = build_demo_tokenizer(root / "tok")
    config = PackConfig.build(
        inputs=(str(demo_data_path()),),
        tokenizer=str(tok),
        out=str(root / "out"),
        max_seq_len=256,
        template="chatml",
        shard_rows=4,
    )
    pack_dataset(config)
    return root / "out", tok


def test_reads_a_real_pack_output_back_consistently(real_pack):
    out, tok = real_pack
    ds = PackedDataset(out, tokenizer=tok)
    manifest = ds.manifest
    assert ds.derive_positions
    assert len(ds) == manifest["stats"]["rows"] and len(manifest["shards"]) > 1
    index = pq.read_table(out / "examples.parquet").to_pylist()
    by_id = {e["example_id"]: e for e in index}
    seen, tokens = [], 0
    for i in range(len(ds)):
        r = ds[i]
        cu = r["cu_seqlens"].tolist()
        tokens += cu[-1]
        assert cu[-1] == r["input_ids"].shape[0] <= ds.max_seq_len
        for j, eid in enumerate(r["example_ids"].tolist()):
            lo, hi = cu[j], cu[j + 1]
            entry = by_id[eid]
            assert ds.locate(i) == (entry["shard"], entry["row"])
            assert hi - lo == entry["num_tokens"]
            labels = r["labels"][lo:hi]
            assert labels[0].item() == IGNORE_INDEX
            assert int((labels != IGNORE_INDEX).sum()) == entry["num_loss_tokens"]
            kept = labels != IGNORE_INDEX
            assert torch.equal(labels[kept], r["input_ids"][lo:hi][kept])
            assert r["position_ids"][lo:hi].tolist() == list(range(hi - lo))
            seen.append(eid)
        k, j = ds.locate(i)
        stored = pq.read_table(ds.shard_paths[k], columns=["position_ids"])["position_ids"][j]
        assert r["position_ids"].tolist() == stored.as_py()  # derived under policy "reset"
    assert sorted(seen) == sorted(by_id)
    assert tokens == manifest["stats"]["tokens"]
    batch = collate_varlen([ds[i] for i in range(len(ds))], pad_to_multiple_of=64)
    assert batch["num_loss_tokens"] == manifest["stats"]["loss_tokens"]
    streamed = []
    for rank in range(2):
        it = PackedIterableDataset(out, rank=rank, world_size=2, drop_remainder=False)
        streamed += [int(r["example_ids"][0]) for r in it]
    first_ids = {int(ds[i]["example_ids"][0]) for i in range(len(ds))}
    assert set(streamed) == first_ids


def test_an_aligned_pack_is_served_padded(tmp_path, packed_demo_tokenizer):
    import numpy as np

    from packshard.torch import PackedDataset
    from tests.helpers import pack_demo_into

    out = pack_demo_into(tmp_path, packed_demo_tokenizer, cp=2)
    padded, plain = PackedDataset(out), PackedDataset(out, padded=False)
    for i in range(len(padded)):
        row, real = padded[i], plain[i]
        cu, unpadded = row["cu_seqlens"].numpy(), row["cu_seqlens_unpadded"].numpy()
        assert (np.diff(cu) % 4 == 0).all() and cu.tolist() == real["cu_seqlens_padded"].tolist()
        assert unpadded.tolist() == real["cu_seqlens"].tolist()
        for j in range(len(cu) - 1):
            n = int(unpadded[j + 1] - unpadded[j])
            s, e, r = int(cu[j]), int(cu[j + 1]), int(unpadded[j])
            assert row["input_ids"][s : s + n].tolist() == real["input_ids"][r : r + n].tolist()
            assert row["labels"][s : s + n].tolist() == real["labels"][r : r + n].tolist()
            assert (row["labels"][s + n : e] == -100).all()  # pads never trained
            assert row["position_ids"][s:e].tolist() == list(range(e - s))
    with pytest.raises(UsageError, match="padded=True, but the pack records no alignment"):
        PackedDataset(pack_demo_into(tmp_path / "plain", packed_demo_tokenizer), padded=True)
