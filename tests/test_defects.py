"""Five defects a review found, each pinned through the command line as a user meets it.

These run the CLI in a fresh interpreter and read only the output folder, so they hold for any
internal layout.  (The core-install defect is ``tests/test_core_install.py``.)
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from packshard.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=300
    )


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from packshard.demo import build_demo_tokenizer, demo_data_path

    root = tmp_path_factory.mktemp("defects")
    tokenizer = build_demo_tokenizer(root / "tok")
    extra = root / "mixed.jsonl"
    records = [{"text": "plain words to learn"}, {"text": "more plain words"}]
    extra.write_text("".join(json.dumps(r) + "\n" for r in records))
    args = [str(demo_data_path()), str(extra), "-t", str(tokenizer), "--template", "chatml"]
    result = cli("pack", *args, "--max-seq-len", "512", "-o", str(root / "out"), "--no-progress")
    assert result.returncode == 0, result.stderr
    return root / "out"


def _rewrite_examples(out: Path, table: pa.Table) -> None:
    """Replace examples.parquet and record its new checksum, as a careless edit would."""
    path = out / "examples.parquet"
    pq.write_table(table, path, compression="zstd")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"]["examples"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))


def test_1_structure_fails_when_it_lists_a_structure_finding(packed: Path, tmp_path: Path) -> None:
    out = Path(shutil.copytree(packed, tmp_path / "out"))
    table = pq.read_table(out / "examples.parquet")
    orphan = table.slice(0, 1).to_pylist()[0] | {"example_id": table.num_rows}
    grown = pa.concat_tables([table, pa.Table.from_pylist([orphan], schema=table.schema)])
    _rewrite_examples(out, grown)
    result = cli(
        "verify", str(out), "--model", "none", "--no-source", "--json", str(tmp_path / "r")
    )
    report = json.loads((tmp_path / "r").read_text())
    structure = [f for f in report["findings"] if f["check"] == "structure"]
    assert structure, result.stdout
    assert report["checks"]["structure"]["status"] == "failed"
    assert report["checks"]["structure"]["findings"] == len(structure)
    assert result.returncode == 1


def test_3_the_manifest_says_what_loss_auto_resolved_to(packed: Path) -> None:
    manifest = json.loads((packed / "manifest.json").read_text())
    loss = manifest["loss"]
    assert loss["option"] == "auto"
    assert loss["by_format"]["messages"] == "assistant"
    assert loss["by_format"]["text"] == "all"
    assert sum(loss["examples_by_policy"].values()) == manifest["stats"]["examples"]
    assert loss["examples_by_policy"]["all"] >= 2  # the two text records, and any in the demo


def test_4_every_parquet_file_carries_the_format_metadata(packed: Path) -> None:
    manifest = json.loads((packed / "manifest.json").read_text())
    for path in [packed / "examples.parquet", *sorted(packed.glob("shard-*.parquet"))]:
        meta = pq.read_schema(path).metadata or {}
        assert meta.get(b"packshard.format_version") == b"1", path.name
        assert meta.get(b"packshard.dataset_id") == manifest["dataset_id"].encode(), path.name


def test_4_verify_refuses_an_examples_index_of_another_pack(packed: Path, tmp_path: Path) -> None:
    out = Path(shutil.copytree(packed, tmp_path / "out"))
    table = pq.read_table(out / "examples.parquet")
    other = table.replace_schema_metadata(
        {b"packshard.format_version": b"1", b"packshard.dataset_id": b"0" * 32}
    )
    _rewrite_examples(out, other)
    result = cli(
        "verify", str(out), "--model", "none", "--no-source", "--json", str(tmp_path / "r")
    )
    report = json.loads((tmp_path / "r").read_text())
    messages = [f["message"] for f in report["findings"] if f["check"] == "integrity"]
    assert any("examples.parquet" in m and "dataset_id" in m for m in messages), messages
    assert result.returncode == 1
