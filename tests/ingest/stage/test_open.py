"""``pack``, ``profile`` and ``verify`` open the stage in one place, with the same checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from packshard.demo import demo_data_path
from packshard.errors import TemplateError, UsageError
from packshard.ingest import expand_inputs, open_stage
from packshard.ingest.stage import open as stage_open
from packshard.ingest.types import IngestOptions
from packshard.pack import PackConfig, pack_dataset
from packshard.profile import ProfileConfig, profile_inputs
from packshard.verify import VerifyOptions, verify_dataset


def _spied(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each check ``open_stage`` runs, by name, in order."""
    calls: list[str] = []
    for name in ("check_markers", "check_forced"):
        real = getattr(stage_open, name)

        def spy(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(stage_open, name, spy)
    return calls


def test_the_three_commands_run_the_same_checks_once(
    demo_tokenizer: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _spied(monkeypatch)
    data = str(demo_data_path())
    config = PackConfig.build(
        inputs=(data,),
        tokenizer=str(demo_tokenizer),
        template="chatml",
        out=str(tmp_path / "out"),
        max_seq_len=256,
    )
    pack_dataset(config)
    assert calls == ["check_markers", "check_forced"]
    profile_inputs(
        expand_inputs([data]), ProfileConfig((data,), str(demo_tokenizer), 256, template="chatml")
    )
    assert calls == ["check_markers", "check_forced"] * 2
    report = verify_dataset(tmp_path / "out", VerifyOptions(model="none"))
    assert report.checks["source"]["status"] == "passed"
    assert calls == ["check_markers", "check_forced"] * 3


def test_a_split_marker_stops_the_stage_unless_allowed(shared_data: Path) -> None:
    phi3 = str(shared_data / "tokenizers" / "phi-3-mini")
    with pytest.raises(TemplateError, match="writes <\\|im_end\\|>"):
        open_stage(phi3, "chatml", IngestOptions())
    stage = open_stage(phi3, "chatml", IngestOptions(), allow_split_markers=True)
    assert stage.template is not None and stage.template.source == "builtin:chatml"


def test_a_forced_fast_backend_is_checked_before_any_record(
    demo_tokenizer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("packshard.ingest.tokens.backends.libraries", lambda bundle: ())
    with pytest.raises(UsageError, match="--backend fast: fastokens is not installed"):
        open_stage(str(demo_tokenizer), None, IngestOptions(backend="fast"))
    assert open_stage(str(demo_tokenizer), None, IngestOptions(backend="auto")).bundle


def test_the_manifest_entries_come_from_the_stage(demo_tokenizer: Path) -> None:
    stage = open_stage(str(demo_tokenizer), "chatml", IngestOptions(loss="all"))
    entries = stage.entries()
    assert entries.tokenizer["sha256"] == stage.bundle.sha256
    assert entries.tokenizer["resolved"] == str(Path(stage.bundle.path).resolve())
    assert stage.template is not None
    assert entries.template["sha256"] == stage.template.sha256
    assert entries.template["label_spans"] == "none"  # loss all trains every token
    assert entries.backends["render"]["name"] == "jinja2"
