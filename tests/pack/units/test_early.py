"""The workers' fork server starts early for local workers only, with pack's own warm-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from packshard.engine import WarmUp, base
from packshard.pack.config import PackConfig
from packshard.pack.units.early import EARLY, MAP_MODULE, WARM_FUNCTION, start_early, warm_up


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
        tokenizer="tok",
        out=str(data.parent / "out"),
        max_seq_len=64,
        **options,
    )  # type: ignore[arg-type]


def test_the_warm_up_names_functions_that_exist() -> None:
    from packshard.ingest.loaded import load_early
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
    assert started == [(WarmUp(MAP_MODULE, WARM_FUNCTION, ("tok", "chatml", "auto"), EARLY),)]
    monkeypatch.setattr(base, "AUTO_BYTES", 100)
    monkeypatch.setattr(base, "usable_cores", lambda: 4)
    start_early(config(data, workers=None))  # auto sized as pack sizes it: more than one
    assert len(started) == 2
    assert warm_up(config(data)).arg == ("tok", None, "auto")
