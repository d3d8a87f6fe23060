r"""Rows capped in images and vision tokens: best-fit decreasing over three capacities.

``--max-images-per-row`` and ``--max-vision-tokens-per-row`` bound a row's vision-encoder work,
so each row has three rooms: tokens (``max_seq_len``), images and vision tokens (an unset cap
is ``max_seq_len``, which no row can pass).

``bfd`` takes the examples by decreasing length, then by index, as the plain planner does,
and puts each into the row with the least *token* room that also has the image and vision
room it needs, preferring among equals the row whose room changed last; none: a new row::

    L = 1024, at most 2 images and 600 vision tokens a row
    example  len  img  vis        rows (token room / images left / vision left)
    e0       700   1   500   →    r0  324 / 1 / 100
    e1       400   1   300   →    r1  624 / 1 / 300        (r0 lacks vision room)
    e2       300   1   200   →    r1  324 / 0 / 100        (r0 lacks vision room)
    e3       300   0     0   →    r1   24 / 0 / 100        (text: least room, changed last)

Two sets of per-room stacks of rows, both pushed whenever a row's room changes (so the head
of a stack is the row that changed last): *all* rows with token room, and the *vision-open*
ones (an image and a vision token left).  A text example looks in the first, an example with
images in the second.  Over each, a max segment tree on the token room finds the smallest room
``c ≥ len`` worth a look in O(log L): its leaf holds 1 for a non-empty stack (all rows), and an
upper bound of the stack's vision room (vision-open rows), raised on every push and set to the
stack's true maximum when a scan of it finds no row that fits::

    room   1    2    …   l   …   c   …   L
    leaf   0    3         0      7        0    vision room bound per stack
           └─ leftmost leaf ≥ vis, from l ─┘   descend the tree, then scan stack c

Text examples cost O(log L); an example with images O(log L) plus the rows it scans past that
lack image room.  Without a binding cap the plan is the plain ``bfd`` plan.  ``sequential`` is
next-fit with the three rooms; ``ffd`` and ``wrapped`` take no caps.
:func:`plan_capped_reference` is the quadratic twin the kernel is held to.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from packshard.arrays import exclusive_cumsum
from packshard.errors import UsageError
from packshard.options import CAPPED_STRATEGIES, NO_CAP, VisionCaps
from packshard.pack.plan.rows import RowPlan


def over_caps(caps: VisionCaps, images: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Return, per example, whether it alone exceeds a cap (bool)."""
    out = np.zeros(len(images), dtype=bool)
    if caps.images != NO_CAP:
        out |= images > caps.images
    if caps.tokens != NO_CAP:
        out |= tokens > caps.tokens
    return out


@njit(cache=True, nogil=True)
def _tree_set(tree: np.ndarray, size: int, leaf: int, value: int) -> None:  # pragma: no cover
    i = leaf + size
    tree[i] = value
    i >>= 1
    while i:
        tree[i] = max(tree[2 * i], tree[2 * i + 1])
        i >>= 1


@njit(cache=True, nogil=True)
def _tree_find(tree: np.ndarray, size: int, lo: int, need: int) -> int:  # pragma: no cover
    """Return the leftmost leaf ≥ ``lo`` whose value is at least ``need``; -1 when none."""
    i = lo + size
    while True:
        if tree[i] >= need:
            while i < size:
                i = 2 * i if tree[2 * i] >= need else 2 * i + 1
            return i - size
        while i & 1:  # a right child: go up until a left child, whose sibling is to the right
            i >>= 1
        if i == 0:
            return -1
        i += 1


@njit(cache=True, nogil=True)
def _unlink(head, nxt, prv, room, r):  # pragma: no cover - compiled
    """Take row ``r`` out of the stack of room ``room``."""
    if prv[r] >= 0:
        nxt[prv[r]] = nxt[r]
    else:
        head[room] = nxt[r]
    if nxt[r] >= 0:
        prv[nxt[r]] = prv[r]


