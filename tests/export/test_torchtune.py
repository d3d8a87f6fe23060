"""torchtune export through torchtune itself: its collator, its recipes' shift, its own packer."""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.trainers
torchtune = pytest.importorskip("torchtune")

from torch.utils.data import DataLoader  # noqa: E402

from packshard.errors import UsageError  # noqa: E402
from packshard.export import export_dataset  # noqa: E402
from packshard.export.torchtune import packed_dataset, write_torchtune  # noqa: E402
from packshard.records import IGNORE_INDEX  # noqa: E402
from tests.helpers import trained_pairs  # noqa: E402


def torchtune_pairs(dataset, shift: bool) -> Counter:
    """Pairs trained from ``padded_collate_packed`` batches (``shift``: torchtune 0.6 recipes)."""
    from torchtune.data import padded_collate_packed

    pairs: Counter = Counter()
    for batch in DataLoader(dataset, batch_size=3, collate_fn=padded_collate_packed):
        tokens, labels, mask = batch["tokens"], batch["labels"], batch["mask"]
        if shift:  # the recipes: labels = hstack(labels[..., 1:], ignore)
            labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], 1)
        for b in range(tokens.shape[0]):
            for q in torch.nonzero(labels[b] != IGNORE_INDEX).flatten().tolist():
                keys = torch.nonzero(mask[b, q]).flatten()
                start = int(keys[0])
                assert keys.tolist() == list(range(start, q + 1))  # one causal block
                assert int(batch["input_pos"][b, q]) == q - start
                pairs[(tuple(tokens[b, start : q + 1].tolist()), int(labels[b, q]))] += 1
    return pairs


def test_torchtune_trains_packshards_pairs_with_either_label_layout(packed_demo, tmp_path):
    export_dataset(packed_demo, "torchtune", tmp_path / "tt")
    samples = packed_dataset(None, path=str(tmp_path / "tt"), packed=True)
    want = trained_pairs(packed_demo)
    assert torchtune_pairs(samples, shift=True) == want  # torchtune 0.6, the release
    write_torchtune(packed_demo, tmp_path, 256, pad_id=0, labels="shifted")
    assert torchtune_pairs(packed_dataset(path=str(tmp_path)), shift=False) == want  # main
    first = samples[0]
    assert {k: (v.dtype, tuple(v.shape)) for k, v in first.items() if k != "seq_lens"} == {
        "tokens": (torch.long, (256,)),
        "labels": (torch.long, (256,)),
        "input_pos": (torch.long, (256,)),
    }
    assert int(first["seq_lens"].sum()) == 256


def test_each_sample_is_what_torchtunes_own_packer_builds(packed_demo, tmp_path):
    import pyarrow.parquet as pq
    from torchtune.datasets import PackedDataset

    export_dataset(packed_demo, "torchtune", tmp_path / "tt")
    samples = packed_dataset(path=str(tmp_path / "tt"))
    manifest_rows = [
        row
        for shard in sorted(packed_demo.glob("shard-*.parquet"))
        for row in pq.read_table(shard).to_pylist()
    ]
    assert len(samples) == len(manifest_rows)
    for k, row in enumerate(manifest_rows):
        examples = [
            {"tokens": row["input_ids"][s:e], "labels": row["labels"][s:e]}
            for s, e in zip(row["cu_seqlens"][:-1], row["cu_seqlens"][1:], strict=True)
        ]
        ours = samples[k]
        theirs = PackedDataset(examples, max_seq_len=256, padding_idx=0)  # one pack
        assert len(theirs) == 1
        for name in ("tokens", "labels", "input_pos", "seq_lens"):
            assert torch.equal(ours[name], theirs[0][name]), (k, name)


def test_the_builder_refuses_what_it_cannot_honour(tmp_path):
    with pytest.raises(UsageError, match="set packed: True in the dataset config"):
        packed_dataset(path=str(tmp_path), packed=False)
    with pytest.raises(UsageError, match="options it does not know: split"):
        packed_dataset(path=str(tmp_path), split="train")
    with pytest.raises(UsageError, match=r"no train-\*\.parquet"):
        packed_dataset(path=str(tmp_path))
