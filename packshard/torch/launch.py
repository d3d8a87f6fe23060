"""A launcher's ranks that would train alone: refused, with the launch that works.

A launcher (``torchrun``, ``accelerate launch``) starts ``WORLD_SIZE`` processes; they train
one model only when a process group joins them and the model syncs its gradients over it.
Accelerate decides that for itself, and on a CPU host it decides "one process" unless told
otherwise::

    torchrun --nproc_per_node 2 train.py          accelerate: DistributedType.NO, 1 process,
                                                  no group → 2 models, each on its rows
    ACCELERATE_USE_CPU=1 torchrun … train.py      MULTI_CPU, gloo group, DDP: one model
    accelerate launch --cpu --num_processes 2     starts ONE process (--cpu uses the simple
                                                  launcher; nothing to detect from inside)

:func:`check_launch` runs where the rows are read: with ``WORLD_SIZE`` > 1 in the environment,
an accelerate that counts fewer processes (its state, or the wrapper splitting the rows) means
the ranks would train without gradient sync; that is a :class:`UsageError` naming the fix.
``WORLD_SIZE`` > 1 without any process group is refused by
:func:`packshard.torch.placement.resolve_placement`.
"""

from __future__ import annotations

import os
import sys

from packshard.errors import UsageError

FIX = (
    "on a CPU host set ACCELERATE_USE_CPU=1 for torchrun (accelerate launch --cpu starts one "
    "process); on GPUs launch with accelerate launch --multi_gpu or torchrun"
)


def launcher_world_size() -> int:
    """``WORLD_SIZE`` a launcher set (1 when unset or not a number)."""
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() else 1


def accelerate_processes() -> int | None:
    """Return the processes an initialised accelerate state counts (None: no state)."""
    state = sys.modules.get("accelerate.state")
    if state is None:
        return None
    shared = getattr(state.PartialState, "_shared_state", None)
    if not shared:
        return None
    return int(shared.get("num_processes", 1))


def check_launch(wrapper_processes: int | None = None) -> None:
    """Refuse ranks of a launcher that accelerate runs as separate single processes.

    ``wrapper_processes``: the processes the accelerate wrapper on the stack splits for.
    """
    world = launcher_world_size()
    if world <= 1:
        return
    processes = wrapper_processes if wrapper_processes is not None else accelerate_processes()
    if processes is not None and processes < world:
        raise UsageError(
            f"WORLD_SIZE={world} but accelerate runs {processes} process(es) with no process "
            f"group: each rank would train its own copy of the model, with no gradient sync ({FIX})"
        )
