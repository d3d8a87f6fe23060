"""``packshard export``: convert an output folder to another project's format, atomically.

Targets (:data:`packshard.records.EXPORT_TARGETS`), each a module of this package:

    megatron    Megatron-Bridge 0.3.1 (released) packed .npy: one dict per row, and its metadata
    megatron-parquet  the same rows as Parquet, for Megatron-Bridge's main branch
    torchtune   torchtune packed samples (tokens, labels, input_pos, seq_lens) and their loader
    mds         MosaicML streaming MDS, one sample per packed row
    unpacked    one row per example (input_ids, attention_mask, labels): Axolotl, LitGPT

Every shard is checked while it is read (:mod:`packshard.export.common`), the export is written
into a hidden folder renamed into place when complete, and ``export.json`` (source dataset,
target, counts, every file's SHA-256) is written last.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packshard import __version__
from packshard.export.common import staged_folder, write_export_info
from packshard.export.mds import write_mds
from packshard.export.megatron import write_megatron
from packshard.export.megatron_npy import write_megatron_npy
from packshard.export.torchtune import write_torchtune
from packshard.export.unpacked import write_unpacked
from packshard.format.manifest import load_manifest
from packshard.vocab import EXPORT_TARGETS, check_choice


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: its folder and the contents of its ``export.json``."""

    dest: Path
    info: dict[str, Any]


def export_dataset(
    out: str | os.PathLike[str], target: str, dest: str | os.PathLike[str], overwrite: bool = False
) -> ExportResult:
    """Export the packed folder ``out`` as ``target`` into the folder ``dest``."""
    check_choice("--to", target, EXPORT_TARGETS)
    source, folder = Path(out), Path(dest)
    manifest = load_manifest(source, validate=False)
    max_seq_len = int(manifest["config"]["max_seq_len"])
    pad = manifest.get("tokenizer", {}).get("pad_token_id")
    with staged_folder(folder, overwrite) as tmp:
        if target == "megatron":
            eos = manifest.get("tokenizer", {}).get("eos_token_id")
            written = write_megatron_npy(source, tmp, max_seq_len, eos)
        elif target == "megatron-parquet":
            written = write_megatron(source, tmp, max_seq_len)
        elif target == "torchtune":
            written = write_torchtune(source, tmp, max_seq_len, 0 if pad is None else int(pad))
        elif target == "mds":
            written = write_mds(source, tmp)
        else:
            written = write_unpacked(source, tmp)
        info = write_export_info(
            tmp,
            {
                "target": target,
                "packshard_version": __version__,
                "source": {"path": str(source), "dataset_id": manifest.get("dataset_id")},
                "max_seq_len": max_seq_len,
                "written": written,
            },
        )
    return ExportResult(folder, info)
