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
CPU-seconds on 20.6M tokens of phi-3 chat data).  A 16 MiB pad (``M_TOP_PAD``) for the whole
run cut that to 0.29M faults and 1.7 s, but held about 30 MiB more at the driver's peak on
2M one-token records (70-78 bytes an example against 62-63,
``scripts/measure_driver_memory.py``), where the peak is the planner's, the statistics' and
the index's.  So the pad is kept only while the units are mapped (:func:`padded_heap`),
where batch after batch allocates and frees the same sizes, and given back before the
stages that peak (measured in :func:`padded_heap`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Iterator
from contextlib import contextmanager

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


M_TOP_PAD = -2
PAD_BYTES = 16 << 20


@contextmanager
def padded_heap() -> Iterator[None]:
    """Keep ``PAD_BYTES`` free at the heap's top while a task runs; give them back after.

    A task's batches allocate and free the same sizes over and over: with the pad the heap
    keeps the pages between batches instead of returning and faulting them in again.
    Measured on the whole pack of 20.5M phi-3 tokens (152 units, one shard), 3 runs each
    side by side, without and with it: 821,000-843,000 → 403,000-497,000 page faults, 2.6-2.9
    → 1.8-2.1 system and 12.7-13.4 → 11.7-12.1 CPU-seconds in all.  The driver's peak on 2M
    one-token records did not grow (428.7 MiB with it, 439.3 without, one run each).
    """
    libc = _glibc()
    if libc is None or not libc.mallopt(M_TOP_PAD, PAD_BYTES):
        yield
        return
    try:
        yield
    finally:
        libc.mallopt(M_TOP_PAD, 0)
        libc.malloc_trim(0)


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt, libc.malloc_trim  # noqa: B018 - not glibc: AttributeError
    except (OSError, AttributeError):
        return None
    return libc


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
