"""A launcher's ranks that accelerate would run as separate single processes are refused."""

from __future__ import annotations

import sys
import types

import pytest

from packshard.errors import UsageError
from packshard.torch import PackedIterableDataset
from packshard.torch.placement import FIX, accelerate_processes, check_launch
from tests.torch.test_placement import out_13  # noqa: F401  (the fixture)


def test_torchrun_without_accelerate_use_cpu_is_refused_in_the_wrapper(out_13, monkeypatch):  # noqa: F811
    """torchrun --nproc_per_node 2 on CPU: accelerate counts 1 process, its shard keeps all."""
    from accelerate.data_loader import IterableDatasetShard

    monkeypatch.setenv("WORLD_SIZE", "2")
    shard = IterableDatasetShard(PackedIterableDataset(out_13), batch_size=2, num_processes=1)
    with pytest.raises(UsageError) as err:
        next(iter(shard))
    assert str(err.value) == (
        "WORLD_SIZE=2 but accelerate runs 1 process(es) with no process group: each rank would "
        f"train its own copy of the model, with no gradient sync ({FIX})"
    )
    assert "ACCELERATE_USE_CPU=1" in str(err.value)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert len(list(shard)) == 12  # one process: every whole block of 2 rows


def test_an_accelerate_state_of_one_process_under_a_launcher_is_refused(out_13, monkeypatch):  # noqa: F811
    fake = types.ModuleType("accelerate.state")
    fake.PartialState = type("PartialState", (), {"_shared_state": {"num_processes": 1}})
    monkeypatch.setitem(sys.modules, "accelerate.state", fake)
    assert accelerate_processes() == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError, match="no gradient sync"):
        next(iter(PackedIterableDataset(out_13)))
    fake.PartialState._shared_state = {}
    assert accelerate_processes() is None
    with pytest.raises(UsageError, match=r"torch\.distributed is not initialised"):
        next(iter(PackedIterableDataset(out_13)))  # the launcher check that was there


def test_matching_counts_pass(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    check_launch(2)
    monkeypatch.delenv("WORLD_SIZE")
    check_launch(1)
