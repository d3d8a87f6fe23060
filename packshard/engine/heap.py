"""Give freed arrays back to the system at once, so that peak RSS is the live set.

glibc serves an allocation above its mmap threshold with a mapping of its own, returned to
the system when freed; below it, from the heap, which keeps freed memory for reuse.  The
threshold starts at 128 KiB but rises to the size of every mapped block freed (up to 32 MiB),
so after the first large temporary array is freed, the next ones come from the heap and stay
resident after the stage that needed them: each stage's temporaries would add up in the
driver's RSS instead of being reused.

:func:`return_freed_memory` fixes the threshold (``mallopt(M_MMAP_THRESHOLD, 256 KiB)``),
which also stops it rising, and has Arrow allocate from the same heap (its default pool,
mimalloc, keeps what it frees too).  Elsewhere than glibc it does nothing.

A fixed threshold also keeps glibc's trim threshold at 128 KiB, so the top of the heap is
given back after every batch and faulted in again by the next.  Where that churn is (map
and write tasks) :func:`pad_heap` keeps ``BUSY_PAD`` (64 MiB, ``M_TOP_PAD``) at the top of
the heap: 0.25M page faults instead of 1.07M on a 20.6M-token pack.  The driver takes the
pad away (and trims) once the map is done, and sets none for a write task it runs itself,
so its planning, statistics and index stages, where its peak RSS is, hold no pad
(``docs/performance.md``, "The heap's thresholds").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import pyarrow as pa

M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
THRESHOLD_BYTES = 256 * 1024
BUSY_PAD = 64 * 1024 * 1024
"""Bytes kept at the top of the heap while map and write tasks run (see the docstring)."""


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """Load the C library once (``find_library`` runs ``ldconfig``); None where there is none."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name is not None else None
    except OSError:
        return None


def _call(function: str, *args: int) -> bool:
    """Call a glibc allocator function; False where there is none (not glibc) or it failed."""
    libc = _libc()
    try:
        return libc is not None and bool(getattr(libc, function)(*args))
    except AttributeError:  # not glibc
        return False


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold (see the module docstring); return whether it was set."""
    if not _call("mallopt", M_MMAP_THRESHOLD, THRESHOLD_BYTES):
        return False
    pa.set_memory_pool(pa.system_memory_pool())
    return True


def pad_heap(pad: int) -> bool:
    """Keep ``pad`` bytes at the top of the heap when it grows or shrinks (``M_TOP_PAD``).

    Idempotent and cheap, so every map or write task sets it wherever it runs; the driver
    sets 0 (then :func:`trim_heap`) before the stages that hold its peak.  glibc only;
    returns whether it was set.
    """
    return _call("mallopt", M_TOP_PAD, pad)


def trim_heap() -> bool:
    """Give the heap's free pages back to the system (``malloc_trim(0)``); glibc only.

    Between stages: what a stage freed below the mmap threshold, scattered between live
    blocks, stays resident otherwise and adds to the next stage's peak (about 29 bytes an
    example at the examples index stage).
    """
    return _call("malloc_trim", 0)
