"""numba in packshard's own processes: no other package's numba extensions loaded.

numba runs every ``numba_extensions`` entry point installed, once, on the first compile or
cache load of any jitted function in a process.  awkward (installed with gigatoken) registers
one, so the first call of one of packshard's kernels (the aligner, the planner, the part
cutter) imports all of awkward: 0.6-1.0 CPU-s, about a third of a 3-record ``pack``, in the
driver and again in every worker.  packshard's kernels use plain numpy arrays and integers,
none of another package's types, so a process that runs nothing else skips the entry points::

    packshard process (console entry)   own_process(): env PACKSHARD_OWN_PROCESS=1; skipped
                                        once the command has imported numba (before a kernel)
      ├─ fork server, workers           skip_if_own() (forkwarm, first): env inherited, skipped
      └─ a library caller's process     nothing changes: numba loads its extensions as usual

Only the ``packshard`` command, which owns its process (``main()`` reading ``sys.argv``), and
the processes it starts opt in; ``pack_dataset`` called from a program leaves numba as it is,
since that program may jit functions over awkward arrays itself.  Compiled code is the same
either way: the extensions add types, not behaviour to existing ones.
"""

from __future__ import annotations

import os
import sys

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
    return True
