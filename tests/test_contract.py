"""The packed contract, pinned: fixture packs whose decoded columns and bytes must not move.

The fixture (``tests/fixtures/contract``, see its README) is the demo chats plus hand-built edge
records and a committed tokenizer whose ids run above 65,535.  Each pack of
:data:`~tests.helpers.FIXTURE_PACKS` (every strategy and overlong policy, and the template of
the tokenizer's config) is packed afresh and compared with ``pins.json``:

* the decoded columns, per row: ``cu_seqlens`` and ``example_ids`` as stored and one digest per
  segment of ``input_ids``, ``labels`` and ``position_ids``, so a library release that moves a
  seam fails with the column, the row and the segment it moved;
* the file bytes of the shards and the examples index, which packshard promises identical for
  the same inputs, options and versions.  An additive format change (a new column, a new
  config key, hence another dataset id in the Parquet metadata) or a new pyarrow moves these
  and not the decoded columns.

A moved pin that is intended is re-pinned with ``make repin`` (``scripts/repin_fixtures.py``).
The same tests run against the newest releases with ``make test-latest``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packshard.digests import sha256_path
from packshard.records import IGNORE_INDEX
from tests.helpers import (
    FIXTURE_FILES,
    FIXTURE_PACKS,
    FIXTURES,
    PINS,
    compare_decoded,
    compare_files,
    decoded_pins,
    example_places,
    pack_fixture,
    pin_failure,
    segment_digest,
)

PACKS = list(FIXTURE_PACKS)


@pytest.fixture(scope="module")
def pins() -> dict:
    return json.loads(PINS.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory):
    """Pack ``name`` once per module: ``packed(name)`` is its output folder."""
    root = tmp_path_factory.mktemp("contract")
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            done[name] = pack_fixture(name, root / name)
        return done[name]

    return get


def test_the_fixture_files_are_the_pinned_ones(pins):
    assert list(pins["fixtures"]) == list(FIXTURE_FILES)
    changed = [n for n in FIXTURE_FILES if sha256_path(FIXTURES / n) != pins["fixtures"][n]]
    assert not changed, f"fixture files changed since pinning: {changed} (re-pin: make repin)"


def test_the_pins_cover_every_strategy_and_overlong_policy(pins):
    assert list(pins["packs"]) == PACKS
    combos = {(o["strategy"], o["overlong"]) for o in FIXTURE_PACKS.values()}
    for strategy in ("bfd", "ffd"):
        assert {(strategy, p) for p in ("drop", "truncate", "split")} <= combos
    assert ("wrapped", "split") in combos  # wrapped splits at row ends whatever --overlong says
    assert PINS.stat().st_size < 100_000
    committed = sum((FIXTURES / n).stat().st_size for n in FIXTURE_FILES)
    assert committed + PINS.stat().st_size < 250_000


def test_the_pins_were_made_with_the_dev_environments_versions(pins):
    """constraints-dev.txt pins the dev environment; the pins must come from those versions."""
    lines = (FIXTURES.parents[2] / "constraints-dev.txt").read_text().splitlines()
    dev = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    for name, made_with in pins["made_with"]["libraries"].items():
        assert dev.get(name) == made_with, (
            f"constraints-dev.txt: {name} {dev.get(name)}, but pins.json was made with "
            f"{made_with} (after raising a version there, run `make install` and `make repin`)"
        )


@pytest.mark.parametrize("name", PACKS)
def test_decoded_columns_hold(name, pins, packed):
    out = packed(name)
    problems = compare_decoded(pins["packs"][name], decoded_pins(out), example_places(out))
    assert not problems, pin_failure("decoded columns", name, problems, pins["made_with"])


@pytest.mark.parametrize("name", PACKS)
def test_file_bytes_hold(name, pins, packed):
    out = packed(name)
    got = decoded_pins(out)
    problems = compare_files(pins["packs"][name]["files"], got["files"])
    note = ""
    if problems:
        held = not compare_decoded(pins["packs"][name], got, example_places(out))
        note = (
            "the decoded columns still hold: an additive format change (a new column, a new "
            "config key and so another dataset id) or another pyarrow writes these bytes"
            if held
            else "the decoded columns moved too (see test_decoded_columns_hold)"
        )
    assert not problems, pin_failure("file bytes", name, problems, pins["made_with"], note)


def test_the_fixture_packs_hold_the_edge_cases(packed):
    """What the fixture is for: high ids, seams on a row's last token, parts, truncation."""
    for name in PACKS:
        out = packed(name)
        manifest = json.loads((out / "manifest.json").read_text())
        tables = [pq.read_table(out / s["path"]) for s in manifest["shards"]]
        ids = np.concatenate([t["input_ids"].combine_chunks().values.to_numpy() for t in tables])
        assert ids.max() >= 100_000 and (ids > 65_535).mean() > 0.3, name
        index = pq.read_table(out / "examples.parquet").to_pydict()
        places = {(s, line) for s, line in zip(index["source"], index["line"], strict=True)}
        # multi-turn, 128 tokens exactly, non-ASCII text, prompt/completion, alpaca, tools
        policy = FIXTURE_PACKS[name]["overlong"]
        lines = {1, 5, 8, 9, 10, 14}
        # longer: two tool records, a long answer, 129 tokens, non-ASCII chat
        lines |= {"drop": set(), "truncate": {3, 4, 6, 7}, "split": {2, 3, 4, 6, 7}}[policy]
        assert lines <= {line for src, line in places if src == "edge.jsonl"}, name
        rejects = (out / "rejects.jsonl").read_text()
        assert '"line": 12' in rejects and '"line": 13' in rejects, name
        # a row whose last token closes a trained segment: the seam on the last token
        full = [
            (t["labels"][r].as_py()[-1], t["num_tokens"][r].as_py())
            for t in tables
            for r in range(t.num_rows)
        ]
        assert any(n == 128 and last != IGNORE_INDEX for last, n in full), name
        stats = manifest["stats"]
        if policy == "split":
            assert stats["split"] >= 5 and max(index["part"]) >= 2, name
        if policy == "truncate":
            assert stats["truncated"] >= 5, name
        if policy == "drop":
            assert stats["rejects_by_code"]["too_long"] >= 5, name


