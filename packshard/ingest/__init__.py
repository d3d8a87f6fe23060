"""Read → normalize → render → label → tokenize: the ingest stage, behind one face.

Every command that needs tokens goes through the names below, and only them (a layout test
holds it): outside ``ingest/`` a module imports ``packshard.ingest`` and
``packshard.ingest.types``, never a module inside.  A command opens the stage once and runs
its units as engine tasks::

    stage = open_stage(tokenizer, template, options)   load + every check, once (driver)
    tasks = [UnitTask(stage.spec, unit, sink) for unit in plan_units(files)]
    worker: run_unit(task, cores) ─► UnitResult(unit, read, value)   the sink keeps its part
    driver: for result, base in in_order(results, len(files)): …     lines absolute, first
                                                                      error raised in order
    manifest: stage.entries(encoded)                    tokenizer, template, backends

Inside, one folder per step: ``read/`` (input specs → raw records), ``normalize`` (every
record format → one conversation), ``template/`` (the sandboxed render), ``label/`` (which
characters are trained), ``tokens/`` (ids and labels), ``media/`` (images), ``stream``
(a chunk of records at a time, tokenized on a second thread), ``stage/`` (the stage opened
once and its work units).

The names are loaded on first use (:pep:`562`), so that importing the face costs nothing:
``pack`` starts its fork server after importing only the input listing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, for the type checker: `as` marks each exported
    from packshard.ingest.label.chat import Frame as Frame
    from packshard.ingest.label.frame import template_frame as template_frame
    from packshard.ingest.label.reasoning import find_block as find_block
    from packshard.ingest.media.grid import image_grid as image_grid
    from packshard.ingest.normalize import normalize_record as normalize_record
    from packshard.ingest.progress import IngestProgress as IngestProgress
    from packshard.ingest.progress import open_progress as open_progress
    from packshard.ingest.progress import progress_mode as progress_mode
    from packshard.ingest.read.inputs import InputFile as InputFile
    from packshard.ingest.read.inputs import expand_inputs as expand_inputs
    from packshard.ingest.read.sources import read_records as read_records
    from packshard.ingest.read.units import WorkUnit as WorkUnit
    from packshard.ingest.read.units import count_newlines as count_newlines
    from packshard.ingest.read.units import file_bytes as file_bytes
    from packshard.ingest.read.units import input_bytes as input_bytes
    from packshard.ingest.read.units import plan_ranges as plan_ranges
    from packshard.ingest.read.units import plan_units as plan_units
    from packshard.ingest.stage.loaded import load_early as load_early
    from packshard.ingest.stage.open import Stage as Stage
    from packshard.ingest.stage.open import StageEntries as StageEntries
    from packshard.ingest.stage.open import open_stage as open_stage
    from packshard.ingest.stage.open import sharing_stage as sharing_stage
    from packshard.ingest.stage.task import UnitError as UnitError
    from packshard.ingest.stage.task import UnitRead as UnitRead
    from packshard.ingest.stage.task import UnitResult as UnitResult
    from packshard.ingest.stage.task import UnitSink as UnitSink
    from packshard.ingest.stage.task import UnitTask as UnitTask
    from packshard.ingest.stage.task import UnitWriter as UnitWriter
    from packshard.ingest.stage.task import in_order as in_order
    from packshard.ingest.stage.unit import run_unit as run_unit
    from packshard.ingest.stage.unit import warm_stage as warm_stage
    from packshard.ingest.template.sandbox import ChatTemplate as ChatTemplate
    from packshard.ingest.template.sandbox import template_conventions as template_conventions
    from packshard.ingest.tokens.backends import backend_note as backend_note
    from packshard.ingest.tokens.backends import merged_entry as merged_entry
    from packshard.ingest.tokens.tokenizer import TokenizerBundle as TokenizerBundle
    from packshard.ingest.tokens.tokenizer import load_tokenizer as load_tokenizer
    from packshard.ingest.tokens.tokenizer import tokenizer_json_path as tokenizer_json_path
    from packshard.ingest.types import pair_starts as pair_starts

FACE = {
    "packshard.ingest.stage.open": (
        "Stage",
        "StageEntries",
        "open_stage",
        "sharing_stage",
    ),
    "packshard.ingest.stage.task": (
        "UnitError",
        "UnitRead",
        "UnitResult",
        "UnitSink",
        "UnitTask",
        "UnitWriter",
        "in_order",
    ),
    "packshard.ingest.stage.unit": ("run_unit", "warm_stage"),
    "packshard.ingest.stage.loaded": ("load_early",),
    "packshard.ingest.read.inputs": ("InputFile", "expand_inputs"),
    "packshard.ingest.read.sources": ("read_records",),
    "packshard.ingest.read.units": (
        "WorkUnit",
        "count_newlines",
        "file_bytes",
        "input_bytes",
        "plan_ranges",
        "plan_units",
    ),
    "packshard.ingest.progress": ("IngestProgress", "open_progress", "progress_mode"),
    "packshard.ingest.normalize": ("normalize_record",),
    "packshard.ingest.types": ("pair_starts",),
    "packshard.ingest.media.grid": ("image_grid",),
    "packshard.ingest.label.chat": ("Frame",),
    "packshard.ingest.label.frame": ("template_frame",),
    "packshard.ingest.label.reasoning": ("find_block",),
    "packshard.ingest.template.sandbox": ("ChatTemplate", "template_conventions"),
    "packshard.ingest.tokens.backends": ("backend_note", "merged_entry"),
    "packshard.ingest.tokens.tokenizer": (
        "TokenizerBundle",
        "load_tokenizer",
        "tokenizer_json_path",
    ),
}
"""Each module behind the face and the names it exports (what ``TYPE_CHECKING`` imports)."""

_WHERE = {name: module for module, names in FACE.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Import the module of ``name`` on first use and return the name (:pep:`562`)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'packshard.ingest' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
