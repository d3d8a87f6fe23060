"""The corruption suite: a good packed folder passes, and every fault is caught and placed.

Each test corrupts a private copy of a real ``pack`` output (demo chats, demo tokenizer,
256-token rows, 4 rows per shard).  Shard faults rewrite the Parquet file with the fault but
leave the manifest's checksum alone, so the structural and source checks, not only the
checksum, must catch them; each test asserts the finding that names the place.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packshard.errors import ManifestError
from packshard.records import IGNORE_INDEX
from packshard.verify.findings import Finding
from packshard.verify.run import VerifyOptions, verify_dataset
from tests.helpers import pack_demo_into

FAST = VerifyOptions(model="none")
SHARD = "shard-00001.parquet"
LIST_COLUMNS = ("input_ids", "labels", "position_ids", "cu_seqlens", "example_ids")

Row = dict[str, Any]


def read_rows(path: Path) -> list[Row]:
    """Rows of a shard as dicts of numpy arrays (list columns) and ints."""
    rows = pq.read_table(path).to_pylist()
    for row in rows:
        for name in LIST_COLUMNS:
            row[name] = np.asarray(row[name], dtype=np.int64)
    return rows


def rewrite_shard(out: Path, name: str, edit: Callable[[list[Row]], None]) -> None:
    """Apply ``edit`` to the rows of ``out/name`` and write them back, same schema and metadata.

    The manifest is left untouched: its checksum now disagrees, as it would after a bug or
    a hand edit, and the other checks must find the fault itself.
    """
    path = out / name
    schema = pq.read_schema(path)
    rows = read_rows(path)
    edit(rows)
    for row in rows:
        for column in LIST_COLUMNS:
            row[column] = row[column].tolist()
    table = pa.Table.from_pylist(rows, schema=schema)
    assert table.schema.metadata == schema.metadata
    pq.write_table(table, path, compression="zstd", use_dictionary=False)


def refresh(row: Row) -> None:
    """Recompute a row's totals so only the injected fault is wrong."""
    row["num_tokens"] = len(row["input_ids"])
    row["num_loss_tokens"] = int((row["labels"] != IGNORE_INDEX).sum())
    row["max_seqlen"] = int(np.diff(row["cu_seqlens"]).max())


def index_source(out: Path, example_id: int) -> str:
    """``source:line`` of an example as the examples index records it."""
    for entry in pq.read_table(out / "examples.parquet").to_pylist():
        if entry["example_id"] == example_id:
            return f"{entry['source']}:{entry['line']}"
    raise AssertionError(f"example {example_id} not in the index")


def stored_row(out: Path, name: str, row: int) -> Row:
    return read_rows(out / name)[row]


def findings_of(report: Any, check: str) -> list[Finding]:
    return [f for f in report.findings.items if f.check == check]


def find(report: Any, check: str, text: str, **where: Any) -> Finding:
    """The first finding of ``check`` whose message contains ``text`` and whose place matches."""
    for f in findings_of(report, check):
        if text in f.message and all(getattr(f, k) == v for k, v in where.items()):
            return f
    listed = "\n".join(str(f) for f in report.findings.items)
    raise AssertionError(f"no [{check}] finding {text!r} at {where}; found:\n{listed}")


def assert_checksum_caught(report: Any, name: str = SHARD) -> None:
    find(report, "integrity", f"{name}: SHA-256 differs from the manifest")


# --- the good folder ------------------------------------------------------------------------


def test_good_folder_passes_every_check(packed_demo):
    report = verify_dataset(packed_demo, FAST)
    assert report.ok, [str(f) for f in report.findings.items]
    assert [report.checks[c]["status"] for c in ("integrity", "structure", "source")] == [
        "passed"
    ] * 3
    assert report.checks["source"]["examples_compared"] == 64
    assert report.checks["model"] == {"status": "skipped", "detail": "--model none"}
    manifest = json.loads((packed_demo / "manifest.json").read_text())
    assert len(report.seam_table) == manifest["stats"]["rows"] == 15
    first = report.seam_table[0]
    assert first == {
        "shard": "shard-00000.parquet",
        "row": 0,
        "segments": len(stored_row(packed_demo, "shard-00000.parquet", 0)["example_ids"]),
        "seams_checked": first["segments"] - 1,
        "max_logit_delta": None,
        "findings": 0,
    }
    total_segments = sum(e["segments"] for e in report.seam_table)
    assert total_segments == manifest["stats"]["examples"] == 64


