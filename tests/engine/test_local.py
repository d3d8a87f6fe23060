from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from packshard.engine import EngineOptions, TaskFailed, open_engine
from packshard.errors import UsageError
from tests.helpers import cores_task, flaky_task, slow_square


@pytest.fixture(scope="module")
def pool():
    with open_engine(EngineOptions("local", workers=2)) as engine:
        yield engine


def test_results_come_back_in_task_order_not_completion_order(pool):
    seen = []
    out = pool.run(slow_square, [1, 2, 3], ["a", "b", "c"], lambda i, v: seen.append(i))
    assert out == [1, 4, 9]
    assert sorted(seen) == [0, 1, 2]


def test_an_exception_is_retried_then_the_task_succeeds(pool, tmp_path):
    assert pool.run(flaky_task, [(str(tmp_path), 2, "raise")], ["unit"]) == ["done after 3"]


def test_a_task_that_keeps_raising_fails_the_job_naming_it(pool, tmp_path):
    with pytest.raises(TaskFailed) as err:
        pool.run(flaky_task, [(str(tmp_path), 9, "raise")], ["chat.jsonl bytes 0–4096"])
    assert str(err.value) == (
        "chat.jsonl bytes 0–4096: failed 3 times (OSError: flaky disk, attempt 3); nothing was "
        "published (fix the cause, then rerun with --resume to keep the finished units)"
    )
    assert len(list(tmp_path.iterdir())) == 3  # one try and two retries


def test_a_packshard_error_is_not_retried_and_arrives_as_itself(pool, tmp_path):
    with pytest.raises(UsageError, match=r"^bad option \(use --good\)$"):
        pool.run(flaky_task, [(str(tmp_path), 9, "usage")], ["unit"])
    assert len(list(tmp_path.iterdir())) == 1


def test_a_dead_worker_is_retried_and_bystanders_are_not_charged(tmp_path):
    dying, bystander = tmp_path / "dying", tmp_path / "bystander"
    dying.mkdir()
    bystander.mkdir()
    args = [(str(dying), 1, "crash"), (str(bystander), 0, "crash")]
    with open_engine(EngineOptions("local", workers=2)) as engine:
        dying_result, bystander_result = engine.run(flaky_task, args, ["a", "b"])
    assert dying_result == "done after 2"
    # a bystander whose result was still on its way when the pool broke runs again, alone,
    # and is not charged: whichever happened, it succeeds
    assert bystander_result in ("done after 1", "done after 2")


def test_a_task_whose_worker_keeps_dying_fails_naming_it(tmp_path):
    with open_engine(EngineOptions("local", workers=2)) as engine, pytest.raises(TaskFailed) as err:
        engine.run(flaky_task, [(str(tmp_path), 9, "crash")], ["rows.parquet row groups 2–3"])
    assert str(err.value).startswith(
        "rows.parquet row groups 2–3: failed 3 times (its worker died)"
    )


def test_engine_options_are_checked():
    with pytest.raises(UsageError, match=r"^--workers must be at least 1, got 0$"):
        EngineOptions("local", 0).check()
    with pytest.raises(UsageError, match=r"^--ray-address needs --engine ray$"):
        EngineOptions("local", 2, "10.0.0.1:6379").check()
    with pytest.raises(UsageError, match=r"^--engine 'spark' is not one of local, ray$"):
        EngineOptions("spark").check()
    assert EngineOptions("local", 1).serial and not EngineOptions("local", 2).serial


def test_a_script_without_a_main_guard_is_refused_before_any_worker_starts(tmp_path):
    """Workers import the main script again: one without the guard would rerun the job in each
    worker and die there; it is refused in one line instead."""
    import subprocess
    import sys

    body = (
        "from packshard.engine import EngineOptions, open_engine\n"
        "from tests.helpers import slow_square\n"
        "{indent}with open_engine(EngineOptions('local', workers=2)) as engine:\n"
        "{indent}    print(engine.run(slow_square, [2, 3], ['a', 'b']))\n"
    )
    bare, guarded = tmp_path / "bare.py", tmp_path / "guarded.py"
    bare.write_text(body.format(indent=""), encoding="utf-8")
    guarded.write_text(
        body.replace("{indent}with", 'if __name__ == "__main__":\n{indent}with').format(
            indent="    "
        ),
        encoding="utf-8",
    )
    root = str(Path(__file__).resolve().parents[2])

    def run(script):
        return subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            cwd=root,
            timeout=120,
            env={**os.environ, "PYTHONPATH": root},
        )

    refused = run(bare)
    assert refused.returncode != 0 and "bootstrapping" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        f"packshard.errors.UsageError: {bare}: the workers of --workers/--engine local import "
        'this script again and would rerun it; put the call under `if __name__ == "__main__":` '
        "(or use one worker)"
    )
    ran = run(guarded)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[4, 9]"


def _too_large(path: str) -> None:
    raise OSError(errno.EFBIG, "File too large", path)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_machine_limit_stops_the_job_as_itself(workers):
    """File too large, disk full: a retry cannot cure them, and TaskFailed would hide them."""
    with open_engine(EngineOptions("local", workers)) as engine:
        with pytest.raises(OSError) as err:
            engine.run(_too_large, ["shard-00000.parquet"], ["shard-00000.parquet"])
    assert type(err.value) is OSError and err.value.errno == errno.EFBIG
    assert err.value.filename == "shard-00000.parquet"


def test_each_worker_knows_its_share_of_the_cores(pool, monkeypatch):
    from packshard.engine import CORES_ENV, usable_cores, worker_cores, worker_share

    share = max(1, usable_cores() // 2)
    assert pool.run(cores_task, [0, 1], ["a", "b"]) == [share, share]
    assert worker_share(EngineOptions("ray", workers=8)) == 1
    monkeypatch.delenv(CORES_ENV, raising=False)
    assert worker_cores() == usable_cores()  # a process no engine started: every core
    monkeypatch.setenv(CORES_ENV, "junk")
    assert worker_cores() == usable_cores()
