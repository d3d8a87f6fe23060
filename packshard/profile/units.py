"""``profile`` on an engine: every work unit profiled by a worker, the arrays merged in order.

``profile --workers N`` (or ``--engine ray``) cuts the inputs into the same units as ``pack``
(:mod:`packshard.ingest.splits`).  A worker runs the ingest stream over its unit and returns
only the few integers per example the report needs (length, loss tokens, domain code,
reasoning tokens and the trained ones, whether it starts a record), its first rejects and its
reject counts; the driver makes lines absolute and domain codes global,
in unit order, and computes the report exactly as one process would
(:func:`~packshard.profile.report.profile_lengths`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from packshard.arrays import NameCodes
from packshard.engine import EngineOptions, open_engine
from packshard.errors import RecordError
from packshard.ingest.chunks import ingest
from packshard.ingest.sources import InputFile
from packshard.ingest.splits import Split, SplitRead, plan_splits, read_split
from packshard.ingest.templates import ChatTemplate, load_template
from packshard.ingest.tokenizer import TokenizerBundle, load_tokenizer
from packshard.profile.report import (
    MAX_LISTED_REJECTS,
    ProfileReport,
    describe_label_paths,
    profile_lengths,
    record_starts,
)
from packshard.records import IngestOptions, Reject, SourceRef


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
    names = NameCodes()
    lengths, losses, codes, thoughts, thought_losses, firsts = [], [], [], [], [], []
    listed: list[Reject] = []
    by_domain: Counter[str] = Counter()
    by_code: Counter[str] = Counter()
    paths: Counter[str] = Counter()
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
            lengths.append(np.diff(chunk.batch.offsets))
            losses.append(chunk.loss_tokens)
            codes.append(names.encode(chunk.batch.domains).astype(np.int64))
            none = np.zeros(len(chunk.batch), np.int64)
            thoughts.append(none if chunk.reasoning_tokens is None else chunk.reasoning_tokens)
            thought_losses.append(none if chunk.reasoning_loss is None else chunk.reasoning_loss)
            firsts.append(record_starts(chunk.batch))
            by_domain.update(r.domain for r in chunk.rejects)
            by_code.update(r.code for r in chunk.rejects)
            listed.extend(chunk.rejects[: MAX_LISTED_REJECTS - len(listed)])
            paths.update(chunk.label_paths)
    except RecordError as exc:  # --on-error fail: the driver raises the first, in order
        error = (exc.code, exc.reason, exc.source, exc.line)
    empty = np.zeros(0, np.int64)
    return {
        "lengths": np.concatenate([empty, *lengths]),
        "loss_tokens": np.concatenate([empty, *losses]).astype(np.int64),
        "codes": np.concatenate([empty, *codes]),
        "thoughts": np.concatenate([empty, *thoughts]).astype(np.int64),
        "thought_losses": np.concatenate([empty, *thought_losses]).astype(np.int64),
        "firsts": np.concatenate([np.zeros(0, bool), *firsts]),
        "domains": tuple(names.names),
        "listed": tuple(listed),
        "by_domain": dict(by_domain),
        "by_code": dict(by_code),
        "paths": dict(paths),
        "newlines": state.newlines,
        "stopped": state.stopped,
        "error": error,
    }


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
    (:func:`packshard.ingest.chunks.ingest_label_path`).
    """
    options.check()
    splits = plan_splits(files, split_bytes)
    tasks = [ProfileTask(tokenizer, template, options, s) for s in splits]
    with open_engine(engine) as running:
        results = running.run(profile_unit, tasks, [s.describe() for s in splits])
    names = NameCodes()
    line_base = [0] * len(files)
    stopped: set[int] = set()
    lengths, losses, codes, thoughts, thought_losses, firsts = [], [], [], [], [], []
    listed: list[Reject] = []
    rejected: Counter[str] = Counter()
    by_code: Counter[str] = Counter()
    paths: Counter[str] = Counter()
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
        glob = names.encode(r["domains"]).astype(np.int64)
        lengths.append(r["lengths"])
        losses.append(r["loss_tokens"])
        codes.append(glob[r["codes"]] if len(glob) else r["codes"])
        thoughts.append(r["thoughts"])
        thought_losses.append(r["thought_losses"])
        firsts.append(r["firsts"])
        for x in r["listed"][: MAX_LISTED_REJECTS - len(listed)]:
            listed.append(
                Reject(SourceRef(x.ref.source, x.ref.line + base), x.domain, x.code, x.reason)
            )
        rejected.update(r["by_domain"])
        by_code.update(r["by_code"])
        paths.update(r["paths"])
    empty = np.zeros(0, np.int64)
    report = profile_lengths(
        np.concatenate([empty, *lengths]),
        np.concatenate([empty, *losses]),
        np.concatenate([empty, *codes]),
        names.names,
        dict(rejected),
        max_seq_len,
        batch_size,
        seed,
        describe_label_paths(paths, label_path),
        (np.concatenate([empty, *thoughts]), np.concatenate([empty, *thought_losses])),
        np.concatenate([np.zeros(0, bool), *firsts]),
    )
    return replace(report, rejects=tuple(listed), reject_codes=tuple(sorted(by_code.items())))
