"""``--resume`` never mixes runs: what changed is redone, and the run says so.

A unit made under other options (``--on-error`` too), other library versions or inputs, a
unit whose files were altered after it finished, or one whose ``unit.json`` is malformed is
never reused: the output is the one a fresh run writes (or the fresh run's error).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packshard.digests import sha256_path
from packshard.engine import TaskFailed
from packshard.errors import RecordError
from packshard.pack import PackConfig, pack_dataset
from packshard.pack.units.scale import work_folder
from tests.helpers import output_digests, scale_inputs
from tests.pack.units.test_scale import SPLIT


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[Path]:
    return scale_inputs(tmp_path_factory.mktemp("resume_inputs"))


def config(inputs, tokenizer, out: Path, **options) -> PackConfig:
    settings = {"max_seq_len": 256, "template": "chatml", "shard_rows": 5, "batch_size": 7}
    settings |= {"workers": 2, "split_bytes": SPLIT, **options}
    return PackConfig.build(
        inputs=tuple(map(str, inputs)), tokenizer=str(tokenizer), out=str(out), **settings
    )  # type: ignore[arg-type]


def crashed(inputs, tokenizer, out: Path, monkeypatch, **options) -> Path:
    """Run a pack whose last unit keeps failing: the other units are kept for --resume."""
    monkeypatch.setenv("PACKSHARD_FAULTS", "raise:array.json:9")
    with pytest.raises(TaskFailed):
        pack_dataset(config(inputs, tokenizer, out, **options))
    monkeypatch.delenv("PACKSHARD_FAULTS")
    work = work_folder(out)
    assert len(list(work.glob("*/unit.json"))) == 8
    return work


def test_on_error_changed_between_crash_and_resume_is_not_published(
    inputs, packed_demo_tokenizer, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    crashed(inputs, packed_demo_tokenizer, out, monkeypatch, on_error="skip")
    with pytest.raises(RecordError) as fresh:
        pack_dataset(config(inputs, packed_demo_tokenizer, tmp_path / "fresh", on_error="fail"))
    with pytest.raises(RecordError) as resumed:
        pack_dataset(config(inputs, packed_demo_tokenizer, out, on_error="fail", resume=True))
    assert str(resumed.value) == str(fresh.value)
    assert not out.exists()


def test_other_library_versions_redo_every_unit(
    inputs, packed_demo_tokenizer, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    crashed(inputs, packed_demo_tokenizer, out, monkeypatch)
    import packshard.format.environment as environment

    real = environment.installed_version
    monkeypatch.setattr(
        environment,
        "installed_version",
        lambda name: "0.0.1-other" if name == "tokenizers" else real(name),
    )
    result = pack_dataset(config(inputs, packed_demo_tokenizer, out, resume=True))
    assert result.manifest["engine"]["units_reused"] == 0
    assert (
        "--resume: library versions changed since the units in .out.units were made; every "
        "unit is redone"
    ) in result.warnings


@pytest.mark.parametrize("name", ["tokens.bin", "labels.bin"])
def test_a_finished_units_altered_tokens_are_redone_not_published(
    inputs, packed_demo_tokenizer, tmp_path, monkeypatch, name
):
    pack_dataset(config(inputs, packed_demo_tokenizer, tmp_path / "whole"))
    out = tmp_path / "out"
    work = crashed(inputs, packed_demo_tokenizer, out, monkeypatch)
    unit = sorted(p.parent for p in work.glob("*/unit.json"))[0]
    recorded = json.loads((unit / "unit.json").read_text())["files"]
    on_disk = {p.name: sha256_path(p) for p in unit.iterdir() if p.name != "unit.json"}
    assert recorded == on_disk  # hashed as written: the digests of the bytes on disk
    tokens = bytearray((unit / name).read_bytes())
    tokens[8:12] = bytes([7, 0, 0, 0])  # another token id (or label), same size
    (unit / name).write_bytes(bytes(tokens))
    result = pack_dataset(config(inputs, packed_demo_tokenizer, out, resume=True))
    assert result.manifest["engine"]["units_reused"] == 7
    assert (
        f"--resume: unit {unit.name} is redone (its files differ from those it recorded)"
        in result.warnings
    )
    assert output_digests(out) == output_digests(tmp_path / "whole")


@pytest.mark.parametrize("text", ["{", "[]", '{"counts": 5}', "null"])
def test_a_malformed_unit_json_is_redone_without_a_traceback(
    inputs, packed_demo_tokenizer, tmp_path, monkeypatch, text
):
    pack_dataset(config(inputs, packed_demo_tokenizer, tmp_path / "whole"))
    out = tmp_path / "out"
    work = crashed(inputs, packed_demo_tokenizer, out, monkeypatch)
    unit = sorted(p.parent for p in work.glob("*/unit.json"))[1]
    (unit / "unit.json").write_text(text)
    result = pack_dataset(config(inputs, packed_demo_tokenizer, out, resume=True))
    assert result.manifest["engine"]["units_reused"] == 7
    assert f"--resume: unit {unit.name} is redone (its unit.json cannot be read)" in (
        result.warnings
    )
    assert output_digests(out) == output_digests(tmp_path / "whole")


def test_an_unreadable_job_record_starts_afresh(
    inputs, packed_demo_tokenizer, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    work = crashed(inputs, packed_demo_tokenizer, out, monkeypatch)
    (work / "job.json").write_text(json.dumps([1, 2]))
    result = pack_dataset(config(inputs, packed_demo_tokenizer, out, resume=True))
    assert result.manifest["engine"]["units_reused"] == 0
