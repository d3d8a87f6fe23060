"""The fork server's warm-up: the early loads on a thread beside it, joined before it ends."""

from __future__ import annotations

import threading
import time

import pytest

from packshard.engine import WarmUp, forkwarm

SEEN: list[tuple[str, str, object]] = []


@pytest.fixture(autouse=True)
def unfrozen(monkeypatch):
    """Keep this test process's objects collectable (the server freezes them after warming)."""
    frozen = []
    monkeypatch.setattr(forkwarm.gc, "freeze", lambda: frozen.append(1))
    return frozen


EARLY: list[threading.Thread] = []


def early(arg: object) -> None:
    EARLY.append(threading.current_thread())
    time.sleep(0.05)  # still loading when the warm-up starts
    SEEN.append(("early", threading.current_thread().name, arg))


def warm(arg: object) -> None:
    SEEN.append(("warm", threading.current_thread().name, arg))


def failing(arg: object) -> None:
    raise OSError("no tokenizer here")


def test_early_runs_on_a_thread_that_is_joined_before_the_warm_up_returns(monkeypatch, unfrozen):
    SEEN.clear()
    EARLY.clear()
    spec = WarmUp(__name__, "warm", ["tok", None], (__name__, "early")).spec()
    monkeypatch.setenv(forkwarm.FORK_WARM_ENV, spec)
    forkwarm._warm()
    assert len(EARLY) == 1 and not EARLY[0].is_alive()  # joined before the server forks
    assert unfrozen == [1]  # what the warm-up made is out of the collector's sight
    kinds = {kind: (thread, arg) for kind, thread, arg in SEEN}
    here = threading.current_thread().name
    assert kinds["warm"] == (here, ("tok", None))  # on the server's own thread
    assert kinds["early"][1] == ("tok", None) and kinds["early"][0] != here


def test_a_failing_early_load_leaves_the_warm_up_to_load(monkeypatch):
    SEEN.clear()
    spec = WarmUp(__name__, "warm", 3, (__name__, "failing")).spec()
    monkeypatch.setenv(forkwarm.FORK_WARM_ENV, spec)
    forkwarm._warm()
    assert SEEN == [("warm", threading.current_thread().name, 3)]
    monkeypatch.setenv(forkwarm.FORK_WARM_ENV, WarmUp(__name__, "failing", 3).spec())
    forkwarm._warm()  # best effort: the first task meets the failure and reports it


def touch(path: str) -> None:
    open(path, "w").close()


def test_only_the_fork_server_runs_the_warm_up(tmp_path):
    import os
    import subprocess
    import sys

    marker = tmp_path / "warmed"
    env = {**os.environ, forkwarm.FORK_WARM_ENV: WarmUp(__name__, "touch", str(marker)).spec()}
    code = "import packshard.engine, packshard.engine.local, packshard.pack.units.early"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert not marker.exists()  # a driver that inherits the variable warms nothing
    subprocess.run([sys.executable, "-c", "import packshard.engine.forkwarm"], env=env, check=True)
    assert marker.exists()
