r"""A pack with images, served row by row: pixels loaded lazily, checked, positioned.

The shards hold tokens only; ``examples.parquet`` holds each example's images by reference
(:mod:`packshard.pack.media`).  ``PackedVisionDataset[i]`` is ``PackedDataset[i]`` plus::

    pixel_values    (patches, 3*2*14*14)  every image of the row, in order, as the processor
                                          makes them (transformers' Qwen2-VL PIL processor)
    image_grid_thw  (images, 3)           each image's grid; equal to the recorded one
    position_ids    (4, tokens)           row 0: 0 at every seam; rows 1-3: the 3-D rotary
                                          positions of each segment alone (``rope``)

It runs in ``__getitem__`` (in the DataLoader's workers).  Each file is read once, hashed and
compared with the recorded SHA-256, and those bytes are decoded; a missing or changed file is
a :class:`~packshard.errors.FormatError` naming it and ``source:line``.
"""

from __future__ import annotations

import io
import os
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

from packshard.digests import sha256_bytes
from packshard.errors import FormatError
from packshard.format.examples import EXAMPLES_NAME
from packshard.format.manifest import load_manifest
from packshard.options import VisionRule
from packshard.torch.dataset import PackedDataset
from packshard.torch.vision.rope import packed_positions

IMAGE_PAD_ID = 151655
"""``<|image_pad|>`` of the Qwen2/2.5/3-VL tokenizers: the token each merged patch takes."""


def vision_rule(manifest: dict[str, Any]) -> VisionRule:
    """Return the rule a pack's images were counted with (the default unless recorded)."""
    recorded = (manifest.get("config") or {}).get("media") or {}
    rule = recorded.get("vision_rule") or {}
    return VisionRule(**rule) if rule else VisionRule()


def read_media(
    entry: dict[str, Any], media_root: str | os.PathLike[str] | None, where: str
) -> bytes:
    """Return an image's bytes after checking them against the index's size and SHA-256.

    Raises:
        FormatError: the file is missing, or its size or hash is not the recorded one.

    """
    root = Path(media_root) if media_root is not None else Path(entry["root"])
    file = root / entry["path"]
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise FormatError(
            str(file),
            f"image of {where} cannot be read ({exc.strerror or exc}); restore it, or pass "
            "media_root= the folder its paths start from",
        ) from None
    if len(data) != entry["bytes"] or sha256_bytes(data) != entry["sha256"]:
        raise FormatError(
            str(file),
            f"image of {where} changed since it was packed ({len(data):,} bytes, recorded "
            f"{entry['bytes']:,} with SHA-256 {entry['sha256'][:12]}…); restore it or pack again",
        )
    return data


class PackedVisionDataset(torch.utils.data.Dataset[dict[str, Any]]):
    """The rows of a pack with images, with their pixels, grids and 3-D positions.

    Args:
        out: the folder ``packshard pack`` wrote.
        media_root: where the images' paths start now (default: the roots recorded).
        **kwargs: passed to :class:`~packshard.torch.dataset.PackedDataset`.

    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        *,
        media_root: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.out = Path(out)
        self.rows = PackedDataset(out, **kwargs)
        self.media_root = media_root
        self.rule = vision_rule(load_manifest(out))
        index = pq.read_table(self.out / EXAMPLES_NAME, columns=["example_id", "source", "line"])
        if "media" not in pq.read_schema(self.out / EXAMPLES_NAME).names:
            raise FormatError(
                str(self.out / EXAMPLES_NAME), "no media column: not a pack with images"
            )
        self._ids = index["example_id"].to_numpy()
        self._places = [
            f"example {e} ({s}:{n})"
            for e, s, n in zip(
                self._ids.tolist(),
                index["source"].to_pylist(),
                index["line"].to_pylist(),
                strict=True,
            )
        ]

    @cached_property
    def media(self) -> list[list[dict[str, Any]]]:
        """Each example's images, by index row (read once per process, on first use)."""
        return pq.read_table(self.out / EXAMPLES_NAME, columns=["media"])["media"].to_pylist()

    @cached_property
    def processor(self) -> Any:
        """Transformers' Qwen2-VL image processor (PIL), set as the pack's rule (Qwen3-VL too)."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        return Qwen2VLImageProcessorPil(**self.rule.processor_options())

    def __len__(self) -> int:
        return len(self.rows)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("media", None)  # each worker reads the column itself, on first use
        state.pop("processor", None)
        return state

    def segment_media(self, example_ids: list[int]) -> list[list[dict[str, Any]]]:
        """Return the recorded images of each example id, in order."""
        rows = np.searchsorted(self._ids, example_ids)
        return [self.media[int(r)] for r in rows]

    def __getitem__(self, index: int) -> dict[str, Any]:
        from PIL import Image

        row = self.rows[index]
        eids = row["example_ids"].tolist()
        per_segment = self.segment_media(eids)
        images, grids = [], []
        for eid, entries in zip(eids, per_segment, strict=True):
            where = self._places[int(np.searchsorted(self._ids, eid))]
            for entry in entries:
                data = read_media(entry, self.media_root, where)
                with Image.open(io.BytesIO(data)) as image:
                    images.append(image.convert("RGB"))
                grids.append((entry["grid_t"], entry["grid_h"], entry["grid_w"]))
        if images:
            got = self.processor(images=images, return_tensors="pt")
            made = got["image_grid_thw"].tolist()
            if made != [list(g) for g in grids]:
                raise FormatError(
                    str(self.out / EXAMPLES_NAME),
                    f"row {index}: the processor made grids {made}, the index records "
                    f"{[list(g) for g in grids]} (another processor or pixel bounds)",
                )
            row["pixel_values"] = got["pixel_values"]
            row["image_grid_thw"] = got["image_grid_thw"]
        ids = row["input_ids"].numpy()
        cu = row["cu_seqlens"].numpy()
        seg_grids = [[(e["grid_t"], e["grid_h"], e["grid_w"]) for e in m] for m in per_segment]
        positions = packed_positions(ids, cu, seg_grids, IMAGE_PAD_ID, self.rule.merge_size)
        row["position_ids"] = torch.from_numpy(positions)
        return row


def collate_vision(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate rows into one packed batch row: what a Qwen2.5-VL forward takes.

    ``input_ids`` and ``labels`` become ``(1, n)``, ``position_ids`` ``(4, 1, n)`` (each
    row's segments keep their own restart, so the seams stay seams), ``pixel_values`` and
    ``image_grid_thw`` the rows' images in order.
    """
    out: dict[str, Any] = {
        "input_ids": torch.cat([r["input_ids"] for r in rows])[None],
        "labels": torch.cat([r["labels"] for r in rows])[None],
        "position_ids": torch.cat([r["position_ids"] for r in rows], dim=1)[:, None],
    }
    with_images = [r for r in rows if "pixel_values" in r]
    if with_images:
        out["pixel_values"] = torch.cat([r["pixel_values"] for r in with_images])
        out["image_grid_thw"] = torch.cat([r["image_grid_thw"] for r in with_images])
    return out
