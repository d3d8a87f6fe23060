"""The workers' fork server starts early for local workers only, with pack's own warm-up;
the inputs are listed there once and the pipeline reuses the listing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from packshard.engine import WarmUp, base
from packshard.errors import UsageError
from packshard.ingest.read.inputs import expand_inputs
from packshard.pack.config import PackConfig
from packshard.pack.units import early
from packshard.pack.units.early import (
    EARLY,
    MAP_MODULE,
    WARM_FUNCTION,
    ListedInputs,
    list_inputs,
    start_early,
    warm_up,
)


@pytest.fixture
def started(monkeypatch) -> list:
    calls: list = []
    monkeypatch.setattr(
        "packshard.engine.local.start_fork_server", lambda *args: calls.append(args)
    )
    return calls


def config(data: Path, **options) -> PackConfig:
    return PackConfig.build(
        inputs=(str(data),),
        tokenizer=options.pop("tokenizer", "tok"),
        out=str(data.parent / "out"),
        max_seq_len=64,
        **options,
    )  # type: ignore[arg-type]


def test_the_warm_up_names_functions_that_exist() -> None:
    from packshard.ingest.stage.loaded import load_early
    from packshard.pack.units.map import warm_worker

    assert (warm_worker.__module__, warm_worker.__name__) == (MAP_MODULE, WARM_FUNCTION)
    assert (load_early.__module__, load_early.__name__) == EARLY


def test_only_several_local_workers_start_a_fork_server(tmp_path, started, monkeypatch) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hi"}\n' * 50)
    start_early(config(data, workers=1))
    start_early(config(data, workers=None))  # auto: 750 bytes are one worker's worth
    start_early(config(data, engine="ray", workers=4))
    start_early(config(tmp_path / "missing.jsonl", workers=None))  # pack names it later
    assert started == []
    start_early(config(data, workers=2, template="chatml"))
    assert started == [(WarmUp(MAP_MODULE, WARM_FUNCTION, ("tok", "chatml", "auto", True), EARLY),)]
    monkeypatch.setattr(base, "AUTO_BYTES", 100)
    monkeypatch.setattr(base, "usable_cores", lambda: 4)
    start_early(config(data, workers=None))  # auto sized as pack sizes it: more than one
    assert len(started) == 2
    assert warm_up(config(data)).arg == ("tok", None, "auto", False)  # not sized yet


def test_the_listing_names_train_and_eval_files_and_their_bytes(tmp_path, started) -> None:
    data, held = tmp_path / "d.jsonl", tmp_path / "held.jsonl"
    data.write_text('{"text": "hi"}\n' * 50)
    held.write_text('{"text": "eval"}\n')
    listed = start_early(config(data, workers=1, eval_inputs=(str(held),)))
    assert listed == list_inputs(config(data, eval_inputs=(str(held),)))
    assert listed == ListedInputs(
        tuple(expand_inputs([str(data)])), tuple(expand_inputs([str(held)])), 750 + 17
    )
    assert [f.path for f in listed.files] == [str(data), str(held)]
    assert start_early(config(tmp_path / "missing.jsonl", workers=1)) is None


def test_pack_lists_its_inputs_once_and_packs_what_was_listed(
    tmp_path, demo_tokenizer, monkeypatch
) -> None:
    from packshard.cli.commands import main
    from packshard.pack import pack_dataset

    for k in range(3):
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f"p{k}.jsonl").write_text(f'{{"text": "record {k}"}}\n')
    calls: list = []

    def counted(specs, fetch=True):
        calls.append(tuple(specs))
        return expand_inputs(specs, fetch)

    monkeypatch.setattr(early, "expand_inputs", counted)
    out = tmp_path / "out"
    args = ["pack", str(tmp_path / "in"), "-t", str(demo_tokenizer), "--max-seq-len", "64"]
    result = CliRunner().invoke(main, [*args, "-o", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert calls == [(str(tmp_path / "in"),)]  # the listing the fork server was sized by
    # the control: the pipeline packs the listing it is handed, not a listing of its own
    cfg = config(tmp_path / "in", tokenizer=str(demo_tokenizer))
    listed = list_inputs(cfg)
    one = ListedInputs(listed.train[:1], (), listed.size)
    packed = pack_dataset(replace(cfg, out=str(tmp_path / "one")), inputs=one)
    assert [i["path"] for i in packed.manifest["inputs"]] == [listed.train[0].path]
    assert packed.manifest["stats"]["records"] == 1


def test_an_eval_input_that_is_a_training_input_is_refused_once_listed(tmp_path) -> None:
    from packshard.pack import pack_dataset

    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hi"}\n')
    cfg = config(data, tokenizer="tok", eval_inputs=(str(data),))
    with pytest.raises(UsageError, match="is both a training input and an --eval input"):
        pack_dataset(cfg, inputs=list_inputs(cfg))


def test_the_small_job_is_decided_from_the_listed_bytes(tmp_path, monkeypatch) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hi"}\n' * 50)  # 750 bytes
    listed = list_inputs(config(data))
    assert listed.size == 750 and not config(data).ingest.small_job
    small = early.sized_config(config(data, workers=None), listed)
    assert small.ingest.small_job and small.engine.workers == 1
    assert warm_up(small).arg == ("tok", None, "auto", True)
    monkeypatch.setattr(early, "SMALL_JOB_BYTES", 750)  # at the line: not small
    assert not early.sized_config(config(data, workers=3), listed).ingest.small_job
