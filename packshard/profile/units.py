"""``profile`` on an engine: every work unit profiled by a worker, the arrays merged in order.

``profile --workers N`` (or ``--engine ray``) cuts the inputs into the same units as ``pack``
(:mod:`packshard.ingest.read.splits`).  A worker runs the ingest stream over its unit and returns
only the few integers per example the report needs (length, loss tokens, domain code,
reasoning tokens and the trained ones, whether it starts a record), its first rejects and its
reject counts; the driver makes lines absolute and domain codes global, in unit order, and
computes the report exactly as one process would.  Both sides gather with
:class:`~packshard.profile.gather.ProfileParts`, the one-process path's gatherer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from packshard.engine import EngineOptions, open_engine
from packshard.errors import RecordError
from packshard.ingest.read.sources import InputFile
from packshard.ingest.read.splits import Split, SplitRead, plan_splits, read_split
from packshard.ingest.stream import ingest
from packshard.ingest.template.render import ChatTemplate, load_template
from packshard.ingest.tokens.tokenizer import TokenizerBundle, load_tokenizer
from packshard.ingest.types import IngestOptions
from packshard.profile.gather import ProfileParts
from packshard.profile.report import ProfileReport


@dataclass(frozen=True, slots=True)
class ProfileTask:
    """One unit to profile, with what loads the tokenizer and template in the worker."""

    tokenizer: str
    template: str | None
    options: IngestOptions
    split: Split


@lru_cache(maxsize=4)
def _loaded(tokenizer: str, template: str | None) -> tuple[TokenizerBundle, ChatTemplate | None]:
    bundle = load_tokenizer(tokenizer)
    return bundle, load_template(template, bundle)


def profile_unit(task: ProfileTask) -> dict[str, Any]:
    """Profile one unit: per-example arrays, first rejects, counts (runs in a worker)."""
    bundle, template = _loaded(task.tokenizer, task.template)
    state = SplitRead()
    parts = ProfileParts()
    error = None
    try:
        chunks = ingest(
            [task.split],
            bundle,
            template,
            task.options,
            read=lambda s, options: read_split(s, state, options),
        )
        for chunk in chunks:
            parts.add_chunk(chunk)
    except RecordError as exc:  # --on-error fail: the driver raises the first, in order
        error = (exc.code, exc.reason, exc.source, exc.line)
    return {**parts.to_unit(), "newlines": state.newlines, "stopped": state.stopped, "error": error}


def profile_on_engine(
    files: Sequence[InputFile],
    tokenizer: str,
    template: str | None,
    options: IngestOptions,
    max_seq_len: int,
    batch_size: int,
    seed: int,
    engine: EngineOptions,
    split_bytes: int = 0,
    label_path: str = "offsets",
) -> ProfileReport:
    """Profile ``files`` unit by unit on ``engine``; the same report one process gives.

    ``label_path`` is the default the report names when no example says otherwise
    (:func:`packshard.ingest.stream.ingest_label_path`).
    """
    options.check()
    splits = plan_splits(files, split_bytes)
    tasks = [ProfileTask(tokenizer, template, options, s) for s in splits]
    with open_engine(engine) as running:
        results = running.run(profile_unit, tasks, [s.describe() for s in splits])
    parts = ProfileParts()
    line_base = [0] * len(files)
    stopped: set[int] = set()
    for split, r in zip(splits, results, strict=True):
        if split.index in stopped:
            continue
        if r["stopped"]:
            stopped.add(split.index)
        base = line_base[split.index] if split.kind == "bytes" else 0
        line_base[split.index] += r["newlines"]
        if r["error"] is not None:
            code, reason, source, line = r["error"]
            raise RecordError(code, reason, source, line + base)
        parts.add_unit(r, base)
    return parts.report(max_seq_len, batch_size, seed, label_path)
