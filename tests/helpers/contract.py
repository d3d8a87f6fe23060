"""The fixture packs and their pins (tests/test_contract.py, tests/fixtures/contract)."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

from tests.helpers.paths import REPO

# --- fixture packs and their pins (see tests/test_contract.py and tests/fixtures/contract) ------

FIXTURES = REPO / "tests" / "fixtures" / "contract"
PINS = FIXTURES / "pins.json"
FIXTURE_FILES = (
    "demo_chat.jsonl",
    "edge.jsonl",
    "tokenizer/tokenizer.json",
    "tokenizer/tokenizer_config.json",
)
FIXTURE_INPUTS = ("demo_chat.jsonl", "edge.jsonl")
FIXTURE_OPTIONS: dict[str, Any] = {"max_seq_len": 128, "shard_rows": 8, "template": "chatml"}
FIXTURE_PACKS: dict[str, dict[str, Any]] = {
    "bfd-drop": {"strategy": "bfd", "overlong": "drop"},
    "bfd-truncate": {"strategy": "bfd", "overlong": "truncate"},
    "bfd-split": {"strategy": "bfd", "overlong": "split"},
    "ffd-drop": {"strategy": "ffd", "overlong": "drop"},
    "ffd-truncate": {"strategy": "ffd", "overlong": "truncate"},
    "ffd-split": {"strategy": "ffd", "overlong": "split"},
    # wrapped cuts every example at row ends: --overlong does not apply (recorded as split)
    "wrapped": {"strategy": "wrapped", "overlong": "split"},
    # the template of tokenizer_config.json: no generation blocks, labels from character spans
    "bfd-split-config-template": {"strategy": "bfd", "overlong": "split", "template": None},
}
SEGMENT_COLUMNS = ("input_ids", "labels", "position_ids")  # one digest per segment
ROW_COLUMNS = ("cu_seqlens", "example_ids")  # kept as they are: they name the segments
REPIN = "make repin"


def pack_fixture(name: str, out: Path) -> Path:
    """Pack the fixture inputs with pack ``name``'s options into ``out``.

    Runs from the fixture folder with relative paths, so the examples index (which records
    each input as given) is the same bytes wherever the repository lies.
    """
    from packshard.pack import PackConfig, pack_dataset

    options = {**FIXTURE_OPTIONS, **FIXTURE_PACKS[name]}
    config = PackConfig.build(inputs=FIXTURE_INPUTS, tokenizer="tokenizer", out=str(out), **options)
    before = Path.cwd()
    os.chdir(FIXTURES)
    try:
        pack_dataset(config)
    finally:
        os.chdir(before)
    return out


def segment_digest(values: np.ndarray) -> str:
    """Eight hex digits of SHA-256 over the values as little-endian int64 (any stored dtype)."""
    return hashlib.sha256(np.asarray(values, dtype="<i8").tobytes()).hexdigest()[:8]


def decoded_pins(out: Path) -> dict[str, Any]:
    """What the pins hold of a pack: per row the segment map and per-segment digests.

    ``rows``: one entry per stored row in shard order, ``at`` (``shard-00000.parquet row 3``),
    ``cu_seqlens`` and ``example_ids`` as stored, and for each of :data:`SEGMENT_COLUMNS` the
    space-separated digests of its segments; ``rejects``: ``source:line code`` of each line of
    rejects.jsonl; ``files``: SHA-256 of the shards and the examples index.
    """
    import pyarrow.parquet as pq

    from packshard.digests import sha256_path

    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    rows: list[dict[str, Any]] = []
    for entry in manifest["shards"]:
        table = pq.read_table(out / entry["path"])
        cells = {}
        for column in (*ROW_COLUMNS, *SEGMENT_COLUMNS):
            lists = table[column].combine_chunks()
            offsets = np.asarray(lists.offsets, dtype=np.int64)
            values = np.asarray(lists.values, dtype=np.int64)
            cells[column] = [values[a:b] for a, b in itertools.pairwise(offsets)]
        for r in range(table.num_rows):
            cu = cells["cu_seqlens"][r]
            row: dict[str, Any] = {"at": f"{entry['path']} row {r}"}
            row.update({c: [int(v) for v in cells[c][r]] for c in ROW_COLUMNS})
            for column in SEGMENT_COLUMNS:
                values = cells[column][r]
                digests = (segment_digest(values[a:b]) for a, b in itertools.pairwise(cu))
                row[column] = " ".join(digests)
            rows.append(row)
    rejects = [
        f"{r['source']}:{r['line']} {r['code']}"
        for r in map(json.loads, (out / "rejects.jsonl").read_text(encoding="utf-8").splitlines())
    ]
    files = {s["path"]: s["sha256"] for s in manifest["shards"]}
    files["examples.parquet"] = sha256_path(out / "examples.parquet")
    return {"rows": rows, "rejects": rejects, "files": files}


def example_places(out: Path) -> dict[int, str]:
    """``example_id`` → ``source:line part P`` from a pack's examples index."""
    import pyarrow.parquet as pq

    index = pq.read_table(out / "examples.parquet").to_pydict()
    return {
        eid: f"{src}:{line} part {part}"
        for eid, src, line, part in zip(
            index["example_id"], index["source"], index["line"], index["part"], strict=True
        )
    }