# --- shard content faults -------------------------------------------------------------------


def test_unmasked_seam_label_is_caught_at_its_segment(packed_demo_copy):
    out = packed_demo_copy
    row = stored_row(out, SHARD, 0)
    start = int(row["cu_seqlens"][1])
    eid = int(row["example_ids"][1])

    def unmask(rows: list[Row]) -> None:
        rows[0]["labels"][start] = rows[0]["input_ids"][start]
        refresh(rows[0])

    rewrite_shard(out, SHARD, unmask)
    report = verify_dataset(out, FAST)
    assert report.ok is False
    assert_checksum_caught(report)
    f = find(report, "structure", "first label of the segment is not -100", shard=SHARD, row=0)
    assert (f.segment, f.example_id, f.source) == (1, eid, index_source(out, eid))
    find(report, "source", "labels differ", shard=SHARD, row=0, segment=1, example_id=eid)
    # shard 1 row 0 follows shard 0's four rows: one structural and one source finding
    assert report.seam_table[4]["findings"] == 2
    assert sum(e["findings"] for e in report.seam_table) == 2


def test_label_that_is_not_its_token_is_caught(packed_demo_copy):
    out = packed_demo_copy
    row = stored_row(out, SHARD, 1)
    lo, hi = int(row["cu_seqlens"][1]), int(row["cu_seqlens"][2])
    trained = lo + int(np.flatnonzero(row["labels"][lo:hi] != IGNORE_INDEX)[0])
    eid = int(row["example_ids"][1])

    def relabel(rows: list[Row]) -> None:
        rows[1]["labels"][trained] = (rows[1]["input_ids"][trained] + 1) % 1024

    rewrite_shard(out, SHARD, relabel)
    report = verify_dataset(out, FAST)
    assert report.ok is False
    f = find(report, "structure", "a label is neither -100 nor its own token", shard=SHARD, row=1)
    assert (f.segment, f.example_id, f.source) == (1, eid, index_source(out, eid))
    find(report, "source", "labels differ", row=1, segment=1, example_id=eid)


def test_position_not_reset_is_caught(packed_demo_copy):
    out = packed_demo_copy
    row = stored_row(out, SHARD, 1)
    eid = int(row["example_ids"][2])

    def continue_positions(rows: list[Row]) -> None:
        cu = rows[1]["cu_seqlens"]
        rows[1]["position_ids"][cu[2] : cu[3]] += cu[2]  # carries on from the previous segment

    rewrite_shard(out, SHARD, continue_positions)
    report = verify_dataset(out, FAST)
    assert report.ok is False
    assert_checksum_caught(report)
    f = find(report, "structure", "position_ids do not restart at 0", shard=SHARD, row=1)
    assert (f.segment, f.example_id, f.source) == (2, eid, index_source(out, eid))
    find(report, "source", "positions differ", row=1, segment=2, example_id=eid)


def test_cu_seqlens_off_by_one_is_caught(packed_demo_copy):
    out = packed_demo_copy
    row = stored_row(out, SHARD, 0)
    eid = int(row["example_ids"][1])

    def shift_boundary(rows: list[Row]) -> None:
        rows[0]["cu_seqlens"][1] += 1
        refresh(rows[0])

    rewrite_shard(out, SHARD, shift_boundary)
    report = verify_dataset(out, FAST)
    assert report.ok is False
    assert_checksum_caught(report)
    structure = [f for f in findings_of(report, "structure") if f.row == 0 and f.shard == SHARD]
    assert structure, "a moved boundary must be a structural finding"
    # The next segment now starts one token late: its first label is the real one.
    f = find(report, "structure", "position_ids do not restart", shard=SHARD, row=0)
    assert f.segment == 0
    f = find(report, "structure", "examples.parquet disagrees", shard=SHARD, row=0, segment=1)
    assert (f.example_id, f.source) == (eid, index_source(out, eid))


