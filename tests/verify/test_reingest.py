from __future__ import annotations

import json

import pytest

from packshard.pack import PackConfig, pack_dataset
from packshard.verify.run import VerifyOptions, verify_dataset
from tests.helpers import scale_inputs


@pytest.fixture(scope="module")
def packed(tmp_path_factory, packed_demo_tokenizer):
    root = tmp_path_factory.mktemp("verify_units")
    inputs = scale_inputs(root / "data")
    out = root / "out"
    settings = {"max_seq_len": 256, "template": "chatml", "overlong": "split"}
    tok = str(packed_demo_tokenizer)
    config = PackConfig.build(tuple(map(str, inputs)), tok, str(out), **settings)
    pack_dataset(config)
    return out


def source_check(out, **options):
    report = verify_dataset(str(out), VerifyOptions(model="none", source=True, **options))
    check = {k: v for k, v in report.checks["source"].items() if k != "seconds"}  # a timing
    return check, [f.message for f in report.findings.items]


def test_the_source_check_on_two_workers_matches_one_process(packed):
    one, one_findings = source_check(packed)
    two, two_findings = source_check(packed, workers=2)
    assert one == two and one_findings == two_findings == []
    assert two["status"] == "passed" and two["examples_compared"] > 100


def test_a_changed_segment_is_found_by_the_workers(packed, tmp_path):
    import shutil

    import pyarrow.parquet as pq

    copy = tmp_path / "out"
    shutil.copytree(packed, copy)
    shard = copy / "shard-00000.parquet"
    table = pq.read_table(shard)
    ids = table["input_ids"].to_pylist()
    ids[0][3] = ids[0][3] + 1
    import pyarrow as pa

    table = table.set_column(0, "input_ids", pa.array(ids, pa.list_(pa.int32())))
    pq.write_table(table, shard, use_dictionary=False)
    _, one_findings = source_check(copy)
    _, two_findings = source_check(copy, workers=2)
    changed = "token ids differ from the source example re-tokenized"
    assert any(f.startswith(changed) for f in two_findings)  # then which encoder packed it
    assert sorted(one_findings) == sorted(two_findings)
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["shards"][0]["path"] == "shard-00000.parquet"


@pytest.mark.parametrize("turns", ["as_rendered", "expand"])
def test_reasoning_turns_on_two_workers_match_one_process(tmp_path, turns, monkeypatch):
    """A reasoning pack (one example per turn on expand): the workers re-ingest the turns and
    compare every example as the one-process check does."""
    from tests.helpers import THINK, answer, build_qwen, chat, user, write_jsonl

    template = tmp_path / "think.jinja"
    template.write_text(THINK, encoding="utf-8")
    records = [
        chat(
            user(f"{k}+{k}?"),
            answer(f"{2 * k}", reasoning_content="Add."),
            user(f"{k}*{k}?"),
            answer(f"{k * k}", reasoning_content="Multiply."),
        )
        for k in range(40)
    ]
    data = write_jsonl(tmp_path / "r.jsonl", records)
    out = tmp_path / "out"
    qwen = str(build_qwen(tmp_path / "qwen"))
    config = PackConfig.build(
        (str(data),), qwen, str(out), 128, template=str(template), turns=turns
    )
    pack_dataset(config)
    from packshard.ingest.read import units as ranges
    from packshard.verify import reingest as units

    one, one_findings = source_check(out)
    cut = []
    monkeypatch.setattr(
        units, "plan_ranges", lambda f: cut.extend(ranges.plan_ranges(f, 1500)) or cut
    )
    two, two_findings = source_check(out, workers=2)
    assert len(cut) > 2
    assert one == two and one_findings == two_findings == []
    assert two["status"] == "passed"
    assert two["examples_compared"] == (80 if turns == "expand" else 40)
