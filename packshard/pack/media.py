"""The examples index's ``media`` column: each example's images, by reference, hashed once.

Planning reads image headers only (:mod:`packshard.ingest.media.files`); the bytes are hashed
here, once per distinct file, after planning, for the examples that hold images.  Their
records are found again by ``source:line`` (the same reading and normalizing ingest did, so
the same files in the same order) and each example gets one entry per image::

    examples.parquet  example 3  chat.json:1  media = [
        {root: "data", path: "imgs/1.jpg", bytes: 12324, sha256: "95d2…", width: 300,
         height: 168, grid_t: 1, grid_h: 12, grid_w: 22},  …]

A ``--turns expand`` example holds the images of its record up to its turn.  Packs without
images never get the column.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from packshard.digests import sha256_path
from packshard.errors import RecordError
from packshard.ingest import expand_inputs, image_grid, normalize_record, read_records
from packshard.ingest.types import IngestOptions
from packshard.options import VisionCaps, VisionRule
from packshard.pack.plan.rows import RowPlan
from packshard.pack.spill import Spill
from packshard.records import Reject


def media_lists(spill: Spill, options: IngestOptions) -> list[list[dict[str, Any]]] | None:
    """Return, per spilled example, its images as the index records them; None without images.

    Raises:
        RecordError: a record's media no longer read as they did while packing (a file
            changed or vanished during the pack), at its place.

    """
    images = spill.images
    if images is None or not images.any():
        return None
    rule = options.vision_rule()
    holders = np.flatnonzero(images)
    wanted: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for e in holders.tolist():
        wanted[int(spill.source_index[e])][int(spill.lines[e])].append(e)
    out: list[list[dict[str, Any]]] = [[] for _ in range(len(spill))]
    hashes: dict[str, str] = {}
    for source, lines in sorted(wanted.items()):
        (f,) = expand_inputs([spill.counts.sources[source]])
        for raw in read_records(f, options=options):
            examples = lines.get(raw.ref.line)
            if examples is None:
                continue
            conv = normalize_record(raw, options.format, options.domain_field, options.media_root)
            entries = []
            for m in conv.media:
                key = str(m.file)
                if key not in hashes:
                    hashes[key] = sha256_path(m.file)
                t, h, w = image_grid(m.width, m.height, rule)
                entries.append(
                    {
                        "root": m.root,
                        "path": m.path,
                        "bytes": m.size,
                        "sha256": hashes[key],
                        "width": m.width,
                        "height": m.height,
                        "grid_t": t,
                        "grid_h": h,
                        "grid_w": w,
                    }
                )
            for e in examples:
                out[e] = entries[: int(images[e])]
    return out


def example_vision(
    media: list[list[dict[str, Any]]], rule: VisionRule
) -> tuple[np.ndarray, np.ndarray]:
    """Return, per spilled example, its images and its vision tokens (int64 each).

    An image's vision tokens are its placeholder tokens: ``t*h*w`` patches, ``merge_size²``
    of them a token (what the vision encoder's merger hands the language model).
    """
    merge = rule.merge_size * rule.merge_size
    images = np.fromiter((len(m) for m in media), np.int64, count=len(media))
    tokens = np.fromiter(
        (sum(e["grid_t"] * e["grid_h"] * e["grid_w"] for e in m) // merge for m in media),
        np.int64,
        count=len(media),
    )
    return images, tokens


OVER_CAP_CODE = "over_vision_cap"


def cap_drops(
    spill: Spill,
    over: np.ndarray,
    caps: VisionCaps,
    overlong: str,
    copies: np.ndarray | None = None,
) -> tuple[Reject, ...]:
    """One ``over_vision_cap`` reject per record whose every example alone exceeds a cap.

    An example with images is never cut, so every ``--overlong`` policy but ``error`` drops
    it.  A record with an example that fits is not rejected; ``copies`` (``--mix``) leaves
    out the records the mixture dropped already.

    Raises:
        RecordError: ``over_vision_cap`` under ``--overlong error``, at the first such example.

    """
    if not over.any():
        return ()
    shown = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in caps.as_dict().items())
    why = f"an example with more images or vision tokens than a row may hold ({shown})"
    if overlong == "error":
        e = int(np.flatnonzero(over)[0])
        source = spill.counts.sources[spill.source_index[e]]
        raise RecordError(OVER_CAP_CODE, f"{why}; use --overlong drop", source, int(spill.lines[e]))
    record_ids = spill.record_ids
    first = np.flatnonzero(np.diff(record_ids, prepend=-1) != 0)
    all_over = np.logical_and.reduceat(over, first)
    if copies is not None:
        all_over &= copies > 0
    return spill.rejects(first[all_over], OVER_CAP_CODE, why)


def vision_stats(
    media: list[list[dict[str, Any]]], plan: RowPlan, rule: VisionRule, caps: VisionCaps
) -> dict[str, Any]:
    """Return the manifest's ``stats.vision``: images and vision tokens, in all and per row.

    A row's vision tokens are what its images cost the vision encoder; their spread over the
    rows (max vs mean) says how unevenly the encoder's work falls on them, and with caps
    (``caps``) the max is at most the cap.
    """
    images, tokens = example_vision(media, rule)
    seg_rows = plan.segment_rows()
    per_row_tokens = np.bincount(
        seg_rows, weights=tokens[plan.seg_example], minlength=plan.num_rows
    )
    per_row_images = np.bincount(
        seg_rows, weights=images[plan.seg_example], minlength=plan.num_rows
    )
    rows = max(plan.num_rows, 1)
    return {
        "images": int(images[plan.seg_example].sum()),
        "vision_tokens": int(tokens[plan.seg_example].sum()),
        "rows_with_images": int(np.count_nonzero(per_row_images)),
        "per_row_images": {
            "max": int(per_row_images.max(initial=0)),
            "mean": round(float(per_row_images.sum()) / rows, 3),
        },
        "per_row_vision_tokens": {
            "max": int(per_row_tokens.max(initial=0)),
            "mean": round(float(per_row_tokens.sum()) / rows, 3),
        },
        "rule": rule.as_dict(),
        **({"caps": caps.as_dict()} if caps.active else {}),
    }
