"""Reference log-probabilities precomputed into a sidecar of OUT, and read back into batches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from packshard.digests import sha256_path  # noqa: E402
from packshard.errors import FormatError, OutputError, UsageError  # noqa: E402
from packshard.torch import PackedDataset, collate_varlen, seq_idx_block_causal_mask  # noqa: E402
from packshard.torch.pairs import dpo_loss, pair_logps  # noqa: E402
from packshard.torch.pairs.reference import (  # noqa: E402
    REFERENCE_NAME,
    ReferenceLogps,
    write_reference_logps,
)
from packshard.verify.model.forward import build_tiny_model  # noqa: E402
from tests.helpers import add_branch_column, pair_branches  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def scored(tmp_path_factory, packed_demo):
    root = tmp_path_factory.mktemp("reference")
    out = Path(shutil.copytree(packed_demo, root / "out"))
    add_branch_column(out)
    model = build_tiny_model(1024, seed=7)
    folder = root / "ref-model"
    model.save_pretrained(folder)
    path = write_reference_logps(out, folder)
    return out, model, path


def test_sidecar_is_listed_and_equals_the_packed_forward(scored):
    out, model, path = scored
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["files"]["reference_logps"]
    assert entry == {
        "path": REFERENCE_NAME,
        "bytes": path.stat().st_size,
        "sha256": sha256_path(path),
    }
    assert not any(
        p.name.endswith(".partial") or ".partial-" in p.name for p in out.parent.iterdir()
    )
    reference = ReferenceLogps(out)
    data = PackedDataset(out)
    rows = [data[i] for i in range(len(data))]
    segments = sum(len(pair_branches(r["example_ids"].numel())) for r in rows)
    paired = sum(sum(b != 0 for b in pair_branches(r["example_ids"].numel())) for r in rows)
    assert 0 < len(reference) == paired < segments
    batch = collate_varlen(rows[:4], pad_to_multiple_of=8)
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            attention_mask=seq_idx_block_causal_mask(batch["seq_idx"]),
        ).logits
    pairs = pair_logps(logits, batch)
    ref_c, ref_r = reference.for_pairs(pairs)
    assert float((ref_c - pairs.chosen.double()).abs().max()) <= 1e-4
    assert float((ref_r - pairs.rejected.double()).abs().max()) <= 1e-4
    # the same model as its own reference: every DPO margin is 0, the loss log 2
    loss = dpo_loss(pairs, (ref_c, ref_r))
    assert abs(float(loss) - float(np.log(2))) <= 1e-5
    joined = reference.join(batch)
    values = joined["reference_logps"]
    assert torch.isnan(values[batch["branch"] == 0]).all()
    assert not torch.isnan(values[batch["branch"] != 0]).any()


def test_a_sidecar_that_changed_is_refused(scored, tmp_path):
    out, _, _ = scored
    copy = Path(shutil.copytree(out, tmp_path / "out"))
    table = pq.read_table(copy / REFERENCE_NAME)
    pq.write_table(table.slice(1), copy / REFERENCE_NAME)
    with pytest.raises(FormatError, match="SHA-256 differs"):
        ReferenceLogps(copy)


def test_a_folder_packshard_did_not_write_is_not_amended(scored, tmp_path):
    out, model, _ = scored
    copy = Path(shutil.copytree(out, tmp_path / "out"))
    (copy / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"notes\.txt"):
        write_reference_logps(copy, model)
    with pytest.raises(UsageError, match="not a model folder"):
        write_reference_logps(copy, tmp_path)


def test_a_pack_without_pairs_has_nothing_to_score(packed_demo, tmp_path):
    copy = Path(shutil.copytree(packed_demo, tmp_path / "out"))
    with pytest.raises(UsageError, match="no preference segments"):
        write_reference_logps(copy, build_tiny_model(1024, seed=7))
    assert not (copy / REFERENCE_NAME).exists()
    with pytest.raises(UsageError, match="no reference log-probabilities"):
        ReferenceLogps(copy)