@njit(cache=True, nogil=True)
def _push(head, nxt, prv, room, r):  # pragma: no cover - compiled
    """Put row ``r`` on top of the stack of room ``room``."""
    nxt[r] = head[room]
    prv[r] = -1
    if head[room] >= 0:
        prv[head[room]] = r
    head[room] = r


@njit(cache=True, nogil=True)
def _best_fit(
    order, lengths, images, vision, big, cap_images, cap_vision, row_of
):  # pragma: no cover
    """Place ``order`` (longest first) by capped best fit; write each row; return the rows."""
    n = len(order)
    size = 1
    while size < big + 1:
        size *= 2
    tree_all = np.zeros(2 * size, np.int64)
    tree_vis = np.zeros(2 * size, np.int64)
    head_all = np.full(big + 1, -1, np.int64)
    head_vis = np.full(big + 1, -1, np.int64)
    count_all = np.zeros(big + 1, np.int64)
    nxt_all = np.empty(n, np.int64)
    prv_all = np.empty(n, np.int64)
    nxt_vis = np.empty(n, np.int64)
    prv_vis = np.empty(n, np.int64)
    tok = np.empty(n, np.int64)
    img = np.empty(n, np.int64)
    vis = np.empty(n, np.int64)
    open_vis = np.zeros(n, np.bool_)
    rows = 0
    for k in range(n):
        e = order[k]
        need, im, vt = lengths[e], images[e], vision[e]
        r = -1
        if im == 0 and vt == 0:
            c = _tree_find(tree_all, size, need, 1)
            if c >= 0:
                r = head_all[c]
        else:
            c = _tree_find(tree_vis, size, need, vt)
            while c >= 0:
                s, best = head_vis[c], 0
                while s >= 0:
                    if vis[s] >= vt and img[s] >= im:
                        r = s
                        break
                    best = max(best, vis[s])
                    s = nxt_vis[s]
                if r >= 0:
                    break
                _tree_set(tree_vis, size, c, best)  # the stack's true bound: none fits here
                c = _tree_find(tree_vis, size, c + 1, vt) if c < big else -1
        if r < 0:
            r = rows
            rows += 1
            tok[r], img[r], vis[r] = big, cap_images, cap_vision
        else:
            room = tok[r]
            _unlink(head_all, nxt_all, prv_all, room, r)
            count_all[room] -= 1
            if count_all[room] == 0:
                _tree_set(tree_all, size, room, 0)
            if open_vis[r]:
                _unlink(head_vis, nxt_vis, prv_vis, room, r)
                if head_vis[room] < 0:
                    _tree_set(tree_vis, size, room, 0)
        row_of[k] = r
        tok[r] -= need
        img[r] -= im
        vis[r] -= vt
        room = tok[r]
        open_vis[r] = room > 0 and img[r] > 0 and vis[r] > 0
        if room > 0:
            _push(head_all, nxt_all, prv_all, room, r)
            count_all[room] += 1
            if count_all[room] == 1:
                _tree_set(tree_all, size, room, 1)
        if open_vis[r]:
            _push(head_vis, nxt_vis, prv_vis, room, r)
            if tree_vis[room + size] < vis[r]:
                _tree_set(tree_vis, size, room, vis[r])
    return rows


@njit(cache=True, nogil=True)
def _next_fit(lengths, images, vision, big, cap_images, cap_vision, row_of):  # pragma: no cover
    """Write each example's row (input order, a new row when a room runs out); return rows."""
    rows, tok, img, vis = 0, 0, 0, 0
    for i in range(len(lengths)):
        if lengths[i] > tok or images[i] > img or vision[i] > vis:
            rows += 1
            tok, img, vis = big, cap_images, cap_vision
        row_of[i] = rows - 1
        tok -= lengths[i]
        img -= images[i]
        vis -= vision[i]
    return rows


