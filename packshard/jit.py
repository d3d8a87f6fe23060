"""numba in packshard's own processes: no other package's numba extensions loaded.

numba runs every ``numba_extensions`` entry point installed, once, on the first compile or
cache load of any jitted function in a process.  awkward (installed with gigatoken) registers
one, so the first call of one of packshard's kernels (the aligner, the planner, the part
cutter) imports all of awkward (0.6-1.0 CPU-s a process).  packshard's kernels use plain
numpy arrays and integers, so a process that runs nothing else skips the entry points::

    packshard process (console entry)   own_process(): env PACKSHARD_OWN_PROCESS=1; skipped
                                        once the command has imported numba (before a kernel)
      ├─ fork server, workers           skip_if_own() (forkwarm, first): env inherited, skipped
      └─ a library caller's process     nothing changes: numba loads its extensions as usual

Only the ``packshard`` command, which owns its process (``main()`` reading ``sys.argv``), and
the processes it starts opt in; ``pack_dataset`` called from a program leaves numba as it is,
since that program may jit functions over awkward arrays itself.  Compiled code is the same
either way: the extensions add types, not behaviour to existing ones.

**Cached kernels loaded without numba's registries.**  Before it loads a kernel from its cache,
numba imports the implementations of everything it can compile (0.25 CPU-s in a fresh
process).  Loading machine code needs only the symbols that code calls: numba's C helpers, the
math functions and exceptions (installed when the context is made), the runtime's allocator
(``rtsys.initialize``) and the hash secret.  So an own process loads cached kernels after those
two steps alone (a first plan: 0.108 CPU-s against 0.333, ``docs/performance.md``, "numba in
packshard's own processes"); a kernel that must be compiled goes through numba's compiler,
which refreshes the whole context itself::

    first kernel of an own process     numba's load          the light load
    refresh: registries imported       yes (0.2-0.25 CPU-s)  no
    runtime initialised, hash secret   yes                   yes
    machine code from the cache        yes                   yes
    a kernel compiled later            refreshes itself      refreshes itself
"""

from __future__ import annotations

import os
import sys
from typing import Any

OWN_ENV = "PACKSHARD_OWN_PROCESS"
"""Set to ``1`` by the ``packshard`` command; inherited by the processes it starts."""


def own_process() -> None:
    """Mark this process and the processes it starts as packshard's own (nothing imported)."""
    os.environ[OWN_ENV] = "1"


def skip_if_own(imported: bool = False) -> bool:
    """Skip numba's extension entry points if this process is packshard's own; say whether.

    With ``imported`` only where numba is imported already (a command that needs none of it
    does not pay 0.3 s to import it here).  Call it before the first kernel runs.  Best
    effort: a numba without the flag (another version) loads its extensions as usual.
    """
    if os.environ.get(OWN_ENV) != "1" or (imported and "numba" not in sys.modules):
        return False
    from numba.core import entrypoints

    if not hasattr(entrypoints, "_already_initialized"):
        return False
    entrypoints._already_initialized = True
    load_cached_lightly()
    return True


def load_cached_lightly() -> bool:
    """Load cached kernels without refreshing numba's registries (see the module notes).

    Returns whether the light load is in place.  Best effort: a numba whose cache lacks the
    methods used here keeps its own load.
    """
    from numba.core import caching

    cache = caching.Cache
    if getattr(cache.load_overload, "light", False):
        return True
    if not all(hasattr(cache, name) for name in ("_load_overload", _GUARD)):
        return False

    def load_overload(self: Any, sig: Any, target_context: Any) -> Any:
        import numba.cpython.hashing  # noqa: F401  (installs the hash secret's symbols)
        from numba.core.runtime import rtsys

        rtsys.initialize(target_context)  # the runtime's allocator and its symbols
        with getattr(self, _GUARD)():
            return self._load_overload(sig, target_context)
        return None  # the guard swallowed an I/O error: compiled instead, as numba does

    load_overload.light = True  # type: ignore[attr-defined]
    cache.load_overload = load_overload  # type: ignore[method-assign]
    return True


_GUARD = "_guard_against_spurious_io_errors"
