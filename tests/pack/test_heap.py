"""The heap pad of the map stage: kept while units are mapped, given back after, anywhere."""

from __future__ import annotations

import numpy as np

from packshard.pack import heap


def test_padded_heap_runs_its_block_and_gives_the_pad_back(monkeypatch):
    calls: list[tuple[str, int]] = []

    class Libc:
        def mallopt(self, option: int, value: int) -> int:
            calls.append(("mallopt", value))
            return 1

        def malloc_trim(self, pad: int) -> int:
            calls.append(("trim", pad))
            return 1

    monkeypatch.setattr(heap, "_glibc", Libc)
    with heap.padded_heap():
        assert calls == [("mallopt", heap.PAD_BYTES)]
        np.ones(1 << 16).sum()
    assert calls == [("mallopt", heap.PAD_BYTES), ("mallopt", 0), ("trim", 0)]


def test_padded_heap_without_glibc_only_runs_its_block(monkeypatch):
    monkeypatch.setattr(heap, "_glibc", lambda: None)
    ran = []
    with heap.padded_heap():
        ran.append(True)
    assert ran == [True]
    with heap.padded_heap():  # the real C library, whatever it is
        np.ones(1 << 16).sum()
