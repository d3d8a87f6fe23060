"""pack --help lists its options by theme, byte limits readable."""

from __future__ import annotations

from click.testing import CliRunner

from packshard.cli.commands import main, pack
from packshard.cli.sections import PACK_SECTIONS, human_bytes


def test_pack_help_is_grouped_by_theme():
    result = CliRunner().invoke(main, ["pack", "--help"], terminal_width=100)
    assert result.exit_code == 0
    text = result.output
    headings = [h for h in PACK_SECTIONS if f"\n{h}:\n" in text]
    assert headings == list(PACK_SECTIONS)
    assert "\nOptions:\n" not in text
    scale = text.split("Scale (processes, threads, work units):", 1)[1].split("\n\n", 1)[0]
    assert "--workers" in scale and "--num-workers" in scale
    assert "[default: 256 MiB]" in text and "[default: 16 MiB]" in text
    assert "[default: 64 GiB]" in text and "268435456" not in text


def test_every_pack_option_is_in_a_section():
    names = {p.name for p in pack.params if p.param_type_name == "option"} - {"help"}
    listed = [n for names_ in PACK_SECTIONS.values() for n in names_]
    assert sorted(listed) == sorted(names)


def test_human_bytes():
    assert human_bytes(256 << 20) == "256 MiB"
    assert human_bytes(64 << 30) == "64 GiB"
    assert human_bytes(1000) == "1,000 bytes"
