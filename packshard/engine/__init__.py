"""Engines that run packshard's work units: in this process, on local processes, or on Ray.

:func:`open_engine` picks one from :class:`EngineOptions`: the serial engine for one local
worker, :mod:`packshard.engine.local`'s processes for more, :mod:`packshard.engine.ray` for a
Ray cluster (Ray is imported only then).  The rules every engine keeps are in
:mod:`packshard.engine.base`; what starts before the work and beside it, in
:mod:`packshard.engine.startup`; the allocator's settings for drivers and workers, in
:mod:`packshard.engine.heap`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from packshard.engine.base import (
    AUTO_BYTES,
    CORES_ENV,
    ENGINES,
    WORKER_MEMORY,
    Engine,
    EngineOptions,
    SerialEngine,
    TaskFailed,
    WarmUp,
    auto_workers,
    usable_cores,
    worker_cores,
    worker_share,
)
from packshard.engine.signals import terminating
from packshard.engine.startup import Beside, prestart, while_starting

__all__ = [
    "AUTO_BYTES",
    "ENGINES",
    "WORKER_MEMORY",
    "Beside",
    "Engine",
    "EngineOptions",
    "TaskFailed",
    "WarmUp",
    "auto_workers",
    "open_engine",
    "prestart",
    "usable_cores",
    "while_starting",
    "worker_cores",
    "worker_share",
]


def _nothing(folders: Sequence[Path]) -> None:
    """Ask nothing: every worker of this machine sees its folders."""


@contextmanager
def open_engine(
    options: EngineOptions,
    env: dict[str, str] | None = None,
    warm: WarmUp | None = None,
    shared: Sequence[Path] = (),
) -> Iterator[Engine]:
    """Start the engine ``options`` name, yield it, and release it whatever happens.

    ``shared``: the folders every task reads or writes; on a joined Ray cluster each node is
    asked first whether it sees them (:meth:`~packshard.engine.ray.RayEngine.check_reach`).

    ``env`` is set in every worker before it runs a task (thread counts, for instance),
    beside the worker's share of the cores (:func:`worker_cores` reads it there);
    ``warm`` runs once in each local worker as it starts (best effort: a load
    that fails there fails again, with its message, in the first task).  Ray is imported only
    here, and only when asked for.
    """
    options.check()
    if options.workers is None:
        raise ValueError("workers=None (auto) is sized by the inputs first: EngineOptions.sized")
    engine: Engine
    reach: Callable[[Sequence[Path]], None] = _nothing  # a joined Ray cluster asks its nodes
    env = {CORES_ENV: str(worker_share(options)), **(env or {})}
    if options.serial:
        engine = SerialEngine(options.max_retries)
    elif options.engine == "local":
        from packshard.engine.local import LocalEngine

        engine = LocalEngine(options.workers, options.max_retries, env, warm)
    else:
        from packshard.engine.ray import RayEngine

        ray_engine = RayEngine(options.workers, options.address, options.max_retries, env)
        engine, reach = ray_engine, ray_engine.check_reach
    try:
        with terminating():
            reach(shared)
            yield engine
    finally:
        engine.close()
