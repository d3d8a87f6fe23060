"""A finished pack, read back and checked: PackOutput, check_pack_output, pack_demo_into."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packshard.records import IGNORE_INDEX, PackedRow
from tests.helpers.data import write_jsonl

# --- a finished pack, read back and checked ----------------------------------------------------


@dataclass
class PackOutput:
    """A finished pack, read back: manifest, rows per shard, examples index, rejects."""

    out: Path
    manifest: dict[str, Any]
    rows: list[Any]  # PackedRow, in shard order then row order
    row_place: list[tuple[int, int]]  # (shard, row) of each entry of ``rows``
    examples: dict[str, list[Any]]  # examples.parquet as columns
    rejects: list[dict[str, Any]]
    # first position of each example id and of each (shard, row), built on the first lookup: a
    # list.index per example made checking a pack of n examples O(n^2)
    _where: dict[Any, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _first(self, values: list[Any], value: Any) -> int:
        if not self._where:
            for key, column in (("example", self.examples["example_id"]), ("row", self.row_place)):
                for i, v in enumerate(column):
                    self._where.setdefault((key, v), i)
        key = "example" if values is self.examples["example_id"] else "row"
        i = self._where.get((key, value))
        if i is None or i >= len(values) or values[i] != value:  # changed since: look again
            return values.index(value)
        return i

    def segment(self, example_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(input_ids, labels, position_ids)`` of one example, found via the index."""
        i = self._first(self.examples["example_id"], example_id)
        shard, row = self.examples["shard"][i], self.examples["row"][i]
        packed = self.rows[self._first(self.row_place, (shard, row))]
        j = int(np.flatnonzero(packed.example_ids == example_id)[0])
        lo, hi = int(packed.cu_seqlens[j]), int(packed.cu_seqlens[j + 1])
        return packed.input_ids[lo:hi], packed.labels[lo:hi], packed.position_ids[lo:hi]

    def records(self) -> dict[tuple[str, int], list[int]]:
        """Example ids per record ``(source, line)``, in part order."""
        out: dict[tuple[str, int], list[tuple[int, int]]] = {}
        ex = self.examples
        for k, eid in enumerate(ex["example_id"]):
            out.setdefault((ex["source"][k], ex["line"][k]), []).append((ex["part"][k], eid))
        return {key: [eid for _, eid in sorted(parts)] for key, parts in out.items()}


