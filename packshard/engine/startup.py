"""Start-up: the workers started early, and what the driver does while they start.

A local job's first second or two, on 2 cores (phi-3, 20M tokens, two workers)::

    driver        [options][import, checks, claim OUT][hash inputs][hand out units][merge…
    fork server            [imports, tokenizer, encoder, warm-up]──► workers [map units…]
    driver thread                                            [load stage][planner kernels]
                           ^ prestart            ^ while_starting   ^ Beside.start

Three pieces, each about the engine's workers rather than about the work:

* :func:`prestart`: the fork server started as soon as the command has read its options, so
  that its imports and warm-up (0.9 s for ``pack``) run beside the driver's own imports
  instead of after them (:mod:`packshard.engine.local`, :mod:`packshard.engine.forkwarm`).
* :func:`while_starting`: the driver does work of the job's first step itself (``pack``: it
  hashes the inputs, in order) on a thread for as long as the workers are starting, stops
  within a piece once they are up, and hands the workers the rest: on 20.6M phi-3 tokens in
  152 files the driver hashed every file before the workers were up, and the first unit
  began mapping 0.05–0.10 s sooner than with every file sent to them.
* :class:`Beside`: a load the driver needs later (``pack``: its own tokenizer and template,
  for the manifest), on a thread, started where it delays nothing: at once while the workers
  are still starting, else once the tasks are handed out, since it holds the GIL for most of
  its time and would delay the first tasks.  The step after it (the planner's kernels) is
  queued behind it, so the plan, which follows the map with one core idle, does not wait.

The serial engine is never starting: the driver does nothing early and its tasks are the work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from packshard.engine.base import Engine, EngineOptions, WarmUp

T = TypeVar("T")
R = TypeVar("R")


def prestart(options: EngineOptions, warm: WarmUp) -> None:
    """Start now what :func:`~packshard.engine.open_engine` will start for ``options``.

    For local workers that is the fork server, importing and running the warm-up while the
    caller goes on (:func:`~packshard.engine.local.start_fork_server`); the serial engine
    and Ray start nothing early.  ``options.workers`` must be sized.
    """
    if options.engine == "local" and options.workers is not None and not options.serial:
        from packshard.engine.local import start_fork_server

        start_fork_server(warm)


def while_starting(
    engine: Engine,
    items: Sequence[T],
    own: Callable[[T, Callable[[], bool]], R | None],
    meanwhile: Callable[[], None] = lambda: None,
) -> list[R]:
    """Do ``items`` in order on a driver thread while ``engine``'s workers start.

    ``own(item, stopped)`` returns the item's result, or None to leave it (and every item
    after it) to the workers; it should poll ``stopped`` and give up, returning None or
    raising, once that says the workers are up.  ``meanwhile`` is called once, on this
    thread, if the workers are found starting.  Returns the results of the items done, a
    prefix of ``items``: the caller sends the rest to the workers.
    """
    done: list[R] = []
    stop = threading.Event()

    def work() -> None:
        for item in items:
            if stop.is_set():
                return
            try:
                value = own(item, stop.is_set)
            except Exception:  # unreadable, or stopped mid-item: left to a worker's task
                return
            if value is None:
                return
            done.append(value)

    thread = threading.Thread(target=work, name="packshard-early", daemon=True)
    thread.start()
    if engine.starting:  # waits a while for the workers before it answers
        meanwhile()
        while thread.is_alive() and engine.starting:
            pass
    stop.set()
    thread.join()
    return done


class Beside(Generic[T]):
    """``load()`` on the driver's thread ``pool``, then ``then()``; started once, on demand.

    :meth:`start` is idempotent, and :meth:`result` and :meth:`failed` start it if nobody
    has (see the module notes for where the callers start it).
    """

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        load: Callable[[], T],
        then: Callable[[], object] = lambda: None,
    ) -> None:
        self._pool, self._load, self._then = pool, load, then
        self._future: Future[T] | None = None

    def start(self) -> None:
        """Start the load, once, with ``then`` queued behind it."""
        if self._future is None:
            self._future = self._pool.submit(self._load)
            self._pool.submit(self._then)

    def result(self) -> T:
        """Return what the load returned (raising what it raised), once it is done."""
        self.start()
        assert self._future is not None
        return self._future.result()

    def failed(self) -> bool:
        """Whether the load raised, once it is done."""
        self.start()
        assert self._future is not None
        return self._future.exception() is not None
