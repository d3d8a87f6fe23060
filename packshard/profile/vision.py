r"""What images cost: vision tokens, image sizes, and the padding of a padded VLM batch.

An image reaches the model as one placeholder token per merged patch
(:mod:`packshard.ingest.media.grid`).  From per-example counts and per-image sizes the profile
reports::

    vision share        Σ vision tokens / Σ tokens                   of the accepted examples
    per example         vision tokens P50 / P90 / P99 / max           examples with images
    image sizes         width×height of the images at P50 / P90 / max of their area, and
                        bytes P50 / P90 / max                        nearest-rank
    padded VLM batch    --batch-size examples with images, drawn with --seed, text and vision
                        tokens padded to the batch's longest:  1 − useful / computed
    vision tokens a batch   max / mean over those batches (the encoder's work per step)

In the padded batches examples longer than ``max_seq_len`` are clipped, as in
:mod:`packshard.profile.lengths`; the share counts every token.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packshard.profile.lengths import measure_batches, nearest_rank

QUANTILES = (50, 90)
"""Nearest-rank percentiles reported beside the maximum."""


def _spread(values: np.ndarray, extra: tuple[int, ...] = ()) -> dict[str, int]:
    """Return nearest-rank ``P<q>`` of ``values`` for :data:`QUANTILES` (and ``extra``), max."""
    ordered = np.sort(values)
    return {
        **{f"p{q}": int(nearest_rank(ordered, q)) for q in (*QUANTILES, *extra)},
        "max": int(ordered[-1]),
    }


def _sizes(sizes: np.ndarray) -> dict[str, list[int]]:
    """Return ``[width, height]`` of the images at the area's nearest-rank quantiles and max."""
    area = sizes[:, 0] * sizes[:, 1]
    order = np.argsort(area, kind="stable")
    n = len(order)
    ranks = {f"p{q}": max((q * n + 99) // 100, 1) - 1 for q in QUANTILES} | {"max": n - 1}
    return {k: [int(v) for v in sizes[order[r], :2]] for k, r in ranks.items()}


def vision_profile(
    lengths: np.ndarray,
    images: np.ndarray,
    vision_tokens: np.ndarray,
    sizes: np.ndarray,
    max_seq_len: int,
    batch_size: int,
    seed: int,
) -> dict[str, Any]:
    """Return the figures of the module notes (an empty dict when no example has an image).

    ``sizes`` holds one ``(width, height, bytes)`` row per image, in example order.
    """
    images = np.asarray(images, dtype=np.int64)
    holders = np.flatnonzero(images)
    if not holders.size:
        return {}
    raw = np.asarray(lengths, dtype=np.int64)
    lengths = np.minimum(raw, max_seq_len)  # the padded batches clip, as every strategy does
    vision = np.asarray(vision_tokens, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 3)
    own = lengths[holders]
    order = np.random.default_rng(seed).permutation(holders.size)
    computed = measure_batches(own[order], batch_size)
    useful = int(own.sum())
    batches = np.add.reduceat(vision[holders][order], np.arange(0, holders.size, batch_size))
    total_vision = int(vision.sum())
    return {
        "examples_with_images": int(holders.size),
        "images": int(images.sum()),
        "vision_tokens": total_vision,
        "vision_share": round(total_vision / int(raw.sum()), 6) if raw.sum() else 0.0,
        "vision_tokens_per_example": _spread(vision[holders], (99,)),
        "images_per_example": _spread(images[holders]),
        "image_size": _sizes(sizes),
        "bytes": {**_spread(sizes[:, 2]), "total": int(sizes[:, 2].sum())},
        "padded_batch": {
            "batch_size": batch_size,
            "computed_tokens": computed,
            "useful_tokens": useful,
            "padding_share": round(1 - useful / computed, 6) if computed else 0.0,
            "vision_tokens_max": int(batches.max()),
            "vision_tokens_mean": round(float(batches.mean()), 3),
        },
    }


def describe_vision(vision: dict[str, Any]) -> str:
    """Return the one-paragraph summary ``profile`` prints for images."""
    per = vision["vision_tokens_per_example"]
    pad = vision["padded_batch"]
    size, b = vision["image_size"], vision["bytes"]
    return (
        f"images: {vision['images']:,} in {vision['examples_with_images']:,} examples; vision "
        f"tokens {vision['vision_tokens']:,}, {vision['vision_share']:.1%} of all tokens; per "
        f"example P50 {per['p50']:,}, P90 {per['p90']:,}, max {per['max']:,}. Images (by area) "
        f"P50 {'×'.join(map(str, size['p50']))}, max {'×'.join(map(str, size['max']))} px; "
        f"{b['p50']:,} B P50, "
        f"{b['total']:,} B in all. A padded VLM batch ({pad['batch_size']} examples with images, "
        f"text and vision tokens padded to the longest) wastes {pad['padding_share']:.1%}; "
        f"vision tokens a batch max {pad['vision_tokens_max']:,}, mean "
        f"{pad['vision_tokens_mean']:,.1f}"
    )
