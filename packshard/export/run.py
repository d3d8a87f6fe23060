"""``packshard export``: convert an output folder to another project's format, atomically.

Targets (:data:`packshard.options.EXPORT_TARGETS`), each a module of this package:

    megatron    Megatron-Bridge packed Parquet (``training_{N}.idx.parquet``), read by releases
                0.4.0 onward (``megatron.bridge.data.packing.parquet`` from 0.6.0)
    megatron-npy      the same rows as the ``.npy`` of releases up to 0.3.1 (deprecated in 0.6)
    megatron-parquet  the earlier name of ``megatron``, kept so that scripts keep working
    torchtune   torchtune packed samples (tokens, labels, input_pos, seq_lens) and their loader
    mds         MosaicML streaming MDS, one sample per packed row
    unpacked    one row per example (input_ids, attention_mask, labels): Axolotl, LitGPT

The input is read and checked as ``verify`` reads it (:mod:`packshard.export.common`); any
problem is one line.  The destination gets ``pack``'s
output-folder guard (:mod:`packshard.format.folder.outdir`), and ``export.json`` (source
dataset, target, counts, every file's SHA-256) is written last.

A pack with preference pairs or KTO records goes only to the targets that carry ``branch`` and
``kto_label`` (``unpacked``, ``mds``); the packed SFT layouts refuse it in one line
(:func:`packshard.export.common.preference_refusal`) rather than train every branch as SFT.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packshard import __version__
from packshard.errors import ManifestError, UsageError
from packshard.export.common import load_source, preference_refusal, write_export_info
from packshard.export.mds import write_mds
from packshard.export.megatron import write_megatron
from packshard.export.megatron_npy import write_megatron_npy
from packshard.export.torchtune import write_torchtune
from packshard.export.unpacked import write_unpacked
from packshard.format.folder.claim import claim_out
from packshard.options import EXPORT_TARGETS, check_choice
from packshard.store import fetched_out, is_url


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: its folder and the contents of its ``export.json``."""

    dest: Path
    info: dict[str, Any]


def export_dataset(
    out: str | os.PathLike[str],
    target: str,
    dest: str | os.PathLike[str],
    overwrite: bool = False,
    notify: Callable[[str], None] | None = None,
    shown: str | None = None,
) -> ExportResult:
    """Export the packed folder ``out`` as ``target`` into the folder ``dest``.

    ``out`` may be a store URL (fetched whole first; ``dest`` is a local folder).  ``notify``
    hears what was cleaned up beside ``dest`` (leftovers of interrupted runs); ``shown`` is
    the source recorded in ``export.json`` when ``out`` is a local copy of it.
    """
    check_choice("--to", target, EXPORT_TARGETS)
    if is_url(dest):
        raise UsageError(
            f"{dest}: export writes a local folder (copy it to the store afterwards); "
            "its input OUT may be on a store"
        )
    if is_url(out):  # every row is read: the pack is fetched whole, manifest first
        with fetched_out(os.fspath(out)) as local:
            return export_dataset(local, target, dest, overwrite, notify, shown=os.fspath(out))
    source, folder = Path(out), Path(dest)
    if not source.is_dir():
        raise ManifestError(f"{source}: not a folder (give the OUT folder that pack wrote)")
    manifest = load_source(source)
    refusal = preference_refusal(manifest, target)
    if refusal is not None:
        raise UsageError(f"{source}: {refusal}")
    multiple = int((manifest["config"].get("alignment") or {}).get("multiple", 1))
    if multiple > 1 and target not in ("megatron", "megatron-parquet"):
        raise UsageError(
            f"{source}: an aligned pack (segments padded to {multiple}) exports only as "
            "--to megatron, the form Megatron-Bridge's context-parallel path reads "
            "(repack with --pad-multiple 1 --cp 1 for the others)"
        )
    max_seq_len = manifest["config"]["max_seq_len"]
    pad = manifest.get("tokenizer", {}).get("pad_token_id")
    with claim_out(os.fspath(dest), overwrite, [os.fspath(out)], [], notify, "export") as claim:
        tmp = claim.tmp
        eos = manifest.get("tokenizer", {}).get("eos_token_id")
        if target in ("megatron", "megatron-parquet"):
            written = write_megatron(source, tmp, max_seq_len, eos, multiple)
        elif target == "megatron-npy":
            written = write_megatron_npy(source, tmp, max_seq_len, eos)
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
                "source": {"path": shown or str(source), "dataset_id": manifest.get("dataset_id")},
                "max_seq_len": max_seq_len,
                "written": written,
            },
        )
        claim.publish()
    return ExportResult(folder, info)
