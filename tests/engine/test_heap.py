"""The heap settings of :mod:`packshard.engine.heap`, seen from a fresh process."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys

import pytest

from packshard.engine.heap import BUSY_PAD

PROBE = """
import resource, sys
import numpy as np
from packshard.engine.heap import pad_heap, return_freed_memory
assert return_freed_memory() and pad_heap(int(sys.argv[1]))
def batch():  # what a map task's batches do: 20 MB of arrays below the mmap threshold
    arrays = [np.ones(200 * 1024 // 8) for _ in range(100)]
    del arrays
batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    batch()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(pad: int) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(pad)], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(
    sys.platform != "linux" or ctypes.util.find_library("c") is None, reason="glibc only"
)
def test_the_busy_pad_keeps_batches_from_faulting_the_heap_in_again() -> None:
    # without a pad every batch's pages go back to the system and fault in again (~50,000
    # here); with it the heap's top stays
    unpadded, padded = _faults(0), _faults(BUSY_PAD)
    assert unpadded > 10 * (padded + 100)
