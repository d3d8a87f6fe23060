"""What every engine does: run one function over many tasks, results in task order.

An engine knows nothing about packing.  The caller hands it a module-level function and a
list of arguments, each with a *key* that names the work in messages (``chat.jsonl bytes
0–4194304``, ``shard-00003.parquet``)::

    driver                         engine                       workers
    run(fn, args, keys) ──► submit, at most `workers` in flight ──► fn(arg) ─┐
         ▲                   retry a crash or an unexpected error          │
         └── results[i] for args[i], in task order ◄────────────────────────┘

Rules every engine keeps:

* results come back in the order of ``args``, never in completion order, so whatever the
  caller builds from them (example ids, shard names, row order) cannot depend on scheduling;
* a :class:`~packshard.errors.PackshardError` raised by ``fn`` (bad data, a usage problem) is
  deterministic: it is not retried and reaches the caller as itself; so is an ``OSError``
  for a limit of the machine (:data:`LIMIT_ERRNOS`: file too large, disk full, quota);
* any other exception, or a worker process that dies, is retried up to ``max_retries``
  times; a task still failing then stops the job with :class:`TaskFailed` naming its key,
  once the other tasks have finished (their work is kept for ``--resume``);
* tasks must be idempotent: a retried task may find what an earlier attempt left behind.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from packshard.errors import PackshardError, UsageError

ENGINES = ("local", "ray")
"""``--engine``: processes on this machine, or a Ray cluster."""
AUTO_BYTES = 32 << 20
"""``--workers auto`` starts one worker per this many bytes of input (:func:`auto_workers`)."""
WORKER_MEMORY = 1 << 30
"""…and no more workers than this many bytes of available memory each (a worker's peak is
about 300 MiB on the shared chat data, ``docs/scale.md``; the rest is room for long records)."""
MAX_RETRIES = 2
LIMIT_ERRNOS = frozenset({errno.EFBIG, errno.ENOSPC, errno.EDQUOT})
"""``OSError`` numbers a retry cannot cure: they stop the job at once, as themselves."""


FORK_WARM_ENV = "PACKSHARD_FORK_WARM"
"""Where a local engine names its :class:`WarmUp` for the fork server
(:mod:`~packshard.engine.forkwarm`)."""


@dataclass(frozen=True, slots=True)
class WarmUp:
    """``module.function(arg)``, run once by each local worker as it starts (in its fork server).

    Named, not held: the caller need not import the module (the fork server does), and it
    travels as JSON.  ``early`` (module, function) gets the same argument first, on a thread.
    """

    module: str
    function: str
    arg: Any
    early: tuple[str, str] | None = None

    def spec(self) -> str:
        """Return the JSON the fork server reads (TypeError: the argument is not JSON)."""
        return json.dumps([self.module, self.function, self.arg, self.early])

    def run(self) -> None:
        """Run the warm-up in this process (its module imported here)."""
        getattr(importlib.import_module(self.module), self.function)(self.arg)


class TaskFailed(PackshardError):
    """A task kept failing (it raised, or its worker died) after every retry."""

    def __init__(self, key: str, attempts: int, cause: str) -> None:
        self.key = key
        super().__init__(
            f"{key}: failed {attempts} times ({cause}); nothing was published "
            "(fix the cause, then rerun with --resume to keep the finished units)"
        )


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """How to run: ``engine`` (:data:`ENGINES`), ``workers``, a Ray cluster ``address``.

    ``workers=None`` is ``--workers auto``: the command sizes it by its inputs
    (:meth:`sized`) before it opens the engine.
    """

    engine: str = "local"
    workers: int | None = 1
    address: str | None = None
    max_retries: int = MAX_RETRIES

    def check(self) -> None:
        """Raise :class:`UsageError` for options no engine can honour."""
        if self.engine not in ENGINES:
            raise UsageError(f"--engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.workers is not None and self.workers < 1:
            raise UsageError(f"--workers must be at least 1, got {self.workers}")
        if self.address is not None and self.engine != "ray":
            raise UsageError("--ray-address needs --engine ray")

    @property
    def serial(self) -> bool:
        """True for one local worker: the single-process path, no engine at all."""
        return self.engine == "local" and self.workers == 1

    def sized(self, input_bytes: int) -> EngineOptions:
        """Return these options with ``--workers auto`` resolved for ``input_bytes`` of input."""
        if self.workers is not None:
            return self
        return dataclasses.replace(self, workers=auto_workers(input_bytes))


def auto_workers(input_bytes: int) -> int:
    """Size ``--workers auto``: one worker per :data:`AUTO_BYTES` of input, at most one per core.

    And at most one per :data:`WORKER_MEMORY` of available memory.

    A worker is a second interpreter to start (imports, tokenizer, canary: about 1.5 CPU-s),
    so small inputs keep one process.  Measured on 2 cores with phi-3 and the shared chat data
    repeated, whole ``pack`` wall time with 1 → 2 workers: 7.5 MB 2.7–2.9 → 3.0–3.2 s (slower),
    19 MB 4.7–4.9 → 4.2–4.9 s (even), 72 MB 8.7–11.3 → 6.8–7.5 s.  The output does not depend
    on the number of workers (units are cut by size alone), so ``auto`` changes time, never
    bytes.
    """
    wanted = min(usable_cores(), input_bytes // AUTO_BYTES)
    available = available_memory()
    if available is not None:
        wanted = min(wanted, available // WORKER_MEMORY)
    return max(1, wanted)


def usable_cores() -> int:
    """Count the cores this process may run on (its CPU affinity where the system has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


CORES_ENV = "PACKSHARD_WORKER_CORES"
"""Set by an engine in each worker it starts: the cores that worker's share is."""


def worker_share(options: EngineOptions) -> int:
    """Cores each worker of ``options`` may use: the usable ones shared out; one on Ray."""
    if options.engine == "ray":
        return 1  # Ray gives each task one CPU
    return max(1, usable_cores() // (options.workers or 1))


def worker_cores() -> int:
    """Cores the work of this process may use: its engine's share, else every usable core.

    A task in a worker of two on two cores gets 1: a second thread there would only take
    turns with the first (:func:`packshard.ingest.stream.ingest` then encodes in place).
    """
    share = os.environ.get(CORES_ENV, "")
    return int(share) if share.isdigit() and int(share) > 0 else usable_cores()


def available_memory() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class Engine(Protocol):
    """Runs ``fn`` over ``args``; see the module docstring for the rules."""

    name: str
    workers: int

    @property
    def starting(self) -> bool:
        """Whether the workers are still starting up (the driver has time to spare)."""
        ...

    def run(
        self,
        fn: Callable[[Any], Any],
        args: Sequence[Any],
        keys: Sequence[str],
        on_result: Callable[[int, Any], None] | None = None,
        on_started: Callable[[], None] | None = None,
    ) -> list[Any]:
        """Return ``[fn(a) for a in args]``; ``on_result(i, value)`` as each one finishes.

        ``on_started()`` is called once, when the first tasks have been handed to the workers
        (after the last task, on an engine that runs them in this process).
        """
        ...

    def close(self) -> None:
        """Release the workers."""
        ...


class SerialEngine:
    """Runs every task in this process, one after the other (``--workers 1``)."""

    name = "local"
    workers = 1
    starting = False

    def __init__(self, max_retries: int = MAX_RETRIES) -> None:
        self.max_retries = max_retries

    def run(
        self,
        fn: Callable[[Any], Any],
        args: Sequence[Any],
        keys: Sequence[str],
        on_result: Callable[[int, Any], None] | None = None,
        on_started: Callable[[], None] | None = None,
    ) -> list[Any]:
        """Run the tasks in order, retrying unexpected errors like any engine."""
        out = []
        for i, (arg, key) in enumerate(zip(args, keys, strict=True)):
            for attempt in range(1, self.max_retries + 2):
                try:
                    value = fn(arg)
                    break
                except PackshardError:
                    raise
                except Exception as exc:
                    if isinstance(exc, OSError) and exc.errno in LIMIT_ERRNOS:
                        raise
                    if attempt > self.max_retries:
                        raise TaskFailed(key, attempt, describe(exc)) from exc
            out.append(value)
            del arg  # a task's inputs (a shard's segments) are not kept into the next step
            if on_result is not None:
                on_result(i, value)
        if on_started is not None:  # nothing runs elsewhere: whatever waited runs after
            on_started()
        return out

    def close(self) -> None:
        """Nothing to release."""


def describe(exc: BaseException) -> str:
    """``OSError: disk full``: an exception in one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def call(fn: Callable[[Any], Any], arg: Any, env: dict[str, str] | None = None) -> tuple[str, Any]:
    """Run ``fn(arg)`` in a worker: a :class:`PackshardError` comes back as a value.

    Returning it instead of raising keeps it out of the engine's retries (it is
    deterministic) and brings it back unchanged.  ``env`` is set first (thread counts must
    be in place before the tokenizer starts its pool).
    """
    if env:
        os.environ.update(env)
    try:
        return "ok", fn(arg)
    except PackshardError as exc:
        return "error", (type(exc), exc.args, vars(exc))
    except OSError as exc:
        if exc.errno not in LIMIT_ERRNOS:
            raise
        return "error", (OSError, (exc.errno, exc.strerror), {"filename": exc.filename})


def raise_error(carried: tuple[type[Exception], tuple[Any, ...], dict[str, Any]]) -> None:
    """Raise the error :func:`call` carried back (rebuilt without calling its ``__init__``)."""
    cls, args, state = carried
    if issubclass(cls, OSError):  # a machine limit (see call)
        error = OSError(*args)
        error.filename = state.get("filename")
        raise error
    exc = cls.__new__(cls)
    Exception.__init__(exc, *args)
    exc.__dict__.update(state)
    raise exc
