"""``repack`` on the real chat data: 1,024 / 2,048 / 8,192 tokens and another seed.

The parent is the shared chat folder packed at 8,192 tokens (phi-3-mini); each repack must
be the fresh pack with the same options byte for byte (shards, examples index, rejects) and
pass ``verify`` (the model stage on the shortest rows, where it is cheapest).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packshard.digests import sha256_path
from packshard.pack import PackConfig, pack_dataset
from packshard.repack import RepackConfig, repack_dataset
from packshard.verify.run import VerifyOptions, verify_dataset

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]


def pack_chat(shared: Path, out: Path, **options: object) -> Path:
    config = PackConfig.build(
        inputs=(str(shared / "chat"),),
        tokenizer=str(shared / "tokenizers" / "phi-3-mini"),
        out=str(out),
        **options,
    )  # type: ignore[arg-type]
    return pack_dataset(config).out


@pytest.fixture(scope="module")
def chat_8k(shared_data, tmp_path_factory) -> Path:
    return pack_chat(shared_data, tmp_path_factory.mktemp("chat") / "8k", max_seq_len=8192)


@pytest.mark.parametrize(
    ("max_seq_len", "seed", "model"),
    [(1024, 0, "tiny"), (2048, 0, "none"), (8192, 7, "none")],
)
def test_repack_of_the_chat_data_is_the_fresh_pack(
    shared_data, chat_8k, tmp_path, max_seq_len, seed, model
):
    want = pack_chat(shared_data, tmp_path / "fresh", max_seq_len=max_seq_len, seed=seed)
    config = RepackConfig.build(
        str(chat_8k), str(tmp_path / "re"), max_seq_len=max_seq_len, seed=seed
    )
    got = repack_dataset(config).out
    mine = json.loads((got / "manifest.json").read_text())
    names = [s["path"] for s in mine["shards"]]
    for name in [*names, "examples.parquet", "rejects.jsonl"]:
        assert sha256_path(got / name) == sha256_path(want / name), name
    assert mine["stats"]["dropped"] >= 2  # the two records over 8,192 tokens stay dropped
    report = verify_dataset(got, VerifyOptions(model=model, model_rows=2))
    assert report.ok, [f.to_dict() for f in report.findings.items]
    assert report.checks["source"]["status"] == "passed"


@pytest.mark.parametrize(("cp", "multiple"), [(2, 4), (4, 8)])
def test_the_chat_data_aligned_for_context_parallelism(chat_8k, tmp_path, cp, multiple):
    import numpy as np
    import pyarrow.parquet as pq

    from packshard.export import export_dataset
    from tests.export.test_megatron import bridge_items, megatron_cp_pairs
    from tests.helpers import trained_pairs

    config = RepackConfig.build(str(chat_8k), str(tmp_path / "re"), max_seq_len=4096, cp=cp)
    got = repack_dataset(config).out
    made = json.loads((got / "manifest.json").read_text())
    for entry in made["shards"]:
        for padded in pq.read_table(got / entry["path"])["cu_seqlens_padded"].to_pylist():
            assert (np.diff(padded) % multiple == 0).all() and padded[-1] <= 4096
    report = verify_dataset(got, VerifyOptions(model="tiny", model_rows=1, model_max_tokens=512))
    assert report.ok, [f.to_dict() for f in report.findings.items]
    export_dataset(got, "megatron", tmp_path / "mb")
    items = bridge_items(tmp_path / "mb" / "training_4096.idx.parquet")
    eos = made["tokenizer"]["eos_token_id"]
    assert megatron_cp_pairs(items, eos, multiple, 4096) == trained_pairs(got)
