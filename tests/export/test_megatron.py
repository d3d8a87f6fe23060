"""``--to megatron``, read back by the rules of released Megatron-Bridge's Parquet reader.

Megatron-Bridge needs Python 3.12 and CUDA libraries to install, so its reading is
reimplemented here from ``GPTSFTPackedParquetDataset`` (``megatron.bridge.data.packing.parquet``
in 0.6.x; ``megatron.bridge.data.datasets.packed_parquet`` in 0.4.x-0.5.x): a spec ending
``.idx.parquet`` names one file; every file must hold ``input_ids``, ``seq_start_id`` and
``loss_mask``; a row is found by row group from the file's metadata and read with
``read_row_group(columns=…)``; ``seq_boundaries = seq_start_id + [len(input_ids)]`` (list
concatenation).  Its ``validate_row`` invariants hold for every row.  The collator (shared with
the ``.npy`` reader) slices segment ``[s, e)`` into inputs ``input_ids[s:e-1]``, targets
``input_ids[s+1:e]`` and loss ``loss_mask[s:e-1]`` (answer-only loss), then zeroes the loss where
the input token is EOS; run-time segments are ``e - s - 1`` long.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packshard.export import export_dataset
from packshard.records import IGNORE_INDEX
from tests.helpers import fixture_rows, trained_pairs, write_out

REQUIRED_COLUMNS = {"input_ids", "seq_start_id", "loss_mask"}


def bridge_items(path: Path) -> list[dict]:
    """Every ``__getitem__`` of the released Parquet dataset over ``path``, in index order."""
    assert str(path).lower().endswith(".idx.parquet")  # is_packed_parquet_file
    metadata, schema = pq.read_metadata(path), pq.read_schema(path)
    assert REQUIRED_COLUMNS <= set(schema.names)
    assert metadata.num_rows > 0  # the reader refuses an empty dataset
    reader = pq.ParquetFile(path)
    items = []
    for group in range(metadata.num_row_groups):
        table = reader.read_row_group(group, columns=["input_ids", "seq_start_id", "loss_mask"])
        for at in range(table.num_rows):
            input_ids = table.column("input_ids")[at].as_py()
            seq_start_id = table.column("seq_start_id")[at].as_py()
            loss_mask = table.column("loss_mask")[at].as_py()
            # validate_row
            assert len(loss_mask) == len(input_ids)
            assert seq_start_id and seq_start_id[0] == 0
            assert all(s < len(input_ids) for s in seq_start_id)
            assert seq_start_id == sorted(seq_start_id)
            items.append(
                {
                    "input_ids": input_ids,
                    "seq_boundaries": seq_start_id + [len(input_ids)],  # noqa: RUF005 (the reader's)
                    "loss_mask": loss_mask,
                }
            )
    return items


def megatron_pairs(items: list[dict], eos_id: int | None = None) -> Counter:
    """The (context → target) pairs the released collator trains on these items."""
    pairs: Counter = Counter()
    for item in items:
        ids, mask, bounds = item["input_ids"], item["loss_mask"], item["seq_boundaries"]
        tokens, targets, loss, cu = [], [], [], [0]
        for s, e in itertools.pairwise(bounds):
            tokens += ids[s : e - 1]
            targets += ids[s + 1 : e]
            loss += mask[s : e - 1]
            cu.append(cu[-1] + e - s - 1)
        for q, token in enumerate(tokens):
            if token == eos_id:
                loss[q] = 0  # loss_mask[tokens == eos_id] = 0
        for a, b in itertools.pairwise(cu):
            for q in range(a, b):
                if loss[q]:
                    pairs[(tuple(tokens[a : q + 1]), targets[q])] += 1
    return pairs


def test_megatron_export_trains_packshards_pairs_exactly(packed_demo, tmp_path):
    result = export_dataset(packed_demo, "megatron", tmp_path / "mb")
    manifest = json.loads((packed_demo / "manifest.json").read_text())
    names = {"training_256.idx.parquet", "256_metadata.jsonl", "export.json"}
    assert {p.name for p in (tmp_path / "mb").iterdir()} == names
    table = pq.read_table(tmp_path / "mb" / "training_256.idx.parquet")
    types = [f.type.value_type for f in table.schema]
    assert table.column_names == ["input_ids", "seq_start_id", "loss_mask"]
    assert types == [pa.int32(), pa.int32(), pa.int8()]
    assert table.num_rows == manifest["stats"]["rows"]
    want = trained_pairs(packed_demo)
    assert sum(want.values()) == manifest["stats"]["loss_tokens"]
    eos = manifest["tokenizer"]["eos_token_id"]
    items = bridge_items(tmp_path / "mb" / "training_256.idx.parquet")
    assert megatron_pairs(items, eos) == want
    assert result.info["written"]["targets_after_eos"] == 0
    # the control: a mask aligned with the tokens (labels != -100), not shifted, trains wrong pairs
    shards = [pq.read_table(packed_demo / s["path"]) for s in manifest["shards"]]
    unshifted = [
        [int(v != IGNORE_INDEX) for v in r] for s in shards for r in s["labels"].to_pylist()
    ]
    control = table.set_column(2, "loss_mask", pa.array(unshifted, pa.list_(pa.int8())))
    pq.write_table(control, tmp_path / "control.idx.parquet")
    assert megatron_pairs(bridge_items(tmp_path / "control.idx.parquet"), eos) != want
    # run-time rows fit packed_sequence_size; the metadata describes them
    runtime = [len(r["input_ids"]) - len(r["seq_start_id"]) for r in table.to_pylist()]
    segments = [np.diff([*r["seq_start_id"], len(r["input_ids"])]) for r in table.to_pylist()]
    assert max(runtime) <= 256
    metadata = json.loads((tmp_path / "mb" / "256_metadata.jsonl").read_text())
    assert metadata == [
        {
            "dataset_max_seqlen": int(max(s.max() for s in segments)) - 1,
            "max_samples_per_bin": max(len(s) for s in segments),
            "packing_factor": round(manifest["stats"]["examples"] / len(runtime), 2),
            "packing_efficiency": round(100 * sum(runtime) / len(runtime) / 256, 2),
            "pack_size": 256,
            "min_packed_seqlen": min(runtime),
        }
    ]
    assert result.info["written"]["dropped_one_token_segments"] == 0


def test_one_token_segments_are_dropped_and_nothing_else(tmp_path):
    rows = fixture_rows(20, seed=3)  # segments of 1 to 11 tokens
    out = write_out(tmp_path / "out", [rows[:9], rows[9:]])
    ones = sum(int((np.diff(r.cu_seqlens) == 1).sum()) for r in rows)
    assert ones > 0
    result = export_dataset(out, "megatron", tmp_path / "mb")
    items = bridge_items(tmp_path / "mb" / "training_64.idx.parquet")
    assert result.info["written"]["dropped_one_token_segments"] == ones
    for item in items:
        assert np.diff(item["seq_boundaries"]).min() >= 2  # no empty sequence at run time
    assert megatron_pairs(items) == trained_pairs(out)


def test_megatron_parquet_is_the_same_export_under_its_earlier_name(packed_demo, tmp_path):
    export_dataset(packed_demo, "megatron", tmp_path / "a")
    export_dataset(packed_demo, "megatron-parquet", tmp_path / "b")
    for name in ("training_256.idx.parquet", "256_metadata.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def megatron_cp_pairs(items: list[dict], eos_id: int, multiple: int, max_length: int) -> Counter:
    """The pairs the released collator trains with ``pad_seq_to_mult = multiple`` (THD, CP).

    Its CP branch: ``cu_seqlens_padded`` from the run-time lengths ``e - s - 1`` (each a
    multiple, the row within ``max_length``), each logical length up to the last non-EOS input
    (the alignment pads excluded), attention within ``[padded start, logical end)``.
    """
    pairs: Counter = Counter()
    for item in items:
        ids, mask, bounds = item["input_ids"], item["loss_mask"], item["seq_boundaries"]
        padded, tokens, targets, loss = [0], [], [], []
        logical: list[int] = []
        for s, e in itertools.pairwise(bounds):
            assert (e - s - 1) % multiple == 0  # what context parallelism needs
            padded.append(padded[-1] + e - s - 1)
            current = ids[s : e - 1]
            real = [q for q, token in enumerate(current) if token != eos_id]
            logical.append(real[-1] + 1 if real else 0)
            tokens += current
            targets += ids[s + 1 : e]
            loss += mask[s : e - 1]
        assert padded[-1] <= max_length
        for q, token in enumerate(tokens):
            if token == eos_id:
                loss[q] = 0
        for (a, _), n in zip(itertools.pairwise(padded), logical, strict=True):
            for q in range(a, a + n):
                if loss[q]:
                    pairs[(tuple(tokens[a : q + 1]), targets[q])] += 1
            assert not any(loss[a + n : _])  # no pad trains
    return pairs


@pytest.mark.parametrize(("cp", "multiple"), [(2, 4), (4, 8)])
def test_an_aligned_pack_exports_what_the_context_parallel_path_reads(
    tmp_path, packed_demo_tokenizer, cp, multiple
):
    from tests.helpers import pack_demo_into

    out = pack_demo_into(tmp_path, packed_demo_tokenizer, cp=cp)
    result = export_dataset(out, "megatron", tmp_path / "mb")
    written = result.info["written"]
    assert written["pad_seq_to_mult"] == multiple and written["alignment_pads"] > 0
    eos = json.loads((out / "manifest.json").read_text())["tokenizer"]["eos_token_id"]
    items = bridge_items(tmp_path / "mb" / "training_256.idx.parquet")
    assert megatron_cp_pairs(items, eos, multiple, 256) == trained_pairs(out)
    with pytest.raises(AssertionError):  # the control: the unaligned export is refused by it
        plain = pack_demo_into(tmp_path / "plain", packed_demo_tokenizer)
        export_dataset(plain, "megatron", tmp_path / "mb-plain")
        megatron_cp_pairs(
            bridge_items(tmp_path / "mb-plain" / "training_256.idx.parquet"), eos, multiple, 256
        )


def test_an_aligned_pack_exports_only_as_megatron(tmp_path, packed_demo_tokenizer):
    from packshard.errors import UsageError
    from tests.helpers import pack_demo_into

    out = pack_demo_into(tmp_path, packed_demo_tokenizer, cp=2)
    with pytest.raises(UsageError, match="exports only as --to megatron"):
        export_dataset(out, "torchtune", tmp_path / "tt")
    assert not (tmp_path / "tt").exists()
