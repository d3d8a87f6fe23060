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
        "WORLD_SIZE=2 but accelerate runs 1 process(es) and syncs no gradients: each rank would "
        f"train its own copy of the model ({FIX})"
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
    with pytest.raises(UsageError, match="syncs no gradients"):
        next(iter(PackedIterableDataset(out_13)))
    fake.PartialState._shared_state = {}
    assert accelerate_processes() is None
    with pytest.raises(UsageError, match=r"torch\.distributed is not initialised"):
        next(iter(PackedIterableDataset(out_13)))  # the launcher check that was there


class AccelerateLoader:
    """Stands for accelerate's DataLoaderShard: reads the dataset from a method of its own."""

    __module__ = "accelerate.data_loader"

    def __init__(self, dataset, set_epoch=True):
        self.dataset, self.set_epoch = dataset, set_epoch

    def __iter__(self):
        if self.set_epoch:  # as DataLoaderShard does, in the main process, before workers read
            self.dataset.set_epoch(0)
        yield from self.dataset


def test_a_live_group_that_accelerate_counts_as_one_process_is_refused(out_13, monkeypatch):  # noqa: F811
    """The group gives each rank its half; without accelerate's DDP no gradient is synced."""
    from tests.torch.test_placement import FakeGroup

    fake = types.ModuleType("accelerate.state")
    fake.PartialState = type("PartialState", (), {"_shared_state": {"num_processes": 1}})
    monkeypatch.setitem(sys.modules, "accelerate.state", fake)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    FakeGroup(monkeypatch, 1, 2)
    for set_epoch in (True, False):  # refused at set_epoch, and where a pass starts
        with pytest.raises(UsageError) as err:
            next(iter(AccelerateLoader(PackedIterableDataset(out_13), set_epoch)))
        assert str(err.value) == (
            "torch.distributed has 2 ranks but accelerate runs 1 process(es) and syncs no "
            f"gradients: each rank would train its own copy of the model ({FIX})"
        )
    assert len(list(PackedIterableDataset(out_13))) == 6  # not accelerate's loop: a stale state
    fake.PartialState._shared_state = {"num_processes": 2}  # MULTI_CPU: one model, its half
    assert len(list(AccelerateLoader(PackedIterableDataset(out_13)))) == 6


def test_matching_counts_pass(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    check_launch(2)
    monkeypatch.delenv("WORLD_SIZE")
    check_launch(1)


def _torchrun(out, results, use_cpu):
    """Launch the Accelerate recipe on two CPU ranks; return (exit code, output lines)."""
    import os
    import socket
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(PYTHONPATH=os.pathsep.join([str(root), env.get("PYTHONPATH", "")]))
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    if use_cpu:
        env["ACCELERATE_USE_CPU"] = "1"
    results.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--master_addr", "127.0.0.1", "--master_port", str(port)]
    command += [str(root / "tests/torch/launch_recipe.py"), str(out), str(results)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, (done.stdout + done.stderr).splitlines()


@pytest.mark.trainers
@pytest.mark.xdist_group("torchrun")
def test_torchrun_with_the_accelerate_recipe_trains_one_model_or_is_refused(marked_pack, tmp_path):
    """Two real torchrun ranks: synced halves with ACCELERATE_USE_CPU=1, one refusal without."""
    import json

    code, lines = _torchrun(marked_pack, tmp_path / "synced", use_cpu=True)
    assert code == 0, "\n".join(lines[-30:])
    ranks = [json.loads((tmp_path / "synced" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert {(r["distributed_type"], r["num_processes"]) for r in ranks} == {
        ("DistributedType.MULTI_CPU", 2)
    }
    halves = [r["example_ids"] for r in ranks]
    assert halves[0] and halves[1] and not set(halves[0]) & set(halves[1])  # disjoint halves
    assert sorted(halves[0] + halves[1]) == list(range(58))  # every example, once
    assert ranks[0]["params"] == ranks[1]["params"]  # gradients synced: one model

    code, lines = _torchrun(marked_pack, tmp_path / "apart", use_cpu=False)
    refused = {line for line in lines if line.startswith("refused: ")}
    assert code != 0 and not list((tmp_path / "apart").iterdir())  # no rank trained
    assert refused == {
        "refused: WORLD_SIZE=2 but accelerate runs 1 process(es) and syncs no gradients: each "
        f"rank would train its own copy of the model ({FIX})"
    }, "\n".join(lines[-30:])
