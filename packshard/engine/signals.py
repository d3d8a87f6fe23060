"""SIGTERM and SIGHUP on a driver: unwind like Ctrl-C, then exit with the signal's code.

A job on an engine has helpers: worker processes, the fork server they come from and
multiprocessing's resource tracker.  Killed by the default action of SIGTERM or SIGHUP, the
driver would leave them running (two workers hold hundreds of megabytes) and its partial
output folder behind.  While an engine is open, :func:`terminating` turns either signal into
:class:`Terminated`, raised in the main thread like ``KeyboardInterrupt``::

    SIGTERM ─► Terminated(15) ─► LocalEngine kills its workers, stops the fork server
                             ─► every ``with`` unwinds: the partial folder is removed
                             ─► the command line exits 128 + 15 = 143

A second signal during the unwinding is ignored, so that the clean-up finishes.  A driver
killed outright (SIGKILL) cannot clean up; its workers notice it is gone
(:func:`watch_driver`, every :data:`WATCH_SECONDS`) and exit, and the fork server and the
tracker end when their last client is gone.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGHUP)
WATCH_SECONDS = 0.5


class Terminated(BaseException):
    """The driver received SIGTERM or SIGHUP (a ``BaseException``, as ``KeyboardInterrupt``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The shell's code for a process ended by this signal: 128 + its number."""
        return 128 + self.signum


def _raise(signum: int, frame: FrameType | None) -> None:
    for sig in SIGNALS:  # the clean-up this starts must not be interrupted in its turn
        if signal.getsignal(sig) is _raise:
            signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


@contextmanager
def terminating() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Terminated` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # a signal the host program handles or ignores (nohup) is left to it
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    taken = [sig for sig, handler in previous.items() if handler == signal.SIG_DFL]
    for sig in taken:
        signal.signal(sig, _raise)
    try:
        yield
    finally:
        for sig in taken:
            signal.signal(sig, previous[sig])


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie waiting to be reaped counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def watch_driver(driver: int) -> None:
    """In a worker: start a daemon thread that ends the process once ``driver`` is gone."""

    def watch() -> None:
        while not _gone(driver):
            time.sleep(WATCH_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="packshard-driver-watch", daemon=True).start()


def stop_fork_server() -> None:
    """Stop multiprocessing's fork server, if this process started one (private API)."""
    try:
        from multiprocessing import forkserver

        forkserver._forkserver._stop()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ChildProcessError):
        return