def _checked(
    lengths: Any, images: Any, vision: Any, max_seq_len: int, strategy: str, caps: VisionCaps
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    if strategy not in CAPPED_STRATEGIES:
        raise UsageError(
            f"--strategy {strategy} does not take --max-images-per-row or "
            "--max-vision-tokens-per-row (use --strategy bfd or sequential)"
        )
    arrays = [np.asarray(a, dtype=np.int64) for a in (lengths, images, vision)]
    if len({len(a) for a in arrays}) != 1:
        raise UsageError("lengths, images and vision tokens must have one entry per example")
    big = int(max_seq_len)
    lengths, images, vision = arrays
    if lengths.size and (lengths.min() < 1 or lengths.max() > big):
        raise UsageError(f"a length is outside 1..{big} (use --overlong drop)")
    if over_caps(caps, images, vision).any() or (
        images.size and min(images.min(), vision.min()) < 0
    ):
        raise UsageError("an example alone exceeds a vision cap (drop it before planning)")
    return lengths, images, vision, caps.images or big, caps.tokens or big


def plan_capped(
    lengths: Any,
    images: Any,
    vision: Any,
    max_seq_len: int,
    strategy: str,
    caps: VisionCaps,
) -> RowPlan:
    """Pack examples into rows of at most ``max_seq_len`` tokens and the ``caps``.

    ``images`` and ``vision`` hold each example's images and vision tokens (0 for text).

    Raises:
        UsageError: a strategy that takes no caps, a length outside 1..max_seq_len, or an
            example that alone exceeds a cap (the caller drops those first).

    """
    lengths, images, vision, cap_i, cap_v = _checked(
        lengths, images, vision, max_seq_len, strategy, caps
    )
    n = len(lengths)
    row_of = np.empty(n, np.int64)
    if strategy == "sequential":
        order = np.arange(n, dtype=np.int64)
        rows = _next_fit(lengths, images, vision, int(max_seq_len), cap_i, cap_v, row_of)
    else:
        order = np.lexsort((np.arange(n), -lengths)).astype(np.int64)
        rows = _best_fit(order, lengths, images, vision, int(max_seq_len), cap_i, cap_v, row_of)
    by_row = np.argsort(row_of, kind="stable")  # a row's segments in placement order
    seg_example = order[by_row]
    return RowPlan.from_segments(
        exclusive_cumsum(np.bincount(row_of, minlength=rows).astype(np.int64)),
        seg_example,
        np.zeros(n, np.int64),
        lengths[seg_example].astype(np.int32),
        int(max_seq_len),
        strategy,
    )


def plan_capped_reference(
    lengths: Any,
    images: Any,
    vision: Any,
    max_seq_len: int,
    strategy: str,
    caps: VisionCaps,
) -> RowPlan:
    """Plan like :func:`plan_capped`, one example and one row at a time (slow; for tests)."""
    lengths, images, vision, cap_i, cap_v = _checked(
        lengths, images, vision, max_seq_len, strategy, caps
    )
    big = int(max_seq_len)
    rooms: list[list[int]] = []  # per row: tokens, images, vision tokens left
    changed: list[int] = []
    rows: list[list[int]] = []
    n = len(lengths)
    if strategy == "sequential":
        steps = list(range(n))
    else:
        steps = sorted(range(n), key=lambda j: (-int(lengths[j]), j))
    for step, e in enumerate(steps):
        need = (int(lengths[e]), int(images[e]), int(vision[e]))
        fits = [b for b, room in enumerate(rooms) if min(np.subtract(room, need)) >= 0]
        if strategy == "sequential":
            fits = [b for b in fits if b == len(rooms) - 1]
        fits.sort(key=lambda b: (rooms[b][0], -changed[b]))
        if not fits:
            rooms.append([big, cap_i, cap_v])
            changed.append(step)
            rows.append([])
        b = fits[0] if fits else len(rooms) - 1
        rows[b].append(e)
        rooms[b] = [x - y for x, y in zip(rooms[b], need, strict=True)]
        changed[b] = step
    flat = np.array([e for row in rows for e in row], dtype=np.int64)
    return RowPlan.from_segments(
        exclusive_cumsum(np.array([len(row) for row in rows], dtype=np.int64)),
        flat,
        np.zeros(len(flat), np.int64),
        lengths[flat].astype(np.int32) if len(flat) else np.zeros(0, np.int32),
        big,
        strategy,
    )