def check_pack_output(out: Path) -> PackOutput:
    """Read ``out`` and check every property of the shard contract that needs no source."""
    import pyarrow.parquet as pq

    from packshard.digests import sha256_path
    from packshard.format.manifest import schema_errors
    from packshard.format.shards import read_row

    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert schema_errors(manifest) == []
    stats = manifest["stats"]
    max_seq_len = manifest["config"]["max_seq_len"]
    dataset_meta = {
        b"packshard.format_version": b"1",
        b"packshard.dataset_id": manifest["dataset_id"].encode(),
    }
    # counting rule, in total and per domain
    assert stats["records"] == stats["records_packed"] + stats["rejected"] + stats["dropped"]
    assert stats["records"] == sum(i["records"] for i in manifest["inputs"])
    for key in ("records", "records_packed", "rejected", "dropped", "examples", "tokens"):
        assert sum(d[key] for d in stats["domains"].values()) == stats[key], key
    for d in stats["domains"].values():
        assert d["records"] == d["records_packed"] + d["rejected"] + d["dropped"]
    rejects_text = (out / "rejects.jsonl").read_text(encoding="utf-8")
    rejects = [json.loads(line) for line in rejects_text.splitlines()]
    assert len(rejects) == stats["rejected"] + stats["dropped"]
    assert Counter(r["code"] for r in rejects) == Counter(stats["rejects_by_code"])
    for reject in rejects:
        assert sorted(reject) == ["code", "domain", "line", "reason", "source"]
    # files and shards against the manifest
    names = {"manifest.json", "examples.parquet", "rejects.jsonl", "README.md"}
    names |= {s["path"] for s in manifest["shards"]}
    assert {p.name for p in out.iterdir()} == names
    for entry in manifest["files"].values():
        assert sha256_path(out / entry["path"]) == entry["sha256"]
    rows: list[PackedRow] = []
    place: list[tuple[int, int]] = []
    for k, entry in enumerate(manifest["shards"]):
        path = out / entry["path"]
        assert sha256_path(path) == entry["sha256"]
        assert path.stat().st_size == entry["bytes"]
        table = pq.read_table(path)
        meta = table.schema.metadata
        assert {key: meta[key] for key in dataset_meta} == dataset_meta
        assert table.num_rows == entry["rows"]
        assert sum(table["num_tokens"].to_pylist()) == entry["tokens"]
        assert sum(table["num_loss_tokens"].to_pylist()) == entry["loss_tokens"]
        for r in range(table.num_rows):
            row = read_row(table, r)
            cu = row.cu_seqlens
            assert cu[0] == 0 and cu[-1] == row.num_tokens <= max_seq_len
            assert np.all(np.diff(cu) > 0)
            assert len(row.example_ids) == row.num_segments
            assert np.all(row.labels[cu[:-1]] == IGNORE_INDEX)
            trained = row.labels != IGNORE_INDEX
            assert np.array_equal(row.labels[trained], row.input_ids[trained])
            seg_len = np.diff(cu)
            expect_pos = np.arange(row.num_tokens) - np.repeat(cu[:-1], seg_len)
            assert np.array_equal(row.position_ids, expect_pos)
            assert table["num_tokens"][r].as_py() == row.num_tokens
            assert table["num_loss_tokens"][r].as_py() == int(trained.sum())
            assert table["max_seqlen"][r].as_py() == int(seg_len.max())
            rows.append(row)
            place.append((k, r))
    assert stats["rows"] == len(rows)
    assert stats["tokens"] == sum(r.num_tokens for r in rows)
    assert stats["loss_tokens"] == sum(int((r.labels != IGNORE_INDEX).sum()) for r in rows)
    assert stats["lower_bound_rows"] == -(-stats["tokens"] // max_seq_len)
    if rows:
        assert stats["fill_rate"] == pytest.approx(
            stats["tokens"] / (len(rows) * max_seq_len), abs=5e-7
        )
    else:
        assert stats["fill_rate"] == 0.0
    # the examples index: one row per segment, ids 0..n-1, pointing at the right row, and
    # the same packshard metadata as the shards
    examples_table = pq.read_table(out / "examples.parquet")
    meta = examples_table.schema.metadata
    assert {key: meta[key] for key in dataset_meta} == dataset_meta
    examples = examples_table.to_pydict()
    n = stats["examples"]
    assert examples["example_id"] == list(range(n))
    assert sorted(int(e) for r in rows for e in r.example_ids) == list(range(n))
    # the loss block: what --loss resolved to, and every packed example under one policy
    loss = manifest["loss"]
    assert loss["option"] == manifest["config"]["loss"]
    assert sum(loss["examples_by_policy"].values()) == n
    assert set(loss["examples_by_policy"]) <= set(loss["by_format"].values())
    output = PackOutput(out, manifest, rows, place, examples, rejects)
    for k in range(n):
        ids, labels, _ = output.segment(k)
        assert len(ids) == examples["num_tokens"][k]
        assert int((labels != IGNORE_INDEX).sum()) == examples["num_loss_tokens"][k]
    return output


def pack_demo_into(root: Path, tokenizer: Path, **options: object) -> Path:
    """Pack a private copy of the embedded demo chats into ``root/out`` and return it.

    The data file is copied under ``root`` so the manifest records an absolute path that
    stays valid (and private to the caller) for the source check.
    """
    from packshard.demo import demo_data_path
    from packshard.pack import PackConfig, pack_dataset

    data = root / "data" / "demo_chat.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(demo_data_path(), data)
    settings: dict[str, object] = {"max_seq_len": 256, "template": "chatml", "shard_rows": 4}
    settings.update(options)
    config = PackConfig.build(
        inputs=(str(data),), tokenizer=str(tokenizer), out=str(root / "out"), **settings
    )  # type: ignore[arg-type]
    pack_dataset(config)
    return root / "out"


def pack_rows(
    root: Path, rows: list[Any], tokenizer: Path, name: str = "in.jsonl", **options: object
) -> Path:
    """Write ``rows`` to ``root/name`` and pack them into ``root/out`` (ChatML, 256 tokens)."""
    from packshard.pack import PackConfig, pack_dataset

    data = write_jsonl(root / name, rows)
    settings: dict[str, object] = {"max_seq_len": 256, "template": "chatml", **options}
    config = PackConfig.build(
        inputs=(str(data),), tokenizer=str(tokenizer), out=str(root / "out"), **settings
    )  # type: ignore[arg-type]
    pack_dataset(config)
    return root / "out"
