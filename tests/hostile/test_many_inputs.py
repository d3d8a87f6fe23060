"""Work units scale with the job, not with its input list; long OUT names work on workers.

Each unit's ``unit.json`` holds its own numbers, never the job's list of inputs (10,000
one-record files made 10,000 markers of 10,000 names each), and the units folder beside a
250-character OUT is shortened like the temporary folder.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from packshard.engine import TaskFailed
from packshard.pack import PackConfig, pack_dataset
from packshard.pack.units.scale import work_folder


def many_files(folder: Path, n: int) -> Path:
    folder.mkdir()
    for i in range(n):
        (folder / f"input-{i:05d}.jsonl").write_text(json.dumps({"text": f"w{i % 9 + 2}"}) + "\n")
    return folder


def test_unit_markers_do_not_repeat_the_input_list(tmp_path, word_tokenizer, monkeypatch):
    data = many_files(tmp_path / "data", 60)
    out = tmp_path / "out"
    config = PackConfig.build(
        inputs=(str(data),),
        tokenizer=str(word_tokenizer),
        out=str(out),
        max_seq_len=16,
        workers=2,
        split_bytes=1,  # a unit per file: small files are gathered otherwise (below)
    )
    whole = pack_dataset(replace(config, out=str(tmp_path / "one")))
    monkeypatch.setenv("PACKSHARD_FAULTS", "raise:shard-00000:9")  # keep the units
    with pytest.raises(TaskFailed):
        pack_dataset(config)
    markers = sorted(work_folder(out).glob("*/unit.json"))
    assert len(markers) == 60
    for marker in markers:
        text = marker.read_text()
        assert text.count("input-") <= 1, marker  # at most its own input, in a reject
        assert json.loads(text)["counts"]["records_per_source"] == [1]
    monkeypatch.delenv("PACKSHARD_FAULTS")
    resumed = pack_dataset(replace(config, resume=True))
    assert resumed.manifest["engine"]["units_reused"] == 60
    records = [i["records"] for i in resumed.manifest["inputs"]]
    assert records == [i["records"] for i in whole.manifest["inputs"]] == [1] * 60


def test_gathered_files_make_one_unit_that_lists_only_its_own_counts(
    tmp_path, word_tokenizer, monkeypatch
):
    data = many_files(tmp_path / "data", 60)
    out = tmp_path / "out"
    config = PackConfig.build(
        inputs=(str(data),), tokenizer=str(word_tokenizer), out=str(out), max_seq_len=16
    )
    monkeypatch.setenv("PACKSHARD_FAULTS", "raise:shard-00000:9")  # keep the units
    with pytest.raises(TaskFailed):
        pack_dataset(config)
    (marker,) = work_folder(out).glob("*/unit.json")
    assert marker.parent.name == "00000-inputs-00059"
    assert json.loads(marker.read_text())["counts"]["records_per_source"] == [1] * 60


def test_a_250_character_out_works_with_workers(tmp_path, word_tokenizer):
    data = many_files(tmp_path / "data", 3)
    out = tmp_path / ("o" * 250)
    config = PackConfig.build(
        inputs=(str(data),),
        tokenizer=str(word_tokenizer),
        out=str(out),
        max_seq_len=16,
        workers=2,
    )
    assert pack_dataset(config).manifest["stats"]["records_packed"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", out.name]
