"""``pack_spill``'s topology steps: aligned segments (``--cp``) and balanced steps (``--dp``).

The demo chats packed at 256 tokens: with ``--cp 2``/``--cp 4`` every padded segment is a
multiple of 4/8, the padded rows fit, the trained pairs are the unaligned pack's and ``verify``
passes (the model stage runs the padded rows); with ``--dp`` the manifest's predicted balance is
the written order's, and it beats the seed's order.  Packs without either keep their bytes
(``tests/test_contract.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from packshard.errors import UsageError
from packshard.format.topology import Topology, row_costs, step_balance
from packshard.pack import PackConfig
from packshard.pack.config import check_config
from packshard.verify.run import VerifyOptions, verify_dataset
from tests.helpers import pack_demo_into, trained_pairs


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def plain(tmp_path_factory, packed_demo_tokenizer) -> Path:
    return pack_demo_into(tmp_path_factory.mktemp("plain"), packed_demo_tokenizer)


@pytest.mark.parametrize(("cp", "multiple"), [(2, 4), (4, 8)])
def test_an_aligned_pack_pads_every_segment_and_verifies(
    tmp_path, packed_demo_tokenizer, plain, cp, multiple
):
    out = pack_demo_into(tmp_path, packed_demo_tokenizer, cp=cp)
    made = manifest(out)
    assert made["config"]["alignment"] == {
        "multiple": multiple,
        "pad_multiple": 1,
        "cp": cp,
        "tp": 1,
    }
    for entry in made["shards"]:
        table = pq.read_table(out / entry["path"]).to_pydict()
        for cu, padded in zip(table["cu_seqlens"], table["cu_seqlens_padded"], strict=True):
            real, width = np.diff(cu), np.diff(padded)
            assert (width % multiple == 0).all() and (width >= real).all()
            assert (width - real < multiple).all() and padded[-1] <= 256
    pads = 0
    for entry in made["shards"]:
        table = pq.read_table(out / entry["path"])
        for cu, padded in zip(
            table["cu_seqlens"].to_pylist(), table["cu_seqlens_padded"].to_pylist(), strict=True
        ):
            pads += padded[-1] - cu[-1]
    assert made["stats"]["alignment"]["pad_tokens"] == pads > 0
    assert made["stats"]["alignment"]["padded_fill_rate"] > made["stats"]["fill_rate"]
    assert trained_pairs(out) == trained_pairs(plain)  # the same examples, the same targets
    report = verify_dataset(out, VerifyOptions(model_rows=2))
    assert report.ok, [f.to_dict() for f in report.findings.items]
    assert report.checks["model"]["status"] == "passed"


def test_a_balanced_pack_records_the_balance_of_its_written_order(tmp_path, packed_demo_tokenizer):
    out = pack_demo_into(tmp_path, packed_demo_tokenizer, dp=2, grad_accum=2, max_seq_len=128)
    made = manifest(out)
    topology = Topology.from_config(made["config"])
    assert topology is not None and topology.step_rows == 4
    lengths, offsets = [], [0]
    for entry in made["shards"]:
        for cu in pq.read_table(out / entry["path"])["cu_seqlens"].to_pylist():
            lengths += np.diff(cu).tolist()
            offsets.append(offsets[-1] + len(cu) - 1)
    costs = row_costs(np.array(lengths), np.array(offsets), topology.cost, topology.c)
    balance = made["stats"]["balance"]
    written = step_balance(costs, topology)
    assert balance["max_over_mean"] == written["max_over_mean"]
    assert balance["max_over_mean"] < balance["unbalanced_max_over_mean"]
    assert balance["steps"] == len(costs) // 4
    report = verify_dataset(out, VerifyOptions(model="none"))
    assert report.ok, [f.to_dict() for f in report.findings.items]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"cp": 3, "max_seq_len": 256},
            "--max-seq-len 256 is not a multiple of the segment alignment 6",
        ),
        ({"cp": 2, "strategy": "wrapped"}, "--strategy wrapped cuts rows full to the token"),
        ({"dp": 4, "strategy": "sequential"}, "--strategy sequential keeps the input order"),
        ({"tp": 2}, "--tp sets the alignment only with context parallelism"),
    ],
)
def test_impossible_topologies_are_refused_before_any_work(tmp_path, options, message):
    settings = {"max_seq_len": 512, **options}
    config = PackConfig.build(("in.jsonl",), "tok", str(tmp_path / "out"), **settings)
    with pytest.raises(UsageError, match=message):
        check_config(config)
