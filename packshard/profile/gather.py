"""What a profile keeps of the ingest stream, gathered by each unit's task and by the driver.

A profile keeps a few integers per example, never the tokens (length, loss tokens, domain
code, reasoning tokens and the trained ones, whether it starts a record), rejects per domain
and code, the first :data:`MAX_LISTED_REJECTS` rejects and the label paths' counts.

:class:`ProfileParts` gathers it from ingest chunks (:meth:`~ProfileParts.add_chunk`, a task)
and from units' results (:meth:`~ProfileParts.add_unit`, the driver), then computes the report
once (:func:`~packshard.profile.report.profile_lengths`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from operator import ne

import numpy as np

from packshard.arrays import NameCodes
from packshard.ingest.types import IngestChunk, TokenizedBatch
from packshard.pack.plan.mix import MixTarget, predict_mixture
from packshard.profile.pairs import pair_profile
from packshard.profile.report import MAX_LISTED_REJECTS, ProfileReport, profile_lengths
from packshard.profile.vision import vision_profile
from packshard.records import IGNORE_INDEX, Reject, SourceRef

COLUMNS = (
    *("lengths", "loss_tokens", "codes", "thoughts", "thought_losses", "firsts"),
    *("pair_codes", "prompts"),
    *("images", "vision_tokens"),
)
"""The per-example arrays, in :func:`profile_lengths`' terms: tokens, loss tokens, domain
code, reasoning tokens, trained reasoning tokens, first example of its record (bool); then
for preference pairs (:func:`~packshard.profile.pairs.pair_profile`) the pair code and the
tokens before the first trained one (zeros in a batch without pairs); then each example's
images and vision tokens (:func:`~packshard.profile.vision.vision_profile`; zeros without
images)."""


@dataclass(frozen=True, slots=True)
class ProfileUnit:
    """What a task sends back for its unit: small, plain values (:meth:`ProfileParts.add_unit`).

    ``columns`` are the unit's per-example arrays (:data:`COLUMNS`), its domain codes local
    to ``domains``; ``listed`` its first rejects, lines relative to the unit's range.
    """

    columns: dict[str, np.ndarray]
    domains: tuple[str, ...]
    listed: tuple[Reject, ...]
    by_domain: dict[str, int]
    by_code: dict[str, int]
    paths: dict[str, int]
    sizes: np.ndarray

    @property
    def tokens(self) -> int:
        """Tokens of the unit's examples."""
        return int(self.columns["lengths"].sum())


