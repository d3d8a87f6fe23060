"""``repack``: a pack re-planned from its own tokens equals a fresh ``pack`` with those options.

The parents are the demo chats packed at 512 tokens (4 rows a shard), with ``--loss auto``
(its formats train under three loss policies) and ``--loss all`` (one); every repack is
compared with a fresh pack of the same input file and options: the same dataset id, shards,
examples index, rejects, card and statistics, byte for byte; only ``created_at``, ``engine``
and ``parent`` differ in the manifest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.digests import sha256_path
from packshard.errors import UsageError
from packshard.pack import PackConfig, pack_dataset
from packshard.repack import RepackConfig, repack_dataset
from packshard.verify.run import VerifyOptions, verify_dataset
from tests.helpers import pack_demo_into

OWN = {"created_at", "engine", "parent"}
"""The manifest keys a repack writes differently from a fresh pack (by design)."""


@pytest.fixture(scope="module")
def parent(tmp_path_factory, packed_demo_tokenizer) -> Path:
    """The demo chats packed at 512 tokens, 4 rows a shard (three loss policies)."""
    root = tmp_path_factory.mktemp("parent")
    return pack_demo_into(root, packed_demo_tokenizer, max_seq_len=512, shard_rows=4)


@pytest.fixture(scope="module")
def parent_all(tmp_path_factory, packed_demo_tokenizer) -> Path:
    """The same with ``--loss all``: one policy, so examples may be dropped or cut."""
    root = tmp_path_factory.mktemp("parent_all")
    return pack_demo_into(root, packed_demo_tokenizer, max_seq_len=512, shard_rows=4, loss="all")


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def fresh_pack(parent: Path, out: Path, **options: object) -> Path:
    """Pack the parent's own input file, with its tokenizer and template, and ``options``."""
    made = manifest(parent)
    loss = made["config"]["loss"]
    settings: dict[str, object] = {"template": "chatml", "shard_rows": 4, "loss": loss, **options}
    config = PackConfig.build(
        inputs=(made["inputs"][0]["path"],),
        tokenizer=made["tokenizer"]["path"],
        out=str(out),
        **settings,
    )  # type: ignore[arg-type]
    return pack_dataset(config).out


def repack(parent: Path, out: Path, **options: object) -> Path:
    return repack_dataset(RepackConfig.build(str(parent), str(out), **options)).out


@pytest.mark.parametrize(
    ("which", "options"),
    [
        ("parent", {"max_seq_len": 256}),
        ("parent", {"max_seq_len": 512, "seed": 3, "strategy": "ffd"}),
        ("parent", {"max_seq_len": 1024, "strategy": "sequential", "shard_rows": 2}),
        ("parent", {"max_seq_len": 300, "eval_fraction": 0.2, "seed": 5}),
        ("parent_all", {"max_seq_len": 96}),
        ("parent_all", {"max_seq_len": 96, "overlong": "split", "seed": 2}),
        ("parent_all", {"max_seq_len": 96, "overlong": "truncate", "compression": "snappy"}),
        ("parent_all", {"max_seq_len": 200, "strategy": "wrapped"}),
        ("parent", {"max_seq_len": 512, "cp": 4}),
        ("parent", {"max_seq_len": 256, "cp": 2, "tp": 2, "dp": 2, "grad_accum": 2}),
        ("parent", {"max_seq_len": 512, "dp": 4, "balance_cost": "tokens", "seed": 1}),
    ],
    ids=[
        "256",
        "512-ffd-seed3",
        "1024-sequential",
        "300-eval",
        "96-drop",
        "96-split",
        "96-truncate",
        "200-wrapped",
        "512-cp4",
        "256-cp2-tp2-dp2",
        "512-dp4-tokens",
    ],
)
def test_a_repack_is_the_fresh_pack_byte_for_byte(request, tmp_path, which, options):
    parent = request.getfixturevalue(which)
    want = fresh_pack(parent, tmp_path / "fresh", **options)
    got = repack(parent, tmp_path / "re", **options)
    mine, theirs = manifest(got), manifest(want)
    names = [s["path"] for s in mine["shards"]]
    assert names == [s["path"] for s in theirs["shards"]]
    for name in [*names, "examples.parquet", "rejects.jsonl", "README.md"]:
        assert sha256_path(got / name) == sha256_path(want / name), name
    differ = {k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)}
    assert "parent" in differ and differ <= OWN
    assert mine["parent"] == {
        "path": str(parent),
        "dataset_id": manifest(parent)["dataset_id"],
        "manifest_sha256": sha256_path(parent / "manifest.json"),
    }


def test_a_repack_leaves_an_interrupted_packs_units_alone(parent, tmp_path):
    units = tmp_path / ".re.units"  # what pack --resume would reuse for the folder re
    (units / "unit-00000").mkdir(parents=True)
    repack(parent, tmp_path / "re", max_seq_len=256)
    assert [p.name for p in units.iterdir()] == ["unit-00000"]
    repack(parent, tmp_path / "again", max_seq_len=256)
    assert not (tmp_path / ".again.units").exists()  # its own work is gone