def test_two_tokens_swapped_across_a_seam_are_caught(packed_demo_copy):
    out = packed_demo_copy
    row = stored_row(out, SHARD, 0)
    seam = int(row["cu_seqlens"][1])
    before, after = (int(e) for e in row["example_ids"][:2])
    assert row["input_ids"][seam - 1] != row["input_ids"][seam]

    def swap(rows: list[Row]) -> None:
        ids = rows[0]["input_ids"]
        ids[seam - 1], ids[seam] = int(ids[seam]), int(ids[seam - 1])

    rewrite_shard(out, SHARD, swap)
    report = verify_dataset(out, FAST)
    assert report.ok is False
    assert_checksum_caught(report)
    for seg, eid in ((0, before), (1, after)):
        f = find(report, "source", "token ids differ", shard=SHARD, row=0, segment=seg)
        assert (f.example_id, f.source) == (eid, index_source(out, eid))


def test_duplicated_example_is_caught(packed_demo_copy):
    out = packed_demo_copy
    row = stored_row(out, SHARD, 0)
    eid = int(row["example_ids"][0])

    def duplicate_row(rows: list[Row]) -> None:
        rows.append({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in rows[0].items()})

    rewrite_shard(out, SHARD, duplicate_row)
    report = verify_dataset(out, FAST)
    assert report.ok is False
    assert_checksum_caught(report)
    f = find(report, "structure", "example appears more than once", example_id=eid)
    assert f.source == index_source(out, eid)
    find(report, "structure", "examples.parquet disagrees", shard=SHARD, row=4, segment=0)
    find(report, "integrity", f"{SHARD}: manifest says rows=4, shard has 5")


def test_missing_example_is_caught(packed_demo_copy):
    out = packed_demo_copy
    row = stored_row(out, SHARD, 1)
    eid = int(row["example_ids"][-1])

    def drop_last_segment(rows: list[Row]) -> None:
        r = rows[1]
        end = int(r["cu_seqlens"][-2])
        for name in ("input_ids", "labels", "position_ids"):
            r[name] = r[name][:end]
        r["cu_seqlens"] = r["cu_seqlens"][:-1]
        r["example_ids"] = r["example_ids"][:-1]
        refresh(r)

    rewrite_shard(out, SHARD, drop_last_segment)
    report = verify_dataset(out, FAST)
    assert report.ok is False
    assert_checksum_caught(report)
    f = find(report, "structure", "example listed in examples.parquet is in no row")
    assert (f.example_id, f.source) == (eid, index_source(out, eid))
    find(report, "source", "example id not found in its row", shard=SHARD, row=1, example_id=eid)


def test_orphan_examples_row_fails_the_structure_check(packed_demo_copy):
    """An index entry no row holds is a structural fault (it used to leave structure passed)."""
    out = packed_demo_copy
    path = out / "examples.parquet"
    table = pq.read_table(path)
    orphan = table.slice(0, 1).to_pylist()[0] | {"example_id": table.num_rows, "line": 999}
    extended = pa.concat_tables([table, pa.Table.from_pylist([orphan], schema=table.schema)])
    pq.write_table(extended, path)  # same schema, same packshard metadata
    report = verify_dataset(out, FAST)
    assert report.ok is False
    f = find(report, "structure", "example listed in examples.parquet is in no row")
    assert (f.example_id, f.source, f.shard, f.row) == (64, f"{orphan['source']}:999", None, None)
    assert report.checks["structure"]["status"] == "failed"
    assert report.checks["structure"]["findings"] == 1
    find(report, "integrity", "examples.parquet: SHA-256 differs from the manifest")
    find(report, "integrity", "examples.parquet has 65 rows, stats.examples=64")


def _with_dataset_id(path: Path, dataset_id: bytes) -> None:
    table = pq.read_table(path)
    meta = dict(table.schema.metadata) | {b"packshard.dataset_id": dataset_id}
    pq.write_table(table.replace_schema_metadata(meta), path, use_dictionary=False)


@pytest.mark.parametrize("name", ["shard-00000.parquet", "examples.parquet"])
def test_a_file_of_another_pack_is_named(packed_demo_copy, name):
    out = packed_demo_copy
    dataset_id = json.loads((out / "manifest.json").read_text())["dataset_id"]
    _with_dataset_id(out / name, b"0" * 32)
    report = verify_dataset(out, FAST)
    assert report.ok is False
    f = find(report, "integrity", f"{name}: packshard.dataset_id {'0' * 32} differs")
    assert f.message == (
        f"{name}: packshard.dataset_id {'0' * 32} differs from the manifest's {dataset_id} "
        "(the file belongs to another pack, or the folder was replaced while it was open)"
    )
    find(report, "integrity", f"{name}: SHA-256 differs from the manifest")
    assert report.checks["integrity"]["status"] == "failed"


