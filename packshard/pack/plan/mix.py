"""``--mix``: how many copies of each record a pack keeps, by a seeded token budget.

``pack --mix a=0.6,b=0.3,c=0.1 --mix-by trained_tokens --max-repeat K`` asks that domain
``a`` hold 60 % of the packed output's trained tokens, ``b`` 30 %, ``c`` 10 %.  The unit of
choice is the whole record (every example, part and turn-example of it together), so a
record is packed 0, 1 … K times and never cut by the mixture.  Each record weighs its measure:
its tokens, its trained tokens (``loss_tokens``, the first label of each example not
counted, as the shards count them) or its examples.

The mixture keeps the input's size by that measure.  With ``W_d`` the weight domain ``d``
has and ``s_d`` its share::

    T      = Σ W_d                       the mixture's total (the input's)
    B_d    = s_d · T                     domain d's budget
    feasible ⇔ B_d ≤ K · W_d  for every d   (else: the first limiting domain, one line)
    --mix-best-effort:  T = min_d K·W_d / s_d   (shares kept, a smaller mixture)

Each domain then takes ``c = ⌊B_d / W_d⌋`` full copies of every record and fills the rest,
``R = B_d − c·W_d``, with records in a seeded order (a permutation per domain, keyed by the
seed and the domain's name), stopping at the prefix whose weight is nearest to ``R``: the
error is at most half a record per domain (60/30/10 came out 60.06/30.03/9.92 % on the
three-domain chat data of ``docs/mixtures.md``)::

    T = 300k, K = 2
    a: W = 100k, B = 180k → c = 1, R = 80k    every record once, 80k more by seeded order
    b: W = 150k, B =  90k → c = 0, R = 90k    a seeded 90k subset; the rest dropped
    c: W =  50k, B =  30k → c = 0, R = 30k

In ``pack`` the choice is made in the driver, between the spill and the planner, once every
length is known (whatever the engine and its workers)::

    spill (records r0 r1 r2 …, each 1+ examples)
      ─► choose_records                copies per record: r0×2, r1×0, r2×1 …
      ─► mix_examples: index = spill examples, each repeated its record's copies
             [e0 e0 e2 e3 …]           (r0 = e0, r1 = e1 dropped, r2 = e2 e3)
      ─► plan_examples(…, index)       ids in input order; copies of one example adjacent
      ─► example_repeats               per segment 0 for the first copy, then 1, 2 …

A record kept 0 times is a ``mix_subsampled`` reject, counted as dropped (:func:`mix_drops`).
:func:`mix_stats` is the manifest's ``stats.mix``: per domain the target, the input, the
realised mixture (:func:`packshard.format.mixture.realised_mixture`, as ``verify`` recounts
it), repeats and drops.  ``profile --mix`` runs the same choice on its own arrays
(:func:`predict_mixture`).  The spill's and the plan's types are imported for the type
checker alone, so that ``profile`` loads no planner (numba) through this module.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from packshard.arrays import exclusive_cumsum, invert
from packshard.errors import UsageError
from packshard.format.mixture import realised_mixture
from packshard.options import MIX_BY, check_choice, check_range

if TYPE_CHECKING:
    from packshard.pack.plan.rows import RowPlan
    from packshard.pack.spill import Spill
    from packshard.records import Reject

MIX_SHARE_TOLERANCE = 1e-6
"""How far the ``--mix`` shares may add up from 1 (written as decimals, they rarely do exactly)."""


@dataclass(frozen=True, slots=True)
class MixTarget:
    """``--mix`` parsed: (domain, share) pairs, the measure, the repeat cap, best effort."""

    shares: tuple[tuple[str, float], ...]
    by: str = "trained_tokens"
    max_repeat: int = 1
    best_effort: bool = False


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    """Parse ``DOMAIN=SHARE,…``; shares in [0, 1] adding up to 1, each domain once.

    Raises:
        UsageError: the text is not ``DOMAIN=SHARE,…`` or its shares do not add up.

    """
    pairs: list[tuple[str, float]] = []
    for item in text.split(","):
        name, eq, value = item.strip().rpartition("=")
        try:
            share = float(value)
        except ValueError:
            share = math.nan
        if not eq or not name or not 0 <= share <= 1:  # nan fails too
            raise UsageError(
                f"--mix {text!r}: {item.strip()!r} is not DOMAIN=SHARE with a share in [0, 1] "
                "(e.g. --mix chat=0.6,code=0.3,math=0.1)"
            )
        if name in dict(pairs):
            raise UsageError(f"--mix {text!r} names domain {name!r} twice")
        pairs.append((name, share))
    total = sum(share for _, share in pairs)
    if abs(total - 1) > MIX_SHARE_TOLERANCE:
        raise UsageError(f"--mix shares must add up to 1, got {total:g} (in {text!r})")
    return tuple(pairs)


def mix_target(mix: str, by: str, max_repeat: int, best_effort: bool) -> MixTarget | None:
    """Check ``--mix-by`` and ``--max-repeat``, parse ``--mix``; None without ``--mix``."""
    check_choice("--mix-by", by, MIX_BY)
    check_range("--max-repeat", max_repeat, 1, 1 << 20)
    return MixTarget(parse_mix(mix), by, max_repeat, best_effort) if mix else None


def domain_shares(target: MixTarget, names: Sequence[str]) -> np.ndarray:
    """Return the target share of each of ``names`` (the domains of the data), in that order.

    Raises:
        UsageError: a domain of the data has no share, or ``--mix`` names one it lacks.

    """
    given = dict(target.shares)
    missing = [name for name in names if name not in given]
    if missing:
        raise UsageError(
            f"--mix gives domain {missing[0]!r} no share (the data's domains: "
            f"{', '.join(names)}); give every domain one, =0 to leave it out"
        )
    extra = [name for name in given if name not in names]
    if extra:
        raise UsageError(
            f"--mix names domain {extra[0]!r}, which no packed record has (the data's "
            f"domains: {', '.join(names)})"
        )
    return np.array([given[name] for name in names], dtype=np.float64)


@dataclass(frozen=True, slots=True)
class MixChoice:
    """How many times each record is packed, and what the mixture aimed at.

    ``copies`` is per record (0: dropped); ``available`` and ``budget`` are per domain, in the
    measure of ``--mix-by``; ``note`` says what ``--mix-best-effort`` gave up, else None.
    """

    copies: np.ndarray  # int32 [records]
    available: np.ndarray  # float64 [domains]
    budget: np.ndarray  # float64 [domains]
    note: str | None = None


def choose_copies(
    record_domain: np.ndarray,
    record_weight: np.ndarray,
    names: Sequence[str],
    target: MixTarget,
    seed: int,
) -> MixChoice:
    """Choose each record's copies so that each domain's weight meets its budget.

    ``record_domain`` indexes ``names``; ``record_weight`` is each record's measure.

    Raises:
        UsageError: a share cannot be met within ``--max-repeat`` (without best effort).

    """
    shares = domain_shares(target, names)
    domain = np.asarray(record_domain, dtype=np.int64)
    weight = np.asarray(record_weight, dtype=np.float64)
    available = np.bincount(domain, weights=weight, minlength=len(names)).astype(np.float64)
    cap = target.max_repeat * available
    total = float(available.sum())
    note = None
    wanted = shares > 0
    reach = np.full(len(names), np.inf)
    reach[wanted] = cap[wanted] / shares[wanted]  # the largest total each domain allows
    if wanted.any() and float(reach.min()) < total * (1 - 1e-12):
        message = _limit_message(names, shares, available, target, total, reach)
        if not target.best_effort:
            raise UsageError(message)
        total, note = float(reach.min()), message
    budget = shares * total
    copies = np.zeros(len(domain), dtype=np.int32)
    for code, name in enumerate(names):
        members = np.flatnonzero(domain == code)
        if available[code] <= 0 or budget[code] <= 0:
            continue
        full = min(target.max_repeat, int(budget[code] / available[code] + 1e-9))
        copies[members] = full
        rest = budget[code] - full * available[code]
        if full < target.max_repeat and rest > 0:
            order = members[_seeded(seed, name).permutation(len(members))]
            copies[order[: _nearest_prefix(weight[order], rest)]] += 1
    return MixChoice(copies, available, budget, note)


def _nearest_prefix(weights: np.ndarray, want: float) -> int:
    """Return how many leading ``weights`` add up nearest to ``want`` (ties: the shorter)."""
    cumulative = np.cumsum(weights)
    k = int(np.searchsorted(cumulative, want, side="left"))  # cumulative[k] >= want
    if k >= len(weights):
        return len(weights)
    below = float(cumulative[k - 1]) if k else 0.0
    return k + 1 if float(cumulative[k]) - want < want - below else k


def _seeded(seed: int, name: str) -> np.random.Generator:
    """Return a generator of its own per (seed, domain): another domain changes no order."""
    digest = hashlib.blake2b(f"{seed}\0mix\0{name}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def _limit_message(
    names: Sequence[str],
    shares: np.ndarray,
    available: np.ndarray,
    target: MixTarget,
    total: float,
    reach: np.ndarray,
) -> str:
    """One line: the domain that limits the mixture most, what it reaches, how to fix it."""
    code = int(np.argmin(reach))
    name, share, have = names[code], float(shares[code]), float(available[code])
    k = target.max_repeat
    most = k * have
    reachable = most / (most + (1 - share) * total) if most + (1 - share) * total else 0.0
    unit = target.by.replace("_", " ")
    times = f"{k} copy" if k == 1 else f"{k} copies"
    need = share * total
    fix = f"raise --max-repeat to {math.ceil(need / have)}, " if have > 0 else ""
    return (
        f"--mix {name}={share:g} by {target.by}: {name} has {have:,.0f} {unit}, "
        f"{most:,.0f} at {times} (--max-repeat {k}), but {share:.1%} of the {total:,.0f} in "
        f"the mixture is {need:,.0f}; {name} reaches at most {reachable:.1%} ({fix}lower its "
        f"share, or pass --mix-best-effort for these shares in {float(reach.min()):,.0f} "
        f"{unit})"
    )


def choose_records(
    record_ids: np.ndarray,
    domain: np.ndarray,
    lengths: np.ndarray,
    trained: np.ndarray,
    names: Sequence[str],
    target: MixTarget,
    seed: int,
) -> tuple[MixChoice, np.ndarray, np.ndarray]:
    """Weigh each record by ``--mix-by`` and choose its copies (:func:`choose_copies`).

    Per example: its record id, domain code, tokens and trained tokens.  Returns the choice
    (per record, in record-id order), each record's first example and each example's record.
    """
    _, first, record = np.unique(record_ids, return_index=True, return_inverse=True)
    record = record.reshape(-1)
    measure = {"tokens": lengths, "trained_tokens": trained}.get(target.by)
    weight = np.ones(len(record)) if measure is None else measure.astype(np.float64)
    per_record = np.bincount(record, weights=weight, minlength=len(first))
    return choose_copies(domain[first], per_record, names, target, seed), first, record


def mixture_stats(
    target: MixTarget,
    choice: MixChoice,
    names: Sequence[str],
    record_domain: np.ndarray,
    packed: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> dict[str, Any]:
    """Return ``stats.mix``: per domain the target, the input, the realised mixture, drops.

    ``packed`` holds per packed example its domain, tokens, trained tokens and repeat.
    """
    realised = realised_mixture(*packed, names)
    dropped = np.bincount(record_domain[choice.copies == 0], minlength=len(names))
    most = np.zeros(len(names), dtype=np.int64)
    np.maximum.at(most, record_domain, choice.copies)
    total = float(choice.available.sum())
    shares = dict(target.shares)
    domains = {
        name: {
            "target": shares[name],
            "input": round(float(choice.available[code]), 6),
            "share_input": round(float(choice.available[code]) / total, 6) if total else 0.0,
            **realised[name],
            "records_dropped": int(dropped[code]),
            "max_copies": int(most[code]),
        }
        for code, name in enumerate(names)
    }
    return {
        "by": target.by,
        "max_repeat": target.max_repeat,
        "best_effort": target.best_effort,
        "domains": domains,
    }


MIX_DROP_CODE = "mix_subsampled"


@dataclass(frozen=True, slots=True)
class Mixed:
    """The mixture chosen for a spill: the examples to plan and each record's copies."""

    target: MixTarget
    index: np.ndarray  # int64, spilled examples to plan (repeated), ascending
    choice: MixChoice  # per record (the spill's records in input order)
    first_example: np.ndarray  # int64 [records], each record's first spilled example


