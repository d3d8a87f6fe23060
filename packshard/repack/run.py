"""``repack_dataset``: a parent pack re-planned into a new folder, through ``pack``'s own stages."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from packshard.digests import sha256_path
from packshard.engine.base import SerialEngine
from packshard.errors import UsageError
from packshard.format.examples import has_media
from packshard.format.folder.claim import claim_out
from packshard.format.folder.outdir import work_folder
from packshard.format.manifest import MANIFEST_NAME, load_manifest
from packshard.format.rejects import REJECTS_NAME, RejectsWriter
from packshard.pack.config import check_config
from packshard.pack.finish import PackResult, Provenance, pack_spill
from packshard.repack.config import RepackConfig, parent_problem
from packshard.repack.respill import respill


def repack_dataset(config: RepackConfig, notify: Callable[[str], None] | None = None) -> PackResult:
    """Re-plan the pack ``config.parent`` under the changed options into ``config.out``.

    No tokenizer, template or input file is read: the parent's shards and index are the
    examples.  The result is the folder a fresh ``pack`` with the same options writes (shards
    and index byte for byte, the same dataset id), its manifest naming the parent; a parent
    whose examples cannot be re-made is refused in one line.
    """
    started = time.perf_counter()
    # glibc's mmap threshold is left to rise (pack's driver fixes it: packshard.engine.heap):
    # repack's temporaries are row groups, of the parent and of the new shards, which the heap
    # then reuses; fixed, they cost 0.7M page faults and 2 system CPU-seconds more on 1M
    # examples (23.0M tokens, scripts/bench_repack.py), for 70 MiB less peak RSS
    parent = Path(config.parent)
    if not parent.is_dir():
        raise UsageError(f"{parent}: not a folder (give the OUT folder that pack wrote)")
    manifest = load_manifest(parent)
    problem = parent_problem(manifest)
    if problem is None and has_media(parent):  # the spill carries no image references
        problem = "it holds images, which repack does not carry yet (pack the inputs again)"
    if problem is not None:
        raise UsageError(f"{parent}: cannot repack: {problem}")
    pack_config = config.pack_config(manifest)
    warnings = check_config(pack_config)
    with claim_out(pack_config.out, config.overwrite, [str(parent)], [], notify, "repack") as claim:
        # its own folder among pack's work units: an interrupted pack's units stay for --resume
        units = work_folder(claim.out)
        work = units / "repack"
        shutil.rmtree(work, ignore_errors=True)
        try:
            work.mkdir(parents=True)
            done = respill(parent, manifest, pack_config, work)
            with RejectsWriter(claim.tmp / REJECTS_NAME) as rejects:
                rejects.write(done.rejects)
                made = replace(
                    _provenance(parent, manifest), examples_by_policy=done.examples_by_policy
                )
                train_files = len(manifest["inputs"])  # --eval inputs are refused
                written = pack_spill(
                    claim.tmp,
                    pack_config,
                    done.spill,
                    rejects,
                    made,
                    train_files,
                    SerialEngine(),
                    work,
                    claim.note,
                    done.lay_out,
                )
        finally:
            shutil.rmtree(work, ignore_errors=True)
            if units.is_dir() and not any(units.iterdir()):
                units.rmdir()
        claim.publish()
    warnings += claim.notes
    return PackResult(claim.out, written, time.perf_counter() - started, tuple(warnings))


def _provenance(parent: Path, manifest: dict[str, Any]) -> Provenance:
    """Return the parent's inputs, tokenizer, template and environment: its tokens' makers."""
    return Provenance(
        inputs=[{k: v for k, v in entry.items() if k != "records"} for entry in manifest["inputs"]],
        tokenizer=manifest["tokenizer"],
        template=manifest["template"],
        environment=manifest["environment"],
        engine={"name": "local", "workers": 1},
        reasoning_dropped=manifest["stats"].get("reasoning_dropped", 0),
        parent={
            "path": str(parent),
            "dataset_id": manifest["dataset_id"],
            "manifest_sha256": sha256_path(parent / MANIFEST_NAME),
        },
    )
