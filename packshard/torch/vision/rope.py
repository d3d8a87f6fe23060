r"""The 3-D rotary positions of Qwen2-VL and Qwen2.5-VL, for one example or a packed row.

Text tokens advance all three rows (temporal, height, width) together; an image's ``t*h*w /
merge²`` placeholder tokens take a grid of positions starting where the text stopped, and the
text after it resumes at that start plus ``max(h, w) / merge`` (transformers'
``get_rope_index`` for images)::

    tokens   sys …  <vs> [pad × 4: grid (1, 4, 4), merge 2]  <ve>  Who ?
    t        0 … 9  10    11 11 11 11                        13    14  15
    h        0 … 9  10    11 11 12 12                        13    14  15
    w        0 … 9  10    11 12 11 12                        13    14  15

Packed, every segment restarts at 0, and transformers finds the seams from four rows: the
plain ``position_ids`` (0 at each seam) stacked on the three rotary rows (without it, the
example attends across the seam).  Positions are derived from the ids and the recorded
grids, so the shards need not store them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mrope_positions(
    ids: np.ndarray, grids: Sequence[Sequence[int]], image_pad_id: int, merge_size: int = 2
) -> np.ndarray:
    """Return one example's ``(3, n)`` rotary positions, int64 (``get_rope_index``'s rule).

    ``grids`` are the example's images' ``(t, h, w)`` in order; each maximal run of
    ``image_pad_id`` is one image.

    Raises:
        ValueError: the runs and the grids disagree (a malformed row: an internal error).

    """
    n = len(ids)
    out = np.empty((3, n), np.int64)
    is_pad = np.asarray(ids) == image_pad_id
    edges = np.flatnonzero(np.diff(np.concatenate(([0], is_pad.view(np.int8), [0]))))
    starts, ends = edges[0::2], edges[1::2]
    if len(starts) != len(grids):
        raise ValueError(f"{len(starts)} image token runs for {len(grids)} grids")
    pos, at = 0, 0
    for lo, hi, grid in zip(starts.tolist(), ends.tolist(), grids, strict=True):
        out[:, at:lo] = np.arange(pos, pos + lo - at)
        pos += lo - at
        t, h, w = (int(grid[0]), int(grid[1]) // merge_size, int(grid[2]) // merge_size)
        if t * h * w != hi - lo:
            raise ValueError(f"an image run of {hi - lo} tokens for grid {tuple(grid)}")
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
        out[0, lo:hi] = tt.ravel() + pos
        out[1, lo:hi] = hh.ravel() + pos
        out[2, lo:hi] = ww.ravel() + pos
        pos += max(h, w)
        at = hi
    out[:, at:] = np.arange(pos, pos + n - at)
    return out


def packed_positions(
    ids: np.ndarray,
    cu_seqlens: np.ndarray,
    grids: Sequence[Sequence[Sequence[int]]],
    image_pad_id: int,
    merge_size: int = 2,
) -> np.ndarray:
    """Return a packed row's ``(4, n)`` positions: the text row, then the three rotary rows.

    ``grids[k]`` are segment ``k``'s image grids; every row restarts at 0 at each seam.
    """
    n = len(ids)
    out = np.empty((4, n), np.int64)
    bounds = zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True)
    for k, (lo, hi) in enumerate(bounds):
        out[0, lo:hi] = np.arange(hi - lo)
        out[1:, lo:hi] = mrope_positions(ids[lo:hi], grids[k], image_pad_id, merge_size)
    return out
