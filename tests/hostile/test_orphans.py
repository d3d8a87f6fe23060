"""A driver stopped by a signal leaves nothing running and nothing half-written.

SIGTERM or SIGHUP to the driver of ``--workers 2`` ends its workers, the fork server and the
resource tracker, removes the partial folder and exits 128 + the signal's number; after a
SIGKILL, which allows no clean-up, the workers notice the driver is gone and exit.  Either
way no process of the job is alive 10 seconds later.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# the driver's signals as in a terminal: a runner started under nohup would hand it SIGHUP
# ignored, which packshard rightly leaves to its host (engine/signals.py)
DRIVER = (
    "import signal; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
    "from packshard.cli.commands import main; main()"
)


def start(tmp_path: Path, tokenizer: Path) -> tuple[subprocess.Popen, Path]:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"w{i % 9 + 2} w3"}) + "\n" for i in range(400)))
    env = dict(os.environ, PACKSHARD_FAULTS="hang:bytes:9")  # every unit hangs
    argv = [sys.executable, "-c", DRIVER, "pack", str(data), "-t", str(tokenizer)]
    argv += ["--max-seq-len", "16", "--workers", "2", "-o", str(tmp_path / "out")]
    argv += ["--no-progress", "--split-bytes", "1000"]
    driver = subprocess.Popen(argv, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    return driver, tmp_path / ".out.units" / "_faults"


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[1])


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` now (read from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        found = _stat(int(entry)) if entry.isdigit() else None
        if found is not None:
            parents.setdefault(found[1], []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        out += children
        todo += children
    return out


def job_processes(driver: subprocess.Popen, faults: Path) -> list[int]:
    """Wait until both workers hang in a task; return every process of the job but the driver."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if faults.is_dir() and len(list(faults.iterdir())) >= 2:
            return descendants(driver.pid)
        assert driver.poll() is None, driver.stderr.read() if driver.stderr else ""
        time.sleep(0.1)
    raise AssertionError("the workers never started their tasks")


def alive(pids: list[int]) -> list[int]:
    return [p for p in pids if (found := _stat(p)) is not None and found[0] not in "ZX"]


def alive_after(pids: list[int], seconds: float = 10) -> list[int]:
    """The processes of ``pids`` alive ``seconds`` from now, or none as soon as none is.

    A process that has ended cannot come back, so once none is alive none is at the deadline
    either: the wait stops there instead of sleeping out the ten seconds.
    """
    deadline = time.monotonic() + seconds
    while True:
        late = time.monotonic() >= deadline
        left = alive(pids)
        if not left or late:
            return left
        time.sleep(0.1)


def kill_left(pids: list[int]) -> None:
    """Never leave a process of a failed test behind."""
    for pid in alive(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_end_every_process_and_clean_the_partial(tmp_path, word_tokenizer, sig):
    driver, faults = start(tmp_path, word_tokenizer)
    helpers = job_processes(driver, faults)
    assert len(helpers) >= 3  # two workers, the fork server (and the resource tracker)
    driver.send_signal(sig)
    code = driver.wait(30)
    left = alive_after(helpers)
    kill_left(helpers)
    assert left == []
    assert code == 128 + sig
    assert driver.stderr is not None
    assert driver.stderr.read().endswith(
        f"error: stopped by {signal.Signals(sig).name} (the partial output was removed)\n"
    )
    assert not list(tmp_path.glob(".out.partial-*"))
    assert not (tmp_path / "out").exists()


def test_sigkill_of_the_driver_leaves_no_process_running(tmp_path, word_tokenizer):
    driver, faults = start(tmp_path, word_tokenizer)
    helpers = job_processes(driver, faults)
    assert len(helpers) >= 3
    driver.kill()
    driver.wait(30)
    left = alive_after(helpers)
    kill_left(helpers)
    assert left == []
