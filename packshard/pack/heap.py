"""Give freed arrays back to the system at once, so that peak RSS is the live set.

glibc serves an allocation above its mmap threshold with a mapping of its own, returned to
the system when freed; below it, from the heap, which keeps freed memory for reuse.  The
threshold starts at 128 KiB but rises to the size of every mapped block freed (up to 32 MiB),
so after the first large temporary array is freed, the next ones come from the heap and stay
resident after the stage that needed them.  Each stage's temporaries (the merge's unit copies,
the planner's scratch, a write task's row group) would then add up in the driver's RSS
instead of being reused: measured on 2M one-token records, about 20 bytes an example.

:func:`return_freed_memory` fixes the threshold (``mallopt(M_MMAP_THRESHOLD, 256 KiB)``),
which also stops it rising, and has Arrow allocate from the same heap (its default pool,
mimalloc, keeps what it frees too).  Elsewhere than glibc it does nothing.

A fixed threshold also keeps glibc's trim threshold at 128 KiB, so the top of the heap is
given back after a batch and faulted in again by the next (1.0M page faults, 3.6 system
CPU-seconds on 20.6M tokens of phi-3 chat data).  A 16 MiB pad (``M_TOP_PAD``) cut that to
0.29M faults and 1.7 s, but held about 30 MiB more at the driver's peak on 2M one-token
records (70-78 bytes an example against 62-63, ``scripts/measure_driver_memory.py``), and a
side-by-side run on 4.3M tokens showed no CPU difference beyond noise; so no pad is set.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import pyarrow as pa

M_MMAP_THRESHOLD = -3
THRESHOLD_BYTES = 256 * 1024


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold (see the module docstring); return whether it was set."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        if not libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES):
            return False
    except (OSError, AttributeError):  # not glibc
        return False
    pa.set_memory_pool(pa.system_memory_pool())
    return True


def trim_heap() -> bool:
    """Give the heap's free pages back to the system (``malloc_trim(0)``); glibc only.

    Between stages: what a stage freed below the mmap threshold, scattered between live
    blocks, stays resident otherwise and adds to the next stage's peak (measured on 2M
    one-token records: the examples index stage peaked 56 MiB lower with it, about 29 bytes
    an example).
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        return bool(ctypes.CDLL(name).malloc_trim(0))
    except (OSError, AttributeError):  # not glibc
        return False