def test_a_shard_without_packshard_metadata_is_named(packed_demo_copy):
    out = packed_demo_copy
    path = out / SHARD
    pq.write_table(pq.read_table(path).replace_schema_metadata(None), path, use_dictionary=False)
    report = verify_dataset(out, FAST)
    assert report.ok is False
    find(report, "integrity", f"{SHARD}: no packshard.format_version in its Parquet metadata")


def test_deleted_shard_is_caught(packed_demo_copy):
    out = packed_demo_copy
    os.remove(out / "shard-00002.parquet")
    report = verify_dataset(out, FAST)
    assert report.ok is False
    f = find(report, "integrity", "shard-00002.parquet: listed in the manifest but missing")
    assert f.shard is None
    assert report.checks["integrity"]["status"] == "failed"


def test_one_flipped_byte_is_caught(packed_demo_copy):
    out = packed_demo_copy
    path = out / SHARD
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    report = verify_dataset(out, FAST)
    assert report.ok is False
    assert_checksum_caught(report)
    assert report.checks["integrity"]["status"] == "failed"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda m: m["stats"].__setitem__("tokens", m["stats"]["tokens"] + 1),
            "manifest stats.tokens=3746 but its shards add up to 3745",
        ),
        (
            lambda m: m["shards"][1].__setitem__("rows", 5),
            "shard-00001.parquet: manifest says rows=5, shard has 4",
        ),
        (
            lambda m: m["stats"].__setitem__("rejected", 0),
            "counting rule broken: records=65 != records_packed 64 + rejected 0 + dropped 0 = 64",
        ),
        (
            lambda m: m["stats"].__setitem__("examples", 63),
            "examples.parquet has 64 rows, stats.examples=63",
        ),
    ],
    ids=["stats-tokens", "shard-rows", "rejected", "examples"],
)
def test_edited_manifest_counts_are_caught(packed_demo_copy, edit, message):
    out = packed_demo_copy
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    report = verify_dataset(out, FAST)
    assert report.ok is False
    find(report, "integrity", message)


def test_rejects_file_with_a_line_removed_is_caught(packed_demo_copy):
    out = packed_demo_copy
    reject = json.loads((out / "rejects.jsonl").read_text())
    assert (reject["line"], reject["code"]) == (18, "invalid_json")
    (out / "rejects.jsonl").write_text("")
    report = verify_dataset(out, FAST)
    assert report.ok is False
    find(report, "integrity", "rejects.jsonl: SHA-256 differs from the manifest")
    find(report, "integrity", "rejects.jsonl has 0 lines, manifest says rejected + dropped = 1")
    f = find(report, "source", "record rejected on re-ingest but not in rejects.jsonl")
    assert f.source == f"{reject['source']}:18"


def test_tokenizer_swapped_after_packing_is_caught(tmp_path, packed_demo_tokenizer, monkeypatch):
    import shutil

    import packshard.demo

    tok = Path(shutil.copytree(packed_demo_tokenizer, tmp_path / "tok"))
    out = pack_demo_into(tmp_path, tok)
    assert verify_dataset(out, FAST).ok
    monkeypatch.setattr(packshard.demo, "VOCAB_SIZE", 700)
    packshard.demo.build_demo_tokenizer(tok)  # another BPE over the same path
    report = verify_dataset(out, FAST)
    assert report.ok is False
    f = find(report, "source", "differs from")
    assert f.message.startswith(f"tokenizer {tok}: SHA-256 ")
    assert "recorded at pack time (a different tokenizer gives different ids)" in f.message
    assert report.checks["source"]["status"] == "failed"


def test_template_edited_after_packing_is_caught(tmp_path, packed_demo_tokenizer):
    from packshard.ingest.template.render import BUILTINS

    template = tmp_path / "chatml.jinja"
    template.write_text(BUILTINS["chatml"], encoding="utf-8")
    out = pack_demo_into(tmp_path, packed_demo_tokenizer, template=str(template))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["template"]["source"] == str(template)
    assert verify_dataset(out, FAST).ok
    template.write_text(BUILTINS["chatml"].replace("assistant", "Assistant"), encoding="utf-8")
    report = verify_dataset(out, FAST)
    assert report.ok is False
    f = find(report, "source", "the template was edited or replaced after packing")
    assert f.message.startswith(f"template {template}: SHA-256 ")


