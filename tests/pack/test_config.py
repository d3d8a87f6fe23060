"""What pack is asked to do: options refused up front, warnings, the recorded config."""

from __future__ import annotations

import pytest

from packshard.errors import UsageError
from packshard.ingest.types import IngestOptions
from packshard.pack import PackConfig
from packshard.pack.config import check_config


def config(tmp_path, **options) -> PackConfig:
    settings = {"max_seq_len": 64, **options}
    return PackConfig.build(
        inputs=("a.jsonl",), tokenizer="tok", out=str(tmp_path / "out"), **settings
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_seq_len": 1}, "--max-seq-len 1 is too small (need at least 2)"),
        ({"strategy": "best"}, "--strategy 'best' is not one of bfd, ffd, sequential, wrapped"),
        ({"overlong": "wrap"}, "--overlong 'wrap' is not one of drop, truncate, split, error"),
        ({"compression": "lz4"}, "--compression 'lz4' is not one of zstd, snappy, none"),
        ({"on_error": "ignore"}, "--on-error 'ignore' is not one of skip, fail"),
        ({"format": "csv"}, "--format 'csv' is not one of auto, messages, sharegpt"),
        ({"loss": "most"}, "--loss 'most' is not one of auto, assistant, last_assistant"),
        ({"batch_size": 0}, "--batch-size must be at least 1, got 0"),
        ({"shard_rows": 0}, "--shard-rows and --shard-bytes must be positive"),
        ({"shard_bytes": 0}, "--shard-rows and --shard-bytes must be positive"),
    ],
)
def test_impossible_options_are_usage_errors(tmp_path, options, message):
    with pytest.raises(UsageError) as info:
        check_config(config(tmp_path, **options))
    assert str(info.value).startswith(message)


def test_out_must_be_new_or_empty_unless_overwritten(tmp_path):
    assert check_config(config(tmp_path)) == []  # does not exist yet
    (tmp_path / "out").mkdir()
    assert check_config(config(tmp_path)) == []  # empty
    (tmp_path / "out" / "x").write_text("mine")
    for overwrite in (False, True):  # never over a folder packshard did not write
        with pytest.raises(UsageError, match="output folder holds 'x' but no packshard manifest"):
            check_config(config(tmp_path, overwrite=overwrite))


def test_questionable_options_give_warnings(tmp_path):
    warnings = check_config(config(tmp_path, strategy="wrapped", overlong="truncate", loss="all"))
    assert warnings == [
        "--strategy wrapped splits every example at row ends; --overlong truncate does not "
        "apply (the manifest records overlong=split)"
    ]
    (chat,) = check_config(config(tmp_path, overlong="split"))
    assert chat.startswith("splitting chat examples: parts after the first lose their prompt")
    assert len(check_config(config(tmp_path, strategy="wrapped"))) == 1  # drop: no warning
    assert check_config(config(tmp_path, overlong="split", loss="all")) == []


def test_recorded_config_and_ingest_part(tmp_path):
    c = config(tmp_path, strategy="wrapped", overlong="drop", seed=3, batch_size=7, loss="all")
    assert c.recorded() == {
        "max_seq_len": 64,
        "strategy": "wrapped",
        "overlong": "split",  # what wrapped does whatever --overlong says
        "loss": "all",
        "position_ids": "reset",
        "seed": 3,
        "group_by_domain": False,
        "format": "auto",
        "domain_field": "domain",
        "compression": "zstd",
        "shard_rows": 8192,
        "shard_bytes": 256 * 1024 * 1024,
        "plan_scope": "global",
        "reasoning": "train",
        "empty_reasoning": "train",
        "turns": "as_rendered",
        "reasoning_markers": ["<think>", "</think>"],
    }
    assert config(tmp_path, overlong="truncate").recorded()["overlong"] == "truncate"
    assert c.ingest == IngestOptions(
        format="auto",
        domain_field="domain",
        loss="all",
        on_error="skip",
        batch_size=7,
        backend="auto",
    )


def test_each_option_is_spelled_once() -> None:
    from dataclasses import fields

    from packshard.engine import EngineOptions
    from packshard.pack.config import PlanOptions, ShardOptions

    parts = {"ingest", "plan", "shards", "engine"}
    own = [f.name for f in fields(PackConfig) if f.name not in parts]
    kinds = (IngestOptions, PlanOptions, ShardOptions, EngineOptions)
    names = own + [f.name for kind in kinds for f in fields(kind)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_build_puts_each_flat_keyword_in_its_part(tmp_path) -> None:
    c = PackConfig.build(
        inputs=("a.jsonl",), tokenizer="tok", out=str(tmp_path / "out"), max_seq_len=8,
        loss="all", shard_rows=3, engine="ray", workers=2, ray_address="host:1", overwrite=True,
    )  # fmt: skip
    assert (c.plan.max_seq_len, c.ingest.loss, c.shards.shard_rows) == (8, "all", 3)
    assert (c.engine.engine, c.engine.workers, c.engine.address) == ("ray", 2, "host:1")
    assert c.overwrite
    with pytest.raises(TypeError):
        PackConfig.build(inputs=(), tokenizer="tok", out="o", max_seq_len=8, nonsense=1)
