"""Plan packed rows from example lengths alone: best/first-fit decreasing, sequential, wrapped.

The planner sees only the lengths array and returns a
:class:`~packshard.pack.plan.rows.RowPlan`: per row, its segments (example, start, length).

Best-fit decreasing (``bfd``, the default) places examples longest first, each into the open
row with the *least* room that still fits it (ties: the row that reached that room last), or a
new row; first-fit decreasing (``ffd``) takes the *earliest* row that fits.  Equal lengths go
in example order, so the plan is a pure function of ``(lengths, max_seq_len, strategy)``.
``wrapped`` cuts the examples' stream every ``max_seq_len`` tokens (``seg_start`` > 0 for the
later parts of a cut example).

How ``bfd`` runs in O(n + runs + L) for L = ``max_seq_len``, with no comparison sort::

    1 count   lengths ──► hist[1..L]                            one sequential read
    2 place   walk l = L … 1, hist[l] times (the histogram is all it needs):
        room  1    2    3   …   l-1   l   l+1  …  c  …  L-1
        head  ·    b7   ·        ·    ·    ·     b3      ·     per-room stacks of rows
        bits  0    1    0        0    0    0     1       0     two-level bitmap of non-empty
                                      └── smallest set bit ≥ l ──┘  (word scan + ctz)
        pop b3 from room c; it takes q = min(c // l, left) copies of l at once
        (after one copy its room c-l is the new smallest fit, so it keeps winning);
        push b3 onto room c - q·l.  No fit → open a new row (room L).  Each such step
        is a *run* (row, first slot, q); the runs of length l are consecutive.
    3 sort    order = example indices, longest first, then by index: a stable counting
              sort, one write stream per length (beside step 2, on another thread)
    4 copy    the runs take consecutive blocks of order, in the order both were made:
              run (row, slot, q) of length l:  p = row_offsets[row] + slot
              seg_example[p : p+q] = order[src : src+q];  seg_length[p : p+q] = l

Steps 3 and 4 prefetch; from 2M examples on, steps 1, 3 and 4 run in 8 parts on a thread pool,
writing disjoint slots (the plan does not depend on the number of threads).  ``ffd`` keeps a
max segment tree over the rows' room (O(n log rows)), with the same steps 1, 3 and 4.  Any-fit
packers leave at most one row half empty, so rows ≤ 2·⌈Σlen / L⌉ + 1 bounds every array.

``sequential`` keeps input order (curricula, ordered data): next-fit, each example appended to
the open row while it fits.  With the order fixed the only choice is where to cut, and cutting
as late as possible gives the fewest rows, so no look-ahead would help::

    lengths  300 500 3600 200 100 ...        L = 4096
    rows     [300 500 ····]  [3600 200 100 ···] ...   fill = Σlen / (rows · L)

``plan_packs_reference`` is the quadratic twin the tests hold the kernels to.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from functools import partial
from itertools import pairwise
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

from packshard.arrays import exclusive_cumsum
from packshard.engine import usable_cores
from packshard.errors import UsageError
from packshard.options import STRATEGIES
from packshard.pack.plan.rows import RowPlan

_ctz: Any = trailing_zeros  # count trailing zero bits (LLVM cttz)
_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
_LINE = 16  # int32 indices per 64-byte cache line
_AHEAD = 16  # runs between prefetching a destination and writing it
_WORKERS = usable_cores()
_PARTS = 8  # each pass is cut into parts, taken in turn by the free threads
_THREADED = 1 << 21  # from this many examples on, the parts run on threads (bench_pack.py)


@intrinsic
def _prefetch_line(typingctx, array, index):  # pragma: no cover - compiled
    """Ask for the cache line of ``array[index]`` for writing; a hint, it never faults."""

    def codegen(context, builder, signature, args):
        kind = signature.args[0]
        view = context.make_array(kind)(context, builder, args[0])
        at = cgutils.get_item_pointer(context, builder, kind, view, [args[1]], wraparound=False)
        byte, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [byte], fnty)
        builder.call(fn, [builder.bitcast(at, byte), i32(1), i32(3), i32(1)])  # write, keep, data
        return context.get_dummy_value()

    return types.void(array, index), codegen


_prefetch: Any = _prefetch_line  # called as _prefetch(array, index) inside kernels


@njit(cache=True, nogil=True)
def _count_lengths(lengths, max_seq_len, capped, hist):  # pragma: no cover - compiled
    total = 0
    for i in range(len(lengths)):
        v = lengths[i]
        if v < 1 or (capped and v > max_seq_len):
            return total, i
        if capped:
            hist[v] += 1
        total += v
    return total, -1


@njit(cache=True, nogil=True)
def _find_slots(hists):  # pragma: no cover - compiled
    parts, width = hists.shape
    above = np.zeros(width, np.int64)  # examples longer than each length
    starts = np.zeros_like(hists)  # where part p's first example of each length goes in order
    s = 0
    for length in range(width - 1, 0, -1):
        above[length] = s
        for p in range(parts):
            starts[p, length] = s
            s += hists[p, length]
    above[0] = s
    return above, starts


@njit(cache=True, nogil=True)
def _place_best_fit(  # pragma: no cover - compiled
    hist, max_seq_len, state, first_run, run_bin, run_slot, run_count
):
    big = max_seq_len
    words = (big >> 6) + 1
    level0 = np.zeros(words, np.uint64)
    level1 = np.zeros((words >> 6) + 1, np.uint64)
    head = np.full(big, -1, np.int32)
    # state[b] = (next row with the same room, segments so far): one cache line per row
    rows = 0
    runs = 0
    for length in range(big, 0, -1):
        first_run[length] = runs
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
                state[b, 1] = 0
            else:
                b = head[room]
                head[room] = state[b, 0]
                if state[b, 0] < 0:
                    level0[room >> 6] &= ~(np.uint64(1) << np.uint64(room & 63))
                    if not level0[room >> 6]:
                        level1[room >> 12] &= ~(np.uint64(1) << np.uint64((room >> 6) & 63))
            take = min(room // length, left)
            run_bin[runs] = b
            run_slot[runs] = state[b, 1]
            run_count[runs] = take
            runs += 1
            state[b, 1] += take
            left -= take
            room -= take * length
            if room > 0:
                state[b, 0] = head[room]
                if head[room] < 0:
                    level0[room >> 6] |= np.uint64(1) << np.uint64(room & 63)
                    level1[room >> 12] |= np.uint64(1) << np.uint64((room >> 6) & 63)
                head[room] = b
    first_run[0] = runs
    return state[:rows, 1], runs


@njit(cache=True, nogil=True)
def _place_first_fit(  # pragma: no cover - compiled
    hist, max_seq_len, state, first_run, run_bin, run_slot, run_count
):
    size = 1
    while size < len(state) + 1:
        size *= 2
    tree = np.full(2 * size, max_seq_len, np.int64)  # leaf size + b: room of row b
    count = np.zeros(size, np.int64)
    rows = 0
    runs = 0
    for length in range(max_seq_len, 0, -1):
        first_run[length] = runs
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
    first_run[0] = runs
    return count[:rows], runs


@njit(cache=True, nogil=True)
def _sort_by_length(lengths, first, start, order):  # pragma: no cover - compiled
    for i in range(len(lengths)):  # example first + i goes to start[its length], then next
        length = lengths[i]
        p = start[length]
        if p % _LINE == 0:  # this length's stream enters a new cache line: fetch the next one
            _prefetch(order, p + _LINE)
        order[p] = first + i
        start[length] = p + 1


@njit(cache=True, nogil=True)
def _copy_runs(  # pragma: no cover - compiled
    order, hist, top, bottom, src, r, row_offsets, run_row, run_slot, run_count, out, out_length
):
    runs = len(run_count)
    for length in range(top, bottom, -1):  # runs come longest first, in the order of `order`
        stop = src + hist[length]
        while src < stop:
            if r + _AHEAD < runs:  # the destination is a random row: fetch it early
                ahead = row_offsets[run_row[r + _AHEAD]] + run_slot[r + _AHEAD]
                _prefetch(out, ahead)
                _prefetch(out_length, ahead)
            dst = row_offsets[run_row[r]] + run_slot[r]
            for k in range(run_count[r]):
                out[dst + k] = order[src + k]
                out_length[dst + k] = length
            src += run_count[r]
            r += 1


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
        raise UsageError(
            f"unknown packing strategy {strategy!r} (use --strategy {'|'.join(STRATEGIES)})"
        )
    if int(max_seq_len) < 1:
        raise UsageError(f"max_seq_len is {max_seq_len}, it must be ≥ 1 (use --max-seq-len N)")
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
        raise UsageError(f"lengths must be a 1-D integer array, got {lengths.dtype}{lengths.shape}")
    if lengths.dtype not in (np.int32, np.int64):
        lengths = lengths.astype(np.int64)
    return lengths


def _run(pool: ThreadPoolExecutor | None, tasks: list[Callable[[], Any]]) -> list[Any]:
    """Call the tasks, on the pool's threads if there is one (kernels release the GIL)."""
    if pool is None:
        return [task() for task in tasks]
    return list(pool.map(lambda task: task(), tasks))