# --- unreadable folders ---------------------------------------------------------------------


def test_folder_without_manifest_is_a_usage_error(tmp_path):
    with pytest.raises(ManifestError) as err:
        verify_dataset(tmp_path, FAST)
    assert str(err.value) == (
        f"{tmp_path}/manifest.json: no manifest (is {tmp_path} a packshard output folder? "
        "a run that was interrupted leaves none: pack again)"
    )
    assert err.value.exit_code == 2


def test_unsupported_format_version_is_refused(packed_demo_copy):
    out = packed_demo_copy
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["format_version"] = 2
    path.write_text(json.dumps(manifest))
    with pytest.raises(ManifestError) as err:
        verify_dataset(out, FAST)
    assert str(err.value) == (
        f"{path}: format_version 2 is not supported by this packshard (supports 1); "
        "upgrade packshard or re-pack the data"
    )


# --- the model check and its control ---------------------------------------------------------


@pytest.mark.torch
def test_model_check_holds_and_its_control_leaks(packed_demo):
    pytest.importorskip("transformers")
    report = verify_dataset(packed_demo, VerifyOptions(source=False))
    assert report.ok, [str(f) for f in report.findings.items]
    model = report.checks["model"]
    assert model["status"] == "passed" and model["rows"] == 8
    atol = model["atol"]
    assert atol == 1e-4
    # packed vs alone: float32 rounding only, far below the tolerance
    assert model["max_logit_delta"] < atol / 10
    assert model["max_loss_delta"] < atol
    assert model["max_mutation_delta"] < atol
    # the naive causal mask over the same rows: every multi-segment row leaks, far above it
    assert model["control_detected"] is True
    assert model["control_min_delta"] > 100 * atol
    assert model["loss_naive"] != pytest.approx(model["loss_true"], abs=atol)
    checked = [e for e in report.seam_table if e["max_logit_delta"] is not None]
    assert len(checked) == 8
    assert all(e["max_logit_delta"] < atol for e in checked)
    assert all(e["control_delta"] > 100 * atol for e in checked if e["segments"] > 1)


@pytest.mark.torch
def test_a_plain_causal_mask_in_place_of_the_block_mask_fails(packed_demo, monkeypatch):
    """If the packed forward leaked like naive concatenation, verify must say so."""
    pytest.importorskip("transformers")
    import packshard.verify.model.forward as forward

    block_mask = forward.build_block_mask

    def leaking_mask(cu_seqlens: np.ndarray, causal_only: bool = False) -> Any:
        return block_mask(cu_seqlens, causal_only=True)

    monkeypatch.setattr(forward, "build_block_mask", leaking_mask)
    report = verify_dataset(packed_demo, VerifyOptions(source=False, model_rows=2))
    assert report.ok is False
    assert report.checks["model"]["status"] == "failed"
    assert report.checks["model"]["max_logit_delta"] > 100 * 1e-4
    f = find(report, "model", "packed logits differ from alone by", segment=1)
    assert f.message.endswith("> 1e-04")
    assert f.shard is not None and f.shard.startswith("shard-") and f.row is not None
    assert f.source == index_source(packed_demo, f.example_id)
    entry = next(e for e in report.seam_table if (e["shard"], e["row"]) == (f.shard, f.row))
    assert entry["findings"] >= 1 and entry["max_logit_delta"] > 100 * 1e-4
    assert report.checks["integrity"]["status"] == report.checks["structure"]["status"] == "passed"


@pytest.mark.torch
def test_a_control_that_cannot_leak_is_itself_a_finding(packed_demo, monkeypatch):
    """A check that cannot fail proves nothing: a blind control fails verify."""
    pytest.importorskip("transformers")
    import packshard.verify.model.forward as forward

    block_mask = forward.build_block_mask

    def blind_control(cu_seqlens: np.ndarray, causal_only: bool = False) -> Any:
        return block_mask(cu_seqlens, causal_only=False)

    monkeypatch.setattr(forward, "build_block_mask", blind_control)
    report = verify_dataset(packed_demo, VerifyOptions(source=False, model_rows=2))
    assert report.ok is False
    assert report.checks["model"]["control_detected"] is False
    find(report, "model", "the naive causal control differs from alone by only")
    find(report, "model", "the naive-mask control was not detected: verify is broken")


# --- real tokenizers and chat files -----------------------------------------------------------

