"""The tokenizer and template a process works with: the driver's, or loaded once per process.

Every command runs its work as engine tasks (:mod:`packshard.engine`).  A task names the
tokenizer and template by their specs (paths, ``builtin:NAME``) and asks :func:`loaded`
for them::

    driver process                                  worker process (local or Ray)
    sharing(specs, load.result) ─┐                  loaded(specs) ─► load once, keep
    task in this process: loaded(specs) ┘─► the driver's objects (never loaded twice)

The entry :func:`sharing` opens is keyed by process id too, so that a process forked from
the driver never waits on its loading thread.  Elsewhere the first task of a process loads
them and later tasks reuse them (four specs at most are kept).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import lru_cache

from packshard.ingest.template.render import ChatTemplate, load_template
from packshard.ingest.tokens.backends import fast_encoder
from packshard.ingest.tokens.tokenizer import TokenizerBundle, load_tokenizer

Loaded = tuple[TokenizerBundle, ChatTemplate | None]
_SHARED: dict[tuple[int, str, str | None], Callable[[], Loaded]] = {}
_LOCK = threading.Lock()


@contextmanager
def sharing(tokenizer: str, template: str | None, load: Callable[[], Loaded]) -> Iterator[None]:
    """While open, tasks run in this process get ``load()`` for these specs."""
    key = (os.getpid(), tokenizer, template)
    _SHARED[key] = load
    try:
        yield
    finally:
        _SHARED.pop(key, None)


def loaded(tokenizer: str, template: str | None) -> Loaded:
    """Return the tokenizer and compiled template: the shared ones, else once per process."""
    shared = _SHARED.get((os.getpid(), tokenizer, template))
    if shared is not None:
        return shared()
    with _LOCK:
        return _load(tokenizer, template)


def load_early(specs: tuple[str, str | None, str] | tuple[str, str | None, str, bool]) -> None:
    """Load the tokenizer, the template and the fast encoder of ``specs`` in this process.

    ``specs`` are the tokenizer, the template, ``--backend`` and, optionally, whether the job
    is small (:data:`~packshard.ingest.types.SMALL_JOB_BYTES`).  Run on a thread of the fork
    server while it imports the rest (:mod:`packshard.engine.forkwarm`): the loads release
    the GIL.  The encoder is only built; each worker decides and proves it.  Best effort:
    what fails here fails again where the worker loads it.
    """
    tokenizer, template, backend, *small = specs
    bundle, _ = loaded(tokenizer, template)
    if backend != "reference" and bundle.aligner is not None:
        with suppress(Exception):  # not installed or not loadable: each worker says why
            fast_encoder(bundle, small_job=bool(small and small[0]))


@lru_cache(maxsize=4)
def _load(tokenizer: str, template: str | None) -> Loaded:
    bundle = load_tokenizer(tokenizer)
    return bundle, load_template(template, bundle)
