"""``--to megatron-npy``: the packed .npy of Megatron-Bridge up to 0.3.1, read by its rules.

Megatron-Bridge does not install on a CPU-only machine, so its reading is reimplemented from
0.3.1's ``megatron/bridge/data``: ``PackedSequenceSpecs`` asserts a ``.npy`` suffix;
``GPTSFTPackedDataset._load_dataset`` is ``np.load(path, allow_pickle=True)``;
``__getitem__`` returns ``input_ids``, ``seq_boundaries = seq_start_id + [len(input_ids)]``
(list concatenation) and ``loss_mask``; ``collate_fn`` slices sequence ``[s, e)`` into inputs
``input_ids[s:e-1]``, labels ``input_ids[s+1:e]``, loss ``loss_mask[s:e-1]`` (answer-only
loss), positions ``range(e - s - 1)``, then zeroes the loss where the input token is EOS;
with ``pad_cu_seqlens`` it reads ``max_samples_per_bin``, ``dataset_max_seqlen`` and
``min_packed_seqlen`` from the metadata list.  The file is read here with an unpickler that
admits NumPy's array reconstruction only (packshard never loads a pickle it did not just
write, and this one is refused anything else).
"""

from __future__ import annotations

import io
import itertools
import json
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from packshard.export import export_dataset
from tests.helpers import fixture_rows, trained_pairs, write_out

ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class _ArrayOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"refused {module}.{name}")
        return super().find_class(module, name)


def load_packed_npy(path: Path) -> np.ndarray:
    """``np.load(path, allow_pickle=True)``, with only NumPy's array reconstruction admitted."""
    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        read_header = getattr(np.lib.format, f"read_array_header_{version[0]}_{version[1]}")
        shape, fortran, dtype = read_header(fh)
        assert dtype == np.dtype(object) and len(shape) == 1 and not fortran
        array = _ArrayOnly(io.BytesIO(fh.read())).load()
    assert isinstance(array, np.ndarray) and array.shape == shape
    return array


def bridge_pairs(samples: np.ndarray, eos_id: int | None) -> Counter:
    """The (context → target) pairs 0.3.1's GPTSFTPackedDataset + collate_fn train."""
    pairs: Counter = Counter()
    for idx in range(len(samples)):
        item = samples[idx]
        input_ids = item["input_ids"]
        seq_boundaries = item["seq_start_id"] + [len(input_ids)]  # as __getitem__ (lists)
        loss_mask = item["loss_mask"]
        tokens, labels, loss, positions = [], [], [], []
        for s, e in itertools.pairwise(seq_boundaries):
            tokens.append(input_ids[s : e - 1])
            labels.append(input_ids[s + 1 : e])
            loss.append(loss_mask[s : e - 1])
            positions += list(range(e - s - 1))
        flat = np.concatenate(tokens)
        mask = np.concatenate(loss).astype(np.int64)
        if eos_id is not None:
            mask[flat == eos_id] = 0  # collate_fn: loss_mask[tokens == eos_id] = 0
        assert len(positions) == len(flat)
        at = 0
        for seq_tokens, seq_labels in zip(tokens, labels, strict=True):
            for q in range(len(seq_tokens)):
                if mask[at + q]:
                    pairs[(tuple(seq_tokens[: q + 1]), seq_labels[q])] += 1
            at += len(seq_tokens)
    return pairs


def test_released_reader_trains_packshards_pairs_exactly(packed_demo, tmp_path):
    result = export_dataset(packed_demo, "megatron-npy", tmp_path / "mb")
    manifest = json.loads((packed_demo / "manifest.json").read_text())
    folder = tmp_path / "mb"
    assert {p.name for p in folder.iterdir()} == {
        "training_256.npy",
        "256_metadata.jsonl",
        "export.json",
    }
    samples = load_packed_npy(folder / "training_256.npy")
    assert len(samples) == manifest["stats"]["rows"]
    for item in samples:
        assert set(item) == {"input_ids", "loss_mask", "seq_start_id"}
        assert all(type(item[k]) is list for k in item)  # seq_start_id + [n] must concatenate
        assert item["seq_start_id"][0] == 0 and len(item["input_ids"]) <= 256
    eos = manifest["tokenizer"]["eos_token_id"]
    want = trained_pairs(packed_demo)
    assert sum(want.values()) == manifest["stats"]["loss_tokens"]
    assert bridge_pairs(samples, eos) == want
    assert result.info["written"]["targets_after_eos"] == 0
    # tokens and boundaries are the shards' (rows in shard order)
    shards = [pq.read_table(packed_demo / s["path"]) for s in manifest["shards"]]
    ids = [r for t in shards for r in t["input_ids"].to_pylist()]
    assert [item["input_ids"] for item in samples] == ids
    # the control: an unshifted mask (labels != -100) trains other pairs
    control = np.empty(len(samples), dtype=object)
    labels = [r for t in shards for r in t["labels"].to_pylist()]
    control[:] = [
        {**item, "loss_mask": [int(v != -100) for v in lab]}
        for item, lab in zip(samples, labels, strict=True)
    ]
    assert bridge_pairs(control, eos) != want
    metadata = json.loads((folder / "256_metadata.jsonl").read_text())
    runtime = [len(i["input_ids"]) - len(i["seq_start_id"]) for i in samples]
    assert isinstance(metadata, list) and len(metadata) == 1
    assert metadata[0]["max_samples_per_bin"] == max(len(i["seq_start_id"]) for i in samples)
    assert metadata[0]["min_packed_seqlen"] == min(runtime)
    assert metadata[0]["dataset_max_seqlen"] == max(
        int(np.diff([*i["seq_start_id"], len(i["input_ids"])]).max()) - 1 for i in samples
    )


def test_one_token_segments_are_dropped_as_in_the_parquet_form(tmp_path):
    rows = fixture_rows(20, seed=3)
    out = write_out(tmp_path / "out", [rows[:9], rows[9:]])
    result = export_dataset(out, "megatron-npy", tmp_path / "mb")
    samples = load_packed_npy(tmp_path / "mb" / "training_64.npy")
    for item in samples:
        assert np.diff([*item["seq_start_id"], len(item["input_ids"])]).min() >= 2
    assert bridge_pairs(samples, None) == trained_pairs(out)
    assert result.info["written"]["dropped_one_token_segments"] > 0


def test_the_reader_refuses_anything_but_arrays(tmp_path):
    path = tmp_path / "evil.npy"
    np.save(path, np.array([Path("x")], dtype=object), allow_pickle=True)
    with pytest.raises(pickle.UnpicklingError, match="refused"):
        load_packed_npy(path)