REAL_CONFIGS = {
    "phi-3-mini config template": ("phi-3-mini", None),
    "phi-3 training template": ("phi-3-mini", "phi-3-mini/chat_template.training.jinja"),
    "phi-2 with chatml": ("phi-2", "chatml"),
}


@pytest.mark.slow
@pytest.mark.shared_data
@pytest.mark.torch
@pytest.mark.parametrize("name", list(REAL_CONFIGS))
def test_verify_passes_on_what_pack_makes_from_real_data(shared_data, tmp_path, name):
    """Every real chat file packed together, per tokenizer, verifies clean with the model."""
    pytest.importorskip("transformers")
    from packshard.pack import PackConfig, pack_dataset

    tokenizer, template = REAL_CONFIGS[name]
    tokenizers = shared_data / "tokenizers"
    if template is not None and template.endswith(".jinja"):
        template = str(tokenizers / template)
    inputs = tuple(str(p) for p in sorted((shared_data / "chat").iterdir()))
    config = PackConfig.build(
        inputs=inputs,
        tokenizer=str(tokenizers / tokenizer),
        template=template,
        out=str(tmp_path / "out"),
        max_seq_len=4096,
        allow_split_markers=tokenizer == "phi-2",  # a base model taught ChatML: markers are text
    )
    manifest = pack_dataset(config).manifest
    recorded = {None: "tokenizer_config.json", "chatml": "builtin:chatml"}.get(template, template)
    assert manifest["template"]["source"] == recorded
    stats = manifest["stats"]
    assert stats["records"] == 5912
    assert stats["records_packed"] + stats["rejected"] + stats["dropped"] == 5912
    assert stats["records_packed"] >= 5900  # only the over-long records are dropped
    options = VerifyOptions(model_rows=4, model_max_tokens=1024)
    report = verify_dataset(tmp_path / "out", options)
    assert report.ok, [str(f) for f in report.findings.items]
    assert report.checks["source"]["examples_compared"] == stats["examples"]
    model = report.checks["model"]
    assert model["control_detected"] and model["control_min_delta"] > 100 * model["atol"]
    assert model["max_logit_delta"] < model["atol"]


# --- broken folders give findings, never a crash ----------------------------------------------


def _drop_labels(out: Path) -> None:
    path = out / "shard-00000.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["labels"]), path)


def _widen_num_tokens(out: Path) -> None:
    path = out / "shard-00000.parquet"
    table = pq.read_table(path)
    at = table.schema.get_field_index("num_tokens")
    pq.write_table(table.set_column(at, "num_tokens", table["num_tokens"].cast(pa.int64())), path)


def _edit_manifest(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def edit(out: Path) -> None:
        path = out / "manifest.json"
        manifest = json.loads(path.read_text())
        change(manifest)
        path.write_text(json.dumps(manifest))

    return edit


@pytest.mark.parametrize(
    ("corrupt", "check", "message"),
    [
        (
            lambda out: os.remove(out / "examples.parquet"),
            "integrity",
            "examples.parquet: listed in the manifest but missing",
        ),
        (
            lambda out: (out / "examples.parquet").write_bytes(b"not parquet"),
            "integrity",
            "examples.parquet: unreadable Parquet: ",
        ),
        (
            _drop_labels,
            "integrity",
            "shard-00000.parquet: missing columns labels (not a format version 1 shard)",
        ),
        (
            _widen_num_tokens,
            "integrity",
            "shard-00000.parquet: column num_tokens is int64, the contract says int32",
        ),
        (
            _edit_manifest(lambda m: m.pop("tokenizer")),
            "integrity",
            "manifest.json: (root): 'tokenizer' is a required property",
        ),
        (
            _edit_manifest(lambda m: m["inputs"][0].pop("path")),
            "integrity",
            "manifest.json: inputs/0: 'path' is a required property",
        ),
        (
            _edit_manifest(lambda m: m["template"].update(source=None)),
            "source",
            "re-ingesting the inputs failed: ",
        ),
    ],
    ids=[
        "no-index",
        "garbage-index",
        "missing-column",
        "wrong-type",
        "no-tokenizer",
        "input-path",
        "template-lost",
    ],
)
def test_broken_folders_give_findings_not_crashes(packed_demo_copy, corrupt, check, message):
    corrupt(packed_demo_copy)
    report = verify_dataset(packed_demo_copy, FAST)
    assert report.ok is False
    find(report, check, message)