def mix_examples(spill: Spill, target: MixTarget, seed: int) -> Mixed:
    """Choose the copies of every record and return the examples to plan."""
    choice, first, record = choose_records(
        spill.record_ids,
        spill.domain_codes,
        spill.lengths,
        spill.loss_tokens,
        spill.counts.domains,
        target,
        seed,
    )
    index = np.repeat(np.arange(len(spill), dtype=np.int64), choice.copies[record])
    return Mixed(target, index, choice, first.astype(np.int64))


def mix_drops(spill: Spill, mixed: Mixed) -> tuple[Reject, ...]:
    """One ``mix_subsampled`` reject per record the mixture left out, in input order."""
    why = "left out by --mix (a seeded choice: its domain is above its share)"
    return spill.rejects(mixed.first_example[mixed.choice.copies == 0], MIX_DROP_CODE, why)


def example_repeats(plan: RowPlan) -> np.ndarray:
    """Per segment, which copy of its example it is: 0, then 1, 2 … (int32).

    Copies of one example (same spilled example, same start) have consecutive ids
    (:func:`packshard.pack.plan.rows.number_examples`), so a copy's repeat is its id minus
    the first copy's.
    """
    order = invert(plan.example_id)  # the segments in example id order
    ex, start = plan.seg_example[order], plan.seg_start[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (ex[1:] != ex[:-1]) | (start[1:] != start[:-1])
    position = np.arange(len(order), dtype=np.int64)
    first = np.maximum.accumulate(np.where(new, position, 0))
    repeats = np.empty(len(order), dtype=np.int32)
    repeats[order] = position - first
    return repeats


def mix_stats(spill: Spill, plan: RowPlan, repeats: np.ndarray, mixed: Mixed) -> dict[str, Any]:
    """Return the manifest's ``stats.mix``: per domain target, input, realised, drops."""
    ex = plan.seg_example
    packed = (spill.domain_codes[ex], plan.seg_length, plan.seg_targets, repeats)
    record_domain = spill.domain_codes[mixed.first_example]
    names = spill.counts.domains
    return mixture_stats(mixed.target, mixed.choice, names, record_domain, packed)


def predict_mixture(
    columns: Mapping[str, np.ndarray],
    names: Sequence[str],
    max_seq_len: int,
    target: MixTarget,
    seed: int,
) -> dict[str, Any]:
    """Return the ``stats.mix`` that ``pack --mix`` would make of a profile's examples.

    ``columns`` holds per example its ``lengths``, ``loss_tokens``, domain ``codes`` and
    ``firsts`` (it starts a record), as :mod:`packshard.profile.gather` keeps them.  The
    examples longer than ``max_seq_len`` are left out first, as ``--overlong drop`` does::

        examples ─► keep length ≤ max_seq_len ─► records ─► choose_copies(seed)
          ─► copies expanded ─► mixture_stats (what pack records in stats.mix)

    Exact under ``--overlong drop`` (the default) and the same seed; near otherwise.
    """
    lengths, trained = columns["lengths"], columns["loss_tokens"]
    keep = lengths <= max_seq_len
    domain = columns["codes"][keep]
    records = (np.cumsum(columns["firsts"]) - 1)[keep]
    choice, first, record = choose_records(
        records, domain, lengths[keep], trained[keep], names, target, seed
    )
    record_domain = domain[first]
    copies = choice.copies[record]  # each kept example repeated, with which copy it is
    example = np.repeat(np.arange(len(copies), dtype=np.int64), copies)
    repeat = np.arange(len(example), dtype=np.int64) - exclusive_cumsum(copies)[example]
    kept = np.flatnonzero(keep)[example]
    packed = (domain[example], lengths[kept], trained[kept], repeat)
    return mixture_stats(target, choice, names, record_domain, packed)
