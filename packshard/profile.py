"""Length statistics and the cost of padding, bucketing and packing, before anything is packed.

``profile_lengths`` works on three per-example arrays (token count, loss-token count, domain
code); ``profile_inputs`` builds them from the ingest stream, keeping only those arrays and
never the tokens.  The report has one :class:`DomainProfile` for the whole input and one per
domain (a domain whose records were all rejected still gets a row).

Conventions (the report states them too):

* Percentiles are nearest-rank: P<p> is the smallest length such that at least p% of the
  examples are that long or shorter, i.e. ``sorted[ceil(p·n/100) − 1]`` (numpy's
  ``method="inverted_cdf"``).  Every percentile is an observed length.
* Loss tokens are labels ``!= IGNORE_INDEX`` excluding each example's first token (its label
  is masked at every seam once packed); prompt tokens = tokens − loss tokens.
* Every strategy sees lengths clipped to ``max_seq_len``: an overlong example counts as
  truncated.  Useful tokens are therefore the same ``U = Σ min(len, L)`` for all four
  strategies; only the computed tokens differ.  Useful fraction = U / computed.

Worked example, lengths ``[5, 2, 1]``, ``L = 8``, ``batch_size = 3`` (U = 8)::

    pad_to_max      5 2 1 → 3 rows × 8           = 24 computed   8/24 = 33%
    random_batches  one batch, longest 5 → 3 × 5  = 15 computed   8/15 = 53%
    bucketed        sorted [1 2 5], same batch    = 15 computed   8/15 = 53%
    packed (bfd)    |55555221| one row × 8        =  8 computed   8/8 = 100%

Batches hold ``batch_size`` consecutive examples; the last one may be smaller and is not
filled with padding examples.  Random batches follow
``numpy.random.default_rng(seed).permutation(n)``; bucketed batches follow ``np.sort``
(ascending; with full batches this grouping computes the fewest tokens, a short last batch
of the longest examples can make it lose to a lucky shuffle on tiny inputs).  Packing is
``plan_packs(clipped, L, "bfd")``; its lower bound is ⌈U / L⌉ rows.
Per-domain utilization treats each domain as if it were profiled alone, so per-domain rows do
not add up to the total's rows; records, rejects and token counts do add up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from packshard.errors import UsageError
from packshard.records import IGNORE_INDEX, Reject

if TYPE_CHECKING:
    from packshard.ingest.chunks import IngestChunk, IngestOptions
    from packshard.ingest.sources import InputFile
    from packshard.ingest.templates import ChatTemplate
    from packshard.ingest.tokenizer import TokenizerBundle

PERCENTILES = (50, 90, 95, 99)
PERCENTILE_METHOD = "nearest-rank (numpy inverted_cdf)"
MAX_LISTED_REJECTS = 10
STRATEGIES = ("pad_to_max", "random_batches", "bucketed", "packed")
HISTOGRAM_BINS_PER_OCTAVE = 4
"""Histogram edges are ``floor(2**(k/4))`` (deduplicated): about 4 bins per doubling."""


@dataclass(frozen=True, slots=True)
class LengthStats:
    """Nearest-rank percentiles, maximum and mean of example lengths in tokens."""

    p50: int
    p90: int
    p95: int
    p99: int
    max: int
    mean: float


@dataclass(frozen=True, slots=True)
class Utilization:
    """Tokens carrying data (``useful``) versus tokens a model computes under one strategy."""

    strategy: str
    rows: int
    computed_tokens: int
    useful_tokens: int

    @property
    def fraction(self) -> float:
        """Useful tokens / computed tokens (1.0 when nothing is computed)."""
        return self.useful_tokens / self.computed_tokens if self.computed_tokens else 1.0


@dataclass(frozen=True, slots=True)
class DomainProfile:
    """Counts, lengths and utilization of one domain, or of everything (name ``"total"``).

    ``histogram`` counts examples per bin of the report's ``histogram_edges``.  ``lengths`` is
    ``None`` and ``utilization`` empty when the domain has no accepted example.
    """

    name: str
    records: int
    examples: int
    rejected: int
    tokens: int
    loss_tokens: int
    over_max: int
    lengths: LengthStats | None
    utilization: tuple[Utilization, ...]
    lower_bound_rows: int
    histogram: tuple[int, ...]

    @property
    def prompt_tokens(self) -> int:
        """Tokens without loss (tokens − loss tokens)."""
        return self.tokens - self.loss_tokens

    @property
    def loss_share(self) -> float:
        """Share of tokens that carry loss."""
        return self.loss_tokens / self.tokens if self.tokens else 0.0

    @property
    def over_max_share(self) -> float:
        """Share of examples longer than ``max_seq_len``."""
        return self.over_max / self.examples if self.examples else 0.0

    def strategy(self, name: str) -> Utilization:
        """Return the utilization of strategy ``name`` (one of :data:`STRATEGIES`)."""
        return next(u for u in self.utilization if u.strategy == name)


@dataclass(frozen=True, slots=True)
class ProfileReport:
    """The whole profile: settings, the total, one profile per domain (sorted by name)."""

    max_seq_len: int
    batch_size: int
    seed: int
    label_path: str
    total: DomainProfile
    domains: tuple[DomainProfile, ...]
    histogram_edges: tuple[int, ...]
    verdict: str
    percentile_method: str = PERCENTILE_METHOD
    rejects: tuple[Reject, ...] = ()  # the first MAX_LISTED_REJECTS, with file:line
    reject_codes: tuple[tuple[str, int], ...] = ()  # every reject, counted per code


def compute_histogram_edges(longest: int, max_seq_len: int) -> np.ndarray:
    """Return integer bin edges ``[1, 2, 3, 4, 5, 6, 8, 9, 11, 13, 16, …]`` past ``longest``.

    ``max_seq_len + 1`` is always an edge, so no bin mixes fitting and overlong examples.
    """
    top = int(np.ceil(HISTOGRAM_BINS_PER_OCTAVE * np.log2(max(longest, 1) + 1))) + 1
    edges = np.floor(2.0 ** (np.arange(top + 1) / HISTOGRAM_BINS_PER_OCTAVE))
    return np.unique(np.append(edges, max_seq_len + 1)).astype(np.int64)


def measure_lengths(sorted_lengths: np.ndarray) -> LengthStats:
    """Return nearest-rank percentiles of an ascending, non-empty length array."""
    n = sorted_lengths.shape[0]
    ranks = [max((p * n + 99) // 100, 1) - 1 for p in PERCENTILES]  # ceil(p·n/100) − 1, exact
    p50, p90, p95, p99 = (int(v) for v in sorted_lengths[ranks])
    return LengthStats(p50, p90, p95, p99, int(sorted_lengths[-1]), float(sorted_lengths.mean()))


def measure_batches(ordered: np.ndarray, batch_size: int) -> int:
    """Return tokens computed when ``ordered`` is cut into batches padded to their longest."""
    n = ordered.shape[0]
    full = n // batch_size * batch_size
    computed = int(ordered[:full].reshape(-1, batch_size).max(axis=1).sum()) * batch_size
    if full < n:
        computed += int(ordered[full:].max()) * (n - full)
    return computed


def measure_utilization(
    lengths: np.ndarray, max_seq_len: int, batch_size: int, seed: int
) -> tuple[tuple[Utilization, ...], int]:
    """Return the four strategies' utilization and the packing lower bound for ``lengths``."""
    from packshard.pack.planner import plan_packs

    clipped = np.minimum(lengths, max_seq_len).astype(np.int64)
    n, useful = clipped.shape[0], int(clipped.sum())
    if n == 0:
        return (), 0
    shuffled = clipped[np.random.default_rng(seed).permutation(n)]
    rows = plan_packs(clipped[clipped > 0], max_seq_len, "bfd").num_rows  # needs 1..L
    return (
        Utilization("pad_to_max", n, n * max_seq_len, useful),
        Utilization("random_batches", n, measure_batches(shuffled, batch_size), useful),
        Utilization("bucketed", n, measure_batches(np.sort(clipped), batch_size), useful),
        Utilization("packed", rows, rows * max_seq_len, useful),
    ), -(-useful // max_seq_len)


def profile_lengths(
    lengths: np.ndarray,
    loss_tokens: np.ndarray,
    domain_codes: np.ndarray,
    domain_names: Sequence[str],
    rejected: Mapping[str, int],
    max_seq_len: int,
    batch_size: int = 8,
    seed: int = 0,
    label_path: str = "offsets",
) -> ProfileReport:
    """Profile examples given as arrays: ``domain_names[domain_codes[i]]`` is example i's domain.

    ``rejected`` counts rejected records per domain name; names missing from ``domain_names``
    become domains of their own.  Raises :class:`UsageError` on a non-positive ``max_seq_len``
    or ``batch_size`` and on arrays of different lengths.
    """
    if max_seq_len <= 0 or batch_size <= 0:
        raise UsageError(
            f"max_seq_len {max_seq_len} and batch_size {batch_size} must be positive "
            "(use --max-seq-len / --batch-size)"
        )
    lengths = np.asarray(lengths, dtype=np.int64)
    loss_tokens = np.asarray(loss_tokens, dtype=np.int64)
    codes = np.asarray(domain_codes, dtype=np.int64)
    if not lengths.shape == loss_tokens.shape == codes.shape:
        raise UsageError(
            f"lengths {lengths.shape}, loss_tokens {loss_tokens.shape} and domain_codes "
            f"{codes.shape} must have one entry per example"
        )
    names = list(domain_names)
    names += sorted(set(rejected) - set(names))
    edges = compute_histogram_edges(max(int(lengths.max(initial=0)), max_seq_len), max_seq_len)
    bins = np.clip(np.searchsorted(edges, lengths, side="right") - 1, 0, edges.shape[0] - 2)

    def profile_one(name: str, where: np.ndarray, rejects: int) -> DomainProfile:
        own = lengths[where]
        utilization, lower_bound = measure_utilization(own, max_seq_len, batch_size, seed)
        counts = np.bincount(bins[where], minlength=edges.shape[0] - 1)
        return DomainProfile(
            name=name,
            records=int(own.shape[0]) + rejects,
            examples=int(own.shape[0]),
            rejected=rejects,
            tokens=int(own.sum()),
            loss_tokens=int(loss_tokens[where].sum()),
            over_max=int(np.count_nonzero(own > max_seq_len)),
            lengths=measure_lengths(np.sort(own)) if own.shape[0] else None,
            utilization=utilization,
            lower_bound_rows=lower_bound,
            histogram=tuple(int(c) for c in counts),
        )

    total = profile_one("total", np.ones(lengths.shape[0], dtype=bool), sum(rejected.values()))
    domains = tuple(
        profile_one(name, codes == code, int(rejected.get(name, 0)))
        for code, name in sorted(enumerate(names), key=lambda item: item[1])
        if np.any(codes == code) or rejected.get(name, 0)
    )
    return ProfileReport(
        max_seq_len=max_seq_len,
        batch_size=batch_size,
        seed=seed,
        label_path=label_path,
        total=total,
        domains=domains,
        histogram_edges=tuple(int(e) for e in edges),
        verdict=write_verdict(total, max_seq_len),
    )


def write_verdict(total: DomainProfile, max_seq_len: int) -> str:
    """Return one sentence saying what packing saves against padding to ``max_seq_len``."""
    if not total.utilization:
        return "no accepted examples: nothing to pack"
    pad, packed = total.strategy("pad_to_max"), total.strategy("packed")
    saved = 1.0 - packed.computed_tokens / pad.computed_tokens
    bucketed = total.strategy("bucketed")
    return (
        f"packing removes {saved:.0%} of computed tokens vs padding to max_seq_len "
        f"{max_seq_len} ({pad.rows:,} padded rows → {packed.rows:,} packed rows, "
        f"fill {packed.fraction:.1%}; bucketed batches reach {bucketed.fraction:.1%})"
    )


def count_loss_tokens(labels: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Return per-example counts of labels ``!= IGNORE_INDEX``, each example's first excluded."""
    trained = labels != IGNORE_INDEX
    starts = offsets[:-1][offsets[:-1] < offsets[1:]]
    trained[starts] = False
    running = np.concatenate(([0], np.cumsum(trained, dtype=np.int64)))
    return running[offsets[1:]] - running[offsets[:-1]]


def describe_label_paths(counts: Mapping[str, int], default: str) -> str:
    """Return ``"offsets"`` for one label path, ``"offsets 950, none 50"`` for several."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if len(ranked) <= 1:
        return ranked[0][0] if ranked else default
    return ", ".join(f"{name} {count:,}" for name, count in ranked)


def profile_chunks(
    chunks: Iterable[IngestChunk],
    max_seq_len: int,
    batch_size: int = 8,
    seed: int = 0,
    label_path: str = "offsets",
) -> ProfileReport:
    """Profile an ingest stream, keeping per-example lengths, loss counts and domains only.

    Loss counts come from ``batch.extra["loss_tokens"]`` when ingest provides them, else from
    the labels.  The chunks' ``label_paths`` counts replace ``label_path`` when present.
    """
    lengths: list[np.ndarray] = []
    losses: list[np.ndarray] = []
    codes: list[np.ndarray] = []
    index: dict[str, int] = {}
    rejected: Counter[str] = Counter()
    codes_seen: Counter[str] = Counter()
    listed: list[Reject] = []
    paths: Counter[str] = Counter()
    for chunk in chunks:
        batch = chunk.batch
        offsets = np.asarray(batch.offsets, dtype=np.int64)
        lengths.append(np.diff(offsets))
        loss = batch.extra.get("loss_tokens")
        losses.append(count_loss_tokens(batch.labels, offsets) if loss is None else loss)
        domains = batch.domains
        code = (index.setdefault(d, len(index)) for d in domains)
        codes.append(np.fromiter(code, dtype=np.int64, count=len(domains)))
        rejected.update(r.domain for r in chunk.rejects)
        codes_seen.update(r.code for r in chunk.rejects)
        listed.extend(chunk.rejects[: MAX_LISTED_REJECTS - len(listed)])
        paths.update(chunk.label_paths)
    empty = np.zeros(0, dtype=np.int64)
    report = profile_lengths(
        np.concatenate([empty, *lengths]),
        np.concatenate([empty, *losses]),
        np.concatenate([empty, *codes]),
        list(index),
        dict(rejected),
        max_seq_len,
        batch_size,
        seed,
        describe_label_paths(paths, label_path),
    )
    return replace(report, rejects=tuple(listed), reject_codes=tuple(sorted(codes_seen.items())))


def profile_inputs(
    files: Sequence[InputFile],
    bundle: TokenizerBundle,
    template: ChatTemplate | None,
    options: IngestOptions,
    max_seq_len: int,
    batch_size: int = 8,
    seed: int = 0,
    progress: bool = False,
) -> ProfileReport:
    """Tokenize ``files`` through :func:`packshard.ingest.ingest` and profile the examples.

    Only three integers per example are kept (length, loss tokens, domain code), never the
    tokens.  ``batch_size`` is the training batch size the batching strategies assume, not
    ``options.batch_size`` (records per ingest chunk).
    """
    from packshard.ingest.chunks import ingest, ingest_label_path

    chunks = ingest(files, bundle, template, options, progress=progress)
    default = ingest_label_path(template, options.loss)
    return profile_chunks(chunks, max_seq_len, batch_size, seed, default)


def report_to_dict(report: ProfileReport) -> dict[str, Any]:
    """Return the report as JSON-ready data: fixed keys, fractions rounded to 6 places."""

    def domain_to_dict(d: DomainProfile) -> dict[str, Any]:
        counts = ("name", "records", "examples", "rejected", "tokens", "loss_tokens")
        data = {key: getattr(d, key) for key in (*counts, "prompt_tokens", "over_max")}
        data["loss_share"] = round(d.loss_share, 6)
        data["over_max_share"] = round(d.over_max_share, 6)
        data["lengths"] = None
        if d.lengths is not None:
            data["lengths"] = {k: getattr(d.lengths, k) for k in ("p50", "p90", "p95", "p99")}
            data["lengths"].update(max=d.lengths.max, mean=round(d.lengths.mean, 3))
        data["utilization"] = {
            u.strategy: {
                "rows": u.rows,
                "computed_tokens": u.computed_tokens,
                "useful_tokens": u.useful_tokens,
                "useful_fraction": round(u.fraction, 6),
            }
            for u in d.utilization
        }
        data["lower_bound_rows"] = d.lower_bound_rows
        data["histogram"] = list(d.histogram)
        return data

    return {
        "max_seq_len": report.max_seq_len,
        "batch_size": report.batch_size,
        "seed": report.seed,
        "label_path": report.label_path,
        "percentile_method": report.percentile_method,
        "overlong": "clipped to max_seq_len (counted as truncated) in every strategy",
        "histogram_edges": list(report.histogram_edges),
        "total": domain_to_dict(report.total),
        "domains": [domain_to_dict(d) for d in report.domains],
        "verdict": report.verdict,
    }
