"""The source stage of verify: finding the inputs again, refusing changed ones, comparing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from packshard.verify.run import VerifyOptions, verify_dataset
from tests.helpers import pack_demo_into


def source_findings(report) -> list[str]:
    return [str(f) for f in report.findings.items if f.check == "source"]


def packed_then_moved(tmp_path: Path, tokenizer: Path) -> tuple[Path, Path, Path]:
    """Pack the demo, then move its input away: (out, recorded input path, new folder)."""
    out = pack_demo_into(tmp_path, tokenizer)
    recorded = tmp_path / "data" / "demo_chat.jsonl"
    moved = tmp_path / "moved"
    (tmp_path / "data").rename(moved)
    return out, recorded, moved


def test_input_edited_after_packing(packed_demo_copy, tmp_path):
    manifest = json.loads((packed_demo_copy / "manifest.json").read_text())
    data = Path(manifest["inputs"][0]["path"])
    edited = tmp_path / "edited.jsonl"
    edited.write_text(data.read_text().replace("palindrome", "anagram"))
    manifest["inputs"][0]["path"] = manifest["inputs"][0]["resolved"] = str(edited)
    (packed_demo_copy / "manifest.json").write_text(json.dumps(manifest))
    report = verify_dataset(packed_demo_copy, VerifyOptions(model="none"))
    assert report.ok is False
    assert source_findings(report) == [
        f"[source] input {edited}: SHA-256 differs from the manifest"
    ]


def test_missing_input_is_not_run_or_a_finding_when_required(tmp_path, packed_demo_tokenizer):
    out, gone, _ = packed_then_moved(tmp_path, packed_demo_tokenizer)
    report = verify_dataset(out, VerifyOptions(model="none"))
    assert report.ok is False and len(report.findings) == 0
    assert {k: v for k, v in report.checks["source"].items() if k != "seconds"} == {
        "status": "not run",
        "detail": f"input {gone} not found (give --source-root)",
    }
    report = verify_dataset(out, VerifyOptions(model="none", source=True))
    assert report.ok is False
    assert source_findings(report) == [f"[source] input {gone} not found (give --source-root)"]


def test_source_root_finds_a_moved_input_by_name(tmp_path, packed_demo_tokenizer):
    out, _, moved = packed_then_moved(tmp_path, packed_demo_tokenizer)
    report = verify_dataset(out, VerifyOptions(model="none", source=True, source_root=str(moved)))
    assert report.ok, source_findings(report)
    assert report.checks["source"]["examples_compared"] == 64


def test_sample_compares_that_many_records(packed_demo):
    report = verify_dataset(packed_demo, VerifyOptions(model="none", sample=10, seed=3))
    assert report.ok
    assert report.checks["source"]["examples_compared"] == 10


def test_given_tokenizer_and_template_must_match_the_recorded_hashes(
    packed_demo, packed_demo_tokenizer, tmp_path, monkeypatch
):
    report = verify_dataset(
        packed_demo,
        VerifyOptions(model="none", tokenizer=str(packed_demo_tokenizer), template="chatml"),
    )
    assert report.ok

    template = tmp_path / "other.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    report = verify_dataset(packed_demo, VerifyOptions(model="none", template=str(template)))
    assert report.ok is False
    (message,) = source_findings(report)
    assert message.startswith(f"[source] template {template}: SHA-256 ")
    assert message.endswith(
        "recorded at pack time (the template was edited or replaced after packing)"
    )

    import packshard.demo

    monkeypatch.setattr(packshard.demo, "VOCAB_SIZE", 600)
    other = packshard.demo.build_demo_tokenizer(tmp_path / "other-tok")
    report = verify_dataset(packed_demo, VerifyOptions(model="none", tokenizer=str(other)))
    (message,) = source_findings(report)
    assert message.startswith(f"[source] tokenizer {other}: SHA-256 ")


def test_missing_tokenizer_means_the_source_check_did_not_run(packed_demo, tmp_path):
    report = verify_dataset(
        packed_demo, VerifyOptions(model="none", tokenizer=str(tmp_path / "no-tokenizer"))
    )
    assert report.ok is False and len(report.findings) == 0
    assert report.checks["source"]["status"] == "not run"
    assert report.checks["source"]["detail"].endswith(
        "not found (give --tokenizer or --source-root)"
    )


@pytest.mark.parametrize("field", ["line", "source"])
def test_index_pointing_at_the_wrong_record_is_caught(packed_demo_copy, field):
    """An examples index whose provenance is wrong names the record that is not packed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = packed_demo_copy / "examples.parquet"
    table = pq.read_table(path)
    column = table[field].to_pylist()
    column[0] = column[0] + 1000 if field == "line" else column[0] + ".other"
    table = table.set_column(
        table.schema.get_field_index(field), field, pa.array(column, table.schema.field(field).type)
    )
    pq.write_table(table, path)
    report = verify_dataset(packed_demo_copy, VerifyOptions(model="none"))
    assert report.ok is False
    found = source_findings(report)
    assert any("record is neither packed nor in rejects.jsonl" in f for f in found), found
    assert any("packed example has no record in the inputs" in f for f in found), found


@pytest.mark.parametrize("edited", [False, True])
def test_a_changed_segment_names_the_drifted_library(packed_demo_copy, monkeypatch, edited):
    """A tokenizers release that merges differently: same tokenizer.json, other ids."""
    from importlib.metadata import version

    from tokenizers import Tokenizer

    from packshard.ingest.stage import open as source  # where verify's stage is loaded

    real = source.load_tokenizer

    def drifted(path: str):
        bundle = real(path)
        spec = json.loads(bundle.tokenizer.to_str())
        spec["model"]["merges"] = spec["model"]["merges"][1:]  # one merge no longer applies
        return dataclasses.replace(bundle, tokenizer=Tokenizer.from_str(json.dumps(spec)))

    monkeypatch.setattr(source, "load_tokenizer", drifted)
    if edited:
        manifest_path = packed_demo_copy / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        manifest["environment"]["libraries"]["tokenizers"] = "0.20.0"
        manifest_path.write_text(json.dumps(manifest))
    report = verify_dataset(packed_demo_copy, VerifyOptions(model="none"))
    found = source_findings(report)
    assert found and report.ok is False
    cause = f" (likely cause: tokenizers 0.20.0 when packed, {version('tokenizers')} now)"
    changed = [f for f in found if "token ids differ from the source example re-tokenized" in f]
    assert changed, found
    assert all(f.endswith(cause) == edited for f in changed)
    first = next(f for f in report.findings.items if f.check == "source")
    assert first.shard is not None and first.row is not None and first.segment is not None