def test_a_repack_verifies(parent, tmp_path):
    out = repack(parent, tmp_path / "re", max_seq_len=200, seed=9)
    report = verify_dataset(out, VerifyOptions(model_rows=2))
    assert report.ok, [f.to_dict() for f in report.findings.items]
    assert report.checks["source"]["status"] == "passed"


def test_a_repack_of_a_repack_is_the_fresh_pack_too(parent, tmp_path):
    first = repack(parent, tmp_path / "a", max_seq_len=300, seed=1)
    again = repack(first, tmp_path / "b", max_seq_len=512, seed=0)  # else first's seed 1
    assert manifest(again)["dataset_id"] == manifest(parent)["dataset_id"]
    for entry in manifest(parent)["shards"]:
        assert sha256_path(again / entry["path"]) == entry["sha256"]
    assert manifest(again)["parent"]["path"] == str(first)


def test_a_record_the_parent_dropped_and_a_fresh_pack_would_keep_is_refused(
    parent, tmp_path, packed_demo_tokenizer
):
    small = pack_demo_into(tmp_path / "small", packed_demo_tokenizer, max_seq_len=96, loss="all")
    lines = [json.loads(x) for x in (small / "rejects.jsonl").read_text().splitlines()]
    dropped = [r for r in lines if r["code"] == "too_long"]
    assert dropped
    repack(small, tmp_path / "smaller", max_seq_len=64)  # still too long: dropped again
    with pytest.raises(UsageError) as err:
        repack(small, tmp_path / "longer", max_seq_len=512)
    where = f"{dropped[0]['source']}:{dropped[0]['line']}"
    assert str(err.value).startswith(f"{where}: the parent dropped this ")
    assert str(err.value).endswith(
        "a fresh pack would keep it (it fits); its tokens are not in the parent (pack from the "
        "inputs, or keep --overlong drop with a --max-seq-len below its length)"
    )
    assert not (tmp_path / "longer").exists()
    with pytest.raises(UsageError) as err:
        repack(small, tmp_path / "strict", max_seq_len=64, overlong="error")
    assert str(err.value).endswith(
        "as too long; under --overlong error a fresh pack would stop there (use --overlong drop)"
    )


def test_several_loss_policies_need_every_example_whole(parent, tmp_path):
    with pytest.raises(UsageError) as err:
        repack(parent, tmp_path / "re", max_seq_len=96)
    assert str(err.value).startswith(
        f"{parent}: cannot repack: its record formats train under different loss policies and "
        "the examples index does not say which example had which, so every example must stay "
        "whole; "
    )
    assert str(err.value).endswith(
        "longer than --max-seq-len 96 (--overlong drop) (keep --max-seq-len at least the "
        "longest example, or pack from the inputs)"
    )
    assert not (tmp_path / "re").exists()


def test_a_parent_whose_examples_were_cut_is_refused(tmp_path, packed_demo_tokenizer):
    cut = pack_demo_into(tmp_path / "cut", packed_demo_tokenizer, max_seq_len=96, overlong="split")
    split = manifest(cut)["stats"]["split"]
    with pytest.raises(UsageError) as err:
        repack(cut, tmp_path / "re", max_seq_len=512)
    assert str(err.value) == (
        f"{cut}: cannot repack: its overlong policy cut examples at max_seq_len 96 (split "
        f"{split}): the tokens past a cut are not in it and a part's first label is masked "
        "there, so the whole examples cannot be re-made (pack from the inputs with the new "
        "options)"
    )


def test_a_repack_of_an_aligned_balanced_pack_undoes_both(parent, tmp_path):
    aligned = repack(parent, tmp_path / "a", max_seq_len=512, cp=4, dp=2)
    assert manifest(aligned)["config"]["alignment"]["multiple"] == 8
    again = repack(aligned, tmp_path / "b", cp=1, dp=0)  # left out, both would be kept
    assert manifest(again)["dataset_id"] == manifest(parent)["dataset_id"]
    for entry in manifest(parent)["shards"]:
        assert sha256_path(again / entry["path"]) == entry["sha256"]


def test_only_planning_and_shard_options_change():
    with pytest.raises(UsageError) as err:
        RepackConfig.build("a", "b", loss="all")
    assert str(err.value).startswith("repack cannot change 'loss': it re-plans the parent's")


def test_the_command(parent, tmp_path):
    runner = CliRunner()
    args = ["repack", str(parent), "--max-seq-len", "256", "-o", str(tmp_path / "re")]
    result = runner.invoke(main, args, prog_name="packshard")
    assert result.exit_code == 0, result.output
    assert "repacked from" in result.stdout and str(parent) in result.stdout
    again = runner.invoke(main, args, prog_name="packshard")
    assert again.exit_code == 2
    assert again.stderr == (
        f"error: {tmp_path / 're'}: output folder exists and is not empty (use --overwrite)\n"
    )
    itself = runner.invoke(main, ["repack", str(parent), "-o", str(parent), "--overwrite"])
    assert itself.exit_code == 2
    assert itself.stderr.startswith(f"error: {parent}: output folder lies inside the input folder")
    missing = runner.invoke(main, ["repack", str(tmp_path / "no"), "-o", str(tmp_path / "x")])
    assert missing.exit_code == 2
    assert missing.stderr.startswith(f"error: {tmp_path / 'no'}: not a folder")
