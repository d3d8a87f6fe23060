"""The command line's defaults are the library's: a config built from the options left out
equals the config the library builds from the required values alone."""

from __future__ import annotations

import dataclasses
from typing import Any

from packshard.cli.commands import main
from packshard.pack.config import PackConfig
from packshard.profile.config import ProfileConfig
from packshard.verify.run import VerifyOptions


def _given(command: str, args: list[str]) -> dict[str, Any]:
    """The keyword arguments click hands ``command`` for ``args`` (defaults filled, converted)."""
    ctx = main.commands[command].make_context(command, args)
    return dict(ctx.params)


def _differences(a: Any, b: Any, at: str = "") -> dict[str, tuple[Any, Any]]:
    """Every field of two configs that differs, by dotted name (nested dataclasses opened)."""
    if dataclasses.is_dataclass(a) and type(a) is type(b):
        out: dict[str, tuple[Any, Any]] = {}
        for f in dataclasses.fields(a):
            out |= _differences(getattr(a, f.name), getattr(b, f.name), f"{at}{f.name}.")
        return out
    return {} if a == b else {at.rstrip("."): (a, b)}


REQUIRED = ["in.jsonl", "-t", "tok", "--max-seq-len", "64"]
CLI_ONLY = {"engine.workers": (None, 1)}
"""Where the command line's default is deliberately not the library's: ``--workers auto``
(sized by the inputs' bytes) against the library's one worker."""


def test_pack_defaults_are_the_configs() -> None:
    given = _given("pack", [*REQUIRED, "-o", "out"])
    for name in ("progress", "quiet", "max_reject_rate"):  # the command's own, not the config's
        given.pop(name)
    cli = PackConfig.build(inputs=given.pop("data"), format=given.pop("fmt"), **given)
    library = PackConfig.build(inputs=("in.jsonl",), tokenizer="tok", out="out", max_seq_len=64)
    assert _differences(cli, library) == CLI_ONLY


def test_profile_defaults_are_the_configs() -> None:
    given = _given("profile", REQUIRED)
    for name in ("progress", "json_path", "html_path", "max_reject_rate", "quiet"):
        given.pop(name)
    given.pop("allow_split_markers")  # a check the command runs (open_stage), not a config field
    cli = ProfileConfig.build(inputs=given.pop("data"), **given)
    library = ProfileConfig.build(inputs=("in.jsonl",), tokenizer="tok", max_seq_len=64)
    assert _differences(cli, library) == CLI_ONLY


def test_verify_defaults_are_the_options() -> None:
    given = _given("verify", ["out"])
    given.pop("out"), given.pop("json_path")
    cli = VerifyOptions(progress=bool(given.pop("progress")), **given)
    assert _differences(cli, VerifyOptions()) == {"workers": (None, 1)}


def test_the_comparison_sees_a_changed_default() -> None:
    """The control: a config whose one field moved is found, nested or not."""
    base = PackConfig.build(inputs=("a",), tokenizer="t", out="o", max_seq_len=64)
    moved = dataclasses.replace(base, plan=dataclasses.replace(base.plan, seed=7))
    assert _differences(moved, base) == {"plan.seed": (7, 0)}
