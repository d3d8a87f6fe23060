"""The error hierarchy, and which stage emits each registered reject code."""

from __future__ import annotations

from packshard.errors import (
    DROPPED,
    EXIT_DATA,
    EXIT_USAGE,
    REJECT_CODES,
    REJECTED,
    FormatError,
    PackshardError,
    RecordError,
    RejectCode,
    UsageError,
    reject_kind,
)

# Every code a stage emits: reading and normalizing, rendering, ingest, the overlong policy.
READ = {"invalid_json", "invalid_utf8", "not_an_object", "duplicate_key", "too_large", "unreadable"}
NORMALIZE = {
    "unknown_format",
    "missing_field",
    "empty_conversation",
    "invalid_message",
    "unknown_role",
    "invalid_content",
    "invalid_tools",
    "invalid_reasoning",
    "invalid_flag",
    "invalid_pair",
}
MEDIA = {"missing_media", "bad_media", "media_url", "media_mismatch", "video_unsupported"}
RENDER = {"no_assistant_turn", "template_error", "reasoning_dropped"}
INGEST = {"no_trainable_tokens", "identical_pair"}
POLICY = {
    "too_long",
    "truncated_no_targets",
    "split_no_targets",
    "mix_subsampled",
    "over_vision_cap",
}


def test_every_emitted_code_is_registered_once_with_its_kind() -> None:
    assert set(REJECT_CODES) == READ | NORMALIZE | MEDIA | RENDER | INGEST | POLICY
    assert len(REJECT_CODES) == 31
    for name, code in REJECT_CODES.items():
        assert isinstance(code, RejectCode) and code.name == name
        assert code.meaning and code.meaning == code.meaning.strip()
        assert reject_kind(name) == code.kind
    assert {n for n, c in REJECT_CODES.items() if c.kind == DROPPED} == POLICY
    assert {
        n for n, c in REJECT_CODES.items() if c.kind == REJECTED
    } == READ | NORMALIZE | MEDIA | RENDER | INGEST


def test_record_errors_are_placed_and_keep_their_code() -> None:
    err = RecordError("invalid_json", "invalid JSON: Expecting value", "a.jsonl", 4)
    assert str(err) == "a.jsonl:4: invalid JSON: Expecting value"
    moved = RecordError("too_long", "example is 9 tokens").at("b.jsonl", 12)
    assert (moved.code, moved.source, moved.line, str(moved)) == (
        "too_long",
        "b.jsonl",
        12,
        "b.jsonl:12: example is 9 tokens",
    )


def test_exit_codes_and_format_errors() -> None:
    assert UsageError("x").exit_code == EXIT_USAGE
    assert RecordError("invalid_json", "x").exit_code == EXIT_DATA
    err = FormatError("out/shard-00000.parquet", "unreadable Parquet: boom")
    assert isinstance(err, PackshardError) and err.exit_code == EXIT_DATA
    assert (err.path, err.problem) == ("out/shard-00000.parquet", "unreadable Parquet: boom")
    assert str(err) == "out/shard-00000.parquet: unreadable Parquet: boom"


def test_the_new_errors_exit_as_their_kind() -> None:
    from packshard.errors import NothingToPackError, OutputError

    assert NothingToPackError("nothing to pack").exit_code == EXIT_DATA
    assert isinstance(OutputError("out: locked"), UsageError)
    assert OutputError("out: locked").exit_code == EXIT_USAGE
