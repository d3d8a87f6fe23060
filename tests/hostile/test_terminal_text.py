"""Nothing a manifest or an input says reaches the terminal as a control character.

A manifest whose shard path carries an escape sequence, a carriage return and a newline
followed by verify's own success line cannot rewrite the screen: ``verify`` fails, and its
output holds the sequence escaped, on the finding's own line.  Rich's tables on a terminal
escape data the same way and keep only their own colours.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.table import Table
from rich.text import Text

from packshard.cli.errors import one_line, printable
from packshard.cli.tables import SafeConsole
from tests.hostile.test_out_folders import cli

FORGED = "\x1b[2K\r\u202eOK: every seam holds\n\x07"


def _forge(out: Path) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][0]["path"] = "shard-00000.parquet" + FORGED
    manifest["packshard_version"] = "0.1.0" + FORGED
    (out / "manifest.json").write_text(json.dumps(manifest))


def test_verify_prints_no_control_character_from_a_manifest(packed_demo_copy):
    _forge(packed_demo_copy)
    result = cli("verify", packed_demo_copy, "--model", "none", "--no-source")
    assert result.exit_code == 1
    for stream in (result.stdout, result.stderr):
        assert not any(printable(c) != c for c in stream), repr(stream)
        assert not [x for x in stream.splitlines() if x.startswith("OK: every seam holds")]
    assert "\\x1b[2K\\r\\u202eOK: every seam holds\\n\\x07" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("FAILED")


def test_inspect_and_errors_print_no_control_character(packed_demo_copy):
    manifest = json.loads((packed_demo_copy / "manifest.json").read_text())
    manifest["dataset_id"] = "x" + FORGED
    (packed_demo_copy / "manifest.json").write_text(json.dumps(manifest))
    result = cli("inspect", packed_demo_copy, "--row", "0")
    assert result.exit_code != 0
    assert result.stderr.count("\n") == 1
    assert not any(printable(c) != c for c in result.stderr.rstrip("\n")), repr(result.stderr)


def test_a_terminal_console_escapes_data_and_keeps_its_own_colours():
    sink = io.StringIO()
    screen = SafeConsole(file=sink, force_terminal=True, color_system="standard", width=120)
    table = Table("domain")
    table.add_row("chat" + FORGED.replace("\n", ""))
    screen.print(table, Text("done" + "\x1b]0;title\x07", style="red"))
    shown = sink.getvalue()
    assert "\x1b[2K" not in shown and "\x07" not in shown and "\r" not in shown
    assert "\\x1b[2K" in shown and "\\x1b]0;title" in shown  # (rich drops BEL and CR itself)
    assert "\x1b[31m" in shown  # the console's own colour for the red line


def test_one_line_escapes_newlines_and_every_control():
    assert one_line("a\nb\r\x1b[31mc\u2066") == "a\\nb\\r\\x1b[31mc\\u2066"
    assert printable("tab\tand\nnewline stay") == "tab\tand\nnewline stay"
