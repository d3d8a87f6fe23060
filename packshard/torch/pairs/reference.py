"""The reference model's log-probabilities, computed once into a sidecar of the pack.

DPO compares the policy with a frozen reference model on the same pairs.  Run on the fly,
the reference costs one more forward per step; its numbers never change, so they can be
computed once and read back as data::

    OUT/reference_logps.parquet    one row per preference segment (branch 1/2, or a KTO label)
        example_id   int64         the segment's example (examples.parquet's id)
        logp         float64       summed log-probability of its trained tokens
        num_tokens   int32         its trained tokens
    manifest.json  files.reference_logps = {path, bytes, sha256}   (integrity checks it)

:func:`write_reference_logps` runs the model over every row of OUT packed, as training does,
writes the file atomically under OUT's lock (:func:`~packshard.format.folder.claim.amend_out`)
and lists it in the manifest.  :meth:`ReferenceLogps.for_pairs` gives a batch's ``(chosen,
rejected)`` sums for :func:`~packshard.torch.pairs.logps.dpo_loss`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from packshard.digests import read_hashed, sha256_path
from packshard.errors import FormatError, UsageError
from packshard.format.folder.claim import amend_out, publish_file
from packshard.format.folder.paths import open_inside
from packshard.format.manifest import load_manifest, write_manifest
from packshard.format.shards import read_shard
from packshard.format.sidecars.reference import (
    REFERENCE_KEY,
    REFERENCE_NAME,
    REFERENCE_SCHEMA,
    read_reference,
    scored_example_ids,
)
from packshard.format.version import META_DATASET_ID, META_FORMAT_VERSION
from packshard.torch.dataset import PackedDataset
from packshard.torch.layers.tiny import local_causal_lm
from packshard.torch.masks import block_causal_mask
from packshard.torch.pairs.logps import PairLogps, segment_logps


def row_reference(model: Any, row: dict[str, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Return one row's per-segment summed log-probabilities and trained-token counts."""
    device = next(model.parameters()).device
    cu = row["cu_seqlens"].to(torch.int64)
    with torch.no_grad():
        logits = model(
            input_ids=row["input_ids"][None].to(device),
            position_ids=row["position_ids"][None].to(device),
            attention_mask=block_causal_mask(cu)[None, None].to(device),
            use_cache=False,
        ).logits
        sums, counts = segment_logps(logits.float(), row["labels"][None].to(device), cu)
    return sums.double().cpu().numpy(), counts.cpu().numpy()


def reference_table(model: Any, data: PackedDataset) -> pa.Table:
    """Run ``model`` over every row of ``data``; one table row per preference segment."""
    ids, logps, counts = [], [], []
    for i in range(len(data)):
        row = data[i]
        keep = torch.zeros(row["example_ids"].numel(), dtype=torch.bool)
        if "branch" in row:
            keep |= row["branch"] != 0
        if "kto_label" in row:
            keep |= row["kto_label"] >= 0
        if not bool(keep.any()):
            continue
        sums, trained = row_reference(model, row)
        mask = keep.numpy()
        ids.append(row["example_ids"].numpy()[mask])
        logps.append(sums[mask])
        counts.append(trained[mask].astype(np.int32))
    if not ids:
        raise UsageError(
            f"{data.out}: no preference segments (branch or kto_label columns) to score; "
            "reference log-probabilities are for packs of preference pairs or KTO records"
        )
    meta = {
        META_FORMAT_VERSION: str(data.manifest.get("format_version", 1)).encode(),
        META_DATASET_ID: data.dataset_id.encode(),
    }
    arrays = [pa.array(np.concatenate(c)) for c in (ids, logps, counts)]
    return pa.Table.from_arrays(arrays, schema=REFERENCE_SCHEMA).replace_schema_metadata(meta)