def _rewrite_labels(path: Path, row: int, position: int, value: int) -> None:
    """Rewrite one label of a shard, keeping its schema and packshard metadata."""
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[row]["labels"][position] = value
    fixed = pa.Table.from_pylist(rows, schema=table.schema)
    pq.write_table(fixed, path, compression="zstd", use_dictionary=False)


def test_a_perturbed_seam_label_is_named_by_column_row_and_segment(pins, tmp_path):
    name = "bfd-split"
    out = pack_fixture(name, tmp_path / name)
    pinned = pins["packs"][name]
    entry = next(r for r in pinned["rows"] if len(r["example_ids"]) >= 2)
    shard, row = entry["at"].split(" row ")
    lo, hi = entry["cu_seqlens"][1], entry["cu_seqlens"][2]
    table = pq.read_table(out / shard)
    ids = table["input_ids"][int(row)].as_py()
    labels = table["labels"][int(row)].as_py()
    assert labels[lo] == IGNORE_INDEX  # a segment's first label never trains
    _rewrite_labels(out / shard, int(row), lo, ids[lo])  # now it trains across the seam
    labels[lo] = ids[lo]
    got = decoded_pins(out)
    problems = compare_decoded(pinned, got, example_places(out))
    eid = entry["example_ids"][1]
    place = example_places(out)[eid]
    digest = segment_digest(np.asarray(labels[lo:hi]))
    expected = (
        f"labels: {shard} row {row} segment 1 (example {eid}, {place}, tokens {lo}..{hi - 1}): "
        f"digest {digest}, pinned {entry['labels'].split()[1]}"
    )
    assert problems == [expected]
    message = pin_failure("decoded columns", name, problems, pins["made_with"])
    assert message.startswith(f"fixture pack {name}: decoded columns moved (1 difference); ")
    assert message.endswith("\n  " + expected)


