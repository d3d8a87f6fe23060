"""Warm-up run once in the fork server, so that every worker forked from it starts warm.

The local engine's fork server imports this module before it forks any worker.  When the
engine has a warm-up (``fn``, ``arg``) it names them in ``PACKSHARD_FORK_WARM`` (module,
function and a JSON argument) before the server starts; importing this module then runs
``fn(arg)`` once in the server: a tokenizer loaded and a template compiled there are in every
worker from its first instruction, instead of being loaded again by each.  A fork server
outlives one job: a later job with other files warms its workers itself (the initializer).
Best effort: a failure here is silent, because the first task meets it again and reports it.
"""

from __future__ import annotations

import importlib
import json
import os

FORK_WARM_ENV = "PACKSHARD_FORK_WARM"


def _warm() -> None:
    spec = os.environ.get(FORK_WARM_ENV)
    if not spec:
        return
    try:
        module, name, arg = json.loads(spec)
        getattr(importlib.import_module(module), name)(tuple(arg) if isinstance(arg, list) else arg)
    except Exception:  # best effort (see the module docstring)
        return


_warm()
