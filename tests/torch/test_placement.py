"""Which rows a process reads: rank read lazily, accelerate's wrappers left to split, resume."""

from __future__ import annotations

import json
import sys

import pytest

torch = pytest.importorskip("torch")

from packshard.errors import UsageError  # noqa: E402
from packshard.torch import PackedIterableDataset, collate_varlen  # noqa: E402
from packshard.torch.placement import Placement, find_wrapper  # noqa: E402
from tests.helpers import fixture_rows, write_out  # noqa: E402


@pytest.fixture
def out_13(tmp_path):
    rows = fixture_rows(13, seed=2)
    return write_out(tmp_path / "out", [rows[:7], rows[7:]])


def first_ids(ds):
    return [int(r["example_ids"][0]) for r in ds]


class FakeGroup:
    """torch.distributed as seen after init_process_group(rank, world_size)."""

    def __init__(self, monkeypatch, rank, world_size):
        monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.distributed, "get_rank", lambda: rank)
        monkeypatch.setattr(torch.distributed, "get_world_size", lambda: world_size)


def test_rank_is_read_when_a_pass_starts_not_when_the_dataset_is_built(out_13, monkeypatch):
    ds = PackedIterableDataset(out_13, seed=1)  # built before the process group exists
    assert (ds.rank, ds.world_size, len(ds)) == (0, 1, 13)
    FakeGroup(monkeypatch, 1, 2)  # ... which a DDP launcher then initialises
    assert (ds.rank, ds.world_size, len(ds)) == (1, 2, 6)
    assert first_ids(ds) == [int(ds.data[i]["example_ids"][0]) for i in ds.rank_rows()]
    assert ds.placement == Placement(1, 2, 1, "torch.distributed")
    assert ds.state_dict()["world_size"] == 2


def test_a_split_that_changes_mid_epoch_is_refused(out_13, monkeypatch):
    ds = PackedIterableDataset(out_13, seed=1)
    for _, _ in zip(range(3), ds, strict=False):  # 3 rows read as one process
        pass
    FakeGroup(monkeypatch, 0, 2)
    with pytest.raises(UsageError) as err:
        next(iter(ds))
    assert str(err.value) == (
        "epoch 0 was read as rank 0 of 1 (one process) and would go on as rank 0 of 2 "
        "(torch.distributed) after 3 rows (the process group changed mid-epoch: call "
        "set_epoch() to start an epoch afresh)"
    )
    ds.set_epoch(1)
    assert len(first_ids(ds)) == 6


def test_a_launcher_without_a_process_group_is_refused(out_13, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    state = sys.modules.get("accelerate.state")
    if state is not None:  # an accelerate state another test left in this process
        monkeypatch.setattr(state.PartialState, "_shared_state", {})
    ds = PackedIterableDataset(out_13)
    with pytest.raises(UsageError) as err:
        next(iter(ds))
    assert str(err.value) == (
        "WORLD_SIZE=2 but torch.distributed is not initialised where the rows are read, so "
        "this process cannot know its share (iterate after init_process_group, or pass rank= "
        "and world_size=)"
    )
    assert len(PackedIterableDataset(out_13, rank=1, world_size=2)) == 6


def test_saved_world_size_is_checked_once_the_process_knows_its_own(out_13, monkeypatch):
    state = PackedIterableDataset(out_13, seed=1, rank=0, world_size=2).state_dict()
    ds = PackedIterableDataset(out_13, seed=1)
    ds.load_state_dict(state)  # before the process group: accepted for now
    with pytest.raises(UsageError) as err:
        next(iter(ds))
    assert str(err.value) == (
        "cannot resume: the saved state has world_size=2 but this process reads rank 0 of 1 "
        "(one process) (resume with the same data and settings)"
    )
    FakeGroup(monkeypatch, 0, 2)
    ds.load_state_dict(json.loads(json.dumps(state)))
    assert len(first_ids(ds)) == 6


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_accelerate_iterable_dataset_shard_splits_once(out_13, num_workers, drop_last):
    """Two processes' IterableDatasetShard over the dataset: every row once, equal shares."""
    from accelerate.data_loader import IterableDatasetShard
    from torch.utils.data import DataLoader

    shares = []
    for process in (0, 1):
        ds = PackedIterableDataset(out_13, seed=4)
        ds.set_epoch(2)
        shard = IterableDatasetShard(
            ds, batch_size=2, drop_last=drop_last, num_processes=2, process_index=process
        )
        loader = DataLoader(shard, batch_size=2, collate_fn=collate_varlen, num_workers=num_workers)
        ids = [e for batch in loader for e in batch["example_ids"].tolist()]
        assert len(loader) == len(shard) // 2 == 3  # 13 rows cut to 12: 3 batches of 2 each
        shares.append(ids)
    data = PackedIterableDataset(out_13).data
    row_of = {int(e): i for i in range(len(data)) for e in data[i]["example_ids"]}
    rows = [{row_of[e] for e in share} for share in shares]
    assert len(rows[0]) == len(rows[1]) == 6  # equal shares, 13 rows cut to whole blocks of 4
    assert not rows[0] & rows[1]
    every = shares[0] + shares[1]
    assert len(every) == len(set(every))  # no example twice


def test_rank_given_and_a_wrapper_that_splits_again_is_refused(out_13):
    from accelerate.data_loader import IterableDatasetShard

    ds = PackedIterableDataset(out_13, rank=0, world_size=2)
    shard = IterableDatasetShard(ds, batch_size=2, num_processes=2, process_index=0)
    with pytest.raises(UsageError) as err:
        next(iter(shard))
    assert str(err.value) == (
        "rank=0 and world_size=2 were given, and accelerate's IterableDatasetShard splits the "
        "rows again (each rank would keep a share of its share, and most rows would never be "
        "read): drop rank= and world_size= and let accelerate split"
    )
    assert find_wrapper() is None  # nothing on the stack out here
