"""``--engine local``: worker processes on this machine, with retries that name the culprit.

Workers are started with ``forkserver`` (``spawn`` where it is missing): clean processes that
never inherit the driver's threads (the tokenizer's pool, Arrow's), so none can deadlock after
a fork.  Each worker sets the driver's ``env`` (thread counts) and runs the caller's warm-up
(loading the tokenizer, compiling the template) once as it starts; the workers are started
when the engine opens, so they warm up while the driver is still busy.  What the tasks cache
stays in the worker for the tasks after.

A Python exception in a task is retried on its own.  A worker that dies (killed, out of
memory, a crash in native code) breaks the whole pool, and every task then in flight is
suspect, not only the one that killed it.  So::

    pool breaks ─► new pool; the suspects run again one at a time, nothing beside them
                   ├─ a suspect that succeeds is done (it was a bystander)
                   └─ a suspect whose worker dies alone is charged; after max_retries
                      deaths of its own the job stops with TaskFailed naming it

A task that fails for good does not stop the others: they finish (so that ``--resume`` has
them), then the failure of the first such task, in task order, is raised.  Results are
collected by task index, so completion order never shows.

A worker ends itself once the driver is gone (:func:`~packshard.engine.signals.watch_driver`);
a driver stopped by Ctrl-C, SIGTERM or SIGHUP terminates its workers and the fork server
before it unwinds (:mod:`packshard.engine.signals`).

Workers import the main module again (as every ``forkserver`` or ``spawn`` child does): a
script that starts a job at its top level, not under ``if __name__ == "__main__":``, would
start it again in every worker, which dies.  A script whose source never tests ``__name__``
is refused before any worker starts.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from packshard.engine.base import FORK_WARM_ENV, TaskFailed, WarmUp, call, describe, raise_error
from packshard.engine.signals import stop_fork_server, watch_driver
from packshard.errors import UsageError

GUARD = 'if __name__ == "__main__":'
READY_WAIT = 0.25
KILL_WAIT = 5.0  # seconds a terminated worker has to exit before it is killed


def check_main_guard() -> None:
    """Refuse a main script without a ``__name__`` test: every worker would run it again.

    Nothing is refused where there is no script file (an interactive session, a notebook,
    ``python -c``) or where it cannot be read (say nothing rather than guess).
    """
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path or not os.path.isfile(path):
        return
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            guarded = "__name__" in fh.read()
    except OSError:
        return
    if not guarded:
        raise UsageError(
            f"{path}: the workers of --workers/--engine local import this script again and "
            f"would rerun it; put the call under `{GUARD}` (or use one worker)"
        )


def _context(module: str, warm: WarmUp | None) -> Any:
    """Return a ``forkserver`` context that imports ``module`` and runs ``warm`` (else ``spawn``).

    The fork server imports the task's module once and runs the warm-up there, before it
    forks any worker (:mod:`packshard.engine.forkwarm`), so that each worker forked from it
    starts with the imports done and the tokenizer loaded.
    """
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    if warm is not None:
        try:
            os.environ[FORK_WARM_ENV] = warm.spec()
        except TypeError:  # not JSON: warm the workers only
            os.environ[FORK_WARM_ENV] = ""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["packshard.engine.forkwarm", module])  # first: early loads
    return ctx


def start_fork_server(warm: WarmUp) -> None:
    """Start the fork server now: it imports and runs ``warm`` while the caller works.

    A :class:`LocalEngine` opened later with the same warm-up forks its workers from this
    server (multiprocessing keeps one a process); with another warm-up its workers warm up
    themselves.  Nothing happens where there is no ``forkserver`` or where the main script
    would be imported again unguarded (the engine refuses that itself).
    """
    if "forkserver" not in mp.get_all_start_methods():
        return
    try:
        check_main_guard()
    except UsageError:  # the engine says so when it opens, in its order
        return
    _context(warm.module, warm)
    from multiprocessing import forkserver

    forkserver.ensure_running()


def _noop() -> None:
    return None


def _start_worker(env: dict[str, str], warm: WarmUp | None, driver: int) -> None:
    """Watch the driver, set its ``env``, then run the warm-up once, best effort."""
    watch_driver(driver)
    os.environ.update(env)
    if warm is not None:
        try:
            warm.run()
        except Exception:  # the first task meets the same problem and reports it properly
            return


class LocalEngine:
    """A pool of ``workers`` processes (see the module docstring)."""

    name = "local"

    def __init__(
        self,
        workers: int,
        max_retries: int,
        env: dict[str, str],
        warm: WarmUp | None = None,
    ) -> None:
        self.workers = workers
        self.max_retries = max_retries
        self._env = dict(env)
        self._warm = warm
        self._pool: ProcessPoolExecutor | None = None
        check_main_guard()
        self._starting: list[Future[Any]] = []
        self._starter: threading.Thread | None = None
        if warm is not None:  # start the workers now: they warm up while the driver works
            # on a thread: the first start waits for the fork server's imports and warm-up
            self._starter = threading.Thread(target=self._start, args=(warm.module,))
            self._starter.start()

    def _start(self, module: str) -> None:
        try:
            pool = self._executor(module)
            self._starting = [pool.submit(_noop) for _ in range(self.workers)]
        except Exception:  # the first run starts the pool again and reports what fails
            return

    def _started(self) -> None:
        if self._starter is not None:
            self._starter.join()
            self._starter = None

    @property
    def starting(self) -> bool:
        """Whether the workers are still starting (the driver has time to spare).

        Workers forked from a running fork server are up within a fraction of a second; the
        fork server's own first start (imports, the warm-up) takes a second or more.  So this
        waits up to :data:`READY_WAIT` seconds for them before it answers.
        """
        deadline = time.monotonic() + READY_WAIT
        if self._starter is not None:
            self._starter.join(READY_WAIT)
            if self._starter.is_alive():
                return True
        wait(self._starting, max(0.0, deadline - time.monotonic()))
        return not all(f.done() for f in self._starting)

    def _executor(self, module: str) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=_context(module, self._warm),
                initializer=_start_worker,
                initargs=(self._env, self._warm, os.getpid()),
            )
        return self._pool

    def _reset(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _kill(self) -> None:
        """Stop the workers now (their tasks too) and the fork server: the job is over."""
        pool, self._pool = self._pool, None
        if pool is not None:
            processes = list((getattr(pool, "_processes", None) or {}).values())
            for process in processes:
                process.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                process.join(KILL_WAIT)
                if process.is_alive():
                    process.kill()
        stop_fork_server()

    def run(
        self,
        fn: Callable[[Any], Any],
        args: Sequence[Any],
        keys: Sequence[str],
        on_result: Callable[[int, Any], None] | None = None,
        on_started: Callable[[], None] | None = None,
    ) -> list[Any]:
        """Return ``[fn(a) for a in args]`` in order; retry as the module docstring says."""
        self._started()
        results: dict[int, Any] = {}
        errors = [0] * len(args)  # Python exceptions raised by each task
        deaths = [0] * len(args)  # worker deaths charged to each task (while alone)
        todo: deque[int] = deque(range(len(args)))
        suspects: deque[int] = deque()
        running: dict[Future[Any], int] = {}
        failed: dict[int, TaskFailed] = {}  # raised once every other task is done

        def submit(queue: deque[int]) -> bool:
            """Start the next task of ``queue``; False when the pool broke meanwhile."""
            i = queue.popleft()
            try:
                running[self._executor(fn.__module__).submit(call, fn, args[i], self._env)] = i
            except BrokenProcessPool:  # a worker died since the last wait
                queue.appendleft(i)
                return False
            return True

        try:
            while todo or suspects or running:
                alone = bool(suspects)
                ok = True
                if alone and not running:
                    ok = submit(suspects)
                while ok and not alone and todo and len(running) < self.workers:
                    ok = submit(todo)
                if not ok:
                    suspects.extend(running.values())  # in flight when the pool broke
                    running.clear()
                    self._reset()
                    continue
                if on_started is not None:
                    on_started()
                    on_started = None
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                broken = False
                for future in done:
                    i = running.pop(future)
                    try:
                        kind, value = future.result()
                    except BrokenProcessPool:
                        broken = True
                        if alone:
                            deaths[i] += 1
                            if deaths[i] > self.max_retries:
                                failed[i] = TaskFailed(keys[i], deaths[i], "its worker died")
                                continue
                        suspects.append(i)
                        continue
                    except Exception as exc:  # raised inside fn, not a PackshardError
                        errors[i] += 1
                        if errors[i] > self.max_retries:
                            failed[i] = TaskFailed(keys[i], errors[i], describe(exc))
                            continue
                        todo.appendleft(i)
                        continue
                    if kind == "error":
                        raise_error(value)
                    results[i] = value
                    if on_result is not None:
                        on_result(i, value)
                if broken:
                    suspects.extend(running.values())  # in flight when the pool broke
                    running.clear()
                    self._reset()
        except Exception:
            self._reset()
            raise
        except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: nothing is left running
            self._kill()
            raise
        if failed:
            raise failed[min(failed)]
        return [results[i] for i in range(len(args))]

    def close(self) -> None:
        """Stop the workers."""
        self._started()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
