"""pack --eval-fraction / --eval (planning schedule): a seeded split by record, own shards."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from packshard.errors import UsageError
from packshard.format.card import card_configs
from packshard.pack import PackConfig, pack_dataset
from packshard.pack.plan.schedule import drawn_eval
from tests.helpers import output_digests, pack_demo_into


def test_the_draw_is_seeded_by_record_and_near_the_fraction():
    lines = np.tile(np.arange(1, 5001), 2)
    source = np.repeat([0, 1], 5000)
    names = ["a.jsonl", "b.jsonl"]
    drawn = drawn_eval(names, source, lines, 0, 0.1)
    assert 0.09 < drawn.mean() < 0.11
    assert np.array_equal(drawn, drawn_eval(names, source, lines, 0, 0.1))  # deterministic
    other = drawn_eval(names, source, lines, 1, 0.1)
    assert not np.array_equal(drawn, other) and 0.09 < other.mean() < 0.11
    assert not np.array_equal(drawn[:5000], drawn[5000:])  # the path is part of the key
    # a record's draw depends on (seed, path, line) alone, not on the other records
    assert np.array_equal(drawn_eval(names, source[::7], lines[::7], 0, 0.1), drawn[::7])
    assert not drawn_eval(names, source, lines, 0, 0.0).any()


def _pack(root: Path, tokenizer: Path, **options: object) -> dict:
    out = pack_demo_into(root, tokenizer, **options)
    return json.loads((out / "manifest.json").read_text())


def _rows_split(out: Path, manifest: dict) -> dict[int, str]:
    """example_id -> the split of the shard whose rows hold it."""
    found = {}
    for entry in manifest["shards"]:
        ids = pq.read_table(out / entry["path"], columns=["example_ids"]).column(0).to_pylist()
        for row in ids:
            splits = {found.setdefault(k, entry["split"]) for k in row}
            assert splits == {entry["split"]}
    return found


def test_eval_fraction_writes_an_eval_split_of_whole_records(tmp_path, packed_demo_tokenizer):
    from packshard.verify.run import VerifyOptions, verify_dataset
    from tests.helpers import check_pack_output

    manifest = _pack(tmp_path, packed_demo_tokenizer, eval_fraction=0.3, overlong="split")
    out = tmp_path / "out"
    check_pack_output(out)
    assert manifest["config"]["eval"] == {"fraction": 0.3, "inputs": []}
    names = [s["path"] for s in manifest["shards"]]
    splits = [s["split"] for s in manifest["shards"]]
    assert splits == sorted(splits, reverse=True) and set(splits) == {"train", "eval"}
    assert all(
        n.startswith("eval-shard-") == (s == "eval") for n, s in zip(names, splits, strict=True)
    )
    index = pq.read_table(out / "examples.parquet").to_pydict()
    by_rows = _rows_split(out, manifest)
    assert [by_rows[k] for k in index["example_id"]] == index["split"]
    record_split: dict[tuple[str, int], set[str]] = {}
    for source, line, split in zip(index["source"], index["line"], index["split"], strict=True):
        record_split.setdefault((source, line), set()).add(split)
    assert all(len(s) == 1 for s in record_split.values())  # a record is in one split
    counts = Counter(next(iter(s)) for s in record_split.values())
    stats = manifest["stats"]["splits"]
    for split in ("train", "eval"):
        assert stats[split]["records_packed"] == counts[split]
        assert stats[split]["examples"] == index["split"].count(split)
        shards = [s for s in manifest["shards"] if s["split"] == split]
        assert stats[split]["rows"] == sum(s["rows"] for s in shards)
        assert stats[split]["tokens"] == sum(s["tokens"] for s in shards)
    assert counts["train"] + counts["eval"] == manifest["stats"]["records_packed"]
    configs = {c["config_name"]: c for c in card_configs((out / "README.md").read_text())}
    assert configs["default"]["data_files"] == [
        {"split": "train", "path": [n for n, s in zip(names, splits, strict=True) if s == "train"]}
    ]
    assert configs["eval"]["data_files"] == [
        {"split": "eval", "path": [n for n, s in zip(names, splits, strict=True) if s == "eval"]}
    ]
    report = verify_dataset(str(out), VerifyOptions(model="none", source=True))
    assert report.ok, [str(f) for f in report.findings.items]
    assert report.checks["source"]["status"] == "passed"


def test_the_training_reader_reads_train_shards_unless_asked(tmp_path, packed_demo_tokenizer):
    pytest.importorskip("torch")
    from packshard.torch import PackedDataset, PackedIterableDataset

    manifest = _pack(tmp_path, packed_demo_tokenizer, eval_fraction=0.3)
    out = tmp_path / "out"
    rows = {
        s: sum(e["rows"] for e in manifest["shards"] if e["split"] == s) for s in ("train", "eval")
    }
    assert len(PackedDataset(out)) == rows["train"] > 0
    assert len(PackedDataset(out, split="eval")) == rows["eval"] > 0
    assert len(PackedDataset(out, split=None)) == rows["train"] + rows["eval"]
    train_ids = {int(k) for i in range(rows["train"]) for k in PackedDataset(out)[i]["example_ids"]}
    index = pq.read_table(out / "examples.parquet").to_pydict()
    assert train_ids == {
        k for k, s in zip(index["example_id"], index["split"], strict=True) if s == "train"
    }
    streamed = PackedIterableDataset(out, shuffle=False, rank=0, world_size=1)
    assert sum(1 for _ in streamed) == rows["train"]


def test_eval_inputs_put_all_their_records_in_eval(tmp_path, packed_demo_tokenizer):
    from packshard.demo import demo_data_path

    held = tmp_path / "held" / "eval.jsonl"
    held.parent.mkdir()
    held.write_text("".join(demo_data_path().read_text().splitlines(keepends=True)[:5]))
    manifest = _pack(tmp_path, packed_demo_tokenizer, eval_inputs=(str(held),))
    index = pq.read_table(tmp_path / "out" / "examples.parquet").to_pydict()
    assert {
        s for src, s in zip(index["source"], index["split"], strict=True) if src == str(held)
    } == {"eval"}
    assert {
        s for src, s in zip(index["source"], index["split"], strict=True) if src != str(held)
    } == {"train"}
    assert manifest["stats"]["splits"]["eval"]["records_packed"] == 5
    assert [i["path"] for i in manifest["inputs"]][-1] == str(held)


def test_without_the_options_nothing_changes(tmp_path, packed_demo_tokenizer):
    before = _pack(tmp_path, packed_demo_tokenizer)
    digests = output_digests(tmp_path / "out")
    manifest = _pack(tmp_path, packed_demo_tokenizer, eval_fraction=0.0, overwrite=True)
    assert output_digests(tmp_path / "out") == digests
    assert manifest["dataset_id"] == before["dataset_id"]
    assert "eval" not in manifest["config"] and "splits" not in manifest["stats"]
    assert all("split" not in s for s in manifest["shards"])
    assert "split" not in pq.read_schema(tmp_path / "out" / "examples.parquet").names


def test_same_seed_same_bytes_other_seed_other_split(tmp_path, packed_demo_tokenizer):
    def held() -> set[int]:
        index = pq.read_table(tmp_path / "out" / "examples.parquet").to_pydict()
        return {line for line, s in zip(index["line"], index["split"], strict=True) if s == "eval"}

    one = _pack(tmp_path, packed_demo_tokenizer, eval_fraction=0.3, seed=3)
    digests, first = output_digests(tmp_path / "out"), held()
    two = _pack(tmp_path, packed_demo_tokenizer, eval_fraction=0.3, seed=3, overwrite=True)
    assert one["shards"] == two["shards"] and output_digests(tmp_path / "out") == digests
    other = _pack(tmp_path, packed_demo_tokenizer, eval_fraction=0.3, seed=4, overwrite=True)
    assert held() != first
    assert other["stats"]["records_packed"] == one["stats"]["records_packed"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"eval_fraction": 1.0}, "--eval-fraction must be in [0, 1), got 1.0"),
        ({"eval_fraction": -0.1}, "--eval-fraction must be in [0, 1), got -0.1"),
        (
            {"eval_fraction": 1e-9},
            "--eval-fraction 1e-09 left the eval split empty (every packed record went to "
            "train): change the fraction or the --eval inputs",
        ),
    ],
)
def test_impossible_splits_are_refused(tmp_path, packed_demo_tokenizer, options, message):
    with pytest.raises(UsageError) as err:
        pack_demo_into(tmp_path, packed_demo_tokenizer, **options)
    assert str(err.value) == message
    assert not (tmp_path / "out").exists()


def test_an_input_named_for_both_splits_is_refused(tmp_path, packed_demo_tokenizer):
    from packshard.demo import demo_data_path

    data = str(demo_data_path())
    config = PackConfig.build(
        inputs=(data,), tokenizer=str(packed_demo_tokenizer), out=str(tmp_path / "out"),
        max_seq_len=256, template="chatml", eval_inputs=(data,),
    )  # fmt: skip
    with pytest.raises(UsageError, match="is both a training input and an --eval input"):
        pack_dataset(config)


def test_exports_hold_the_eval_split_out(tmp_path, packed_demo_tokenizer):
    from packshard.export.common import read_rows

    manifest = _pack(tmp_path, packed_demo_tokenizer, eval_fraction=0.3)
    train = [e["rows"] for e in manifest["shards"] if e["split"] == "train"]
    assert len(train) < len(manifest["shards"])
    assert [rows.num_rows for rows in read_rows(tmp_path / "out")] == train


def test_verify_finds_an_example_outside_its_split(tmp_path, packed_demo_tokenizer):
    from packshard.verify.run import VerifyOptions, verify_dataset

    manifest = _pack(tmp_path, packed_demo_tokenizer, eval_fraction=0.3)
    out = tmp_path / "out"
    manifest["shards"][-1]["split"] = "train"  # an eval shard now claims to be train
    (out / "manifest.json").write_text(json.dumps(manifest))
    report = verify_dataset(str(out), VerifyOptions(model="none", source=False))
    assert not report.ok
    assert report.findings.count_kind("structure", "split_mismatch") > 0


def test_a_record_in_both_splits_is_a_finding():
    from packshard.format.examples import ExamplesIndex, build_examples_table
    from packshard.verify.findings import FindingList
    from packshard.verify.structure import _check_splits

    n = 4
    columns = {name: np.zeros(n, np.int64) for name in ("part", "token_offset", "domain")}
    columns.update(
        example_id=np.arange(n), source=np.zeros(n, np.int64), line=np.array([1, 1, 2, 3]),
        num_tokens=np.ones(n), num_loss_tokens=np.ones(n), truncated=np.zeros(n, bool),
        shard=np.array([0, 1, 0, 1]), row=np.zeros(n), split=np.array([False, True, False, True]),
    )  # fmt: skip
    index = ExamplesIndex.from_table(build_examples_table(columns, ["a.jsonl"], ["d"]))
    manifest = {"shards": [{"split": "train"}, {"split": "eval"}]}
    findings = FindingList()
    _check_splits(manifest, index, findings)
    assert findings.count_kind("structure", "split_leak") == 1  # line 1: examples 0 and 1
    assert findings.count_kind("structure", "split_mismatch") == 0
    assert [f.example_id for f in findings.items] == [1]


def test_the_command_line_split_is_the_same_on_two_workers(tmp_path, packed_demo_tokenizer):
    from tests.cli.test_commands import pack_args, run

    one, two = tmp_path / "one", tmp_path / "two"
    result = run(*pack_args(packed_demo_tokenizer, one, "--eval-fraction", "0.2", "--seed", "5"))
    assert result.exit_code == 0, result.output
    manifest = json.loads((one / "manifest.json").read_text())
    split = manifest["stats"]["splits"]
    counts = f"{split['train']['records_packed']} / {split['eval']['records_packed']}"
    assert "train / eval records" in result.stdout and counts in result.stdout
    more = ("--eval-fraction", "0.2", "--seed", "5", "--workers", "2", "--split-bytes", "4096")
    assert run(*pack_args(packed_demo_tokenizer, two, *more)).exit_code == 0
    assert output_digests(one) == output_digests(two)
    result = run("verify", two, "--model", "none")
    assert result.exit_code == 0, result.output


def test_turn_examples_of_one_record_share_its_split(tmp_path, packed_demo_tokenizer):
    _pack(tmp_path, packed_demo_tokenizer, eval_fraction=0.3, turns="expand")
    index = pq.read_table(tmp_path / "out" / "examples.parquet").to_pydict()
    splits: dict[tuple[str, int], set[str]] = {}
    for source, line, split in zip(index["source"], index["line"], index["split"], strict=True):
        splits.setdefault((source, line), set()).add(split)
    assert len(index["turn"]) > len(splits)  # some records gave several turn-examples
    assert all(len(s) == 1 for s in splits.values())
    assert {next(iter(s)) for s in splits.values()} == {"train", "eval"}


def test_verify_checks_the_split_counts(tmp_path, packed_demo_tokenizer):
    from packshard.verify.run import VerifyOptions, verify_dataset

    manifest = _pack(tmp_path, packed_demo_tokenizer, eval_fraction=0.3)
    out = tmp_path / "out"
    rows = manifest["stats"]["splits"]["eval"]["rows"]
    manifest["stats"]["splits"]["eval"]["rows"] += 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    report = verify_dataset(str(out), VerifyOptions(model="none", source=False))
    assert [f.message for f in report.findings.items] == [
        f"manifest stats.splits.eval.rows={rows + 1} but its shards add up to {rows}"
    ]