def write_reference_logps(out: str | os.PathLike[str], model: Any | str | os.PathLike[str]) -> Path:
    """Score every preference segment of OUT with ``model`` and add the sidecar to OUT.

    ``model`` is a loaded causal LM or a local model folder.  Every split is scored (eval
    pairs need their reference too).  Returns the sidecar's path.
    """
    if isinstance(model, str | os.PathLike):
        if not (Path(model) / "config.json").is_file():
            raise UsageError(f"{model}: not a model folder (no config.json); give a local folder")
        model = local_causal_lm(Path(model))
    with amend_out(out, REFERENCE_NAME, "reference") as folder:
        data = PackedDataset(folder, split=None)
        table = reference_table(model, data)
        path = publish_file(
            folder, REFERENCE_NAME, lambda tmp: pq.write_table(table, tmp, compression="zstd")
        )
        manifest = load_manifest(folder, validate=False)
        manifest.setdefault("files", {})[REFERENCE_KEY] = {
            "path": REFERENCE_NAME,
            "bytes": path.stat().st_size,
            "sha256": sha256_path(path),
        }
        write_manifest(folder, manifest)
    return path


class ReferenceLogps:
    """The sidecar of OUT, read back: reference sums by example id.

    Refuses a sidecar the manifest does not list, whose SHA-256 differs, or whose contents
    break :func:`~packshard.format.sidecars.reference.reference_problem`: it goes straight into
    the loss.
    """

    def __init__(self, out: str | os.PathLike[str]) -> None:
        folder = Path(out)
        manifest = load_manifest(folder, validate=False)
        entry = manifest.get("files", {}).get(REFERENCE_KEY)
        if not isinstance(entry, dict):
            raise UsageError(
                f"{folder}: no reference log-probabilities (add them with "
                "packshard.torch.pairs.reference.write_reference_logps, or run the reference "
                "model on the fly)"
            )
        path = folder / str(entry.get("path"))
        try:
            fd = open_inside(folder, entry.get("path"))
        except FormatError as exc:
            raise FormatError(str(path), exc.problem) from None
        with os.fdopen(fd, "rb") as fh:
            raw, digest = read_hashed(fh)  # the bytes hashed are the bytes decoded
        if digest != entry.get("sha256"):
            raise FormatError(str(path), "SHA-256 differs from the manifest (score it again)")
        data = PackedDataset(folder, split=None)  # the shards it scores, as the writer read them
        segments = [
            read_shard(cast(Path, shard), data.dataset_id, ["example_ids", *extra])
            for shard, extra in zip(data.shard_paths, data.shard_extra, strict=True)  # local
        ]
        table = read_reference(path, raw, data.dataset_id, scored_example_ids(segments))
        ids = table["example_id"].to_numpy()
        order = np.argsort(ids, kind="stable")
        self.example_ids = ids[order]
        self.logps = table["logp"].to_numpy()[order]
        self.num_tokens = table["num_tokens"].to_numpy()[order]

    def __len__(self) -> int:
        return int(self.example_ids.size)

    def lookup(self, example_ids: torch.Tensor) -> torch.Tensor:
        """Return the reference sums (float64) of ``example_ids``; refuse one it lacks."""
        want = example_ids.cpu().numpy().astype(np.int64)
        at = np.searchsorted(self.example_ids, want).clip(max=max(len(self) - 1, 0))
        found = len(self) > 0 and bool((self.example_ids[at] == want).all())
        if not found:
            missing = want[self.example_ids[at] != want] if len(self) else want
            raise UsageError(
                f"example {int(missing[0])} has no reference log-probability (the sidecar was "
                "scored on another pack: score this one again)"
            )
        return torch.from_numpy(self.logps[at])

    def join(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Add ``reference_logps`` to a collated batch: float64, one per segment, NaN elsewhere.

        Segments with a branch or a KTO label must be in the sidecar; padding and plain
        segments get NaN.
        """
        owners = torch.as_tensor(batch["example_ids"]).to(torch.int64)
        scored = torch.zeros(owners.shape, dtype=torch.bool)
        for name, none in (("branch", 0), ("kto_label", -1)):
            if name in batch:
                scored |= torch.as_tensor(batch[name]).reshape(owners.shape) != none
        values = torch.full(owners.shape, float("nan"), dtype=torch.float64)
        values[scored] = self.lookup(owners[scored])
        return {**batch, "reference_logps": values}

    def for_pairs(self, pairs: PairLogps) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the ``(chosen, rejected)`` reference sums of a batch's pairs."""
        return self.lookup(pairs.chosen_example_ids), self.lookup(pairs.rejected_example_ids)
