from __future__ import annotations

import pytest

from packshard.engine import EngineOptions, TaskFailed, open_engine
from packshard.errors import UsageError
from tests.helpers import flaky_task, slow_square


def test_without_ray_the_engine_says_what_to_install(monkeypatch):
    import sys

    from packshard.engine.ray import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # what a core install has
    with pytest.raises(UsageError) as err:
        import_ray()
    assert str(err.value) == (
        "--engine ray needs Ray, which is not installed (pip install 'packshard[ray]')"
    )


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_ray_keeps_task_order_and_retries(ray_cluster, tmp_path):
    dying = tmp_path / "dying"
    dying.mkdir()
    with open_engine(EngineOptions("ray", workers=2)) as engine:
        assert engine.name == "ray" and engine.workers == 2
        assert engine.run(slow_square, [1, 2, 3], ["a", "b", "c"]) == [1, 4, 9]
        assert engine.run(flaky_task, [(str(dying), 1, "crash")], ["a"]) == ["done after 2"]
    assert ray_cluster.is_initialized()  # a cluster the engine joined is left running


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_ray_failures_name_the_task(ray_cluster, tmp_path):
    raising, usage = tmp_path / "raising", tmp_path / "usage"
    raising.mkdir()
    usage.mkdir()
    with open_engine(EngineOptions("ray", workers=2)) as engine:
        with pytest.raises(
            TaskFailed, match=r"^x\.jsonl bytes 0–9: failed 3 times \(OSError: flaky"
        ):
            engine.run(flaky_task, [(str(raising), 9, "raise")], ["x.jsonl bytes 0–9"])
        with pytest.raises(UsageError, match=r"^bad option"):
            engine.run(flaky_task, [(str(usage), 9, "usage")], ["u"])
    assert len(list(usage.iterdir())) == 1  # never retried