def warm_planner(strategy: str) -> None:
    """Load ``strategy``'s kernels from numba's cache with a plan of three examples.

    The first plan of a process spends 0.16 s there (numba's registries, then each kernel's
    cache); ``pack``'s driver does this while its workers map, so that its plan, which
    nothing else can run beside, does not.  Best effort: a real plan meets any failure.
    """
    try:
        plan_packs(np.array([3, 2, 1], np.int32), 4, strategy)
    except Exception:  # the real plan raises it again, with its message
        return


def plan_packs(lengths: np.ndarray, max_seq_len: int, strategy: str = "bfd") -> RowPlan:
    """Pack examples of the given lengths into rows of at most ``max_seq_len`` tokens.

    Args:
        lengths: one length per example (int32 or int64), each in 1..max_seq_len for ``bfd``
            and ``ffd``; any positive length for ``wrapped``.
        max_seq_len: the capacity of a row in tokens.
        strategy: ``bfd`` (best-fit decreasing), ``ffd`` (first-fit decreasing),
            ``sequential`` (next-fit in input order) or ``wrapped``.

    Raises:
        UsageError: on an unknown strategy, a non-positive ``max_seq_len`` or a length that
            the strategy cannot place.

    """
    lengths = _check_arguments(lengths, max_seq_len, strategy)
    big = int(max_seq_len)
    capped = strategy != "wrapped"
    n = len(lengths)
    parts = _PARTS if capped else 1  # ``wrapped`` needs only the total
    cuts = [n * p // parts for p in range(parts + 1)]
    hists = np.zeros((parts, big + 1 if capped else 1), np.int64)
    threads = min(_WORKERS, parts) if n >= _THREADED else 1
    with ThreadPoolExecutor(threads) if threads > 1 else nullcontext() as pool:
        counted = _run(
            pool,
            [
                partial(_count_lengths, lengths[lo:hi], big, capped, hists[p])
                for p, (lo, hi) in enumerate(pairwise(cuts))
            ],
        )
        for first, (_, bad) in zip(cuts, counted, strict=False):
            if bad >= 0:
                limit = f"1..{big}" if capped else "≥ 1"
                raise UsageError(
                    f"example {first + bad} has length {int(lengths[first + bad])}, outside "
                    f"{limit} for strategy {strategy!r} (use --overlong truncate|split|drop)"
                )
        total = sum(int(t) for t, _ in counted)
        if not capped:
            return _plan_wrapped(lengths, big, total)
        if strategy == "sequential":
            return _plan_sequential(lengths, big)
        return _plan_decreasing(pool, lengths, cuts, hists, total, big, strategy)


def _plan_wrapped(lengths: np.ndarray, big: int, total: int) -> RowPlan:
    segments = _count_wrapped(lengths, big)
    row_offsets = np.zeros(-(-total // big) + 1, np.int64)
    seg_example = np.empty(segments, np.int64)
    seg_start = np.empty(segments, np.int64)
    seg_length = np.empty(segments, np.int32)
    _cut_wrapped(lengths, big, row_offsets, seg_example, seg_start, seg_length)
    return RowPlan.from_segments(row_offsets, seg_example, seg_start, seg_length, big, "wrapped")


@njit(cache=True, nogil=True)
def _next_fit(lengths: np.ndarray, big: int, row_first: np.ndarray) -> int:  # pragma: no cover
    """Write the first example of every row into ``row_first``; return the number of rows."""
    rows, room = 0, 0
    for i in range(lengths.shape[0]):
        if lengths[i] > room:
            row_first[rows] = i
            rows += 1
            room = big
        room -= lengths[i]
    return rows


def _plan_sequential(lengths: np.ndarray, big: int) -> RowPlan:
    n = len(lengths)
    row_first = np.empty(n, np.int64)
    rows = _next_fit(lengths, big, row_first)
    row_offsets = np.append(row_first[:rows], n).astype(np.int64)
    seg_example = np.arange(n, dtype=np.int64)
    seg_start = np.zeros(n, np.int64)
    return RowPlan.from_segments(
        row_offsets, seg_example, seg_start, lengths.astype(np.int32), big, "sequential"
    )


def _plan_decreasing(
    pool: ThreadPoolExecutor | None,
    lengths: np.ndarray,
    cuts: list[int],
    hists: np.ndarray,
    total: int,
    big: int,
    strategy: str,
) -> RowPlan:
    n = len(lengths)
    hist = hists.sum(axis=0)
    above, starts = _find_slots(hists)
    index = np.int32 if n < 2**31 else np.int64  # example and row numbers
    order = np.empty(n, index)  # numpy's buffers get huge pages: first touches cost less
    first_run = np.empty(big + 1, np.int64)
    run_row = np.empty(n, index)  # runs ≤ examples; only the pages used are touched
    run_slot = np.empty(n, np.int32)
    run_count = np.empty(n, np.int32)
    max_rows = min(n, 2 * (-(-total // big)) + 1)
    state = np.empty((max_rows, 2), np.int32)  # per row: next row of equal room, segments
    place = _place_best_fit if strategy == "bfd" else _place_first_fit
    placed, *_ = _run(  # placing needs only the histogram: it runs beside the sort
        pool,
        [partial(place, hist, big, state, first_run, run_row, run_slot, run_count)]
        + [
            partial(_sort_by_length, lengths[lo:hi], lo, starts[p], order)
            for p, (lo, hi) in enumerate(pairwise(cuts))
        ],
    )
    counts, runs = placed
    row_offsets = exclusive_cumsum(counts)
    seg_example = np.empty(n, index)  # the driver keeps it: 4 bytes a segment while n fits
    seg_length = np.empty(n, np.int32)
    # Copy part p moves the lengths tops[p] down to tops[p + 1] + 1: about n / _PARTS examples.
    targets = [n * p // _PARTS for p in range(_PARTS)]
    tops = [max(0, big - int(k)) for k in np.searchsorted(above[::-1], targets)] + [0]
    runs_of = (run_row[:runs], run_slot[:runs], run_count[:runs])

    def copy(top: int, low: int) -> None:
        src, run = int(above[top]), int(first_run[top])
        _copy_runs(order, hist, top, low, src, run, row_offsets, *runs_of, seg_example, seg_length)

    _run(pool, [partial(copy, top, low) for top, low in pairwise(tops)])
    zeros = np.zeros(n, np.int64)  # never written: no page of it is resident
    return RowPlan.from_segments(row_offsets, seg_example, zeros, seg_length, big, strategy)


def plan_packs_reference(
    lengths: np.ndarray | list[int], max_seq_len: int, strategy: str = "bfd"
) -> RowPlan:
    """Plan like :func:`plan_packs`, one example at a time in plain Python (slow; for tests).

    Each strategy as the module docstring states it, with no histogram, stack or tree.
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
    elif strategy == "sequential":
        room = 0
        for i, v in enumerate(values):
            if v > room:
                segments.append([])
                room = big
            segments[-1].append((i, 0, v))
            room -= v
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
    return RowPlan.from_segments(
        row_offsets=exclusive_cumsum(np.array([len(row) for row in segments], dtype=np.int64)),
        seg_example=np.array([s[0] for s in flat], np.int64),
        seg_start=np.array([s[1] for s in flat], np.int64),
        seg_length=np.array([s[2] for s in flat], np.int32),
        max_seq_len=big,
        strategy=strategy,
    )