def test_a_moved_seam_is_named_by_its_segment_end(pins):
    pinned = pins["packs"]["bfd-drop"]
    rows = [dict(r) for r in pinned["rows"]]
    k = next(i for i, r in enumerate(rows) if len(r["example_ids"]) >= 2)
    moved = list(rows[k]["cu_seqlens"])
    moved[1] += 1
    rows[k] = {**rows[k], "cu_seqlens": moved}
    problems = compare_decoded(pinned, {**pinned, "rows": rows}, {})
    assert problems == [
        f"cu_seqlens: {rows[k]['at']} segment 0 ends at {moved[1]}, pinned {moved[1] - 1} "
        f"(cu_seqlens {moved}, pinned {pinned['rows'][k]['cu_seqlens']})"
    ]


def test_changed_bytes_are_named_per_file():
    assert compare_files({"a.parquet": "1" * 64, "b": "2" * 64}, {"a.parquet": "3" * 64}) == [
        f"a.parquet: SHA-256 {'3' * 16}, pinned {'1' * 16}",
        f"b: SHA-256 absent, pinned {'2' * 16}",
    ]


# --- the same fixture through transformers, and through the model check -----------------------


@pytest.mark.torch
@pytest.mark.parametrize("spec", ["chatml", None])
def test_fixture_ids_and_labels_match_transformers(spec):
    """``apply_chat_template`` gives our ids for every fixture chat; with generation blocks its
    assistant mask is our labels."""
    transformers = pytest.importorskip("transformers")
    from packshard.errors import RecordError
    from packshard.ingest.label.spans import render_example
    from packshard.ingest.normalize import normalize_record
    from packshard.ingest.read.sources import expand_inputs, read_records
    from packshard.ingest.template.render import load_template
    from packshard.ingest.tokens.labels import encode_rendered
    from packshard.ingest.tokens.tokenizer import load_tokenizer

    folder = FIXTURES / "tokenizer"
    bundle = load_tokenizer(str(folder))
    template = load_template(spec, bundle)
    assert template is not None
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    checked = 0
    for f in expand_inputs([str(FIXTURES / n) for n in ("demo_chat.jsonl", "edge.jsonl")]):
        for raw in read_records(f):
            if raw.error is not None:
                continue
            try:
                conv = normalize_record(raw)
            except RecordError:
                continue
            if not conv.is_chat:
                continue
            messages = [
                {"role": m.role, "content": m.content, **dict(m.extra)} for m in conv.messages
            ]
            rendered = render_example(conv, template, bundle, "auto")
            ids, labels, _ = encode_rendered(bundle, [rendered])
            out = hf.apply_chat_template(
                messages,
                tools=list(conv.tools) if conv.tools else None,
                chat_template=template.text,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=template.has_generation,
            )
            assert ids.tolist() == list(out["input_ids"]), conv.ref
            if template.has_generation:
                mask = np.asarray(out["assistant_masks"], dtype=bool)
                np.testing.assert_array_equal(labels != IGNORE_INDEX, mask, err_msg=str(conv.ref))
            checked += 1
    assert checked == 71  # 62 demo chats and 9 edge ones (no text, no plain completion)


@pytest.mark.torch
def test_a_fixture_pack_is_the_same_packed_and_alone(packed, torch_one_thread):
    pytest.importorskip("transformers")
    from packshard.verify.model.equivalence import DEFAULT_ATOL
    from packshard.verify.run import VerifyOptions, verify_dataset

    report = verify_dataset(packed("wrapped"), VerifyOptions(model_rows=4))
    assert report.ok, [str(f) for f in report.findings.items]
    model = report.checks["model"]
    assert model["status"] == "passed" and model["atol"] == DEFAULT_ATOL == 1e-4
    assert model["max_logit_delta"] < DEFAULT_ATOL and model["control_detected"] is True
    assert report.environment["tolerance"]["atol"] == DEFAULT_ATOL
