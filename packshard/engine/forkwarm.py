"""Warm-up run once in the fork server, so that every worker forked from it starts warm.

The local engine's fork server imports this module first, before it forks any worker.  When
the engine has a :class:`~packshard.engine.base.WarmUp` it names it in
``PACKSHARD_FORK_WARM`` (JSON) before the server starts; importing this module then runs it
once in the server: a tokenizer loaded and a template compiled there are in every worker
from its first instruction, instead of being loaded again by each.  A warm-up may name an
``early`` function too, run on a thread from the start while this module imports the
warm-up's own module (0.37 s of numba and the rest for ``pack``): loads whose libraries
release the GIL (a tokenizer, a fast encoder) overlap those imports, and the thread is
joined before the server forks anything (``pack``'s workers began mapping at 0.8 s instead
of 1.0 on phi-3)::

    server main thread   [import the warm-up's module     ][warm-up]──► fork workers
    early thread         [load tokenizer, build encoder]─────┘ joined

A fork server outlives one job: a later job with other files warms its workers itself (the
initializer).  Best effort: a failure here is silent, because the first task meets it
again and reports it.
"""

from __future__ import annotations

import gc
import json
import os
import threading
from typing import Any

from packshard.engine.base import FORK_WARM_ENV, WarmUp
from packshard.jit import skip_if_own


def _quietly(module: str, function: str, arg: Any) -> None:
    try:
        WarmUp(module, function, arg).run()
    except Exception:  # best effort: the warm-up or the first task loads it again
        return


def _warm() -> None:
    spec = os.environ.get(FORK_WARM_ENV)
    if not spec:
        skip_if_own()  # the packshard command's server: no numba extensions (packshard.jit)
        return
    early = None
    try:
        module, function, arg, first = json.loads(spec)
        arg = tuple(arg) if isinstance(arg, list) else arg
        if first:
            early = threading.Thread(target=_quietly, args=(*first, arg), daemon=True)
            early.start()
        skip_if_own()  # before the warm-up's first kernel: see packshard.jit
        WarmUp(module, function, arg).run()
    except Exception:  # best effort (see the module docstring)
        return
    finally:
        if early is not None:
            early.join()  # no thread may outlive the warm-up: the server forks next
        # what the imports and the warm-up made lives as long as every worker: out of the
        # collector's sight, so a worker's collections never walk it (113k objects for
        # pack: 0.049 -> 0.009 s of collections mapping 4.3M phi-3 tokens), and its pages
        # stay shared with the server
        gc.freeze()


_warm()
