"""The dataset card: load_dataset(OUT) reads the shards and the index apart; verify checks it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest

from packshard.digests import sha256_bytes, sha256_path
from packshard.format.card import card_configs, card_problem, front_matter, render_card


def manifest_of(out):
    return json.loads((out / "manifest.json").read_text(encoding="utf-8"))


def test_card_names_every_shard_and_the_index_and_tells_what_the_folder_is(packed_demo):
    m = manifest_of(packed_demo)
    text = (packed_demo / "README.md").read_text(encoding="utf-8")
    assert m["files"]["card"] == {
        "path": "README.md",
        "sha256": sha256_path(packed_demo / "README.md"),
    }
    shards = [s["path"] for s in m["shards"]]
    assert len(shards) == 4
    default = {"split": "train", "path": shards}
    index = {"split": "train", "path": ["examples.parquet"]}
    configs = card_configs(text)
    assert [{k: v for k, v in c.items() if k != "description"} for c in configs] == [
        {"config_name": "default", "default": True, "data_files": [default]},
        {"config_name": "examples", "data_files": [index]},
    ]
    # the contents' digest: datasets caches a local folder under its name and its card's configs
    shas = "\n".join(s["sha256"] for s in m["shards"]).encode()
    assert configs[0]["description"] == f"packshard rows {sha256_bytes(shas)[:16]}"
    examples_sha = m["files"]["examples"]["sha256"].encode()
    assert configs[1]["description"] == f"packshard examples {sha256_bytes(examples_sha)[:16]}"
    yaml = pytest.importorskip("yaml")  # what datasets parses the card with
    assert yaml.safe_load(text.split("---\n")[1])["configs"] == card_configs(text)
    stats = m["stats"]
    for fact in (
        f"| dataset id | `{m['dataset_id']}` |",
        f"(sha256 `{m['tokenizer']['sha256']}`)",
        "| chat template | `builtin:chatml`",
        "| max_seq_len | 256 tokens per row |",
        f"| records | {stats['records']} read = {stats['records_packed']} packed + "
        f"{stats['rejected']} rejected + {stats['dropped']} dropped",
        f"| examples / rows / shards | {stats['examples']} / {stats['rows']} / 4 |",
        f"| fill rate | {100 * stats['fill_rate']:.2f}% of rows × max_seq_len",
        "$ packshard verify OUT",
        "SFTConfig(padding_free=True, packing=False, max_length=None)",
    ):
        assert fact in text, fact
    # rendered from the manifest alone, never from when it was made
    assert render_card(m | {"created_at": "1999-01-01T00:00:00Z"}) == text


def test_load_dataset_reads_the_rows_and_the_index_and_no_stray_file(
    packed_demo, tmp_path, monkeypatch
):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = shutil.copytree(packed_demo, tmp_path / "out")
    m = manifest_of(out)
    shutil.copyfile(out / "examples.parquet", out / "shard-99999.parquet")  # a stray file
    rows = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert rows.num_rows == m["stats"]["rows"]
    first = pq.read_table(out / m["shards"][0]["path"]).to_pylist()[0]
    assert rows[0] == first
    assert rows[0]["seq_lengths"] == np.diff(first["cu_seqlens"]).tolist()
    examples = datasets.load_dataset(
        str(out), "examples", split="train", cache_dir=str(tmp_path / "hf")
    )
    assert examples.num_rows == m["stats"]["examples"]
    assert examples["example_id"] == list(range(m["stats"]["examples"]))
    # the failure the card prevents: without it every *.parquet is one split of mixed schemas
    (out / "README.md").unlink()
    with pytest.raises(datasets.exceptions.DatasetGenerationError) as info:
        datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf2"))
    assert "column names don't match" in str(info.value.__cause__)


def _rewrite_front_matter(out, configs):
    text = (out / "README.md").read_text(encoding="utf-8")
    body = text.split("---\n", 2)[2]
    lines = ["---", "configs:", *(f"- {json.dumps(c)}" for c in configs), "---", ""]
    (out / "README.md").write_text("\n".join(lines) + body, encoding="utf-8")


def test_card_problem_names_what_load_dataset_would_get_wrong(packed_demo_copy):
    out = packed_demo_copy
    m = manifest_of(out)
    assert card_problem(out, m) is None
    good = card_configs(front_matter(m))
    dropped = json.loads(json.dumps(good))
    dropped[0]["data_files"][0]["path"].pop()
    _rewrite_front_matter(out, dropped)
    assert card_problem(out, m) == (
        "the card's config 'default' does not name the manifest's files (load_dataset would "
        "read other files than the manifest lists)"
    )
    _rewrite_front_matter(out, [good[0], good[1] | {"default": True}])
    two = "the card's default configs are ['default', 'examples'], expected ['default']"
    assert card_problem(out, m) == two
    _rewrite_front_matter(out, [good[0]])
    assert card_problem(out, m) == (
        "the card's config 'examples' does not name the manifest's files (load_dataset would "
        "read other files than the manifest lists)"
    )
    (out / "README.md").write_text("# no front matter\n", encoding="utf-8")
    assert card_problem(out, m) == "unreadable dataset card: no YAML front matter"
    (out / "README.md").write_text("---\nconfigs:\n- [not an object\n---\n", encoding="utf-8")
    assert card_problem(out, m).startswith(
        "unreadable dataset card: a configs entry is not one JSON object:"
    )


def test_verify_reports_a_card_that_names_other_files(packed_demo_copy):
    from packshard.verify.run import VerifyOptions, verify_dataset

    out = packed_demo_copy
    m = manifest_of(out)
    configs = card_configs(front_matter(m))
    configs[0]["data_files"][0]["path"] = configs[0]["data_files"][0]["path"][:1]
    _rewrite_front_matter(out, configs)
    m["files"]["card"]["sha256"] = sha256_path(out / "README.md")  # only the meaning differs
    (out / "manifest.json").write_text(json.dumps(m), encoding="utf-8")
    report = verify_dataset(out, VerifyOptions(source=False, model="none"))
    assert [f.message for f in report.findings.items] == [
        "README.md: the card's config 'default' does not name the manifest's files "
        "(load_dataset would read other files than the manifest lists)"
    ]
    assert report.checks["integrity"]["status"] == "failed"


def test_folders_named_alike_and_a_repacked_folder_each_load_their_own_rows(
    word_tokenizer, tmp_path, monkeypatch
):
    datasets = pytest.importorskip("datasets")
    from tests.helpers import pack_marked_examples

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cache = str(tmp_path / "hf")  # one user cache for every load

    def rows_of(out):
        return datasets.load_dataset(str(out), split="train", cache_dir=cache)["input_ids"]

    def own_rows(out):
        return [r["input_ids"] for r in pq.read_table(out / "shard-00000.parquet").to_pylist()]

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = pack_marked_examples(tmp_path / "a", word_tokenizer, examples=40)
    second = pack_marked_examples(tmp_path / "b", word_tokenizer, examples=12)
    assert first.name == second.name == "out"
    for out in (first, second, first):
        got = rows_of(out)
        assert len(got) == manifest_of(out)["stats"]["rows"]
        assert got[: len(own_rows(out))] == own_rows(out)
    # one folder packed again over itself from other inputs
    again = pack_marked_examples(tmp_path / "a", word_tokenizer, examples=20, overwrite=True)
    assert again == first and manifest_of(again)["stats"]["examples"] == 20
    got = rows_of(again)
    assert len(got) == manifest_of(again)["stats"]["rows"]
    assert got[: len(own_rows(again))] == own_rows(again)
