"""Plan packed rows from example lengths alone: best-fit or first-fit decreasing, or wrapped.

The planner never sees tokens.  It takes the lengths array (one entry per example, after the
overlong policy) and returns a :class:`PackPlan`: for every row, its segments in order, each
segment naming an example, where in that example it starts, and how long it is.

Best-fit decreasing (``bfd``, the default) places examples longest first; each goes into the
open row with the *least* room that still fits it, or opens a new row.  Ties (rows with equal
room) go to the row that reached that room most recently.  First-fit decreasing (``ffd``)
takes the *earliest* row that fits instead.  Equal lengths are taken in example order, so the
plan is a pure function of ``(lengths, max_seq_len, strategy)``.  ``wrapped`` concatenates the
examples in input order and cuts the stream every ``max_seq_len`` tokens; an example crossing
a cut becomes consecutive segments (``seg_start`` > 0 for the later parts).

How ``bfd`` runs in O(n + runs + L) for L = ``max_seq_len``, with no sort and no gather::

    lengths ──count──► hist[1..L]                        one sequential pass
    walk l = L … 1, hist[l] times:
        room  1    2    3   …   l-1   l   l+1  …  c  …  L-1
        head  ·    b7   ·        ·    ·    ·     b3      ·     per-room stacks of rows
        bits  0    1    0        0    0    0     1       0     two-level bitmap of non-empty
                                      └── smallest set bit ≥ l ──┘  (word scan + ctz)
        pop b3 from room c; it takes q = min(c // l, left) copies of l at once
        (after one copy its room c-l is the new smallest fit, so it keeps winning);
        push b3 onto room c - q·l.  No fit → open a new row (room L).
    each such step is a *run* (row, first slot, count); runs of length l are consecutive
    lengths ──second pass──► example i is the next copy of len[i] in its length's run, slot
        p = row_offsets[row] + slot; (i, p) is dealt to bucket p >> 16 of the output arrays
        (sequential streams), then each 2**16-slot bucket is permuted in place inside L2.

``ffd`` keeps a max segment tree over the rows' room (leaves beyond the open rows hold L,
so "the leftmost leaf ≥ l" is either an open row or the next new one): O(n log rows).
Any-fit packers leave at most one row half empty, so rows ≤ 2·⌈Σlen / L⌉ + 1 bounds every
array up front.

Measured on 2 shared cores, lognormal lengths (median 300) clipped to L = 4096, warm JIT:
1M lengths plan in ≈17 ms with ``bfd`` (TRL's ``pack_dataset`` bfd: ≈45 s, +0.46% rows);
10M in ≈0.25 s quiet, ≈0.45 s under load, where numpy's AVX-512 sort of the same int64
array takes ≈0.06-0.12 s: the plan writes 120 MB of output and reads the lengths twice, so
it stays ≈4× a sort.  ``wrapped``: ≈0.1 s for 10M.  ``bfd`` rows exceed ⌈Σlen / L⌉ by
≈0.003%.  JIT: ≈2 s to compile, 0.2-0.7 s to load from the on-disk cache (``cache=True``).
``plan_packs_reference`` is the obviously-correct quadratic twin that the tests hold the
kernels to, plan for plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from packshard.errors import UsageError

STRATEGIES = ("bfd", "ffd", "wrapped")

_ctz: Any = trailing_zeros  # count trailing zero bits (LLVM cttz)
_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
_SHIFT = 16  # a scatter bucket spans 2**16 slots: 768 KiB of output, inside L2
_BUCKET = 1 << _SHIFT


@dataclass(frozen=True, slots=True)
class PackPlan:
    """Rows of segments; row ``r`` owns segments ``row_offsets[r]:row_offsets[r + 1]``."""

    row_offsets: np.ndarray  # int64, num_rows + 1
    seg_example: np.ndarray  # int64, index into the lengths array
    seg_start: np.ndarray  # int64, first token of the segment within its example
    seg_length: np.ndarray  # int32
    max_seq_len: int
    strategy: str = "bfd"

    @property
    def num_rows(self) -> int:
        """Number of packed rows."""
        return len(self.row_offsets) - 1

    @property
    def num_segments(self) -> int:
        """Number of segments over all rows."""
        return len(self.seg_example)

    @property
    def num_tokens(self) -> int:
        """Tokens over all rows."""
        return int(self.seg_length.sum(dtype=np.int64))

    @property
    def row_tokens(self) -> np.ndarray:
        """Tokens per row (int64, one entry per row)."""
        ends = np.concatenate(([0], np.cumsum(self.seg_length, dtype=np.int64)))
        return ends[self.row_offsets[1:]] - ends[self.row_offsets[:-1]]

    @property
    def lower_bound_rows(self) -> int:
        """⌈tokens / max_seq_len⌉: no packing of these tokens has fewer rows."""
        return -(-self.num_tokens // self.max_seq_len)

    @property
    def fill_rate(self) -> float:
        """Tokens over row capacity, a fraction (1.0 for an empty plan)."""
        return fill_rate(self.num_tokens, self.num_rows, self.max_seq_len)

    def segment_rows(self) -> np.ndarray:
        """Return the row of every segment (int64, one entry per segment)."""
        return np.repeat(np.arange(self.num_rows, dtype=np.int64), np.diff(self.row_offsets))


def lower_bound_rows(lengths: np.ndarray, max_seq_len: int) -> int:
    """Return ⌈Σ lengths / max_seq_len⌉, the fewest rows any packing can use."""
    return -(-int(np.sum(lengths, dtype=np.int64)) // max_seq_len)


def fill_rate(num_tokens: int, num_rows: int, max_seq_len: int) -> float:
    """Return ``num_tokens / (num_rows * max_seq_len)``; 1.0 when there are no rows."""
    return num_tokens / (num_rows * max_seq_len) if num_rows else 1.0


@njit(cache=True, nogil=True)
def _count_lengths(lengths, max_seq_len, capped):  # pragma: no cover - compiled
    hist = np.zeros(max_seq_len + 1, np.int64)
    total = 0
    for i in range(len(lengths)):
        v = lengths[i]
        if v < 1 or (capped and v > max_seq_len):
            return hist, total, i
        if capped:
            hist[v] += 1
        total += v
    return hist, total, -1


@njit(cache=True, nogil=True)
def _place_best_fit(hist, max_seq_len, max_rows, run_bin, run_slot, run_count):  # pragma: no cover
    big = max_seq_len
    words = (big >> 6) + 1
    level0 = np.zeros(words, np.uint64)
    level1 = np.zeros((words >> 6) + 1, np.uint64)
    head = np.full(big, -1, np.int32)
    nxt = np.empty(max_rows, np.int32)
    count = np.zeros(max_rows, np.int64)
    rows = 0
    runs = 0
    for length in range(big, 0, -1):
        left = hist[length]
        while left > 0:
            room = big  # smallest room >= length among open rows, else a new row
            w = length >> 6
            bits = level0[w] & (_ONES << np.uint64(length & 63))
            if bits:
                room = (w << 6) + _ctz(bits)
            else:
                w += 1
                w1 = w >> 6
                if w1 < len(level1):
                    bits = level1[w1] & (_ONES << np.uint64(w & 63))
                    while True:
                        if bits:
                            w = (w1 << 6) + _ctz(bits)
                            room = (w << 6) + _ctz(level0[w])
                            break
                        w1 += 1
                        if w1 >= len(level1):
                            break
                        bits = level1[w1]
            if room >= big:
                room = big
                b = rows
                rows += 1
            else:
                b = head[room]
                head[room] = nxt[b]
                if nxt[b] < 0:
                    level0[room >> 6] &= ~(np.uint64(1) << np.uint64(room & 63))
                    if not level0[room >> 6]:
                        level1[room >> 12] &= ~(np.uint64(1) << np.uint64((room >> 6) & 63))
            take = min(room // length, left)
            run_bin[runs] = b
            run_slot[runs] = count[b]
            run_count[runs] = take
            runs += 1
            count[b] += take
            left -= take
            room -= take * length
            if room > 0:
                nxt[b] = head[room]
                if head[room] < 0:
                    level0[room >> 6] |= np.uint64(1) << np.uint64(room & 63)
                    level1[room >> 12] |= np.uint64(1) << np.uint64((room >> 6) & 63)
                head[room] = b
    return count[:rows], runs


@njit(cache=True, nogil=True)
def _place_first_fit(hist, max_seq_len, max_rows, run_bin, run_slot, run_count):  # pragma: no cover
    size = 1
    while size < max_rows + 1:
        size *= 2
    tree = np.full(2 * size, max_seq_len, np.int64)  # leaf size + b: room of row b
    count = np.zeros(size, np.int64)
    rows = 0
    runs = 0
    for length in range(max_seq_len, 0, -1):
        left = hist[length]
        while left > 0:
            node = 1
            while node < size:
                node = 2 * node if tree[2 * node] >= length else 2 * node + 1
            b = node - size
            rows = max(rows, b + 1)
            room = tree[node]
            take = min(room // length, left)
            run_bin[runs] = b
            run_slot[runs] = count[b]
            run_count[runs] = take
            runs += 1
            count[b] += take
            left -= take
            tree[node] = room - take * length
            node >>= 1
            while node:
                tree[node] = max(tree[2 * node], tree[2 * node + 1])
                node >>= 1
    return count[:rows], runs


@njit(cache=True, nogil=True)
def _scatter_runs(  # pragma: no cover - compiled
    lengths, hist, row_offsets, runs, run_row, run_slot, run_count, seg_example, seg_length
):
    big = len(hist) - 1
    n = len(lengths)
    for r in range(runs):  # run_row becomes the run's first slot in the plan
        run_row[r] = row_offsets[run_row[r]] + run_slot[r]
    cursor = np.empty(big + 1, np.int64)  # next run of each length
    r = 0
    for length in range(big, 0, -1):
        cursor[length] = r
        placed = 0
        while placed < hist[length]:
            placed += run_count[r]
            r += 1
    pos = np.zeros(big + 1, np.int64)
    end = np.zeros(big + 1, np.int64)
    # Two passes keep the permutation inside the caches: deal (example, slot) keys into the
    # bucket of _BUCKET consecutive slots they belong to, then permute each bucket in place.
    fill = np.arange((n >> _SHIFT) + 1) << _SHIFT
    for i in range(n):
        length = lengths[i]
        p = pos[length]
        if p == end[length]:
            r = cursor[length]
            cursor[length] = r + 1
            p = run_row[r]
            end[length] = p + run_count[r]
        pos[length] = p + 1
        q = fill[p >> _SHIFT]
        fill[p >> _SHIFT] = q + 1
        seg_example[q] = (i << _SHIFT) | (p & (_BUCKET - 1))
        seg_length[q] = length
    keys = np.empty(_BUCKET, np.int64)
    sizes = np.empty(_BUCKET, np.int32)
    for base in range(0, n, _BUCKET):
        m = min(_BUCKET, n - base)
        keys[:m] = seg_example[base : base + m]
        sizes[:m] = seg_length[base : base + m]
        for q in range(m):
            p = base + (keys[q] & (_BUCKET - 1))
            seg_example[p] = keys[q] >> _SHIFT
            seg_length[p] = sizes[q]


@njit(cache=True, nogil=True)
def _count_wrapped(lengths, max_seq_len):  # pragma: no cover - compiled
    segments = 0
    room = max_seq_len
    for i in range(len(lengths)):
        need = lengths[i]
        while True:
            if room == 0:
                room = max_seq_len
            segments += 1
            take = min(need, room)
            need -= take
            room -= take
            if need == 0:
                break
    return segments


@njit(cache=True, nogil=True)
def _cut_wrapped(  # pragma: no cover - compiled
    lengths, max_seq_len, row_offsets, seg_example, seg_start, seg_length
):
    s = 0
    row = 0
    room = max_seq_len
    for i in range(len(lengths)):
        done = 0
        while True:
            if room == 0:
                row += 1
                row_offsets[row] = s
                room = max_seq_len
            take = min(lengths[i] - done, room)
            seg_example[s] = i
            seg_start[s] = done
            seg_length[s] = take
            s += 1
            done += take
            room -= take
            if done == lengths[i]:
                break
    row_offsets[-1] = s


def _check_arguments(lengths: np.ndarray, max_seq_len: int, strategy: str) -> np.ndarray:
    if strategy not in STRATEGIES:
        raise UsageError(f"unknown packing strategy {strategy!r} (use --strategy bfd|ffd|wrapped)")
    if int(max_seq_len) < 1:
        raise UsageError(f"max_seq_len is {max_seq_len}, it must be ≥ 1 (use --max-seq-len N)")
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
        raise UsageError(f"lengths must be a 1-D integer array, got {lengths.dtype}{lengths.shape}")
    if lengths.dtype not in (np.int32, np.int64):
        lengths = lengths.astype(np.int64)
    return lengths


def plan_packs(lengths: np.ndarray, max_seq_len: int, strategy: str = "bfd") -> PackPlan:
    """Pack examples of the given lengths into rows of at most ``max_seq_len`` tokens.

    Args:
        lengths: one length per example (int32 or int64), each in 1..max_seq_len for ``bfd``
            and ``ffd``; any positive length for ``wrapped``.
        max_seq_len: the capacity of a row in tokens.
        strategy: ``bfd`` (best-fit decreasing), ``ffd`` (first-fit decreasing) or ``wrapped``.

    Raises:
        UsageError: on an unknown strategy, a non-positive ``max_seq_len`` or a length that
            the strategy cannot place.

    """
    lengths = _check_arguments(lengths, max_seq_len, strategy)
    big = int(max_seq_len)
    capped = strategy != "wrapped"
    hist, total, bad = _count_lengths(lengths, big, capped)
    if bad >= 0:
        limit = f"1..{big}" if capped else "≥ 1"
        raise UsageError(
            f"example {bad} has length {int(lengths[bad])}, outside {limit} for strategy "
            f"{strategy!r} (use --overlong truncate|split|drop)"
        )
    if not capped:
        segments = _count_wrapped(lengths, big)
        row_offsets = np.zeros(-(-total // big) + 1, np.int64)
        seg_example = np.empty(segments, np.int64)
        seg_start = np.empty(segments, np.int64)
        seg_length = np.empty(segments, np.int32)
        _cut_wrapped(lengths, big, row_offsets, seg_example, seg_start, seg_length)
        return PackPlan(row_offsets, seg_example, seg_start, seg_length, big, strategy)
    n = len(lengths)
    max_rows = min(n, 2 * (-(-total // big)) + 1)
    run_row = np.empty(n, np.int64)
    run_slot = np.empty(n, np.int32)
    run_count = np.empty(n, np.int32)
    place = _place_best_fit if strategy == "bfd" else _place_first_fit
    counts, runs = place(hist, big, max_rows, run_row, run_slot, run_count)
    row_offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=row_offsets[1:])
    # Outputs are allocated by numpy, which asks the kernel for huge pages: first touch of
    # 120 MB costs ≈10 ms that way against ≈45 ms through the JIT's own allocator.
    seg_example = np.empty(n, np.int64)
    seg_length = np.empty(n, np.int32)
    _scatter_runs(
        lengths, hist, row_offsets, runs, run_row, run_slot, run_count, seg_example, seg_length
    )
    return PackPlan(
        row_offsets, seg_example, np.zeros(n, np.int64), seg_length, big, strategy=strategy
    )


def plan_packs_reference(
    lengths: np.ndarray | list[int], max_seq_len: int, strategy: str = "bfd"
) -> PackPlan:
    """Plan like :func:`plan_packs`, one example at a time in plain Python (slow; for tests).

    ``bfd``: take examples by decreasing length, then by index; put each into the open row
    with the least room that still fits it, preferring among equals the row whose room
    changed last; open a new row when none fits.  ``ffd``: the first row (in opening order)
    that fits.  ``wrapped``: cut the concatenated stream every ``max_seq_len`` tokens.
    """
    values = [int(v) for v in _check_arguments(np.asarray(lengths), max_seq_len, strategy)]
    big = int(max_seq_len)
    if any(v < 1 or (strategy != "wrapped" and v > big) for v in values):
        raise UsageError(f"a length is outside 1..{big} for strategy {strategy!r}")
    segments: list[list[tuple[int, int, int]]] = []  # row -> [(example, start, length)]
    if strategy == "wrapped":
        room = 0
        for i, v in enumerate(values):
            done = 0
            while done < v:
                if room == 0:
                    segments.append([])
                    room = big
                take = min(v - done, room)
                segments[-1].append((i, done, take))
                done, room = done + take, room - take
    else:
        rooms: list[int] = []
        changed: list[int] = []  # when each row's room last changed
        for step, i in enumerate(sorted(range(len(values)), key=lambda j: (-values[j], j))):
            v = values[i]
            fits = [b for b in range(len(rooms)) if rooms[b] >= v]
            if strategy == "bfd":
                fits.sort(key=lambda b: (rooms[b], -changed[b]))
            if not fits:
                rooms.append(big)
                changed.append(step)
                segments.append([])
            b = fits[0] if fits else len(rooms) - 1
            segments[b].append((i, 0, v))
            rooms[b] -= v
            changed[b] = step
    flat = [seg for row in segments for seg in row]
    return PackPlan(
        row_offsets=np.cumsum([0] + [len(row) for row in segments], dtype=np.int64),
        seg_example=np.array([s[0] for s in flat], np.int64),
        seg_start=np.array([s[1] for s in flat], np.int64),
        seg_length=np.array([s[2] for s in flat], np.int32),
        max_seq_len=big,
        strategy=strategy,
    )