def compare_decoded(
    pinned: dict[str, Any], got: dict[str, Any], places: dict[int, str]
) -> list[str]:
    """One line per difference of the decoded columns, naming column, row and segment."""
    problems: list[str] = []
    if len(got["rows"]) != len(pinned["rows"]):
        problems.append(f"rows: {len(got['rows'])} stored, pinned {len(pinned['rows'])}")
    for want, have in zip(pinned["rows"], got["rows"], strict=False):
        where = have["at"]
        if want["at"] != where:
            problems.append(f"rows: {where} holds what was pinned at {want['at']}")
        cu, cu_pinned = have["cu_seqlens"], want["cu_seqlens"]
        same = len(cu) - 1
        if cu != cu_pinned:
            k = next(
                (i for i, (a, b) in enumerate(zip(cu, cu_pinned, strict=False)) if a != b),
                min(len(cu), len(cu_pinned)),
            )
            end = cu[k] if k < len(cu) else "nowhere"
            end_pinned = cu_pinned[k] if k < len(cu_pinned) else "nowhere"
            problems.append(
                f"cu_seqlens: {where} segment {k - 1} ends at {end}, pinned {end_pinned} "
                f"(cu_seqlens {cu}, pinned {cu_pinned})"
            )
            same = k - 1
        ids, ids_pinned = have["example_ids"], want["example_ids"]
        for s, (a, b) in enumerate(zip(ids, ids_pinned, strict=False)):
            if a != b:
                problems.append(f"example_ids: {where} segment {s} holds example {a}, pinned {b}")
                break
        for column in SEGMENT_COLUMNS:
            digests, digests_pinned = have[column].split(), want[column].split()
            for s in range(min(same, len(digests), len(digests_pinned))):
                if digests[s] != digests_pinned[s]:
                    eid = ids[s]
                    problems.append(
                        f"{column}: {where} segment {s} (example {eid}, "
                        f"{places.get(eid, 'not in the index')}, tokens {cu[s]}..{cu[s + 1] - 1}"
                        f"): digest {digests[s]}, pinned {digests_pinned[s]}"
                    )
    if got["rejects"] != pinned["rejects"]:
        gone = [r for r in pinned["rejects"] if r not in got["rejects"]]
        new = [r for r in got["rejects"] if r not in pinned["rejects"]]
        problems.append(f"rejects: new {new or 'none'}, no longer {gone or 'none'}")
    return problems


def compare_files(pinned: dict[str, str], got: dict[str, str]) -> list[str]:
    """One line per file whose SHA-256 differs from the pinned one."""
    return [
        f"{name}: SHA-256 {str(got.get(name, 'absent'))[:16]}, pinned "
        f"{str(pinned.get(name, 'absent'))[:16]}"
        for name in sorted(set(pinned) | set(got))
        if pinned.get(name) != got.get(name)
    ]


def pins_environment() -> dict[str, Any]:
    """The versions pins are made (and compared) with: packshard, Python and the libraries."""
    from packshard import __version__
    from packshard.format.environment import CONTENT_LIBRARIES, library_versions

    return {
        "packshard": __version__,
        "python": platform.python_version(),
        "libraries": library_versions((*CONTENT_LIBRARIES, "transformers")),
    }


def moved_versions(made_with: dict[str, Any]) -> list[str]:
    """``name pinned → now`` for each version that differs from the pins' (empty: none)."""
    now = pins_environment()
    moved = [
        f"{name} {made_with['libraries'].get(name)} → {version}"
        for name, version in now["libraries"].items()
        if made_with["libraries"].get(name) != version
    ]
    for key in ("packshard", "python"):
        if made_with.get(key) != now[key]:
            moved.append(f"{key} {made_with.get(key)} → {now[key]}")
    return moved


def pin_failure(
    what: str, name: str, problems: list[str], made_with: dict[str, Any], note: str = ""
) -> str:
    """The message of a moved pin: what moved, the versions that changed, how to re-pin.

    ``note`` (a line on what the differences mean) comes before the differences.
    """
    moved = moved_versions(made_with)
    versions = ", ".join(moved) if moved else "none (the code or the fixtures changed)"
    shown = problems[:20] + ([f"… and {len(problems) - 20} more"] if len(problems) > 20 else [])
    count = f"{len(problems)} difference{'' if len(problems) == 1 else 's'}"
    return (
        f"fixture pack {name}: {what} moved ({count}); versions changed since pinning: "
        f"{versions}. If the change is intended, run `{REPIN}` and say why in the commit.\n  "
        + "\n  ".join([note] * bool(note) + shown)
    )


def format_pins(pins: dict[str, Any]) -> str:
    """The pin file's text: indented JSON with one line per row, so diffs show rows."""
    packs = {}
    for name, pack in pins["packs"].items():
        packs[name] = {**pack, "rows": f"@rows:{name}@"}
    text = json.dumps({**pins, "packs": packs}, indent=2, ensure_ascii=False)
    for name, pack in pins["packs"].items():
        lines = ",\n".join("        " + json.dumps(row, ensure_ascii=False) for row in pack["rows"])
        text = text.replace(f'"@rows:{name}@"', "[\n" + lines + "\n      ]")
    return text + "\n"