@dataclass
class ProfileParts:
    """The per-example arrays and reject counts of a profile, gathered part by part."""

    names: NameCodes = field(default_factory=NameCodes)
    parts: dict[str, list[np.ndarray]] = field(default_factory=lambda: {c: [] for c in COLUMNS})
    rejected: Counter[str] = field(default_factory=Counter)  # rejected records per domain
    by_code: Counter[str] = field(default_factory=Counter)
    listed: list[Reject] = field(default_factory=list)
    paths: Counter[str] = field(default_factory=Counter)  # examples per label path
    sizes: list[np.ndarray] = field(default_factory=list)  # per image: width, height, bytes

    def add_chunk(self, chunk: IngestChunk) -> None:
        """Add one ingest chunk's examples and rejects."""
        batch = chunk.batch
        none = np.zeros(len(batch), dtype=np.int64)
        self.parts["lengths"].append(np.diff(np.asarray(batch.offsets, dtype=np.int64)))
        self.parts["loss_tokens"].append(chunk.loss_tokens)
        self.parts["codes"].append(self.names.encode(batch.domains).astype(np.int64))
        thoughts, trained = chunk.reasoning_tokens, chunk.reasoning_loss
        self.parts["thoughts"].append(none if thoughts is None else thoughts)
        self.parts["thought_losses"].append(none if trained is None else trained)
        self.parts["firsts"].append(record_starts(batch))
        pairs = batch.pairs
        self.parts["pair_codes"].append(none if pairs is None else pairs.astype(np.int64))
        self.parts["prompts"].append(none if pairs is None else prompt_tokens(batch))
        images, vision = batch.images, batch.vision_tokens
        self.parts["images"].append(none if images is None else images.astype(np.int64))
        self.parts["vision_tokens"].append(none if vision is None else vision.astype(np.int64))
        if batch.image_sizes is not None:
            self.sizes.append(batch.image_sizes)
        self.rejected.update(r.domain for r in chunk.rejects)
        self.by_code.update(r.code for r in chunk.rejects)
        self.listed.extend(chunk.rejects[: MAX_LISTED_REJECTS - len(self.listed)])
        self.paths.update(chunk.label_paths)

    def add_unit(self, unit: ProfileUnit, line_base: int) -> None:
        """Add what :meth:`to_unit` returned for a unit whose lines start after ``line_base``."""
        glob = self.names.encode(unit.domains).astype(np.int64)
        for name in COLUMNS:
            values = unit.columns[name]
            self.parts[name].append(glob[values] if name == "codes" and len(glob) else values)
        for x in unit.listed[: MAX_LISTED_REJECTS - len(self.listed)]:
            where = SourceRef(x.ref.source, x.ref.line + line_base)
            self.listed.append(Reject(where, x.domain, x.code, x.reason))
        self.rejected.update(unit.by_domain)
        self.by_code.update(unit.by_code)
        self.paths.update(unit.paths)
        self.sizes.append(unit.sizes)

    def columns(self) -> dict[str, np.ndarray]:
        """Every per-example array, concatenated (empty ones with their dtype)."""
        out = {}
        for name in COLUMNS:
            empty = np.zeros(0, dtype=bool if name == "firsts" else np.int64)
            out[name] = np.concatenate([empty, *self.parts[name]]).astype(empty.dtype)
        return out

    def to_unit(self) -> ProfileUnit:
        """Return what a worker sends back for its unit (:meth:`add_unit`)."""
        return ProfileUnit(
            columns=self.columns(),
            domains=tuple(self.names.names),
            listed=tuple(self.listed),
            by_domain=dict(self.rejected),
            by_code=dict(self.by_code),
            paths=dict(self.paths),
            sizes=self.image_sizes(),
        )

    def image_sizes(self) -> np.ndarray:
        """Every image's width, height and bytes, in example order (int64 ``[images, 3]``)."""
        return np.concatenate([np.zeros((0, 3), np.int64), *self.sizes]).astype(np.int64)

    def report(
        self,
        max_seq_len: int,
        batch_size: int,
        seed: int,
        label_path: str,
        mix: MixTarget | None = None,
        overlong: str = "drop",
    ) -> ProfileReport:
        """Compute the report; ``label_path`` is named when no example said otherwise.

        With ``mix`` the report predicts the mixture ``pack --mix`` would make.
        """
        c = self.columns()
        names = self.names.names
        mixture = predict_mixture(c, names, max_seq_len, mix, seed) if mix is not None else {}
        report = profile_lengths(
            c["lengths"],
            c["loss_tokens"],
            c["codes"],
            names,
            dict(self.rejected),
            max_seq_len,
            batch_size,
            seed,
            describe_label_paths(self.paths, label_path),
            (c["thoughts"], c["thought_losses"]),
            c["firsts"],
            overlong,
        )
        codes = tuple(sorted(self.by_code.items()))
        pairs = pair_profile(
            c["lengths"], c["prompts"], c["pair_codes"], max_seq_len, batch_size, seed
        )
        vision = vision_profile(
            c["lengths"],
            c["images"],
            c["vision_tokens"],
            self.image_sizes(),
            max_seq_len,
            batch_size,
            seed,
        )
        listed = tuple(self.listed)
        return replace(
            report, rejects=listed, reject_codes=codes, mixture=mixture, pairs=pairs, vision=vision
        )


def describe_label_paths(counts: Mapping[str, int], default: str) -> str:
    """Return ``"offsets"`` for one label path, ``"offsets 950, none 50"`` for several."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if len(ranked) <= 1:
        return ranked[0][0] if ranked else default
    return ", ".join(f"{name} {count:,}" for name, count in ranked)


def prompt_tokens(batch: TokenizedBatch) -> np.ndarray:
    """Return each example's tokens before its first trained one (all of them: none trained)."""
    lengths = np.diff(np.asarray(batch.offsets, dtype=np.int64))
    trained = np.flatnonzero(batch.labels != IGNORE_INDEX)
    first = np.searchsorted(trained, batch.offsets[:-1], side="left")
    at = trained[np.minimum(first, max(len(trained) - 1, 0))] if len(trained) else first
    inside = (first < len(trained)) & (at < batch.offsets[1:])
    return np.where(inside, at - batch.offsets[:-1], lengths).astype(np.int64)


def record_starts(batch: TokenizedBatch) -> np.ndarray:
    """Mark the first example of each record in ``batch`` (expanded ones share a ref)."""
    first = np.ones(len(batch), dtype=bool)
    if (batch.turns is not None or batch.pairs is not None) and len(batch) > 1:
        refs = batch.refs
        first[1:] = np.fromiter(map(ne, refs[1:], refs[:-1]), dtype=bool, count=len(refs) - 1)
    return first


def profile_chunks(
    chunks: Iterable[IngestChunk],
    max_seq_len: int,
    batch_size: int = 8,
    seed: int = 0,
    label_path: str = "offsets",
) -> ProfileReport:
    """Profile an ingest stream, keeping per-example integers only (see the module docstring).

    The chunks' ``label_paths`` counts replace ``label_path`` when present.
    """
    parts = ProfileParts()
    for chunk in chunks:
        parts.add_chunk(chunk)
    return parts.report(max_seq_len, batch_size, seed, label_path)
